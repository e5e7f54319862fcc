//! The `[[app]]` tables as serde reads them: every key of every kind, unknown keys refused
//! (with the line, the column and the allowed names); `validate` turns them into the typed
//! spec.

use isolane_core::spec::{Criticality, PartitionSpec, Precision};
use serde::Deserialize;

use super::{Dtype, Late};

#[derive(Deserialize)]
pub(super) struct FileRaw {
    #[serde(default)]
    pub(super) app: Vec<AppRaw>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct AppRaw {
    pub(super) name: String,
    pub(super) deadline_ms: f64,
    pub(super) frames: Option<u64>,
    pub(super) duration_s: Option<f64>,
    pub(super) drop_frames: Option<u64>,
    pub(super) late: Option<Late>,
    #[serde(default)]
    pub(super) cpu: Vec<usize>,
    #[serde(default)]
    pub(super) partition: PartitionSpec,
    pub(super) precision: Option<Precision>,
    pub(super) gpu: Option<u32>,
    pub(super) criticality: Option<Criticality>,
    pub(super) stretch: Option<f64>,
    pub(super) transfer: Option<super::Transfer>,
    pub(super) source: SourceRaw,
    #[serde(default)]
    pub(super) stage: Vec<StageRaw>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct SourceRaw {
    pub(super) kind: SourceKindName,
    pub(super) fps: f64,
    pub(super) width: Option<u32>,
    pub(super) height: Option<u32>,
    pub(super) dir: Option<String>,
    pub(super) path: Option<String>,
}

#[derive(Deserialize, Clone, Copy)]
#[serde(rename_all = "lowercase")]
pub(super) enum SourceKindName {
    Synthetic,
    Images,
    Video,
}

#[derive(Deserialize, Clone, Copy, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub(super) enum KindName {
    Preprocess,
    Model,
    Yolov8Decode,
    SegArgmax,
    Classify,
    Ensemble,
    Sink,
    /// The Vulkan render stage (`crates/isolane-graphics`).
    Graphics,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct StageRaw {
    pub(super) name: String,
    pub(super) kind: KindName,
    pub(super) after: Option<Vec<String>>,
    // preprocess
    pub(super) size: Option<[u32; 2]>,
    pub(super) crop: Option<[u32; 4]>,
    pub(super) mean: Option<[f32; 3]>,
    pub(super) std: Option<[f32; 3]>,
    pub(super) dtype: Option<Dtype>,
    // model
    pub(super) model: Option<String>,
    pub(super) weights: Option<String>,
    pub(super) precision: Option<Precision>,
    pub(super) partition: Option<PartitionSpec>,
    pub(super) plan_check: Option<bool>,
    // yolov8_decode
    pub(super) conf: Option<f32>,
    pub(super) iou: Option<f32>,
    pub(super) max_det: Option<usize>,
    // seg_argmax
    pub(super) alpha: Option<f32>,
    // classify
    pub(super) top_k: Option<usize>,
    // ensemble
    pub(super) members: Option<Vec<MemberRaw>>,
    pub(super) vote: Option<VoteName>,
    pub(super) voter: Option<String>,
    // graphics and preprocess
    pub(super) device: Option<String>,
    pub(super) save_every: Option<u64>,
    // graphics, model, ensemble, preprocess
    pub(super) gpu: Option<u32>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct MemberRaw {
    pub(super) name: String,
    pub(super) model: String,
    pub(super) weights: Option<String>,
    pub(super) precision: Option<Precision>,
    pub(super) partition: Option<PartitionSpec>,
    pub(super) plan_check: Option<bool>,
}

#[derive(Deserialize, Clone, Copy, PartialEq, Eq)]
#[serde(rename_all = "lowercase")]
pub(super) enum VoteName {
    Majority,
    Mean,
    Onnx,
}

/// The keys each kind accepts besides `name`, `kind`, `after`.
pub(super) fn kind_keys(kind: KindName) -> &'static [&'static str] {
    match kind {
        KindName::Preprocess => &["size", "crop", "mean", "std", "dtype", "device", "gpu"],
        KindName::Model => &[
            "model",
            "weights",
            "precision",
            "partition",
            "plan_check",
            "gpu",
        ],
        KindName::Yolov8Decode => &["conf", "iou", "max_det"],
        KindName::SegArgmax => &["alpha"],
        KindName::Classify => &["top_k"],
        KindName::Ensemble => &["members", "vote", "voter", "gpu"],
        KindName::Graphics => &["device", "alpha", "save_every", "gpu"],
        KindName::Sink => &[],
    }
}

impl StageRaw {
    /// The kind-specific keys this table set.
    pub(super) fn keys_set(&self) -> Vec<&'static str> {
        let set = [
            ("size", self.size.is_some()),
            ("crop", self.crop.is_some()),
            ("mean", self.mean.is_some()),
            ("std", self.std.is_some()),
            ("dtype", self.dtype.is_some()),
            ("model", self.model.is_some()),
            ("weights", self.weights.is_some()),
            ("precision", self.precision.is_some()),
            ("partition", self.partition.is_some()),
            ("plan_check", self.plan_check.is_some()),
            ("conf", self.conf.is_some()),
            ("iou", self.iou.is_some()),
            ("max_det", self.max_det.is_some()),
            ("alpha", self.alpha.is_some()),
            ("top_k", self.top_k.is_some()),
            ("device", self.device.is_some()),
            ("save_every", self.save_every.is_some()),
            ("gpu", self.gpu.is_some()),
            ("members", self.members.is_some()),
            ("vote", self.vote.is_some()),
            ("voter", self.voter.is_some()),
        ];
        set.iter().filter(|(_, s)| *s).map(|(k, _)| *k).collect()
    }
}
