//! The backend interface: compile a [`Graph`] once per (batch, precision), run it many times.
//!
//! A [`CompiledModel`] owns every buffer it needs (input, activations, outputs, scratch), so
//! [`CompiledModel::run`] allocates nothing of its own: the caller writes the input through
//! [`CompiledModel::input_mut`], calls `run`, and reads [`CompiledModel::output`]. A CUDA backend
//! implements the same traits with pinned host buffers behind `input_mut`/`output` and a device
//! arena behind `run`.

use std::fmt;

use crate::error::Result;
use crate::ir::Graph;

/// Numeric precision a model is compiled for.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Precision {
    /// IEEE f32 everywhere (the CPU backend's only precision).
    Fp32,
    /// f32 storage, TF32 tensor-core math.
    Tf32,
    /// f16 storage and math, f32 accumulation.
    Fp16,
    /// bf16 storage and math, f32 accumulation.
    Bf16,
}

impl Precision {
    /// All precisions, in order.
    pub const ALL: [Precision; 4] = [
        Precision::Fp32,
        Precision::Tf32,
        Precision::Fp16,
        Precision::Bf16,
    ];

    /// The lowercase name used in scenarios and on the command line.
    pub fn as_str(self) -> &'static str {
        match self {
            Precision::Fp32 => "fp32",
            Precision::Tf32 => "tf32",
            Precision::Fp16 => "fp16",
            Precision::Bf16 => "bf16",
        }
    }
}

impl fmt::Display for Precision {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl std::str::FromStr for Precision {
    type Err = crate::error::EngineError;
    fn from_str(s: &str) -> Result<Self> {
        Precision::ALL
            .into_iter()
            .find(|p| p.as_str() == s)
            .ok_or_else(|| {
                crate::error::EngineError::InvalidArgument(format!(
                    "unknown precision `{s}` (fp32, tf32, fp16, bf16)"
                ))
            })
    }
}

/// Something that turns graphs into runnable models.
pub trait Backend: Send + Sync {
    /// A short name ("cpu", "cuda").
    fn name(&self) -> &str;
    /// Optimises and plans `graph` for a batch size and precision. All the expensive work
    /// (graph passes, memory planning, weight layout) happens here, once.
    fn compile(
        &self,
        graph: &Graph,
        batch: usize,
        precision: Precision,
    ) -> Result<Box<dyn CompiledModel>>;
}

/// A model compiled for one (batch, precision), owning its buffers.
pub trait CompiledModel: Send {
    /// Number of graph inputs.
    fn num_inputs(&self) -> usize {
        1
    }
    /// Number of graph outputs.
    fn num_outputs(&self) -> usize {
        1
    }
    /// Shape of input `i` (batch included).
    fn input_shape_at(&self, i: usize) -> &[usize];
    /// Shape of output `i` (batch included).
    fn output_shape_at(&self, i: usize) -> &[usize];
    /// Writable buffer of input `i` (row-major f32). Panics-free: out of range gives an empty slice.
    fn input_mut_at(&mut self, i: usize) -> &mut [f32];
    /// Result buffer of output `i`, valid after [`CompiledModel::run`].
    fn output_at(&self, i: usize) -> &[f32];
    /// Runs the forward pass on the current input buffers.
    fn run(&mut self) -> Result<()>;

    /// Shape of the first input.
    fn input_shape(&self) -> &[usize] {
        self.input_shape_at(0)
    }
    /// Shape of the first output.
    fn output_shape(&self) -> &[usize] {
        self.output_shape_at(0)
    }
    /// Buffer of the first input.
    fn input_mut(&mut self) -> &mut [f32] {
        self.input_mut_at(0)
    }
    /// Buffer of the first output.
    fn output(&self) -> &[f32] {
        self.output_at(0)
    }
    /// Bytes of activation memory planned (the arena), for reports.
    fn arena_bytes(&self) -> usize {
        0
    }
    /// The backend's own model, for a caller that knows the backend (an app's stage handing
    /// device memory to a CUDA model); `None` where the model offers nothing beyond this trait.
    fn as_any_mut(&mut self) -> Option<&mut dyn std::any::Any> {
        None
    }
}
