//! A thin, checked layer over cudarc's raw driver bindings (`cudarc::driver::sys`): every call
//! goes through [`check`], which turns a `CUresult` into [`GpuError::Cuda`] naming the call
//! (by the one checked-call layer, [`crate::call`]).
//!
//! We use the raw layer rather than cudarc's safe `CudaContext` because green contexts, their
//! streams and the contexts made current on worker threads have to be managed explicitly, and
//! cudarc's safe layer binds its own primary context to threads behind our back.

use std::ffi::{c_char, c_int, CStr};
use std::sync::OnceLock;

pub use cudarc::driver::sys;

use crate::error::{GpuError, Result};
use crate::loader::{self, NvLib};

/// The driver's name for a result code, e.g. `CUDA_ERROR_INVALID_VALUE`. The bindings' enum
/// variants carry exactly the names `cuGetErrorName` returns, and formatting them needs no
/// driver (so an error can be named even when libcuda is gone).
pub fn error_name(r: sys::CUresult) -> String {
    format!("{r:?}")
}

/// `Ok(())` on CUDA_SUCCESS, else an error naming `call`: the checked-call layer's
/// ([`crate::call::cu_check`]) failure as this crate's error ([`GpuError::Cuda`]).
pub fn check(call: &'static str, r: sys::CUresult) -> Result<()> {
    crate::call::cu_check(call, r).map_err(GpuError::from)
}

/// Finds libcuda (see [`crate::loader`]) and runs `cuInit(0)` once per process.
pub fn init() -> Result<()> {
    static INIT: OnceLock<std::result::Result<(), sys::CUresult>> = OnceLock::new();
    loader::ensure(NvLib::Cuda)?;
    let r = INIT.get_or_init(|| {
        // SAFETY: cuInit has no preconditions; libcuda is loaded (checked above), so cudarc's
        // lazy symbol lookup cannot panic on a missing library.
        let r = unsafe { sys::cuInit(0) };
        if r == sys::CUresult::CUDA_SUCCESS {
            Ok(())
        } else {
            Err(r)
        }
    });
    match *r {
        Ok(()) => Ok(()),
        Err(sys::CUresult::CUDA_ERROR_NO_DEVICE) => Err(GpuError::NoDevice(
            "the CUDA driver reports no device (cuInit: CUDA_ERROR_NO_DEVICE)".into(),
        )),
        Err(r) => check("cuInit", r),
    }
}

pub fn device_count() -> Result<u32> {
    init()?;
    let mut n: c_int = 0;
    // SAFETY: valid out-pointer; the driver is initialised.
    check("cuDeviceGetCount", unsafe { sys::cuDeviceGetCount(&mut n) })?;
    Ok(n.max(0) as u32)
}

pub fn device(index: u32) -> Result<sys::CUdevice> {
    let count = device_count()?;
    if index >= count {
        return Err(GpuError::DeviceIndex { index, count });
    }
    let mut d: sys::CUdevice = 0;
    // SAFETY: valid out-pointer; ordinal checked against the device count.
    check("cuDeviceGet", unsafe {
        sys::cuDeviceGet(&mut d, index as c_int)
    })?;
    Ok(d)
}

pub fn attribute(dev: sys::CUdevice, attr: sys::CUdevice_attribute) -> Result<i32> {
    let mut v: c_int = 0;
    // SAFETY: valid out-pointer and a device handle from cuDeviceGet.
    check("cuDeviceGetAttribute", unsafe {
        sys::cuDeviceGetAttribute(&mut v, attr, dev)
    })?;
    Ok(v)
}

pub fn sm_count(dev: sys::CUdevice) -> Result<u32> {
    Ok(attribute(
        dev,
        sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT,
    )?
    .max(0) as u32)
}

pub fn compute_capability(dev: sys::CUdevice) -> Result<(u32, u32)> {
    use sys::CUdevice_attribute as A;
    let major = attribute(dev, A::CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR)?;
    let minor = attribute(dev, A::CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR)?;
    Ok((major.max(0) as u32, minor.max(0) as u32))
}

pub fn name(dev: sys::CUdevice) -> Result<String> {
    let mut buf = [0 as c_char; 256];
    // SAFETY: the buffer is 256 bytes and its length is passed; the driver NUL-terminates.
    check("cuDeviceGetName", unsafe {
        sys::cuDeviceGetName(buf.as_mut_ptr(), buf.len() as c_int, dev)
    })?;
    // SAFETY: NUL-terminated by the driver within the buffer (zero-initialised besides).
    Ok(unsafe { CStr::from_ptr(buf.as_ptr()) }
        .to_string_lossy()
        .into_owned())
}

/// `GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx`, as nvidia-smi and CUDA_VISIBLE_DEVICES spell it.
pub fn uuid(dev: sys::CUdevice) -> Result<String> {
    loader::require_cuda_symbols(&["cuDeviceGetUuid_v2"], "needs a CUDA 11.4 or later driver")?;
    // SAFETY: CUuuid is 16 plain bytes; all-zero is a valid value.
    let mut u: sys::CUuuid = unsafe { std::mem::zeroed() };
    // SAFETY: valid out-pointer to a CUuuid.
    check("cuDeviceGetUuid_v2", unsafe {
        sys::cuDeviceGetUuid_v2(&mut u, dev)
    })?;
    let b: Vec<u8> = u.bytes.iter().map(|&c| c as u8).collect();
    Ok(format_uuid("GPU-", &b))
}

pub(crate) fn format_uuid(prefix: &str, b: &[u8]) -> String {
    let hex: Vec<String> = b.iter().map(|x| format!("{x:02x}")).collect();
    if hex.len() != 16 {
        return format!("{prefix}{}", hex.concat());
    }
    format!(
        "{prefix}{}-{}-{}-{}-{}",
        hex[0..4].concat(),
        hex[4..6].concat(),
        hex[6..8].concat(),
        hex[8..10].concat(),
        hex[10..16].concat()
    )
}

pub fn total_mem(dev: sys::CUdevice) -> Result<u64> {
    let mut b: usize = 0;
    // SAFETY: valid out-pointer.
    check("cuDeviceTotalMem_v2", unsafe {
        sys::cuDeviceTotalMem_v2(&mut b, dev)
    })?;
    Ok(b as u64)
}

/// e.g. 13000 for CUDA 13.0.
pub fn driver_version() -> Result<i32> {
    init()?;
    let mut v: c_int = 0;
    // SAFETY: valid out-pointer.
    check("cuDriverGetVersion", unsafe {
        sys::cuDriverGetVersion(&mut v)
    })?;
    Ok(v)
}

/// The device's primary context, retained for as long as the value lives (green contexts
/// retain it too; NVIDIA advises keeping it active so it is not initialised and torn down
/// repeatedly).
pub struct PrimaryContext {
    dev: sys::CUdevice,
    ctx: sys::CUcontext,
}

// SAFETY: a CUcontext handle may be used from any thread (the driver API is thread-safe);
// release happens once, in Drop.
unsafe impl Send for PrimaryContext {}
// SAFETY: shared access only reads the handle values.
unsafe impl Sync for PrimaryContext {}

impl PrimaryContext {
    pub fn retain(dev: sys::CUdevice) -> Result<Self> {
        let mut ctx: sys::CUcontext = std::ptr::null_mut();
        // SAFETY: valid out-pointer and device handle.
        check("cuDevicePrimaryCtxRetain", unsafe {
            sys::cuDevicePrimaryCtxRetain(&mut ctx, dev)
        })?;
        Ok(PrimaryContext { dev, ctx })
    }

    pub fn raw(&self) -> sys::CUcontext {
        self.ctx
    }

    pub fn device(&self) -> sys::CUdevice {
        self.dev
    }
}

impl Drop for PrimaryContext {
    fn drop(&mut self) {
        // SAFETY: balances the retain in `retain`; errors cannot be reported from Drop.
        let _ = unsafe { sys::cuDevicePrimaryCtxRelease_v2(self.dev) };
    }
}

/// Makes `ctx` current on the calling thread (null: none). Crate-internal: callers pass only
/// contexts they own (a green group's, a retained primary context's) or null.
pub(crate) fn set_current(ctx: sys::CUcontext) -> Result<()> {
    // SAFETY: ctx is a live context handle owned by the caller's partition or primary context,
    // or null, which the driver takes as "unbind the calling thread's context".
    check("cuCtxSetCurrent", unsafe { sys::cuCtxSetCurrent(ctx) })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn uuids_are_formatted_like_nvidia_smi() {
        let b: Vec<u8> = (0u8..16).collect();
        assert_eq!(
            format_uuid("GPU-", &b),
            "GPU-00010203-0405-0607-0809-0a0b0c0d0e0f"
        );
    }

    #[test]
    fn results_are_named() {
        let e = check("cuGreenCtxCreate", sys::CUresult::CUDA_ERROR_INVALID_VALUE).unwrap_err();
        assert_eq!(
            e.to_string(),
            "cuGreenCtxCreate failed: CUDA_ERROR_INVALID_VALUE"
        );
    }
}
