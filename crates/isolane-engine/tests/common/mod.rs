//! ONNX models built in memory, and the error measure, shared by the import tests.
#![allow(dead_code)] // each test module uses part of it

use isolane_engine::onnx::proto::{
    tensor_proto::DataType, tensor_shape_proto, type_proto, GraphProto, ModelProto,
    OperatorSetIdProto, TensorShapeProto, TypeProto, ValueInfoProto,
};

/// A graph input or output `name`: a tensor of `elem` with the fixed sizes `dims`.
pub fn value_info(name: &str, elem: DataType, dims: &[i64]) -> ValueInfoProto {
    let dim = dims
        .iter()
        .map(|&d| tensor_shape_proto::Dimension {
            value: Some(tensor_shape_proto::dimension::Value::DimValue(d)),
            ..Default::default()
        })
        .collect();
    ValueInfoProto {
        name: Some(name.into()),
        r#type: Some(TypeProto {
            value: Some(type_proto::Value::TensorType(type_proto::Tensor {
                elem_type: Some(elem as i32),
                shape: Some(TensorShapeProto { dim }),
            })),
            ..Default::default()
        }),
        ..Default::default()
    }
}

/// `graph` as a model of the default domain's opset 17 (IR version 8).
pub fn model(graph: GraphProto) -> ModelProto {
    ModelProto {
        ir_version: Some(8),
        opset_import: vec![OperatorSetIdProto {
            domain: Some(String::new()),
            version: Some(17),
        }],
        graph: Some(graph),
        ..Default::default()
    }
}

/// Relative L2 distance of `a` from the reference `b`.
pub fn rel_l2(a: &[f32], b: &[f32]) -> f64 {
    let (mut num, mut den) = (0f64, 0f64);
    for (x, y) in a.iter().zip(b) {
        num += (*x as f64 - *y as f64).powi(2);
        den += (*y as f64).powi(2);
    }
    (num / den.max(1e-30)).sqrt()
}
