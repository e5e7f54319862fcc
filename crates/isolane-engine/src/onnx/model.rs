//! Reading an ONNX file: protobuf decode, opset check, graph inputs, outputs and initializers.

use super::error::{OnnxError, Result};
use super::proto::{self, GraphProto, ModelProto};
use super::tensor::{self, Tensor};
use std::collections::HashMap;
use std::path::{Path, PathBuf};

/// The opsets of the default domain that the importer knows, op by op (see docs/onnx.md).
pub const MIN_OPSET: i64 = 7;
pub const MAX_OPSET: i64 = 21;

/// The largest ONNX file read: protobuf's own limit on a message (a larger model keeps its
/// weights in external data files, read by the range each tensor names).
pub const MAX_ONNX_FILE_BYTES: u64 = 2 << 30;

/// One dimension of a graph input as the file declares it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Dim {
    Fixed(usize),
    /// A symbolic (`dim_param`, e.g. "batch_size") or absent dimension.
    Dynamic(String),
}

/// A graph input that is not an initializer: what the user feeds.
#[derive(Debug, Clone, PartialEq)]
pub struct Input {
    pub name: String,
    pub dims: Vec<Dim>,
}

/// A decoded and checked ONNX model: the graph as protobuf plus its initializers decoded.
#[derive(Debug)]
pub struct OnnxModel {
    pub path: PathBuf,
    /// The opset of the default ("" / "ai.onnx") domain.
    pub opset: i64,
    pub ir_version: i64,
    pub producer: String,
    /// The graph as decoded, less its initializers (decoded into `initializers`).
    pub graph: GraphProto,
    pub inputs: Vec<Input>,
    pub outputs: Vec<String>,
    pub initializers: HashMap<String, Tensor>,
}

impl OnnxModel {
    /// Reads and checks `path`. Errors name the file.
    pub fn load(path: impl AsRef<Path>) -> Result<Self> {
        let path = path.as_ref();
        let model = {
            use prost::Message;
            // A regular file only, and no more than it holds: a device or a FIFO is refused.
            let bytes = isolane_core::files::read_file_capped(path, MAX_ONNX_FILE_BYTES).map_err(
                |source| OnnxError::Io {
                    path: path.to_path_buf(),
                    source,
                },
            )?;
            ModelProto::decode(bytes.as_slice()).map_err(|source| OnnxError::Decode {
                path: path.to_path_buf(),
                source,
            })?
            // The file's bytes are dropped here: a large model is not held twice.
        };
        Self::from_proto(model, path)
    }

    /// Decodes a model held in memory; `path` is used in messages and to find external data.
    pub fn from_bytes(bytes: &[u8], path: &Path) -> Result<Self> {
        use prost::Message;
        let model = ModelProto::decode(bytes).map_err(|source| OnnxError::Decode {
            path: path.to_path_buf(),
            source,
        })?;
        Self::from_proto(model, path)
    }

    pub fn from_proto(model: ModelProto, path: &Path) -> Result<Self> {
        let invalid = |what: String| OnnxError::Invalid {
            path: path.to_path_buf(),
            what,
        };
        // A file truncated on a field boundary still decodes; what is missing shows here.
        let mut opset = None;
        for o in &model.opset_import {
            if matches!(o.domain(), "" | "ai.onnx") {
                opset = Some(o.version());
            }
        }
        let opset = opset.ok_or_else(|| {
            invalid(
                "the model imports no opset of the default ONNX domain (truncated file, or not an ONNX model?)"
                    .into(),
            )
        })?;
        if !(MIN_OPSET..=MAX_OPSET).contains(&opset) {
            return Err(OnnxError::Opset {
                path: path.to_path_buf(),
                opset,
                min: MIN_OPSET,
                max: MAX_OPSET,
            });
        }
        let ir_version = model.ir_version();
        let producer = format!("{} {}", model.producer_name(), model.producer_version())
            .trim()
            .to_string();
        let graph = model.graph.ok_or_else(|| {
            invalid("the model has no graph (truncated file, or not an ONNX model?)".into())
        })?;
        if !graph.sparse_initializer.is_empty() {
            return Err(invalid("sparse initializers are not supported".into()));
        }

        let mut initializers = HashMap::with_capacity(graph.initializer.len());
        for t in &graph.initializer {
            let name = t.name().to_string();
            let mut ext = |t: &proto::TensorProto| tensor::read_external(path, t);
            // Checked before decoding: a second tensor of one name would silently replace the
            // first (which one a node reads would depend on the order).
            if initializers.contains_key(&name) {
                return Err(invalid(format!(
                    "initializer {name:?} is given twice; each initializer needs a name of its own"
                )));
            }
            let value = tensor::from_proto(t, &mut ext)
                .map_err(|e| OnnxError::from_tensor_error(path, &name, e))?;
            initializers.insert(name, value);
        }

        // The decoded initializers replace their protobuf form, which would otherwise keep a
        // second copy of every weight alive.
        let mut graph = graph;
        graph.initializer.clear();

        let mut inputs = Vec::new();
        let mut listed = std::collections::HashSet::new();
        for vi in &graph.input {
            if !listed.insert(vi.name()) {
                return Err(invalid(format!(
                    "graph input {:?} is listed twice; each graph input needs a name of its own",
                    vi.name()
                )));
            }
            // Before IR version 4 initializers were also listed as inputs; those are not fed.
            if initializers.contains_key(vi.name()) {
                continue;
            }
            inputs.push(Input {
                name: vi.name().to_string(),
                dims: input_dims(vi)
                    .map_err(|what| invalid(format!("graph input {:?}: {what}", vi.name())))?,
            });
        }
        if inputs.is_empty() {
            return Err(invalid("the graph has no input".into()));
        }
        let outputs: Vec<String> = graph.output.iter().map(|o| o.name().to_string()).collect();
        if outputs.is_empty() {
            return Err(invalid("the graph has no output (truncated file?)".into()));
        }
        Ok(OnnxModel {
            path: path.to_path_buf(),
            opset,
            ir_version,
            producer,
            graph,
            inputs,
            outputs,
            initializers,
        })
    }
}

fn input_dims(vi: &proto::ValueInfoProto) -> Result<Vec<Dim>, String> {
    use proto::tensor_shape_proto::dimension::Value;
    use proto::type_proto::Value as TV;
    let ty = vi
        .r#type
        .as_ref()
        .and_then(|t| t.value.as_ref())
        .ok_or("no type")?;
    let TV::TensorType(tt) = ty else {
        return Err("not a tensor (sequences, maps and optionals are not supported)".into());
    };
    use proto::tensor_proto::DataType as T;
    // float16/bfloat16 inputs (fp16-converted models) are fed float32 values: the engine's
    // storage; the arithmetic precision is `--precision`'s (docs/onnx.md).
    let float_types = [T::Float as i32, T::Float16 as i32, T::Bfloat16 as i32];
    if !float_types.contains(&tt.elem_type()) {
        let name = proto::tensor_proto::DataType::try_from(tt.elem_type())
            .map(|d| d.as_str_name().to_string())
            .unwrap_or_else(|_| tt.elem_type().to_string());
        return Err(format!(
            "element type {name}; isolane feeds float32, float16 and bfloat16 inputs only"
        ));
    }
    let shape = tt.shape.as_ref().ok_or("no shape (rank unknown)")?;
    shape
        .dim
        .iter()
        .enumerate()
        .map(|(i, d)| match &d.value {
            Some(Value::DimValue(v)) if *v >= 0 => Ok(Dim::Fixed(*v as usize)),
            // A negative size is a broken file, not a dynamic dimension: say so.
            Some(Value::DimValue(v)) => Err(format!(
                "dimension {i} is {v}; expected a size >= 0 or a named (dynamic) dimension"
            )),
            Some(Value::DimParam(p)) if !p.is_empty() => Ok(Dim::Dynamic(p.clone())),
            _ => Ok(Dim::Dynamic(format!("dim{i}"))),
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A model path linked to /dev/zero took all of memory, and a FIFO blocked for good: both
    /// are refused naming the file, before a byte is read.
    #[test]
    fn a_device_or_a_fifo_is_no_onnx_file() {
        let d = tempfile::tempdir().unwrap();
        let cases = isolane_core::files::a_device_and_a_fifo(d.path(), ".onnx");
        for (p, what) in &cases {
            let e = OnnxModel::load(p).unwrap_err().to_string();
            assert!(
                e.starts_with(&format!("cannot read ONNX file {}: is {what}", p.display())),
                "{e}"
            );
            let e = crate::onnx::import_file(p).unwrap_err().to_string();
            assert!(e.contains("not a regular file"), "{e}");
        }
    }
}
