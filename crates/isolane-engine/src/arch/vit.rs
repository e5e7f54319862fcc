//! torchvision Vision Transformer: patch embedding conv, class token, learned position
//! embedding, pre-norm encoder blocks (nn.MultiheadAttention with packed in_proj, MLP with
//! exact GELU), final LayerNorm (eps 1e-6), class-token head.

use super::Builder;
use crate::error::Result;
use crate::ir::{Binary, Dim, Op, Tensor, Unary, ValueId};
use crate::weights::Init;

const EPS: f32 = 1e-6;

/// A ViT configuration.
#[derive(Clone, Copy, Debug)]
pub(crate) struct VitConfig {
    pub patch: usize,
    pub layers: usize,
    pub heads: usize,
    pub hidden: usize,
    pub mlp: usize,
}

impl VitConfig {
    pub const B16: VitConfig = VitConfig {
        patch: 16,
        layers: 12,
        heads: 12,
        hidden: 768,
        mlp: 3072,
    };
    pub const L32: VitConfig = VitConfig {
        patch: 32,
        layers: 24,
        heads: 16,
        hidden: 1024,
        mlp: 4096,
    };
}

fn attention(
    b: &mut Builder,
    x: ValueId,
    name: &str,
    cfg: VitConfig,
    seq: usize,
) -> Result<ValueId> {
    let (h, heads) = (cfg.hidden, cfg.heads);
    let hd = h / heads;
    let w = b.param(
        &format!("{name}.in_proj_weight"),
        &[3 * h, h],
        Init::lecun(h),
    )?;
    let bias = b.param(&format!("{name}.in_proj_bias"), &[3 * h], Init::small())?;
    let qkv = b.op(
        &format!("{name}.in_proj"),
        Op::Linear { activation: None },
        &[x, w, bias],
    )?;
    // [N, S, 3h] -> [N, S, 3, heads, hd] -> [3, N, heads, S, hd]
    let qkv = b.reshape(
        qkv,
        &format!("{name}.split_heads"),
        vec![
            Dim::Batch,
            Dim::Fixed(seq),
            Dim::Fixed(3),
            Dim::Fixed(heads),
            Dim::Fixed(hd),
        ],
    )?;
    let qkv = b.transpose(qkv, &format!("{name}.qkv_t"), &[2, 0, 3, 1, 4])?;
    let parts = b.op_multi(
        &format!("{name}.qkv"),
        Op::Split {
            axis: 0,
            sizes: vec![1, 1, 1],
        },
        &[qkv],
    )?;
    let sq = |b: &mut Builder, v: ValueId, n: &str| {
        b.op(&format!("{name}.{n}"), Op::Squeeze { axes: vec![0] }, &[v])
    };
    let q = sq(b, parts[0], "q")?;
    let k = sq(b, parts[1], "k")?;
    let v = sq(b, parts[2], "v")?;
    let scale = b.constant(
        &format!("{name}.scale"),
        Tensor::scalar(1.0 / (hd as f32).sqrt()),
    );
    let q = b.binary(&format!("{name}.q_scaled"), Binary::Mul, q, scale)?;
    let kt = b.transpose(k, &format!("{name}.k_t"), &[0, 1, 3, 2])?;
    let s = b.op(&format!("{name}.scores"), Op::MatMul, &[q, kt])?;
    let p = b.op(&format!("{name}.softmax"), Op::Softmax { axis: -1 }, &[s])?;
    let o = b.op(&format!("{name}.context"), Op::MatMul, &[p, v])?;
    let o = b.transpose(o, &format!("{name}.merge_t"), &[0, 2, 1, 3])?;
    let o = b.reshape(
        o,
        &format!("{name}.merge_heads"),
        vec![Dim::Batch, Dim::Fixed(seq), Dim::Fixed(h)],
    )?;
    b.linear(o, &format!("{name}.out_proj"), h, h, true)
}

pub(crate) fn vit(b: &mut Builder, cfg: VitConfig) -> Result<()> {
    let (img, h) = (224, cfg.hidden);
    let np = (img / cfg.patch) * (img / cfg.patch);
    let seq = np + 1;
    let x = b.image_input(3, img, img);
    let mut y = b.conv(x, "conv_proj", 3, h, cfg.patch, cfg.patch, 0, 1, 1, true)?;
    y = b.reshape(
        y,
        "patches",
        vec![Dim::Batch, Dim::Fixed(h), Dim::Fixed(np)],
    )?;
    y = b.transpose(y, "patches_t", &[0, 2, 1])?;
    let cls = b.param("class_token", &[1, 1, h], Init::Normal(0.02))?;
    let cls = b.op(
        "class_token_expand",
        Op::Expand {
            shape: vec![Dim::Batch, Dim::Fixed(1), Dim::Fixed(h)],
        },
        &[cls],
    )?;
    y = b.op("concat_class_token", Op::Concat { axis: 1 }, &[cls, y])?;
    let pos = b.param("encoder.pos_embedding", &[1, seq, h], Init::Normal(0.02))?;
    y = b.add("encoder.add_pos", y, pos)?;
    for i in 0..cfg.layers {
        let name = format!("encoder.layers.encoder_layer_{i}");
        let a = b.layer_norm(y, &format!("{name}.ln_1"), h, EPS)?;
        let a = attention(b, a, &format!("{name}.self_attention"), cfg, seq)?;
        y = b.add(&format!("{name}.add_1"), a, y)?;
        let m = b.layer_norm(y, &format!("{name}.ln_2"), h, EPS)?;
        let m = b.linear(m, &format!("{name}.mlp.0"), h, cfg.mlp, true)?;
        let m = b.act(m, &format!("{name}.mlp.1"), Unary::Gelu)?;
        let m = b.linear(m, &format!("{name}.mlp.3"), cfg.mlp, h, true)?;
        y = b.add(&format!("{name}.add_2"), y, m)?;
    }
    y = b.layer_norm(y, "encoder.ln", h, EPS)?;
    y = b.op(
        "class_token_out",
        Op::Gather {
            axis: 1,
            indices: vec![0],
            indices_shape: vec![],
        },
        &[y],
    )?;
    y = b.linear(y, "heads.head", h, 1000, true)?;
    b.output(y)
}
