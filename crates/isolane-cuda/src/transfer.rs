//! Values one stage leaves in device memory ([`DeviceF32`], e.g. a GPU preprocess's output)
//! and their copy into a model's input on whatever GPU the model runs ([`InputCopier`]):
//! device to device on one GPU, peer to peer between two GPUs that can reach each other
//! (NVLink or PCIe; the CUDA programming guide's peer access), and otherwise staged through
//! page-locked host memory. Every copy is waited for, so its time is the caller's to take.

use std::ffi::c_void;

use cudarc::driver::sys as cu;
use isolane_engine::{EngineError, Result};

use crate::error::cu_check;
use crate::handles::{DeviceBuffer, PinnedF32};
use crate::model::make_current;
use crate::{CudaBackend, CudaModel};

/// f32 values in device memory of one backend's context, freed in that context.
pub struct DeviceF32 {
    buf: Option<DeviceBuffer>,
    len: usize,
    device: cu::CUdevice,
    backend: CudaBackend,
}

// SAFETY: driver handles and a device address only, which any thread may use; every method
// makes the owning context current first.
unsafe impl Send for DeviceF32 {}
// SAFETY: shared access reads the values only (`to_host`, a copy from them), never writes.
unsafe impl Sync for DeviceF32 {}

impl CudaBackend {
    /// `len` f32s of device memory in this backend's context.
    pub fn device_f32(&self, len: usize) -> Result<DeviceF32> {
        make_current(self.context())?;
        let device = current_device()?;
        Ok(DeviceF32 {
            buf: Some(DeviceBuffer::new(len * 4)?),
            len,
            device,
            backend: self.clone(),
        })
    }
}

impl DeviceF32 {
    pub fn ptr(&self) -> cu::CUdeviceptr {
        self.buf.as_ref().map_or(0, |b| b.ptr)
    }

    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The context the memory belongs to.
    pub fn context(&self) -> cu::CUcontext {
        self.backend.context()
    }

    /// Copies the values into `out` (`len()` values) and waits.
    pub fn to_host(&self, out: &mut [f32]) -> Result<()> {
        if out.len() != self.len {
            return Err(EngineError::InvalidArgument(format!(
                "device values: {} to copy into {} values",
                self.len,
                out.len()
            )));
        }
        make_current(self.context())?;
        // SAFETY: `ptr()` holds len f32s of this context, `out` as many (checked); the copy is
        // synchronous, so `out` outlives it.
        cu_check("cuMemcpyDtoH", unsafe {
            cu::cuMemcpyDtoH_v2(out.as_mut_ptr() as *mut c_void, self.ptr(), self.len * 4)
        })
    }
}

impl Drop for DeviceF32 {
    fn drop(&mut self) {
        // The buffer is freed in its context; failing to make it current leaks it rather than
        // freeing it elsewhere.
        if make_current(self.context()).is_ok() {
            self.buf = None;
        } else {
            std::mem::forget(self.buf.take());
        }
    }
}

/// How a copy reached the model's GPU.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CopyPath {
    /// Device to device, on one GPU.
    Device,
    /// GPU to GPU, peer to peer.
    Peer,
    /// GPU to GPU through page-locked host memory.
    Staged,
}

/// Copies device values into a model's input, remembering per source context whether peer
/// access could be enabled, and keeping the page-locked buffer a staged copy goes through.
#[derive(Default)]
pub struct InputCopier {
    /// Source contexts on other GPUs, and whether this model's context reaches them peer to
    /// peer.
    peers: Vec<(cu::CUcontext, bool)>,
    staging: Option<PinnedF32>,
}

// SAFETY: context handles (compared, passed to the driver) and page-locked memory owned here.
unsafe impl Send for InputCopier {}

impl InputCopier {
    /// Copies `src` into `model`'s first input on the model's stream and waits; the model's
    /// next [`CudaModel::launch_from_device`] starts from there. Between two GPUs the copy goes
    /// peer to peer when `peer` allows it and the GPUs can reach each other, else through
    /// host memory.
    pub fn copy_into(
        &mut self,
        model: &mut CudaModel,
        src: &DeviceF32,
        peer: bool,
    ) -> Result<CopyPath> {
        let (dst, bytes) = model.device_input(0).ok_or_else(|| {
            EngineError::InvalidArgument("the model has no input to copy into".into())
        })?;
        if model.device_input(1).is_some() {
            return Err(EngineError::InvalidArgument(
                "the model has more than one input; device values feed a one-input model".into(),
            ));
        }
        if bytes != src.len() * 4 {
            return Err(EngineError::InvalidArgument(format!(
                "the model's input holds {} values, the device values are {}",
                bytes / 4,
                src.len()
            )));
        }
        let (ctx, stream) = (model.context(), model.stream());
        make_current(ctx)?;
        let device = current_device()?;
        let path = if device == src.device {
            CopyPath::Device
        } else if peer && self.reaches(device, src)? {
            CopyPath::Peer
        } else {
            CopyPath::Staged
        };
        match path {
            // SAFETY: `dst` holds `bytes` in `ctx` (the model's input staging), `src` as
            // many in its own context; the wait below ends the copy before either is reused.
            CopyPath::Device | CopyPath::Peer => cu_check("cuMemcpyPeerAsync", unsafe {
                cu::cuMemcpyPeerAsync(dst, ctx, src.ptr(), src.context(), bytes, stream)
            })?,
            CopyPath::Staged => self.staged(dst, src, stream)?,
        }
        // SAFETY: the model's live stream.
        cu_check("cuStreamSynchronize", unsafe {
            cu::cuStreamSynchronize(stream)
        })?;
        Ok(path)
    }

    /// Whether the current context (the model's, on `device`) reaches `src`'s peer to peer,
    /// enabling it the first time (a context may refuse: then the copies are staged).
    fn reaches(&mut self, device: cu::CUdevice, src: &DeviceF32) -> Result<bool> {
        if let Some((_, ok)) = self.peers.iter().find(|(c, _)| *c == src.context()) {
            return Ok(*ok);
        }
        let mut can = 0;
        // SAFETY: valid out-pointer and two device handles of this machine.
        cu_check("cuDeviceCanAccessPeer", unsafe {
            cu::cuDeviceCanAccessPeer(&mut can, device, src.device)
        })?;
        let ok = can == 1 && {
            // SAFETY: the model's context is current; `src`'s context is live (src holds its
            // backend).
            let r = unsafe { cu::cuCtxEnablePeerAccess(src.context(), 0) };
            matches!(
                r,
                cu::CUresult::CUDA_SUCCESS | cu::CUresult::CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED
            )
        };
        self.peers.push((src.context(), ok));
        Ok(ok)
    }

    /// `src` into `dst` through page-locked host memory, on `stream` (unified addressing lets
    /// one stream order both copies, the pointers telling the directions).
    fn staged(
        &mut self,
        dst: cu::CUdeviceptr,
        src: &DeviceF32,
        stream: cu::CUstream,
    ) -> Result<()> {
        if self.staging.as_ref().is_none_or(|s| s.len() != src.len()) {
            self.staging = Some(PinnedF32::new(src.len())?);
        }
        let host = self.staging.as_ref().expect("made above").ptr() as cu::CUdeviceptr;
        let bytes = src.len() * 4;
        // SAFETY: the staging holds `bytes`, as do `src` and `dst` (checked by the caller);
        // the second copy follows the first on one stream, and the caller waits for both.
        unsafe {
            cu_check(
                "cuMemcpyAsync",
                cu::cuMemcpyAsync(host, src.ptr(), bytes, stream),
            )?;
            cu_check("cuMemcpyAsync", cu::cuMemcpyAsync(dst, host, bytes, stream))?;
        }
        Ok(())
    }
}

/// The device of the current context.
fn current_device() -> Result<cu::CUdevice> {
    let mut device: cu::CUdevice = 0;
    // SAFETY: valid out-pointer; the caller made a context current.
    cu_check("cuCtxGetDevice", unsafe { cu::cuCtxGetDevice(&mut device) })?;
    Ok(device)
}
