//! What both front ends say about the server and its models, in the protocol's types: the
//! server metadata, a model's metadata and configuration, its repository index entry and the
//! size limits of its requests.

use isolane_protocol::{
    ConfigTensor, DataType, DynamicBatching, Limits, ModelConfig, ModelMetadata, ModelState,
    RepositoryIndexEntry, ServerMetadata, TensorMetadata,
};
use isolane_runtime::exec::TensorInfo;

use crate::ModelInfo;

/// The protocol extensions served (Triton's names, as clients look for them).
pub const EXTENSIONS: &[&str] = &[
    "binary_tensor_data",
    "classification",
    "model_repository",
    "statistics",
    "system_shared_memory",
];

pub fn server_metadata() -> ServerMetadata {
    ServerMetadata {
        name: "isolane".into(),
        version: env!("CARGO_PKG_VERSION").into(),
        extensions: EXTENSIONS.iter().map(|e| e.to_string()).collect(),
    }
}

/// The platform a model reports: isolane's engine on its backend.
pub fn platform(info: &ModelInfo) -> String {
    format!("isolane_{}", info.backend)
}

/// Metadata: shapes with `-1` for the batch dimension (any rows up to `max_batch`).
pub fn metadata(info: &ModelInfo) -> ModelMetadata {
    let tensors = |ts: &[TensorInfo]| {
        ts.iter()
            .map(|t| TensorMetadata {
                name: t.name.clone(),
                datatype: DataType::Fp32,
                shape: std::iter::once(-1)
                    .chain(t.shape.iter().skip(1).map(|&d| d as i64))
                    .collect(),
            })
            .collect()
    };
    ModelMetadata {
        name: info.name.clone(),
        versions: vec!["1".into()],
        platform: platform(info),
        inputs: tensors(&info.inputs),
        outputs: tensors(&info.outputs),
    }
}

/// Triton's model configuration: `max_batch_size` is the compiled batch, dims without it.
pub fn config(info: &ModelInfo) -> ModelConfig {
    let tensors = |ts: &[TensorInfo]| {
        ts.iter()
            .map(|t| ConfigTensor {
                name: t.name.clone(),
                data_type: DataType::Fp32,
                dims: t.shape.iter().skip(1).map(|&d| d as i64).collect(),
            })
            .collect()
    };
    ModelConfig {
        name: info.name.clone(),
        platform: platform(info),
        backend: "isolane".into(),
        max_batch_size: info.max_batch as u32,
        input: tensors(&info.inputs),
        output: tensors(&info.outputs),
        dynamic_batching: info.batching.as_ref().map(|b| DynamicBatching {
            preferred_batch_size: b.preferred.clone(),
            max_queue_delay_microseconds: (b.max_delay_ms * 1e3).round() as u64,
        }),
    }
}

pub fn index_entry(info: &ModelInfo, ready: bool) -> RepositoryIndexEntry {
    RepositoryIndexEntry {
        name: info.name.clone(),
        version: Some("1".into()),
        state: if ready {
            ModelState::Ready
        } else {
            ModelState::Unavailable
        },
        reason: if ready {
            String::new()
        } else {
            "the server is shutting down".into()
        },
    }
}

/// A request to `info` carries at most its full batch of inputs: the decoded tensors are
/// capped at that, and the body at 16 bytes of JSON per byte of tensor (a float written out in
/// full) plus 64 KiB of header, so that no request holds more memory than its model can use. An
/// input of more rows than the model's batch is refused for its batch (400), not its bytes.
pub fn limits(info: &ModelInfo) -> Limits {
    let tensor_bytes: u64 = info
        .inputs
        .iter()
        .map(|t| t.elements() as u64 * 4)
        .sum::<u64>()
        .max(4);
    let default = Limits::default();
    Limits {
        max_tensor_bytes: tensor_bytes.min(default.max_tensor_bytes),
        max_body_bytes: tensor_bytes
            .saturating_mul(16)
            .saturating_add(64 << 10)
            .min(default.max_body_bytes),
        max_batch: Some(info.max_batch.max(1) as u64),
    }
}
