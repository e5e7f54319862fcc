//! The CPU operators of app stages: pure functions on [`crate::data`] types, each tested on
//! hand-computed values.

pub mod classify;
pub mod preprocess;
pub mod seg;
pub mod vote;
pub mod yolo;

/// Softmax of `logits` (numerically stable: the max is subtracted first).
pub fn softmax(logits: &[f32]) -> Vec<f32> {
    let max = logits.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    let exp: Vec<f32> = logits.iter().map(|v| (v - max).exp()).collect();
    let sum: f32 = exp.iter().sum();
    exp.into_iter().map(|e| e / sum).collect()
}

#[cfg(test)]
mod tests {
    #[test]
    fn softmax_sums_to_one_and_keeps_order() {
        let p = super::softmax(&[1.0, 2.0, 3.0]);
        assert!((p.iter().sum::<f32>() - 1.0).abs() < 1e-6);
        // e^0 / (e^-2 + e^-1 + e^0) = 0.66524
        assert!((p[2] - 0.665_241).abs() < 1e-5, "{p:?}");
        // large logits do not overflow
        let q = super::softmax(&[1000.0, 1000.0]);
        assert_eq!(q, vec![0.5, 0.5]);
    }
}
