//! Tensor files and image input: `.npy` read/write (f32, C-order) and the ImageNet preprocessing
//! of torchvision's classification transforms.

pub mod classes;
pub mod image;
pub mod npy;

pub use self::image::{load_image, preprocess, ImageError};
pub use classes::imagenet_classes;
pub use npy::{read_npy, read_npy_labels, write_npy, NpyError, NpyTensor};
