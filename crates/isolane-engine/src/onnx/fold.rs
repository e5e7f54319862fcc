//! Constant propagation at import: arrays of known values and the ops that move or combine them.
//!
//! Shape subgraphs (Shape → Gather → Unsqueeze → Concat → Reshape, ConstantOfShape, Range, Where...)
//! compute on integers that depend on the input's shape. All dimensions are static except the
//! batch, so every such integer is `a·B + c` for the batch size B ([`Sym`]). Folding with that
//! form keeps the imported graph batch-agnostic: a Reshape target `[B·12, S, 64]` becomes
//! `[BatchTimes(12), Fixed(S), Fixed(64)]`. Anything that is not of that form (B², a comparison
//! whose answer depends on B) is an error, never a guess.

use crate::ir;

/// An integer `a·B + c`, B being the batch size chosen at compile time (B ≥ 1).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Sym {
    pub a: i64,
    pub c: i64,
}

impl Sym {
    pub const fn k(c: i64) -> Sym {
        Sym { a: 0, c }
    }

    pub fn is_const(self) -> bool {
        self.a == 0
    }

    /// The value at batch `b`.
    pub fn at(self, b: i64) -> i64 {
        self.a.saturating_mul(b).saturating_add(self.c)
    }

    pub fn add(self, o: Sym) -> Result<Sym, String> {
        Ok(Sym {
            a: self.a.checked_add(o.a).ok_or("overflow")?,
            c: self.c.checked_add(o.c).ok_or("overflow")?,
        })
    }

    pub fn sub(self, o: Sym) -> Result<Sym, String> {
        Ok(Sym {
            a: self.a.checked_sub(o.a).ok_or("overflow")?,
            c: self.c.checked_sub(o.c).ok_or("overflow")?,
        })
    }

    pub fn mul(self, o: Sym) -> Result<Sym, String> {
        let (k, s) = match (self.is_const(), o.is_const()) {
            (true, _) => (self.c, o),
            (_, true) => (o.c, self),
            _ => return Err("a product of two batch-dependent values (B²)".into()),
        };
        Ok(Sym {
            a: s.a.checked_mul(k).ok_or("overflow")?,
            c: s.c.checked_mul(k).ok_or("overflow")?,
        })
    }

    /// ONNX integer Div (truncates toward zero, as C and onnxruntime do).
    pub fn div(self, o: Sym) -> Result<Sym, String> {
        if !o.is_const() {
            // (a·B) / (b·B) is a / b for every batch: PyTorch's classic export of
            // `windows.shape[0] // B` (GC ViT's window attention) divides so.
            if self.c == 0 && o.c == 0 && o.a != 0 {
                return Ok(Sym::k(self.a.checked_div(o.a).ok_or("overflow")?));
            }
            return Err("division by a batch-dependent value".into());
        }
        if o.c == 0 {
            return Err("integer division by zero".into());
        }
        if self.is_const() {
            return Ok(Sym::k(self.c.checked_div(o.c).ok_or("overflow")?));
        }
        if let (Some(0), Some(0)) = (self.a.checked_rem(o.c), self.c.checked_rem(o.c)) {
            return Ok(Sym {
                a: self.a.checked_div(o.c).ok_or("overflow")?,
                c: self.c.checked_div(o.c).ok_or("overflow")?,
            });
        }
        Err(format!(
            "({}·B + {}) / {} is not a whole multiple of the batch",
            self.a, self.c, o.c
        ))
    }

    /// `self == o` for every batch B ≥ 1, or an error if the answer depends on B.
    pub fn equal(self, o: Sym) -> Result<bool, String> {
        let d = self.sub(o)?; // d.a·B + d.c == 0 ?
        if d.a == 0 {
            return Ok(d.c == 0);
        }
        // Zero only at B = -c/a; if that is not a positive integer, never equal.
        let root =
            d.c.checked_rem(d.a)
                .filter(|&r| r == 0)
                .and_then(|_| d.c.checked_div(d.a));
        if root.is_some_and(|q| q <= -1) {
            return Err("a comparison whose result depends on the batch size".into());
        }
        Ok(false)
    }

    /// `self < o` for every batch B ≥ 1, or an error if the answer depends on B.
    pub fn less(self, o: Sym) -> Result<bool, String> {
        let d = self.sub(o)?;
        let (lo, hi) = (d.at(1), d.at(1 << 20));
        match d.a {
            0 => Ok(d.c < 0),
            _ if lo < 0 && hi < 0 => Ok(true),
            _ if lo >= 0 && hi >= 0 && d.a > 0 => Ok(false),
            _ => Err("a comparison whose result depends on the batch size".into()),
        }
    }

    pub fn max(self, o: Sym) -> Result<Sym, String> {
        Ok(if self.less(o)? { o } else { self })
    }

    pub fn min(self, o: Sym) -> Result<Sym, String> {
        Ok(if self.less(o)? { self } else { o })
    }
}

impl std::fmt::Display for Sym {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match (self.a, self.c) {
            (0, c) => write!(f, "{c}"),
            (1, 0) => write!(f, "B"),
            (a, 0) => write!(f, "{a}·B"),
            (a, c) => write!(f, "{a}·B{c:+}"),
        }
    }
}

/// A dense C-order array of known values.
#[derive(Debug, Clone, PartialEq)]
pub struct Arr<T> {
    pub shape: Vec<usize>,
    pub data: Vec<T>,
}

/// Largest constant that folding may create (bytes, 256 MiB: 2^26 floats, 2^24 integers, which
/// are held as [`Sym`]s): guards ConstantOfShape/Range/Expand against a shape that is wrong by
/// orders of magnitude exhausting memory. Checked before the constant is allocated.
pub const MAX_FOLD_BYTES: usize = 1 << 28;

/// The elements of a float constant of `shape`, or an error past [`MAX_FOLD_BYTES`].
pub fn numel(shape: &[usize]) -> Result<usize, String> {
    numel_of::<f32>(shape)
}

/// The elements of a constant of `T`s of `shape`, or an error past [`MAX_FOLD_BYTES`].
pub fn numel_of<T>(shape: &[usize]) -> Result<usize, String> {
    let most = MAX_FOLD_BYTES / std::mem::size_of::<T>().max(1);
    shape
        .iter()
        .try_fold(1usize, |a, &d| a.checked_mul(d))
        .filter(|&n| n <= most)
        .ok_or_else(|| format!("a constant of shape {shape:?} is too large to fold"))
}

fn strides(shape: &[usize]) -> Vec<usize> {
    let mut s = vec![1; shape.len()];
    for i in (0..shape.len().saturating_sub(1)).rev() {
        s[i] = s[i + 1] * shape[i + 1];
    }
    s
}

/// Calls `f(out_index, multi_index)` for every element of `shape` in C order.
fn for_each_index(shape: &[usize], mut f: impl FnMut(usize, &[usize])) {
    let n: usize = shape.iter().product();
    let mut idx = vec![0usize; shape.len()];
    for o in 0..n {
        f(o, &idx);
        for d in (0..shape.len()).rev() {
            idx[d] += 1;
            if idx[d] < shape[d] {
                break;
            }
            idx[d] = 0;
        }
    }
}

impl<T: Clone> Arr<T> {
    pub fn new(shape: Vec<usize>, data: Vec<T>) -> Self {
        debug_assert_eq!(shape.iter().product::<usize>(), data.len());
        Arr { shape, data }
    }

    pub fn scalar(v: T) -> Self {
        Arr {
            shape: vec![],
            data: vec![v],
        }
    }

    /// ONNX CumSum along `axis` (normalised): each element the sum of those before it along
    /// the axis (`exclusive`: without itself), counted from the end when `reverse`.
    pub fn cumsum(&self, axis: usize, exclusive: bool, reverse: bool) -> Arr<T>
    where
        T: Copy + Default + std::ops::Add<Output = T>,
    {
        let n = self.shape[axis];
        let inner: usize = self.shape[axis + 1..].iter().product();
        let outer: usize = self.shape[..axis].iter().product();
        let mut out = self.data.clone();
        for o in 0..outer {
            for i in 0..inner {
                let mut acc = T::default();
                for step in 0..n {
                    let k = if reverse { n - 1 - step } else { step };
                    let at = (o * n + k) * inner + i;
                    let v = self.data[at];
                    if exclusive {
                        out[at] = acc;
                        acc = acc + v;
                    } else {
                        acc = acc + v;
                        out[at] = acc;
                    }
                }
            }
        }
        Arr {
            shape: self.shape.clone(),
            data: out,
        }
    }

    pub fn map<U>(&self, f: impl Fn(&T) -> U) -> Arr<U> {
        Arr {
            shape: self.shape.clone(),
            data: self.data.iter().map(f).collect(),
        }
    }

    pub fn try_map<U>(&self, f: impl Fn(&T) -> Result<U, String>) -> Result<Arr<U>, String> {
        Ok(Arr {
            shape: self.shape.clone(),
            data: self.data.iter().map(f).collect::<Result<_, _>>()?,
        })
    }

    pub fn reshape(&self, shape: Vec<usize>) -> Result<Self, String> {
        if shape.iter().product::<usize>() != self.data.len() {
            return Err(format!("cannot reshape {:?} into {shape:?}", self.shape));
        }
        Ok(Arr {
            shape,
            data: self.data.clone(),
        })
    }

    /// Output element `o` at multi-index `idx` takes source flat index `src(idx)`.
    fn gather_by(
        &self,
        out_shape: Vec<usize>,
        src: impl Fn(&[usize]) -> usize,
    ) -> Result<Self, String> {
        let n = numel_of::<T>(&out_shape)?;
        let mut data = Vec::with_capacity(n);
        for_each_index(&out_shape, |_, idx| data.push(self.data[src(idx)].clone()));
        Ok(Arr {
            shape: out_shape,
            data,
        })
    }

    pub fn transpose(&self, perm: &[usize]) -> Result<Self, String> {
        let st = strides(&self.shape);
        let out: Vec<usize> = perm.iter().map(|&p| self.shape[p]).collect();
        self.gather_by(out, |idx| {
            idx.iter().zip(perm).map(|(&i, &p)| i * st[p]).sum()
        })
    }

    /// numpy broadcast to `shape` (which must already be the broadcast result).
    pub fn broadcast_to(&self, shape: &[usize]) -> Result<Self, String> {
        if self.shape == shape {
            return Ok(self.clone());
        }
        let r = shape.len();
        let off = r
            .checked_sub(self.shape.len())
            .ok_or("broadcast to a lower rank")?;
        let st = strides(&self.shape);
        for (i, &d) in self.shape.iter().enumerate() {
            if d != 1 && d != shape[off + i] {
                return Err(format!("cannot broadcast {:?} to {shape:?}", self.shape));
            }
        }
        let shp = self.shape.clone();
        self.gather_by(shape.to_vec(), |idx| {
            shp.iter()
                .enumerate()
                .map(|(i, &d)| if d == 1 { 0 } else { idx[off + i] * st[i] })
                .sum()
        })
    }

    /// ONNX Slice with parameters resolved by [`ir::slice_params`].
    pub fn slice(&self, params: &[(i64, i64, usize)]) -> Result<Self, String> {
        let st = strides(&self.shape);
        let out: Vec<usize> = params.iter().map(|p| p.2).collect();
        self.gather_by(out, |idx| {
            idx.iter()
                .zip(params)
                .zip(&st)
                .map(|((&i, &(s, step, _)), &stride)| (s + i as i64 * step) as usize * stride)
                .sum()
        })
    }

    /// ONNX Gather along `axis` (already normalised) with normalised, in-range indices.
    pub fn gather(&self, axis: usize, indices: &[usize], ishape: &[usize]) -> Result<Self, String> {
        let st = strides(&self.shape);
        let mut out = self.shape[..axis].to_vec();
        out.extend_from_slice(ishape);
        out.extend_from_slice(&self.shape[axis + 1..]);
        let ist = strides(ishape);
        let (ir, r) = (ishape.len(), self.shape.len());
        self.gather_by(out, |idx| {
            let mut s = 0;
            for d in 0..axis {
                s += idx[d] * st[d];
            }
            let ii: usize = (0..ir).map(|k| idx[axis + k] * ist[k]).sum();
            s += indices[ii] * st[axis];
            for d in axis + 1..r {
                s += idx[d + ir - 1] * st[d];
            }
            s
        })
    }

    pub fn concat(parts: &[&Arr<T>], axis: usize) -> Result<Self, String> {
        let first = parts.first().ok_or("concat of nothing")?;
        let mut out = first.shape.clone();
        out[axis] = parts.iter().map(|p| p.shape[axis]).sum();
        let outer: usize = out[..axis].iter().product();
        let mut data = Vec::with_capacity(numel_of::<T>(&out)?);
        for o in 0..outer {
            for p in parts {
                let chunk: usize = p.shape[axis..].iter().product();
                data.extend_from_slice(&p.data[o * chunk..(o + 1) * chunk]);
            }
        }
        Ok(Arr { shape: out, data })
    }
}

/// Elementwise `f(a, b)` with numpy broadcasting.
pub fn zip<A: Clone, B: Clone, C>(
    a: &Arr<A>,
    b: &Arr<B>,
    f: impl Fn(&A, &B) -> Result<C, String>,
) -> Result<Arr<C>, String> {
    let shape = ir::broadcast_shapes(&a.shape, &b.shape)
        .ok_or_else(|| format!("cannot broadcast {:?} with {:?}", a.shape, b.shape))?;
    let (a, b) = (a.broadcast_to(&shape)?, b.broadcast_to(&shape)?);
    let data = a
        .data
        .iter()
        .zip(&b.data)
        .map(|(x, y)| f(x, y))
        .collect::<Result<_, _>>()?;
    Ok(Arr { shape, data })
}

/// ONNX Where with broadcasting of all three inputs.
pub fn select<T: Clone>(cond: &Arr<bool>, x: &Arr<T>, y: &Arr<T>) -> Result<Arr<T>, String> {
    let s1 = ir::broadcast_shapes(&cond.shape, &x.shape).ok_or("shapes do not broadcast")?;
    let shape = ir::broadcast_shapes(&s1, &y.shape).ok_or("shapes do not broadcast")?;
    let (c, x, y) = (
        cond.broadcast_to(&shape)?,
        x.broadcast_to(&shape)?,
        y.broadcast_to(&shape)?,
    );
    let data = c
        .data
        .iter()
        .zip(x.data.into_iter().zip(y.data))
        .map(|(&c, (x, y))| if c { x } else { y })
        .collect();
    Ok(Arr { shape, data })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// timm's GC ViT, classic export with a dynamic batch, divides `windows.shape[0]` (49·B)
    /// by B: refused as "division by a batch-dependent value". A multiple of B over a
    /// multiple of B is a constant; anything with an offset still depends on B.
    #[test]
    fn a_multiple_of_the_batch_over_another_is_a_constant() {
        let b = |a: i64, c: i64| Sym { a, c };
        assert_eq!(b(49, 0).div(b(1, 0)), Ok(Sym::k(49)));
        assert_eq!(b(6, 0).div(b(4, 0)), Ok(Sym::k(1)));
        // These quotients change with the batch (49/2 = 24 at B = 1, 98/3 = 32 at B = 2...).
        for (x, y) in [
            (b(49, 0), b(1, 1)),
            (b(49, 1), b(1, 0)),
            (Sym::k(4), b(1, 0)),
        ] {
            assert!(x.div(y).is_err(), "{x:?} / {y:?}");
        }
    }

    #[test]
    fn sym_arith() {
        let b = Sym { a: 1, c: 0 };
        let twelve_b = b.mul(Sym::k(12)).unwrap();
        assert_eq!(twelve_b, Sym { a: 12, c: 0 });
        assert_eq!(twelve_b.div(Sym::k(12)).unwrap(), b);
        assert!(b.mul(b).is_err());
        assert!(b.div(Sym::k(5)).is_err());
        assert_eq!(b.equal(Sym::k(-1)), Ok(false));
        assert!(b.equal(Sym::k(1)).is_err());
        assert_eq!(Sym::k(3).div(Sym::k(-2)).unwrap(), Sym::k(-1));
        assert_eq!(b.less(Sym::k(0)), Ok(false));
    }

    #[test]
    fn transpose_gather_slice_concat() {
        let a = Arr::new(vec![2, 3], (0..6).collect::<Vec<i32>>());
        assert_eq!(a.transpose(&[1, 0]).unwrap().data, vec![0, 3, 1, 4, 2, 5]);
        assert_eq!(a.gather(1, &[2, 0], &[2]).unwrap().data, vec![2, 0, 5, 3]);
        let p = ir::slice_params(&a.shape, &[-1], &[-4], &[1], &[-1]).unwrap();
        assert_eq!(a.slice(&p).unwrap().data, vec![2, 1, 0, 5, 4, 3]);
        let c = Arr::concat(&[&a, &a], 0).unwrap();
        assert_eq!(c.shape, vec![4, 3]);
        let c = Arr::concat(&[&a, &a], 1).unwrap();
        assert_eq!(c.data, vec![0, 1, 2, 0, 1, 2, 3, 4, 5, 3, 4, 5]);
        let b = Arr::new(vec![3], vec![10, 20, 30]);
        let s = zip(&a, &b, |x, y| Ok(x + y)).unwrap();
        assert_eq!(s.data, vec![10, 21, 32, 13, 24, 35]);
    }

    #[test]
    fn cumsum_follows_onnx_along_an_inner_axis_exclusive_and_reversed() {
        // [[1, 2, 3], [4, 5, 6]] along axis 1 (ONNX CumSum's own examples use these flags).
        let a = Arr::new(vec![2, 3], vec![1.0f32, 2.0, 3.0, 4.0, 5.0, 6.0]);
        assert_eq!(
            a.cumsum(1, false, false).data,
            vec![1.0, 3.0, 6.0, 4.0, 9.0, 15.0]
        );
        assert_eq!(
            a.cumsum(1, true, false).data,
            vec![0.0, 1.0, 3.0, 0.0, 4.0, 9.0]
        );
        assert_eq!(
            a.cumsum(1, false, true).data,
            vec![6.0, 5.0, 3.0, 15.0, 11.0, 6.0]
        );
        assert_eq!(
            a.cumsum(1, true, true).data,
            vec![5.0, 3.0, 0.0, 11.0, 6.0, 0.0]
        );
        assert_eq!(
            a.cumsum(0, false, false).data,
            vec![1.0, 2.0, 3.0, 5.0, 7.0, 9.0]
        );
    }
}
