//! An ensemble's votes over its members' outputs (each a `[1, K]` classifier output, logits).

use crate::data::{Classes, Tensor};

#[derive(Debug, thiserror::Error, PartialEq)]
pub enum VoteError {
    #[error("ensemble members' outputs differ in shape ({0:?} and {1:?}); a vote needs the same classes from every member")]
    Shapes(Vec<usize>, Vec<usize>),
    #[error(transparent)]
    Shape(#[from] super::classify::BadShape),
}

fn same_shapes(outputs: &[&Tensor]) -> Result<(), VoteError> {
    for o in outputs.iter().skip(1) {
        if o.shape != outputs[0].shape {
            return Err(VoteError::Shapes(outputs[0].shape.clone(), o.shape.clone()));
        }
    }
    Ok(())
}

/// The most frequent top-1 class; ties go to the lowest class id. Its score is the share of
/// members that voted for it.
pub fn majority(outputs: &[&Tensor]) -> Result<Classes, VoteError> {
    same_shapes(outputs)?;
    let mut votes: Vec<(u32, usize)> = Vec::new();
    for o in outputs {
        let p = super::classify::probabilities(o)?;
        let top = super::classify::top_k(&p, 1).top[0].0;
        match votes.iter_mut().find(|(c, _)| *c == top) {
            Some(v) => v.1 += 1,
            None => votes.push((top, 1)),
        }
    }
    votes.sort_by(|a, b| b.1.cmp(&a.1).then(a.0.cmp(&b.0)));
    let n = outputs.len() as f32;
    Ok(Classes {
        top: votes.into_iter().map(|(c, v)| (c, v as f32 / n)).collect(),
    })
}

/// The mean of the members' softmax probabilities, its `k` best classes.
pub fn mean(outputs: &[&Tensor], k: usize) -> Result<Classes, VoteError> {
    same_shapes(outputs)?;
    let mut sum: Vec<f32> = Vec::new();
    for o in outputs {
        let p = super::classify::probabilities(o)?;
        if sum.is_empty() {
            sum = p;
        } else {
            sum.iter_mut().zip(p).for_each(|(s, v)| *s += v);
        }
    }
    let n = outputs.len() as f32;
    sum.iter_mut().for_each(|s| *s /= n);
    Ok(super::classify::top_k(&sum, k))
}

/// The members' outputs stacked along a new first axis: `[members, ...their shape]`, the
/// input of a user's voter model.
pub fn stack(outputs: &[&Tensor]) -> Result<Tensor, VoteError> {
    same_shapes(outputs)?;
    let mut shape = vec![outputs.len()];
    shape.extend(&outputs[0].shape);
    Ok(Tensor {
        shape,
        data: outputs
            .iter()
            .flat_map(|o| o.data.iter().copied())
            .collect(),
        frame_map: None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn logits(v: &[f32]) -> Tensor {
        Tensor {
            shape: vec![1, v.len()],
            data: v.to_vec(),
            frame_map: None,
        }
    }

    #[test]
    fn majority_counts_top_1_and_breaks_ties_low() {
        let a = logits(&[0.0, 5.0, 0.0]);
        let b = logits(&[0.0, 0.0, 5.0]);
        let c = logits(&[0.0, 4.0, 0.0]);
        let v = majority(&[&a, &b, &c]).unwrap();
        assert_eq!(v.top[0].0, 1);
        assert!((v.top[0].1 - 2.0 / 3.0).abs() < 1e-6);
        // one vote each: the lowest class wins
        assert_eq!(majority(&[&b, &a]).unwrap().top[0].0, 1);
    }

    #[test]
    fn mean_can_differ_from_majority() {
        // two members barely prefer class 0; one is sure of class 1
        let a = logits(&[0.1, 0.0]);
        let c = logits(&[0.0, 10.0]);
        assert_eq!(majority(&[&a, &a, &c]).unwrap().top[0].0, 0);
        let m = mean(&[&a, &a, &c], 2).unwrap();
        assert_eq!(m.top[0].0, 1);
        // by hand: p1 = (2 · 0.47502 + 0.99995) / 3 = 0.64999
        assert!((m.top[0].1 - 0.649_99).abs() < 1e-4, "{m:?}");
    }

    #[test]
    fn stack_and_shape_checks() {
        let a = logits(&[1.0, 2.0]);
        let b = logits(&[3.0, 4.0]);
        let s = stack(&[&a, &b]).unwrap();
        assert_eq!(s.shape, vec![2, 1, 2]);
        assert_eq!(s.data, vec![1.0, 2.0, 3.0, 4.0]);
        let c = logits(&[1.0, 2.0, 3.0]);
        assert!(matches!(majority(&[&a, &c]), Err(VoteError::Shapes(..))));
    }
}
