//! Reading a scenario file: the structural walk.
//!
//! The file is parsed once into toml's spanned document (`DeTable`) and walked by hand rather
//! than through `#[derive(Deserialize)]`: serde stops at the first error and loses positions,
//! while the walk knows the span of every key and value, can name the field, and can report
//! every problem of the file at once.
//!
//! The walk only reads: it refuses what cannot become the typed [`Scenario`] (a value of the
//! wrong TOML type or outside its Rust type, a choice not among the names, an unknown key, a
//! missing required key, a key the file format does not allow beside another: an interferer's
//! `rate_hz`, `duration_s` and `jobs`, both `duration_s` and `jobs`), fills in the defaults and
//! records where each field was written ([`Spans`]). Every rule about the values themselves
//! (ranges, limits, cross-field rules, unique names, models, files) is `spec::validate`'s, which
//! runs on the typed scenario, as it does for a scenario built in code. A field the walk
//! refused holds a placeholder and is marked unread, so that no rule reports it twice.

mod program;

use std::ops::Range;
use std::path::Path;

use toml::de::{DeString, DeTable, DeValue};
use toml::Spanned;

use super::error::{Problem, SpecError};
use super::format::{
    default_host, default_mechanism, fine_piece_expected, hz_expected, max_delay_expected,
    model_expectation, phase_expected, preferred_expected, rate_expected, seconds_expected,
    stretch_expected, IntRule, BACKENDS, BATCH, BATCHING_KEYS, CALIBRATION_EXPECTED,
    CALIBRATION_METHODS, CALIBRATION_SKIPS, CPU_ID, CRITICALITIES, DEFAULT_WARMUP_JOBS,
    DEVICE_KEYS, GPU, HOSTS, JOBS, L2_PERSIST_MIB, LATE, MARGIN_US, MECHANISMS, MEM_LIMIT_MIB,
    MIG_EXPECTED, NAME_EXPECTED, PARTITION_KEYS, PIECE_US, PRECISIONS, PROTECTION_KEYS,
    QUEUE_LIMIT, RAMP_KEYS, ROLES, ROOT_KEYS, SEED, SERVE_KEYS, SMS, SPIN_US, START_DELAY_MS,
    STEPS, THREAD_PCT, TIMING_KEYS, WARMUP_JOBS, WHEN_FULL, WORKLOAD_KEYS,
};
use super::model::{is_onnx_path, ModelCatalog};
use super::spans::{describe, FieldPath, Lines, Spans};
use super::validate;
use super::{
    AdmissionMode, Backend, Batching, CalibrationMethod, CalibrationSkips, CalibrationSpec,
    Criticality, DeviceSpec, Host, LatePolicy, MaxRate, Mechanism, PartitionSpec, Precision,
    ProtectionSpec, Ramp, Rate, Role, RunLength, Scenario, ServeSpec, TimingSpec, WorkloadSpec,
};

use FieldPath::{Cpu, Length, Top, Workload};

type Value<'a> = Spanned<DeValue<'a>>;
type Key<'a> = Spanned<DeString<'a>>;

/// Parse and validate; see [`Scenario::from_toml_str`].
pub(super) fn parse(
    text: &str,
    path: &Path,
    models: &dyn ModelCatalog,
) -> Result<Scenario, SpecError> {
    let file = path.display().to_string();
    let base_dir = path.parent().map(Path::to_path_buf).unwrap_or_default();
    let lines = Lines::new(text);
    let doc = DeTable::parse(text).map_err(|e| {
        let (line, column) = e.span().map_or((1, 1), |s| lines.line_col(s.start));
        SpecError::Syntax {
            file: file.clone(),
            line,
            column,
            message: syntax_message(e.message(), e.span().and_then(|s| text.get(s))),
        }
    })?;
    let mut walk = Walk {
        lines: &lines,
        spans: Spans::of_file(&lines),
        problems: Vec::new(),
        model_expected: model_expectation(models),
    };
    let root = Tbl {
        t: doc.get_ref(),
        span: 0..0,
        kind: Kind::Root,
    };
    let mut scenario = walk.root(&root);
    let mut problems = walk.problems;
    problems.extend(validate::check(&scenario, &walk.spans, &base_dir, models));
    if problems.is_empty() {
        resolve_files(&mut scenario, &base_dir);
        resolve_gpus(&mut scenario);
        return Ok(scenario);
    }
    problems.sort_by_key(|(offset, _)| *offset);
    Err(SpecError::Invalid {
        file,
        problems: problems.into_iter().map(|(_, p)| p).collect(),
    })
}

/// toml's message on one line, naming the key where toml says only "duplicate key" (`at` is the
/// text its span covers: the key written a second time).
fn syntax_message(message: &str, at: Option<&str>) -> String {
    let message = message.trim().replace('\n', "; ");
    match at
        .map(str::trim)
        .filter(|k| !k.is_empty() && k.len() <= 200)
    {
        Some(key) if message == "duplicate key" => {
            format!("duplicate key `{key}`: a key is written once per table (remove one of them)")
        }
        _ => message,
    }
}

/// `.onnx` models and weights files as absolute paths, so the resolved scenario works from any
/// directory. Validation has found them; a path that no longer resolves, or is not UTF-8 (TOML
/// cannot hold it), stays as the user wrote it.
fn resolve_files(s: &mut Scenario, base_dir: &Path) {
    let absolute = |p: &str| {
        validate::resolve(base_dir, p)
            .canonicalize()
            .ok()
            .and_then(|a| a.to_str().map(str::to_string))
    };
    for w in &mut s.workloads {
        if w.program.is_none() && !validate::is_synthetic(&w.model) && is_onnx_path(&w.model) {
            if let Some(a) = absolute(&w.model) {
                w.model = a;
            }
        }
        if let Some(a) = w.weights.as_deref().and_then(absolute) {
            w.weights = Some(a);
        }
        if let Some(c) = w.calibration.as_mut() {
            if let Some(a) = absolute(&c.dir) {
                c.dir = a;
            }
        }
        let cwd = w.program.as_mut().and_then(|p| p.cwd.as_mut());
        if let Some(cwd) = cwd {
            if let Some(a) = absolute(cwd) {
                *cwd = a;
            }
        }
    }
}

/// Each workload's GPU, resolved: written out for every GPU workload when the device has
/// several GPUs (the first by default), left out with one GPU (validation has checked that a
/// `gpu` given there names it), so that a single-GPU scenario resolves as before.
fn resolve_gpus(s: &mut Scenario) {
    let several = s.device.several_gpus();
    for w in &mut s.workloads {
        w.gpu = match (several, w.on_gpu() && w.program.is_none()) {
            (true, true) => Some(w.gpu_on(&s.device)),
            _ => None,
        };
    }
}

/// Which table a [`Tbl`] is, to name its keys.
#[derive(Clone, Copy)]
enum Kind {
    Root,
    Named(&'static str),
    Workload(usize),
    Ramp(usize),
    Partition(usize),
    Serve(usize),
    Batching(usize),
}

/// A table with its span, for looking up keys and reporting.
struct Tbl<'a> {
    t: &'a DeTable<'a>,
    span: Range<usize>,
    kind: Kind,
}

impl Tbl<'_> {
    fn path(&self, key: &'static str) -> FieldPath {
        match self.kind {
            Kind::Root => Top("", key),
            Kind::Named(table) => Top(table, key),
            Kind::Workload(i) => Workload(i, key),
            Kind::Ramp(i) => FieldPath::Ramp(i, key),
            Kind::Partition(i) => FieldPath::Partition(i, key),
            Kind::Serve(i) => FieldPath::Serve(i, key),
            Kind::Batching(i) => FieldPath::Batching(i, key),
        }
    }

    /// The table's dotted name, empty for the root.
    fn name(&self) -> String {
        match self.kind {
            Kind::Root => String::new(),
            Kind::Named(table) => table.to_string(),
            Kind::Workload(i) => format!("workload[{i}]"),
            Kind::Ramp(i) => format!("workload[{i}].ramp"),
            Kind::Partition(i) => format!("workload[{i}].partition"),
            Kind::Serve(i) => format!("workload[{i}].serve"),
            Kind::Batching(i) => format!("workload[{i}].serve.batching"),
        }
    }

    /// The dotted name of a key of this table (any key, also one the format does not know).
    fn field(&self, key: &str) -> String {
        match self.name() {
            n if n.is_empty() => key.to_string(),
            n => format!("{n}.{key}"),
        }
    }
}

/// The walk's state: the problems it found and the sites of what it read.
struct Walk<'a> {
    lines: &'a Lines<'a>,
    spans: Spans<'a>,
    problems: Vec<(usize, Problem)>,
    /// What a model may be (it lists the catalog: built once, not per workload).
    model_expected: String,
}

/// A ramp the walk could not read, or did not (the role refuses it).
const PLACEHOLDER_RAMP: Ramp = Ramp {
    from_hz: 1.0,
    to_hz: 1.0,
    steps: 1,
    step_s: 1.0,
};

/// A workload table the walk could not read (its every field is unread).
fn placeholder_workload() -> WorkloadSpec {
    WorkloadSpec {
        name: String::new(),
        model: String::new(),
        weights: None,
        batch: 1,
        precision: Precision::Fp32,
        calibration: None,
        rate: Rate::Hz(1.0),
        deadline_ms: None,
        phase_ms: None,
        length: RunLength::Jobs(1),
        warmup_jobs: DEFAULT_WARMUP_JOBS,
        late: LatePolicy::Skip,
        cpu: Vec::new(),
        role: Role::Standalone,
        ramp: None,
        host: Host::Thread,
        partition: PartitionSpec::default(),
        plan_check: true,
        criticality: Criticality::Critical,
        stretch: None,
        backend: Backend::Cpu,
        program: None,
        gpu: None,
        serve: ServeSpec::default(),
    }
}

const CPU_DEVICE: DeviceSpec = DeviceSpec {
    backend: Backend::Cpu,
    gpu: 0,
    gpus: Vec::new(),
    mechanism: Mechanism::None,
    host: Host::Thread,
};

// ---- reporting and typed extraction: each reader reports, marks the field unread and returns
// None on a value that cannot become the field's type ----

impl<'a> Walk<'a> {
    fn report(&mut self, span: Range<usize>, field: impl Into<String>, message: impl Into<String>) {
        let (line, column) = self.lines.line_col(span.start);
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

    /// Reports at the key of a field the walk has seen.
    fn report_key(&mut self, path: FieldPath, message: &str) {
        self.report(self.spans.span(path, true), path.to_string(), message);
    }

    fn wrong(&mut self, v: &Value<'_>, path: FieldPath, expected: &str) {
        self.spans.mark_unread(path);
        self.report(
            v.span(),
            path.to_string(),
            format!("found {}; expected {expected}", describe(v.get_ref())),
        );
    }

    /// The value of `key`, its site recorded.
    fn get(&mut self, t: &Tbl<'a>, key: &'static str) -> Option<&'a Value<'a>> {
        let (k, v) = t.t.get_key_value(key)?;
        self.spans.record(t.path(key), k.span(), v);
        Some(v)
    }

    /// `key`'s value read by `read`, `default` when absent (and when unreadable: the
    /// placeholder of an unread field).
    fn read<T>(
        &mut self,
        t: &Tbl<'a>,
        key: &'static str,
        default: T,
        read: impl FnOnce(&mut Self, &'a Value<'a>, FieldPath) -> Option<T>,
    ) -> T {
        match self.get(t, key) {
            None => default,
            Some(v) => read(self, v, t.path(key)).unwrap_or(default),
        }
    }

    /// An optional key: `None` when absent, `placeholder` when unreadable.
    fn optional<T>(
        &mut self,
        t: &Tbl<'a>,
        key: &'static str,
        placeholder: T,
        read: impl FnOnce(&mut Self, &'a Value<'a>, FieldPath) -> Option<T>,
    ) -> Option<T> {
        let v = self.get(t, key)?;
        Some(read(self, v, t.path(key)).unwrap_or(placeholder))
    }

    /// A required key: reported missing (at the table) when absent.
    fn required<T>(
        &mut self,
        t: &Tbl<'a>,
        key: &'static str,
        expected: &str,
        read: impl FnOnce(&mut Self, &'a Value<'a>, FieldPath) -> Option<T>,
    ) -> Option<T> {
        match self.get(t, key) {
            None => {
                self.missing(t, key, expected);
                None
            }
            Some(v) => read(self, v, t.path(key)),
        }
    }

    /// A default that follows another field: unread when that one is.
    fn derived<T>(&mut self, path: FieldPath, from: FieldPath, value: T) -> T {
        if self.spans.unread(from) {
            self.spans.mark_unread(path);
        }
        value
    }

    fn string(&mut self, v: &'a Value<'a>, path: FieldPath, expected: &str) -> Option<&'a str> {
        match v.get_ref() {
            DeValue::String(s) => Some(s.as_ref()),
            _ => {
                self.wrong(v, path, expected);
                None
            }
        }
    }

    fn boolean(&mut self, v: &Value<'_>, path: FieldPath) -> Option<bool> {
        match v.get_ref() {
            DeValue::Boolean(b) => Some(*b),
            _ => {
                self.wrong(v, path, "true or false");
                None
            }
        }
    }

    fn choice<T: Copy>(
        &mut self,
        v: &'a Value<'a>,
        path: FieldPath,
        choices: &[(&str, T)],
    ) -> Option<T> {
        let allowed = choices
            .iter()
            .map(|(n, _)| format!("\"{n}\""))
            .collect::<Vec<_>>()
            .join(" | ");
        let expected = format!("one of {allowed}");
        let s = self.string(v, path, &expected)?;
        match choices.iter().find(|(n, _)| *n == s) {
            Some((_, t)) => Some(*t),
            None => {
                self.wrong(v, path, &expected);
                None
            }
        }
    }

    /// An integer that fits the field's type `T`; `rule` says the field's bounds (checked by
    /// validation) in the message. Floats are refused even when integral: a count written `2.0`
    /// usually means the user confused two fields.
    fn int<T: TryFrom<u64>>(&mut self, v: &Value<'_>, path: FieldPath, rule: IntRule) -> Option<T> {
        let typed = integer(v);
        if typed.is_none() {
            self.wrong(v, path, &rule.expected());
        }
        typed
    }

    /// A number (integers accepted: `rate_hz = 100`); its range is validation's.
    fn float(&mut self, v: &Value<'_>, path: FieldPath, expected: &str) -> Option<f64> {
        let x = match v.get_ref() {
            DeValue::Integer(i) => i64::from_str_radix(i.as_str(), i.radix())
                .ok()
                .map(|n| n as f64),
            DeValue::Float(f) => f.as_str().parse::<f64>().ok(),
            _ => None,
        };
        if x.is_none() {
            self.wrong(v, path, expected);
        }
        x
    }

    fn table(&mut self, v: &'a Value<'a>, path: FieldPath, kind: Kind) -> Option<Tbl<'a>> {
        match v.get_ref() {
            DeValue::Table(t) => Some(Tbl {
                t,
                span: v.span(),
                kind,
            }),
            _ => {
                self.wrong(v, path, "a table");
                None
            }
        }
    }

    fn check_keys(&mut self, t: &Tbl<'a>, allowed: &[&str]) {
        let mut unknown: Vec<&Key<'_>> =
            t.t.keys()
                .filter(|k| !allowed.contains(&k.get_ref().as_ref()))
                .collect();
        unknown.sort_by_key(|k| k.span().start);
        for k in unknown {
            let name: &str = k.get_ref().as_ref();
            let hint = closest(name, allowed)
                .map(|c| format!(" (did you mean \"{c}\"?)"))
                .unwrap_or_default();
            self.report(
                k.span(),
                t.field(name),
                format!(
                    "unknown key{hint}; allowed keys here: {}",
                    allowed.join(", ")
                ),
            );
        }
    }

    fn missing(&mut self, t: &Tbl<'a>, key: &'static str, expected: &str) {
        let where_ = match t.kind {
            Kind::Root => String::from("the file"),
            _ => format!("[{}]", t.name()),
        };
        self.spans.mark_unread(t.path(key));
        self.report(
            t.span.clone(),
            t.field(key),
            format!("missing in {where_}; expected {expected}"),
        );
    }
}

/// An integer value that fits `T` (floats refused, see [`Walk::int`]).
fn integer<T: TryFrom<u64>>(v: &Value<'_>) -> Option<T> {
    let n = match v.get_ref() {
        // i128 so that a u64 seed above i64::MAX (which toml writes) reads back.
        DeValue::Integer(i) => i128::from_str_radix(i.as_str(), i.radix()).ok(),
        _ => None,
    };
    n.and_then(|n| u64::try_from(n).ok())
        .and_then(|n| T::try_from(n).ok())
}

/// A cheap "did you mean": an allowed key at edit distance ≤ 2.
fn closest<'k>(name: &str, allowed: &[&'k str]) -> Option<&'k str> {
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

// ---- the tables of a scenario ----

impl<'a> Walk<'a> {
    fn root(&mut self, root: &Tbl<'a>) -> Scenario {
        self.check_keys(root, ROOT_KEYS);
        let device = match self.get(root, "device") {
            None => CPU_DEVICE,
            Some(v) => match self.table(v, Top("", "device"), Kind::Named("device")) {
                Some(t) => self.device(&t),
                None => {
                    for key in DEVICE_KEYS {
                        self.spans.mark_unread(Top("device", key));
                    }
                    CPU_DEVICE
                }
            },
        };
        // A timing or protection that is not a table keeps its defaults, which pass the rules.
        let timing = match self.get(root, "timing") {
            None => TimingSpec::default(),
            Some(v) => match self.table(v, Top("", "timing"), Kind::Named("timing")) {
                Some(t) => self.timing(&t),
                None => TimingSpec::default(),
            },
        };
        let protection = match self.get(root, "protection") {
            None => ProtectionSpec::default(),
            Some(v) => match self.table(v, Top("", "protection"), Kind::Named("protection")) {
                Some(t) => self.protection(&t),
                None => ProtectionSpec::default(),
            },
        };
        let workloads = self.workloads(root, &device);
        Scenario {
            device,
            timing,
            protection,
            workloads,
        }
    }

    fn device(&mut self, t: &Tbl<'a>) -> DeviceSpec {
        self.check_keys(t, DEVICE_KEYS);
        let backend = self.read(t, "backend", Backend::Cpu, |w, v, p| {
            w.choice(v, p, BACKENDS)
        });
        let (gpu, gpus) = self.device_gpus(t);
        let mechanism = match self.get(t, "mechanism") {
            Some(v) => (self.choice(v, t.path("mechanism"), MECHANISMS)).unwrap_or(Mechanism::None),
            None => self.derived(
                t.path("mechanism"),
                t.path("backend"),
                default_mechanism(backend),
            ),
        };
        let host = match self.get(t, "host") {
            Some(v) => self
                .choice(v, t.path("host"), HOSTS)
                .unwrap_or(Host::Thread),
            None => self.derived(t.path("host"), t.path("mechanism"), default_host(mechanism)),
        };
        DeviceSpec {
            backend,
            gpu,
            gpus,
            mechanism,
            host,
        }
    }

    fn timing(&mut self, t: &Tbl<'a>) -> TimingSpec {
        self.check_keys(t, TIMING_KEYS);
        let d = TimingSpec::default();
        TimingSpec {
            spin_us: self.read(t, "spin_us", d.spin_us, |w, v, p| w.int(v, p, SPIN_US)),
            start_delay_ms: self.read(t, "start_delay_ms", d.start_delay_ms, |w, v, p| {
                w.int(v, p, START_DELAY_MS)
            }),
            seed: self.read(t, "seed", d.seed, |w, v, p| w.int(v, p, SEED)),
        }
    }

    fn protection(&mut self, t: &Tbl<'a>) -> ProtectionSpec {
        self.check_keys(t, PROTECTION_KEYS);
        let d = ProtectionSpec::default();
        ProtectionSpec {
            enabled: self.read(t, "enabled", d.enabled, |w, v, p| w.boolean(v, p)),
            piece_us: self.read(t, "piece_us", d.piece_us, |w, v, p| w.int(v, p, PIECE_US)),
            margin_us: self.read(t, "margin_us", d.margin_us, |w, v, p| {
                w.int(v, p, MARGIN_US)
            }),
            stretch: self.optional(t, "stretch", 1.0, |w, v, p| {
                w.float(v, p, &stretch_expected())
            }),
            priorities: self.read(t, "priorities", d.priorities, |w, v, p| w.boolean(v, p)),
            guard: self.read(t, "guard", d.guard, |w, v, p| w.boolean(v, p)),
            admission: self.read(t, "admission", d.admission, |w, v, p| {
                w.choice(v, p, &AdmissionMode::ALL)
            }),
            l2_persist_mib: self.read(t, "l2_persist_mib", d.l2_persist_mib, |w, v, p| {
                w.int(v, p, L2_PERSIST_MIB)
            }),
            slack_order: self.read(t, "slack_order", d.slack_order, |w, v, p| w.boolean(v, p)),
            share: self.read(t, "share", d.share, |w, v, p| w.boolean(v, p)),
            // Its range depends on `piece_us`: validation's.
            fine_piece_us: self.read(t, "fine_piece_us", d.fine_piece_us, |w, v, p| {
                let n = integer(v);
                if n.is_none() {
                    w.wrong(v, p, &fine_piece_expected(None));
                }
                n
            }),
        }
    }

    fn workloads(&mut self, root: &Tbl<'a>, device: &DeviceSpec) -> Vec<WorkloadSpec> {
        let path = Top("", "workload");
        let Some(v) = self.get(root, "workload") else {
            self.spans.mark_unread(path);
            // A file of `[[app]]`s needs no workloads: its apps are isolane-app's to read.
            if root.t.get("app").is_some() {
                return Vec::new();
            }
            self.report(
                0..0,
                "workload",
                "no workloads; expected at least one [[workload]] table with name, model, rate_hz \
                 and duration_s or jobs",
            );
            return Vec::new();
        };
        // An empty array reads as no workloads, which validation refuses.
        let DeValue::Array(items) = v.get_ref() else {
            self.spans.mark_unread(path);
            self.report(
                v.span(),
                "workload",
                format!(
                    "found {}; expected an array of tables: write each workload as [[workload]], \
                     with two brackets",
                    describe(v.get_ref())
                ),
            );
            return Vec::new();
        };
        let mut out = Vec::with_capacity(items.len());
        for (i, item) in items.iter().enumerate() {
            let path = Workload(i, "");
            self.spans.record(path, item.span(), item);
            out.push(match self.table(item, path, Kind::Workload(i)) {
                Some(t) => self.workload(i, &t, device),
                None => placeholder_workload(),
            });
        }
        out
    }

    fn workload(&mut self, i: usize, t: &Tbl<'a>, device: &DeviceSpec) -> WorkloadSpec {
        self.check_keys(t, WORKLOAD_KEYS);
        if t.t.get("command").is_some() {
            return self.program_workload(i, t, device);
        }
        self.refuse_program_keys(i, t);
        let name = self.required(
            t,
            "name",
            "a name of letters, digits, '_', '.' or '-', unique in the scenario",
            |w, v, p| w.string(v, p, NAME_EXPECTED),
        );
        let role = self.read(t, "role", Role::Standalone, |w, v, p| w.choice(v, p, ROLES));
        let expected = std::mem::take(&mut self.model_expected);
        let model = self.required(t, "model", &expected, |w, v, p| w.string(v, p, &expected));
        self.model_expected = expected;
        let model = model.unwrap_or_default();
        let weights = self.weights(t, model);
        let batch = self.read(t, "batch", 1, |w, v, p| w.int(v, p, BATCH));
        let precision = self.read(t, "precision", Precision::Fp32, |w, v, p| {
            w.choice(v, p, PRECISIONS)
        });
        let calibration = self.calibration(t);
        let ramp = self.ramp(i, t, role);
        let interferer = role == Role::Interferer && !self.spans.unread(Workload(i, "role"));
        let rate = self.rate(i, t, interferer, ramp.as_ref());
        let deadline_ms = self.optional(t, "deadline_ms", 1.0, |w, v, p| {
            w.float(v, p, &seconds_expected("milliseconds", 1e3))
        });
        let phase_ms = self.optional(t, "phase_ms", 1.0, |w, v, p| {
            w.float(v, p, &phase_expected())
        });
        let length = self.length(i, t, interferer, ramp.as_ref());
        let warmup_jobs = self.read(t, "warmup_jobs", DEFAULT_WARMUP_JOBS, |w, v, p| {
            w.int(v, p, WARMUP_JOBS)
        });
        let late = self.read(t, "late", LatePolicy::Skip, |w, v, p| w.choice(v, p, LATE));
        let cpu = self.cpu_list(i, t);
        let host = match self.get(t, "host") {
            Some(v) => self.choice(v, t.path("host"), HOSTS).unwrap_or(device.host),
            None => self.derived(t.path("host"), Top("device", "host"), device.host),
        };
        let partition = self.partition(i, t);
        let plan_check = self.read(t, "plan_check", true, |w, v, p| w.boolean(v, p));
        let criticality = self.read(t, "criticality", Criticality::Critical, |w, v, p| {
            w.choice(v, p, CRITICALITIES)
        });
        let stretch = self.optional(t, "stretch", 1.0, |w, v, p| {
            w.float(v, p, &stretch_expected())
        });
        let backend = self.workload_backend(t, device);
        let gpu = self.optional(t, "gpu", device.gpu, |w, v, p| w.int(v, p, GPU));
        // Preferred sizes are told their bound only when the batch is one.
        let batch_read = (!self.spans.unread(Workload(i, "batch")))
            .then_some(batch)
            .filter(|&b| BATCH.allows(u64::from(b)));
        let serve = self.serve(i, t, batch_read, interferer);
        WorkloadSpec {
            name: name.unwrap_or_default().to_string(),
            model: model.to_string(),
            weights,
            batch,
            precision,
            calibration,
            rate,
            deadline_ms,
            phase_ms,
            length,
            warmup_jobs,
            late,
            cpu,
            role,
            ramp,
            host,
            partition,
            plan_check,
            criticality,
            stretch,
            backend,
            program: None,
            gpu,
            serve,
        }
    }

    /// `gpu` or `gpus` (not both): the first GPU, and the list when there are several (one
    /// entry reads as `gpu`, so that the resolved file of one GPU is as before).
    fn device_gpus(&mut self, t: &Tbl<'a>) -> (u32, Vec<u32>) {
        let gpu = self.read(t, "gpu", 0, |w, v, p| w.int(v, p, GPU));
        let Some(v) = self.get(t, "gpus") else {
            return (gpu, Vec::new());
        };
        let path = Top("device", "gpus");
        if t.t.get("gpu").is_some() {
            self.spans.mark_unread(path);
            self.report_key(
                path,
                "give either gpu (one GPU) or gpus (several), not both; the first of gpus is \
                 the default GPU of every workload",
            );
            return (gpu, Vec::new());
        }
        let expected = "a non-empty array of distinct GPU indices (integers >= 0), e.g. [0, 1]";
        let items = match v.get_ref() {
            DeValue::Array(items) if !items.is_empty() => items,
            _ => {
                self.wrong(v, path, expected);
                return (gpu, Vec::new());
            }
        };
        let mut gpus = Vec::with_capacity(items.len());
        for item in items.iter() {
            match self.int::<u32>(item, path, GPU) {
                Some(g) => gpus.push(g),
                None => return (gpu, Vec::new()),
            }
        }
        match gpus.len() {
            1 => (gpus[0], Vec::new()),
            _ => (gpus[0], gpus),
        }
    }

    /// `backend`: the device's unless the workload names its own.
    fn workload_backend(&mut self, t: &Tbl<'a>, device: &DeviceSpec) -> Backend {
        match self.get(t, "backend") {
            Some(v) => self
                .choice(v, t.path("backend"), BACKENDS)
                .unwrap_or(device.backend),
            None => self.derived(t.path("backend"), Top("device", "backend"), device.backend),
        }
    }

    /// A synthetic model has no weights: the key is left unread, for validation to refuse.
    fn weights(&mut self, t: &Tbl<'a>, model: &str) -> Option<String> {
        let v = self.get(t, "weights")?;
        let path = t.path("weights");
        if validate::is_synthetic(model) {
            self.spans.mark_unread(path);
            return Some(String::new());
        }
        let s = self.string(v, path, "a path to a .safetensors file");
        Some(s.unwrap_or_default().to_string())
    }

    /// `calibration`, `calibration_method` and `calibration_skips`, read whatever the
    /// precision (validation says where they do not belong); a method or skips without a
    /// folder keep the folder empty.
    fn calibration(&mut self, t: &Tbl<'a>) -> Option<CalibrationSpec> {
        let dir = self.optional(t, "calibration", String::new(), |w, v, p| {
            w.string(v, p, CALIBRATION_EXPECTED).map(str::to_string)
        });
        let method = self.optional(
            t,
            "calibration_method",
            CalibrationMethod::Percentile,
            |w, v, p| w.choice(v, p, CALIBRATION_METHODS),
        );
        let skips = self.optional(
            t,
            "calibration_skips",
            CalibrationSkips::Quantized,
            |w, v, p| w.choice(v, p, CALIBRATION_SKIPS),
        );
        if dir.is_none() && method.is_none() && skips.is_none() {
            return None;
        }
        Some(CalibrationSpec {
            dir: dir.unwrap_or_default(),
            method: method.unwrap_or(CalibrationMethod::Percentile),
            skips: skips.unwrap_or_default(),
        })
    }

    /// Only an interferer ramps: another role's ramp is left unread, for validation to refuse.
    fn ramp(&mut self, i: usize, t: &Tbl<'a>, role: Role) -> Option<Ramp> {
        let v = self.get(t, "ramp")?;
        let path = t.path("ramp");
        if role != Role::Interferer && !self.spans.unread(Workload(i, "role")) {
            self.spans.mark_unread(path);
            return Some(PLACEHOLDER_RAMP);
        }
        let Some(rt) = self.table(v, path, Kind::Ramp(i)) else {
            return Some(PLACEHOLDER_RAMP);
        };
        self.check_keys(&rt, RAMP_KEYS);
        let hz = hz_expected();
        let rate = |w: &mut Self, key: &'static str| {
            w.required(&rt, key, &hz, |w, v, p| w.float(v, p, &hz))
                .unwrap_or(1.0)
        };
        let from_hz = rate(self, "from_hz");
        let to_hz = rate(self, "to_hz");
        let steps = self.required(&rt, "steps", "an integer >= 1", |w, v, p| {
            w.int(v, p, STEPS)
        });
        let step_s = self.required(
            &rt,
            "step_s",
            "a finite number of seconds > 0",
            |w, v, p| w.float(v, p, &seconds_expected("seconds", 1.0)),
        );
        Some(Ramp {
            from_hz,
            to_hz,
            steps: steps.unwrap_or(1),
            step_s: step_s.unwrap_or(1.0),
        })
    }

    /// `rate_hz`: a number or "max"; an interferer's comes from its ramp and the key is refused.
    fn rate(&mut self, i: usize, t: &Tbl<'a>, interferer: bool, ramp: Option<&Ramp>) -> Rate {
        let path = Workload(i, "rate_hz");
        let unknown = Rate::Hz(1.0);
        let value = self.get(t, "rate_hz");
        let rate = match value {
            Some(_) if interferer => {
                let why = "not allowed with role \"interferer\"; its rates come from ramp \
                           (from_hz .. to_hz)";
                self.report_key(path, why);
                None
            }
            None if interferer => ramp.map(|r| Rate::Hz(r.from_hz)),
            None => {
                self.missing(t, "rate_hz", &rate_expected());
                None
            }
            Some(v) => match v.get_ref() {
                DeValue::String(s) if s.as_ref() == "max" => Some(Rate::Max(MaxRate::Max)),
                _ => self.float(v, path, &rate_expected()).map(Rate::Hz),
            },
        };
        rate.unwrap_or_else(|| {
            self.spans.mark_unread(path);
            unknown
        })
    }

    /// Exactly one of `duration_s` and `jobs`; an interferer's length is its ramp's and both
    /// keys are refused.
    fn length(
        &mut self,
        i: usize,
        t: &Tbl<'a>,
        interferer: bool,
        ramp: Option<&Ramp>,
    ) -> RunLength {
        let d = self.get(t, "duration_s");
        let j = self.get(t, "jobs");
        let length = match (d, j) {
            (d, j) if interferer => {
                if d.is_some() || j.is_some() {
                    let key = if d.is_some() { "duration_s" } else { "jobs" };
                    self.report_key(
                        Workload(i, key),
                        "not allowed with role \"interferer\"; its length is the ramp's steps × \
                         step_s",
                    );
                    None
                } else {
                    ramp.map(|r| RunLength::DurationS(r.total_duration_s()))
                }
            }
            (Some(_), Some(_)) => {
                // Point at whichever of the two comes second: that is the one to delete.
                let (ds, js) = (Workload(i, "duration_s"), Workload(i, "jobs"));
                let later = if self.spans.span(js, true).start > self.spans.span(ds, true).start {
                    js
                } else {
                    ds
                };
                self.report_key(
                    later,
                    "found both duration_s and jobs; expected exactly one of them",
                );
                None
            }
            (None, None) => {
                self.missing(
                    t,
                    "duration_s",
                    "exactly one of duration_s (seconds > 0) or jobs (an integer >= 1)",
                );
                None
            }
            (Some(v), None) => {
                let expected = seconds_expected("seconds", 1.0);
                let x = self.float(v, Workload(i, "duration_s"), &expected);
                x.map(RunLength::DurationS)
            }
            (None, Some(v)) => self.int(v, Workload(i, "jobs"), JOBS).map(RunLength::Jobs),
        };
        length.unwrap_or_else(|| {
            self.spans.mark_unread(Length(i));
            RunLength::Jobs(1)
        })
    }

    fn cpu_list(&mut self, i: usize, t: &Tbl<'a>) -> Vec<usize> {
        let Some(v) = self.get(t, "cpu") else {
            return Vec::new();
        };
        let DeValue::Array(items) = v.get_ref() else {
            let expected = "an array of CPU ids (integers >= 0), e.g. [0, 1]";
            self.wrong(v, t.path("cpu"), expected);
            return Vec::new();
        };
        let mut out = Vec::with_capacity(items.len());
        for (j, item) in items.iter().enumerate() {
            self.spans.record(Cpu(i, j), item.span(), item);
            let id: Option<u32> = self.int(item, Cpu(i, j), CPU_ID);
            // An unread id holds a placeholder that validation skips.
            out.push(id.map_or(usize::MAX, |c| c as usize));
        }
        out
    }

    /// `[workload.serve]`, for a workload of `batch` rows (`None`: the walk refused its batch).
    /// A command workload or an interferer serves no requests (`refused`): its table is left
    /// unread, for validation to refuse by name.
    pub(super) fn serve(
        &mut self,
        i: usize,
        t: &Tbl<'a>,
        batch: Option<u32>,
        refused: bool,
    ) -> ServeSpec {
        let d = ServeSpec::default();
        let Some(v) = self.get(t, "serve") else {
            return d;
        };
        let path = t.path("serve");
        if refused {
            self.spans.mark_unread(path);
            return d;
        }
        let Some(st) = self.table(v, path, Kind::Serve(i)) else {
            return d;
        };
        self.check_keys(&st, SERVE_KEYS);
        ServeSpec {
            queue_limit: self.read(&st, "queue_limit", d.queue_limit, |w, v, p| {
                w.int(v, p, QUEUE_LIMIT)
            }),
            when_full: self.read(&st, "when_full", d.when_full, |w, v, p| {
                w.choice(v, p, WHEN_FULL)
            }),
            batching: self.batching(i, &st, batch),
        }
    }

    /// `[workload.serve.batching]`: written at all, it batches (an empty table: what is
    /// queued, no delay), whatever the criticality's default.
    fn batching(&mut self, i: usize, st: &Tbl<'a>, batch: Option<u32>) -> Option<Batching> {
        let v = self.get(st, "batching")?;
        let Some(bt) = self.table(v, st.path("batching"), Kind::Batching(i)) else {
            return Some(Batching::default());
        };
        self.check_keys(&bt, BATCHING_KEYS);
        let max_delay_ms = self.read(&bt, "max_delay_ms", 0.0, |w, v, p| {
            w.float(v, p, &max_delay_expected())
        });
        Some(Batching {
            max_delay_ms,
            preferred: self.preferred(i, &bt, batch),
        })
    }

    fn preferred(&mut self, i: usize, bt: &Tbl<'a>, batch: Option<u32>) -> Vec<u32> {
        let Some(v) = self.get(bt, "preferred") else {
            return Vec::new();
        };
        let DeValue::Array(items) = v.get_ref() else {
            self.wrong(v, bt.path("preferred"), &preferred_expected(batch));
            return Vec::new();
        };
        let mut out = Vec::with_capacity(items.len());
        for (j, item) in items.iter().enumerate() {
            let path = FieldPath::Preferred(i, j);
            self.spans.record(path, item.span(), item);
            let size = integer::<u32>(item);
            if size.is_none() {
                self.wrong(item, path, &preferred_expected(batch));
            }
            // An unread size holds a placeholder that validation skips.
            out.push(size.unwrap_or(0));
        }
        out
    }

    fn partition(&mut self, i: usize, t: &Tbl<'a>) -> PartitionSpec {
        let Some(v) = self.get(t, "partition") else {
            return PartitionSpec::default();
        };
        let Some(pt) = self.table(v, t.path("partition"), Kind::Partition(i)) else {
            return PartitionSpec::default();
        };
        self.check_keys(&pt, PARTITION_KEYS);
        // An unreadable key keeps a placeholder value: whether it may be there at all is still
        // validation's to say.
        PartitionSpec {
            sms: self.optional(&pt, "sms", 1, |w, v, p| w.int(v, p, SMS)),
            thread_pct: self.optional(&pt, "thread_pct", 1, |w, v, p| w.int(v, p, THREAD_PCT)),
            mem_limit_mib: self.optional(&pt, "mem_limit_mib", 1, |w, v, p| {
                w.int(v, p, MEM_LIMIT_MIB)
            }),
            mig_profile: self.optional(&pt, "mig_profile", String::new(), |w, v, p| {
                w.string(v, p, MIG_EXPECTED).map(str::to_string)
            }),
        }
    }
}
