//! torchvision `fcn_resnet50(aux_loss=False)`: dilated ResNet-50 backbone (output stride 8),
//! FCNHead, bilinear upsampling back to the input size (align_corners=False).

use super::resnet::{body, ResNetBody};
use super::{Builder, SameConv};
use crate::error::Result;
use crate::ir::{CoordMode, NearestMode, Op, ResizeAttrs, ResizeMode, ResizeSize, Unary};

pub(crate) fn fcn_resnet50(b: &mut Builder) -> Result<()> {
    // Pretrained torchvision checkpoints carry the auxiliary head; it is not part of this
    // model, so its tensors are ignored when loading.
    b.p.ignore_prefix("aux_classifier.");
    let (h, w) = (520, 520);
    let x = b.image_input(3, h, w);
    let cfg = ResNetBody {
        prefix: "backbone.",
        layers: [3, 4, 6, 3],
        bottleneck: true,
        dilate: [false, true, true],
    };
    let f = body(b, x, &cfg)?;
    let head = SameConv::new(2048, 512, 3, 1);
    let mut y = b.conv_bn(f, ["classifier.0", "classifier.1"], head, 1e-5, 1.0)?;
    y = b.act(y, "classifier.2", Unary::Relu)?;
    // classifier.3 is Dropout(0.1): identity at inference.
    y = b.conv(y, "classifier.4", 512, 21, 1, 1, 0, 1, 1, true)?;
    y = b.op(
        "upsample",
        Op::Resize(ResizeAttrs {
            mode: ResizeMode::Linear,
            coord: CoordMode::PytorchHalfPixel,
            nearest: NearestMode::Floor,
            size: ResizeSize::Size([h, w]),
        }),
        &[y],
    )?;
    b.output(y)
}
