//! cuBLASLt's candidate algorithms checked against the CPU before the search times them.
//!
//! Why: as an MPS client with 16–33 % of the H100's threads, some of the algorithms cuBLASLt
//! offered for a matmul computed something else (yolov8n, vit_b_16, resnet18 and mobilenet_v2 at
//! fp16 failed the plan check at a Linear or at a convolution's GEMM; the same models built with
//! cuBLASLt's and cuDNN's first choices, untimed, were right). The search timed those algorithms
//! like the others and kept the fastest. Now every candidate first runs once on seeded random
//! activations and its output is compared, at [`SAMPLES`] positions, with the same dot products
//! computed on the CPU from what is on the device; one that disagrees is never timed or kept.
//!
//! Random positions alone missed wrong tiles: as an MPS client with 30 % of the H200's threads,
//! an fp16 algorithm for vit_b_16's first Linear passed 96 random positions and still wrote inf
//! somewhere in its 197 × 2304 output (session 28). So the output is first poisoned (NaN), one
//! position of every [`TILE`] × [`TILE`] block is compared too (every tile a kernel writes, at
//! any tile size down to it), and the whole output must be finite: a tile left unwritten or
//! written with inf fails.

use std::ffi::c_void;

use cudarc::driver::sys as cu;
use isolane_engine::{Precision, Result};

use crate::error::{cu_check, CudaError};
use crate::plan::DType;

/// Output positions compared per candidate, at random.
const SAMPLES: usize = 96;

/// The side of the output blocks of which one position each is compared too (cuBLASLt's and
/// cuDNN's GEMM kernels write tiles of 64 × 8 and larger).
const TILE: usize = 32;

/// At most this many block positions (a larger output's blocks are taken at a stride).
const TILE_SAMPLES: usize = 4096;

/// The largest output checked whole for non-finite values (bytes); a larger one is checked at
/// its sampled positions only.
const FINITE_CHECK_BYTES: usize = 64 << 20;

/// The shape and operands of one matmul as the recorder lays it out (row-major, our names):
/// `y[b, i, j] = act(alpha · Σ_k x[b, i, k] · w[b, j, k] (+ bias[j]) (+ c[b, i, j]))`, `w`
/// stored `[n, k]` when `w_trans`, else `[k, n]`; strides in elements.
pub(crate) struct MatmulShape {
    pub m: usize,
    pub n: usize,
    pub k: usize,
    pub batch: usize,
    /// Batch strides of x, w and y (0: the same matrix for every batch entry).
    pub sx: usize,
    pub sw: usize,
    pub sy: usize,
    /// Row strides of x, w and y.
    pub ldx: usize,
    pub ldw: usize,
    pub ldy: usize,
    pub w_trans: bool,
    pub alpha: f32,
    /// The fused epilogue: bias, ReLU, GELU (tanh, as cuBLASLt's), residual (beta 1).
    pub bias: Option<u64>,
    pub relu: bool,
    pub gelu: bool,
    pub residual: bool,
}

/// Device pointers of one matmul's operands.
pub(crate) struct MatmulOperands {
    pub x: u64,
    pub w: u64,
    /// The residual (read only when `residual`).
    pub c: u64,
    pub y: u64,
}

/// The seeded inputs of one matmul and its expected output at the sampled positions.
pub(crate) struct MatmulProbe {
    dtype: DType,
    /// Regions written before each candidate runs: (device pointer, bytes).
    inputs: Vec<(u64, Vec<u8>)>,
    y: u64,
    /// The arena regions the check and the candidates wrote: (device pointer, bytes).
    written: Vec<(u64, usize)>,
    /// (element offset in y, expected value).
    expected: Vec<(usize, f64)>,
    tolerance: f64,
    /// The bytes of y read to check each of its elements for non-finite values; `None`: too
    /// large, its sampled positions only.
    whole: Option<usize>,
    /// y poisoned before each candidate runs (not where it is also the residual's input).
    poison_y: bool,
    /// y's batch, rows, columns, batch stride and row stride (elements).
    shape: (usize, usize, usize, usize, usize),
}

impl MatmulShape {
    fn x_at(&self, b: usize, i: usize, k: usize) -> usize {
        b * self.sx + i * self.ldx + k
    }
    fn w_at(&self, b: usize, j: usize, k: usize) -> usize {
        if self.w_trans {
            b * self.sw + j * self.ldw + k
        } else {
            b * self.sw + k * self.ldw + j
        }
    }
    fn y_at(&self, b: usize, i: usize, j: usize) -> usize {
        b * self.sy + i * self.ldy + j
    }
    fn x_len(&self) -> usize {
        self.x_at(self.batch - 1, self.m - 1, self.k - 1) + 1
    }
    fn w_len(&self) -> usize {
        self.w_at(self.batch - 1, self.n - 1, self.k - 1)
            .max(self.w_at(self.batch - 1, 0, self.k - 1))
            + 1
    }
    fn y_len(&self) -> usize {
        self.y_at(self.batch - 1, self.m - 1, self.n - 1) + 1
    }
}

impl MatmulProbe {
    /// Writes seeded random activations over the operands that lie in `writable` (the arena:
    /// never the weights), reads back what every operand then holds, and computes the sampled
    /// outputs on the CPU.
    pub(crate) fn new(
        s: &MatmulShape,
        ops: &MatmulOperands,
        dtype: DType,
        precision: Precision,
        writable: std::ops::Range<u64>,
    ) -> Result<MatmulProbe> {
        let es = dtype.size();
        let mut rng = Lcg(0x5eed ^ (s.m * 31 + s.n * 17 + s.k) as u64);
        let mut inputs = Vec::new();
        let mut regions = vec![(ops.x, s.x_len()), (ops.w, s.w_len())];
        if s.residual {
            regions.push((ops.c, s.y_len()));
        }
        for &(ptr, len) in &regions {
            let end = ptr + (len * es) as u64;
            if writable.contains(&ptr) && end <= writable.end {
                let values: Vec<f32> = (0..len).map(|_| rng.uniform()).collect();
                let bytes = encode(dtype, &values);
                upload(ptr, &bytes)?;
                inputs.push((ptr, bytes));
            }
        }
        let x = decode(dtype, &download(ops.x, s.x_len() * es)?);
        let w = decode(dtype, &download(ops.w, s.w_len() * es)?);
        let c = if s.residual {
            decode(dtype, &download(ops.c, s.y_len() * es)?)
        } else {
            Vec::new()
        };
        let bias = match s.bias {
            Some(p) => decode(dtype, &download(p, s.n * es)?),
            None => Vec::new(),
        };
        let mut expected = Vec::with_capacity(SAMPLES + TILE_SAMPLES);
        let mut positions: Vec<(usize, usize, usize)> = (0..SAMPLES)
            .map(|_| (rng.below(s.batch), rng.below(s.m), rng.below(s.n)))
            .collect();
        positions.extend(tile_positions(s, &mut rng));
        for (b, i, j) in positions {
            let mut acc: f64 = (0..s.k)
                .map(|k| f64::from(x[s.x_at(b, i, k)]) * f64::from(w[s.w_at(b, j, k)]))
                .sum::<f64>()
                * f64::from(s.alpha);
            if s.bias.is_some() {
                acc += f64::from(bias[j]);
            }
            if s.residual {
                acc += f64::from(c[s.y_at(b, i, j)]);
            }
            if s.relu {
                acc = acc.max(0.0);
            }
            if s.gelu {
                let t = (0.797_884_560_802_865_4 * (acc + 0.044715 * acc * acc * acc)).tanh();
                acc = 0.5 * acc * (1.0 + t);
            }
            expected.push((s.y_at(b, i, j), acc));
        }
        // The plan check's limits (docs/cuda.md, Plan check): a wrong algorithm misses by far more.
        let tolerance = match precision {
            Precision::Fp32 => 1e-4,
            Precision::Tf32 => 5e-3,
            Precision::Fp16 => 3e-2,
            Precision::Bf16 => 6e-2,
        };
        let mut written: Vec<(u64, usize)> = inputs.iter().map(|(p, b)| (*p, b.len())).collect();
        let y_bytes = s.y_len() * es;
        let y_writable = writable.contains(&ops.y) && ops.y + y_bytes as u64 <= writable.end;
        if y_writable {
            written.push((ops.y, y_bytes));
        }
        // The residual is read from c, which may be y itself: then y keeps its input.
        let c_meets_y =
            s.residual && ops.c < ops.y + y_bytes as u64 && ops.y < ops.c + y_bytes as u64;
        Ok(MatmulProbe {
            dtype,
            inputs,
            y: ops.y,
            written,
            expected,
            tolerance,
            whole: (y_bytes <= FINITE_CHECK_BYTES).then_some(y_bytes),
            poison_y: y_writable && !c_meets_y,
            shape: (s.batch, s.m, s.n, s.sy, s.ldy),
        })
    }

    /// Puts the arena's poison (0xff bytes: NaN in f32, f16 and bf16, written when the arena is
    /// made) back over what the check wrote and what the candidates computed from it, so that a
    /// later read of memory no step wrote still shows up as NaN.
    pub(crate) fn poison_again(&self) -> Result<()> {
        for &(ptr, bytes) in &self.written {
            // SAFETY: a region of the model's arena (or its output), sized from the matmul's
            // shape; synchronous.
            cu_check("cuMemsetD8", unsafe { cu::cuMemsetD8_v2(ptr, 0xff, bytes) })?;
        }
        Ok(())
    }

    /// Restores the seeded inputs, runs the candidate (`run`, on `stream`), and says whether its
    /// sampled outputs match the CPU's within the precision's tolerance (relative L2). A
    /// candidate whose launch fails does not match.
    pub(crate) fn matches(
        &self,
        stream: cu::CUstream,
        run: &mut dyn FnMut() -> Result<()>,
    ) -> Result<bool> {
        for (ptr, bytes) in &self.inputs {
            upload(*ptr, bytes)?;
        }
        let (batch, m, n, sy, ldy) = self.shape;
        let es = self.dtype.size();
        if self.poison_y {
            // Its elements only, row by row: the gaps between rows (y a slice of a wider buffer,
            // as a concatenation's part) may hold this matmul's own input. On the candidate's
            // stream, so that it lands before the candidate writes (the stream does not wait
            // for the legacy default stream a plain memset runs on).
            for b in 0..batch {
                let at = self.y + (b * sy * es) as u64;
                // SAFETY: y's rows of batch entry b lie in the arena (checked in `new`): m rows
                // of n elements, ldy apart; the stream is live.
                cu_check("cuMemsetD2D8Async", unsafe {
                    cu::cuMemsetD2D8Async(at, ldy * es, 0xff, n * es, m, stream)
                })?;
            }
        }
        if run().is_err() {
            return Ok(false);
        }
        // SAFETY: the stream is live; the candidate was issued on it.
        isolane_gpu::call::cu_check("cuStreamSynchronize", unsafe {
            cu::cuStreamSynchronize(stream)
        })
        .map_err(|e| {
            crate::error::engine(CudaError {
                detail: Some("a cuBLASLt candidate failed on the GPU while it was checked".into()),
                ..e
            })
        })?;
        let y = match self.whole {
            Some(bytes) => decode(self.dtype, &download(self.y, bytes)?),
            None => Vec::new(),
        };
        if !y.is_empty() {
            let finite = (0..batch).all(|b| {
                (0..m).all(|i| {
                    let row = b * sy + i * ldy;
                    y[row..row + n].iter().all(|v| v.is_finite())
                })
            });
            if !finite {
                return Ok(false);
            }
        }
        let (mut err, mut norm) = (0.0f64, 0.0f64);
        for &(at, want) in &self.expected {
            let got = match y.get(at) {
                Some(&v) => v,
                None => decode(self.dtype, &download(self.y + (at * es) as u64, es)?)[0],
            };
            let got = f64::from(got);
            if !got.is_finite() {
                return Ok(false);
            }
            err += (got - want).powi(2);
            norm += want.powi(2);
        }
        Ok(err.sqrt() <= self.tolerance * norm.sqrt().max(1e-6))
    }
}

fn upload(ptr: u64, bytes: &[u8]) -> Result<()> {
    // SAFETY: `ptr` holds at least `bytes.len()` bytes (a region of the model's own buffers,
    // sized from the matmul's shape); the copy is synchronous.
    cu_check("cuMemcpyHtoD", unsafe {
        cu::cuMemcpyHtoD_v2(ptr, bytes.as_ptr() as *const c_void, bytes.len())
    })?;
    Ok(())
}

fn download(ptr: u64, len: usize) -> Result<Vec<u8>> {
    let mut out = vec![0u8; len];
    // SAFETY: as in `upload`, in the other direction, into a host buffer of `len` bytes.
    cu_check("cuMemcpyDtoH", unsafe {
        cu::cuMemcpyDtoH_v2(out.as_mut_ptr() as *mut c_void, ptr, len)
    })?;
    Ok(out)
}

fn encode(dtype: DType, values: &[f32]) -> Vec<u8> {
    match dtype {
        DType::F32 => values.iter().flat_map(|v| v.to_le_bytes()).collect(),
        DType::F16 => values
            .iter()
            .flat_map(|v| half::f16::from_f32(*v).to_le_bytes())
            .collect(),
        DType::Bf16 => values
            .iter()
            .flat_map(|v| half::bf16::from_f32(*v).to_le_bytes())
            .collect(),
    }
}

fn decode(dtype: DType, bytes: &[u8]) -> Vec<f32> {
    match dtype {
        DType::F32 => bytes
            .chunks_exact(4)
            .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
            .collect(),
        DType::F16 => bytes
            .chunks_exact(2)
            .map(|b| half::f16::from_le_bytes([b[0], b[1]]).to_f32())
            .collect(),
        DType::Bf16 => bytes
            .chunks_exact(2)
            .map(|b| half::bf16::from_le_bytes([b[0], b[1]]).to_f32())
            .collect(),
    }
}

/// A small deterministic generator: the same inputs and positions in every build.
/// One position in each [`TILE`] × [`TILE`] block of every batch entry's output (at a random
/// place inside it), at most [`TILE_SAMPLES`] (the blocks taken at an even stride beyond, a
/// stride that shares no factor with the blocks in a row, so that every column of blocks is
/// reached).
fn tile_positions(s: &MatmulShape, rng: &mut Lcg) -> Vec<(usize, usize, usize)> {
    let (rows, cols) = (s.m.div_ceil(TILE), s.n.div_ceil(TILE));
    let blocks = s.batch * rows * cols;
    let mut stride = blocks.div_ceil(TILE_SAMPLES).max(1);
    while stride > 1 && gcd(stride, cols) != 1 {
        stride += 1;
    }
    (0..blocks)
        .step_by(stride)
        .map(|t| {
            let (b, r, c) = (t / (rows * cols), t / cols % rows, t % cols);
            let i = (r * TILE + rng.below(TILE)).min(s.m - 1);
            let j = (c * TILE + rng.below(TILE)).min(s.n - 1);
            (b, i, j)
        })
        .collect()
}

fn gcd(a: usize, b: usize) -> usize {
    if b == 0 {
        a
    } else {
        gcd(b, a % b)
    }
}

struct Lcg(u64);

impl Lcg {
    fn next(&mut self) -> u64 {
        self.0 = self
            .0
            .wrapping_mul(6_364_136_223_846_793_005)
            .wrapping_add(1_442_695_040_888_963_407);
        self.0 >> 11
    }
    /// Uniform in [-1, 1).
    fn uniform(&mut self) -> f32 {
        (self.next() as f64 / (1u64 << 53) as f64 * 2.0 - 1.0) as f32
    }
    fn below(&mut self, n: usize) -> usize {
        (self.next() % n.max(1) as u64) as usize
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every block of the output, of every batch entry, gets a position inside it; a larger
    /// output's blocks are taken at a stride, at most TILE_SAMPLES of them.
    #[test]
    fn every_output_block_is_sampled() {
        let s = MatmulShape {
            sx: 0,
            ..dense(197, 2304, 768, 2)
        };
        let p = tile_positions(&s, &mut Lcg(1));
        let (rows, cols) = (197usize.div_ceil(TILE), 2304 / TILE);
        assert_eq!(p.len(), 2 * rows * cols);
        let mut seen = std::collections::HashSet::new();
        for &(b, i, j) in &p {
            assert!(b < 2 && i < 197 && j < 2304);
            seen.insert((b, i / TILE, j / TILE));
        }
        assert_eq!(seen.len(), p.len(), "each block once");
        let big = MatmulShape {
            batch: 64,
            sy: 197 * 2304,
            ..s
        };
        let q = tile_positions(&big, &mut Lcg(1));
        assert!(
            q.len() <= TILE_SAMPLES && q.len() > TILE_SAMPLES / 2,
            "{}",
            q.len()
        );
        assert!(
            q.iter().any(|&(b, _, _)| b == 63),
            "the last batch entry is reached"
        );
        // 72 blocks a row and a first stride of 8: every column of blocks is still reached.
        let columns: std::collections::HashSet<usize> =
            q.iter().map(|&(_, _, j)| j / TILE).collect();
        assert_eq!(columns.len(), cols, "every column of blocks");
    }

    /// A plain matmul of `batch` entries: x and y packed row-major per entry, one `w` stored
    /// `[n, k]` for every entry, no epilogue.
    fn dense(m: usize, n: usize, k: usize, batch: usize) -> MatmulShape {
        MatmulShape {
            m,
            n,
            k,
            batch,
            sx: m * k,
            sw: 0,
            sy: m * n,
            ldx: k,
            ldw: k,
            ldy: n,
            w_trans: true,
            alpha: 1.0,
            bias: None,
            relu: false,
            gelu: false,
            residual: false,
        }
    }

    #[test]
    fn operand_offsets_follow_the_strides() {
        let s = dense(3, 4, 5, 2);
        assert_eq!((s.x_len(), s.w_len(), s.y_len()), (30, 20, 24));
        let t = MatmulShape {
            w_trans: false,
            ldw: 4,
            ..s
        };
        // w stored [k, n]: the last element is (k - 1, n - 1).
        assert_eq!(t.w_at(0, 3, 4), 19);
        assert_eq!(t.w_len(), 20);
    }

    #[test]
    fn values_round_trip_through_each_dtype() {
        let v = [0.5f32, -1.25, 3.0];
        for d in [DType::F32, DType::F16, DType::Bf16] {
            assert_eq!(decode(d, &encode(d, &v)), v, "{d:?}");
        }
    }
}
