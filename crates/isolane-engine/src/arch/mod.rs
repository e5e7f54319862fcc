//! Built-in architectures, written to match torchvision (and Ultralytics for YOLOv8) exactly:
//! same layer structure, same state-dict tensor names and shapes, same parameter counts, so a
//! state dict saved from PyTorch as safetensors loads by name.
//!
//! One file per family: `resnet.rs` (resnet18, resnet50, and the dilated ResNet-50 backbone
//! of FCN), `fcn.rs`, `mobilenet_v2.rs`, `convnext.rs`, `vit.rs`, `yolov8.rs`.

mod convnext;
mod fcn;
mod mobilenet_v2;
mod resnet;
mod vit;
mod yolov8;

use std::collections::HashSet;
use std::sync::Arc;

use crate::error::{EngineError, Result};
use crate::ir::{ConvAttrs, Dim, Graph, Op, PoolAttrs, Tensor, Unary, ValueId};
use crate::weights::{Init, ParamStore, Weights};

/// What `isolane models` shows about a built-in.
#[derive(Clone, Debug, PartialEq)]
pub struct ModelInfo {
    pub name: &'static str,
    /// Trainable parameters, as `sum(p.numel() for p in model.parameters())`.
    pub params: u64,
    /// Floating-point operations per image (2 × multiply-accumulates of convolutions and
    /// matrix products; elementwise work not counted), at `input_shape`.
    pub gflops_per_image: f64,
    /// Per-image input shape `[C, H, W]`.
    pub input_shape: [usize; 3],
    /// Per-image output shape.
    pub output_shape: &'static [usize],
    /// One line: what the model is and what its output means.
    pub description: &'static str,
}

static MODELS: &[ModelInfo] = &[
    ModelInfo {
        name: "resnet18",
        params: 11_689_512,
        gflops_per_image: 3.63,
        input_shape: [3, 224, 224],
        output_shape: &[1000],
        description: "torchvision resnet18; ImageNet logits",
    },
    ModelInfo {
        name: "resnet50",
        params: 25_557_032,
        gflops_per_image: 8.18,
        input_shape: [3, 224, 224],
        output_shape: &[1000],
        description: "torchvision resnet50 (v1.5); ImageNet logits",
    },
    ModelInfo {
        name: "mobilenet_v2",
        params: 3_504_872,
        gflops_per_image: 0.60,
        input_shape: [3, 224, 224],
        output_shape: &[1000],
        description: "torchvision mobilenet_v2; ImageNet logits",
    },
    ModelInfo {
        name: "convnext_base",
        params: 88_591_464,
        gflops_per_image: 30.71,
        input_shape: [3, 224, 224],
        output_shape: &[1000],
        description: "torchvision convnext_base; ImageNet logits",
    },
    ModelInfo {
        name: "convnext_large",
        params: 197_767_336,
        gflops_per_image: 68.72,
        input_shape: [3, 224, 224],
        output_shape: &[1000],
        description: "torchvision convnext_large; ImageNet logits",
    },
    ModelInfo {
        name: "vit_b_16",
        params: 86_567_656,
        gflops_per_image: 35.13,
        input_shape: [3, 224, 224],
        output_shape: &[1000],
        description: "torchvision vit_b_16; ImageNet logits",
    },
    ModelInfo {
        name: "vit_l_32",
        params: 306_535_400,
        gflops_per_image: 30.76,
        input_shape: [3, 224, 224],
        output_shape: &[1000],
        description: "torchvision vit_l_32; ImageNet logits",
    },
    ModelInfo {
        name: "fcn_resnet50",
        params: 32_957_013,
        gflops_per_image: 285.45,
        input_shape: [3, 520, 520],
        output_shape: &[21, 520, 520],
        description:
            "torchvision fcn_resnet50 without aux head; per-pixel logits of 21 VOC classes",
    },
    ModelInfo {
        name: "yolov8n",
        params: 3_157_200,
        gflops_per_image: 8.74,
        input_shape: [3, 640, 640],
        output_shape: &[84, 8400],
        description:
            "Ultralytics yolov8n; [cx, cy, w, h] in pixels + 80 class scores for 8400 anchors",
    },
];

/// The built-in models.
pub fn builtin_models() -> &'static [ModelInfo] {
    MODELS
}

/// Information about one built-in model.
pub fn model_info(name: &str) -> Option<&'static ModelInfo> {
    MODELS.iter().find(|m| m.name == name)
}

/// Builds a built-in model's graph (batch dimension symbolic) with the given weights.
pub fn build_model(name: &str, weights: Weights) -> Result<Graph> {
    Ok(build_model_counted(name, &weights)?.0)
}

/// Builds a model and returns its graph and its trainable-parameter count.
pub fn build_model_counted(name: &str, weights: &Weights) -> Result<(Graph, usize)> {
    let b = build(name, weights)?;
    b.finish()
}

/// A built-in model's state dict (parameters and BatchNorm buffers, by torchvision /
/// Ultralytics name) as the given weights define it.
pub fn state_dict(name: &str, weights: &Weights) -> Result<Vec<(String, Arc<Tensor>)>> {
    let b = build(name, weights)?;
    b.p.finish()?;
    Ok(b.state)
}

fn build(name: &str, weights: &Weights) -> Result<Builder> {
    let mut b = Builder::new(name, weights)?;
    match name {
        "resnet18" => resnet::resnet18(&mut b)?,
        "resnet50" => resnet::resnet50(&mut b)?,
        "mobilenet_v2" => mobilenet_v2::mobilenet_v2(&mut b)?,
        "convnext_base" => convnext::convnext(&mut b, &[128, 256, 512, 1024])?,
        "convnext_large" => convnext::convnext(&mut b, &[192, 384, 768, 1536])?,
        "vit_b_16" => vit::vit(&mut b, vit::VitConfig::B16)?,
        "vit_l_32" => vit::vit(&mut b, vit::VitConfig::L32)?,
        "fcn_resnet50" => fcn::fcn_resnet50(&mut b)?,
        "yolov8n" => yolov8::yolov8n(&mut b)?,
        _ => {
            return Err(EngineError::UnknownModel {
                name: name.to_string(),
                known: MODELS.iter().map(|m| m.name).collect::<Vec<_>>().join(", "),
            })
        }
    }
    Ok(b)
}

/// FLOPs per image of a graph (2 × MACs of Conv, Linear, MatMul, Gemm), at batch 1.
pub fn graph_flops(g: &Graph) -> Result<f64> {
    let shapes = g.infer_shapes(1)?;
    let mut macs = 0f64;
    for n in &g.nodes {
        let out: f64 = shapes[n.outputs[0]].iter().product::<usize>() as f64;
        macs += match &n.op {
            Op::Conv(_) => {
                let w = &shapes[n.inputs[1]];
                out * (w[1] * w[2] * w[3]) as f64
            }
            Op::Linear { .. } => out * shapes[n.inputs[1]][1] as f64,
            Op::MatMul | Op::Gemm { .. } => {
                let a = &shapes[n.inputs[0]];
                let k = if matches!(n.op, Op::Gemm { trans_a: true, .. }) {
                    a[0]
                } else {
                    a[a.len() - 1]
                };
                out * k as f64
            }
            _ => 0.0,
        };
    }
    Ok(2.0 * macs)
}

/// A bias-free `k × k` convolution (`k` odd) padded to keep the size at stride 1, as the
/// conv-BN blocks have it.
#[derive(Clone, Copy)]
pub(crate) struct SameConv {
    pub cin: usize,
    pub cout: usize,
    pub k: usize,
    pub stride: usize,
    pub dilation: usize,
    pub groups: usize,
}

impl SameConv {
    /// Dilation 1, one group.
    pub fn new(cin: usize, cout: usize, k: usize, stride: usize) -> Self {
        SameConv {
            cin,
            cout,
            k,
            stride,
            dilation: 1,
            groups: 1,
        }
    }
}

/// Graph-building helper shared by the architectures: creates parameters by state-dict name
/// and nodes with unique names.
pub(crate) struct Builder {
    pub g: Graph,
    pub p: ParamStore,
    names: HashSet<String>,
    /// State-dict tensors in creation order.
    state: Vec<(String, Arc<Tensor>)>,
}

impl Builder {
    fn new(name: &str, w: &Weights) -> Result<Self> {
        Ok(Builder {
            g: Graph::new(name),
            p: ParamStore::new(w)?,
            names: HashSet::new(),
            state: Vec::new(),
        })
    }

    fn finish(self) -> Result<(Graph, usize)> {
        self.p.finish()?;
        self.g.validate()?;
        Ok((self.g, self.p.params))
    }

    /// The image input `[N, c, h, w]`.
    pub fn image_input(&mut self, c: usize, h: usize, w: usize) -> ValueId {
        self.g.add_input(
            "input",
            vec![Dim::Batch, Dim::Fixed(c), Dim::Fixed(h), Dim::Fixed(w)],
        )
    }

    fn unique(&mut self, name: &str) -> String {
        if self.names.insert(name.to_string()) {
            return name.to_string();
        }
        let mut i = 1;
        loop {
            let n = format!("{name}_{i}");
            if self.names.insert(n.clone()) {
                return n;
            }
            i += 1;
        }
    }

    /// A node with one output.
    pub fn op(&mut self, name: &str, op: Op, inputs: &[ValueId]) -> Result<ValueId> {
        let n = self.unique(name);
        self.g.add_op(n, op, inputs)
    }

    /// A node with several outputs.
    pub fn op_multi(&mut self, name: &str, op: Op, inputs: &[ValueId]) -> Result<Vec<ValueId>> {
        let n = self.unique(name);
        self.g.add_node(n, op, inputs)
    }

    /// A counted parameter.
    pub fn param(&mut self, name: &str, shape: &[usize], init: Init) -> Result<ValueId> {
        let t = self.p.param(name, shape, init)?;
        Ok(self.state_tensor(name, t))
    }

    /// A buffer (not counted as a parameter) from the state dict.
    pub fn buffer(&mut self, name: &str, shape: &[usize], init: Init) -> Result<ValueId> {
        let t = self.p.buffer(name, shape, init)?;
        Ok(self.state_tensor(name, t))
    }

    fn state_tensor(&mut self, name: &str, t: Tensor) -> ValueId {
        let t = Arc::new(t);
        self.state.push((name.to_string(), t.clone()));
        self.g.add_shared_constant(name, t)
    }

    /// A fixed constant (not part of the state dict).
    pub fn constant(&mut self, name: &str, t: Tensor) -> ValueId {
        self.g.add_constant(name, t)
    }

    /// `nn.Conv2d` named `prefix` (`prefix.weight`, `prefix.bias`), Kaiming-initialised.
    #[allow(clippy::too_many_arguments)]
    pub fn conv(
        &mut self,
        x: ValueId,
        prefix: &str,
        cin: usize,
        cout: usize,
        k: usize,
        stride: usize,
        pad: usize,
        dilation: usize,
        groups: usize,
        bias: bool,
    ) -> Result<ValueId> {
        let fan_in = cin / groups * k * k;
        let w = self.param(
            &format!("{prefix}.weight"),
            &[cout, cin / groups, k, k],
            Init::kaiming(fan_in),
        )?;
        let mut ins = vec![x, w];
        if bias {
            ins.push(self.param(&format!("{prefix}.bias"), &[cout], Init::small())?);
        }
        self.op(
            prefix,
            Op::Conv(ConvAttrs {
                strides: [stride, stride],
                pads: [pad; 4],
                dilations: [dilation, dilation],
                groups,
                ..Default::default()
            }),
            &ins,
        )
    }

    /// The convolution `c` named `names[0]`, then `nn.BatchNorm2d` named `names[1]` (`eps`,
    /// synthetic scale `gamma`): the conv-BN pair of torchvision's and Ultralytics' blocks.
    pub fn conv_bn(
        &mut self,
        x: ValueId,
        names: [&str; 2],
        c: SameConv,
        eps: f32,
        gamma: f32,
    ) -> Result<ValueId> {
        let pad = c.dilation * (c.k - 1) / 2;
        let (cin, cout, k, stride) = (c.cin, c.cout, c.k, c.stride);
        let y = self.conv(
            x, names[0], cin, cout, k, stride, pad, c.dilation, c.groups, false,
        )?;
        self.bn(y, names[1], cout, eps, gamma)
    }

    /// `nn.BatchNorm2d` named `prefix`; `gamma` is the synthetic scale (1 for most layers,
    /// smaller on the last BN of a residual branch so that deep residual stacks keep their
    /// activations in range with synthetic weights).
    pub fn bn(
        &mut self,
        x: ValueId,
        prefix: &str,
        c: usize,
        eps: f32,
        gamma: f32,
    ) -> Result<ValueId> {
        let w = self.param(
            &format!("{prefix}.weight"),
            &[c],
            Init::NormalAround(gamma, 0.05 * gamma),
        )?;
        let b = self.param(&format!("{prefix}.bias"), &[c], Init::Normal(0.02))?;
        let m = self.buffer(&format!("{prefix}.running_mean"), &[c], Init::Normal(0.02))?;
        let v = self.buffer(
            &format!("{prefix}.running_var"),
            &[c],
            Init::Uniform(0.9, 1.1),
        )?;
        self.op(prefix, Op::BatchNorm { eps }, &[x, w, b, m, v])
    }

    /// `nn.Linear` named `prefix` (weight `[out, in]`).
    pub fn linear(
        &mut self,
        x: ValueId,
        prefix: &str,
        fin: usize,
        fout: usize,
        bias: bool,
    ) -> Result<ValueId> {
        let w = self.param(&format!("{prefix}.weight"), &[fout, fin], Init::lecun(fin))?;
        let mut ins = vec![x, w];
        if bias {
            ins.push(self.param(&format!("{prefix}.bias"), &[fout], Init::small())?);
        }
        self.op(prefix, Op::Linear { activation: None }, &ins)
    }

    /// `nn.LayerNorm(dim)` over the last axis, named `prefix`.
    pub fn layer_norm(
        &mut self,
        x: ValueId,
        prefix: &str,
        dim: usize,
        eps: f32,
    ) -> Result<ValueId> {
        let w = self.param(
            &format!("{prefix}.weight"),
            &[dim],
            Init::NormalAround(1.0, 0.05),
        )?;
        let b = self.param(&format!("{prefix}.bias"), &[dim], Init::Normal(0.02))?;
        self.op(prefix, Op::LayerNorm { axis: -1, eps }, &[x, w, b])
    }

    pub fn act(&mut self, x: ValueId, name: &str, u: Unary) -> Result<ValueId> {
        self.op(name, Op::Unary(u), &[x])
    }

    pub fn binary(
        &mut self,
        name: &str,
        op: crate::ir::Binary,
        a: ValueId,
        b: ValueId,
    ) -> Result<ValueId> {
        self.op(name, Op::Binary(op), &[a, b])
    }

    pub fn add(&mut self, name: &str, a: ValueId, b: ValueId) -> Result<ValueId> {
        self.binary(name, crate::ir::Binary::Add, a, b)
    }

    pub fn max_pool(
        &mut self,
        x: ValueId,
        name: &str,
        k: usize,
        stride: usize,
        pad: usize,
    ) -> Result<ValueId> {
        self.op(
            name,
            Op::MaxPool(PoolAttrs {
                kernel: [k, k],
                strides: [stride, stride],
                pads: [pad; 4],
                ..Default::default()
            }),
            &[x],
        )
    }

    pub fn transpose(&mut self, x: ValueId, name: &str, perm: &[usize]) -> Result<ValueId> {
        self.op(
            name,
            Op::Transpose {
                perm: perm.to_vec(),
            },
            &[x],
        )
    }

    pub fn reshape(&mut self, x: ValueId, name: &str, shape: Vec<Dim>) -> Result<ValueId> {
        self.op(name, Op::Reshape { shape }, &[x])
    }

    pub fn output(&mut self, v: ValueId) -> Result<()> {
        self.g.add_output(v)
    }
}
