//! The device's compute capability and the NVRTC compile of kernel sources, through the disk cache.

use super::*;

/// One attribute of the current context's device.
fn device_attribute(attr: cu::CUdevice_attribute) -> Result<i32> {
    let mut dev: cu::CUdevice = 0;
    // SAFETY: valid out-pointer, a context is current.
    cu_check("cuCtxGetDevice", unsafe { cu::cuCtxGetDevice(&mut dev) })?;
    let mut v = 0;
    // SAFETY: valid out-pointer and device.
    cu_check("cuDeviceGetAttribute", unsafe {
        cu::cuDeviceGetAttribute(&mut v, attr, dev)
    })?;
    Ok(v)
}

/// The SMs the current context's device reports: all of them in a green context, its thread
/// share's as an MPS client with part of the threads (what cuBLASLt sizes its work by unless
/// told otherwise: `crate::saved::SmTargets`).
pub(crate) fn device_sm_count() -> Result<u32> {
    let sms = device_attribute(cu::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT)?;
    u32::try_from(sms)
        .ok()
        .filter(|&n| n > 0)
        .ok_or_else(|| EngineError::Runtime(format!("the device reports {sms} SMs")))
}

/// The most shared memory a block of the current context's device may opt in to (bytes).
pub(crate) fn device_smem_optin() -> Result<usize> {
    let bytes = device_attribute(
        cu::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN,
    )?;
    Ok(usize::try_from(bytes).unwrap_or(0))
}

pub(crate) fn device_arch() -> Result<(i32, i32)> {
    use cu::CUdevice_attribute::{
        CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR as MAJOR,
        CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR as MINOR,
    };
    Ok((device_attribute(MAJOR)?, device_attribute(MINOR)?))
}

/// Compiles (or loads from the disk cache) the kernels for `dtype` and returns the cubin. With
/// `wgmma` on compute capability 9.0 the module is built for `sm_90a`, whose arch-specific
/// instructions the Hopper int8 kernel needs (`kernels::QGEMM_WG_SHARED_BYTES`); the rest of the
/// module compiles as for `sm_90`.
pub(super) fn kernel_cubin(dtype: DType, arch: (i32, i32), wgmma: bool) -> Result<Vec<u8>> {
    let target = module_target(arch, wgmma);
    cubin_for_target(kernels::source(dtype), "isolane_kernels.cu", &target)
}

/// The NVRTC target of the kernels' module for a device of compute capability `arch`.
pub(crate) fn module_target(arch: (i32, i32), wgmma: bool) -> String {
    match (arch, wgmma) {
        ((9, 0), true) => "sm_90a".to_string(),
        ((major, minor), _) => format!("sm_{major}{minor}"),
    }
}

/// Compiles `src` (no headers) with NVRTC for `arch`, or loads it from the disk cache.
pub(crate) fn cubin_for(src: String, file: &str, arch: (i32, i32)) -> Result<Vec<u8>> {
    cubin_for_target(src, file, &format!("sm_{}{}", arch.0, arch.1))
}

/// Compiles `src` (no headers) with NVRTC for `arch_s` (`sm_90a`, `sm_86`, …), or loads it from
/// the disk cache.
fn cubin_for_target(src: String, file: &str, arch_s: &str) -> Result<Vec<u8>> {
    let options = vec![
        format!("--gpu-architecture={arch_s}"),
        "-default-device".to_string(),
    ];
    let (mut vmaj, mut vmin) = (0, 0);
    // SAFETY: valid out-pointers; libnvrtc is loaded (libs::ensure_all ran before).
    rtc_check("nvrtcVersion", unsafe {
        rtc::nvrtcVersion(&mut vmaj, &mut vmin)
    })?;
    let key = kernels::cache_key(&src, arch_s, (vmaj, vmin), &options);
    let dir = kernels::cache_dir();
    if let Some(d) = &dir {
        if let Some(c) = kernels::cache_read(d, &key) {
            return Ok(c);
        }
    }
    let csrc = CString::new(src).map_err(|e| EngineError::Runtime(e.to_string()))?;
    let name = CString::new(file).map_err(|e| EngineError::Runtime(e.to_string()))?;
    let copts: Vec<CString> = options
        .iter()
        .map(|o| CString::new(o.as_str()).expect("options have no NUL"))
        .collect();
    let popts: Vec<*const std::ffi::c_char> = copts.iter().map(|c| c.as_ptr()).collect();
    let mut prog: rtc::nvrtcProgram = std::ptr::null_mut();
    // SAFETY: the source and name strings outlive the program; no headers are passed.
    rtc_check("nvrtcCreateProgram", unsafe {
        rtc::nvrtcCreateProgram(
            &mut prog,
            csrc.as_ptr(),
            name.as_ptr(),
            0,
            std::ptr::null(),
            std::ptr::null(),
        )
    })?;
    // SAFETY: prog is live; the option pointers are valid NUL-terminated strings.
    let r = unsafe { rtc::nvrtcCompileProgram(prog, popts.len() as i32, popts.as_ptr()) };
    let result = (|| -> Result<Vec<u8>> {
        if let Err(e) = isolane_gpu::call::rtc_check("nvrtcCompileProgram", r) {
            let mut n = 0usize;
            // SAFETY: prog is live; the log buffer has the size NVRTC reported.
            let log = unsafe {
                rtc::nvrtcGetProgramLogSize(prog, &mut n);
                let mut buf = vec![0u8; n.max(1)];
                rtc::nvrtcGetProgramLog(prog, buf.as_mut_ptr() as *mut std::ffi::c_char);
                String::from_utf8_lossy(&buf)
                    .trim_end_matches('\0')
                    .to_string()
            };
            // A library failure with the compiler's log as its detail (an out-of-memory
            // becomes one, as from any call).
            return Err(crate::error::engine(CudaError {
                detail: Some(log),
                ..e
            }));
        }
        let mut n = 0usize;
        // SAFETY: prog compiled; the buffer has the size NVRTC reported.
        unsafe {
            rtc_check("nvrtcGetCUBINSize", rtc::nvrtcGetCUBINSize(prog, &mut n))?;
            let mut buf = vec![0u8; n];
            rtc_check(
                "nvrtcGetCUBIN",
                rtc::nvrtcGetCUBIN(prog, buf.as_mut_ptr() as *mut std::ffi::c_char),
            )?;
            Ok(buf)
        }
    })();
    // SAFETY: prog was created above and is destroyed once.
    unsafe { rtc::nvrtcDestroyProgram(&mut prog) };
    let cubin = result?;
    if let Some(d) = &dir {
        kernels::cache_write(d, &key, &cubin);
    }
    Ok(cubin)
}

#[cfg(test)]
mod tests {
    /// Only compute capability 9.0, asked for wgmma, builds the module for its arch-specific
    /// target; a later GPU's `sm_100` cubin must not ask for 9.0's features, nor an older one
    /// for any, and a build that does not force the own kernel keeps plain `sm_90`.
    #[test]
    fn only_hopper_builds_the_module_for_its_arch_specific_target() {
        use super::module_target;
        assert_eq!(module_target((9, 0), true), "sm_90a");
        assert_eq!(module_target((9, 0), false), "sm_90");
        assert_eq!(module_target((8, 6), true), "sm_86");
        assert_eq!(module_target((8, 9), true), "sm_89");
        assert_eq!(module_target((10, 0), true), "sm_100");
    }
}
