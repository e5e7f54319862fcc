//! torchvision ResNet (v1.5: the stride sits on the 3×3 conv of a bottleneck), and the
//! dilated ResNet-50 backbone that FCN uses (`replace_stride_with_dilation=[False, True, True]`).

use super::Builder;
use crate::error::Result;
use crate::ir::{Op, Unary, ValueId};

const BN_EPS: f32 = 1e-5;

/// Body configuration.
pub(crate) struct ResNetBody<'a> {
    /// State-dict prefix ("" for classifiers, "backbone." inside FCN).
    pub prefix: &'a str,
    pub layers: [usize; 4],
    pub bottleneck: bool,
    /// replace_stride_with_dilation for layer2..layer4.
    pub dilate: [bool; 3],
}

/// Stem + layer1..layer4; returns the layer4 output.
pub(crate) fn body(b: &mut Builder, x: ValueId, cfg: &ResNetBody) -> Result<ValueId> {
    let p = cfg.prefix;
    let expansion = if cfg.bottleneck { 4 } else { 1 };
    // Synthetic weights: scale each residual branch's last BN by 1/sqrt(#blocks) so the
    // variance added by the branches sums to O(1) instead of doubling per block.
    let total: usize = cfg.layers.iter().sum();
    let branch_gamma = 1.0 / (total as f32).sqrt();
    let mut x = b.conv(x, &format!("{p}conv1"), 3, 64, 7, 2, 3, 1, 1, false)?;
    x = b.bn(x, &format!("{p}bn1"), 64, BN_EPS, 1.0)?;
    x = b.act(x, &format!("{p}relu"), Unary::Relu)?;
    x = b.max_pool(x, &format!("{p}maxpool"), 3, 2, 1)?;
    let mut inplanes = 64;
    let mut dilation = 1;
    for (li, (&planes, &blocks)) in [64usize, 128, 256, 512].iter().zip(&cfg.layers).enumerate() {
        let mut stride = if li == 0 { 1 } else { 2 };
        let previous_dilation = dilation;
        if li > 0 && cfg.dilate[li - 1] {
            dilation *= stride;
            stride = 1;
        }
        for bi in 0..blocks {
            let name = format!("{p}layer{}.{bi}", li + 1);
            let (s, d) = if bi == 0 {
                (stride, previous_dilation)
            } else {
                (1, dilation)
            };
            let downsample = bi == 0 && (stride != 1 || inplanes != planes * expansion);
            x = if cfg.bottleneck {
                bottleneck(
                    b,
                    x,
                    &name,
                    inplanes,
                    planes,
                    s,
                    d,
                    downsample,
                    branch_gamma,
                )?
            } else {
                basic(b, x, &name, inplanes, planes, s, downsample, branch_gamma)?
            };
            inplanes = planes * expansion;
        }
    }
    Ok(x)
}

#[allow(clippy::too_many_arguments)]
fn basic(
    b: &mut Builder,
    x: ValueId,
    name: &str,
    inplanes: usize,
    planes: usize,
    stride: usize,
    downsample: bool,
    gamma: f32,
) -> Result<ValueId> {
    let first = Conv {
        cin: inplanes,
        cout: planes,
        k: 3,
        stride,
        dilation: 1,
    };
    let mut y = conv_bn(b, x, name, 1, first, 1.0)?;
    y = b.act(y, &format!("{name}.relu1"), Unary::Relu)?;
    let second = Conv {
        cin: planes,
        stride: 1,
        ..first
    };
    y = conv_bn(b, y, name, 2, second, gamma)?;
    let identity = shortcut(b, x, name, inplanes, planes, stride, downsample)?;
    let s = b.add(&format!("{name}.add"), y, identity)?;
    b.act(s, &format!("{name}.relu2"), Unary::Relu)
}

#[allow(clippy::too_many_arguments)]
fn bottleneck(
    b: &mut Builder,
    x: ValueId,
    name: &str,
    inplanes: usize,
    planes: usize,
    stride: usize,
    dilation: usize,
    downsample: bool,
    gamma: f32,
) -> Result<ValueId> {
    let width = planes;
    let conv1x1 = |cin, cout| Conv {
        cin,
        cout,
        k: 1,
        stride: 1,
        dilation: 1,
    };
    let mut y = conv_bn(b, x, name, 1, conv1x1(inplanes, width), 1.0)?;
    y = b.act(y, &format!("{name}.relu1"), Unary::Relu)?;
    let middle = Conv {
        k: 3,
        stride,
        dilation,
        ..conv1x1(width, width)
    };
    y = conv_bn(b, y, name, 2, middle, 1.0)?;
    y = b.act(y, &format!("{name}.relu2"), Unary::Relu)?;
    y = conv_bn(b, y, name, 3, conv1x1(width, planes * 4), gamma)?;
    let identity = shortcut(b, x, name, inplanes, planes * 4, stride, downsample)?;
    let s = b.add(&format!("{name}.add"), y, identity)?;
    b.act(s, &format!("{name}.relu3"), Unary::Relu)
}

/// A bias-free `k × k` convolution in a block, padded to keep the size at stride 1.
#[derive(Clone, Copy)]
struct Conv {
    cin: usize,
    cout: usize,
    k: usize,
    stride: usize,
    dilation: usize,
}

/// Layer `i` of block `name`: the convolution `{name}.conv{i}` then `{name}.bn{i}` (its
/// synthetic scale `gamma`).
fn conv_bn(
    b: &mut Builder,
    x: ValueId,
    name: &str,
    i: usize,
    c: Conv,
    gamma: f32,
) -> Result<ValueId> {
    let pad = c.dilation * (c.k - 1) / 2;
    let conv = format!("{name}.conv{i}");
    let y = b.conv(
        x, &conv, c.cin, c.cout, c.k, c.stride, pad, c.dilation, 1, false,
    )?;
    b.bn(y, &format!("{name}.bn{i}"), c.cout, BN_EPS, gamma)
}

fn shortcut(
    b: &mut Builder,
    x: ValueId,
    name: &str,
    cin: usize,
    cout: usize,
    stride: usize,
    downsample: bool,
) -> Result<ValueId> {
    if !downsample {
        return Ok(x);
    }
    let d = b.conv(
        x,
        &format!("{name}.downsample.0"),
        cin,
        cout,
        1,
        stride,
        0,
        1,
        1,
        false,
    )?;
    b.bn(d, &format!("{name}.downsample.1"), cout, BN_EPS, 1.0)
}

fn classifier(b: &mut Builder, layers: [usize; 4], bottleneck: bool) -> Result<()> {
    let x = b.image_input(3, 224, 224);
    let cfg = ResNetBody {
        prefix: "",
        layers,
        bottleneck,
        dilate: [false; 3],
    };
    let mut y = body(b, x, &cfg)?;
    y = b.op("avgpool", Op::GlobalAveragePool, &[y])?;
    y = b.op("flatten", Op::Flatten { axis: 1 }, &[y])?;
    let c = if bottleneck { 2048 } else { 512 };
    y = b.linear(y, "fc", c, 1000, true)?;
    b.output(y)
}

pub(crate) fn resnet18(b: &mut Builder) -> Result<()> {
    classifier(b, [2, 2, 2, 2], false)
}

pub(crate) fn resnet50(b: &mut Builder) -> Result<()> {
    classifier(b, [3, 4, 6, 3], true)
}
