//! The `[[app]]` tables of a scenario file: the typed spec here, serde's reading of the file
//! in `raw`, the rules in `validate`.
//!
//! isolane-core's scenario walk lets the `app` key through and leaves it here: the file is
//! parsed a second time, for its apps only, through serde (unknown keys and unknown names are
//! refused with the line, the column and the allowed values), then every rule that involves
//! more than one value (stage names, the DAG, what each kind accepts) is checked by field path
//! (`app[0].stage[2].after`). Everything refused is a user error (exit code 2).

use std::path::PathBuf;

use isolane_core::spec::{Backend, Criticality, DeviceSpec, PartitionSpec, Precision};
use serde::Deserialize;

mod raw;
mod validate;

pub use validate::parse_apps;

/// The name `after` uses for an app's source.
pub const SOURCE: &str = "source";

/// Frames left out of the metrics at each end by default (paper 004: the first and last 10).
pub const DEFAULT_DROP_FRAMES: u64 = 10;

#[derive(Debug, thiserror::Error)]
pub enum SpecError {
    #[error("{file}: {message}")]
    Syntax { file: String, message: String },
    #[error("{file}: {field}: {message}")]
    Invalid {
        file: String,
        field: String,
        message: String,
    },
}

/// One application.
#[derive(Debug, Clone, PartialEq)]
pub struct AppSpec {
    pub name: String,
    /// End-to-end deadline: source release to sink end.
    pub deadline_ms: f64,
    pub frames: u64,
    /// Frames left out of the metrics at the start and at the end.
    pub drop_frames: u64,
    pub late: Late,
    /// CPU cores every thread of the app (source, stages, ensemble members) is pinned to;
    /// empty: not pinned.
    pub cpu: Vec<usize>,
    /// The partition of model stages that do not name one.
    pub partition: PartitionSpec,
    /// The GPU of the app's compute (models, GPU preprocess) and, unless a graphics stage names
    /// its own, of its rendering: one of `[device] gpus`; `None`: the device's first GPU.
    /// Read it through [`AppSpec::gpu_on`].
    pub gpu: Option<u32>,
    /// `critical` (the default): its frames' deadlines are kept; `best_effort`: its GPU stages
    /// are held back whenever they could make a critical app's frame late, in a run with
    /// `[protection]` enabled (docs/criticality.md, Apps).
    pub criticality: Criticality,
    /// A critical app's own worst stretch beside best effort (≥ 1): the guard charges overlap
    /// with its frames `1 − 1/stretch` instead of the run's `[protection] stretch`.
    pub stretch: Option<f64>,
    /// How a GPU stage's output reaches a GPU stage after it (`transfer =`).
    pub transfer: Transfer,
    pub source: SourceSpec,
    /// In the order of the file; `inputs` index into it (`None`: the source).
    pub stages: Vec<StageSpec>,
}

/// How values move from a GPU stage to the GPU stage that reads them (a GPU preprocess into
/// the model it feeds): `auto` leaves them on the GPU and copies them device to device, GPU to
/// GPU by a peer copy where the two GPUs can reach each other; `staged` makes a copy between
/// two GPUs go through host memory even where a peer copy could (the CUDA driver stages it);
/// `host` hands them on through the stages' host buffers (the producer downloads, the reader
/// uploads), as isolane did before stages handed device memory on.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Default)]
#[serde(rename_all = "lowercase")]
pub enum Transfer {
    #[default]
    Auto,
    Staged,
    Host,
}

impl Transfer {
    pub fn name(self) -> &'static str {
        match self {
            Transfer::Auto => "auto",
            Transfer::Staged => "staged",
            Transfer::Host => "host",
        }
    }
}

/// What a stage does with a frame whose deadline passed before it could start.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Late {
    /// Drop it (counted as a timeout): sensor semantics, as a workload's `late = "skip"`.
    Skip,
    /// Process every frame; a backlog grows under overload.
    Queue,
}

#[derive(Debug, Clone, PartialEq)]
pub struct SourceSpec {
    pub fps: f64,
    pub kind: SourceKind,
}

#[derive(Debug, Clone, PartialEq)]
pub enum SourceKind {
    /// Deterministic frames of this size (a moving pattern; the same frames every run).
    Synthetic { width: u32, height: u32 },
    /// PNG/JPEG files of a folder, in name order, cycled.
    Images { dir: PathBuf },
    /// An uncompressed YUV4MPEG2 (`.y4m`) file, 4:2:0 / 4:4:4 8-bit, cycled.
    Video { path: PathBuf },
}

/// Where a stage's input comes from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Input {
    Source,
    Stage(usize),
}

#[derive(Debug, Clone, PartialEq)]
pub struct StageSpec {
    pub name: String,
    pub inputs: Vec<Input>,
    pub kind: StageKind,
}

#[derive(Debug, Clone, PartialEq)]
pub enum StageKind {
    Preprocess(PreprocessSpec),
    Model(ModelSpec),
    Yolov8Decode {
        conf: f32,
        iou: f32,
        max_det: usize,
    },
    SegArgmax {
        alpha: f32,
    },
    Classify {
        top_k: usize,
    },
    Ensemble {
        members: Vec<ModelSpec>,
        vote: Vote,
    },
    /// Renders the source frame with the detections or mask it reads, offscreen through Vulkan
    /// (`device`: `auto`, `gpu`, `cpu`, an index or part of a device name; `alpha`: the mask's
    /// weight), and passes the rendered frame on.
    Graphics {
        device: String,
        alpha: f32,
        /// Save every n-th rendered frame as a PNG under the run's folder.
        save_every: Option<u64>,
        /// The CUDA GPU that renders (the Vulkan device with its UUID), where the stage names
        /// one; `None`: the app's GPU. Read it through [`AppSpec::render_gpu`].
        gpu: Option<u32>,
    },
    Sink,
}

impl StageKind {
    /// The name `kind =` gives it.
    pub fn name(&self) -> &'static str {
        match self {
            StageKind::Preprocess(_) => "preprocess",
            StageKind::Model(_) => "model",
            StageKind::Yolov8Decode { .. } => "yolov8_decode",
            StageKind::SegArgmax { .. } => "seg_argmax",
            StageKind::Classify { .. } => "classify",
            StageKind::Ensemble { .. } => "ensemble",
            StageKind::Graphics { .. } => "graphics",
            StageKind::Sink => "sink",
        }
    }
}

#[derive(Debug, Clone, PartialEq)]
pub struct PreprocessSpec {
    /// Output `[width, height]`; `None`: the input size of the model it feeds.
    pub size: Option<[u32; 2]>,
    /// `[x, y, width, height]` of the frame, cut out before the resize.
    pub crop: Option<[u32; 4]>,
    /// Per channel (RGB), on values scaled to 0..1: `(v/255 − mean) / std`.
    pub mean: [f32; 3],
    pub std: [f32; 3],
    pub dtype: Dtype,
    /// Where it runs: the CPU operator, or the CUDA kernel (`isolane_cuda::preprocess`).
    pub device: PreprocessDevice,
    /// The GPU of a `device = "gpu"` preprocess, where it names one; `None`: the GPU of the
    /// model it feeds. Read it through [`AppSpec::stage_gpu`].
    pub gpu: Option<u32>,
}

/// Where a preprocess runs (`device =`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PreprocessDevice {
    Cpu,
    /// The CUDA kernel, in the partition of the model it feeds (backend `cuda` only).
    Gpu,
}

impl PreprocessDevice {
    /// The words `device =` takes, for messages.
    pub const NAMES: &'static str = "\"cpu\" or \"gpu\"";

    pub fn name(self) -> &'static str {
        match self {
            PreprocessDevice::Cpu => "cpu",
            PreprocessDevice::Gpu => "gpu",
        }
    }
}

/// The element type a preprocess produces.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Dtype {
    F32,
    /// Rounded to f16 (what an f16 input carries); held in the engine's f32 input buffers.
    F16,
}

/// A model of a model stage or of an ensemble's member.
#[derive(Debug, Clone, PartialEq)]
pub struct ModelSpec {
    /// Unique within the app: the stage's name, or `<stage>.<member>`.
    pub name: String,
    /// A built-in model (`isolane models`) or an `.onnx` path (absolute once parsed).
    pub model: String,
    pub weights: Option<String>,
    pub precision: Precision,
    /// Its own partition, or the app's.
    pub partition: PartitionSpec,
    pub plan_check: bool,
    /// The GPU its stage names (`gpu =` of a model or ensemble stage); `None`: the app's.
    /// Read it through [`AppSpec::model_gpu`].
    pub gpu: Option<u32>,
}

#[derive(Debug, Clone, PartialEq)]
pub enum Vote {
    /// The most frequent top-1 class (ties: the lowest class id).
    Majority,
    /// The mean of the members' softmax probabilities.
    Mean,
    /// A user model taking the members' outputs stacked `[members, ...]`.
    Onnx(ModelSpec),
}

/// Whether a model string names something the engine can build: a built-in or an `.onnx`.
pub trait ModelNames {
    fn is_builtin(&self, model: &str) -> bool;
    /// For the message of an unknown model.
    fn builtins(&self) -> Vec<String>;
}

/// The engine's built-in models.
pub struct EngineModels;

impl ModelNames for EngineModels {
    fn is_builtin(&self, model: &str) -> bool {
        isolane_engine::model_info(model).is_some()
    }
    fn builtins(&self) -> Vec<String> {
        isolane_engine::builtin_models()
            .iter()
            .map(|m| m.name.to_string())
            .collect()
    }
}

impl AppSpec {
    /// Every model of the app (model stages, ensemble members, onnx voters), in file order.
    pub fn models(&self) -> Vec<&ModelSpec> {
        let mut out = Vec::new();
        for s in &self.stages {
            match &s.kind {
                StageKind::Model(m) => out.push(m),
                StageKind::Ensemble { members, vote } => {
                    out.extend(members);
                    if let Vote::Onnx(m) = vote {
                        out.push(m);
                    }
                }
                _ => {}
            }
        }
        out
    }

    /// [`AppSpec::models`], to change (`--no-plan-check`).
    pub fn models_mut(&mut self) -> Vec<&mut ModelSpec> {
        let mut out = Vec::new();
        for s in &mut self.stages {
            match &mut s.kind {
                StageKind::Model(m) => out.push(m),
                StageKind::Ensemble { members, vote } => {
                    out.extend(members.iter_mut());
                    if let Vote::Onnx(m) = vote {
                        out.push(m);
                    }
                }
                _ => {}
            }
        }
        out
    }

    /// The stages whose preprocess runs on the GPU (`device = "gpu"`), by index.
    pub fn gpu_preprocesses(&self) -> Vec<usize> {
        (0..self.stages.len())
            .filter(|&j| {
                matches!(&self.stages[j].kind, StageKind::Preprocess(p) if p.device == PreprocessDevice::Gpu)
            })
            .collect()
    }

    /// The model a preprocess at stage `j` feeds: the first model stage (or ensemble's first
    /// member) that reads it. Its size and, on the GPU, its partition are the preprocess's.
    pub fn fed_model(&self, j: usize) -> Option<&ModelSpec> {
        self.consumers(j)
            .into_iter()
            .find_map(|k| match &self.stages[k].kind {
                StageKind::Model(m) => Some(m),
                StageKind::Ensemble { members, .. } => members.first(),
                _ => None,
            })
    }

    /// The stages that read stage `j`'s output.
    pub fn consumers(&self, j: usize) -> Vec<usize> {
        (0..self.stages.len())
            .filter(|&k| self.stages[k].inputs.contains(&Input::Stage(j)))
            .collect()
    }

    /// The GPU of the app's compute: its own `gpu`, else the device's first.
    pub fn gpu_on(&self, device: &DeviceSpec) -> u32 {
        self.gpu.unwrap_or(device.gpu)
    }

    /// The GPU a model of the app runs on: its stage's `gpu`, else the app's.
    pub fn model_gpu(&self, model: &ModelSpec, device: &DeviceSpec) -> u32 {
        model.gpu.unwrap_or_else(|| self.gpu_on(device))
    }

    /// The GPU stage `j` computes on: a model's or an ensemble's (its members'), a GPU
    /// preprocess's own `gpu` or else the one of the model it feeds; `None` for a stage that
    /// computes on the CPU or renders (a graphics stage: [`AppSpec::render_gpu`]).
    pub fn stage_gpu(&self, j: usize, device: &DeviceSpec) -> Option<u32> {
        match &self.stages[j].kind {
            StageKind::Model(m) => Some(self.model_gpu(m, device)),
            StageKind::Ensemble { members, .. } => {
                members.first().map(|m| self.model_gpu(m, device))
            }
            StageKind::Preprocess(p) if p.device == PreprocessDevice::Gpu => Some(
                p.gpu
                    .or_else(|| self.fed_model(j).map(|m| self.model_gpu(m, device)))
                    .unwrap_or_else(|| self.gpu_on(device)),
            ),
            _ => None,
        }
    }

    /// The CUDA GPU a graphics stage renders on, where the run pins it to one (`None`: the
    /// stage's `device` preference chooses, as on one GPU without `gpu` keys). A stage is
    /// pinned when it or its app names a GPU, or when the device has several GPUs and the
    /// stage leaves `device` at `auto` (each app then renders on its own GPU).
    pub fn render_gpu(&self, stage: &StageSpec, device: &DeviceSpec) -> Option<u32> {
        let StageKind::Graphics {
            device: preference,
            gpu,
            ..
        } = &stage.kind
        else {
            return None;
        };
        if device.backend != Backend::Cuda {
            return None;
        }
        let auto = preference.trim().eq_ignore_ascii_case("auto");
        match (gpu, self.gpu) {
            (Some(g), _) => Some(*g),
            (None, Some(g)) if auto => Some(g),
            (None, None) if auto && device.several_gpus() => Some(device.gpu),
            _ => None,
        }
    }

    /// Frame period (ns).
    pub fn period_ns(&self) -> i64 {
        (1e9 / self.source.fps).round() as i64
    }

    pub fn deadline_ns(&self) -> i64 {
        (self.deadline_ms * 1e6).round() as i64
    }

    /// The source in words, for summaries.
    pub fn source_words(&self) -> String {
        match &self.source.kind {
            SourceKind::Synthetic { width, height } => format!("synthetic {width}x{height}"),
            SourceKind::Images { dir } => format!("images {}", dir.display()),
            SourceKind::Video { path } => format!("video {}", path.display()),
        }
    }
}

#[cfg(test)]
mod tests;
