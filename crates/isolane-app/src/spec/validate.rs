//! From serde's reading of the `[[app]]` tables to the typed spec: every rule that involves
//! more than one value (names, paths, the DAG and what flows on its edges, what each kind
//! accepts), reported by field path (`app[0].stage[2].after`).

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

use isolane_core::spec::{Criticality, PartitionSpec, Precision};

use super::raw::{
    kind_keys, AppRaw, FileRaw, KindName, SourceKindName, SourceRaw, StageRaw, VoteName,
};
use super::{
    AppSpec, Dtype, Input, Late, ModelNames, ModelSpec, PreprocessDevice, PreprocessSpec,
    SourceKind, SourceSpec, SpecError, StageKind, StageSpec, Vote, DEFAULT_DROP_FRAMES, SOURCE,
};

/// At most this many frames per app: each stage keeps a record (about 80 bytes) per frame.
const MAX_FRAMES: u64 = 10_000_000;
/// Times (a deadline, a run's length) up to 100 days, as a workload's: release times and
/// deadlines stay exact in i64 nanoseconds.
const MAX_SECONDS: f64 = 8.64e6;

/// Reads the `[[app]]` tables of scenario `text` (file `path`; relative paths in it are
/// relative to its folder). No `app` key: no apps.
pub fn parse_apps(
    text: &str,
    path: &Path,
    models: &dyn ModelNames,
) -> Result<Vec<AppSpec>, SpecError> {
    let file = path.display().to_string();
    let raw: FileRaw = toml::from_str(text).map_err(|e| SpecError::Syntax {
        file: file.clone(),
        message: e.to_string().trim_end().to_string(),
    })?;
    let mut v = Validator {
        file,
        base: path.parent().map(Path::to_path_buf).unwrap_or_default(),
        models,
    };
    let apps = raw
        .app
        .into_iter()
        .enumerate()
        .map(|(i, a)| v.app(i, a))
        .collect::<Result<Vec<_>, _>>()?;
    v.unique(apps.iter().map(|a| a.name.as_str()), |i| {
        format!("app[{i}].name")
    })?;
    Ok(apps)
}

struct Validator<'a> {
    file: String,
    base: PathBuf,
    models: &'a dyn ModelNames,
}

impl Validator<'_> {
    fn err(&self, field: impl Into<String>, message: impl Into<String>) -> SpecError {
        SpecError::Invalid {
            file: self.file.clone(),
            field: field.into(),
            message: message.into(),
        }
    }

    fn unique<'n>(
        &self,
        names: impl Iterator<Item = &'n str>,
        field: impl Fn(usize) -> String,
    ) -> Result<(), SpecError> {
        let mut seen = BTreeSet::new();
        for (i, n) in names.enumerate() {
            if !seen.insert(n) {
                return Err(self.err(
                    field(i),
                    format!("`{n}` is used twice; names must be unique"),
                ));
            }
        }
        Ok(())
    }

    fn name(&self, field: &str, name: &str) -> Result<(), SpecError> {
        let ok = !name.is_empty()
            && name.len() <= 64
            && name
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '-'));
        if !ok {
            return Err(self.err(
                field,
                format!("`{name}`: expected 1 to 64 letters, digits, `_` or `-`"),
            ));
        }
        Ok(())
    }

    fn app(&mut self, i: usize, a: AppRaw) -> Result<AppSpec, SpecError> {
        let at = format!("app[{i}]");
        self.name(&format!("{at}.name"), &a.name)?;
        if !(a.deadline_ms.is_finite() && a.deadline_ms > 0.0 && a.deadline_ms <= MAX_SECONDS * 1e3)
        {
            return Err(self.err(
                format!("{at}.deadline_ms"),
                format!(
                    "{}: expected a number of milliseconds > 0 and at most 8.64e9 (100 days)",
                    a.deadline_ms
                ),
            ));
        }
        let source = self.source(&at, a.source)?;
        let frames = self.frames(&at, a.frames, a.duration_s, source.fps)?;
        let drop_frames = a.drop_frames.unwrap_or(DEFAULT_DROP_FRAMES);
        if frames <= drop_frames.saturating_mul(2) {
            return Err(self.err(
                format!("{at}.frames"),
                format!(
                    "{frames} frames leave none to measure after dropping the first and last \
                     {drop_frames} (drop_frames); expected more than {}",
                    drop_frames.saturating_mul(2)
                ),
            ));
        }
        let mut cores = BTreeSet::new();
        if let Some(c) = a.cpu.iter().find(|&&c| !cores.insert(c)) {
            return Err(self.err(
                format!("{at}.cpu"),
                format!("core {c} is listed twice; expected distinct core ids"),
            ));
        }
        let defaults = ModelDefaults {
            precision: a.precision.unwrap_or(Precision::Fp32),
            partition: a.partition,
        };
        let stages = self.stages(&at, a.stage, &defaults)?;
        self.check_crops(&at, &source, &stages)?;
        let criticality = a.criticality.unwrap_or_default();
        if let Some(s) = a.stretch {
            if !(s.is_finite() && (1.0..=1000.0).contains(&s)) {
                return Err(self.err(
                    format!("{at}.stretch"),
                    format!("{s}: expected the worst slowdown beside best effort, from 1 to 1000"),
                ));
            }
            if criticality != Criticality::Critical {
                return Err(self.err(
                    format!("{at}.stretch"),
                    "a best-effort app has no deadline to keep; expected stretch on a critical \
                     app only",
                ));
            }
        }
        Ok(AppSpec {
            name: a.name,
            deadline_ms: a.deadline_ms,
            frames,
            drop_frames,
            late: a.late.unwrap_or(Late::Skip),
            cpu: a.cpu,
            partition: defaults.partition,
            gpu: a.gpu,
            criticality,
            stretch: a.stretch,
            transfer: a.transfer.unwrap_or_default(),
            source,
            stages,
        })
    }

    fn frames(
        &self,
        at: &str,
        frames: Option<u64>,
        duration_s: Option<f64>,
        fps: f64,
    ) -> Result<u64, SpecError> {
        let n = match (frames, duration_s) {
            (Some(_), Some(_)) => Err(self.err(
                format!("{at}.duration_s"),
                "both frames and duration_s; expected one of them",
            )),
            (Some(n), None) => Ok(n),
            (None, Some(d)) if d.is_finite() && d > 0.0 => Ok((d * fps).round() as u64),
            (None, Some(d)) => Err(self.err(
                format!("{at}.duration_s"),
                format!("{d}: expected a number of seconds > 0"),
            )),
            (None, None) => Err(self.err(
                format!("{at}.frames"),
                "missing; expected frames = N or duration_s = S",
            )),
        }?;
        // Every stage keeps a record per frame in memory until the run ends.
        if n > MAX_FRAMES {
            return Err(self.err(
                format!("{at}.frames"),
                format!("{n} frames; expected at most {MAX_FRAMES} (about 46 hours at 60 fps)"),
            ));
        }
        if n as f64 / fps > MAX_SECONDS {
            return Err(self.err(
                format!("{at}.frames"),
                format!("{n} frames at {fps} fps last more than 100 days; expected a shorter run"),
            ));
        }
        Ok(n)
    }

    fn source(&self, at: &str, s: SourceRaw) -> Result<SourceSpec, SpecError> {
        let at = format!("{at}.source");
        if !(s.fps.is_finite() && s.fps > 0.0 && s.fps <= 10_000.0) {
            return Err(self.err(
                format!("{at}.fps"),
                format!("{}: expected frames per second in (0, 10000]", s.fps),
            ));
        }
        let only = |allowed: &[&str]| -> Result<(), SpecError> {
            let set = [
                ("width", s.width.is_some()),
                ("height", s.height.is_some()),
                ("dir", s.dir.is_some()),
                ("path", s.path.is_some()),
            ];
            match set.iter().find(|(k, on)| *on && !allowed.contains(k)) {
                Some((k, _)) => Err(self.err(
                    format!("{at}.{k}"),
                    format!(
                        "not a key of this source kind; its keys: kind, fps{}",
                        allowed.iter().map(|k| format!(", {k}")).collect::<String>()
                    ),
                )),
                None => Ok(()),
            }
        };
        let kind = match s.kind {
            SourceKindName::Synthetic => {
                only(&["width", "height"])?;
                let (Some(width), Some(height)) = (s.width, s.height) else {
                    return Err(self.err(
                        format!("{at}.width"),
                        "a synthetic source needs width and height (pixels)",
                    ));
                };
                if !(1..=16384).contains(&width) || !(1..=16384).contains(&height) {
                    return Err(self.err(
                        format!("{at}.width"),
                        format!("{width}x{height}: expected 1 to 16384 pixels each"),
                    ));
                }
                SourceKind::Synthetic { width, height }
            }
            SourceKindName::Images => {
                only(&["dir"])?;
                let dir = self.path(&format!("{at}.dir"), s.dir.as_deref(), "a folder")?;
                if !dir.is_dir() {
                    // "no such folder" for /dev/zero or a file sent the user looking for a typo.
                    let what = if dir.exists() {
                        "not a folder; expected the folder of the .png and .jpg frames"
                    } else {
                        "no such folder"
                    };
                    return Err(self.err(format!("{at}.dir"), format!("{}: {what}", dir.display())));
                }
                SourceKind::Images { dir }
            }
            SourceKindName::Video => {
                only(&["path"])?;
                let path = self.path(&format!("{at}.path"), s.path.as_deref(), "a .y4m file")?;
                if path.extension().and_then(|e| e.to_str()) != Some("y4m") {
                    return Err(self.err(
                        format!("{at}.path"),
                        format!(
                            "{}: expected an uncompressed YUV4MPEG2 .y4m file (the only video \
                             format read; `ffmpeg -i in.mp4 -pix_fmt yuv420p out.y4m` makes one)",
                            path.display()
                        ),
                    ));
                }
                if !path.is_file() {
                    return Err(self.err(
                        format!("{at}.path"),
                        format!("{}: no such file", path.display()),
                    ));
                }
                SourceKind::Video { path }
            }
        };
        Ok(SourceSpec { fps: s.fps, kind })
    }

    fn path(&self, field: &str, p: Option<&str>, what: &str) -> Result<PathBuf, SpecError> {
        let p = p.ok_or_else(|| self.err(field, format!("missing; expected {what}")))?;
        let joined = self.base.join(p);
        Ok(joined.canonicalize().unwrap_or(joined))
    }

    fn stages(
        &self,
        at: &str,
        raws: Vec<StageRaw>,
        defaults: &ModelDefaults,
    ) -> Result<Vec<StageSpec>, SpecError> {
        if raws.is_empty() {
            return Err(self.err(
                format!("{at}.stage"),
                "no stages; expected [[app.stage]] tables ending in a kind = \"sink\"",
            ));
        }
        let mut index: BTreeMap<String, usize> = BTreeMap::new();
        for (j, r) in raws.iter().enumerate() {
            let f = format!("{at}.stage[{j}].name");
            self.name(&f, &r.name)?;
            if r.name == SOURCE {
                return Err(self.err(f, "`source` names the app's source; pick another name"));
            }
            if index.insert(r.name.clone(), j).is_some() {
                return Err(self.err(
                    f,
                    format!("`{}` is used twice; names must be unique", r.name),
                ));
            }
        }
        let mut stages = Vec::with_capacity(raws.len());
        for (j, r) in raws.into_iter().enumerate() {
            let sat = format!("{at}.stage[{j}]");
            let inputs = self.inputs(&sat, &r, j, &index)?;
            let kind = self.kind(&sat, r.name.as_str(), &r, defaults)?;
            stages.push(StageSpec {
                name: r.name,
                inputs,
                kind,
            });
        }
        self.check_graph(at, &stages)?;
        Ok(stages)
    }

    /// `after` names earlier stages (or `source`), so the stages of a file are already in an
    /// order every input comes before: the graph cannot have a cycle.
    fn inputs(
        &self,
        sat: &str,
        r: &StageRaw,
        j: usize,
        index: &BTreeMap<String, usize>,
    ) -> Result<Vec<Input>, SpecError> {
        let Some(after) = &r.after else {
            return Ok(vec![if j == 0 {
                Input::Source
            } else {
                Input::Stage(j - 1)
            }]);
        };
        if after.is_empty() {
            return Err(self.err(
                format!("{sat}.after"),
                "empty; expected at least one stage name or \"source\"",
            ));
        }
        let mut inputs = Vec::new();
        for name in after {
            let input = match index.get(name) {
                _ if name == SOURCE => Input::Source,
                Some(&k) if k < j => Input::Stage(k),
                Some(_) => {
                    return Err(self.err(
                        format!("{sat}.after"),
                        format!("`{name}` comes later in the file; a stage may only follow stages above it (or \"source\")"),
                    ))
                }
                None => {
                    let known: Vec<&str> = std::iter::once(SOURCE)
                        .chain(index.iter().filter(|(_, &k)| k < j).map(|(n, _)| n.as_str()))
                        .collect();
                    return Err(self.err(
                        format!("{sat}.after"),
                        format!("unknown stage `{name}`; expected one of: {}", known.join(", ")),
                    ));
                }
            };
            if inputs.contains(&input) {
                return Err(self.err(format!("{sat}.after"), format!("`{name}` is named twice")));
            }
            inputs.push(input);
        }
        Ok(inputs)
    }

    fn kind(
        &self,
        sat: &str,
        name: &str,
        r: &StageRaw,
        defaults: &ModelDefaults,
    ) -> Result<StageKind, SpecError> {
        let allowed = kind_keys(r.kind);
        if let Some(k) = r.keys_set().into_iter().find(|k| !allowed.contains(k)) {
            let mut keys = vec!["name", "kind", "after"];
            keys.extend(allowed);
            return Err(self.err(
                format!("{sat}.{k}"),
                format!(
                    "not a key of this stage kind; its keys: {}",
                    keys.join(", ")
                ),
            ));
        }
        let unit = |field: &str, v: f32| -> Result<f32, SpecError> {
            if (0.0..=1.0).contains(&v) {
                Ok(v)
            } else {
                Err(self.err(format!("{sat}.{field}"), format!("{v}: expected 0 to 1")))
            }
        };
        let count = |field: &str, v: usize| -> Result<usize, SpecError> {
            if (1..=100_000).contains(&v) {
                Ok(v)
            } else {
                Err(self.err(
                    format!("{sat}.{field}"),
                    format!("{v}: expected 1 to 100000"),
                ))
            }
        };
        Ok(match r.kind {
            KindName::Preprocess => StageKind::Preprocess(self.preprocess(sat, r)?),
            KindName::Model => {
                let model = r.model.clone().ok_or_else(|| {
                    self.err(
                        format!("{sat}.model"),
                        "missing; a model stage needs model = ...",
                    )
                })?;
                let mut m = self.model(
                    &format!("{sat}.model"),
                    name.to_string(),
                    model,
                    r.weights.clone(),
                    r.precision,
                    r.partition.clone(),
                    r.plan_check,
                    defaults,
                )?;
                m.gpu = r.gpu;
                StageKind::Model(m)
            }
            KindName::Yolov8Decode => StageKind::Yolov8Decode {
                conf: unit("conf", r.conf.unwrap_or(0.25))?,
                iou: unit("iou", r.iou.unwrap_or(0.45))?,
                max_det: count("max_det", r.max_det.unwrap_or(300))?,
            },
            KindName::SegArgmax => StageKind::SegArgmax {
                alpha: unit("alpha", r.alpha.unwrap_or(0.5))?,
            },
            KindName::Classify => StageKind::Classify {
                top_k: count("top_k", r.top_k.unwrap_or(5))?,
            },
            KindName::Ensemble => self.ensemble(sat, name, r, defaults)?,
            KindName::Sink => StageKind::Sink,
            KindName::Graphics => StageKind::Graphics {
                device: self.render_device(sat, r.device.as_deref())?,
                alpha: unit("alpha", r.alpha.unwrap_or(0.5))?,
                save_every: match r.save_every {
                    Some(n) => Some(count("save_every", n as usize)? as u64),
                    None => None,
                },
                gpu: self.render_gpu(sat, r)?,
            },
        })
    }

    /// A graphics stage's `device`, as the renderer will read it (checked here, so that a bad
    /// one is a scenario error before anything runs).
    fn render_device(&self, sat: &str, device: Option<&str>) -> Result<String, SpecError> {
        let text = device.unwrap_or("auto");
        text.parse::<isolane_graphics::DevicePreference>()
            .map(|_| text.to_string())
            .map_err(|e| self.err(format!("{sat}.device"), e.to_string()))
    }

    /// A graphics stage's `gpu` (the device's GPUs are checked with the device,
    /// `partitions::check_gpus`): with a `device` preference other than `auto` the two would
    /// choose the Vulkan device twice, so that is refused.
    fn render_gpu(&self, sat: &str, r: &StageRaw) -> Result<Option<u32>, SpecError> {
        match (&r.device, r.gpu) {
            (Some(d), Some(g)) if !d.trim().eq_ignore_ascii_case("auto") => Err(self.err(
                format!("{sat}.gpu"),
                format!(
                    "{g} beside device = {d:?}: both choose the Vulkan device; give gpu (the \
                     CUDA GPU, found by its UUID) or device (a Vulkan preference), not both"
                ),
            )),
            (_, g) => Ok(g),
        }
    }

    fn preprocess(&self, sat: &str, r: &StageRaw) -> Result<PreprocessSpec, SpecError> {
        if let Some([w, h]) = r.size {
            if !(1..=16384).contains(&w) || !(1..=16384).contains(&h) {
                return Err(self.err(
                    format!("{sat}.size"),
                    format!("[{w}, {h}]: expected [width, height] of 1 to 16384 pixels"),
                ));
            }
        }
        if let Some([_, _, w, h]) = r.crop {
            if w == 0 || h == 0 {
                return Err(self.err(
                    format!("{sat}.crop"),
                    "expected [x, y, width, height] with width and height > 0",
                ));
            }
        }
        let device = self.preprocess_device(sat, r.device.as_deref())?;
        if let (Some(g), PreprocessDevice::Cpu) = (r.gpu, device) {
            return Err(self.err(
                format!("{sat}.gpu"),
                format!(
                    "{g} on a preprocess that runs on the CPU; expected gpu only beside \
                     device = \"gpu\""
                ),
            ));
        }
        let std = r.std.unwrap_or([1.0; 3]);
        if std.iter().any(|s| !(s.is_finite() && *s > 0.0)) {
            return Err(self.err(format!("{sat}.std"), "expected three numbers > 0"));
        }
        // NaN, an infinity, or a number past f32's range (it reads as an infinity) would make
        // every pixel of every frame NaN.
        let mean = r.mean.unwrap_or([0.0; 3]);
        if mean.iter().any(|m| !m.is_finite()) {
            return Err(self.err(
                format!("{sat}.mean"),
                format!("{mean:?}: expected three finite numbers (per channel, e.g. 0.485)"),
            ));
        }
        Ok(PreprocessSpec {
            size: r.size,
            crop: r.crop,
            mean,
            std,
            dtype: r.dtype.unwrap_or(Dtype::F32),
            device,
            gpu: r.gpu,
        })
    }

    /// A preprocess's `device`: the CPU operator (default) or the CUDA kernel. Whether the
    /// scenario's backend has a GPU is checked with the device (`partitions::check_device`).
    fn preprocess_device(
        &self,
        sat: &str,
        device: Option<&str>,
    ) -> Result<PreprocessDevice, SpecError> {
        match device.unwrap_or("cpu") {
            "cpu" => Ok(PreprocessDevice::Cpu),
            "gpu" => Ok(PreprocessDevice::Gpu),
            other => Err(self.err(
                format!("{sat}.device"),
                format!("`{other}`: expected {}", PreprocessDevice::NAMES),
            )),
        }
    }

    #[allow(clippy::too_many_arguments)]
    fn model(
        &self,
        field: &str,
        name: String,
        model: String,
        weights: Option<String>,
        precision: Option<Precision>,
        partition: Option<PartitionSpec>,
        plan_check: Option<bool>,
        defaults: &ModelDefaults,
    ) -> Result<ModelSpec, SpecError> {
        let p = precision.unwrap_or(defaults.precision);
        if p.quantized() {
            // int8 / fp8 quantize a model from a calibration folder, a [[workload]] key.
            return Err(self.err(
                format!("{}precision", field.trim_end_matches("model")),
                format!(
                    "\"{}\" is for [[workload]]s (with their calibration folder); expected one \
                     of \"fp32\" | \"tf32\" | \"fp16\" | \"bf16\"",
                    if p == Precision::Int8 { "int8" } else { "fp8" }
                ),
            ));
        }
        let model = if model.ends_with(".onnx") {
            let p = self.path(field, Some(&model), "an .onnx file")?;
            if !p.is_file() {
                return Err(self.err(field, format!("{}: no such file", p.display())));
            }
            p.display().to_string()
        } else if self.models.is_builtin(&model) {
            model
        } else {
            return Err(self.err(
                field,
                format!(
                    "`{model}`: expected a built-in model ({}) or a path to an .onnx file",
                    self.models.builtins().join(", ")
                ),
            ));
        };
        let weights =
            match weights {
                // The file's own weights are what runs: a weights file beside it would be ignored.
                Some(_) if model.ends_with(".onnx") => return Err(self.err(
                    format!("{}weights", field.trim_end_matches("model")),
                    "not allowed with an .onnx model, which carries its own weights; remove it, \
                     or use a built-in model"
                        .to_string(),
                )),
                Some(w) => Some(
                    self.path(field, Some(&w), "a weights file")?
                        .display()
                        .to_string(),
                ),
                None => None,
            };
        Ok(ModelSpec {
            name,
            model,
            weights,
            precision: precision.unwrap_or(defaults.precision),
            partition: partition.unwrap_or_else(|| defaults.partition.clone()),
            plan_check: plan_check.unwrap_or(true),
            gpu: None,
        })
    }

    fn ensemble(
        &self,
        sat: &str,
        name: &str,
        r: &StageRaw,
        defaults: &ModelDefaults,
    ) -> Result<StageKind, SpecError> {
        let raws = r.members.as_deref().unwrap_or_default();
        if raws.len() < 2 {
            return Err(self.err(
                format!("{sat}.members"),
                "an ensemble needs at least 2 members = [{ name, model }, ...]",
            ));
        }
        let mut members = Vec::new();
        for (m, raw) in raws.iter().enumerate() {
            let f = format!("{sat}.members[{m}]");
            self.name(&format!("{f}.name"), &raw.name)?;
            members.push(self.model(
                &format!("{f}.model"),
                format!("{name}.{}", raw.name),
                raw.model.clone(),
                raw.weights.clone(),
                raw.precision,
                raw.partition.clone(),
                raw.plan_check,
                defaults,
            )?);
        }
        self.unique(raws.iter().map(|m| m.name.as_str()), |m| {
            format!("{sat}.members[{m}].name")
        })?;
        let vote = match (r.vote.unwrap_or(VoteName::Majority), &r.voter) {
            (VoteName::Onnx, Some(v)) => Vote::Onnx(self.model(
                &format!("{sat}.voter"),
                format!("{name}.voter"),
                v.clone(),
                None,
                Some(Precision::Fp32),
                None,
                None,
                defaults,
            )?),
            (VoteName::Onnx, None) => {
                return Err(self.err(
                    format!("{sat}.voter"),
                    "vote = \"onnx\" needs voter = \"FILE.onnx\" (its input: the members' outputs stacked)",
                ))
            }
            (_, Some(_)) => {
                return Err(self.err(format!("{sat}.voter"), "only with vote = \"onnx\"")) 
            }
            (VoteName::Majority, None) => Vote::Majority,
            (VoteName::Mean, None) => Vote::Mean,
        };
        // The members and the voter run on the stage's GPU.
        let mut vote = vote;
        for m in members.iter_mut().chain(match &mut vote {
            Vote::Onnx(v) => Some(v),
            _ => None,
        }) {
            m.gpu = r.gpu;
        }
        Ok(StageKind::Ensemble { members, vote })
    }

    /// Exactly one sink, and every stage on a path to it (a stage whose output nobody reads
    /// would be work outside the end-to-end latency).
    fn check_graph(&self, at: &str, stages: &[StageSpec]) -> Result<(), SpecError> {
        let sinks: Vec<usize> = (0..stages.len())
            .filter(|&j| stages[j].kind == StageKind::Sink)
            .collect();
        let [sink] = sinks[..] else {
            return Err(self.err(
                format!("{at}.stage"),
                format!(
                    "{} sink stages; expected exactly one kind = \"sink\"",
                    sinks.len()
                ),
            ));
        };
        let mut reaches = vec![false; stages.len()];
        reaches[sink] = true;
        for j in (0..stages.len()).rev() {
            if reaches[j] {
                for input in &stages[j].inputs {
                    if let Input::Stage(k) = input {
                        reaches[*k] = true;
                    }
                }
            }
        }
        self.check_types(at, stages)?;
        if let Some(j) = reaches.iter().position(|r| !r) {
            return Err(self.err(
                format!("{at}.stage[{j}]"),
                format!(
                    "`{}` does not lead to the sink; name it in a later stage's after",
                    stages[j].name
                ),
            ));
        }
        Ok(())
    }
}

/// What flows on an edge, for checking that each stage gets what it reads.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum DataType {
    Frame,
    Tensor,
    Detections,
    Mask,
    Classes,
    Nothing,
}

impl DataType {
    fn name(self) -> &'static str {
        match self {
            DataType::Frame => "a frame",
            DataType::Tensor => "a tensor",
            DataType::Detections => "detections",
            DataType::Mask => "a mask",
            DataType::Classes => "classes",
            DataType::Nothing => "nothing",
        }
    }
}

/// A kind's input (`None`: any, any number) and output.
fn io_types(kind: &StageKind) -> (Option<DataType>, DataType) {
    use DataType::*;
    match kind {
        StageKind::Preprocess(_) => (Some(Frame), Tensor),
        StageKind::Model(_) => (Some(Tensor), Tensor),
        StageKind::Yolov8Decode { .. } => (Some(Tensor), Detections),
        StageKind::SegArgmax { .. } => (Some(Tensor), Mask),
        StageKind::Classify { .. } => (Some(Tensor), Classes),
        StageKind::Ensemble {
            vote: Vote::Onnx(_),
            ..
        } => (Some(Tensor), Tensor),
        StageKind::Ensemble { .. } => (Some(Tensor), Classes),
        // Detections, or a mask: `accepts` lets the mask in too.
        StageKind::Graphics { .. } => (Some(Detections), Frame),
        StageKind::Sink => (None, Nothing),
    }
}

/// Whether a stage of `kind` that reads `want` also takes `got`.
fn accepts(kind: &StageKind, want: DataType, got: DataType) -> bool {
    got == want || matches!(kind, StageKind::Graphics { .. }) && got == DataType::Mask
}

impl Validator<'_> {
    /// Every stage but the sink reads one input of the type it takes.
    fn check_types(&self, at: &str, stages: &[StageSpec]) -> Result<(), SpecError> {
        for (j, s) in stages.iter().enumerate() {
            let (Some(want), _) = io_types(&s.kind) else {
                continue;
            };
            if s.inputs.len() != 1 {
                return Err(self.err(
                    format!("{at}.stage[{j}].after"),
                    format!(
                        "a {} stage reads one input; only a sink joins several",
                        s.kind.name()
                    ),
                ));
            }
            let (got, from) = match s.inputs[0] {
                Input::Source => (DataType::Frame, SOURCE.to_string()),
                Input::Stage(k) => (io_types(&stages[k].kind).1, stages[k].name.clone()),
            };
            if !accepts(&s.kind, want, got) {
                let reads = match s.kind {
                    StageKind::Graphics { .. } => "detections or a mask".to_string(),
                    _ => want.name().to_string(),
                };
                return Err(self.err(
                    format!("{at}.stage[{j}].after"),
                    format!(
                        "a {} stage reads {reads}, but `{from}` gives {}",
                        s.kind.name(),
                        got.name()
                    ),
                ));
            }
        }
        Ok(())
    }
}

impl Validator<'_> {
    /// A crop must fit the frame; of a synthetic source the size is known now (files are
    /// checked per frame, where a crop that does not fit fails the stage).
    fn check_crops(
        &self,
        at: &str,
        source: &SourceSpec,
        stages: &[StageSpec],
    ) -> Result<(), SpecError> {
        let SourceKind::Synthetic { width, height } = source.kind else {
            return Ok(());
        };
        for (j, s) in stages.iter().enumerate() {
            if let StageKind::Preprocess(PreprocessSpec {
                crop: Some([x, y, w, h]),
                ..
            }) = &s.kind
            {
                if u64::from(*x) + u64::from(*w) > u64::from(width)
                    || u64::from(*y) + u64::from(*h) > u64::from(height)
                {
                    return Err(self.err(
                        format!("{at}.stage[{j}].crop"),
                        format!("[{x}, {y}, {w}, {h}] does not fit the {width}x{height} frames of the source"),
                    ));
                }
            }
        }
        Ok(())
    }
}

struct ModelDefaults {
    precision: Precision,
    partition: PartitionSpec,
}
