//! The rules of a scenario, checked on the typed [`Scenario`]: ranges and limits, cross-field
//! rules (mechanism and backend, host and mechanism, role and ramp, partition keys and
//! mechanism, job counts), unique names, model names against the catalog, files that must
//! exist. The same rules check a file (after `spec::parse` has read it, with its spans) and a
//! scenario built in code (without spans): problems name fields by [`FieldPath`], and only a
//! file turns them into file:line:column.
//!
//! A rule skips what the walk could not read ([`Spans::unread`]; it reported it already), and a
//! cross-field rule runs only when the fields it relates passed their own rules, as one problem
//! should be reported once, where it is.

mod program;

use std::collections::HashMap;
use std::path::Path;

use super::error::Problem;
use super::format::{
    default_host, fine_piece_expected, hz_expected, max_delay_expected, model_expectation, name_of,
    phase_expected, preferred_expected, rate_expected, seconds_expected, stretch_expected, IntRule,
    BATCH, CALIBRATION_EXPECTED, JOBS, L2_PERSIST_MIB, MARGIN_US, MECHANISMS, MEM_LIMIT_MIB,
    MIG_EXPECTED, NAME_EXPECTED, PARTITION_KEYS, PIECE_US, PRECISIONS, QUEUE_LIMIT, RAMP_EXPECTED,
    ROLES, SMS, SPIN_US, START_DELAY_MS, STEPS, THREAD_PCT, WARMUP_JOBS,
};
use super::kernel::KernelModel;
use super::limits::{
    MAX_BATCH_DELAY_MS, MAX_JOBS, MAX_RATE_HZ, MAX_SECONDS, MAX_STRETCH, MIN_PIECE_US, MIN_SECONDS,
};
use super::model::{is_onnx_path, ModelCatalog, SpinModel, SPIN_SYNTAX};

/// Synthetic models (`spin:`, `kernel:`) have no weights.
pub(super) fn is_synthetic(model: &str) -> bool {
    model.starts_with("spin:") || model.starts_with("kernel:")
}
use super::spans::{FieldPath, Spans};
use super::{
    Backend, Batching, CalibrationMethod, DeviceSpec, Host, Mechanism, PartitionSpec, Precision,
    ProtectionSpec, Ramp, Rate, Role, RunLength, Scenario, ServeSpec, TimingSpec, WorkloadSpec,
};

use FieldPath::{Cpu, Partition, Top, Workload};

/// Every problem of `s`, each with the byte offset it sorts by (0 without a file). `base_dir`
/// resolves relative `.onnx` and weights paths (the scenario file's directory).
pub(super) fn check(
    s: &Scenario,
    spans: &Spans<'_>,
    base_dir: &Path,
    models: &dyn ModelCatalog,
) -> Vec<(usize, Problem)> {
    let mut c = Checker {
        spans,
        base_dir,
        models,
        problems: Vec::new(),
    };
    let device_ok = c.device(&s.device);
    c.timing(&s.timing);
    c.protection(&s.protection);
    if s.workloads.is_empty() && !spans.unread(Top("", "workload")) {
        c.report(
            Top("", "workload"),
            false,
            "no workloads; expected at least one [[workload]] table".to_string(),
        );
    }
    c.unique_names(&s.workloads);
    let device = device_ok.then_some(&s.device);
    for (i, w) in s.workloads.iter().enumerate() {
        if !spans.unread(Workload(i, "")) {
            c.workload(i, w, device);
        }
    }
    c.problems
}

/// The name a workload becomes a file by.
fn valid_name(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= 64
        && s.chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '.' | '-'))
        && !s.chars().all(|c| c == '.')
}

/// A float as a scenario file writes it (toml's writer), for problems of a scenario built in
/// code, which has no text to quote.
fn float_text(x: f64) -> String {
    if x.is_nan() {
        if x.is_sign_negative() { "-nan" } else { "nan" }.to_string()
    } else if x == 0.0 {
        if x.is_sign_negative() { "-0.0" } else { "0.0" }.to_string()
    } else if x % 1.0 == 0.0 {
        format!("{x}.0")
    } else {
        format!("{x}")
    }
}

struct Checker<'s, 'a> {
    spans: &'s Spans<'a>,
    base_dir: &'s Path,
    models: &'s dyn ModelCatalog,
    problems: Vec<(usize, Problem)>,
}

impl Checker<'_, '_> {
    /// Reports at the field's value, or at its key when `at_key`.
    fn report(&mut self, path: FieldPath, at_key: bool, message: String) {
        let offset = self.spans.span(path, at_key).start;
        self.push(offset, path, message);
    }

    fn push(&mut self, offset: usize, path: FieldPath, message: String) {
        let (line, column) = self.spans.line_col(offset).unwrap_or((0, 0));
        self.problems.push((
            offset,
            Problem {
                line,
                column,
                field: path.to_string(),
                message,
            },
        ));
    }

    /// "found <what the file wrote, else `typed`>; expected <expected>", at the value.
    fn wrong(&mut self, path: FieldPath, typed: impl FnOnce() -> String, expected: &str) {
        let found = self.spans.found(path).unwrap_or_else(typed);
        self.report(path, false, format!("found {found}; expected {expected}"));
    }

    /// Whether `n` is within `rule` (false, reported, when not; false when unread).
    fn int(&mut self, path: FieldPath, n: u64, rule: IntRule) -> bool {
        if self.spans.unread(path) {
            return false;
        }
        if !rule.allows(n) {
            self.wrong(path, || format!("integer {n}"), &rule.expected());
            return false;
        }
        true
    }

    /// Whether `x` is finite, > 0 and within `min..=max` (false, reported, when not; false when
    /// unread).
    fn positive(&mut self, path: FieldPath, x: f64, min: f64, max: f64, expected: &str) -> bool {
        if self.spans.unread(path) {
            return false;
        }
        if !(x.is_finite() && x > 0.0 && x >= min && x <= max) {
            self.wrong(path, || format!("float {}", float_text(x)), expected);
            return false;
        }
        true
    }

    /// A workload's phase: 0 or more milliseconds, at most the longest run.
    fn phase(&mut self, i: usize, w: &WorkloadSpec) {
        let Some(x) = w.phase_ms else { return };
        let path = Workload(i, "phase_ms");
        // contains() is false for NaN, and the infinities are out of the range.
        let in_range = (0.0..=MAX_SECONDS * 1e3).contains(&x);
        if !in_range && !self.spans.unread(path) {
            self.wrong(
                path,
                || format!("float {}", float_text(x)),
                &phase_expected(),
            );
        }
    }

    fn seconds(&mut self, path: FieldPath, x: f64) -> bool {
        let expected = seconds_expected("seconds", 1.0);
        self.positive(path, x, MIN_SECONDS, MAX_SECONDS, &expected)
    }

    fn unread_any(&self, paths: &[FieldPath]) -> bool {
        paths.iter().any(|&p| self.spans.unread(p))
    }

    /// Whether the device passed every rule; the workloads' device rules need it to.
    fn device(&mut self, d: &DeviceSpec) -> bool {
        let before = self.problems.len();
        let [backend, gpu, mechanism, host] =
            ["backend", "gpu", "mechanism", "host"].map(|k| Top("device", k));
        if !self.unread_any(&[backend, mechanism]) {
            self.mechanism_fits_backend(d.backend, d.mechanism);
        }
        if !self.unread_any(&[mechanism, host]) {
            self.host_fits_mechanism(host, d.host, d.mechanism);
        }
        let gpus = Top("device", "gpus");
        if !self.spans.unread(gpus) {
            self.gpu_list(d);
        }
        self.problems.len() == before && !self.unread_any(&[backend, gpu, gpus, mechanism, host])
    }

    /// `gpus`: distinct indices, the first of them `gpu` (the walk sets it so; a scenario built
    /// in code must too, since `gpu` is every workload's default).
    fn gpu_list(&mut self, d: &DeviceSpec) {
        let path = Top("device", "gpus");
        let mut seen = std::collections::BTreeSet::new();
        if let Some(dup) = d.gpus.iter().find(|g| !seen.insert(**g)) {
            self.report(
                path,
                false,
                format!(
                    "found GPU {dup} twice in {:?}; expected distinct GPU indices, e.g. [0, 1]",
                    d.gpus
                ),
            );
        }
        if d.gpus.first().is_some_and(|&g| g != d.gpu) {
            self.report(
                path,
                false,
                format!(
                    "gpus starts with {} but gpu is {}; expected gpu to be the first of gpus",
                    d.gpus[0], d.gpu
                ),
            );
        }
    }

    /// A workload's `gpu`: only on a model workload on the GPU, and one of the device's GPUs.
    fn workload_gpu(&mut self, i: usize, w: &WorkloadSpec, device: Option<&DeviceSpec>) {
        let path = Workload(i, "gpu");
        let Some(g) = w.gpu else { return };
        if self.spans.unread(path) {
            return;
        }
        if w.program.is_some() {
            let message = "not allowed on a command workload: a program runs on the device's \
                           first GPU (its partition's environment names it)";
            self.report(path, true, message.to_string());
            return;
        }
        if self.spans.unread(Workload(i, "backend")) {
            return;
        }
        if !w.on_gpu() {
            self.report(
                path,
                true,
                "not allowed with backend \"cpu\": a workload on the CPU takes no GPU; remove \
                 it, or set backend = \"cuda\""
                    .to_string(),
            );
            return;
        }
        let Some(d) = device else { return };
        let allowed = d.all_gpus();
        if !allowed.contains(&g) {
            let list = allowed.iter().map(u32::to_string).collect::<Vec<_>>();
            self.report(
                path,
                false,
                format!(
                    "found GPU {g}; expected one of the device's GPUs: {} (device.gpu or \
                     device.gpus)",
                    list.join(" | ")
                ),
            );
        }
    }

    fn mechanism_fits_backend(&mut self, b: Backend, m: Mechanism) {
        let path = Top("device", "mechanism");
        match (b, m) {
            (Backend::Cpu, m) if m != Mechanism::None => self.report(
                path,
                false,
                format!(
                    "found \"{}\" with backend \"cpu\"; expected \"none\": the CPU is not \
                     partitioned (timeslice, mps, mig and green need backend = \"cuda\")",
                    name_of(MECHANISMS, m)
                ),
            ),
            (Backend::Cuda, Mechanism::None) => self.report(
                path,
                false,
                "found \"none\" with backend \"cuda\"; expected one of \"timeslice\" | \"mps\" | \
                 \"mig\" | \"green\" (\"none\" is for the cpu backend)"
                    .to_string(),
            ),
            _ => {}
        }
    }

    fn host_fits_mechanism(&mut self, path: FieldPath, host: Host, m: Mechanism) {
        if host == Host::Thread && default_host(m) == Host::Process {
            let why = match m {
                Mechanism::Mps => "each MPS client is its own process",
                Mechanism::Mig => "each MIG instance is bound to its own worker process",
                _ => "timeslice shares the GPU between separate processes",
            };
            self.report(
                path,
                false,
                format!(
                    "found \"thread\" with mechanism \"{}\"; expected \"process\" ({why})",
                    name_of(MECHANISMS, m)
                ),
            );
        }
    }

    fn timing(&mut self, t: &TimingSpec) {
        self.int(Top("timing", "spin_us"), t.spin_us, SPIN_US);
        self.int(
            Top("timing", "start_delay_ms"),
            t.start_delay_ms,
            START_DELAY_MS,
        );
        // The seed may be any u64.
    }

    fn protection(&mut self, p: &ProtectionSpec) {
        let piece_ok = self.int(Top("protection", "piece_us"), p.piece_us, PIECE_US);
        let fine = Top("protection", "fine_piece_us");
        let n = p.fine_piece_us;
        // 0 is off; otherwise no shorter than a launch and its wait are worth, and no longer
        // than a run may be (`piece_us`), which is not known when `piece_us` broke its own rule.
        let most = if piece_ok { p.piece_us } else { u64::MAX };
        if n != 0 && !(MIN_PIECE_US..=most).contains(&n) && !self.spans.unread(fine) {
            let expected = fine_piece_expected(piece_ok.then_some(p.piece_us));
            self.wrong(fine, || format!("integer {n}"), &expected);
        }
        self.int(Top("protection", "margin_us"), p.margin_us, MARGIN_US);
        self.int(
            Top("protection", "l2_persist_mib"),
            p.l2_persist_mib,
            L2_PERSIST_MIB,
        );
        if let Some(s) = p.stretch {
            let expected = stretch_expected();
            self.positive(Top("protection", "stretch"), s, 1.0, MAX_STRETCH, &expected);
        }
    }

    /// Names become file names: each once. Linear: one map of the names seen.
    fn unique_names(&mut self, ws: &[WorkloadSpec]) {
        let mut seen: HashMap<&str, usize> = HashMap::with_capacity(ws.len());
        for (i, w) in ws.iter().enumerate() {
            let path = Workload(i, "name");
            if self.unread_any(&[Workload(i, ""), path]) {
                continue;
            }
            let Some(&j) = seen.get(w.name.as_str()) else {
                seen.insert(&w.name, i);
                continue;
            };
            let line = self
                .spans
                .line_of(Workload(j, "name"))
                .map(|l| format!(" (line {l})"))
                .unwrap_or_default();
            self.report(
                path,
                false,
                format!(
                    "found {:?}, already the name of workload[{j}]{line}; expected a name unique \
                     in the scenario",
                    w.name
                ),
            );
        }
    }

    fn workload(&mut self, i: usize, w: &WorkloadSpec, device: Option<&DeviceSpec>) {
        if !self.spans.unread(Workload(i, "name")) && !valid_name(&w.name) {
            self.wrong(
                Workload(i, "name"),
                || format!("string {:?}", w.name),
                NAME_EXPECTED,
            );
        }
        self.workload_gpu(i, w, device);
        self.serve(i, w);
        if let Some(p) = &w.program {
            self.program(i, w, p, device);
            return;
        }
        self.model_and_weights(i, w);
        self.calibration(i, w);
        self.int(Workload(i, "batch"), u64::from(w.batch), BATCH);
        let backend_ok = device.is_some() && !self.spans.unread(Workload(i, "backend"));
        if backend_ok {
            self.precision_fits_backend(i, w.precision, w.backend);
        }
        self.rate_length_and_ramp(i, w);
        self.int(Workload(i, "warmup_jobs"), w.warmup_jobs, WARMUP_JOBS);
        self.cpus_once(i, &w.cpu);
        if let (Some(d), true) = (device, backend_ok) {
            // A CPU workload is never a GPU client: any host will do.
            if !self.spans.unread(Workload(i, "host")) && w.on_gpu() {
                self.host_fits_mechanism(Workload(i, "host"), w.host, d.mechanism);
            }
        }
        self.backend_and_partition(i, w, device);
        self.workload_stretch(i, w);
    }

    /// A workload's own stretch: in range, and only where the guard charges it (critical work).
    fn workload_stretch(&mut self, i: usize, w: &WorkloadSpec) {
        let Some(s) = w.stretch else { return };
        let path = Workload(i, "stretch");
        if !self.positive(path, s, 1.0, MAX_STRETCH, &stretch_expected()) {
            return;
        }
        if w.criticality == crate::spec::Criticality::BestEffort
            && !self.spans.unread(Workload(i, "criticality"))
        {
            self.report(
                path,
                true,
                "is for critical workloads (how much best effort slows this one down); this \
                 workload is best_effort: remove stretch, or make it critical"
                    .to_string(),
            );
        }
    }

    /// `[workload.serve]`: only where `isolane serve` has requests to queue (a model workload
    /// that is not an interferer), within its bounds.
    fn serve(&mut self, i: usize, w: &WorkloadSpec) {
        let path = Workload(i, "serve");
        if w.serve == ServeSpec::default() && !self.spans.written(path) {
            return;
        }
        let refusal = if w.program.is_some() {
            Some(
                "not allowed on a command workload: `isolane serve` serves models, and a program \
                 has no requests to queue or batch; remove it",
            )
        } else if w.role == Role::Interferer && !self.spans.unread(Workload(i, "role")) {
            Some(
                "not allowed with role \"interferer\": an interferer's load is its ramp, not \
                 requests to queue or batch; remove it, or set role = \"standalone\"",
            )
        } else {
            None
        };
        if let Some(why) = refusal {
            self.report(path, true, why.to_string());
            return;
        }
        if self.spans.unread(path) {
            return;
        }
        let queue_limit = u64::from(w.serve.queue_limit);
        self.int(FieldPath::Serve(i, "queue_limit"), queue_limit, QUEUE_LIMIT);
        if let Some(b) = &w.serve.batching {
            if !self.spans.unread(FieldPath::Serve(i, "batching")) {
                self.batching(i, w, b);
            }
        }
    }

    /// A batch's delay within its bounds, and preferred sizes that a job of the workload's
    /// `batch` rows can hold, each once, in order.
    fn batching(&mut self, i: usize, w: &WorkloadSpec, b: &Batching) {
        let path = FieldPath::Batching(i, "max_delay_ms");
        // contains() is false for NaN, and the infinities are out of the range.
        let in_range = (0.0..=MAX_BATCH_DELAY_MS).contains(&b.max_delay_ms);
        if !in_range && !self.spans.unread(path) {
            let x = b.max_delay_ms;
            self.wrong(
                path,
                || format!("float {}", float_text(x)),
                &max_delay_expected(),
            );
        }
        // The bound is the batch only once the batch passed its own rules.
        let batch = (!self.spans.unread(Workload(i, "batch")) && BATCH.allows(u64::from(w.batch)))
            .then_some(w.batch);
        let expected = preferred_expected(batch);
        let mut last: Option<(usize, u32)> = None;
        for (j, &n) in b.preferred.iter().enumerate() {
            let path = FieldPath::Preferred(i, j);
            if self.spans.unread(path) {
                continue;
            }
            if n == 0 || batch.is_some_and(|b| n > b) {
                self.wrong(path, || format!("integer {n}"), &expected);
                continue;
            }
            if let Some((k, m)) = last.filter(|&(_, m)| n <= m) {
                self.report(
                    path,
                    false,
                    format!(
                        "found {n} after preferred[{k}] = {m}; expected strictly increasing \
                         batch sizes (each once, smallest first), e.g. [4, 8]"
                    ),
                );
            }
            last = Some((j, n));
        }
    }

    /// A workload's own backend against the device's, then its partition keys: a CPU workload
    /// has none, a GPU workload those of the device's mechanism.
    fn backend_and_partition(&mut self, i: usize, w: &WorkloadSpec, device: Option<&DeviceSpec>) {
        let backend_read = !self.spans.unread(Workload(i, "backend"));
        if let (Some(d), true) = (device, backend_read) {
            if w.backend == Backend::Cuda && d.backend == Backend::Cpu {
                self.report(
                    Workload(i, "backend"),
                    false,
                    "found \"cuda\" with device.backend \"cpu\"; expected \"cpu\" (a workload \
                     runs on the GPU only in a scenario whose [device] has backend = \"cuda\" \
                     and a mechanism to share it)"
                        .to_string(),
                );
                return;
            }
        }
        if self.spans.unread(Workload(i, "partition")) {
            return;
        }
        let mechanism = device.filter(|_| backend_read).map(|d| d.mechanism);
        if w.backend == Backend::Cpu && mechanism.is_some_and(|m| m != Mechanism::None) {
            self.cpu_without_partition(i, &w.partition);
            return;
        }
        self.partition(i, &w.partition, mechanism);
    }

    /// A CPU workload of a GPU scenario gets no GPU partition: every key of one is refused.
    fn cpu_without_partition(&mut self, i: usize, p: &PartitionSpec) {
        let present = [
            p.sms.is_some(),
            p.thread_pct.is_some(),
            p.mem_limit_mib.is_some(),
            p.mig_profile.is_some(),
        ];
        for (key, _) in PARTITION_KEYS.iter().zip(present).filter(|(_, on)| *on) {
            self.report(
                Partition(i, key),
                true,
                "not allowed with backend \"cpu\": a workload on the CPU gets no GPU \
                 partition; remove it, or set backend = \"cuda\" (pin it to cores with cpu = \
                 [...])"
                    .to_string(),
            );
        }
    }

    fn precision_fits_backend(&mut self, i: usize, p: Precision, b: Backend) {
        let path = Workload(i, "precision");
        let cpu_runs = matches!(p, Precision::Fp32 | Precision::Int8 | Precision::Fp8);
        if b == Backend::Cpu && !cpu_runs && !self.spans.unread(path) {
            self.report(
                path,
                false,
                format!(
                    "found \"{}\" with backend \"cpu\"; expected \"fp32\", \"int8\" or \"fp8\" \
                     (tf32, fp16 and bf16 need backend = \"cuda\")",
                    name_of(PRECISIONS, p)
                ),
            );
        }
    }

    /// `precision = "int8"` / `"fp8"` quantizes a model's graph from a calibration folder:
    /// the folder is required there; it, the method and the skips are refused elsewhere
    /// (nothing is calibrated); entropy calibration is int8's.
    fn calibration(&mut self, i: usize, w: &WorkloadSpec) {
        let precision = Workload(i, "precision");
        let (dir_path, method_path, skips_path) = (
            Workload(i, "calibration"),
            Workload(i, "calibration_method"),
            Workload(i, "calibration_skips"),
        );
        if self.spans.unread(precision) {
            return;
        }
        let name = name_of(PRECISIONS, w.precision);
        if !w.precision.quantized() {
            for (path, key) in [
                (dir_path, "calibration"),
                (method_path, "calibration_method"),
                (skips_path, "calibration_skips"),
            ] {
                if self.spans.written(path) {
                    self.report(
                        path,
                        true,
                        format!(
                            "only with precision = \"int8\" or \"fp8\" (it calibrates the \
                             quantized model); this workload's precision is \"{name}\": remove \
                             {key}, or set precision = \"int8\""
                        ),
                    );
                }
            }
            return;
        }
        if is_synthetic(&w.model) {
            self.report(
                precision,
                false,
                format!(
                    "found \"{name}\" with a spin: or kernel: model (nothing to quantize); \
                     expected one of \"fp32\" | \"tf32\" | \"fp16\" | \"bf16\", or a built-in \
                     or .onnx model"
                ),
            );
            return;
        }
        let dir = w.calibration.as_ref().map(|c| c.dir.as_str()).unwrap_or("");
        if dir.is_empty() {
            if !self.spans.unread(dir_path) {
                self.report_missing(
                    Workload(i, ""),
                    dir_path,
                    &format!(
                        "{CALIBRATION_EXPECTED}: precision = \"{name}\" quantizes the model from it"
                    ),
                );
            }
        } else if !self.spans.unread(dir_path) {
            let p = resolve(self.base_dir, dir);
            if !p.is_dir() {
                self.report(
                    dir_path,
                    false,
                    format!(
                        "{} is not a folder (relative paths are relative to the scenario \
                         file's directory); expected {CALIBRATION_EXPECTED}",
                        p.display()
                    ),
                );
            }
        }
        let entropy = w
            .calibration
            .as_ref()
            .is_some_and(|c| c.method == CalibrationMethod::Entropy);
        if entropy && w.precision == Precision::Fp8 && !self.spans.unread(method_path) {
            self.report(
                method_path,
                false,
                "found \"entropy\" with precision \"fp8\"; expected \"percentile\" | \"minmax\" \
                 (entropy calibration models int8's uniform grid)"
                    .to_string(),
            );
        }
    }

    fn model_and_weights(&mut self, i: usize, w: &WorkloadSpec) {
        if !self.spans.unread(Workload(i, "model")) {
            self.model(Workload(i, "model"), &w.model);
        }
        let path = Workload(i, "weights");
        let Some(weights) = &w.weights else {
            return;
        };
        if is_synthetic(&w.model) {
            self.report(
                path,
                true,
                "not allowed with a spin: or kernel: model (it has no weights); remove it, or \
                 use a built-in model"
                    .to_string(),
            );
        } else if is_onnx_path(&w.model) {
            // The file's own weights are what runs: a weights file beside it would be ignored.
            let what = if w.model.to_ascii_lowercase().ends_with(".isoplan") {
                "a saved plan (.isoplan)"
            } else {
                "an .onnx model"
            };
            self.report(
                path,
                true,
                format!(
                    "not allowed with {what}, which carries its own weights; remove it, or use \
                     a built-in model"
                ),
            );
        } else if !self.spans.unread(path) {
            self.file(path, weights, "weights file");
        }
    }

    fn model(&mut self, path: FieldPath, s: &str) {
        if s.starts_with("spin:") {
            if let Err(e) = SpinModel::parse(s) {
                self.report(path, false, e.to_string());
            }
            return;
        }
        if s.starts_with("kernel:") {
            if let Err(e) = KernelModel::parse(s) {
                self.report(path, false, e.to_string());
            }
            return;
        }
        if is_onnx_path(s) {
            self.file(path, s, "model file (.onnx, or a saved plan .isoplan)");
            return;
        }
        if self.models.is_builtin(s) {
            return;
        }
        let hint = if s.starts_with("spin") {
            format!(" ({SPIN_SYNTAX})")
        } else {
            String::new()
        };
        let expected = model_expectation(self.models);
        self.report(
            path,
            false,
            format!("unknown model {s:?}{hint}; expected {expected}"),
        );
    }

    /// A file path relative to the scenario file's directory must name an existing file.
    fn file(&mut self, path: FieldPath, s: &str, what: &str) {
        let p = resolve(self.base_dir, s);
        let message = match p.canonicalize() {
            Ok(abs) if abs.is_file() => return,
            Ok(_) => format!("{} is not a file; expected a {what}", p.display()),
            Err(e) => format!(
                "{} cannot be opened ({e}); expected an existing {what} (relative paths are \
                 relative to the scenario file's directory)",
                p.display()
            ),
        };
        self.report(path, false, message);
    }

    /// Rate, deadline, run length and ramp, and the job count they give. An interferer's rate
    /// and length come from its ramp.
    fn rate_length_and_ramp(&mut self, i: usize, w: &WorkloadSpec) {
        let role = (!self.spans.unread(Workload(i, "role"))).then_some(w.role);
        let ramp_ok = self.ramp_fits_role(i, w.ramp.as_ref(), role);
        if let Some(d) = w.deadline_ms {
            let expected = seconds_expected("milliseconds", 1e3);
            let (lo, hi) = (MIN_SECONDS * 1e3, MAX_SECONDS * 1e3);
            self.positive(Workload(i, "deadline_ms"), d, lo, hi, &expected);
        }
        self.phase(i, w);
        if role == Some(Role::Interferer) {
            // A rate_hz or length key the walk refused leaves the job count unknown.
            let derived = !self.unread_any(&[Workload(i, "rate_hz"), FieldPath::Length(i)]);
            if let (Some(r), true, true) = (&w.ramp, ramp_ok, derived) {
                self.ramp_jobs(i, r);
            }
            return;
        }
        let rate_ok = self.rate(i, w.rate, role == Some(Role::Victim));
        let length_ok = !self.spans.unread(FieldPath::Length(i))
            && match w.length {
                RunLength::DurationS(d) => self.seconds(Workload(i, "duration_s"), d),
                RunLength::Jobs(n) => self.int(Workload(i, "jobs"), n, JOBS),
            };
        match (rate_ok, length_ok, w.length, w.rate) {
            (true, true, RunLength::DurationS(d), Rate::Hz(hz)) => self.duration_jobs(i, d, hz),
            (true, true, RunLength::Jobs(n), Rate::Hz(hz)) => self.jobs_span(i, n, hz),
            _ => {}
        }
    }

    /// A job count at a fixed rate spans `jobs` periods, each job's deadline one period by
    /// default: at most [`MAX_SECONDS`], as `duration_s` (issue 31: `jobs = 2` at `rate_hz =
    /// 1e-12` released its second job 1e21 ns after t0, beyond i64, and overflowed the release
    /// loop; at 1e-9 Hz it waited 31 years).
    fn jobs_span(&mut self, i: usize, n: u64, hz: f64) {
        let span_s = n as f64 / hz;
        if span_s > MAX_SECONDS {
            self.report(
                Workload(i, "jobs"),
                false,
                format!(
                    "found {n} jobs at rate_hz = {hz:?}: {n} periods of {:e} s = {span_s:e} s; \
                     expected jobs / rate_hz of at most {MAX_SECONDS:e} s (100 days): fewer jobs \
                     or a higher rate_hz",
                    1.0 / hz
                ),
            );
        }
    }

    /// Only an interferer ramps, and it must. Whether the ramp passed its rules.
    fn ramp_fits_role(&mut self, i: usize, ramp: Option<&Ramp>, role: Option<Role>) -> bool {
        let path = Workload(i, "ramp");
        match (ramp, role) {
            (Some(_), Some(r)) if r != Role::Interferer => {
                self.report(
                    path,
                    true,
                    format!(
                        "not allowed with role \"{}\"; expected role = \"interferer\" (only an \
                         interferer ramps its rate)",
                        name_of(ROLES, r)
                    ),
                );
                false
            }
            (Some(r), _) => !self.spans.unread(path) && self.ramp(i, r),
            (None, Some(Role::Interferer)) => {
                self.report_missing(Workload(i, ""), path, RAMP_EXPECTED);
                false
            }
            (None, _) => false,
        }
    }

    /// "missing in [table]; expected ...", at the table, as the walk says it of a file's keys.
    fn report_missing(&mut self, table: FieldPath, path: FieldPath, expected: &str) {
        let offset = self.spans.span(table, false).start;
        self.push(
            offset,
            path,
            format!("missing in [{table}]; expected {expected}"),
        );
    }

    fn rate(&mut self, i: usize, rate: Rate, victim: bool) -> bool {
        let path = Workload(i, "rate_hz");
        if self.spans.unread(path) {
            return false;
        }
        match rate {
            Rate::Max(_) if victim => {
                self.report(
                    path,
                    false,
                    "found \"max\" with role \"victim\"; expected a fixed rate > 0 (a victim's \
                     deadline keeping is measured at a fixed rate, e.g. its max stable rate)"
                        .to_string(),
                );
                false
            }
            Rate::Max(_) => true,
            Rate::Hz(hz) => self.positive(path, hz, 0.0, MAX_RATE_HZ, &rate_expected()),
        }
    }

    /// Whether the ramp passed every rule.
    fn ramp(&mut self, i: usize, r: &Ramp) -> bool {
        let before = self.problems.len();
        let path = |k| FieldPath::Ramp(i, k);
        let hz = hz_expected();
        let from_ok = self.positive(path("from_hz"), r.from_hz, 0.0, MAX_RATE_HZ, &hz);
        let to_ok = self.positive(path("to_hz"), r.to_hz, 0.0, MAX_RATE_HZ, &hz);
        self.int(path("steps"), u64::from(r.steps), STEPS);
        self.seconds(path("step_s"), r.step_s);
        if from_ok && to_ok && r.from_hz > r.to_hz {
            self.report(
                path("to_hz"),
                false,
                format!(
                    "found to_hz = {:?} below from_hz = {:?}; expected from_hz <= to_hz (the ramp \
                     rises)",
                    r.to_hz, r.from_hz
                ),
            );
        }
        self.problems.len() == before
            && !self.unread_any(&RAMP_PATHS.map(|k| FieldPath::Ramp(i, k)))
    }

    /// A duration at a fixed rate must release at least one job (a run that releases nothing
    /// measures nothing and would say "ok") and at most [`MAX_JOBS`].
    fn duration_jobs(&mut self, i: usize, d: f64, hz: f64) {
        let path = Workload(i, "duration_s");
        let jobs = d * hz;
        if crate::schedule::jobs_in(d, hz) == 0 {
            self.report(
                path,
                false,
                format!(
                    "found {d:?} s at rate_hz = {hz:?}: no job would be released (duration_s × \
                     rate_hz = {jobs:e} < 1); expected at least one period, {:e} s",
                    1.0 / hz
                ),
            );
        } else if jobs > MAX_JOBS as f64 {
            self.report(
                path,
                false,
                format!(
                    "found {d:?} s at rate_hz = {hz:?}: {jobs:e} jobs; expected at most {MAX_JOBS} \
                     jobs (duration_s × rate_hz)"
                ),
            );
        }
    }

    /// A ramp's every step must release a job, and all of them at most [`MAX_JOBS`].
    fn ramp_jobs(&mut self, i: usize, r: &Ramp) {
        let path = Workload(i, "ramp");
        if r.total_duration_s() > MAX_SECONDS {
            let message = format!(
                "found steps × step_s = {} × {:?} s = {:e} s; expected at most {MAX_SECONDS:e} s",
                r.steps,
                r.step_s,
                r.total_duration_s()
            );
            self.report(path, false, message);
            return;
        }
        // The first step has the lowest rate: if it releases a job, every step does.
        if crate::schedule::jobs_in(r.step_s, r.from_hz) == 0 {
            let message = format!(
                "found step_s = {:?} s at from_hz = {:?}: the first step would release no job \
                 (step_s × from_hz < 1); expected step_s >= {:e} s",
                r.step_s,
                r.from_hz,
                1.0 / r.from_hz
            );
            self.report(path, false, message);
            return;
        }
        let total = ramp_jobs_total(r);
        if total > MAX_JOBS as f64 {
            self.report(
                path,
                false,
                format!("releases {total:e} jobs over its steps; expected at most {MAX_JOBS} jobs"),
            );
        }
    }

    /// Each CPU id once. Linear: one map of the ids seen.
    fn cpus_once(&mut self, i: usize, cpus: &[usize]) {
        if self.spans.unread(Workload(i, "cpu")) {
            return;
        }
        let mut seen: HashMap<usize, usize> = HashMap::with_capacity(cpus.len());
        for (j, &c) in cpus.iter().enumerate() {
            if self.spans.unread(Cpu(i, j)) {
                continue;
            }
            if let Some(&k) = seen.get(&c) {
                self.report(
                    Cpu(i, j),
                    false,
                    format!(
                        "found CPU {c} again (already workload[{i}].cpu[{k}]); expected each CPU \
                         id once"
                    ),
                );
            } else {
                seen.insert(c, j);
            }
        }
    }

    /// Each partition key belongs to one mechanism (checked when the device passed its rules),
    /// and each value has its bounds.
    fn partition(&mut self, i: usize, p: &PartitionSpec, mechanism: Option<Mechanism>) {
        let present = [
            p.sms.is_some(),
            p.thread_pct.is_some(),
            p.mem_limit_mib.is_some(),
            p.mig_profile.is_some(),
        ];
        if let Some(m) = mechanism {
            for (key, _) in PARTITION_KEYS.iter().zip(present).filter(|(_, on)| *on) {
                self.partition_key_fits(Partition(i, key), partition_owner(key), m);
            }
        }
        if let Some(n) = p.sms {
            self.int(Partition(i, "sms"), u64::from(n), SMS);
        }
        if let Some(n) = p.thread_pct {
            self.int(Partition(i, "thread_pct"), u64::from(n), THREAD_PCT);
        }
        if let Some(n) = p.mem_limit_mib {
            self.int(Partition(i, "mem_limit_mib"), n, MEM_LIMIT_MIB);
        }
        let path = Partition(i, "mig_profile");
        if let Some(s) = &p.mig_profile {
            if s.trim().is_empty() && !self.spans.unread(path) {
                self.wrong(path, || format!("string {s:?}"), MIG_EXPECTED);
            }
        }
    }

    fn partition_key_fits(&mut self, path: FieldPath, owner: Mechanism, m: Mechanism) {
        if owner == m {
            return;
        }
        let allowed: Vec<&str> = PARTITION_KEYS
            .iter()
            .copied()
            .filter(|k| partition_owner(k) == m)
            .collect();
        let allowed_txt = if allowed.is_empty() {
            "no partition keys (the device is not partitioned)".to_string()
        } else {
            format!("only {}", allowed.join(", "))
        };
        self.report(
            path,
            true,
            format!(
                "belongs to mechanism \"{}\", but device.mechanism is \"{}\"; expected \
                 {allowed_txt} here",
                name_of(MECHANISMS, owner),
                name_of(MECHANISMS, m)
            ),
        );
    }
}

/// Jobs a ramp releases over its steps (as a float: it may exceed any integer type). Summed
/// step by step, in order, up to a million steps; beyond, the closed form of evenly spaced rates
/// (a file may ask for 4 billion steps, whose list of rates would take 32 GB).
fn ramp_jobs_total(r: &Ramp) -> f64 {
    const SUMMED_STEPS: u32 = 1_000_000;
    if r.steps <= SUMMED_STEPS {
        (0..r.steps).map(|i| r.step_rate(i) * r.step_s).sum()
    } else {
        f64::from(r.steps) * r.step_s * (r.from_hz + r.to_hz) / 2.0
    }
}

const RAMP_PATHS: [&str; 4] = ["from_hz", "to_hz", "steps", "step_s"];

/// The mechanism a partition key belongs to.
fn partition_owner(key: &str) -> Mechanism {
    match key {
        "sms" => Mechanism::Green,
        "mig_profile" => Mechanism::Mig,
        _ => Mechanism::Mps,
    }
}

/// `s` relative to `base_dir` unless absolute.
pub(super) fn resolve(base_dir: &Path, s: &str) -> std::path::PathBuf {
    let p = Path::new(s);
    if p.is_absolute() {
        p.to_path_buf()
    } else {
        base_dir.join(p)
    }
}
