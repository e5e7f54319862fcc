//! YOLOv8 detection head output → detections: box decode and class-wise non-maximum
//! suppression, as Ultralytics' `non_max_suppression` does by default (one class per box: its
//! best; boxes of different classes never suppress each other).
//!
//! The built-in `yolov8n` ends in the Detect head's inference decode (crates/isolane-engine,
//! arch/yolov8.rs): output `[1, 4 + classes, anchors]`, rows 0..4 `cx, cy, w, h` in model
//! input pixels, the other rows the class probabilities (already through the sigmoid).

use crate::data::{Detection, FrameMap, Tensor};

#[derive(Debug, Clone, thiserror::Error, PartialEq)]
pub enum DecodeError {
    #[error("yolov8_decode: expected a [1, 4 + classes, anchors] tensor with at least one class; found {0:?}")]
    Shape(Vec<usize>),
    /// A wrong answer is not decoded into boxes that look right: NaN or infinite values come
    /// from a model whose output is wrong (an overflow, a fault), never from a real scene.
    #[error(
        "yolov8_decode: the model's output has {count} values that are not finite (the first: \
         {value} in row {row} of {rows}, anchor {anchor}); it is not decoded"
    )]
    NotFinite {
        count: usize,
        value: f32,
        row: usize,
        rows: usize,
        anchor: usize,
    },
}

/// Detections in frame pixels (through the tensor's frame map), best first.
pub fn decode(
    t: &Tensor,
    conf: f32,
    iou: f32,
    max_det: usize,
) -> Result<Vec<Detection>, DecodeError> {
    let [1, rows, anchors] = t.shape[..] else {
        return Err(DecodeError::Shape(t.shape.clone()));
    };
    if rows < 5 || t.data.len() != rows * anchors {
        return Err(DecodeError::Shape(t.shape.clone()));
    }
    if let Some(i) = t.data.iter().position(|v| !v.is_finite()) {
        return Err(DecodeError::NotFinite {
            count: t.data.iter().filter(|v| !v.is_finite()).count(),
            value: t.data[i],
            row: i / anchors,
            rows,
            anchor: i % anchors,
        });
    }
    let at = |r: usize, a: usize| t.data[r * anchors + a];
    let map = t.frame_map.unwrap_or(FrameMap::IDENTITY);
    let mut candidates = Vec::new();
    for a in 0..anchors {
        let (class, score) =
            (4..rows)
                .map(|r| (r - 4, at(r, a)))
                .fold(
                    (0, f32::NEG_INFINITY),
                    |best, c| if c.1 > best.1 { c } else { best },
                );
        if score < conf {
            continue;
        }
        let (cx, cy, w, h) = (at(0, a), at(1, a), at(2, a), at(3, a));
        let (x1, y1) = map.to_frame(cx - w / 2.0, cy - h / 2.0);
        let (x2, y2) = map.to_frame(cx + w / 2.0, cy + h / 2.0);
        candidates.push(Detection {
            x1,
            y1,
            x2,
            y2,
            score,
            class: class as u32,
        });
    }
    Ok(nms(candidates, iou, max_det))
}

/// Class-wise NMS: highest score first; a box is dropped when it overlaps a kept box of its
/// class by IoU > `iou`. At most `max_det` boxes.
pub fn nms(mut boxes: Vec<Detection>, iou: f32, max_det: usize) -> Vec<Detection> {
    boxes.sort_by(|a, b| b.score.total_cmp(&a.score));
    let mut kept: Vec<Detection> = Vec::new();
    for b in boxes {
        if kept.len() == max_det {
            break;
        }
        if kept
            .iter()
            .all(|k| k.class != b.class || box_iou(k, &b) <= iou)
        {
            kept.push(b);
        }
    }
    kept
}

/// Intersection over union of two boxes (0 when either is empty).
pub fn box_iou(a: &Detection, b: &Detection) -> f32 {
    let area = |d: &Detection| (d.x2 - d.x1).max(0.0) * (d.y2 - d.y1).max(0.0);
    let iw = (a.x2.min(b.x2) - a.x1.max(b.x1)).max(0.0);
    let ih = (a.y2.min(b.y2) - a.y1.max(b.y1)).max(0.0);
    let inter = iw * ih;
    let union = area(a) + area(b) - inter;
    if union > 0.0 {
        inter / union
    } else {
        0.0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn det(x1: f32, y1: f32, x2: f32, y2: f32, score: f32, class: u32) -> Detection {
        Detection {
            x1,
            y1,
            x2,
            y2,
            score,
            class,
        }
    }

    #[test]
    fn iou_by_hand() {
        // two 2x2 boxes overlapping in a 1x2 strip: 2 / (4 + 4 − 2) = 1/3
        let a = det(0.0, 0.0, 2.0, 2.0, 1.0, 0);
        let b = det(1.0, 0.0, 3.0, 2.0, 1.0, 0);
        assert!((box_iou(&a, &b) - 1.0 / 3.0).abs() < 1e-6);
        assert_eq!(box_iou(&a, &det(5.0, 5.0, 6.0, 6.0, 1.0, 0)), 0.0);
        assert_eq!(box_iou(&a, &a), 1.0);
    }

    #[test]
    fn nms_is_class_wise_and_keeps_the_best() {
        let boxes = vec![
            det(0.0, 0.0, 10.0, 10.0, 0.6, 0),
            det(1.0, 1.0, 10.0, 10.0, 0.9, 0), // IoU with the first 81/100 = 0.81
            det(0.0, 0.0, 10.0, 10.0, 0.5, 1), // same place, other class: kept
            det(20.0, 20.0, 30.0, 30.0, 0.4, 0), // apart: kept
        ];
        let kept = nms(boxes.clone(), 0.45, 300);
        let scores: Vec<f32> = kept.iter().map(|d| d.score).collect();
        assert_eq!(scores, vec![0.9, 0.5, 0.4]);
        // a loose threshold keeps the overlapping pair
        assert_eq!(nms(boxes.clone(), 0.9, 300).len(), 4);
        assert_eq!(nms(boxes, 0.9, 2).len(), 2);
    }

    /// Three anchors, two classes: `[1, 6, 3]` rows cx, cy, w, h, p0, p1.
    fn head() -> Tensor {
        #[rustfmt::skip]
        let data = vec![
            10.0, 11.0, 50.0, // cx
            10.0, 10.0, 50.0, // cy
            4.0, 4.0, 2.0,    // w
            4.0, 4.0, 2.0,    // h
            0.9, 0.8, 0.1,    // class 0
            0.1, 0.2, 0.2,    // class 1
        ];
        Tensor {
            shape: vec![1, 6, 3],
            data,
            frame_map: None,
        }
    }

    #[test]
    fn decodes_centre_boxes_thresholds_and_suppresses() {
        let d = decode(&head(), 0.25, 0.45, 300).unwrap();
        // anchor 2 is below conf; anchor 1 overlaps anchor 0 (IoU 12/20 = 0.6) in class 0
        assert_eq!(d, vec![det(8.0, 8.0, 12.0, 12.0, 0.9, 0)]);
    }

    #[test]
    fn maps_boxes_back_onto_the_frame() {
        let mut t = head();
        t.frame_map = Some(FrameMap {
            scale_x: 2.0,
            scale_y: 3.0,
            offset_x: 100.0,
            offset_y: 0.0,
        });
        let d = decode(&t, 0.5, 0.45, 300).unwrap();
        assert_eq!(d[0], det(116.0, 24.0, 124.0, 36.0, 0.9, 0));
    }

    #[test]
    fn refuses_an_output_that_is_not_finite() {
        let mut t = head();
        t.data[3 * 3 + 2] = f32::NAN; // h of anchor 2 (below conf: still refused)
        t.data[4 * 3 + 1] = f32::INFINITY;
        let e = decode(&t, 0.25, 0.45, 300).unwrap_err();
        let DecodeError::NotFinite {
            count,
            value,
            row,
            rows,
            anchor,
        } = e.clone()
        else {
            panic!("{e}");
        };
        assert_eq!((count, row, rows, anchor), (2, 3, 6, 2));
        assert!(value.is_nan());
        let text = e.to_string();
        assert!(
            text.contains("2 values that are not finite") && text.contains("row 3 of 6, anchor 2"),
            "{text}"
        );
    }

    #[test]
    fn refuses_other_shapes() {
        let t = Tensor {
            shape: vec![1, 1000],
            data: vec![0.0; 1000],
            frame_map: None,
        };
        assert!(decode(&t, 0.25, 0.45, 300)
            .unwrap_err()
            .to_string()
            .contains("[1, 1000]"));
    }
}
