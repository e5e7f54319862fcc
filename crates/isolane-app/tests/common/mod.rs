//! What the integration tests share.

use isolane_app::spec::ModelNames;
use isolane_engine::CompiledModel;

/// Takes every model name as a built-in: the tests' builders make stand-ins for whatever a
/// stage names.
pub struct Names;

impl ModelNames for Names {
    fn is_builtin(&self, _: &str) -> bool {
        true
    }
    fn builtins(&self) -> Vec<String> {
        vec![]
    }
}

/// A stand-in model: `[1, 3, 4, 4]` in, each channel's mean out, "on" GPU `gpu`; it fails after
/// `fail_after` runs where that is set.
#[allow(dead_code)] // each test binary uses its part of this module
pub struct ChannelMeans {
    pub gpu: u32,
    pub input: Vec<f32>,
    pub output: Vec<f32>,
    pub runs: usize,
    pub fail_after: Option<usize>,
}

#[allow(dead_code)]
impl ChannelMeans {
    pub fn new(gpu: u32) -> ChannelMeans {
        ChannelMeans {
            gpu,
            input: vec![0.0; 48],
            output: vec![0.0; 3],
            runs: 0,
            fail_after: None,
        }
    }
}

impl CompiledModel for ChannelMeans {
    fn input_shape_at(&self, _: usize) -> &[usize] {
        &[1, 3, 4, 4]
    }
    fn output_shape_at(&self, _: usize) -> &[usize] {
        &[1, 3]
    }
    fn input_mut_at(&mut self, _: usize) -> &mut [f32] {
        &mut self.input
    }
    fn output_at(&self, _: usize) -> &[f32] {
        &self.output
    }
    fn run(&mut self) -> isolane_engine::Result<()> {
        self.runs += 1;
        if self.fail_after.is_some_and(|n| self.runs > n) {
            return Err(isolane_engine::EngineError::InvalidArgument(
                "stand-in failure".into(),
            ));
        }
        for c in 0..3 {
            self.output[c] = self.input[c * 16..(c + 1) * 16].iter().sum::<f32>() / 16.0;
        }
        Ok(())
    }
    fn as_any_mut(&mut self) -> Option<&mut dyn std::any::Any> {
        Some(self)
    }
}
