//! Frame → model input: crop, bilinear resize, `(v/255 − mean) / std`, HWC u8 → NCHW f32
//! (values rounded to f16 for `dtype = "f16"`).

use crate::data::{Frame, FrameMap, Tensor};
#[cfg(test)]
use crate::spec::PreprocessDevice;
use crate::spec::{Dtype, PreprocessSpec};

/// A preprocess with its output size resolved (`size`, or the input of the model it feeds).
#[derive(Debug, Clone, PartialEq)]
pub struct Preprocess {
    pub width: u32,
    pub height: u32,
    pub spec: PreprocessSpec,
}

#[derive(Debug, thiserror::Error, PartialEq)]
#[error("crop [{x}, {y}, {w}, {h}] does not fit the {fw}x{fh} frame")]
pub struct CropOutside {
    x: u32,
    y: u32,
    w: u32,
    h: u32,
    fw: u32,
    fh: u32,
}

impl Preprocess {
    /// `[1, 3, height, width]`, with the map from its pixels back to the frame's.
    pub fn run(&self, frame: &Frame) -> Result<Tensor, CropOutside> {
        let [cx, cy, cw, ch] = self.crop_of(frame)?;
        let (ow, oh) = (self.width as usize, self.height as usize);
        let map = self.frame_map([cx, cy, cw, ch]);
        let (sx, sy) = (map.scale_x, map.scale_y);
        let plane = ow * oh;
        let mut data = vec![0f32; 3 * plane];
        let xs = taps(ow, sx, cx, cw);
        let ys = taps(oh, sy, cy, ch);
        let scale: [f32; 3] = std::array::from_fn(|c| 1.0 / (255.0 * self.spec.std[c]));
        let shift: [f32; 3] = std::array::from_fn(|c| self.spec.mean[c] / self.spec.std[c]);
        let row = frame.width as usize * 3;
        for (oy, &(y0, y1, fy)) in ys.iter().enumerate() {
            for (ox, &(x0, x1, fx)) in xs.iter().enumerate() {
                for c in 0..3 {
                    let at = |x: usize, y: usize| frame.rgb[y * row + x * 3 + c] as f32;
                    let top = at(x0, y0) * (1.0 - fx) + at(x1, y0) * fx;
                    let bottom = at(x0, y1) * (1.0 - fx) + at(x1, y1) * fx;
                    let v = (top * (1.0 - fy) + bottom * fy) * scale[c] - shift[c];
                    data[c * plane + oy * ow + ox] = match self.spec.dtype {
                        Dtype::F32 => v,
                        Dtype::F16 => half::f16::from_f32(v).to_f32(),
                    };
                }
            }
        }
        Ok(Tensor {
            shape: vec![1, 3, oh, ow],
            data,
            frame_map: Some(map),
        })
    }

    /// The `[x, y, width, height]` of `frame` it reads: its crop, or the whole frame; a crop
    /// that does not fit the frame is refused.
    pub fn crop_of(&self, frame: &Frame) -> Result<[u32; 4], CropOutside> {
        let [cx, cy, cw, ch] = self.spec.crop.unwrap_or([0, 0, frame.width, frame.height]);
        if cx.checked_add(cw).is_none_or(|r| r > frame.width)
            || cy.checked_add(ch).is_none_or(|b| b > frame.height)
        {
            return Err(CropOutside {
                x: cx,
                y: cy,
                w: cw,
                h: ch,
                fw: frame.width,
                fh: frame.height,
            });
        }
        Ok([cx, cy, cw, ch])
    }

    /// The map from the output's pixels back to the frame's, for the region `crop` read.
    pub fn frame_map(&self, [cx, cy, cw, ch]: [u32; 4]) -> FrameMap {
        FrameMap {
            scale_x: cw as f32 / self.width as f32,
            scale_y: ch as f32 / self.height as f32,
            offset_x: cx as f32,
            offset_y: cy as f32,
        }
    }
}

impl Preprocess {
    /// What the CUDA kernel (`isolane_cuda::preprocess`, bit-exact with the engine's CPU
    /// reference) computes for this preprocess on frames whose crop is `crop_w × crop_h`: the
    /// crop cut out first ([`cut`]), then the kernel's resize of the whole cut frame, without
    /// its centre crop. It agrees with [`Preprocess::run`] to f32 rounding: the kernel divides by
    /// the scale where this operator multiplies by its inverse.
    pub fn kernel_plan(
        &self,
        crop_w: u32,
        crop_h: u32,
    ) -> Result<isolane_engine::preprocess::PreprocessPlan, String> {
        let spec = isolane_engine::preprocess::PreprocessSpec {
            resize: [self.height as usize, self.width as usize],
            crop: None,
            mean: self.spec.mean,
            std: self.spec.std,
        };
        let layout = isolane_engine::preprocess::FrameLayout {
            width: crop_w as usize,
            height: crop_h as usize,
            channels: 3,
        };
        spec.plan(layout).map_err(|e| e.to_string())
    }
}

/// The `[x, y, width, height]` region of `frame` as packed RGB rows, into `out` (reused): what
/// a preprocess that reads whole frames of the region's size gets.
pub fn cut(frame: &Frame, [x, y, w, h]: [u32; 4], out: &mut Vec<u8>) {
    out.clear();
    let row = frame.width as usize * 3;
    let (x, w) = (x as usize * 3, w as usize * 3);
    for r in y as usize..(y + h) as usize {
        out.extend_from_slice(&frame.rgb[r * row + x..r * row + x + w]);
    }
}

/// For each output coordinate: the two source pixels it blends and the weight of the second,
/// with half-pixel centres (`src = (dst + 0.5) · scale − 0.5`, as OpenCV's INTER_LINEAR and
/// PyTorch's `align_corners=False`), clamped at the edges.
fn taps(out: usize, scale: f32, start: u32, len: u32) -> Vec<(usize, usize, f32)> {
    let last = (len - 1) as f32;
    (0..out)
        .map(|d| {
            let s = ((d as f32 + 0.5) * scale - 0.5).clamp(0.0, last);
            let i0 = s.floor();
            let i1 = (i0 + 1.0).min(last);
            (
                start as usize + i0 as usize,
                start as usize + i1 as usize,
                s - i0,
            )
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec() -> PreprocessSpec {
        PreprocessSpec {
            size: None,
            crop: None,
            mean: [0.0; 3],
            std: [1.0; 3],
            dtype: Dtype::F32,
            device: PreprocessDevice::Cpu,
            gpu: None,
        }
    }

    /// A 2x1 frame: black, white (all channels).
    fn two_pixels() -> Frame {
        Frame {
            width: 2,
            height: 1,
            rgb: vec![0, 0, 0, 255, 255, 255],
        }
    }

    #[test]
    fn same_size_is_a_layout_change_and_scaling() {
        let f = Frame {
            width: 2,
            height: 1,
            rgb: vec![10, 20, 30, 40, 50, 60],
        };
        let p = Preprocess {
            width: 2,
            height: 1,
            spec: spec(),
        };
        let t = p.run(&f).unwrap();
        assert_eq!(t.shape, vec![1, 3, 1, 2]);
        let expect: Vec<f32> = [10, 40, 20, 50, 30, 60]
            .iter()
            .map(|v| *v as f32 / 255.0)
            .collect();
        for (a, b) in t.data.iter().zip(&expect) {
            assert!((a - b).abs() < 1e-6, "{:?}", t.data);
        }
        assert_eq!(t.frame_map.unwrap().to_frame(1.0, 0.0), (1.0, 0.0));
    }

    #[test]
    fn upscaling_interpolates_with_half_pixel_centres() {
        // 2 → 4 pixels: sources -0.25 (clamped 0), 0.25, 0.75, 1.25 (clamped 1)
        let p = Preprocess {
            width: 4,
            height: 1,
            spec: spec(),
        };
        let t = p.run(&two_pixels()).unwrap();
        let red = &t.data[0..4];
        let expect = [0.0, 0.25, 0.75, 1.0];
        for (a, b) in red.iter().zip(expect) {
            assert!((a - b).abs() < 1e-6, "{red:?}");
        }
        assert_eq!(t.frame_map.unwrap().scale_x, 0.5);
    }

    #[test]
    fn normalises_per_channel_and_rounds_to_f16() {
        let mut s = spec();
        s.mean = [0.5, 0.0, 0.0];
        s.std = [0.25, 2.0, 1.0];
        let p = Preprocess {
            width: 2,
            height: 1,
            spec: s.clone(),
        };
        let t = p.run(&two_pixels()).unwrap();
        // red: (0 − 0.5)/0.25 = −2, (1 − 0.5)/0.25 = 2; green: 1/2
        assert_eq!(&t.data[0..2], &[-2.0, 2.0]);
        assert_eq!(t.data[3], 0.5);
        s.dtype = Dtype::F16;
        s.mean = [0.0; 3];
        s.std = [3.0; 3];
        let t = Preprocess {
            width: 2,
            height: 1,
            spec: s,
        }
        .run(&two_pixels())
        .unwrap();
        // 1/3 is not an f16: rounded to 0.33325195
        assert_eq!(t.data[1], half::f16::from_f32(1.0 / 3.0).to_f32());
        assert_ne!(t.data[1], 1.0 / 3.0);
    }

    #[test]
    fn cut_packs_the_rows_of_a_region() {
        let f = Frame {
            width: 3,
            height: 2,
            rgb: (0..18).collect(),
        };
        let mut out = vec![99];
        cut(&f, [1, 1, 2, 1], &mut out);
        assert_eq!(out, vec![12, 13, 14, 15, 16, 17]);
        cut(&f, [0, 0, 1, 2], &mut out);
        assert_eq!(out, vec![0, 1, 2, 9, 10, 11]);
    }

    #[test]
    fn crops_before_resizing_and_refuses_a_crop_outside() {
        let mut s = spec();
        s.crop = Some([1, 0, 1, 1]);
        let p = Preprocess {
            width: 1,
            height: 1,
            spec: s.clone(),
        };
        let t = p.run(&two_pixels()).unwrap();
        assert_eq!(t.data, vec![1.0, 1.0, 1.0]);
        assert_eq!(t.frame_map.unwrap().to_frame(0.0, 0.0), (1.0, 0.0));
        s.crop = Some([1, 0, 2, 1]);
        let e = Preprocess {
            width: 1,
            height: 1,
            spec: s,
        }
        .run(&two_pixels())
        .unwrap_err();
        assert!(e.to_string().contains("does not fit the 2x1 frame"), "{e}");
    }
}
