//! What flows between stages. A stage's output is one [`Payload`], shared (`Arc`) with every
//! stage that reads it; the source frame travels beside it in every message, so an overlay
//! or a render stage can always reach the picture.

use std::sync::Arc;

/// An 8-bit RGB picture, row-major HWC (`rgb.len() == width * height * 3`).
#[derive(Debug, Clone, PartialEq)]
pub struct Frame {
    pub width: u32,
    pub height: u32,
    pub rgb: Vec<u8>,
}

impl Frame {
    /// A black frame.
    pub fn black(width: u32, height: u32) -> Frame {
        Frame {
            width,
            height,
            rgb: vec![0; width as usize * height as usize * 3],
        }
    }

    /// Pixel (x, y) as [r, g, b].
    pub fn pixel(&self, x: u32, y: u32) -> [u8; 3] {
        let i = (y as usize * self.width as usize + x as usize) * 3;
        [self.rgb[i], self.rgb[i + 1], self.rgb[i + 2]]
    }
}

/// Frames handed downstream and reused once every reader has let go of them (`Arc::get_mut`),
/// as a camera or a renderer cycles a few buffers: no fresh 6 MB allocation (and its page
/// faults) per 1080p frame on the path that must keep the frame rate. Each buffer carries a tag
/// (`T`) saying what it holds, so an update can repaint only what changed.
pub struct FramePool<T> {
    slots: Vec<(Arc<Frame>, T)>,
    capacity: usize,
}

impl<T> FramePool<T> {
    /// A pool that keeps at most `capacity` buffers; frames made while all of them are still
    /// held downstream are not kept.
    pub fn new(capacity: usize) -> FramePool<T> {
        FramePool {
            slots: Vec::new(),
            capacity,
        }
    }

    /// The next frame: a kept buffer that nobody else holds, brought up to date by `update`
    /// (with its tag), or else a new one from `make`.
    pub fn next(
        &mut self,
        make: impl FnOnce() -> (Frame, T),
        update: impl FnOnce(&mut Frame, &mut T),
    ) -> Arc<Frame> {
        for (frame, tag) in &mut self.slots {
            if let Some(f) = Arc::get_mut(frame) {
                update(f, tag);
                return frame.clone();
            }
        }
        let (f, tag) = make();
        let frame = Arc::new(f);
        if self.slots.len() < self.capacity {
            self.slots.push((frame.clone(), tag));
        }
        frame
    }
}

/// Where a tensor's pixels were in the frame: frame `x = tensor_x * scale_x + offset_x` (and
/// `y` alike), so detections found in model input pixels map back onto the frame.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct FrameMap {
    pub scale_x: f32,
    pub scale_y: f32,
    pub offset_x: f32,
    pub offset_y: f32,
}

impl FrameMap {
    pub const IDENTITY: FrameMap = FrameMap {
        scale_x: 1.0,
        scale_y: 1.0,
        offset_x: 0.0,
        offset_y: 0.0,
    };

    pub fn to_frame(&self, x: f32, y: f32) -> (f32, f32) {
        (
            x * self.scale_x + self.offset_x,
            y * self.scale_y + self.offset_y,
        )
    }
}

/// A dense f32 tensor, row-major, batch included (`[1, C, H, W]` for an image).
#[derive(Debug, Clone, PartialEq)]
pub struct Tensor {
    pub shape: Vec<usize>,
    pub data: Vec<f32>,
    /// How the tensor's spatial axes map onto the source frame, where they do.
    pub frame_map: Option<FrameMap>,
}

/// f32 values a GPU stage left in device memory for the stages after it (a GPU preprocess's
/// output): the backend implements it (the binary's CUDA one), so that this crate needs no GPU.
/// The values stay unchanged while anyone holds them: the producer reuses the memory only
/// once every reader has let go.
pub trait DeviceValues: Send + Sync {
    /// The GPU they are on, as the machine numbers its GPUs.
    fn gpu(&self) -> u32;
    fn len(&self) -> usize;
    fn is_empty(&self) -> bool {
        self.len() == 0
    }
    /// Copies them into `out` (`len()` values) and waits for the copy.
    fn to_host(&self, out: &mut [f32]) -> Result<(), String>;
    /// The backend's own type, for a backend's model that copies them device to device.
    fn as_any(&self) -> &dyn std::any::Any;
}

/// A tensor left on a GPU (f32, row-major, batch included): what a GPU preprocess hands the
/// model it feeds, unless the app says `transfer = "host"`.
#[derive(Clone)]
pub struct DeviceTensor {
    pub shape: Vec<usize>,
    pub values: Arc<dyn DeviceValues>,
    pub frame_map: Option<FrameMap>,
}

impl DeviceTensor {
    /// The same tensor in host memory (a download, waited for).
    pub fn to_host(&self) -> Result<Tensor, String> {
        let mut data = vec![0f32; self.values.len()];
        self.values.to_host(&mut data)?;
        Ok(Tensor {
            shape: self.shape.clone(),
            data,
            frame_map: self.frame_map,
        })
    }
}

impl std::fmt::Debug for DeviceTensor {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DeviceTensor")
            .field("shape", &self.shape)
            .field("gpu", &self.values.gpu())
            .field("frame_map", &self.frame_map)
            .finish()
    }
}

impl PartialEq for DeviceTensor {
    /// The same memory, seen the same way.
    fn eq(&self, other: &Self) -> bool {
        Arc::ptr_eq(&self.values, &other.values)
            && self.shape == other.shape
            && self.frame_map == other.frame_map
    }
}

pub use isolane_core::app_records::Link;

/// One detected object, in frame pixels.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Detection {
    pub x1: f32,
    pub y1: f32,
    pub x2: f32,
    pub y2: f32,
    pub score: f32,
    pub class: u32,
}

/// Per-pixel class ids at the model's output resolution, with the frame coloured by them.
#[derive(Debug, Clone, PartialEq)]
pub struct Mask {
    pub width: u32,
    pub height: u32,
    pub classes: Vec<u16>,
    /// The source frame with each class's colour blended in (at the frame's size).
    pub overlay: Frame,
}

/// A classification: classes and scores, best first.
#[derive(Debug, Clone, PartialEq)]
pub struct Classes {
    pub top: Vec<(u32, f32)>,
}

/// A stage's output.
#[derive(Debug, Clone, PartialEq)]
pub enum Payload {
    Frame(Arc<Frame>),
    Tensor(Tensor),
    /// A tensor left on a GPU.
    Device(DeviceTensor),
    Detections(Vec<Detection>),
    Mask(Mask),
    Classes(Classes),
    /// What a sink passes on: nothing.
    Done,
}

impl Payload {
    /// One line about what it holds, for the frames CSV (no commas: it is a CSV cell).
    pub fn describe(&self) -> String {
        match self {
            Payload::Frame(f) => format!("frame {}x{}", f.width, f.height),
            Payload::Tensor(t) => {
                let dims: Vec<String> = t.shape.iter().map(usize::to_string).collect();
                format!("tensor {}", dims.join("x"))
            }
            Payload::Device(t) => {
                let dims: Vec<String> = t.shape.iter().map(usize::to_string).collect();
                format!("tensor {} on GPU {}", dims.join("x"), t.values.gpu())
            }
            Payload::Detections(d) => match d.first() {
                Some(b) => format!(
                    "{} detections; best class {} score {:.3} at {:.1} {:.1} {:.1} {:.1}",
                    d.len(),
                    b.class,
                    b.score,
                    b.x1,
                    b.y1,
                    b.x2,
                    b.y2
                ),
                None => "0 detections".to_string(),
            },
            Payload::Mask(m) => {
                let classes = m
                    .classes
                    .iter()
                    .collect::<std::collections::BTreeSet<_>>()
                    .len();
                format!("mask {}x{} with {classes} classes", m.width, m.height)
            }
            Payload::Classes(c) => match c.top.first() {
                Some((class, p)) => format!("class {class} score {p:.3}"),
                None => "no class".to_string(),
            },
            Payload::Done => String::new(),
        }
    }

    /// The name of its type, for messages.
    pub fn type_name(&self) -> &'static str {
        match self {
            Payload::Frame(_) => "frame",
            Payload::Tensor(_) | Payload::Device(_) => "tensor",
            Payload::Detections(_) => "detections",
            Payload::Mask(_) => "mask",
            Payload::Classes(_) => "classes",
            Payload::Done => "nothing",
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn descriptions_are_one_csv_cell() {
        let d = Payload::Detections(vec![Detection {
            x1: 3.0,
            y1: 3.0,
            x2: 5.0,
            y2: 5.0,
            score: 0.9,
            class: 0,
        }]);
        assert_eq!(
            d.describe(),
            "1 detections; best class 0 score 0.900 at 3.0 3.0 5.0 5.0"
        );
        let m = Payload::Mask(Mask {
            width: 2,
            height: 2,
            classes: vec![0, 3, 3, 0],
            overlay: Frame::black(2, 2),
        });
        assert_eq!(m.describe(), "mask 2x2 with 2 classes");
        let t = Payload::Tensor(Tensor {
            shape: vec![1, 5],
            data: vec![0.0; 5],
            frame_map: None,
        });
        assert_eq!(t.describe(), "tensor 1x5");
        let c = Payload::Classes(Classes {
            top: vec![(7, 0.25)],
        });
        assert_eq!(c.describe(), "class 7 score 0.250");
        for p in [d, m, t, c] {
            assert!(!p.describe().contains(','));
        }
    }
}
