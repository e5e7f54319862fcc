//! Ultralytics YOLOv8n (`yolov8n.yaml`, depth 0.33, width 0.25): Conv(+BN eps 1e-3 + SiLU),
//! C2f, SPPF, nearest 2× upsampling, PAN neck, and the Detect head with its inference-time
//! decode: DFL (softmax over 16 bins, expectation via the fixed `dfl.conv`), distances to
//! boxes around the anchor points, × stride, and sigmoid class scores. Output
//! `[N, 84, 8400]` for 640×640: rows 0..4 are `cx, cy, w, h` in input pixels, rows 4..84 the
//! 80 class probabilities — exactly Ultralytics' `model(x)[0]` in eval mode.

use super::{Builder, SameConv};
use crate::error::Result;
use crate::ir::{
    Binary, CoordMode, Dim, NearestMode, Op, ResizeAttrs, ResizeMode, ResizeSize, Tensor, Unary,
    ValueId,
};
use crate::weights::Init;

const EPS: f32 = 1e-3;
const NC: usize = 80;
const REG_MAX: usize = 16;
const IMG: usize = 640;

/// Ultralytics `Conv`: conv (no bias, pad k/2) + BN + SiLU; names `prefix.conv`, `prefix.bn`.
fn conv(
    b: &mut Builder,
    x: ValueId,
    prefix: &str,
    cin: usize,
    cout: usize,
    k: usize,
    s: usize,
) -> Result<ValueId> {
    let (conv, bn) = (format!("{prefix}.conv"), format!("{prefix}.bn"));
    let y = b.conv_bn(x, [&conv, &bn], SameConv::new(cin, cout, k, s), EPS, 1.0)?;
    b.act(y, &format!("{prefix}.act"), Unary::Silu)
}

/// Ultralytics `C2f(c1, c2, n, shortcut)` with e = 0.5.
fn c2f(
    b: &mut Builder,
    x: ValueId,
    prefix: &str,
    c1: usize,
    c2: usize,
    n: usize,
    shortcut: bool,
) -> Result<ValueId> {
    let c = c2 / 2;
    let y = conv(b, x, &format!("{prefix}.cv1"), c1, 2 * c, 1, 1)?;
    let halves = b.op_multi(
        &format!("{prefix}.chunk"),
        Op::Split {
            axis: 1,
            sizes: vec![c, c],
        },
        &[y],
    )?;
    let mut ys = halves.clone();
    let mut last = halves[1];
    for i in 0..n {
        let m = format!("{prefix}.m.{i}");
        let mut z = conv(b, last, &format!("{m}.cv1"), c, c, 3, 1)?;
        z = conv(b, z, &format!("{m}.cv2"), c, c, 3, 1)?;
        if shortcut {
            z = b.add(&format!("{m}.add"), last, z)?;
        }
        ys.push(z);
        last = z;
    }
    let cat = b.op(&format!("{prefix}.cat"), Op::Concat { axis: 1 }, &ys)?;
    conv(b, cat, &format!("{prefix}.cv2"), (2 + n) * c, c2, 1, 1)
}

/// Ultralytics `SPPF(c1, c2, k=5)`.
fn sppf(b: &mut Builder, x: ValueId, prefix: &str, c1: usize, c2: usize) -> Result<ValueId> {
    let c = c1 / 2;
    let mut y = conv(b, x, &format!("{prefix}.cv1"), c1, c, 1, 1)?;
    let mut ys = vec![y];
    for i in 0..3 {
        y = b.max_pool(y, &format!("{prefix}.m{i}"), 5, 1, 2)?;
        ys.push(y);
    }
    let cat = b.op(&format!("{prefix}.cat"), Op::Concat { axis: 1 }, &ys)?;
    conv(b, cat, &format!("{prefix}.cv2"), 4 * c, c2, 1, 1)
}

fn upsample(b: &mut Builder, x: ValueId, name: &str) -> Result<ValueId> {
    b.op(
        name,
        Op::Resize(ResizeAttrs {
            mode: ResizeMode::Nearest,
            coord: CoordMode::Asymmetric,
            nearest: NearestMode::Floor,
            size: ResizeSize::Scales([2.0, 2.0]),
        }),
        &[x],
    )
}

fn cat(b: &mut Builder, name: &str, xs: &[ValueId]) -> Result<ValueId> {
    b.op(name, Op::Concat { axis: 1 }, xs)
}

pub(crate) fn yolov8n(b: &mut Builder) -> Result<()> {
    let x = b.image_input(3, IMG, IMG);
    // Backbone.
    let x0 = conv(b, x, "model.0", 3, 16, 3, 2)?;
    let x1 = conv(b, x0, "model.1", 16, 32, 3, 2)?;
    let x2 = c2f(b, x1, "model.2", 32, 32, 1, true)?;
    let x3 = conv(b, x2, "model.3", 32, 64, 3, 2)?;
    let x4 = c2f(b, x3, "model.4", 64, 64, 2, true)?;
    let x5 = conv(b, x4, "model.5", 64, 128, 3, 2)?;
    let x6 = c2f(b, x5, "model.6", 128, 128, 2, true)?;
    let x7 = conv(b, x6, "model.7", 128, 256, 3, 2)?;
    let x8 = c2f(b, x7, "model.8", 256, 256, 1, true)?;
    let x9 = sppf(b, x8, "model.9", 256, 256)?;
    // Neck.
    let x10 = upsample(b, x9, "model.10")?;
    let x11 = cat(b, "model.11", &[x10, x6])?;
    let x12 = c2f(b, x11, "model.12", 384, 128, 1, false)?;
    let x13 = upsample(b, x12, "model.13")?;
    let x14 = cat(b, "model.14", &[x13, x4])?;
    let x15 = c2f(b, x14, "model.15", 192, 64, 1, false)?;
    let x16 = conv(b, x15, "model.16", 64, 64, 3, 2)?;
    let x17 = cat(b, "model.17", &[x16, x12])?;
    let x18 = c2f(b, x17, "model.18", 192, 128, 1, false)?;
    let x19 = conv(b, x18, "model.19", 128, 128, 3, 2)?;
    let x20 = cat(b, "model.20", &[x19, x9])?;
    let x21 = c2f(b, x20, "model.21", 384, 256, 1, false)?;
    let y = detect(b, &[(x15, 64, 8), (x18, 128, 16), (x21, 256, 32)])?;
    b.output(y)
}

/// Detect head; `levels`: (feature, channels, stride).
fn detect(b: &mut Builder, levels: &[(ValueId, usize, usize)]) -> Result<ValueId> {
    let p = "model.22";
    let c2 = 16usize.max(levels[0].1 / 4).max(REG_MAX * 4);
    let c3 = levels[0].1.max(NC.min(100));
    let no = NC + 4 * REG_MAX;
    let mut flat = Vec::new();
    let mut anchors_x = Vec::new();
    let mut anchors_y = Vec::new();
    let mut strides = Vec::new();
    for (i, &(x, ch, stride)) in levels.iter().enumerate() {
        let mut bx = conv(b, x, &format!("{p}.cv2.{i}.0"), ch, c2, 3, 1)?;
        bx = conv(b, bx, &format!("{p}.cv2.{i}.1"), c2, c2, 3, 1)?;
        bx = b.conv(
            bx,
            &format!("{p}.cv2.{i}.2"),
            c2,
            4 * REG_MAX,
            1,
            1,
            0,
            1,
            1,
            true,
        )?;
        let mut cl = conv(b, x, &format!("{p}.cv3.{i}.0"), ch, c3, 3, 1)?;
        cl = conv(b, cl, &format!("{p}.cv3.{i}.1"), c3, c3, 3, 1)?;
        cl = b.conv(cl, &format!("{p}.cv3.{i}.2"), c3, NC, 1, 1, 0, 1, 1, true)?;
        let both = cat(b, &format!("{p}.cat.{i}"), &[bx, cl])?;
        let hw = IMG / stride;
        flat.push(b.reshape(
            both,
            &format!("{p}.view.{i}"),
            vec![Dim::Batch, Dim::Fixed(no), Dim::Fixed(hw * hw)],
        )?);
        // make_anchors: cell centres (x + 0.5, y + 0.5), row-major over (y, x).
        for yy in 0..hw {
            for xx in 0..hw {
                anchors_x.push(xx as f32 + 0.5);
                anchors_y.push(yy as f32 + 0.5);
                strides.push(stride as f32);
            }
        }
    }
    let a = anchors_x.len();
    let x_cat = b.op(&format!("{p}.x_cat"), Op::Concat { axis: 2 }, &flat)?;
    let parts = b.op_multi(
        &format!("{p}.split"),
        Op::Split {
            axis: 1,
            sizes: vec![4 * REG_MAX, NC],
        },
        &[x_cat],
    )?;
    let (bx, cl) = (parts[0], parts[1]);
    // DFL: view(b, 4, 16, a).transpose(2, 1).softmax(1) -> conv 16->1 -> view(b, 4, a).
    let mut d = b.reshape(
        bx,
        &format!("{p}.dfl.view"),
        vec![
            Dim::Batch,
            Dim::Fixed(4),
            Dim::Fixed(REG_MAX),
            Dim::Fixed(a),
        ],
    )?;
    d = b.transpose(d, &format!("{p}.dfl.transpose"), &[0, 2, 1, 3])?;
    d = b.op(&format!("{p}.dfl.softmax"), Op::Softmax { axis: 1 }, &[d])?;
    let w = b.param(
        &format!("{p}.dfl.conv.weight"),
        &[1, REG_MAX, 1, 1],
        Init::Arange,
    )?;
    d = b.op(
        &format!("{p}.dfl.conv"),
        Op::Conv(Default::default()),
        &[d, w],
    )?;
    d = b.reshape(
        d,
        &format!("{p}.dfl.out"),
        vec![Dim::Batch, Dim::Fixed(4), Dim::Fixed(a)],
    )?;
    // dist2bbox(xywh=True): lt, rb = chunk(2); x1y1 = anchor - lt; x2y2 = anchor + rb.
    let lr = b.op_multi(
        &format!("{p}.dist.chunk"),
        Op::Split {
            axis: 1,
            sizes: vec![2, 2],
        },
        &[d],
    )?;
    let mut anchors = anchors_x;
    anchors.extend(anchors_y);
    let anchors = b.constant(
        &format!("{p}.anchors"),
        Tensor::new(vec![1, 2, a], anchors)?,
    );
    let x1y1 = b.binary(&format!("{p}.x1y1"), Binary::Sub, anchors, lr[0])?;
    let x2y2 = b.binary(&format!("{p}.x2y2"), Binary::Add, anchors, lr[1])?;
    let sum = b.add(&format!("{p}.c_sum"), x1y1, x2y2)?;
    let two = b.constant(&format!("{p}.two"), Tensor::scalar(2.0));
    let cxy = b.binary(&format!("{p}.c_xy"), Binary::Div, sum, two)?;
    let wh = b.binary(&format!("{p}.wh"), Binary::Sub, x2y2, x1y1)?;
    let dbox = cat(b, &format!("{p}.xywh"), &[cxy, wh])?;
    let st = b.constant(&format!("{p}.strides"), Tensor::new(vec![1, a], strides)?);
    let dbox = b.binary(&format!("{p}.scale"), Binary::Mul, dbox, st)?;
    let cls = b.act(cl, &format!("{p}.sigmoid"), Unary::Sigmoid)?;
    cat(b, &format!("{p}.out"), &[dbox, cls])
}
