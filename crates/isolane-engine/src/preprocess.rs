//! An application's preprocessing: a camera frame (8-bit HWC, RGB or RGBA) into a model's input
//! (NCHW, one image): bilinear resize, an optional centre crop, per-channel normalisation.
//! This is the CPU reference; the cuda backend's kernel (`isolane_cuda::preprocess`) computes
//! every value with the same f32 operations, fused multiply-adds included, so the two agree
//! bit for bit in f32 (and after rounding to f16).
//!
//! Semantics, as torchvision's `Resize` (bilinear, no antialiasing) then `CenterCrop` then
//! `Normalize` on `ToTensor`'s [0, 1] values:
//! - resize: half-pixel centres, the source coordinate clamped to the image (where each output
//!   pixel reads is [`ResizeAttrs::source`], the engine's one definition for Resize);
//! - crop: the top (left) offset is `round((resized - crop) / 2)` with ties to even, as
//!   torchvision's `int(round(...))` in Python;
//! - normalise: `(v / 255 - mean) / std`, computed as `v · gain + bias` with
//!   `gain = 1 / (255 · std)` and `bias = -mean / std`.

use crate::ir::{CoordMode, NearestMode, ResizeAttrs, ResizeMode, ResizeSize};
use crate::{EngineError, Result};

/// ImageNet's channel means and standard deviations (torchvision's models).
pub const IMAGENET_MEAN: [f32; 3] = [0.485, 0.456, 0.406];
pub const IMAGENET_STD: [f32; 3] = [0.229, 0.224, 0.225];

/// A frame's layout: `height` rows of `width` pixels of `channels` bytes (3: RGB, 4: RGBA, the
/// alpha ignored), rows packed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FrameLayout {
    pub width: usize,
    pub height: usize,
    pub channels: usize,
}

impl FrameLayout {
    pub fn bytes(&self) -> usize {
        self.width * self.height * self.channels
    }
}

/// What the model wants.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct PreprocessSpec {
    /// Height and width after the resize.
    pub resize: [usize; 2],
    /// Height and width of the centre crop of the resized image (the model's input size);
    /// None: the resized image is the input.
    pub crop: Option<[usize; 2]>,
    pub mean: [f32; 3],
    pub std: [f32; 3],
}

impl PreprocessSpec {
    /// ImageNet normalisation with the given resize and crop.
    pub fn imagenet(resize: [usize; 2], crop: Option<[usize; 2]>) -> Self {
        Self {
            resize,
            crop,
            mean: IMAGENET_MEAN,
            std: IMAGENET_STD,
        }
    }

    /// The numbers both implementations work from, for frames of `frame`'s layout.
    pub fn plan(&self, frame: FrameLayout) -> Result<PreprocessPlan> {
        self.check(frame)?;
        let [resized_h, resized_w] = self.resize;
        let [out_h, out_w] = self.crop.unwrap_or(self.resize);
        let [scale_y, scale_x] =
            resize_attrs().coord_scales([frame.height, frame.width], self.resize);
        let gain = std::array::from_fn(|c| 1.0 / (255.0 * self.std[c]));
        let bias = std::array::from_fn(|c| -self.mean[c] / self.std[c]);
        Ok(PreprocessPlan {
            frame,
            resized: [resized_h, resized_w],
            out: [out_h, out_w],
            crop_offset: [
                centre_offset(resized_h, out_h),
                centre_offset(resized_w, out_w),
            ],
            scale: [scale_y, scale_x],
            gain,
            bias,
        })
    }

    fn check(&self, frame: FrameLayout) -> Result<()> {
        let bad = |msg: String| {
            Err(EngineError::InvalidArgument(format!(
                "preprocessing: {msg}"
            )))
        };
        if !matches!(frame.channels, 3 | 4) {
            return bad(format!(
                "frames have {} channels; 3 (RGB) or 4 (RGBA) are supported",
                frame.channels
            ));
        }
        if frame.width == 0 || frame.height == 0 {
            return bad(format!("the frame is {}x{}", frame.width, frame.height));
        }
        let [h, w] = self.resize;
        if h == 0 || w == 0 {
            return bad(format!("the resize is to {h}x{w}"));
        }
        if let Some([ch, cw]) = self.crop {
            if ch == 0 || cw == 0 || ch > h || cw > w {
                return bad(format!(
                    "the crop {ch}x{cw} does not fit in the resized {h}x{w}"
                ));
            }
        }
        // The kernel indexes with 32-bit integers and f32 coordinates (exact below 2^24).
        let limit = 1 << 24;
        let sides = [frame.width, frame.height, h, w];
        if sides.iter().any(|&s| s >= limit)
            || frame.bytes() > i32::MAX as usize
            || h * w * 3 > i32::MAX as usize
        {
            return bad("the frame or the resize is too large".to_string());
        }
        if self.std.iter().any(|s| !s.is_finite() || *s == 0.0)
            || self.mean.iter().any(|m| !m.is_finite())
        {
            return bad(format!(
                "mean {:?} and std {:?} must be finite, std non-zero",
                self.mean, self.std
            ));
        }
        Ok(())
    }
}

/// Everything the CPU reference and the kernel compute from, derived once from a spec and a
/// frame layout.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct PreprocessPlan {
    pub frame: FrameLayout,
    /// Height and width after the resize.
    pub resized: [usize; 2],
    /// Height and width of the output (the crop, or the resized image).
    pub out: [usize; 2],
    /// Top and left of the crop in the resized image.
    pub crop_offset: [usize; 2],
    /// Resize scales (resized / frame) of y and x, as the coordinate transform uses them.
    pub scale: [f32; 2],
    /// Per channel: `1 / (255 std)` and `-mean / std`.
    pub gain: [f32; 3],
    pub bias: [f32; 3],
}

impl PreprocessPlan {
    /// Values in the output: 3 · height · width (NCHW, one image).
    pub fn output_len(&self) -> usize {
        3 * self.out[0] * self.out[1]
    }
}

/// The resize every implementation follows: bilinear, half-pixel centres.
fn resize_attrs() -> ResizeAttrs {
    ResizeAttrs {
        mode: ResizeMode::Linear,
        coord: CoordMode::HalfPixel,
        nearest: NearestMode::Floor,
        size: ResizeSize::Size([0, 0]),
    }
}

/// `round((full - part) / 2)`, ties to even (Python's round, as torchvision's CenterCrop).
fn centre_offset(full: usize, part: usize) -> usize {
    let d = full - part;
    let half = d / 2;
    if d % 2 == 1 && half % 2 == 1 {
        half + 1
    } else {
        half
    }
}

/// The model input for `frame` (HWC bytes of the plan's layout): NCHW f32, one image.
pub fn preprocess(plan: &PreprocessPlan, frame: &[u8]) -> Result<Vec<f32>> {
    let mut out = vec![0f32; plan.output_len()];
    preprocess_into(plan, frame, &mut out)?;
    Ok(out)
}

/// [`preprocess`] into `out` (`plan.output_len()` values), allocating nothing: for a CPU
/// stage that runs it per job.
pub fn preprocess_into(plan: &PreprocessPlan, frame: &[u8], out: &mut [f32]) -> Result<()> {
    let bad = |what: &str, got: usize, want: usize| {
        Err(EngineError::InvalidArgument(format!(
            "preprocessing: the {what} has {got} values, the plan needs {want}"
        )))
    };
    if frame.len() != plan.frame.bytes() {
        return bad("frame", frame.len(), plan.frame.bytes());
    }
    if out.len() != plan.output_len() {
        return bad("output", out.len(), plan.output_len());
    }
    let attrs = resize_attrs();
    let FrameLayout {
        width,
        height,
        channels,
    } = plan.frame;
    let [out_h, out_w] = plan.out;
    let texel = |y: usize, x: usize, c: usize| f32::from(frame[(y * width + x) * channels + c]);
    for (c, plane) in out.chunks_exact_mut(out_h * out_w).enumerate() {
        for (oy, row) in plane.chunks_exact_mut(out_w).enumerate() {
            let (y0, y1, wy) = attrs.source(
                plan.crop_offset[0] + oy,
                height,
                plan.resized[0],
                plan.scale[0],
            );
            for (ox, value) in row.iter_mut().enumerate() {
                let (x0, x1, wx) = attrs.source(
                    plan.crop_offset[1] + ox,
                    width,
                    plan.resized[1],
                    plan.scale[1],
                );
                // The kernel's operations, in its order: fused multiply-adds throughout.
                let top = (texel(y0, x1, c) - texel(y0, x0, c)).mul_add(wx, texel(y0, x0, c));
                let bottom = (texel(y1, x1, c) - texel(y1, x0, c)).mul_add(wx, texel(y1, x0, c));
                let v = (bottom - top).mul_add(wy, top);
                *value = v.mul_add(plan.gain[c], plan.bias[c]);
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rgb(width: usize, height: usize) -> FrameLayout {
        FrameLayout {
            width,
            height,
            channels: 3,
        }
    }

    /// Mean 0, std 1/255: the output is the interpolated byte value itself.
    fn raw(resize: [usize; 2], crop: Option<[usize; 2]>) -> PreprocessSpec {
        PreprocessSpec {
            resize,
            crop,
            mean: [0.0; 3],
            std: [1.0 / 255.0; 3],
        }
    }

    #[test]
    fn identity_size_keeps_the_values_and_moves_channels_first() {
        // 2x2 RGB: pixel (y, x) has R = 10y + x, G = 100 + R, B = 200 + R.
        let frame: Vec<u8> = (0..4u8)
            .flat_map(|i| {
                [
                    10 * (i / 2) + i % 2,
                    100 + 10 * (i / 2) + i % 2,
                    200 + 10 * (i / 2) + i % 2,
                ]
            })
            .collect();
        let plan = raw([2, 2], None).plan(rgb(2, 2)).unwrap();
        let out = preprocess(&plan, &frame).unwrap();
        assert_eq!(
            out,
            [0.0, 1.0, 10.0, 11.0, 100.0, 101.0, 110.0, 111.0, 200.0, 201.0, 210.0, 211.0]
        );
    }

    #[test]
    fn upscaling_a_row_by_two_interpolates_at_half_pixel_centres() {
        // One row 0, 100 (grey) to four: sources x = (i + 0.5) / 2 - 0.5 = -0.25, 0.25, 0.75,
        // 1.25, clamped to [0, 1]: 0, 0.25, 0.75, 1 -> 0, 25, 75, 100.
        let frame = [0, 0, 0, 100, 100, 100];
        let plan = raw([1, 4], None).plan(rgb(2, 1)).unwrap();
        let out = preprocess(&plan, &frame).unwrap();
        assert_eq!(&out[..4], [0.0, 25.0, 75.0, 100.0]);
        assert_eq!(&out[4..8], &out[..4]);
    }

    #[test]
    fn downscaling_by_two_averages_each_square() {
        // 4x4 to 2x2: sources y, x = (i + 0.5) * 2 - 0.5 = 0.5, 2.5: the mean of each 2x2 block.
        let values: [u8; 16] = [
            0, 10, 20, 30, 40, 50, 60, 70, 80, 90, 100, 110, 120, 130, 140, 150,
        ];
        let frame: Vec<u8> = values.iter().flat_map(|&v| [v, v, v, 255]).collect();
        let plan = raw([2, 2], None)
            .plan(FrameLayout {
                width: 4,
                height: 4,
                channels: 4,
            })
            .unwrap();
        let out = preprocess(&plan, &frame).unwrap();
        assert_eq!(&out[..4], [25.0, 45.0, 105.0, 125.0]);
    }

    #[test]
    fn the_crop_takes_the_centre_with_ties_to_even() {
        assert_eq!(centre_offset(256, 224), 16);
        assert_eq!(centre_offset(5, 2), 2); // (5 - 2) / 2 = 1.5 -> 2
        assert_eq!(centre_offset(7, 2), 2); // 2.5 -> 2
        assert_eq!(centre_offset(4, 3), 0); // 0.5 -> 0
                                            // 4x1 row 0, 10, 20, 30 cropped to 2 columns: offset 1 -> 10, 20.
        let frame: Vec<u8> = [0u8, 10, 20, 30].iter().flat_map(|&v| [v, v, v]).collect();
        let plan = raw([1, 4], Some([1, 2])).plan(rgb(4, 1)).unwrap();
        assert_eq!(plan.crop_offset, [0, 1]);
        assert_eq!(&preprocess(&plan, &frame).unwrap()[..2], [10.0, 20.0]);
    }

    #[test]
    fn normalisation_by_hand() {
        // A 1x1 white pixel: (255 / 255 - mean) / std per channel.
        let plan = PreprocessSpec::imagenet([1, 1], None)
            .plan(rgb(1, 1))
            .unwrap();
        let out = preprocess(&plan, &[255, 255, 255]).unwrap();
        let expected = [
            (1.0 - 0.485) / 0.229,
            (1.0 - 0.456) / 0.224,
            (1.0 - 0.406) / 0.225,
        ];
        for (got, want) in out.iter().zip(expected) {
            assert!((got - want).abs() < 1e-5, "{got} vs {want}");
        }
        // Black: -mean / std.
        let out = preprocess(&plan, &[0, 0, 0]).unwrap();
        assert!((out[0] - (-0.485 / 0.229)).abs() < 1e-6);
    }

    #[test]
    fn bad_specs_and_frames_are_refused_with_the_reason() {
        let cases = [
            (
                raw([2, 2], None),
                FrameLayout {
                    width: 2,
                    height: 2,
                    channels: 1,
                },
                "channels",
            ),
            (raw([0, 2], None), rgb(2, 2), "resize"),
            (raw([2, 2], Some([3, 1])), rgb(2, 2), "crop"),
            (
                PreprocessSpec {
                    std: [0.0; 3],
                    ..raw([2, 2], None)
                },
                rgb(2, 2),
                "std",
            ),
            (raw([2, 2], None), rgb(0, 2), "frame"),
        ];
        for (spec, frame, word) in cases {
            let err = spec.plan(frame).unwrap_err().to_string();
            assert!(err.contains(word), "{err}");
        }
        let plan = raw([2, 2], None).plan(rgb(2, 2)).unwrap();
        let err = preprocess(&plan, &[0; 11]).unwrap_err().to_string();
        assert!(err.contains("frame has 11 values"), "{err}");
        let err = preprocess_into(&plan, &[0; 12], &mut [0.0; 5])
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("output has 5 values, the plan needs 12"),
            "{err}"
        );
    }
}
