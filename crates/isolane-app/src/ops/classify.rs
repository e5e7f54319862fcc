//! Classifier logits → the `k` most probable classes with their softmax probabilities.

use crate::data::{Classes, Tensor};

#[derive(Debug, thiserror::Error, PartialEq)]
#[error("classify: expected a [1, classes] tensor; found {0:?}")]
pub struct BadShape(pub Vec<usize>);

/// Per-class scores of a `[1, K]` tensor as probabilities (softmax of the logits).
pub fn probabilities(t: &Tensor) -> Result<Vec<f32>, BadShape> {
    match t.shape[..] {
        [1, k] if k > 0 && t.data.len() == k => Ok(super::softmax(&t.data)),
        _ => Err(BadShape(t.shape.clone())),
    }
}

/// The `k` best of `probs`, best first (ties: the lower class first).
pub fn top_k(probs: &[f32], k: usize) -> Classes {
    let mut order: Vec<u32> = (0..probs.len() as u32).collect();
    order.sort_by(|&a, &b| {
        probs[b as usize]
            .total_cmp(&probs[a as usize])
            .then(a.cmp(&b))
    });
    Classes {
        top: order
            .into_iter()
            .take(k)
            .map(|c| (c, probs[c as usize]))
            .collect(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn top_k_of_softmax() {
        let t = Tensor {
            shape: vec![1, 4],
            data: vec![0.0, 3.0, 1.0, 3.0],
            frame_map: None,
        };
        let p = probabilities(&t).unwrap();
        let c = top_k(&p, 2);
        assert_eq!(c.top.iter().map(|x| x.0).collect::<Vec<_>>(), vec![1, 3]);
        // e^3 / (1 + 2e^3 + e) = 0.4576
        assert!((c.top[0].1 - 0.457_6).abs() < 1e-4, "{c:?}");
        assert!(probabilities(&Tensor {
            shape: vec![1, 2, 3],
            data: vec![0.0; 6],
            frame_map: None
        })
        .is_err());
    }
}
