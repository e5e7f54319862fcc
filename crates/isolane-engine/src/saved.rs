//! Saved plans (`.isoplan` files, `isolane build`): a model compiled once for a batch, a
//! precision and a device, written so that a later start loads it instead of compiling and
//! timing it again (docs/engine.md, "Saved plans").
//!
//! A file is `MAGIC`, the format version (u32 LE), the payload's length (u64 LE), the CRC-32
//! of the payload (u32 LE), then the payload: the key (ordered `field = value` pairs: device,
//! precision, batch, engine revision, and on cuda the GPU, its SM count, compute capability,
//! driver and library versions), the graph after the engine's passes (BatchNorm folded,
//! epilogues fused; weights as f32 bits), and the backend's own bytes (the CUDA backend's
//! algorithm choices, `isolane_cuda::saved`). Everything is little-endian and length-prefixed,
//! read with bounds checks: a truncated, corrupt or foreign file is an error naming the file
//! and what is wrong, never a panic or an allocation sized by the file.

use std::path::Path;
use std::sync::Arc;

use crate::ir::{
    Binary, ConvAttrs, CoordMode, Dim, Graph, NearestMode, Node, Op, PoolAttrs, ReduceKind,
    ResizeAttrs, ResizeMode, ResizeSize, Tensor, Unary, Value, ValueKind, ValueType,
};
use crate::quant::{FakeQuantAttrs, Granularity, QuantType};

/// The extension a saved plan is recognised by where a model path is accepted.
pub const EXTENSION: &str = "isoplan";

/// The format this build writes and reads; any other is refused (build the plan again).
pub const FORMAT_VERSION: u32 = 1;

/// The CPU backend's revision in a saved plan's key: bump it with any change that makes the
/// CPU backend compute other bits from the same fused graph.
pub const CPU_REVISION: u32 = 1;

/// The largest saved plan read: a plan holds its model's weights as f32, so this is far
/// beyond the models isolane runs, and a bound on what a wrong path can take.
pub const MAX_PLAN_BYTES: u64 = 16 << 30;

const MAGIC: &[u8; 8] = b"ISOPLAN\0";
const PREFIX: usize = 8 + 4 + 8 + 4;

/// Key fields every saved plan has.
pub const FIELD_DEVICE: &str = "device";
pub const FIELD_PRECISION: &str = "precision";
pub const FIELD_BATCH: &str = "batch";
pub const FIELD_ENGINE: &str = "engine revision";
pub const FIELD_MODEL: &str = "model";
pub const FIELD_MODEL_HASH: &str = "model hash";

/// Whether a model path names a saved plan (by its extension, any case).
pub fn is_saved_plan_path(model: &str) -> bool {
    Path::new(model)
        .extension()
        .and_then(|e| e.to_str())
        .is_some_and(|e| e.eq_ignore_ascii_case(EXTENSION))
}

/// What a CPU plan for `precision` and `batch` must have in its key (the CPU backend's
/// revision: its kernels compute the same bits on any x86-64 it runs on).
pub fn cpu_key(precision: crate::Precision, batch: usize) -> Vec<(String, String)> {
    vec![
        (FIELD_DEVICE.into(), "cpu".into()),
        (FIELD_PRECISION.into(), precision.as_str().into()),
        (FIELD_BATCH.into(), batch.to_string()),
        (FIELD_ENGINE.into(), format!("cpu {CPU_REVISION}")),
    ]
}

/// The CPU backend's saved plan of `graph` for `batch`: the graph after the passes (what a
/// compile would make of it), keyed by [`cpu_key`], `model` and its hash.
pub fn cpu_plan(graph: &Graph, model: &str, batch: usize) -> crate::Result<SavedPlan> {
    let mut key = cpu_key(crate::Precision::Fp32, batch);
    key.push((FIELD_MODEL.into(), model.into()));
    key.push((FIELD_MODEL_HASH.into(), model_hash(graph)));
    Ok(SavedPlan {
        key,
        graph: crate::passes::optimize(graph, batch)?,
        backend: Vec::new(),
    })
}

/// A saved plan in memory.
#[derive(Clone, Debug, PartialEq)]
pub struct SavedPlan {
    /// `(field, value)` pairs, in the order written.
    pub key: Vec<(String, String)>,
    /// The graph after the engine's passes for the key's batch.
    pub graph: Graph,
    /// The backend's own part (empty for the CPU backend).
    pub backend: Vec<u8>,
}

/// Why a saved plan cannot be used.
#[derive(Debug, thiserror::Error, PartialEq)]
pub enum SavedPlanError {
    #[error("saved plan `{file}`: {msg}")]
    Io { file: String, msg: String },
    /// Not a saved plan, truncated, or its bytes do not decode.
    #[error("saved plan `{file}` is corrupt or not a saved plan: {msg}")]
    Corrupt { file: String, msg: String },
    #[error(
        "saved plan `{file}` has format version {found}; this isolane reads version \
         {FORMAT_VERSION}: build it again with `isolane build`"
    )]
    Version { file: String, found: u32 },
    /// The plan was built for something else than what it is asked to run on.
    #[error(
        "saved plan `{file}` was built for {field} {saved:?}, but here {field} is {here:?}: \
         build it again here with `isolane build` (a saved plan is never used where its key \
         differs)"
    )]
    Mismatch {
        file: String,
        field: String,
        saved: String,
        here: String,
    },
}

impl SavedPlan {
    /// The value of key field `field`.
    pub fn field(&self, field: &str) -> Option<&str> {
        self.key
            .iter()
            .find(|(k, _)| k == field)
            .map(|(_, v)| v.as_str())
    }

    /// Checks that every `(field, value)` of `here` is in the key with the same value; the
    /// first that is not is a [`SavedPlanError::Mismatch`] naming the field and both values.
    pub fn check_key(&self, file: &str, here: &[(String, String)]) -> Result<(), SavedPlanError> {
        for (field, value) in here {
            let saved = self.field(field).unwrap_or("(none)");
            if saved != value {
                return Err(SavedPlanError::Mismatch {
                    file: file.to_string(),
                    field: field.clone(),
                    saved: saved.to_string(),
                    here: value.clone(),
                });
            }
        }
        Ok(())
    }

    /// The key's batch size.
    pub fn batch(&self) -> Option<usize> {
        self.field(FIELD_BATCH)?.parse().ok()
    }

    /// The file's bytes.
    pub fn to_bytes(&self) -> Vec<u8> {
        let mut w = Writer::default();
        w.usize(self.key.len());
        for (k, v) in &self.key {
            w.str(k);
            w.str(v);
        }
        write_graph(&mut w, &self.graph);
        w.bytes(&self.backend);
        let payload = w.into_bytes();
        let mut out = Vec::with_capacity(PREFIX + payload.len());
        out.extend_from_slice(MAGIC);
        out.extend_from_slice(&FORMAT_VERSION.to_le_bytes());
        out.extend_from_slice(&(payload.len() as u64).to_le_bytes());
        out.extend_from_slice(&crc32fast::hash(&payload).to_le_bytes());
        out.extend_from_slice(&payload);
        out
    }

    /// Reads a saved plan from its bytes; `file` names it in errors.
    pub fn from_bytes(file: &str, bytes: &[u8]) -> Result<SavedPlan, SavedPlanError> {
        let corrupt = |msg: String| SavedPlanError::Corrupt {
            file: file.to_string(),
            msg,
        };
        if bytes.len() < MAGIC.len() || &bytes[..MAGIC.len()] != MAGIC {
            return Err(corrupt(
                "it does not start with an isolane saved plan's signature".into(),
            ));
        }
        if bytes.len() < PREFIX {
            return Err(corrupt(format!(
                "truncated: {} bytes, shorter than the {PREFIX}-byte header",
                bytes.len()
            )));
        }
        let u32_at = |i: usize| u32::from_le_bytes(bytes[i..i + 4].try_into().expect("4 bytes"));
        let version = u32_at(8);
        if version != FORMAT_VERSION {
            return Err(SavedPlanError::Version {
                file: file.to_string(),
                found: version,
            });
        }
        let len = u64::from_le_bytes(bytes[12..20].try_into().expect("8 bytes"));
        let have = (bytes.len() - PREFIX) as u64;
        if len != have {
            return Err(corrupt(if have < len {
                format!("truncated: the header says {len} bytes follow, {have} do")
            } else {
                format!("{} bytes after the plan's end", have - len)
            }));
        }
        let payload = &bytes[PREFIX..];
        if crc32fast::hash(payload) != u32_at(20) {
            return Err(corrupt(
                "its checksum does not match its contents (a changed or damaged file)".into(),
            ));
        }
        let decoded = (|| {
            let mut r = Reader::new(payload);
            let n = r.count(8)?;
            let mut key = Vec::with_capacity(n);
            for _ in 0..n {
                key.push((r.str()?, r.str()?));
            }
            let graph = read_graph(&mut r)?;
            let backend = r.bytes()?.to_vec();
            r.end()?;
            Ok::<_, String>(SavedPlan {
                key,
                graph,
                backend,
            })
        })()
        .map_err(corrupt)?;
        decoded
            .graph
            .validate()
            .map_err(|e| corrupt(format!("its graph is not valid: {e}")))?;
        Ok(decoded)
    }

    /// Reads and checks the file at `path`: a regular file of at most [`MAX_PLAN_BYTES`] (a
    /// device or a FIFO is refused, never read without end).
    pub fn load(path: &Path) -> Result<SavedPlan, SavedPlanError> {
        let file = path.display().to_string();
        let bytes = isolane_core::files::read_file_capped(path, MAX_PLAN_BYTES).map_err(|e| {
            SavedPlanError::Io {
                file: file.clone(),
                msg: e.to_string(),
            }
        })?;
        SavedPlan::from_bytes(&file, &bytes)
    }

    /// Writes the file atomically (a temporary file beside it, then a rename), so that a
    /// reader never sees half a plan.
    pub fn save(&self, path: &Path) -> Result<(), SavedPlanError> {
        let file = path.display().to_string();
        let io = |e: std::io::Error| SavedPlanError::Io {
            file: file.clone(),
            msg: e.to_string(),
        };
        let dir = match path.parent() {
            Some(d) if !d.as_os_str().is_empty() => d,
            _ => Path::new("."),
        };
        let name = path
            .file_name()
            .map_or("plan".into(), |n| n.to_string_lossy());
        let tmp = dir.join(format!(".{name}.{}.tmp", std::process::id()));
        let written =
            std::fs::write(&tmp, self.to_bytes()).and_then(|()| std::fs::rename(&tmp, path));
        if let Err(e) = written {
            let _ = std::fs::remove_file(&tmp);
            return Err(io(e));
        }
        Ok(())
    }
}

/// A model's identity in a saved plan's key: the CRC-32 and length of its graph's encoding
/// (every op, attribute and weight bit), so equal models have equal hashes whichever file
/// they came from.
pub fn model_hash(graph: &Graph) -> String {
    let mut w = Writer::default();
    write_graph(&mut w, graph);
    let b = w.into_bytes();
    format!("{:08x}-{}", crc32fast::hash(&b), b.len())
}

/// The identity of a tensor's bits (CRC-32 and length): a saved plan keeps one per output
/// of its check run, and a load compares them, so outputs are compared bit for bit without
/// keeping them.
pub fn bits_hash(values: &[f32]) -> String {
    let mut h = crc32fast::Hasher::new();
    for v in values {
        h.update(&v.to_bits().to_le_bytes());
    }
    format!("{:08x}-{}", h.finalize(), values.len())
}

/// Little-endian, length-prefixed writing (the backend's part uses it too).
#[derive(Default)]
pub struct Writer {
    buf: Vec<u8>,
}

impl Writer {
    pub fn into_bytes(self) -> Vec<u8> {
        self.buf
    }
    pub fn u8(&mut self, v: u8) {
        self.buf.push(v);
    }
    pub fn bool(&mut self, v: bool) {
        self.u8(v as u8);
    }
    pub fn u32(&mut self, v: u32) {
        self.buf.extend_from_slice(&v.to_le_bytes());
    }
    pub fn u64(&mut self, v: u64) {
        self.buf.extend_from_slice(&v.to_le_bytes());
    }
    pub fn i64(&mut self, v: i64) {
        self.buf.extend_from_slice(&v.to_le_bytes());
    }
    pub fn usize(&mut self, v: usize) {
        self.u64(v as u64);
    }
    /// As its bits: every f32, NaN payloads included, comes back the same.
    pub fn f32(&mut self, v: f32) {
        self.u32(v.to_bits());
    }
    pub fn bytes(&mut self, b: &[u8]) {
        self.usize(b.len());
        self.buf.extend_from_slice(b);
    }
    pub fn str(&mut self, s: &str) {
        self.bytes(s.as_bytes());
    }
    pub fn usizes(&mut self, v: &[usize]) {
        self.usize(v.len());
        v.iter().for_each(|&x| self.usize(x));
    }
    pub fn i64s(&mut self, v: &[i64]) {
        self.usize(v.len());
        v.iter().for_each(|&x| self.i64(x));
    }
    pub fn f32s(&mut self, v: &[f32]) {
        self.usize(v.len());
        self.buf.reserve(v.len() * 4);
        v.iter().for_each(|&x| self.f32(x));
    }
}

/// Bounds-checked reading of what [`Writer`] wrote; every error is a message for
/// [`SavedPlanError::Corrupt`].
pub struct Reader<'a> {
    buf: &'a [u8],
    at: usize,
}

impl<'a> Reader<'a> {
    pub fn new(buf: &'a [u8]) -> Reader<'a> {
        Reader { buf, at: 0 }
    }
    fn take(&mut self, n: usize) -> Result<&'a [u8], String> {
        if self.buf.len() - self.at < n {
            return Err(format!(
                "it ends inside a field (byte {} of {}, {n} more wanted)",
                self.at,
                self.buf.len()
            ));
        }
        let s = &self.buf[self.at..self.at + n];
        self.at += n;
        Ok(s)
    }
    /// Everything was read.
    pub fn end(&self) -> Result<(), String> {
        if self.at != self.buf.len() {
            return Err(format!(
                "{} unread bytes at its end",
                self.buf.len() - self.at
            ));
        }
        Ok(())
    }
    pub fn u8(&mut self) -> Result<u8, String> {
        Ok(self.take(1)?[0])
    }
    pub fn bool(&mut self) -> Result<bool, String> {
        match self.u8()? {
            0 => Ok(false),
            1 => Ok(true),
            v => Err(format!("a flag of {v} (0 or 1 expected)")),
        }
    }
    pub fn u32(&mut self) -> Result<u32, String> {
        Ok(u32::from_le_bytes(self.take(4)?.try_into().expect("4")))
    }
    pub fn u64(&mut self) -> Result<u64, String> {
        Ok(u64::from_le_bytes(self.take(8)?.try_into().expect("8")))
    }
    pub fn i64(&mut self) -> Result<i64, String> {
        Ok(i64::from_le_bytes(self.take(8)?.try_into().expect("8")))
    }
    pub fn usize(&mut self) -> Result<usize, String> {
        let v = self.u64()?;
        usize::try_from(v).map_err(|_| format!("a size of {v}"))
    }
    pub fn f32(&mut self) -> Result<f32, String> {
        Ok(f32::from_bits(self.u32()?))
    }
    /// A count of items at least `item_bytes` long each: never more than the bytes left can
    /// hold, so a corrupt count cannot make the reader allocate.
    pub fn count(&mut self, item_bytes: usize) -> Result<usize, String> {
        let n = self.usize()?;
        let left = self.buf.len() - self.at;
        if n.checked_mul(item_bytes.max(1)).is_none_or(|b| b > left) {
            return Err(format!("a count of {n} with {left} bytes left"));
        }
        Ok(n)
    }
    pub fn bytes(&mut self) -> Result<&'a [u8], String> {
        let n = self.count(1)?;
        self.take(n)
    }
    pub fn str(&mut self) -> Result<String, String> {
        String::from_utf8(self.bytes()?.to_vec()).map_err(|_| "a name that is not UTF-8".into())
    }
    pub fn usizes(&mut self) -> Result<Vec<usize>, String> {
        let n = self.count(8)?;
        (0..n).map(|_| self.usize()).collect()
    }
    pub fn i64s(&mut self) -> Result<Vec<i64>, String> {
        let n = self.count(8)?;
        (0..n).map(|_| self.i64()).collect()
    }
    pub fn f32s(&mut self) -> Result<Vec<f32>, String> {
        let n = self.count(4)?;
        let b = self.take(n * 4)?;
        Ok(b.chunks_exact(4)
            .map(|c| f32::from_bits(u32::from_le_bytes(c.try_into().expect("4"))))
            .collect())
    }
    fn array<const N: usize>(&mut self) -> Result<[usize; N], String> {
        let mut a = [0; N];
        for x in &mut a {
            *x = self.usize()?;
        }
        Ok(a)
    }
}

fn write_dims(w: &mut Writer, dims: &[Dim]) {
    w.usize(dims.len());
    for d in dims {
        match *d {
            Dim::Fixed(n) => {
                w.u8(0);
                w.usize(n)
            }
            Dim::Batch => w.u8(1),
            Dim::BatchTimes(k) => {
                w.u8(2);
                w.usize(k)
            }
            Dim::Copy => w.u8(3),
            Dim::Infer => w.u8(4),
        }
    }
}

fn read_dims(r: &mut Reader) -> Result<Vec<Dim>, String> {
    let n = r.count(1)?;
    (0..n)
        .map(|_| {
            Ok(match r.u8()? {
                0 => Dim::Fixed(r.usize()?),
                1 => Dim::Batch,
                2 => Dim::BatchTimes(r.usize()?),
                3 => Dim::Copy,
                4 => Dim::Infer,
                t => return Err(format!("an unknown dimension kind {t}")),
            })
        })
        .collect()
}

fn write_unary(w: &mut Writer, u: &Unary) {
    let (tag, params): (u8, &[f32]) = match u {
        Unary::Identity => (0, &[]),
        Unary::Relu => (1, &[]),
        Unary::Relu6 => (2, &[]),
        Unary::Clip { min, max } => (3, &[*min, *max]),
        Unary::LeakyRelu { alpha } => (4, &[*alpha]),
        Unary::Sigmoid => (5, &[]),
        Unary::HardSigmoid { alpha, beta } => (6, &[*alpha, *beta]),
        Unary::HardSwish => (7, &[]),
        Unary::Silu => (8, &[]),
        Unary::Gelu => (9, &[]),
        Unary::GeluTanh => (10, &[]),
        Unary::Tanh => (11, &[]),
        Unary::Exp => (12, &[]),
        Unary::Log => (13, &[]),
        Unary::Sqrt => (14, &[]),
        Unary::Erf => (15, &[]),
        Unary::Neg => (16, &[]),
        Unary::Abs => (17, &[]),
        Unary::Reciprocal => (18, &[]),
    };
    w.u8(tag);
    params.iter().for_each(|&p| w.f32(p));
}

fn read_unary(r: &mut Reader) -> Result<Unary, String> {
    Ok(match r.u8()? {
        0 => Unary::Identity,
        1 => Unary::Relu,
        2 => Unary::Relu6,
        3 => Unary::Clip {
            min: r.f32()?,
            max: r.f32()?,
        },
        4 => Unary::LeakyRelu { alpha: r.f32()? },
        5 => Unary::Sigmoid,
        6 => Unary::HardSigmoid {
            alpha: r.f32()?,
            beta: r.f32()?,
        },
        7 => Unary::HardSwish,
        8 => Unary::Silu,
        9 => Unary::Gelu,
        10 => Unary::GeluTanh,
        11 => Unary::Tanh,
        12 => Unary::Exp,
        13 => Unary::Log,
        14 => Unary::Sqrt,
        15 => Unary::Erf,
        16 => Unary::Neg,
        17 => Unary::Abs,
        18 => Unary::Reciprocal,
        t => return Err(format!("an unknown pointwise function {t}")),
    })
}

fn write_opt_unary(w: &mut Writer, u: &Option<Unary>) {
    match u {
        None => w.u8(0),
        Some(u) => {
            w.u8(1);
            write_unary(w, u)
        }
    }
}

fn read_opt_unary(r: &mut Reader) -> Result<Option<Unary>, String> {
    Ok(if r.bool()? {
        Some(read_unary(r)?)
    } else {
        None
    })
}

fn write_pool(w: &mut Writer, p: &PoolAttrs) {
    p.kernel.iter().for_each(|&x| w.usize(x));
    p.strides.iter().for_each(|&x| w.usize(x));
    p.pads.iter().for_each(|&x| w.usize(x));
    p.dilations.iter().for_each(|&x| w.usize(x));
    w.bool(p.ceil_mode);
    w.bool(p.count_include_pad);
}

fn read_pool(r: &mut Reader) -> Result<PoolAttrs, String> {
    Ok(PoolAttrs {
        kernel: r.array()?,
        strides: r.array()?,
        pads: r.array()?,
        dilations: r.array()?,
        ceil_mode: r.bool()?,
        count_include_pad: r.bool()?,
    })
}

const BINARIES: [Binary; 7] = [
    Binary::Add,
    Binary::Sub,
    Binary::Mul,
    Binary::Div,
    Binary::Pow,
    Binary::Max,
    Binary::Min,
];
const REDUCES: [ReduceKind; 7] = [
    ReduceKind::Mean,
    ReduceKind::Sum,
    ReduceKind::Max,
    ReduceKind::Min,
    ReduceKind::L1,
    ReduceKind::SumSquare,
    ReduceKind::L2,
];
const COORDS: [CoordMode; 4] = [
    CoordMode::HalfPixel,
    CoordMode::PytorchHalfPixel,
    CoordMode::AlignCorners,
    CoordMode::Asymmetric,
];
const NEARESTS: [NearestMode; 4] = [
    NearestMode::RoundPreferFloor,
    NearestMode::RoundPreferCeil,
    NearestMode::Floor,
    NearestMode::Ceil,
];
const QTYPES: [QuantType; 5] = [
    QuantType::Uint8,
    QuantType::Int8,
    QuantType::Uint16,
    QuantType::Int16,
    QuantType::Float8E4M3Fn,
];

fn index_of<T: PartialEq>(all: &[T], v: &T) -> u8 {
    all.iter()
        .position(|x| x == v)
        .expect("every variant is listed") as u8
}

fn pick<T: Copy>(all: &[T], i: u8, what: &str) -> Result<T, String> {
    all.get(i as usize)
        .copied()
        .ok_or_else(|| format!("an unknown {what} {i}"))
}

fn write_op(w: &mut Writer, op: &Op) {
    match op {
        Op::Conv(a) => {
            w.u8(0);
            a.strides.iter().for_each(|&x| w.usize(x));
            a.pads.iter().for_each(|&x| w.usize(x));
            a.dilations.iter().for_each(|&x| w.usize(x));
            w.usize(a.groups);
            write_opt_unary(w, &a.activation);
            w.bool(a.residual);
        }
        Op::BatchNorm { eps } => {
            w.u8(1);
            w.f32(*eps)
        }
        Op::Unary(u) => {
            w.u8(2);
            write_unary(w, u)
        }
        Op::Binary(b) => {
            w.u8(3);
            w.u8(index_of(&BINARIES, b))
        }
        Op::MatMul => w.u8(4),
        Op::Gemm {
            alpha,
            beta,
            trans_a,
            trans_b,
        } => {
            w.u8(5);
            w.f32(*alpha);
            w.f32(*beta);
            w.bool(*trans_a);
            w.bool(*trans_b);
        }
        Op::Linear { activation } => {
            w.u8(6);
            write_opt_unary(w, activation)
        }
        Op::MaxPool(p) => {
            w.u8(7);
            write_pool(w, p)
        }
        Op::AveragePool(p) => {
            w.u8(8);
            write_pool(w, p)
        }
        Op::GlobalAveragePool => w.u8(9),
        Op::AdaptiveAvgPool { output } => {
            w.u8(10);
            output.iter().for_each(|&x| w.usize(x));
        }
        Op::Flatten { axis } => {
            w.u8(11);
            w.i64(*axis)
        }
        Op::Reshape { shape } => {
            w.u8(12);
            write_dims(w, shape)
        }
        Op::Transpose { perm } => {
            w.u8(13);
            w.usizes(perm)
        }
        Op::Concat { axis } => {
            w.u8(14);
            w.i64(*axis)
        }
        Op::Split { axis, sizes } => {
            w.u8(15);
            w.i64(*axis);
            w.usizes(sizes);
        }
        Op::Slice {
            starts,
            ends,
            axes,
            steps,
        } => {
            w.u8(16);
            [starts, ends, axes, steps].iter().for_each(|v| w.i64s(v));
        }
        Op::Gather {
            axis,
            indices,
            indices_shape,
        } => {
            w.u8(17);
            w.i64(*axis);
            w.i64s(indices);
            w.usizes(indices_shape);
        }
        Op::Unsqueeze { axes } => {
            w.u8(18);
            w.i64s(axes)
        }
        Op::Squeeze { axes } => {
            w.u8(19);
            w.i64s(axes)
        }
        Op::Expand { shape } => {
            w.u8(20);
            write_dims(w, shape)
        }
        Op::Softmax { axis } => {
            w.u8(21);
            w.i64(*axis)
        }
        Op::LayerNorm { axis, eps } => {
            w.u8(22);
            w.i64(*axis);
            w.f32(*eps);
        }
        Op::Reduce {
            kind,
            axes,
            keepdims,
        } => {
            w.u8(23);
            w.u8(index_of(&REDUCES, kind));
            w.i64s(axes);
            w.bool(*keepdims);
        }
        Op::Resize(a) => {
            w.u8(24);
            w.bool(a.mode == ResizeMode::Linear);
            w.u8(index_of(&COORDS, &a.coord));
            w.u8(index_of(&NEARESTS, &a.nearest));
            match a.size {
                ResizeSize::Scales(s) => {
                    w.u8(0);
                    s.iter().for_each(|&x| w.f32(x));
                }
                ResizeSize::Size(s) => {
                    w.u8(1);
                    s.iter().for_each(|&x| w.usize(x));
                }
            }
        }
        Op::Identity => w.u8(25),
        Op::FakeQuant(q) => {
            w.u8(26);
            w.u8(index_of(&QTYPES, &q.qtype));
            w.bool(q.saturate);
            match q.granularity {
                Granularity::PerTensor => w.u8(0),
                Granularity::PerAxis { axis } => {
                    w.u8(1);
                    w.i64(axis)
                }
                Granularity::Blocked { axis, block } => {
                    w.u8(2);
                    w.i64(axis);
                    w.usize(block);
                }
            }
            w.f32s(&q.scales);
            w.f32s(&q.zero_points);
        }
    }
}

fn read_op(r: &mut Reader) -> Result<Op, String> {
    Ok(match r.u8()? {
        0 => Op::Conv(ConvAttrs {
            strides: r.array()?,
            pads: r.array()?,
            dilations: r.array()?,
            groups: r.usize()?,
            activation: read_opt_unary(r)?,
            residual: r.bool()?,
        }),
        1 => Op::BatchNorm { eps: r.f32()? },
        2 => Op::Unary(read_unary(r)?),
        3 => Op::Binary(pick(&BINARIES, r.u8()?, "binary op")?),
        4 => Op::MatMul,
        5 => Op::Gemm {
            alpha: r.f32()?,
            beta: r.f32()?,
            trans_a: r.bool()?,
            trans_b: r.bool()?,
        },
        6 => Op::Linear {
            activation: read_opt_unary(r)?,
        },
        7 => Op::MaxPool(read_pool(r)?),
        8 => Op::AveragePool(read_pool(r)?),
        9 => Op::GlobalAveragePool,
        10 => Op::AdaptiveAvgPool { output: r.array()? },
        11 => Op::Flatten { axis: r.i64()? },
        12 => Op::Reshape {
            shape: read_dims(r)?,
        },
        13 => Op::Transpose { perm: r.usizes()? },
        14 => Op::Concat { axis: r.i64()? },
        15 => Op::Split {
            axis: r.i64()?,
            sizes: r.usizes()?,
        },
        16 => Op::Slice {
            starts: r.i64s()?,
            ends: r.i64s()?,
            axes: r.i64s()?,
            steps: r.i64s()?,
        },
        17 => Op::Gather {
            axis: r.i64()?,
            indices: r.i64s()?,
            indices_shape: r.usizes()?,
        },
        18 => Op::Unsqueeze { axes: r.i64s()? },
        19 => Op::Squeeze { axes: r.i64s()? },
        20 => Op::Expand {
            shape: read_dims(r)?,
        },
        21 => Op::Softmax { axis: r.i64()? },
        22 => Op::LayerNorm {
            axis: r.i64()?,
            eps: r.f32()?,
        },
        23 => Op::Reduce {
            kind: pick(&REDUCES, r.u8()?, "reduction")?,
            axes: r.i64s()?,
            keepdims: r.bool()?,
        },
        24 => Op::Resize(ResizeAttrs {
            mode: if r.bool()? {
                ResizeMode::Linear
            } else {
                ResizeMode::Nearest
            },
            coord: pick(&COORDS, r.u8()?, "coordinate mode")?,
            nearest: pick(&NEARESTS, r.u8()?, "nearest mode")?,
            size: match r.u8()? {
                0 => ResizeSize::Scales([r.f32()?, r.f32()?]),
                1 => ResizeSize::Size(r.array()?),
                t => return Err(format!("an unknown resize size kind {t}")),
            },
        }),
        25 => Op::Identity,
        26 => Op::FakeQuant(FakeQuantAttrs {
            qtype: pick(&QTYPES, r.u8()?, "quantized type")?,
            saturate: r.bool()?,
            granularity: match r.u8()? {
                0 => Granularity::PerTensor,
                1 => Granularity::PerAxis { axis: r.i64()? },
                2 => Granularity::Blocked {
                    axis: r.i64()?,
                    block: r.usize()?,
                },
                t => return Err(format!("an unknown quantization granularity {t}")),
            },
            scales: r.f32s()?,
            zero_points: r.f32s()?,
        }),
        t => return Err(format!("an unknown op {t}")),
    })
}

fn write_graph(w: &mut Writer, g: &Graph) {
    w.str(&g.name);
    w.usize(g.values.len());
    for v in &g.values {
        w.str(&v.name);
        match &v.kind {
            ValueKind::Input(dims) => {
                w.u8(0);
                write_dims(w, dims)
            }
            ValueKind::Constant(t) => {
                w.u8(1);
                w.usizes(&t.shape);
                w.f32s(&t.data);
            }
            ValueKind::Computed { node, index } => {
                w.u8(2);
                w.usize(*node);
                w.usize(*index);
            }
        }
    }
    w.usize(g.nodes.len());
    for n in &g.nodes {
        w.str(&n.name);
        write_op(w, &n.op);
        w.usizes(&n.inputs);
        w.usizes(&n.outputs);
    }
    w.usizes(&g.inputs);
    w.usizes(&g.outputs);
}

fn read_graph(r: &mut Reader) -> Result<Graph, String> {
    let name = r.str()?;
    let nv = r.count(9)?;
    let mut values = Vec::with_capacity(nv);
    for _ in 0..nv {
        let name = r.str()?;
        let kind = match r.u8()? {
            0 => ValueKind::Input(read_dims(r)?),
            1 => {
                let shape = r.usizes()?;
                let data = r.f32s()?;
                let t = Tensor::new(shape, data).map_err(|e| format!("constant `{name}`: {e}"))?;
                ValueKind::Constant(Arc::new(t))
            }
            2 => ValueKind::Computed {
                node: r.usize()?,
                index: r.usize()?,
            },
            t => return Err(format!("value `{name}` of an unknown kind {t}")),
        };
        // f32 as the builder makes inputs and constants; a computed value's type is set
        // below from its op, as the builder does (the file does not hold it).
        values.push(Value {
            name,
            kind,
            ty: ValueType::F32,
        });
    }
    let nn = r.count(9)?;
    let mut nodes = Vec::with_capacity(nn);
    for _ in 0..nn {
        let name = r.str()?;
        let op = read_op(r).map_err(|e| format!("node `{name}`: {e}"))?;
        nodes.push(Node {
            name,
            op,
            inputs: r.usizes()?,
            outputs: r.usizes()?,
        });
    }
    for n in &nodes {
        let ins: Vec<&ValueType> = n
            .inputs
            .iter()
            .filter_map(|&i| values.get(i).map(|v| &v.ty))
            .collect();
        // A rule's refusal is left to the graph's validation, which names the node.
        let Ok(types) = crate::ops::value_types(&n.op, &ins) else {
            continue;
        };
        for (&o, ty) in n.outputs.iter().zip(types) {
            if let Some(v) = values.get_mut(o) {
                v.ty = ty;
            }
        }
    }
    Ok(Graph {
        name,
        values,
        nodes,
        inputs: r.usizes()?,
        outputs: r.usizes()?,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{build_model, passes, CompiledModel, CpuBackend, Precision, Weights};

    fn plan_of(model: &str, batch: usize) -> (Graph, SavedPlan) {
        let g = build_model(model, Weights::Synthetic { seed: 7 }).unwrap();
        let fused = passes::optimize(&g, batch).unwrap();
        let saved = SavedPlan {
            key: vec![
                (FIELD_DEVICE.into(), "cpu".into()),
                (FIELD_PRECISION.into(), "fp32".into()),
                (FIELD_BATCH.into(), batch.to_string()),
                (FIELD_ENGINE.into(), format!("cpu {CPU_REVISION}")),
                (FIELD_MODEL_HASH.into(), model_hash(&g)),
            ],
            graph: fused,
            backend: vec![1, 2, 3],
        };
        (g, saved)
    }

    fn outputs(g: &Graph, batch: usize) -> Vec<u32> {
        let mut m = CpuBackend::new(1)
            .compile_cpu(g, batch, Precision::Fp32)
            .unwrap();
        for (i, x) in m.input_mut().iter_mut().enumerate() {
            *x = ((i * 7919) % 1000) as f32 / 500.0 - 1.0;
        }
        m.run().unwrap();
        m.output().iter().map(|v| v.to_bits()).collect()
    }

    #[test]
    fn a_saved_cpu_plan_computes_the_same_bits_as_the_model() {
        for (model, batch) in [("resnet18", 1), ("mobilenet_v2", 2)] {
            let (g, saved) = plan_of(model, batch);
            let bytes = saved.to_bytes();
            let back = SavedPlan::from_bytes("x.isoplan", &bytes).unwrap();
            assert_eq!(back, saved);
            assert_eq!(
                outputs(&back.graph, batch),
                outputs(&g, batch),
                "{model} batch {batch}"
            );
        }
    }

    /// Loading a CPU plan compiles its fused graph, whose passes run again: they must leave it
    /// as it is, so that the loaded model is the built one, node for node (same kernels, same
    /// speed), not only the same bits.
    #[test]
    fn the_passes_leave_a_saved_graph_as_it_is() {
        for (model, batch) in [("resnet18", 1), ("mobilenet_v2", 2), ("vit_b_16", 1)] {
            let g = build_model(model, Weights::Zeros).unwrap();
            let fused = passes::optimize(&g, batch).unwrap();
            let again = passes::optimize(&fused, batch).unwrap();
            assert_eq!(again.nodes, fused.nodes, "{model}");
            assert_eq!(again.values.len(), fused.values.len(), "{model}");
        }
    }

    #[test]
    fn every_op_round_trips() {
        use crate::quant::QuantType;
        let mut g = Graph::new("ops");
        let x = g.add_input(
            "x",
            vec![Dim::Batch, Dim::Fixed(4), Dim::Fixed(6), Dim::Fixed(6)],
        );
        let w = g.add_constant(
            "w",
            Tensor::new(vec![4, 4, 1, 1], (0..16).map(|i| i as f32 * 0.1).collect()).unwrap(),
        );
        let ops = vec![
            Op::Unary(Unary::Clip {
                min: f32::NEG_INFINITY,
                max: 6.0,
            }),
            Op::Unary(Unary::HardSigmoid {
                alpha: 0.2,
                beta: 0.5,
            }),
            Op::Unary(Unary::LeakyRelu { alpha: 0.01 }),
            Op::MaxPool(PoolAttrs {
                kernel: [3, 3],
                strides: [1, 1],
                pads: [1, 1, 1, 1],
                ceil_mode: true,
                ..Default::default()
            }),
            Op::AveragePool(PoolAttrs {
                count_include_pad: true,
                ..Default::default()
            }),
            Op::Resize(ResizeAttrs {
                mode: ResizeMode::Nearest,
                coord: CoordMode::Asymmetric,
                nearest: NearestMode::Floor,
                size: ResizeSize::Size([6, 6]),
            }),
            Op::Resize(ResizeAttrs {
                mode: ResizeMode::Linear,
                coord: CoordMode::AlignCorners,
                nearest: NearestMode::RoundPreferCeil,
                size: ResizeSize::Scales([1.0, 1.0]),
            }),
            Op::FakeQuant(FakeQuantAttrs {
                qtype: QuantType::Int8,
                saturate: true,
                granularity: Granularity::PerAxis { axis: 1 },
                scales: vec![0.1, 0.2, 0.3, 0.4],
                zero_points: vec![0.0, 1.0, -1.0, 3.0],
            }),
            Op::Identity,
        ];
        let mut v = g
            .add_op(
                "conv",
                Op::Conv(ConvAttrs {
                    activation: Some(Unary::Relu6),
                    ..Default::default()
                }),
                &[x, w],
            )
            .unwrap();
        for (i, op) in ops.into_iter().enumerate() {
            v = g.add_op(format!("n{i}"), op, &[v]).unwrap();
        }
        let parts = g
            .add_node(
                "split",
                Op::Split {
                    axis: 1,
                    sizes: vec![1, 3],
                },
                &[v],
            )
            .unwrap();
        let a = g
            .add_op(
                "slice",
                Op::Slice {
                    starts: vec![-1],
                    ends: vec![i64::MIN],
                    axes: vec![2],
                    steps: vec![-1],
                },
                &[parts[1]],
            )
            .unwrap();
        let a = g
            .add_op(
                "reduce",
                Op::Reduce {
                    kind: ReduceKind::L2,
                    axes: vec![2, 3],
                    keepdims: true,
                },
                &[a],
            )
            .unwrap();
        let a = g
            .add_op(
                "reshape",
                Op::Reshape {
                    shape: vec![Dim::Copy, Dim::Infer],
                },
                &[a],
            )
            .unwrap();
        let b = g
            .add_op(
                "gather",
                Op::Gather {
                    axis: 1,
                    indices: vec![0, -1],
                    indices_shape: vec![2],
                },
                &[a],
            )
            .unwrap();
        let c = g.add_op("sub", Op::Binary(Binary::Sub), &[b, b]).unwrap();
        g.add_output(c).unwrap();
        g.add_output(parts[0]).unwrap();
        let saved = SavedPlan {
            key: vec![],
            graph: g,
            backend: vec![],
        };
        let back = SavedPlan::from_bytes("ops.isoplan", &saved.to_bytes()).unwrap();
        assert_eq!(back, saved);
        // NaN payloads survive as bits.
        let nan = f32::from_bits(0x7fc0_1234);
        let mut w = Writer::default();
        w.f32(nan);
        let b = w.into_bytes();
        assert_eq!(Reader::new(&b).f32().unwrap().to_bits(), 0x7fc0_1234);
    }

    #[test]
    fn damaged_files_are_refused_with_what_is_wrong() {
        let (_, saved) = plan_of("resnet18", 1);
        let bytes = saved.to_bytes();
        let err = |b: &[u8]| {
            SavedPlan::from_bytes("m.isoplan", b)
                .unwrap_err()
                .to_string()
        };
        let e = err(b"PK\x03\x04 an onnx or zip file");
        assert!(
            e.contains("m.isoplan") && e.contains("not a saved plan"),
            "{e}"
        );
        let e = err(&bytes[..bytes.len() / 2]);
        assert!(e.contains("truncated"), "{e}");
        let e = err(&bytes[..10]);
        assert!(e.contains("truncated"), "{e}");
        let mut flipped = bytes.clone();
        let mid = flipped.len() / 3;
        flipped[mid] ^= 0x10;
        let e = err(&flipped);
        assert!(e.contains("checksum"), "{e}");
        let mut longer = bytes.clone();
        longer.push(0);
        assert!(err(&longer).contains("1 bytes after"));
        let mut v2 = bytes.clone();
        v2[8..12].copy_from_slice(&2u32.to_le_bytes());
        let e = err(&v2);
        assert!(
            e.contains("format version 2")
                && e.contains(&format!("reads version {FORMAT_VERSION}")),
            "{e}"
        );
        // A payload whose checksum is right but whose counts lie: refused, not allocated.
        let mut w = Writer::default();
        w.usize(usize::MAX / 2);
        let payload = w.into_bytes();
        let mut forged = Vec::new();
        forged.extend_from_slice(MAGIC);
        forged.extend_from_slice(&FORMAT_VERSION.to_le_bytes());
        forged.extend_from_slice(&(payload.len() as u64).to_le_bytes());
        forged.extend_from_slice(&crc32fast::hash(&payload).to_le_bytes());
        forged.extend_from_slice(&payload);
        assert!(err(&forged).contains("a count of"), "{}", err(&forged));
    }

    #[test]
    fn a_key_mismatch_names_the_field_and_both_values() {
        let (_, saved) = plan_of("resnet18", 1);
        let here = |p: &str, b: &str| {
            vec![
                (FIELD_DEVICE.to_string(), "cpu".to_string()),
                (FIELD_PRECISION.to_string(), p.to_string()),
                (FIELD_BATCH.to_string(), b.to_string()),
            ]
        };
        saved.check_key("m.isoplan", &here("fp32", "1")).unwrap();
        let e = saved
            .check_key("m.isoplan", &here("fp16", "1"))
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("m.isoplan") && e.contains("precision \"fp32\"") && e.contains("\"fp16\""),
            "{e}"
        );
        let e = saved
            .check_key("m.isoplan", &here("fp32", "8"))
            .unwrap_err()
            .to_string();
        assert!(e.contains("batch \"1\"") && e.contains("\"8\""), "{e}");
    }

    #[test]
    fn save_and_load_through_a_file() {
        let (_, saved) = plan_of("mobilenet_v2", 1);
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("m.isoplan");
        saved.save(&p).unwrap();
        assert_eq!(SavedPlan::load(&p).unwrap(), saved);
        assert!(is_saved_plan_path("a/b/M.ISOPLAN"));
        assert!(!is_saved_plan_path("a/b/m.onnx"));
        let e = SavedPlan::load(&dir.path().join("none.isoplan"))
            .unwrap_err()
            .to_string();
        assert!(e.contains("none.isoplan"), "{e}");
    }

    /// `ctl load` reads a served plan again: one now linked to /dev/zero took 20 GB of the
    /// server's memory, and a FIFO blocked the reload for good. Both are refused naming the
    /// file, before a byte is read.
    #[test]
    fn a_device_or_a_fifo_is_no_saved_plan() {
        let dir = tempfile::tempdir().unwrap();
        let cases = isolane_core::files::a_device_and_a_fifo(dir.path(), ".isoplan");
        for (p, what) in &cases {
            let e = SavedPlan::load(p).unwrap_err().to_string();
            assert!(
                e.starts_with(&format!("saved plan `{}`: is {what}", p.display())),
                "{e}"
            );
        }
    }
}
