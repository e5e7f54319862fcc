//! torchvision ResNet (v1.5: the stride sits on the 3×3 conv of a bottleneck), and the
//! dilated ResNet-50 backbone that FCN uses (`replace_stride_with_dilation=[False, True, True]`).

use super::{Builder, SameConv};
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
    let (conv, bn) = (format!("{p}conv1"), format!("{p}bn1"));
    let mut x = b.conv_bn(x, [&conv, &bn], SameConv::new(3, 64, 7, 2), BN_EPS, 1.0)?;
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
    let mut y = conv_bn(
        b,
        x,
        name,
        1,
        SameConv::new(inplanes, planes, 3, stride),
        1.0,
    )?;
    y = b.act(y, &format!("{name}.relu1"), Unary::Relu)?;
    y = conv_bn(b, y, name, 2, SameConv::new(planes, planes, 3, 1), gamma)?;
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
    let mut y = conv_bn(b, x, name, 1, SameConv::new(inplanes, width, 1, 1), 1.0)?;
    y = b.act(y, &format!("{name}.relu1"), Unary::Relu)?;
    let middle = SameConv {
        dilation,
        ..SameConv::new(width, width, 3, stride)
    };
    y = conv_bn(b, y, name, 2, middle, 1.0)?;
    y = b.act(y, &format!("{name}.relu2"), Unary::Relu)?;
    y = conv_bn(b, y, name, 3, SameConv::new(width, planes * 4, 1, 1), gamma)?;
    let identity = shortcut(b, x, name, inplanes, planes * 4, stride, downsample)?;
    let s = b.add(&format!("{name}.add"), y, identity)?;
    b.act(s, &format!("{name}.relu3"), Unary::Relu)
}

/// Layer `i` of block `name`: the convolution `{name}.conv{i}` then `{name}.bn{i}` (its
/// synthetic scale `gamma`).
fn conv_bn(
    b: &mut Builder,
    x: ValueId,
    name: &str,
    i: usize,
    c: SameConv,
    gamma: f32,
) -> Result<ValueId> {
    let (conv, bn) = (format!("{name}.conv{i}"), format!("{name}.bn{i}"));
    b.conv_bn(x, [&conv, &bn], c, BN_EPS, gamma)
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
    let (conv, bn) = (
        format!("{name}.downsample.0"),
        format!("{name}.downsample.1"),
    );
    let c = SameConv::new(cin, cout, 1, stride);
    b.conv_bn(x, [&conv, &bn], c, BN_EPS, 1.0)
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
