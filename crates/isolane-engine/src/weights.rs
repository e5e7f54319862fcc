//! Model weights: seeded synthetic initialisation, or a safetensors state dict loaded by name.
//!
//! Synthetic weights are deterministic per (seed, tensor name): each tensor has its own
//! generator, so a tensor's values do not depend on the order in which a model is built.
//! Loading checks every tensor's presence, dtype (f32; f16/bf16 converted) and shape, and
//! rejects unexpected tensors (except `num_batches_tracked`, and prefixes a model declares
//! ignorable, such as FCN's `aux_classifier.`), so a wrong file never silently half-loads.

use std::collections::{HashMap, HashSet};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use rayon::prelude::*;
use safetensors::tensor::TensorView;
use safetensors::{Dtype, SafeTensors};

use crate::error::{EngineError, Result};
use crate::ir::Tensor;

/// Where a built-in model's weights come from.
#[derive(Clone, Debug, PartialEq)]
pub enum Weights {
    /// Seeded synthetic initialisation (deterministic, non-zero, variance-preserving).
    Synthetic { seed: u64 },
    /// A safetensors state dict with torchvision / Ultralytics tensor names.
    Safetensors(PathBuf),
    /// All-zero tensors: cheap, for shape/parameter/FLOP checks only (not for inference).
    Zeros,
}

impl Default for Weights {
    fn default() -> Self {
        Weights::Synthetic { seed: 0 }
    }
}

/// How a synthetic tensor is initialised.
#[derive(Clone, Copy, Debug)]
pub enum Init {
    /// Normal with standard deviation `std`.
    Normal(f32),
    /// `mean + N(0, std)`.
    NormalAround(f32, f32),
    /// Uniform in `[lo, hi)`.
    Uniform(f32, f32),
    /// Every element equal.
    Const(f32),
    /// `0, 1, 2, ...` (YOLOv8's fixed DFL projection).
    Arange,
}

impl Init {
    /// Kaiming-normal for ReLU nets: `std = sqrt(2 / fan_in)`.
    pub fn kaiming(fan_in: usize) -> Init {
        Init::Normal((2.0 / fan_in.max(1) as f32).sqrt())
    }
    /// Variance-preserving for linear maps: `std = sqrt(1 / fan_in)`.
    pub fn lecun(fan_in: usize) -> Init {
        Init::Normal((1.0 / fan_in.max(1) as f32).sqrt())
    }
    /// A small bias.
    pub fn small() -> Init {
        Init::Uniform(-0.02, 0.02)
    }
}

/// SplitMix64: tiny, fast, good enough for weights, and stable across crate versions.
struct SplitMix(u64);

impl SplitMix {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }
    /// Uniform in (0, 1].
    fn unit(&mut self) -> f64 {
        ((self.next() >> 11) as f64 + 1.0) / (1u64 << 53) as f64
    }
}

fn fnv1a(seed: u64, s: &str) -> u64 {
    let mut h = 0xcbf2_9ce4_8422_2325u64 ^ seed.wrapping_mul(0x1000_0000_01b3);
    for b in s.bytes() {
        h ^= b as u64;
        h = h.wrapping_mul(0x1000_0000_01b3);
    }
    h
}

/// Generates a synthetic tensor, deterministic in (seed, name).
pub fn synthesize(seed: u64, name: &str, shape: &[usize], init: Init) -> Tensor {
    let n: usize = shape.iter().product();
    let mut data = vec![0.0f32; n];
    let base = fnv1a(seed, name);
    const BLOCK: usize = 1 << 16;
    data.par_chunks_mut(BLOCK)
        .enumerate()
        .for_each(|(bi, chunk)| {
            let mut rng = SplitMix(base ^ (bi as u64).wrapping_mul(0xD6E8_FEB8_6659_FD93));
            match init {
                Init::Const(v) => chunk.fill(v),
                Init::Arange => chunk
                    .iter_mut()
                    .enumerate()
                    .for_each(|(i, x)| *x = (bi * BLOCK + i) as f32),
                Init::Uniform(lo, hi) => chunk.iter_mut().for_each(|x| {
                    *x = lo + (hi - lo) * (rng.unit() as f32 - f32::EPSILON).max(0.0)
                }),
                Init::Normal(std) | Init::NormalAround(_, std) => {
                    let mean = if let Init::NormalAround(m, _) = init {
                        m
                    } else {
                        0.0
                    };
                    let mut i = 0;
                    while i < chunk.len() {
                        // Box-Muller: two normals per pair of uniforms.
                        let (u1, u2) = (rng.unit(), rng.unit());
                        let r = (-2.0 * u1.ln()).sqrt();
                        let t = 2.0 * std::f64::consts::PI * u2;
                        chunk[i] = mean + std * (r * t.cos()) as f32;
                        if i + 1 < chunk.len() {
                            chunk[i + 1] = mean + std * (r * t.sin()) as f32;
                        }
                        i += 2;
                    }
                }
            }
        });
    Tensor {
        shape: shape.to_vec(),
        data,
    }
}

/// An opened safetensors file.
struct Loaded {
    file: String,
    bytes: Vec<u8>,
}

/// Supplies a model builder with named tensors and keeps count of parameters.
pub struct ParamStore {
    source: Source,
    used: HashSet<String>,
    /// Elements of trainable parameters (what `model.parameters()` counts).
    pub params: usize,
    /// Prefixes of tensors in a file that the model does not use and may be ignored.
    ignorable: Vec<String>,
}

enum Source {
    Synthetic(u64),
    Zeros,
    File(Loaded),
}

impl ParamStore {
    /// Opens the weight source (reads the whole safetensors file once).
    pub fn new(w: &Weights) -> Result<Self> {
        let source = match w {
            Weights::Synthetic { seed } => Source::Synthetic(*seed),
            Weights::Zeros => Source::Zeros,
            Weights::Safetensors(p) => {
                let file = p.display().to_string();
                let bytes = read_weights_file(p).map_err(|e| EngineError::Weights {
                    file: file.clone(),
                    msg: format!("cannot read: {e}"),
                })?;
                // Validate the header now so that format errors name the file up front.
                SafeTensors::deserialize(&bytes).map_err(|e| EngineError::Weights {
                    file: file.clone(),
                    msg: format!("not a valid safetensors file: {e}"),
                })?;
                Source::File(Loaded { file, bytes })
            }
        };
        Ok(ParamStore {
            source,
            used: HashSet::new(),
            params: 0,
            ignorable: Vec::new(),
        })
    }

    /// Declares a prefix of file tensors the model ignores (e.g. `aux_classifier.`).
    pub fn ignore_prefix(&mut self, p: &str) {
        self.ignorable.push(p.to_string());
    }

    /// A trainable parameter (counted).
    pub fn param(&mut self, name: &str, shape: &[usize], init: Init) -> Result<Tensor> {
        self.params += shape.iter().product::<usize>();
        self.get(name, shape, init)
    }

    /// A buffer (BatchNorm running statistics): loaded like a parameter but not counted.
    pub fn buffer(&mut self, name: &str, shape: &[usize], init: Init) -> Result<Tensor> {
        self.get(name, shape, init)
    }

    fn get(&mut self, name: &str, shape: &[usize], init: Init) -> Result<Tensor> {
        if !self.used.insert(name.to_string()) {
            return Err(EngineError::InvalidArgument(format!(
                "tensor `{name}` requested twice"
            )));
        }
        match &self.source {
            Source::Synthetic(seed) => Ok(synthesize(*seed, name, shape, init)),
            Source::Zeros => Ok(Tensor::zeros(shape.to_vec())),
            Source::File(l) => load_tensor(l, name, shape),
        }
    }

    /// Finishes loading: errors on tensors in the file that the model did not use.
    pub fn finish(&self) -> Result<()> {
        let Source::File(l) = &self.source else {
            return Ok(());
        };
        let st = SafeTensors::deserialize(&l.bytes).map_err(|e| EngineError::Weights {
            file: l.file.clone(),
            msg: format!("not a valid safetensors file: {e}"),
        })?;
        let mut extra: Vec<String> = st
            .names()
            .into_iter()
            .filter(|n| !self.used.contains(*n))
            .filter(|n| !n.ends_with("num_batches_tracked"))
            .filter(|n| !self.ignorable.iter().any(|p| n.starts_with(p.as_str())))
            .map(str::to_string)
            .collect();
        if extra.is_empty() {
            return Ok(());
        }
        extra.sort();
        let n = extra.len();
        extra.truncate(5);
        Err(EngineError::Weights {
            file: l.file.clone(),
            msg: format!(
                "{n} unexpected tensor(s) the model does not use, e.g. {} (wrong model or a state dict with other names?)",
                extra.join(", ")
            ),
        })
    }
}

fn load_tensor(l: &Loaded, name: &str, shape: &[usize]) -> Result<Tensor> {
    let err = |msg: String| EngineError::Weights {
        file: l.file.clone(),
        msg,
    };
    let st = SafeTensors::deserialize(&l.bytes)
        .map_err(|e| err(format!("not a valid safetensors file: {e}")))?;
    let view = st.tensor(name).map_err(|_| {
        err(format!(
            "missing tensor `{name}` (expected shape {shape:?})"
        ))
    })?;
    let found: &[usize] = view.shape();
    if found != shape {
        return Err(err(format!(
            "tensor `{name}` has shape {found:?}, expected {shape:?}"
        )));
    }
    let raw = view.data();
    let data: Vec<f32> = match view.dtype() {
        Dtype::F32 => raw
            .chunks_exact(4)
            .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
            .collect(),
        Dtype::F16 => raw
            .chunks_exact(2)
            .map(|b| f16_to_f32(u16::from_le_bytes([b[0], b[1]])))
            .collect(),
        Dtype::BF16 => raw
            .chunks_exact(2)
            .map(|b| f32::from_bits((u16::from_le_bytes([b[0], b[1]]) as u32) << 16))
            .collect(),
        other => {
            return Err(err(format!(
                "tensor `{name}` has dtype {other:?}; expected F32 (F16 and BF16 are converted)"
            )))
        }
    };
    let n: usize = shape.iter().product();
    if data.len() != n {
        return Err(err(format!(
            "tensor `{name}` holds {} values, expected {n}",
            data.len()
        )));
    }
    Ok(Tensor {
        shape: shape.to_vec(),
        data,
    })
}

/// IEEE half → f32 (exact).
pub fn f16_to_f32(h: u16) -> f32 {
    let sign = ((h >> 15) as u32) << 31;
    let exp = ((h >> 10) & 0x1f) as u32;
    let mant = (h & 0x3ff) as u32;
    let bits = match (exp, mant) {
        (0, 0) => sign,
        (0, m) => {
            // Subnormal: normalise.
            let mut e = 127 - 15 + 1;
            let mut m = m;
            while m & 0x400 == 0 {
                m <<= 1;
                e -= 1;
            }
            sign | ((e as u32) << 23) | ((m & 0x3ff) << 13)
        }
        (0x1f, m) => sign | 0x7f80_0000 | (m << 13),
        (e, m) => sign | ((e + 127 - 15) << 23) | (m << 13),
    };
    f32::from_bits(bits)
}

/// The largest safetensors file read (64 GiB: more than any model isolane serves): the file is
/// read whole, so a device or a FIFO given as weights must be refused, not read until memory
/// runs out.
const MAX_WEIGHTS_FILE_BYTES: u64 = 64 << 30;

/// A safetensors file's bytes: a regular file only, within the cap.
fn read_weights_file(path: &Path) -> std::io::Result<Vec<u8>> {
    isolane_core::files::read_file_capped(path, MAX_WEIGHTS_FILE_BYTES)
}

/// Reads every tensor of a safetensors file as f32 (tools and tests).
pub fn read_safetensors(path: &Path) -> Result<HashMap<String, Tensor>> {
    let file = path.display().to_string();
    let bytes = read_weights_file(path).map_err(|e| EngineError::Weights {
        file: file.clone(),
        msg: format!("cannot read: {e}"),
    })?;
    let l = Loaded { file, bytes };
    let st = SafeTensors::deserialize(&l.bytes).map_err(|e| EngineError::Weights {
        file: l.file.clone(),
        msg: format!("not a valid safetensors file: {e}"),
    })?;
    let mut out = HashMap::new();
    for name in st.names() {
        let shape = st
            .tensor(name)
            .map(|v| v.shape().to_vec())
            .unwrap_or_default();
        if let Ok(t) = load_tensor(&l, name, &shape) {
            out.insert(name.to_string(), t);
        }
    }
    Ok(out)
}

/// Writes named f32 tensors as a safetensors file (e.g. a built-in model's synthetic state
/// dict, so that PyTorch can load exactly the same weights).
pub fn write_safetensors(path: &Path, tensors: &[(String, Arc<Tensor>)]) -> Result<()> {
    let file = path.display().to_string();
    let bytes: Vec<(String, Vec<usize>, Vec<u8>)> = tensors
        .iter()
        .map(|(n, t)| {
            (
                n.clone(),
                t.shape.clone(),
                t.data.iter().flat_map(|v| v.to_le_bytes()).collect(),
            )
        })
        .collect();
    let views = bytes
        .iter()
        .map(|(n, shape, b)| {
            TensorView::new(Dtype::F32, shape.clone(), b)
                .map(|v| (n.as_str(), v))
                .map_err(|e| EngineError::Weights {
                    file: file.clone(),
                    msg: format!("tensor `{n}`: {e}"),
                })
        })
        .collect::<Result<Vec<_>>>()?;
    safetensors::serialize_to_file(views, None, path).map_err(|e| EngineError::Weights {
        file,
        msg: format!("cannot write: {e}"),
    })
}
