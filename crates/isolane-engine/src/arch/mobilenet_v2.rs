//! torchvision MobileNetV2 (width 1.0): inverted residuals with ReLU6 and linear bottlenecks.

use super::{Builder, SameConv};
use crate::error::Result;
use crate::ir::{Op, Unary, ValueId};

const EPS: f32 = 1e-5;

/// Conv2dNormActivation: conv (no bias) + BN + ReLU6, named `prefix.0`, `prefix.1`.
#[allow(clippy::too_many_arguments)]
fn cna(
    b: &mut Builder,
    x: ValueId,
    prefix: &str,
    cin: usize,
    cout: usize,
    k: usize,
    stride: usize,
    groups: usize,
) -> Result<ValueId> {
    let c = SameConv {
        groups,
        ..SameConv::new(cin, cout, k, stride)
    };
    let (conv, bn) = (format!("{prefix}.0"), format!("{prefix}.1"));
    let y = b.conv_bn(x, [&conv, &bn], c, EPS, 1.0)?;
    b.act(y, &format!("{prefix}.2"), Unary::Relu6)
}

pub(crate) fn mobilenet_v2(b: &mut Builder) -> Result<()> {
    let x = b.image_input(3, 224, 224);
    let mut y = cna(b, x, "features.0", 3, 32, 3, 2, 1)?;
    let settings: [(usize, usize, usize, usize); 7] = [
        (1, 16, 1, 1),
        (6, 24, 2, 2),
        (6, 32, 3, 2),
        (6, 64, 4, 2),
        (6, 96, 3, 1),
        (6, 160, 3, 2),
        (6, 320, 1, 1),
    ];
    let blocks: usize = settings.iter().map(|s| s.2).sum();
    let gamma = 1.0 / (blocks as f32).sqrt();
    let mut cin = 32;
    let mut idx = 1;
    for (t, c, n, s) in settings {
        for i in 0..n {
            let stride = if i == 0 { s } else { 1 };
            let name = format!("features.{idx}.conv");
            let hidden = cin * t;
            let mut z = y;
            let mut j = 0;
            if t != 1 {
                z = cna(b, z, &format!("{name}.{j}"), cin, hidden, 1, 1, 1)?;
                j += 1;
            }
            z = cna(
                b,
                z,
                &format!("{name}.{j}"),
                hidden,
                hidden,
                3,
                stride,
                hidden,
            )?;
            // The linear bottleneck: no activation.
            let use_res = stride == 1 && cin == c;
            let (conv, bn) = (format!("{name}.{}", j + 1), format!("{name}.{}", j + 2));
            let project = SameConv::new(hidden, c, 1, 1);
            let bn_gamma = if use_res { gamma } else { 1.0 };
            z = b.conv_bn(z, [&conv, &bn], project, EPS, bn_gamma)?;
            y = if use_res {
                b.add(&format!("features.{idx}.add"), y, z)?
            } else {
                z
            };
            cin = c;
            idx += 1;
        }
    }
    y = cna(b, y, "features.18", 320, 1280, 1, 1, 1)?;
    y = b.op("avgpool", Op::GlobalAveragePool, &[y])?;
    y = b.op("flatten", Op::Flatten { axis: 1 }, &[y])?;
    // classifier.0 is Dropout(0.2): identity at inference.
    y = b.linear(y, "classifier.1", 1280, 1000, true)?;
    b.output(y)
}
