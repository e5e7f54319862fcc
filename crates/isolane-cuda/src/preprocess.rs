//! An application's preprocessing on the GPU: a camera frame (8-bit HWC RGB or RGBA) in device
//! memory into a model's input (NCHW f32 or f16): bilinear resize, centre crop, mean/std — one
//! NVRTC kernel launch on the backend's stream (so a green context confines it like a model).
//!
//! The semantics and the CPU reference are the engine's (`isolane_engine::preprocess`); the
//! kernel repeats the reference's f32 operations one for one — the source coordinate as
//! `ResizeAttrs::source`, explicit fused multiply-adds (`fmaf`, one rounding, Rust's `mul_add`) so that
//! the compiler's contraction cannot differ — and agrees with it bit for bit.

use std::ffi::{c_void, CString};

use cudarc::driver::sys as cu;
use isolane_engine::preprocess::PreprocessPlan;
use isolane_engine::{EngineError, Result};

use crate::error::cu_check;
use crate::handles::{DeviceBuffer, Module};
use crate::model::{cubin_for, device_arch, make_current, Events};
use crate::{CudaBackend, CudaModel};

/// Threads per block.
const BLOCK: u32 = 256;

/// The kernels. `Args` has the layout of [`KernelArgs`] (fifteen 4-byte fields, no padding).
pub const SRC: &str = r#"
struct Args {
    int in_h, in_w, channels, out_h, out_w, crop_top, crop_left;
    float scale_y, scale_x;
    float gain[3], bias[3];
};

// ResizeAttrs::source for linear, half-pixel: the two source indices and the second's weight.
__device__ __forceinline__ void source(int i, int inp, float scale, int* i0, int* i1, float* w) {
    float xo = ((float)i + 0.5f) / scale - 0.5f;
    float xc = fminf(fmaxf(xo, 0.f), (float)(inp - 1));
    int a = (int)floorf(xc);
    *i0 = a;
    *i1 = min(a + 1, inp - 1);
    *w = xc - (float)a;
}

// Output element i (NCHW, one image): bilinear sample of channel c, then gain and bias.
__device__ __forceinline__ float value(const unsigned char* __restrict__ src, const Args& a,
                                       long long i) {
    int ox = (int)(i % a.out_w);
    long long r = i / a.out_w;
    int oy = (int)(r % a.out_h);
    int c = (int)(r / a.out_h);
    int y0, y1, x0, x1;
    float wy, wx;
    source(a.crop_top + oy, a.in_h, a.scale_y, &y0, &y1, &wy);
    source(a.crop_left + ox, a.in_w, a.scale_x, &x0, &x1, &wx);
    const unsigned char* r0 = src + (long long)y0 * a.in_w * a.channels + c;
    const unsigned char* r1 = src + (long long)y1 * a.in_w * a.channels + c;
    float p00 = r0[x0 * a.channels], p01 = r0[x1 * a.channels];
    float p10 = r1[x0 * a.channels], p11 = r1[x1 * a.channels];
    float top = fmaf(p01 - p00, wx, p00);
    float bottom = fmaf(p11 - p10, wx, p10);
    float v = fmaf(bottom - top, wy, top);
    return fmaf(v, a.gain[c], a.bias[c]);
}

extern "C" __global__ void preprocess_f32(const unsigned char* __restrict__ src,
                                          float* __restrict__ dst, Args a) {
    long long n = 3LL * a.out_h * a.out_w;
    long long stride = (long long)gridDim.x * blockDim.x;
    for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride)
        dst[i] = value(src, a, i);
}

extern "C" __global__ void preprocess_f16_as_f32(const unsigned char* __restrict__ src,
                                                 float* __restrict__ dst, Args a) {
    long long n = 3LL * a.out_h * a.out_w;
    long long stride = (long long)gridDim.x * blockDim.x;
    for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride) {
        unsigned short h;
        float v;
        asm("cvt.rn.f16.f32 %0, %1;" : "=h"(h) : "f"(value(src, a, i)));
        asm("cvt.f32.f16 %0, %1;" : "=f"(v) : "h"(h));
        dst[i] = v;
    }
}

extern "C" __global__ void preprocess_f16(const unsigned char* __restrict__ src,
                                          unsigned short* __restrict__ dst, Args a) {
    long long n = 3LL * a.out_h * a.out_w;
    long long stride = (long long)gridDim.x * blockDim.x;
    for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride) {
        unsigned short h;
        asm("cvt.rn.f16.f32 %0, %1;" : "=h"(h) : "f"(value(src, a, i)));
        dst[i] = h;
    }
}
"#;

/// The element type of the model input the kernel writes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum InputType {
    F32,
    /// IEEE half, rounded to nearest even.
    F16,
    /// The values of `F16`, widened back to f32: what a model's f32 input staging takes from
    /// a preprocess whose values are rounded to half (a model casts to its precision itself).
    F16AsF32,
}

impl InputType {
    fn bytes(self) -> usize {
        match self {
            Self::F32 | Self::F16AsF32 => 4,
            Self::F16 => 2,
        }
    }

    fn kernel(self) -> &'static str {
        match self {
            Self::F32 => "preprocess_f32",
            Self::F16 => "preprocess_f16",
            Self::F16AsF32 => "preprocess_f16_as_f32",
        }
    }
}

/// The kernel's by-value argument (`struct Args` in [`SRC`]).
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct KernelArgs {
    pub in_h: i32,
    pub in_w: i32,
    pub channels: i32,
    pub out_h: i32,
    pub out_w: i32,
    pub crop_top: i32,
    pub crop_left: i32,
    pub scale_y: f32,
    pub scale_x: f32,
    pub gain: [f32; 3],
    pub bias: [f32; 3],
}

impl KernelArgs {
    /// The arguments for a plan (whose sizes the engine checked to fit 32-bit integers).
    pub fn from_plan(plan: &PreprocessPlan) -> Result<Self> {
        let int = |v: usize| {
            i32::try_from(v).map_err(|_| {
                EngineError::InvalidArgument(format!("preprocessing: {v} is too large"))
            })
        };
        Ok(Self {
            in_h: int(plan.frame.height)?,
            in_w: int(plan.frame.width)?,
            channels: int(plan.frame.channels)?,
            out_h: int(plan.out[0])?,
            out_w: int(plan.out[1])?,
            crop_top: int(plan.crop_offset[0])?,
            crop_left: int(plan.crop_offset[1])?,
            scale_y: plan.scale[0],
            scale_x: plan.scale[1],
            gain: plan.gain,
            bias: plan.bias,
        })
    }
}

/// The preprocessing kernel for one frame layout and model input, ready to launch.
pub struct Preprocessor {
    backend: CudaBackend,
    func: cu::CUfunction,
    grid: u32,
    args: KernelArgs,
    plan: PreprocessPlan,
    input_type: InputType,
    /// Device copies of a frame and an input for [`Preprocessor::run_host`], made on first use.
    host_io: Option<(DeviceBuffer, DeviceBuffer)>,
    /// f16 outputs on their way to f32 in [`Preprocessor::run_host_into`].
    half_host: Vec<u16>,
    // Last: unloaded after Drop made the context current.
    _module: Module,
}

// SAFETY: driver handles may be used from any thread; every method makes the backend's context
// current first, and `&mut self` serialises run_host's use of its buffers.
unsafe impl Send for Preprocessor {}

impl CudaBackend {
    /// Compiles (or loads from the kernel cache) the preprocessing kernel for `plan`, writing
    /// `input_type` values.
    pub fn preprocessor(
        &self,
        plan: &PreprocessPlan,
        input_type: InputType,
    ) -> Result<Preprocessor> {
        let args = KernelArgs::from_plan(plan)?;
        make_current(self.context())?;
        let module = Module::load(&cubin_for(
            SRC.to_string(),
            "isolane_preprocess.cu",
            device_arch()?,
        )?)?;
        let name =
            CString::new(input_type.kernel()).map_err(|e| EngineError::Runtime(e.to_string()))?;
        let mut func: cu::CUfunction = std::ptr::null_mut();
        // SAFETY: the module is loaded (and kept by the Preprocessor); the name is NUL-terminated.
        cu_check("cuModuleGetFunction", unsafe {
            cu::cuModuleGetFunction(&mut func, module.raw(), name.as_ptr())
        })?;
        // One thread per output element, at most a grid-stride loop's worth of blocks.
        let blocks = plan.output_len().div_ceil(BLOCK as usize).clamp(1, 65_535) as u32;
        Ok(Preprocessor {
            backend: self.clone(),
            func,
            grid: blocks,
            args,
            plan: *plan,
            input_type,
            host_io: None,
            half_host: Vec::new(),
            _module: module,
        })
    }
}

impl Preprocessor {
    /// Bytes of one frame (the kernel's input).
    pub fn frame_bytes(&self) -> usize {
        self.plan.frame.bytes()
    }

    /// Bytes of the model input it writes.
    pub fn output_bytes(&self) -> usize {
        self.plan.output_len() * self.input_type.bytes()
    }

    pub fn plan(&self) -> &PreprocessPlan {
        &self.plan
    }

    /// Queues the kernel on the backend's stream: `frame` (HWC bytes) into `output` (NCHW).
    /// Returns without waiting.
    ///
    /// # Safety
    /// `frame` must hold [`Preprocessor::frame_bytes`] and `output`
    /// [`Preprocessor::output_bytes`] of device memory usable in the backend's context, both
    /// alive until the stream has run the kernel, and nothing else may write `output` or
    /// `frame` meanwhile.
    pub unsafe fn launch(&self, frame: cu::CUdeviceptr, output: cu::CUdeviceptr) -> Result<()> {
        make_current(self.backend.context())?;
        let (mut src, mut dst, mut args) = (frame, output, self.args);
        let mut params: [*mut c_void; 3] = [
            &mut src as *mut _ as *mut c_void,
            &mut dst as *mut _ as *mut c_void,
            &mut args as *mut KernelArgs as *mut c_void,
        ];
        // SAFETY: the parameters match the kernel's (pointer, pointer, Args by value; the
        // driver copies them before returning); the caller vouches for the buffers.
        cu_check("cuLaunchKernel", unsafe {
            cu::cuLaunchKernel(
                self.func,
                self.grid,
                1,
                1,
                BLOCK,
                1,
                1,
                0,
                self.backend.stream(),
                params.as_mut_ptr(),
                std::ptr::null_mut(),
            )
        })
    }

    /// Queues the kernel writing straight into `model`'s input (its device staging, f32),
    /// then `model`'s job without its input copy, on the one stream the two share; pair with
    /// `model.wait()` and read the outputs as after a run. For a one-input model of this
    /// plan's output size, compiled on the same backend.
    ///
    /// # Safety
    /// `frame` as in [`Preprocessor::launch`].
    pub unsafe fn launch_into_model(
        &self,
        frame: cu::CUdeviceptr,
        model: &mut CudaModel,
    ) -> Result<()> {
        let input = self.model_input(model)?;
        // SAFETY: the caller vouches for `frame`; `input` is the model's own staging of
        // output_bytes() (checked), written before the model's job on the same stream.
        unsafe { self.launch(frame, input)? };
        model.launch_from_device()
    }

    /// A host frame into `model`: copied to the device, then [`Preprocessor::launch_into_model`].
    pub fn run_into_model(&mut self, frame: &[u8], model: &mut CudaModel) -> Result<()> {
        let (src, _) = self.upload(frame)?;
        // SAFETY: `src` holds the frame (upload copied it there).
        unsafe { self.launch_into_model(src, model) }
    }

    /// The model's input staging, if this preprocessing can write it.
    fn model_input(&self, model: &CudaModel) -> Result<cu::CUdeviceptr> {
        let refuse = |why: String| {
            Err(EngineError::InvalidArgument(format!(
                "preprocessing into a model: {why}"
            )))
        };
        if self.input_type.bytes() != 4 {
            return refuse(
                "a model's device input is f32 (it casts to its precision itself)".into(),
            );
        }
        if model.stream() != self.backend.stream() {
            return refuse(
                "the model runs on another stream; compile it on this preprocessor's backend"
                    .into(),
            );
        }
        if model.device_input(1).is_some() {
            return refuse("the model has more than one input".into());
        }
        match model.device_input(0) {
            Some((ptr, bytes)) if bytes == self.output_bytes() => Ok(ptr),
            Some((_, bytes)) => refuse(format!(
                "the model's input holds {} values, the preprocessing writes {}",
                bytes / 4,
                self.plan.output_len()
            )),
            None => refuse("the model has no input".into()),
        }
    }

    /// A host frame through the kernel into `out` (device values of this backend, f32: an
    /// `F32` or `F16AsF32` preprocessor), waited for: a stage's output that the stages after
    /// it copy from.
    pub fn run_to(&mut self, frame: &[u8], out: &crate::DeviceF32) -> Result<()> {
        if self.input_type.bytes() != 4 || out.len() != self.plan.output_len() {
            return Err(EngineError::InvalidArgument(format!(
                "preprocessing into device values: {} values of {} bytes, {} to write",
                out.len(),
                self.input_type.bytes(),
                self.plan.output_len()
            )));
        }
        if out.context() != self.backend.context() {
            return Err(EngineError::InvalidArgument(
                "preprocessing into device values of another context".into(),
            ));
        }
        let (src, _) = self.upload(frame)?;
        let stream = self.backend.stream();
        // SAFETY: `src` holds the frame; `out` holds output_len() f32s of this context
        // (checked) and its owner lets nobody read it until this returns; the wait ends the
        // kernel before then.
        unsafe {
            self.launch(src, out.ptr())?;
            cu_check("cuStreamSynchronize", cu::cuStreamSynchronize(stream))?;
        }
        Ok(())
    }

    /// A frame from host memory through the kernel and back: copy in, launch, copy out, wait.
    /// f16 values are returned widened to f32 (exactly). For tests and stages whose frames are
    /// on the host; a pipeline with frames on the device calls [`Preprocessor::launch`].
    pub fn run_host(&mut self, frame: &[u8]) -> Result<Vec<f32>> {
        let mut out = vec![0f32; self.plan.output_len()];
        self.run_host_into(frame, &mut out)?;
        Ok(out)
    }

    /// [`Preprocessor::run_host`] into `out` (`plan().output_len()` values), allocating
    /// nothing after the first call: for a stage that runs it per job.
    pub fn run_host_into(&mut self, frame: &[u8], out: &mut [f32]) -> Result<()> {
        if out.len() != self.plan.output_len() {
            return Err(EngineError::InvalidArgument(format!(
                "preprocessing: the output has {} values, the plan needs {}",
                out.len(),
                self.plan.output_len()
            )));
        }
        let (src, dst) = self.upload(frame)?;
        let stream = self.backend.stream();
        // f32 comes straight into `out`; f16 through a host buffer kept for the next call.
        let (host, bytes) = match self.input_type {
            InputType::F32 | InputType::F16AsF32 => {
                (out.as_mut_ptr() as *mut c_void, std::mem::size_of_val(out))
            }
            InputType::F16 => {
                self.half_host.resize(out.len(), 0);
                (
                    self.half_host.as_mut_ptr() as *mut c_void,
                    self.half_host.len() * 2,
                )
            }
        };
        // SAFETY: `src` holds the frame and `dst` output_bytes() == `bytes` (upload made them
        // so; `out` has the plan's length); the copy back follows the kernel on the same
        // stream, and `host` outlives the wait.
        unsafe {
            self.launch(src, dst)?;
            cu_check(
                "cuMemcpyDtoHAsync",
                cu::cuMemcpyDtoHAsync_v2(host, dst, bytes, stream),
            )?;
            cu_check("cuStreamSynchronize", cu::cuStreamSynchronize(stream))?;
        }
        if self.input_type == InputType::F16 {
            for (value, bits) in out.iter_mut().zip(&self.half_host) {
                *value = half::f16::from_bits(*bits).to_f32();
            }
        }
        Ok(())
    }

    /// Device time of one launch on `frame` (copied to the device once): the median of
    /// `launches` launches, each timed with CUDA events, in milliseconds.
    pub fn device_ms(&mut self, frame: &[u8], launches: usize) -> Result<f64> {
        let (src, dst) = self.upload(frame)?;
        let events = Events::new()?;
        let mut times = Vec::with_capacity(launches.max(1));
        for _ in 0..launches.max(1) {
            // SAFETY: as in run_host; each launch is waited for by `time`.
            let ms = events.time(self.backend.stream(), &mut || unsafe {
                self.launch(src, dst)
            })?;
            times.push(f64::from(ms));
        }
        times.sort_by(f64::total_cmp);
        Ok(times[times.len() / 2])
    }

    /// Copies `frame` into this preprocessor's device frame (made on first use, with the
    /// device output) and returns both pointers.
    fn upload(&mut self, frame: &[u8]) -> Result<(cu::CUdeviceptr, cu::CUdeviceptr)> {
        if frame.len() != self.frame_bytes() {
            return Err(EngineError::InvalidArgument(format!(
                "preprocessing: the frame has {} bytes, the plan needs {}",
                frame.len(),
                self.frame_bytes()
            )));
        }
        make_current(self.backend.context())?;
        let io = match self.host_io.take() {
            Some(io) => io,
            None => (
                DeviceBuffer::new(self.frame_bytes())?,
                DeviceBuffer::new(self.output_bytes())?,
            ),
        };
        let (src, dst) = (io.0.ptr, io.1.ptr);
        self.host_io = Some(io);
        // On the backend's stream (non-blocking: a plain cuMemcpyHtoD would not be ordered
        // before the kernel), waited for before `frame`'s borrow ends.
        let stream = self.backend.stream();
        // SAFETY: `src` holds frame_bytes(), which `frame` has (checked); no launch of ours is
        // pending (each is waited for), and the wait ends the copy before `frame` is released.
        unsafe {
            cu_check(
                "cuMemcpyHtoDAsync",
                cu::cuMemcpyHtoDAsync_v2(src, frame.as_ptr() as *const c_void, frame.len(), stream),
            )?;
            cu_check("cuStreamSynchronize", cu::cuStreamSynchronize(stream))?;
        }
        Ok((src, dst))
    }
}

impl Drop for Preprocessor {
    fn drop(&mut self) {
        if make_current(self.backend.context()).is_err() {
            return;
        }
        // SAFETY: the backend's stream; a launch of ours may still read our buffers.
        let _ = unsafe { cu::cuStreamSynchronize(self.backend.stream()) };
        // The buffers and then the module drop after this, with the context current.
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kernel_args_have_the_c_struct_layout() {
        // Fifteen 4-byte fields, no padding: what `struct Args` in SRC is on the device.
        assert_eq!(std::mem::size_of::<KernelArgs>(), 60);
        assert_eq!(std::mem::align_of::<KernelArgs>(), 4);
        assert!(SRC.contains("int in_h, in_w, channels, out_h, out_w, crop_top, crop_left;"));
        assert!(SRC.contains("float scale_y, scale_x;\n    float gain[3], bias[3];"));
    }
}
