//! Scenario parsing and validation.
//!
//! The file is parsed once into toml's spanned document (`DeTable`) and walked by hand rather
//! than through `#[derive(Deserialize)]`: serde stops at the first error and loses the position
//! of semantic errors (a negative rate is a well-typed float), while the walk knows the span of
//! every key and value, can name the field, and can report every problem of the file at once.

use std::collections::HashMap;
use std::ops::Range;
use std::path::{Path, PathBuf};

use serde::Serialize;
use toml::de::{DeString, DeTable, DeValue};
use toml::Spanned;

use super::error::{Problem, SpecError};
use super::kernel::KernelModel;
use super::limits::{
    MAX_JOBS, MAX_MARGIN_US, MAX_PIECE_US, MAX_RATE_HZ, MAX_SECONDS, MAX_SPIN_US,
    MAX_START_DELAY_MS, MAX_STRETCH, MIN_PIECE_US, MIN_SECONDS,
};
use super::model::{is_onnx_path, ModelCatalog, SpinModel, SPIN_SYNTAX};
use super::{
    Backend, Criticality, DeviceSpec, Host, LatePolicy, MaxRate, Mechanism, PartitionSpec,
    Precision, ProtectionSpec, Ramp, Rate, Role, RunLength, Scenario, TimingSpec, WorkloadSpec,
};

type Value<'i> = Spanned<DeValue<'i>>;
type Key<'i> = Spanned<DeString<'i>>;

const ROOT_KEYS: &[&str] = &["device", "timing", "protection", "workload"];
/// The keys each table of a scenario allows (also the property tests' alphabet).
pub const DEVICE_KEYS: &[&str] = &["backend", "gpu", "mechanism", "host"];
pub const TIMING_KEYS: &[&str] = &["spin_us", "start_delay_ms", "seed"];
pub const PROTECTION_KEYS: &[&str] = &["enabled", "piece_us", "margin_us", "stretch"];
pub const WORKLOAD_KEYS: &[&str] = &[
    "name",
    "model",
    "weights",
    "batch",
    "precision",
    "rate_hz",
    "deadline_ms",
    "duration_s",
    "jobs",
    "warmup_jobs",
    "late",
    "cpu",
    "role",
    "ramp",
    "host",
    "partition",
    "plan_check",
    "criticality",
];
const RAMP_KEYS: &[&str] = &["from_hz", "to_hz", "steps", "step_s"];
const PARTITION_KEYS: &[&str] = &["sms", "thread_pct", "mem_limit_mib", "mig_profile"];

const BACKENDS: &[(&str, Backend)] = &[("cpu", Backend::Cpu), ("cuda", Backend::Cuda)];
const MECHANISMS: &[(&str, Mechanism)] = &[
    ("none", Mechanism::None),
    ("timeslice", Mechanism::Timeslice),
    ("mps", Mechanism::Mps),
    ("mig", Mechanism::Mig),
    ("green", Mechanism::Green),
];
const HOSTS: &[(&str, Host)] = &[("thread", Host::Thread), ("process", Host::Process)];
const PRECISIONS: &[(&str, Precision)] = &[
    ("fp32", Precision::Fp32),
    ("tf32", Precision::Tf32),
    ("fp16", Precision::Fp16),
    ("bf16", Precision::Bf16),
];
const LATE: &[(&str, LatePolicy)] = &[("skip", LatePolicy::Skip), ("queue", LatePolicy::Queue)];
const CRITICALITIES: &[(&str, Criticality)] = &[
    ("critical", Criticality::Critical),
    ("best_effort", Criticality::BestEffort),
];
const ROLES: &[(&str, Role)] = &[
    ("standalone", Role::Standalone),
    ("victim", Role::Victim),
    ("interferer", Role::Interferer),
];

/// Default warm-up, in jobs (DESIGN.md: warm-up jobs run first and are excluded).
pub(crate) const DEFAULT_WARMUP_JOBS: u64 = 10;

pub(crate) fn default_mechanism(backend: Backend) -> Mechanism {
    match backend {
        Backend::Cpu => Mechanism::None,
        // No partitioning: the papers' "GPU stand-alone".
        Backend::Cuda => Mechanism::Timeslice,
    }
}

pub(crate) fn default_host(mechanism: Mechanism) -> Host {
    match mechanism {
        // Green contexts of one process run concurrently; separate processes would not
        // (DESIGN.md, "Partitions").
        Mechanism::None | Mechanism::Green => Host::Thread,
        Mechanism::Timeslice | Mechanism::Mps | Mechanism::Mig => Host::Process,
    }
}

fn name_of<T: PartialEq + Copy>(table: &[(&'static str, T)], v: T) -> &'static str {
    table.iter().find(|(_, t)| *t == v).map_or("?", |(n, _)| n)
}

/// What a time value may be: more than 0, from 1 ns ([`MIN_SECONDS`]) to 100 days
/// ([`MAX_SECONDS`]), in seconds or milliseconds.
fn seconds_expected(unit: &str, per_second: f64) -> String {
    let (lo, hi) = if per_second == 1e3 {
        ("1e-6", "8.64e9")
    } else {
        ("1e-9", "8.64e6")
    };
    debug_assert_eq!(hi.parse::<f64>().ok(), Some(MAX_SECONDS * per_second));
    format!("a finite number of {unit} > 0, from {lo} (1 ns) to {hi} (100 days)")
}

/// Accumulates problems with their positions.
struct Ctx<'a> {
    text: &'a str,
    /// Byte offset of the start of every line, ascending (the first is 0): a position is found
    /// by binary search, so locating a name costs O(log n), not a scan of the text before it
    /// (which made a scenario of many workloads quadratic to validate).
    line_starts: Vec<usize>,
    file: String,
    base_dir: PathBuf,
    problems: Vec<(usize, Problem)>,
}

/// Byte offsets at which the lines of `text` start.
fn line_starts(text: &str) -> Vec<usize> {
    std::iter::once(0)
        .chain(text.match_indices('\n').map(|(i, _)| i + 1))
        .collect()
}

impl Ctx<'_> {
    fn line_col(&self, offset: usize) -> (usize, usize) {
        let offset = offset.min(self.text.len());
        // Spans are byte offsets; a span inside a multi-byte char would be a toml bug, but
        // find a char boundary rather than panic on slicing.
        let mut offset = offset;
        while !self.text.is_char_boundary(offset) {
            offset -= 1;
        }
        // The last line start at or before `offset` (there is always one: 0).
        let line_index = self.line_starts.partition_point(|&s| s <= offset) - 1;
        let line_start = self.line_starts[line_index];
        let column = self.text[line_start..offset].chars().count() + 1;
        (line_index + 1, column)
    }

    fn report(&mut self, span: Range<usize>, field: impl Into<String>, message: impl Into<String>) {
        let (line, column) = self.line_col(span.start);
        self.problems.push((
            span.start,
            Problem {
                line,
                column,
                field: field.into(),
                message: message.into(),
            },
        ));
    }

    fn wrong(&mut self, v: &Value<'_>, field: &str, expected: &str) {
        self.report(
            v.span(),
            field,
            format!("found {}; expected {expected}", describe(v.get_ref())),
        );
    }

    // ---- typed extraction: each reports and returns None on a wrong type or value ----

    fn string<'v>(&mut self, v: &'v Value<'_>, field: &str, expected: &str) -> Option<&'v str> {
        match v.get_ref() {
            DeValue::String(s) => Some(s.as_ref()),
            _ => {
                self.wrong(v, field, expected);
                None
            }
        }
    }

    fn boolean(&mut self, v: &Value<'_>, field: &str) -> Option<bool> {
        match v.get_ref() {
            DeValue::Boolean(b) => Some(*b),
            _ => {
                self.wrong(v, field, "true or false");
                None
            }
        }
    }

    fn choice<T: Copy>(&mut self, v: &Value<'_>, field: &str, choices: &[(&str, T)]) -> Option<T> {
        let allowed = choices
            .iter()
            .map(|(n, _)| format!("\"{n}\""))
            .collect::<Vec<_>>()
            .join(" | ");
        let s = self.string(v, field, &format!("one of {allowed}"))?;
        match choices.iter().find(|(n, _)| *n == s) {
            Some((_, t)) => Some(*t),
            None => {
                self.wrong(v, field, &format!("one of {allowed}"));
                None
            }
        }
    }

    /// An integer ≥ `min` and ≤ `max`. Floats are refused even when integral: a count written
    /// `2.0` usually means the user confused two fields.
    fn integer(&mut self, v: &Value<'_>, field: &str, min: u64, max: u64) -> Option<u64> {
        // Both bounds, always: a value too large must be told the real limit.
        let expected = if max == 100 {
            format!("an integer from {min} to {max}")
        } else {
            format!("an integer >= {min} (at most {max})")
        };
        let DeValue::Integer(i) = v.get_ref() else {
            self.wrong(v, field, &expected);
            return None;
        };
        // i128 so that a u64 seed above i64::MAX (which toml writes) reads back.
        match i128::from_str_radix(i.as_str(), i.radix()) {
            Ok(n) if n >= i128::from(min) && n <= i128::from(max) => Some(n as u64),
            _ => {
                self.wrong(v, field, &expected);
                None
            }
        }
    }

    /// A finite number `x > 0` with `min <= x <= max` (integers accepted: `rate_hz = 100`); NaN and
    /// the infinities are refused.
    fn positive(
        &mut self,
        v: &Value<'_>,
        field: &str,
        min: f64,
        max: f64,
        expected: &str,
    ) -> Option<f64> {
        let x = match v.get_ref() {
            DeValue::Integer(i) => i64::from_str_radix(i.as_str(), i.radix())
                .ok()
                .map(|n| n as f64),
            DeValue::Float(f) => f.as_str().parse::<f64>().ok(),
            _ => None,
        };
        match x {
            Some(x) if x.is_finite() && x > 0.0 && x >= min && x <= max => Some(x),
            _ => {
                self.wrong(v, field, expected);
                None
            }
        }
    }

    fn table<'v, 'i>(&mut self, v: &'v Value<'i>, field: &str) -> Option<Tbl<'v, 'i>> {
        match v.get_ref() {
            DeValue::Table(t) => Some(Tbl {
                t,
                span: v.span(),
                path: field.to_string(),
            }),
            _ => {
                self.wrong(v, field, "a table");
                None
            }
        }
    }

    fn resolve_file(&self, s: &str) -> PathBuf {
        let p = Path::new(s);
        if p.is_absolute() {
            p.to_path_buf()
        } else {
            self.base_dir.join(p)
        }
    }
}

/// A table with its dotted path and span, for looking up keys and reporting.
struct Tbl<'v, 'i> {
    t: &'v DeTable<'i>,
    span: Range<usize>,
    path: String,
}

impl<'v, 'i> Tbl<'v, 'i> {
    fn get(&self, key: &str) -> Option<&'v Value<'i>> {
        self.t.get(key)
    }

    fn key_span(&self, key: &str) -> Range<usize> {
        self.t
            .get_key_value(key)
            .map_or(self.span.clone(), |(k, _)| k.span())
    }

    fn field(&self, key: &str) -> String {
        if self.path.is_empty() {
            key.to_string()
        } else {
            format!("{}.{}", self.path, key)
        }
    }

    fn check_keys(&self, ctx: &mut Ctx<'_>, allowed: &[&str]) {
        let mut unknown: Vec<&Key<'i>> = self
            .t
            .keys()
            .filter(|k| !allowed.contains(&k.get_ref().as_ref()))
            .collect();
        unknown.sort_by_key(|k| k.span().start);
        for k in unknown {
            let name: &str = k.get_ref().as_ref();
            let hint = closest(name, allowed)
                .map(|c| format!(" (did you mean \"{c}\"?)"))
                .unwrap_or_default();
            ctx.report(
                k.span(),
                self.field(name),
                format!(
                    "unknown key{hint}; allowed keys here: {}",
                    allowed.join(", ")
                ),
            );
        }
    }

    fn missing(&self, ctx: &mut Ctx<'_>, key: &str, expected: &str) {
        let where_ = if self.path.is_empty() {
            String::from("the file")
        } else {
            format!("[{}]", self.path)
        };
        ctx.report(
            self.span.clone(),
            self.field(key),
            format!("missing in {where_}; expected {expected}"),
        );
    }
}

/// A cheap "did you mean": an allowed key at edit distance ≤ 2.
fn closest<'a>(name: &str, allowed: &[&'a str]) -> Option<&'a str> {
    fn dist(a: &str, b: &str) -> usize {
        let b: Vec<char> = b.chars().collect();
        let mut prev: Vec<usize> = (0..=b.len()).collect();
        for (i, ca) in a.chars().enumerate() {
            let mut cur = vec![i + 1];
            for (j, cb) in b.iter().enumerate() {
                let sub = prev[j] + usize::from(ca != *cb);
                cur.push(sub.min(prev[j + 1] + 1).min(cur[j] + 1));
            }
            prev = cur;
        }
        prev[b.len()]
    }
    allowed
        .iter()
        .map(|a| (dist(name, a), *a))
        .filter(|(d, _)| *d <= 2)
        .min_by_key(|(d, _)| *d)
        .map(|(_, a)| a)
}

fn describe(v: &DeValue<'_>) -> String {
    match v {
        DeValue::String(s) => format!("string {:?}", s.as_ref()),
        DeValue::Integer(i) => format!("integer {}", i.as_str()),
        DeValue::Float(f) => format!("float {}", f.as_str()),
        DeValue::Boolean(b) => format!("boolean {b}"),
        DeValue::Datetime(d) => format!("datetime {d}"),
        DeValue::Array(_) => "an array".to_string(),
        DeValue::Table(_) => "a table".to_string(),
    }
}

fn valid_name(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= 64
        && s.chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '.' | '-'))
        && !s.chars().all(|c| c == '.')
}

/// Parse and validate; see [`Scenario::from_toml_str`].
pub(super) fn parse(
    text: &str,
    path: &Path,
    models: &dyn ModelCatalog,
) -> Result<Scenario, SpecError> {
    let file = path.display().to_string();
    let base_dir = path.parent().map(Path::to_path_buf).unwrap_or_default();
    let mut ctx = Ctx {
        text,
        line_starts: line_starts(text),
        file,
        base_dir,
        problems: Vec::new(),
    };
    let doc = match DeTable::parse(text) {
        Ok(d) => d,
        Err(e) => {
            let (line, column) = e.span().map_or((1, 1), |s| ctx.line_col(s.start));
            return Err(SpecError::Syntax {
                file: ctx.file,
                line,
                column,
                message: e.message().trim().replace('\n', "; "),
            });
        }
    };
    let root = Tbl {
        t: doc.get_ref(),
        span: 0..0,
        path: String::new(),
    };
    let scenario = parse_root(&mut ctx, &root, models);
    if ctx.problems.is_empty() {
        if let Some(s) = scenario {
            return Ok(s);
        }
    }
    let mut problems = ctx.problems;
    problems.sort_by_key(|(offset, _)| *offset);
    Err(SpecError::Invalid {
        file: ctx.file,
        problems: problems.into_iter().map(|(_, p)| p).collect(),
    })
}

fn parse_root(
    ctx: &mut Ctx<'_>,
    root: &Tbl<'_, '_>,
    models: &dyn ModelCatalog,
) -> Option<Scenario> {
    root.check_keys(ctx, ROOT_KEYS);

    let device = match root.get("device") {
        None => Some(DeviceSpec {
            backend: Backend::Cpu,
            gpu: 0,
            mechanism: Mechanism::None,
            host: Host::Thread,
        }),
        Some(v) => ctx.table(v, "device").and_then(|t| parse_device(ctx, &t)),
    };
    let timing = match root.get("timing") {
        None => Some(TimingSpec::default()),
        Some(v) => ctx.table(v, "timing").and_then(|t| parse_timing(ctx, &t)),
    };
    let protection = match root.get("protection") {
        None => Some(ProtectionSpec::default()),
        Some(v) => ctx
            .table(v, "protection")
            .and_then(|t| parse_protection(ctx, &t)),
    };

    let mut workloads = Vec::new();
    let mut all_ok = true;
    match root.get("workload") {
        None => {
            ctx.report(
                0..0,
                "workload",
                "no workloads; expected at least one [[workload]] table with name, model, rate_hz \
                 and duration_s or jobs",
            );
            all_ok = false;
        }
        Some(v) => match v.get_ref() {
            DeValue::Array(items) if items.iter().next().is_none() => {
                ctx.report(
                    v.span(),
                    "workload",
                    "no workloads; expected at least one [[workload]] table",
                );
                all_ok = false;
            }
            DeValue::Array(items) => {
                let mut names: HashMap<String, (usize, usize)> = HashMap::new();
                for (i, item) in items.iter().enumerate() {
                    let field = format!("workload[{i}]");
                    let Some(t) = ctx.table(item, &field) else {
                        all_ok = false;
                        continue;
                    };
                    // Duplicate names are checked here, where all names are seen.
                    if let Some(DeValue::String(n)) = t.get("name").map(|v| v.get_ref()) {
                        let n: &str = n.as_ref();
                        let span = t.get("name").map_or(t.span.clone(), |v| v.span());
                        if let Some((j, line)) = names.get(n) {
                            ctx.report(
                                span,
                                format!("{field}.name"),
                                format!(
                                    "found {n:?}, already the name of workload[{j}] (line {line}); \
                                     expected a name unique in the scenario"
                                ),
                            );
                        } else {
                            let line = ctx.line_col(span.start).0;
                            names.insert(n.to_string(), (i, line));
                        }
                    }
                    match parse_workload(ctx, &t, device.as_ref(), models) {
                        Some(w) => workloads.push(w),
                        None => all_ok = false,
                    }
                }
            }
            _ => {
                ctx.report(
                    v.span(),
                    "workload",
                    format!(
                        "found {}; expected an array of tables: write each workload as [[workload]], \
                         with two brackets",
                        describe(v.get_ref())
                    ),
                );
                all_ok = false;
            }
        },
    }

    if !all_ok {
        return None;
    }
    Some(Scenario {
        device: device?,
        timing: timing?,
        protection: protection?,
        workloads,
    })
}

fn parse_device(ctx: &mut Ctx<'_>, t: &Tbl<'_, '_>) -> Option<DeviceSpec> {
    t.check_keys(ctx, DEVICE_KEYS);
    let before = ctx.problems.len();
    let backend = match t.get("backend") {
        None => Some(Backend::Cpu),
        Some(v) => ctx.choice(v, "device.backend", BACKENDS),
    };
    let gpu = match t.get("gpu") {
        None => Some(0),
        Some(v) => ctx
            .integer(v, "device.gpu", 0, u64::from(u32::MAX))
            .map(|g| g as u32),
    };
    let mechanism = match (t.get("mechanism"), backend) {
        (None, Some(b)) => Some(default_mechanism(b)),
        (None, None) => None,
        (Some(v), _) => ctx.choice(v, "device.mechanism", MECHANISMS),
    };
    if let (Some(b), Some(m), Some(v)) = (backend, mechanism, t.get("mechanism")) {
        match (b, m) {
            (Backend::Cpu, m) if m != Mechanism::None => ctx.report(
                v.span(),
                "device.mechanism",
                format!(
                    "found \"{}\" with backend \"cpu\"; expected \"none\": the CPU is not partitioned \
                     (timeslice, mps, mig and green need backend = \"cuda\")",
                    name_of(MECHANISMS, m)
                ),
            ),
            (Backend::Cuda, Mechanism::None) => ctx.report(
                v.span(),
                "device.mechanism",
                "found \"none\" with backend \"cuda\"; expected one of \"timeslice\" | \"mps\" | \
                 \"mig\" | \"green\" (\"none\" is for the cpu backend)",
            ),
            _ => {}
        }
    }
    let host = match (t.get("host"), mechanism) {
        (None, Some(m)) => Some(default_host(m)),
        (None, None) => None,
        (Some(v), m) => {
            let h = ctx.choice(v, "device.host", HOSTS);
            if let (Some(h), Some(m)) = (h, m) {
                check_host(ctx, v, "device.host", h, m);
            }
            h
        }
    };
    if ctx.problems.len() > before {
        return None;
    }
    Some(DeviceSpec {
        backend: backend?,
        gpu: gpu?,
        mechanism: mechanism?,
        host: host?,
    })
}

fn check_host(ctx: &mut Ctx<'_>, v: &Value<'_>, field: &str, host: Host, m: Mechanism) {
    if host == Host::Thread && default_host(m) == Host::Process {
        let why = match m {
            Mechanism::Mps => "each MPS client is its own process",
            Mechanism::Mig => "each MIG instance is bound to its own worker process",
            _ => "timeslice shares the GPU between separate processes",
        };
        ctx.report(
            v.span(),
            field,
            format!(
                "found \"thread\" with mechanism \"{}\"; expected \"process\" ({why})",
                name_of(MECHANISMS, m)
            ),
        );
    }
}

fn parse_timing(ctx: &mut Ctx<'_>, t: &Tbl<'_, '_>) -> Option<TimingSpec> {
    t.check_keys(ctx, TIMING_KEYS);
    let d = TimingSpec::default();
    let mut get = |key: &str, default: u64, max: u64| match t.get(key) {
        None => Some(default),
        Some(v) => ctx.integer(v, &t.field(key), 0, max),
    };
    let spin_us = get("spin_us", d.spin_us, MAX_SPIN_US);
    let start_delay_ms = get("start_delay_ms", d.start_delay_ms, MAX_START_DELAY_MS);
    let seed = get("seed", d.seed, u64::MAX);
    Some(TimingSpec {
        spin_us: spin_us?,
        start_delay_ms: start_delay_ms?,
        seed: seed?,
    })
}

fn parse_protection(ctx: &mut Ctx<'_>, t: &Tbl<'_, '_>) -> Option<ProtectionSpec> {
    t.check_keys(ctx, PROTECTION_KEYS);
    let d = ProtectionSpec::default();
    let enabled = match t.get("enabled") {
        None => Some(d.enabled),
        Some(v) => ctx.boolean(v, &t.field("enabled")),
    };
    let piece_us = match t.get("piece_us") {
        None => Some(d.piece_us),
        Some(v) => ctx.integer(v, &t.field("piece_us"), MIN_PIECE_US, MAX_PIECE_US),
    };
    let margin_us = match t.get("margin_us") {
        None => Some(d.margin_us),
        Some(v) => ctx.integer(v, &t.field("margin_us"), 0, MAX_MARGIN_US),
    };
    let stretch = match t.get("stretch") {
        None => Some(None),
        Some(v) => ctx
            .positive(
                v,
                &t.field("stretch"),
                1.0,
                MAX_STRETCH,
                &format!("a number from 1 to {MAX_STRETCH} (how many times longer a critical job may take beside best effort)"),
            )
            .map(Some),
    };
    Some(ProtectionSpec {
        enabled: enabled?,
        piece_us: piece_us?,
        margin_us: margin_us?,
        stretch: stretch?,
    })
}

fn parse_workload(
    ctx: &mut Ctx<'_>,
    t: &Tbl<'_, '_>,
    device: Option<&DeviceSpec>,
    models: &dyn ModelCatalog,
) -> Option<WorkloadSpec> {
    t.check_keys(ctx, WORKLOAD_KEYS);
    let before = ctx.problems.len();
    let f = |k: &str| t.field(k);

    let name = match t.get("name") {
        None => {
            t.missing(
                ctx,
                "name",
                "a name of letters, digits, '_', '.' or '-', unique in the scenario",
            );
            None
        }
        Some(v) => {
            let expected = "a name of 1 to 64 letters, digits, '_', '.' or '-' (it becomes a file \
                            name), not only dots";
            match ctx.string(v, &f("name"), expected) {
                Some(s) if valid_name(s) => Some(s.to_string()),
                Some(_) => {
                    ctx.wrong(v, &f("name"), expected);
                    None
                }
                None => None,
            }
        }
    };

    let role = match t.get("role") {
        None => Some(Role::Standalone),
        Some(v) => ctx.choice(v, &f("role"), ROLES),
    };

    // Synthetic models (`spin:`, `kernel:`) have no weights.
    let (model, is_synthetic) = match t.get("model") {
        None => {
            t.missing(ctx, "model", &model_expectation(models));
            (None, false)
        }
        Some(v) => match ctx.string(v, &f("model"), &model_expectation(models)) {
            Some(s) => (
                check_model(ctx, v, &f("model"), s, models),
                s.starts_with("spin:") || s.starts_with("kernel:"),
            ),
            None => (None, false),
        },
    };

    let weights = match t.get("weights") {
        None => None,
        Some(v) => {
            if is_synthetic {
                ctx.report(
                    t.key_span("weights"),
                    f("weights"),
                    "not allowed with a spin: or kernel: model (it has no weights); remove it, \
                     or use a built-in or .onnx model",
                );
                None
            } else {
                ctx.string(v, &f("weights"), "a path to a .safetensors file")
                    .and_then(|s| check_file(ctx, v, &f("weights"), s, "weights file"))
            }
        }
    };

    let batch = match t.get("batch") {
        None => Some(1),
        Some(v) => ctx
            .integer(v, &f("batch"), 1, u64::from(u32::MAX))
            .map(|b| b as u32),
    };

    let precision = match t.get("precision") {
        None => Some(Precision::Fp32),
        Some(v) => {
            let p = ctx.choice(v, &f("precision"), PRECISIONS);
            if let (Some(p), Some(d)) = (p, device) {
                if d.backend == Backend::Cpu && p != Precision::Fp32 {
                    ctx.report(
                        v.span(),
                        f("precision"),
                        format!(
                            "found \"{}\" with backend \"cpu\"; expected \"fp32\" (tf32, fp16 and \
                             bf16 need backend = \"cuda\")",
                            name_of(PRECISIONS, p)
                        ),
                    );
                }
            }
            p
        }
    };

    let ramp = match (t.get("ramp"), role) {
        (Some(_), Some(r)) if r != Role::Interferer => {
            ctx.report(
                t.key_span("ramp"),
                f("ramp"),
                format!(
                    "not allowed with role \"{}\"; expected role = \"interferer\" (only an \
                     interferer ramps its rate)",
                    name_of(ROLES, r)
                ),
            );
            None
        }
        (Some(v), _) => ctx.table(v, &f("ramp")).and_then(|rt| parse_ramp(ctx, &rt)),
        (None, Some(Role::Interferer)) => {
            t.missing(
                ctx,
                "ramp",
                "ramp = { from_hz = <Hz>, to_hz = <Hz>, steps = <n>, step_s = <s> } (an \
                 interferer's rate comes from its ramp)",
            );
            None
        }
        (None, _) => None,
    };
    let interferer = role == Some(Role::Interferer);

    let rate_expected = format!(
        "a finite number > 0 (jobs per second) and <= {MAX_RATE_HZ:e} (one per ns, the clock's \
         resolution), or \"max\" (closed loop)"
    );
    let rate = match t.get("rate_hz") {
        Some(_) if interferer => {
            ctx.report(
                t.key_span("rate_hz"),
                f("rate_hz"),
                "not allowed with role \"interferer\"; its rates come from ramp (from_hz .. to_hz)",
            );
            None
        }
        None if interferer => ramp.map(|r| Rate::Hz(r.from_hz)),
        None => {
            t.missing(ctx, "rate_hz", &rate_expected);
            None
        }
        Some(v) => match v.get_ref() {
            DeValue::String(s) if s.as_ref() == "max" => {
                if role == Some(Role::Victim) {
                    ctx.report(
                        v.span(),
                        f("rate_hz"),
                        "found \"max\" with role \"victim\"; expected a fixed rate > 0 (a victim's \
                         deadline keeping is measured at a fixed rate, e.g. its max stable rate)",
                    );
                    None
                } else {
                    Some(Rate::Max(MaxRate::Max))
                }
            }
            _ => ctx
                .positive(v, &f("rate_hz"), 0.0, MAX_RATE_HZ, &rate_expected)
                .map(Rate::Hz),
        },
    };

    let deadline_ms = match t.get("deadline_ms") {
        None => None,
        Some(v) => ctx.positive(
            v,
            &f("deadline_ms"),
            MIN_SECONDS * 1e3,
            MAX_SECONDS * 1e3,
            &seconds_expected("milliseconds", 1e3),
        ),
    };

    let length = match (t.get("duration_s"), t.get("jobs")) {
        (d, j) if interferer => {
            if d.is_some() || j.is_some() {
                let key = if d.is_some() { "duration_s" } else { "jobs" };
                ctx.report(
                    t.key_span(key),
                    f(key),
                    "not allowed with role \"interferer\"; its length is the ramp's steps × step_s",
                );
                None
            } else {
                ramp.map(|r| RunLength::DurationS(r.total_duration_s()))
            }
        }
        (Some(_), Some(_)) => {
            // Point at whichever of the two comes second: that is the one to delete.
            let later = if t.key_span("jobs").start > t.key_span("duration_s").start {
                "jobs"
            } else {
                "duration_s"
            };
            ctx.report(
                t.key_span(later),
                f(later),
                "found both duration_s and jobs; expected exactly one of them",
            );
            None
        }
        (None, None) => {
            t.missing(
                ctx,
                "duration_s",
                "exactly one of duration_s (seconds > 0) or jobs (an integer >= 1)",
            );
            None
        }
        (Some(v), None) => ctx
            .positive(
                v,
                &f("duration_s"),
                MIN_SECONDS,
                MAX_SECONDS,
                &seconds_expected("seconds", 1.0),
            )
            .map(RunLength::DurationS),
        (None, Some(v)) => ctx.integer(v, &f("jobs"), 1, MAX_JOBS).map(RunLength::Jobs),
    };

    let warmup_jobs = match t.get("warmup_jobs") {
        None => Some(DEFAULT_WARMUP_JOBS),
        Some(v) => ctx.integer(v, &f("warmup_jobs"), 0, MAX_JOBS),
    };

    let late = match t.get("late") {
        None => Some(LatePolicy::Skip),
        Some(v) => ctx.choice(v, &f("late"), LATE),
    };

    let cpu = match t.get("cpu") {
        None => Some(Vec::new()),
        Some(v) => parse_cpu_list(ctx, v, &f("cpu")),
    };

    let host = match (t.get("host"), device) {
        (None, Some(d)) => Some(d.host),
        (None, None) => None,
        (Some(v), d) => {
            let h = ctx.choice(v, &f("host"), HOSTS);
            if let (Some(h), Some(d)) = (h, d) {
                check_host(ctx, v, &f("host"), h, d.mechanism);
            }
            h
        }
    };

    let partition = match t.get("partition") {
        None => Some(PartitionSpec::default()),
        Some(v) => ctx
            .table(v, &f("partition"))
            .and_then(|pt| parse_partition(ctx, &pt, device.map(|d| d.mechanism))),
    };

    let plan_check = match t.get("plan_check") {
        None => Some(true),
        Some(v) => ctx.boolean(v, &f("plan_check")),
    };
    let criticality = match t.get("criticality") {
        None => Some(Criticality::Critical),
        Some(v) => ctx.choice(v, &f("criticality"), CRITICALITIES),
    };
    if let (Some(rate), Some(length)) = (rate, length) {
        check_job_count(ctx, t, rate, length, ramp.filter(|_| interferer));
    }

    if ctx.problems.len() > before {
        return None;
    }
    Some(WorkloadSpec {
        name: name?,
        model: model?,
        weights,
        batch: batch?,
        precision: precision?,
        rate: rate?,
        deadline_ms,
        length: length?,
        warmup_jobs: warmup_jobs?,
        late: late?,
        cpu: cpu?,
        role: role?,
        ramp,
        host: host?,
        partition: partition?,
        plan_check: plan_check?,
        criticality: criticality?,
    })
}

/// The jobs a run length releases must be at least one (a run that releases nothing measures
/// nothing and would say "ok") and at most [`MAX_JOBS`]. A ramp's every step must release one.
fn check_job_count(
    ctx: &mut Ctx<'_>,
    t: &Tbl<'_, '_>,
    rate: Rate,
    length: RunLength,
    ramp: Option<Ramp>,
) {
    if let Some(r) = ramp {
        check_ramp_jobs(ctx, t, &r);
        return;
    }
    let (RunLength::DurationS(d), Rate::Hz(hz)) = (length, rate) else {
        return;
    };
    let span = t.get("duration_s").map_or(t.span.clone(), |v| v.span());
    let field = t.field("duration_s");
    let jobs = d * hz;
    if crate::schedule::jobs_in(d, hz) == 0 {
        ctx.report(
            span,
            field,
            format!(
                "found {d} s at rate_hz = {hz}: no job would be released (duration_s × rate_hz = \
                 {jobs:e} < 1); expected at least one period, {:e} s",
                1.0 / hz
            ),
        );
    } else if jobs > MAX_JOBS as f64 {
        ctx.report(
            span,
            field,
            format!(
                "found {d} s at rate_hz = {hz}: {jobs:e} jobs; expected at most {MAX_JOBS} jobs \
                 (duration_s × rate_hz)"
            ),
        );
    }
}

fn check_ramp_jobs(ctx: &mut Ctx<'_>, t: &Tbl<'_, '_>, r: &Ramp) {
    let span = t.get("ramp").map_or(t.span.clone(), |v| v.span());
    let field = t.field("ramp");
    if r.total_duration_s() > MAX_SECONDS {
        ctx.report(
            span,
            field,
            format!(
                "found steps × step_s = {} × {} s = {:e} s; expected at most {MAX_SECONDS:e} s",
                r.steps,
                r.step_s,
                r.total_duration_s()
            ),
        );
        return;
    }
    // The first step has the lowest rate: if it releases a job, every step does.
    if crate::schedule::jobs_in(r.step_s, r.from_hz) == 0 {
        ctx.report(
            span,
            field,
            format!(
                "found step_s = {} s at from_hz = {}: the first step would release no job \
                 (step_s × from_hz < 1); expected step_s >= {:e} s",
                r.step_s,
                r.from_hz,
                1.0 / r.from_hz
            ),
        );
        return;
    }
    let total: f64 = r.rates().iter().map(|h| h * r.step_s).sum();
    if total > MAX_JOBS as f64 {
        ctx.report(
            span,
            field,
            format!("releases {total:e} jobs over its steps; expected at most {MAX_JOBS} jobs"),
        );
    }
}

fn model_expectation(models: &dyn ModelCatalog) -> String {
    let names = models.builtin_names();
    let builtins = if names.is_empty() {
        "no built-in models in this build".to_string()
    } else {
        format!("a built-in model: {}", names.join(", "))
    };
    format!(
        "\"spin:<time>[~<jitter>]\" (e.g. \"spin:4ms\"), \"kernel:<kind>:…\" (e.g. \
         \"kernel:triad:256MiB\"), a path ending in .onnx, or {builtins}"
    )
}

/// Validates the model string; returns it in resolved form (an `.onnx` path made absolute, so
/// the resolved scenario works from any directory).
fn check_model(
    ctx: &mut Ctx<'_>,
    v: &Value<'_>,
    field: &str,
    s: &str,
    models: &dyn ModelCatalog,
) -> Option<String> {
    if s.starts_with("spin:") {
        return match SpinModel::parse(s) {
            Ok(_) => Some(s.to_string()),
            Err(e) => {
                ctx.report(v.span(), field, e.to_string());
                None
            }
        };
    }
    if s.starts_with("kernel:") {
        return match KernelModel::parse(s) {
            Ok(_) => Some(s.to_string()),
            Err(e) => {
                ctx.report(v.span(), field, e.to_string());
                None
            }
        };
    }
    if is_onnx_path(s) {
        return check_file(ctx, v, field, s, "ONNX file");
    }
    if models.is_builtin(s) {
        return Some(s.to_string());
    }
    let hint = if s.starts_with("spin") {
        format!(" ({SPIN_SYNTAX})")
    } else {
        String::new()
    };
    ctx.report(
        v.span(),
        field,
        format!(
            "unknown model {s:?}{hint}; expected {}",
            model_expectation(models)
        ),
    );
    None
}

/// A file path relative to the scenario file's directory; must exist. Returned absolute.
fn check_file(
    ctx: &mut Ctx<'_>,
    v: &Value<'_>,
    field: &str,
    s: &str,
    what: &str,
) -> Option<String> {
    let p = ctx.resolve_file(s);
    match p.canonicalize() {
        Ok(abs) if abs.is_file() => match abs.to_str() {
            Some(a) => Some(a.to_string()),
            // A non-UTF-8 path cannot be written back to TOML; keep what the user wrote.
            None => Some(s.to_string()),
        },
        Ok(_) => {
            ctx.report(
                v.span(),
                field,
                format!("{} is not a file; expected a {what}", p.display()),
            );
            None
        }
        Err(e) => {
            ctx.report(
                v.span(),
                field,
                format!(
                    "{} cannot be opened ({e}); expected an existing {what} (relative paths are \
                     relative to the scenario file's directory)",
                    p.display()
                ),
            );
            None
        }
    }
}

fn parse_cpu_list(ctx: &mut Ctx<'_>, v: &Value<'_>, field: &str) -> Option<Vec<usize>> {
    let DeValue::Array(items) = v.get_ref() else {
        ctx.wrong(v, field, "an array of CPU ids (integers >= 0), e.g. [0, 1]");
        return None;
    };
    let mut out = Vec::new();
    let mut ok = true;
    for (i, item) in items.iter().enumerate() {
        let ifield = format!("{field}[{i}]");
        match ctx.integer(item, &ifield, 0, u32::MAX as u64) {
            Some(c) => {
                let c = c as usize;
                if let Some(j) = out.iter().position(|&x| x == c) {
                    ctx.report(
                        item.span(),
                        ifield,
                        format!(
                            "found CPU {c} again (already {field}[{j}]); expected each CPU id once"
                        ),
                    );
                    ok = false;
                }
                out.push(c);
            }
            None => ok = false,
        }
    }
    ok.then_some(out)
}

fn parse_ramp(ctx: &mut Ctx<'_>, t: &Tbl<'_, '_>) -> Option<Ramp> {
    t.check_keys(ctx, RAMP_KEYS);
    let before = ctx.problems.len();
    let hz_expected = format!("a finite rate > 0 in Hz, at most {MAX_RATE_HZ:e}");
    let mut hz = |key: &str| match t.get(key) {
        None => {
            t.missing(ctx, key, &hz_expected);
            None
        }
        Some(v) => ctx.positive(v, &t.field(key), 0.0, MAX_RATE_HZ, &hz_expected),
    };
    let from_hz = hz("from_hz");
    let to_hz = hz("to_hz");
    let steps = match t.get("steps") {
        None => {
            t.missing(ctx, "steps", "an integer >= 1");
            None
        }
        Some(v) => ctx
            .integer(v, &t.field("steps"), 1, u64::from(u32::MAX))
            .map(|s| s as u32),
    };
    let step_s = match t.get("step_s") {
        None => {
            t.missing(ctx, "step_s", "a finite number of seconds > 0");
            None
        }
        Some(v) => ctx.positive(
            v,
            &t.field("step_s"),
            MIN_SECONDS,
            MAX_SECONDS,
            &seconds_expected("seconds", 1.0),
        ),
    };
    if let (Some(a), Some(b)) = (from_hz, to_hz) {
        if a > b {
            let span = t.get("to_hz").map_or(t.span.clone(), |v| v.span());
            ctx.report(
                span,
                t.field("to_hz"),
                format!("found to_hz = {b} below from_hz = {a}; expected from_hz <= to_hz (the ramp rises)"),
            );
        }
    }
    if ctx.problems.len() > before {
        return None;
    }
    Some(Ramp {
        from_hz: from_hz?,
        to_hz: to_hz?,
        steps: steps?,
        step_s: step_s?,
    })
}

fn parse_partition(
    ctx: &mut Ctx<'_>,
    t: &Tbl<'_, '_>,
    mechanism: Option<Mechanism>,
) -> Option<PartitionSpec> {
    t.check_keys(ctx, PARTITION_KEYS);
    let before = ctx.problems.len();
    let owner = |key: &str| match key {
        "sms" => Mechanism::Green,
        "mig_profile" => Mechanism::Mig,
        _ => Mechanism::Mps,
    };
    if let Some(m) = mechanism {
        let allowed: Vec<&str> = PARTITION_KEYS
            .iter()
            .copied()
            .filter(|k| owner(k) == m)
            .collect();
        let mut present: Vec<&str> = PARTITION_KEYS
            .iter()
            .copied()
            .filter(|k| t.get(k).is_some() && owner(k) != m)
            .collect();
        present.sort_by_key(|k| t.key_span(k).start);
        for key in present {
            let allowed_txt = if allowed.is_empty() {
                "no partition keys (the device is not partitioned)".to_string()
            } else {
                format!("only {}", allowed.join(", "))
            };
            ctx.report(
                t.key_span(key),
                t.field(key),
                format!(
                    "belongs to mechanism \"{}\", but device.mechanism is \"{}\"; expected {allowed_txt} here",
                    name_of(MECHANISMS, owner(key)),
                    name_of(MECHANISMS, m)
                ),
            );
        }
    }
    let sms = t
        .get("sms")
        .and_then(|v| ctx.integer(v, &t.field("sms"), 1, u64::from(u32::MAX)))
        .map(|x| x as u32);
    let thread_pct = t
        .get("thread_pct")
        .and_then(|v| ctx.integer(v, &t.field("thread_pct"), 1, 100))
        .map(|x| x as u32);
    let mem_limit_mib = t
        .get("mem_limit_mib")
        .and_then(|v| ctx.integer(v, &t.field("mem_limit_mib"), 1, i64::MAX as u64));
    let mig_profile = t.get("mig_profile").and_then(|v| {
        let expected = "a MIG profile name such as \"1g.10gb\" or \"3g.40gb\"";
        match ctx.string(v, &t.field("mig_profile"), expected) {
            Some(s) if !s.trim().is_empty() => Some(s.to_string()),
            Some(_) => {
                ctx.wrong(v, &t.field("mig_profile"), expected);
                None
            }
            None => None,
        }
    });
    if ctx.problems.len() > before {
        return None;
    }
    Some(PartitionSpec {
        sms,
        thread_pct,
        mem_limit_mib,
        mig_profile,
    })
}

// ---------------------------------------------------------------------------------------------
// Writing the resolved file. Private mirror types keep the user format (rate_hz, duration_s /
// jobs, no `length`) independent of the public types' serde representation.

#[derive(Serialize)]
struct OutScenario<'a> {
    device: OutDevice,
    timing: &'a TimingSpec,
    protection: &'a ProtectionSpec,
    workload: Vec<OutWorkload<'a>>,
}

#[derive(Serialize)]
struct OutDevice {
    backend: &'static str,
    gpu: u32,
    mechanism: &'static str,
    host: &'static str,
}

#[derive(Serialize)]
struct OutWorkload<'a> {
    name: &'a str,
    model: &'a str,
    #[serde(skip_serializing_if = "Option::is_none")]
    weights: Option<&'a str>,
    batch: u32,
    precision: &'static str,
    #[serde(skip_serializing_if = "Option::is_none")]
    rate_hz: Option<Rate>,
    #[serde(skip_serializing_if = "Option::is_none")]
    deadline_ms: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    duration_s: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    jobs: Option<u64>,
    warmup_jobs: u64,
    late: &'static str,
    cpu: &'a [usize],
    role: &'static str,
    host: &'static str,
    #[serde(skip_serializing_if = "Option::is_none")]
    ramp: Option<&'a Ramp>,
    #[serde(skip_serializing_if = "Option::is_none")]
    partition: Option<OutPartition<'a>>,
    plan_check: bool,
    criticality: &'static str,
}

#[derive(Serialize)]
struct OutPartition<'a> {
    #[serde(skip_serializing_if = "Option::is_none")]
    sms: Option<u32>,
    #[serde(skip_serializing_if = "Option::is_none")]
    thread_pct: Option<u32>,
    #[serde(skip_serializing_if = "Option::is_none")]
    mem_limit_mib: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    mig_profile: Option<&'a str>,
}

pub(super) fn to_toml(s: &Scenario) -> Result<String, SpecError> {
    let out = OutScenario {
        device: OutDevice {
            backend: name_of(BACKENDS, s.device.backend),
            gpu: s.device.gpu,
            mechanism: name_of(MECHANISMS, s.device.mechanism),
            host: name_of(HOSTS, s.device.host),
        },
        timing: &s.timing,
        protection: &s.protection,
        workload: s
            .workloads
            .iter()
            .map(|w| {
                let interferer = w.role == Role::Interferer;
                let p = &w.partition;
                OutWorkload {
                    name: &w.name,
                    model: &w.model,
                    weights: w.weights.as_deref(),
                    batch: w.batch,
                    precision: name_of(PRECISIONS, w.precision),
                    // An interferer's rate and length follow from its ramp; writing them would
                    // make the file invalid.
                    rate_hz: (!interferer).then_some(w.rate),
                    deadline_ms: w.deadline_ms,
                    duration_s: match w.length {
                        RunLength::DurationS(d) if !interferer => Some(d),
                        _ => None,
                    },
                    jobs: match w.length {
                        RunLength::Jobs(n) if !interferer => Some(n),
                        _ => None,
                    },
                    warmup_jobs: w.warmup_jobs,
                    late: name_of(LATE, w.late),
                    cpu: &w.cpu,
                    role: name_of(ROLES, w.role),
                    host: name_of(HOSTS, w.host),
                    ramp: w.ramp.as_ref(),
                    partition: (*p != PartitionSpec::default()).then_some(OutPartition {
                        sms: p.sms,
                        thread_pct: p.thread_pct,
                        mem_limit_mib: p.mem_limit_mib,
                        mig_profile: p.mig_profile.as_deref(),
                    }),
                    plan_check: w.plan_check,
                    criticality: name_of(CRITICALITIES, w.criticality),
                }
            })
            .collect(),
    };
    let body = toml::to_string(&out).map_err(|e| SpecError::Write(e.to_string()))?;
    Ok(format!(
        "# Resolved scenario written by isolane {}: every default filled in.\n\
         # A missing deadline_ms means \"the period\" (for an interferer: of the current ramp step).\n\n{body}",
        env!("CARGO_PKG_VERSION")
    ))
}
