//! A calibrated model's whole-model fallback: its quantized plan and its float plan built and
//! timed whole, the faster kept.
//!
//! Each quantized product already declines quantization where its float product alone is
//! faster (the plain float step, TensorRT's per-layer fallback). What a layer alone cannot see
//! is what the quantization costs between layers: the quantize and dequantize passes where a
//! value is kept as bytes, and the kernels fusion no longer merges. On the H200 those made a
//! calibrated vit_b_16 0.55× and mobilenet_v2 0.79× of their fp16 speed at batch 1 (session
//! 38), although each layer kept its faster candidate. So a calibrated model is also built
//! without its quantization, at the same float precision, and the two forwards are timed
//! alternately on this GPU; the float plan is kept only where it is faster by more than
//! [`FLOAT_PLAN_MARGIN`]. A QDQ file is never given this choice: its quantization is its
//! author's, not isolane's.

use crate::{CompileOptions, CudaBackend, CudaModel, Result};
use isolane_engine::{CompiledModel, Graph, Precision};

/// How much faster (as a fraction of the quantized plan's time) the float plan must run to
/// be kept: within it the two are the same speed as far as a few dozen timed replays can
/// tell, and the quantized plan, which the user asked for, stays.
pub const FLOAT_PLAN_MARGIN: f64 = 0.03;

/// Rounds of alternating timing, and replays a round: the median of each plan's rounds is
/// compared, so that a clock or cache change during one round does not decide.
const ROUNDS: usize = 3;
const REPLAYS: usize = 20;

/// The two plans of a calibrated model timed whole ([`CudaBackend::compile_calibrated`]).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct WholeModelChoice {
    /// The quantized plan's forward (device time, ms, median of the rounds).
    pub quantized_ms: f64,
    /// The float plan's forward.
    pub float_ms: f64,
    /// Whether the float plan was kept.
    pub kept_float: bool,
}

impl WholeModelChoice {
    /// The choice for two timed forwards.
    pub fn of(quantized_ms: f64, float_ms: f64) -> WholeModelChoice {
        WholeModelChoice {
            quantized_ms,
            float_ms,
            kept_float: float_plan_wins(quantized_ms, float_ms),
        }
    }

    /// One line for the user: both times and which plan runs.
    pub fn describe(&self, quantized: &str, float: &str) -> String {
        let kept = if self.kept_float {
            format!(
                "runs the {float} plan (no activation quantized; \
                 ISOLANE_CUDA_QUANT_FALLBACK=off keeps the {quantized} plan)"
            )
        } else {
            format!("runs the {quantized} plan")
        };
        format!(
            "{quantized} plan {:.4} ms a forward, {float} plan {:.4} ms on this GPU: {kept}",
            self.quantized_ms, self.float_ms
        )
    }
}

/// Whether a float forward of `float_ms` replaces a quantized one of `quantized_ms`: only when
/// it is faster by more than [`FLOAT_PLAN_MARGIN`], and never on a time that is not a time.
pub fn float_plan_wins(quantized_ms: f64, float_ms: f64) -> bool {
    quantized_ms.is_finite()
        && float_ms.is_finite()
        && float_ms > 0.0
        && float_ms * (1.0 + FLOAT_PLAN_MARGIN) < quantized_ms
}

/// What [`CudaBackend::compile_calibrated`] did besides the quantized plan.
#[derive(Clone, Debug, PartialEq)]
pub enum FallbackOutcome {
    /// The fallback is off ([`crate::BuildOptions::quant_fallback`]): one plan built.
    Off,
    /// Both plans built and timed whole.
    Timed(WholeModelChoice),
    /// The float plan could not be built here (out of memory in a small partition, say): the
    /// quantized plan runs, and this is why there was no choice.
    FloatFailed(String),
}

impl FallbackOutcome {
    /// The timed choice, where there was one.
    pub fn timed(&self) -> Option<WholeModelChoice> {
        match self {
            FallbackOutcome::Timed(c) => Some(*c),
            _ => None,
        }
    }

    /// Whether the float plan runs.
    pub fn kept_float(&self) -> bool {
        self.timed().is_some_and(|c| c.kept_float)
    }

    /// The line to tell the user (none when the fallback is off).
    pub fn describe(&self, quantized: &str, float: &str) -> Option<String> {
        match self {
            FallbackOutcome::Off => None,
            FallbackOutcome::Timed(c) => Some(c.describe(quantized, float)),
            FallbackOutcome::FloatFailed(why) => Some(format!(
                "runs the {quantized} plan: its {float} plan, to time against it, could not be                  built here ({why})"
            )),
        }
    }
}

impl CudaBackend {
    /// Compiles a calibrated model: `quantized` (isolane's calibration of `float`) with this
    /// backend's options (built [`crate::BuildOptions::for_calibrated`] by the caller), and,
    /// unless [`crate::BuildOptions::quant_fallback`] is off, `float` at the same `precision`;
    /// both timed whole, the faster kept ([`FallbackOutcome`]). A quantized plan that fails to
    /// build is the error: it is not replaced. A float plan that fails to build (the second
    /// model needs its own memory while the first is held) leaves the quantized plan running.
    pub fn compile_calibrated(
        &self,
        float: &Graph,
        quantized: &Graph,
        batch: usize,
        precision: Precision,
        options: &CompileOptions,
    ) -> Result<(CudaModel, FallbackOutcome)> {
        let mut q = self.compile_cuda_with(quantized, batch, precision, options)?;
        if !self.build.quant_fallback {
            return Ok((q, FallbackOutcome::Off));
        }
        let mut f = match self.compile_cuda_with(float, batch, precision, options) {
            Ok(f) => f,
            Err(e) => return Ok((q, FallbackOutcome::FloatFailed(e.to_string()))),
        };
        let (tq, tf) = time_alternately(&mut q, &mut f)?;
        let choice = WholeModelChoice::of(tq, tf);
        let kept = if choice.kept_float { f } else { q };
        Ok((kept, FallbackOutcome::Timed(choice)))
    }
}

/// Both models' forwards, timed in alternating rounds on the same input values: the median of
/// each one's rounds (ms).
fn time_alternately(a: &mut CudaModel, b: &mut CudaModel) -> Result<(f64, f64)> {
    for m in [&mut *a, &mut *b] {
        for (i, v) in m.input_mut().iter_mut().enumerate() {
            // Ordinary values (no zeros, denormals or NaN that some kernel might shortcut).
            *v = ((i % 97) as f32 - 48.0) / 24.0;
        }
        // The job once whole: its input copied, its caches as a job leaves them.
        m.run()?;
    }
    let (mut ta, mut tb) = (Vec::with_capacity(ROUNDS), Vec::with_capacity(ROUNDS));
    for _ in 0..ROUNDS {
        ta.push(a.device_ms(REPLAYS)?);
        tb.push(b.device_ms(REPLAYS)?);
    }
    Ok((median(&mut ta), median(&mut tb)))
}

fn median(t: &mut [f64]) -> f64 {
    t.sort_by(|x, y| x.total_cmp(y));
    t.get(t.len() / 2).copied().unwrap_or(f64::NAN)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_float_plan_replaces_the_quantized_one_only_when_clearly_faster() {
        // vit_b_16 at batch 1 on the H200 (session 38): fp16 0.479, int8 0.872 ms a job.
        assert!(float_plan_wins(0.872, 0.479));
        // resnet50 at batch 1: the two within noise, the quantized plan stays.
        assert!(!float_plan_wins(0.297, 0.298));
        assert!(!float_plan_wins(0.300, 0.295));
        // Faster by more than the margin.
        assert!(float_plan_wins(0.300, 0.290));
        // The quantized plan faster: it stays.
        assert!(!float_plan_wins(1.58, 1.69));
    }

    #[test]
    fn a_time_that_is_not_a_time_never_replaces_the_quantized_plan() {
        for (q, f) in [
            (f64::NAN, 0.1),
            (0.5, f64::NAN),
            (f64::INFINITY, 0.1),
            (0.5, 0.0),
            (0.5, -1.0),
        ] {
            assert!(!float_plan_wins(q, f), "{q} {f}");
        }
    }

    #[test]
    fn the_line_names_both_times_and_the_plan_that_runs() {
        let kept = WholeModelChoice::of(0.872, 0.479);
        assert!(kept.kept_float);
        let line = kept.describe("int8", "fp16");
        assert!(line.contains("int8 plan 0.8720 ms"), "{line}");
        assert!(line.contains("fp16 plan 0.4790 ms"), "{line}");
        assert!(line.contains("runs the fp16 plan"), "{line}");
        assert!(line.contains("ISOLANE_CUDA_QUANT_FALLBACK=off"), "{line}");
        let stays = WholeModelChoice::of(0.297, 0.298);
        assert!(!stays.kept_float);
        assert!(stays
            .describe("int8", "fp16")
            .ends_with("runs the int8 plan"));
    }
}
