//! torchvision ConvNeXt (base / large): patchify stem, CNBlocks (7×7 depthwise conv,
//! channels-last LayerNorm, MLP with exact GELU, layer scale), LayerNorm2d + 2×2 conv
//! downsampling, and a LayerNorm2d → Flatten → Linear head. Stochastic depth is the identity
//! at inference.

use super::Builder;
use crate::error::Result;
use crate::ir::{Binary, Dim, Op, Unary, ValueId};
use crate::weights::Init;

const EPS: f32 = 1e-6;
const NCHW_TO_NHWC: [usize; 4] = [0, 2, 3, 1];
const NHWC_TO_NCHW: [usize; 4] = [0, 3, 1, 2];

/// torchvision's LayerNorm2d: permute to channels-last, LayerNorm over C, permute back.
fn layer_norm_2d(b: &mut Builder, x: ValueId, prefix: &str, c: usize) -> Result<ValueId> {
    let t = b.transpose(x, &format!("{prefix}.to_nhwc"), &NCHW_TO_NHWC)?;
    let t = b.layer_norm(t, prefix, c, EPS)?;
    b.transpose(t, &format!("{prefix}.to_nchw"), &NHWC_TO_NCHW)
}

fn block(b: &mut Builder, x: ValueId, name: &str, dim: usize) -> Result<ValueId> {
    let mut y = b.conv(
        x,
        &format!("{name}.block.0"),
        dim,
        dim,
        7,
        1,
        3,
        1,
        dim,
        true,
    )?;
    y = b.transpose(y, &format!("{name}.block.1"), &NCHW_TO_NHWC)?;
    y = b.layer_norm(y, &format!("{name}.block.2"), dim, EPS)?;
    y = b.linear(y, &format!("{name}.block.3"), dim, 4 * dim, true)?;
    y = b.act(y, &format!("{name}.block.4"), Unary::Gelu)?;
    y = b.linear(y, &format!("{name}.block.5"), 4 * dim, dim, true)?;
    y = b.transpose(y, &format!("{name}.block.6"), &NHWC_TO_NCHW)?;
    // torchvision initialises layer_scale to 1e-6; synthetic weights use a larger scale so
    // that the blocks contribute visibly to the output (a better correctness check).
    let ls = b.param(
        &format!("{name}.layer_scale"),
        &[dim, 1, 1],
        Init::NormalAround(0.2, 0.02),
    )?;
    y = b.binary(&format!("{name}.scale"), Binary::Mul, ls, y)?;
    b.add(&format!("{name}.add"), y, x)
}

/// `dims`: channels of the four stages; depths are 3, 3, 27, 3 for base and large.
pub(crate) fn convnext(b: &mut Builder, dims: &[usize; 4]) -> Result<()> {
    let depths = [3usize, 3, 27, 3];
    let x = b.image_input(3, 224, 224);
    let mut y = b.conv(x, "features.0.0", 3, dims[0], 4, 4, 0, 1, 1, true)?;
    y = layer_norm_2d(b, y, "features.0.1", dims[0])?;
    let mut idx = 1;
    for stage in 0..4 {
        for i in 0..depths[stage] {
            y = block(b, y, &format!("features.{idx}.{i}"), dims[stage])?;
        }
        idx += 1;
        if stage < 3 {
            y = layer_norm_2d(b, y, &format!("features.{idx}.0"), dims[stage])?;
            y = b.conv(
                y,
                &format!("features.{idx}.1"),
                dims[stage],
                dims[stage + 1],
                2,
                2,
                0,
                1,
                1,
                true,
            )?;
            idx += 1;
        }
    }
    y = b.op("avgpool", Op::GlobalAveragePool, &[y])?;
    // classifier.0 is LayerNorm2d on [N, C, 1, 1]: identical to a LayerNorm over C after
    // flattening, which avoids two transposes.
    y = b.reshape(y, "classifier.1", vec![Dim::Batch, Dim::Fixed(dims[3])])?;
    y = b.layer_norm(y, "classifier.0", dims[3], EPS)?;
    y = b.linear(y, "classifier.2", dims[3], 1000, true)?;
    b.output(y)
}
