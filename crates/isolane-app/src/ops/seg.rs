//! Segmentation logits → per-pixel class ids, and the frame with each class's colour blended
//! in (nearest neighbour from the mask's resolution to the frame's).

use crate::data::{Frame, Mask, Tensor};

#[derive(Debug, thiserror::Error, PartialEq)]
#[error("seg_argmax: expected a [1, classes, height, width] tensor; found {0:?}")]
pub struct BadShape(pub Vec<usize>);

/// Argmax over the class axis of `[1, C, H, W]` (ties: the lowest class), and the overlay of
/// `frame` with opacity `alpha`.
pub fn argmax_overlay(t: &Tensor, frame: &Frame, alpha: f32) -> Result<Mask, BadShape> {
    let [1, c, h, w] = t.shape[..] else {
        return Err(BadShape(t.shape.clone()));
    };
    if c == 0 || c > u16::MAX as usize || h == 0 || w == 0 || t.data.len() != c * h * w {
        return Err(BadShape(t.shape.clone()));
    }
    let plane = h * w;
    let classes: Vec<u16> = (0..plane)
        .map(|p| {
            let mut best = 0;
            for k in 1..c {
                if t.data[k * plane + p] > t.data[best * plane + p] {
                    best = k;
                }
            }
            best as u16
        })
        .collect();
    let overlay = overlay(frame, &classes, w, h, alpha);
    Ok(Mask {
        width: w as u32,
        height: h as u32,
        classes,
        overlay,
    })
}

/// A fixed colour per class (class 0, the background by convention, is left uncoloured).
pub fn class_colour(class: u16) -> Option<[u8; 3]> {
    if class == 0 {
        return None;
    }
    // Well-spread hues from a multiplicative hash: same colour for the same class every run.
    let h = (class as u32).wrapping_mul(2_654_435_761);
    Some([
        (h >> 24) as u8 | 0x40,
        (h >> 16) as u8 | 0x40,
        (h >> 8) as u8 | 0x40,
    ])
}

fn overlay(frame: &Frame, classes: &[u16], w: usize, h: usize, alpha: f32) -> Frame {
    let (fw, fh) = (frame.width as usize, frame.height as usize);
    let mut out = frame.clone();
    for y in 0..fh {
        let my = (y * h / fh).min(h - 1);
        for x in 0..fw {
            let mx = (x * w / fw).min(w - 1);
            if let Some(colour) = class_colour(classes[my * w + mx]) {
                let i = (y * fw + x) * 3;
                for (px, c) in out.rgb[i..i + 3].iter_mut().zip(colour) {
                    *px = (*px as f32 * (1.0 - alpha) + c as f32 * alpha).round() as u8;
                }
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn argmax_per_pixel_and_overlay() {
        // 2 classes, 1x2 pixels: pixel 0 → class 0, pixel 1 → class 1; a tie goes to class 0
        let t = Tensor {
            shape: vec![1, 2, 1, 2],
            data: vec![0.9, 0.1, 0.2, 0.8],
            frame_map: None,
        };
        let frame = Frame {
            width: 4,
            height: 1,
            rgb: vec![100; 12],
        };
        let m = argmax_overlay(&t, &frame, 0.5).unwrap();
        assert_eq!(m.classes, vec![0, 1]);
        // the left half of the frame is background: untouched
        assert_eq!(m.overlay.pixel(1, 0), [100, 100, 100]);
        // the right half: halfway to class 1's colour
        let c = class_colour(1).unwrap();
        let blend = |v: u8| ((100.0 + v as f32) / 2.0).round() as u8;
        assert_eq!(
            m.overlay.pixel(3, 0),
            [blend(c[0]), blend(c[1]), blend(c[2])]
        );
        let tie = Tensor {
            shape: vec![1, 2, 1, 1],
            data: vec![0.5, 0.5],
            frame_map: None,
        };
        assert_eq!(argmax_overlay(&tie, &frame, 0.5).unwrap().classes, vec![0]);
    }

    #[test]
    fn refuses_other_shapes() {
        let t = Tensor {
            shape: vec![1, 84, 8400],
            data: vec![],
            frame_map: None,
        };
        let frame = Frame::black(1, 1);
        assert!(argmax_overlay(&t, &frame, 0.5).is_err());
    }
}
