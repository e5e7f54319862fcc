//! isolane-app: applications — a source of frames at a fixed rate, a DAG of stages (CPU
//! operators, models, ensembles) and a sink, with an end-to-end deadline per frame
//! (docs/apps.md).
//!
//! | module | one job |
//! | --- | --- |
//! | [`spec`] | the `[[app]]` tables of a scenario: types, parsing, validation |
//! | [`data`] | what flows between stages: frames, tensors, detections, masks, classes |
//! | [`source`] | synthetic frames, a folder of images, a `.y4m` video |
//! | [`ops`] | the CPU operators: preprocess, YOLOv8 decode + NMS, segmentation argmax, classify, votes |
//! | [`stage`] | the [`stage::Stage`] trait (the extension point) and the built stages |
//! | [`partitions`] | an app's models as workloads, for partitions and admission |
//! | [`placement`] | which CUDA GPU renders each graphics stage (its Vulkan device by UUID) |
//! | [`models`] | how a model stage gets a compiled model ([`models::ModelBuilder`]) |
//! | [`protection`] | criticality protection: critical apps' frames in the guard, best-effort stages held |
//! | [`run`] | one run of the apps: threads, channels, the release schedule, the records |
//! | [`session`] | `isolane run` of apps: checks, partitions, telemetry, live metrics, the files written |
//! | [`command`] | `isolane run` of apps from its flags: checked, admitted and placed, then run into its folder |
//! | [`workers`] | apps in `isolane worker` processes (MPS, time-slicing): the coordinator's side |
//! | [`metrics`] | records → summary.json's `apps` (paper 004's metrics), and the frames CSV |

pub mod command;
pub mod data;
pub mod metrics;
pub mod models;
pub mod ops;
pub mod partitions;
pub mod placement;
pub mod protection;
pub mod run;
pub mod scenario_file;
pub mod session;
pub mod source;
pub mod spec;
pub mod stage;
pub mod workers;
