//! `kernel:` models: synthetic workloads of a known resource profile (issue 17), so that an
//! interference matrix can put a memory-bound or a compute-bound neighbour beside a model and
//! see which shared resource matters. Each job does a fixed amount of work, stated in bytes
//! moved and floating-point operations ([`KernelModel::work`]).
//!
//! Grammar (also in docs/scenario.md, "Synthetic kernels"):
//!
//! | model | one job |
//! | --- | --- |
//! | `kernel:triad:<size>` | STREAM triad `a = b + s·c` over three f32 arrays that fill `<size>` together |
//! | `kernel:gemm:<n>[:<precision>]` | `C = A·B`, M = N = K = `<n>`, precision `fp16` (default), `bf16`, `tf32` or `fp32` |
//! | `kernel:l2:<size>[:<passes>]` | `<passes>` (default 64) reads of one f32 buffer of `<size>`, sized to stay in L2 |
//!
//! `<size>` is a whole number with a binary unit: `KiB`, `MiB` or `GiB` (`256MiB`).

use super::Precision;

/// The accepted syntax, quoted in every error.
pub(crate) const KERNEL_SYNTAX: &str = "kernel:triad:<size>, kernel:gemm:<n>[:<precision>] or \
     kernel:l2:<size>[:<passes>] (size in KiB, MiB or GiB; precision fp16, bf16, tf32 or fp32), \
     e.g. \"kernel:triad:256MiB\", \"kernel:gemm:4096:fp16\", \"kernel:l2:16MiB\"";

/// Smallest `<size>`: below it a job is only the launch.
pub const MIN_KERNEL_BYTES: u64 = 1 << 10;
/// Largest triad `<size>` (64 GiB): more than any GPU of this project holds.
pub const MAX_TRIAD_BYTES: u64 = 64 << 30;
/// Largest l2 `<size>` (1 GiB): far past any L2; a larger one is a typo.
pub const MAX_L2_BYTES: u64 = 1 << 30;
/// GEMM sizes: tensor cores and cuBLASLt's fp16 layouts want multiples of 8.
pub const GEMM_MIN_N: u32 = 8;
pub const GEMM_MAX_N: u32 = 32768;
pub const GEMM_N_STEP: u32 = 8;
/// l2 passes per job.
pub const L2_DEFAULT_PASSES: u32 = 64;
pub const L2_MAX_PASSES: u32 = 1_000_000;

/// A parsed `kernel:` model.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum KernelModel {
    /// Memory-bound: each job reads `b` and `c` and writes `a`, `elems` f32 each.
    Triad { elems: u64 },
    /// Compute-bound: one `n`×`n`×`n` matrix product at `precision`.
    Gemm { n: u32, precision: Precision },
    /// L2-resident: `passes` reads of `elems` f32.
    L2 { elems: u64, passes: u32 },
}

/// The fixed work of one job (in summary.json's `work` and the interference cells).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, serde::Serialize, serde::Deserialize)]
pub struct KernelWork {
    /// Bytes read and written by the kernel (STREAM counting: each array once).
    pub bytes: u64,
    /// Floating-point operations (a multiply-add counts 2).
    pub flops: u64,
}

/// Why a `kernel:` model string is malformed; names the field and what is allowed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct KernelParseError(String);

fn err(s: &str, field: &str, why: impl std::fmt::Display) -> KernelParseError {
    KernelParseError(format!("{field} of {s:?}: {why}; expected {KERNEL_SYNTAX}"))
}

impl KernelModel {
    /// Parses `kernel:triad:256MiB`, `kernel:gemm:4096:fp16`, `kernel:l2:16MiB:128`.
    pub fn parse(s: &str) -> Result<KernelModel, KernelParseError> {
        let body = s
            .strip_prefix("kernel:")
            .ok_or_else(|| err(s, "prefix", "does not start with \"kernel:\""))?;
        let parts: Vec<&str> = body.split(':').collect();
        match parts.as_slice() {
            ["triad", size] => {
                let bytes = parse_size(s, "size", size, MAX_TRIAD_BYTES)?;
                Ok(KernelModel::Triad { elems: bytes / 12 })
            }
            ["gemm", n, rest @ ..] if rest.len() <= 1 => {
                let n = parse_gemm_n(s, n)?;
                let precision = match rest.first() {
                    None => Precision::Fp16,
                    Some(p) => parse_precision(s, p)?,
                };
                Ok(KernelModel::Gemm { n, precision })
            }
            ["l2", size, rest @ ..] if rest.len() <= 1 => {
                let bytes = parse_size(s, "size", size, MAX_L2_BYTES)?;
                let passes = match rest.first() {
                    None => L2_DEFAULT_PASSES,
                    Some(p) => parse_passes(s, p)?,
                };
                Ok(KernelModel::L2 {
                    elems: bytes / 4,
                    passes,
                })
            }
            [kind, ..] if !["triad", "gemm", "l2"].contains(kind) => Err(err(
                s,
                "kind",
                format!("unknown kind {kind:?} (allowed: triad, gemm, l2)"),
            )),
            _ => Err(err(s, "fields", "wrong number of ':'-separated fields")),
        }
    }

    /// The work of one job.
    pub fn work(&self) -> KernelWork {
        match *self {
            KernelModel::Triad { elems } => KernelWork {
                bytes: 3 * 4 * elems,
                flops: 2 * elems,
            },
            KernelModel::Gemm { n, precision } => {
                let n = u64::from(n);
                KernelWork {
                    // A and B read once, C written once: the least traffic a GEMM can make.
                    bytes: 3 * n * n * element_bytes(precision),
                    flops: 2 * n * n * n,
                }
            }
            KernelModel::L2 { elems, passes } => KernelWork {
                bytes: 4 * elems * u64::from(passes),
                flops: elems * u64::from(passes),
            },
        }
    }

    /// Device (or host) memory the kernel's buffers take, bytes.
    pub fn buffer_bytes(&self) -> u64 {
        match *self {
            KernelModel::Triad { elems } => 3 * 4 * elems,
            KernelModel::Gemm { n, precision } => {
                3 * u64::from(n) * u64::from(n) * element_bytes(precision)
            }
            KernelModel::L2 { elems, .. } => 4 * elems,
        }
    }
}

/// Bytes of one matrix element stored at `p` (tf32 is stored as f32).
pub fn element_bytes(p: Precision) -> u64 {
    match p {
        Precision::Int8 | Precision::Fp8 => 1,
        Precision::Fp16 | Precision::Bf16 => 2,
        Precision::Fp32 | Precision::Tf32 => 4,
    }
}

fn precision_word(p: Precision) -> &'static str {
    match p {
        Precision::Fp32 => "fp32",
        Precision::Tf32 => "tf32",
        Precision::Fp16 => "fp16",
        Precision::Bf16 => "bf16",
        Precision::Int8 => "int8",
        Precision::Fp8 => "fp8",
    }
}

impl std::fmt::Display for KernelModel {
    /// The canonical form: parse(display(x)) == x.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match *self {
            KernelModel::Triad { elems } => write!(f, "kernel:triad:{}KiB", elems * 12 / 1024),
            KernelModel::Gemm { n, precision } => {
                write!(f, "kernel:gemm:{n}:{}", precision_word(precision))
            }
            KernelModel::L2 { elems, passes } => {
                write!(f, "kernel:l2:{}KiB:{passes}", elems * 4 / 1024)
            }
        }
    }
}

/// `256MiB` → bytes, within [`MIN_KERNEL_BYTES`, `max`].
fn parse_size(s: &str, field: &str, v: &str, max: u64) -> Result<u64, KernelParseError> {
    let split = v.find(|c: char| !c.is_ascii_digit()).unwrap_or(v.len());
    let (num, unit) = v.split_at(split);
    let shift = match unit {
        "KiB" => 10,
        "MiB" => 20,
        "GiB" => 30,
        _ => {
            return Err(err(
                s,
                field,
                format!("{v:?} needs a whole number and a unit KiB, MiB or GiB"),
            ))
        }
    };
    let n: u64 = num
        .parse()
        .map_err(|_| err(s, field, format!("{v:?} is not a whole number with a unit")))?;
    let bytes = n.checked_shl(shift).filter(|b| b >> shift == n);
    match bytes {
        Some(b) if (MIN_KERNEL_BYTES..=max).contains(&b) => Ok(b),
        _ => Err(err(
            s,
            field,
            format!("{v} is outside 1KiB to {}GiB", max >> 30),
        )),
    }
}

fn parse_gemm_n(s: &str, v: &str) -> Result<u32, KernelParseError> {
    match v.parse::<u32>() {
        Ok(n) if (GEMM_MIN_N..=GEMM_MAX_N).contains(&n) && n % GEMM_N_STEP == 0 => Ok(n),
        _ => Err(err(
            s,
            "n",
            format!("{v:?} is not a multiple of {GEMM_N_STEP} from {GEMM_MIN_N} to {GEMM_MAX_N}"),
        )),
    }
}

fn parse_precision(s: &str, v: &str) -> Result<Precision, KernelParseError> {
    match v {
        "fp32" => Ok(Precision::Fp32),
        "tf32" => Ok(Precision::Tf32),
        "fp16" => Ok(Precision::Fp16),
        "bf16" => Ok(Precision::Bf16),
        _ => Err(err(
            s,
            "precision",
            format!("unknown {v:?} (allowed: fp16, bf16, tf32, fp32)"),
        )),
    }
}

fn parse_passes(s: &str, v: &str) -> Result<u32, KernelParseError> {
    match v.parse::<u32>() {
        Ok(p) if (1..=L2_MAX_PASSES).contains(&p) => Ok(p),
        _ => Err(err(
            s,
            "passes",
            format!("{v:?} is not a whole number from 1 to {L2_MAX_PASSES}"),
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_each_kind_and_its_work() {
        let t = KernelModel::parse("kernel:triad:12KiB").unwrap();
        assert_eq!(t, KernelModel::Triad { elems: 1024 });
        assert_eq!(
            t.work(),
            KernelWork {
                bytes: 12 * 1024,
                flops: 2048
            }
        );
        let g = KernelModel::parse("kernel:gemm:4096:fp16").unwrap();
        assert_eq!(g.work().flops, 2 * 4096u64.pow(3));
        assert_eq!(g.work().bytes, 3 * 4096 * 4096 * 2);
        assert_eq!(
            KernelModel::parse("kernel:gemm:64").unwrap(),
            KernelModel::Gemm {
                n: 64,
                precision: Precision::Fp16
            }
        );
        let l = KernelModel::parse("kernel:l2:16MiB").unwrap();
        assert_eq!(
            l,
            KernelModel::L2 {
                elems: 4 << 20,
                passes: L2_DEFAULT_PASSES
            }
        );
        assert_eq!(l.work().bytes, (16 << 20) * 64);
        assert_eq!(l.buffer_bytes(), 16 << 20);
        assert_eq!(
            KernelModel::parse("kernel:l2:1MiB:3").unwrap().work().bytes,
            3 << 20
        );
    }

    #[test]
    fn display_round_trips() {
        for s in [
            "kernel:triad:12KiB",
            "kernel:gemm:4096:bf16",
            "kernel:l2:1024KiB:7",
        ] {
            let m = KernelModel::parse(s).unwrap();
            assert_eq!(m.to_string(), s);
            assert_eq!(KernelModel::parse(&m.to_string()).unwrap(), m);
        }
    }

    #[test]
    fn errors_name_the_field_and_what_is_allowed() {
        for (s, needle) in [
            (
                "kernel:copy:1MiB",
                "unknown kind \"copy\" (allowed: triad, gemm, l2)",
            ),
            ("kernel:triad", "fields of"),
            ("kernel:triad:1MiB:2", "fields of"),
            ("kernel:triad:256MB", "size of"),
            ("kernel:triad:256", "unit KiB, MiB or GiB"),
            ("kernel:triad:-1MiB", "size of"),
            ("kernel:triad:0KiB", "outside 1KiB"),
            ("kernel:triad:65GiB", "outside 1KiB to 64GiB"),
            ("kernel:triad:99999999999999999999GiB", "size of"),
            ("kernel:l2:2GiB", "outside 1KiB to 1GiB"),
            ("kernel:l2:1MiB:0", "passes of"),
            ("kernel:gemm:100", "multiple of 8"),
            ("kernel:gemm:0", "n of"),
            ("kernel:gemm:40000", "n of"),
            (
                "kernel:gemm:64:int8",
                "unknown \"int8\" (allowed: fp16, bf16, tf32, fp32)",
            ),
            ("kernel:gemm:64:fp16:x", "fields of"),
        ] {
            let e = KernelModel::parse(s).unwrap_err().to_string();
            assert!(e.contains(needle), "{s}: {e}");
            assert!(e.contains("expected kernel:triad:<size>"), "{s}: {e}");
        }
    }
}
