//! Image input as torchvision's ImageNet classification transform prepares it:
//! `Resize(256)` (shorter side to 256, bilinear with antialiasing, as PIL does it),
//! `CenterCrop(224)`, `ToTensor()` (/255), `Normalize(mean, std)`, laid out NCHW f32.
//!
//! The resize follows PIL's `Image.resize(..., BILINEAR)`, which torchvision calls on PIL images:
//! a separable triangle filter whose support widens by the scale factor when shrinking
//! (antialiasing), horizontal pass first, each pass rounded to 8 bits. Matching PIL matters
//! because `isolane infer --image` should give the numbers a PyTorch user gets for the same file.

use ::image::{DynamicImage, RgbImage};
use std::path::{Path, PathBuf};

/// The largest image file isolane reads: a PNG or JPEG of far more pixels than a classifier
/// takes, and a bound on what a wrong path can take.
pub const MAX_IMAGE_FILE_BYTES: u64 = 256 << 20;

/// The most bytes an image may take resized, before its crop (and each resize pass's result):
/// the decoder's own bound on a decoded image (the `image` crate's default, 512 MiB). The
/// shorter side is resized and the longer one keeps the aspect ratio, so a strip of a few bytes
/// on disk (60000x1) would otherwise become gigabytes.
pub const MAX_RESIZED_BYTES: u64 = 512 << 20;

/// ImageNet statistics used by torchvision's pretrained classifiers.
pub const IMAGENET_MEAN: [f32; 3] = [0.485, 0.456, 0.406];
pub const IMAGENET_STD: [f32; 3] = [0.229, 0.224, 0.225];

#[derive(Debug, thiserror::Error)]
pub enum ImageError {
    #[error("cannot read image {path}: {source}")]
    Read {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("cannot decode image {path} (PNG and JPEG are supported): {source}")]
    Decode {
        path: PathBuf,
        #[source]
        source: ::image::ImageError,
    },
    #[error("image {path} is {width}x{height}; it must be at least 1x1")]
    Empty {
        path: PathBuf,
        width: u32,
        height: u32,
    },
    #[error("image {path}: {oversize}")]
    Oversize { path: PathBuf, oversize: Oversize },
}

/// An image whose resize would take more than [`MAX_RESIZED_BYTES`] ([`preprocess`]).
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[error(
    "{width}x{height} pixels; resized to {resize} on its shorter side it would take {:.1} GiB, \
     more than {} MiB: its longer side may be at most {} times its shorter",
    *bytes as f64 / (1u64 << 30) as f64,
    MAX_RESIZED_BYTES >> 20,
    MAX_RESIZED_BYTES / (3 * (*resize as u64).max(1).pow(2)),
)]
pub struct Oversize {
    pub width: usize,
    pub height: usize,
    pub resize: usize,
    /// The larger of the two resize passes' results, RGB8.
    pub bytes: u128,
}

/// The size of a square input of `side` pixels' torchvision ImageNet resize: `Resize(256)` for
/// `CenterCrop(224)`, the same ratio for other sizes.
pub fn resize_for(side: usize) -> usize {
    (side as f64 * 256.0 / 224.0).round() as usize
}

/// Decodes `path` (PNG or JPEG) and returns the standard ImageNet input: shape `[3, crop, crop]`
/// with `resize = 256`, `crop = 224`.
pub fn load_image(path: impl AsRef<Path>) -> Result<(Vec<usize>, Vec<f32>), ImageError> {
    let data = load_image_sized(path.as_ref(), 224)?;
    Ok((vec![3, 224, 224], data))
}

/// Decodes `path` and prepares it for a model input of `[3, side, side]`: resized to
/// [`resize_for`]`(side)` on its shorter side, centre-cropped to `side` (`infer --image`, an
/// image of a calibration folder).
pub fn load_image_sized(path: &Path, side: usize) -> Result<Vec<f32>, ImageError> {
    let img = decode(path)?;
    preprocess(&img, resize_for(side), side).map_err(|oversize| ImageError::Oversize {
        path: path.to_path_buf(),
        oversize,
    })
}

/// Decodes an image file to 8-bit RGB (grey and alpha are converted, as PIL's `convert("RGB")`).
pub fn decode(path: &Path) -> Result<RgbImage, ImageError> {
    let bytes =
        isolane_core::files::read_file_capped(path, MAX_IMAGE_FILE_BYTES).map_err(|source| {
            ImageError::Read {
                path: path.to_path_buf(),
                source,
            }
        })?;
    let img: DynamicImage =
        ::image::load_from_memory(&bytes).map_err(|source| ImageError::Decode {
            path: path.to_path_buf(),
            source,
        })?;
    if img.width() == 0 || img.height() == 0 {
        return Err(ImageError::Empty {
            path: path.to_path_buf(),
            width: img.width(),
            height: img.height(),
        });
    }
    Ok(img.to_rgb8())
}

/// `Resize(resize)` + `CenterCrop(crop)` + `ToTensor` + `Normalize(ImageNet)`, CHW f32; an
/// image whose resize would take more than [`MAX_RESIZED_BYTES`] is refused, before anything
/// is allocated for it.
pub fn preprocess(img: &RgbImage, resize: usize, crop: usize) -> Result<Vec<f32>, Oversize> {
    let (w, h) = (img.width() as usize, img.height() as usize);
    // torchvision: the shorter side becomes `resize`, the longer one int(resize * long / short).
    let (nw, nh) = if w <= h {
        (resize, (resize as f64 * h as f64 / w as f64) as usize)
    } else {
        ((resize as f64 * w as f64 / h as f64) as usize, resize)
    };
    // The horizontal pass makes nw x h, the vertical one nw x nh.
    let bytes = (nw as u128 * h as u128).max(nw as u128 * nh as u128) * 3;
    if bytes > MAX_RESIZED_BYTES as u128 {
        return Err(Oversize {
            width: w,
            height: h,
            resize,
            bytes,
        });
    }
    let src: Vec<u8> = img.as_raw().clone();
    let horiz = if nw != w {
        resample(&src, w, h, nw, true)
    } else {
        src
    };
    let resized = if nh != h {
        resample(&horiz, nw, h, nh, false)
    } else {
        horiz
    };
    // torchvision CenterCrop: top = int(round((h - crop) / 2)), Python's round (half to even).
    // A crop larger than the image would pad with zeros; with resize >= crop that cannot happen.
    let top = round_half_even((nh as f64 - crop as f64) / 2.0).max(0) as usize;
    let left = round_half_even((nw as f64 - crop as f64) / 2.0).max(0) as usize;
    let mut out = vec![0f32; 3 * crop * crop];
    for c in 0..3 {
        let (m, s) = (IMAGENET_MEAN[c], IMAGENET_STD[c]);
        for y in 0..crop {
            for x in 0..crop {
                let (sy, sx) = (top + y, left + x);
                let v = if sy < nh && sx < nw {
                    resized[(sy * nw + sx) * 3 + c] as f32 / 255.0
                } else {
                    0.0
                };
                out[(c * crop + y) * crop + x] = (v - m) / s;
            }
        }
    }
    Ok(out)
}

fn round_half_even(x: f64) -> i64 {
    let r = x.round();
    if (x - x.trunc()).abs() == 0.5 && (r as i64) % 2 != 0 {
        (r - x.signum()) as i64
    } else {
        r as i64
    }
}

/// One pass of PIL's bilinear resample along x (`horizontal`) or y, RGB8 in and out.
/// Mirrors `ImagingResampleHorizontal/Vertical_8bpc` in PIL's Resample.c: coefficients from a
/// triangle filter of support `max(scale, 1)`, normalised, applied in fixed point with
/// PRECISION_BITS = 32 - 8 - 2 and rounded, then clipped to 0..255.
fn resample(src: &[u8], w: usize, h: usize, new_len: usize, horizontal: bool) -> Vec<u8> {
    let in_len = if horizontal { w } else { h };
    let (bounds, kk, ksize) = coefficients(in_len, new_len);
    let (ow, oh) = if horizontal {
        (new_len, h)
    } else {
        (w, new_len)
    };
    let mut out = vec![0u8; ow * oh * 3];
    const PRECISION_BITS: u32 = 32 - 8 - 2;
    let half = 1i64 << (PRECISION_BITS - 1);
    for y in 0..oh {
        for x in 0..ow {
            let i = if horizontal { x } else { y };
            let (xmin, xcnt) = bounds[i];
            let k = &kk[i * ksize..i * ksize + xcnt];
            for c in 0..3 {
                let mut ss = half;
                for (j, &kj) in k.iter().enumerate() {
                    let p = if horizontal {
                        src[(y * w + xmin + j) * 3 + c]
                    } else {
                        src[((xmin + j) * w + x) * 3 + c]
                    };
                    ss += p as i64 * kj;
                }
                out[(y * ow + x) * 3 + c] = (ss >> PRECISION_BITS).clamp(0, 255) as u8;
            }
        }
    }
    out
}

/// PIL's `precompute_coeffs` for the bilinear (triangle) filter, converted to fixed point as
/// `normalize_coeffs_8bpc` does. Returns per output index (first input index, count), the
/// coefficients (ksize per output index) and ksize.
fn coefficients(in_len: usize, out_len: usize) -> (Vec<(usize, usize)>, Vec<i64>, usize) {
    let scale = in_len as f64 / out_len as f64;
    let filterscale = scale.max(1.0);
    let support = 1.0 * filterscale; // the triangle filter's support is 1
    let ksize = support.ceil() as usize * 2 + 1;
    let mut bounds = Vec::with_capacity(out_len);
    let mut kk = vec![0i64; out_len * ksize];
    const PRECISION_BITS: u32 = 32 - 8 - 2;
    for xx in 0..out_len {
        let center = (xx as f64 + 0.5) * scale;
        let ww_inv = 1.0 / filterscale;
        let xmin = ((center - support + 0.5).trunc() as i64).max(0) as usize;
        let xmax = ((center + support + 0.5).trunc() as i64).min(in_len as i64) as usize;
        let xcnt = xmax.saturating_sub(xmin).min(ksize);
        let mut k = vec![0f64; xcnt];
        let mut total = 0.0;
        for (x, kx) in k.iter_mut().enumerate() {
            let t = ((x + xmin) as f64 - center + 0.5) * ww_inv;
            let w = if t.abs() < 1.0 { 1.0 - t.abs() } else { 0.0 };
            *kx = w;
            total += w;
        }
        for (x, kx) in k.iter().enumerate() {
            let v = if total != 0.0 { kx / total } else { 0.0 };
            // PIL: (int)(0.5 + v * (1 << PRECISION_BITS)) for v >= 0, (int)(-0.5 + ...) otherwise
            let f = v * (1i64 << PRECISION_BITS) as f64;
            kk[xx * ksize + x] = if f < 0.0 {
                (f - 0.5).trunc() as i64
            } else {
                (f + 0.5).trunc() as i64
            };
        }
        bounds.push((xmin, xcnt));
    }
    (bounds, kk, ksize)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn constant_image_stays_constant() {
        let img = RgbImage::from_pixel(50, 37, ::image::Rgb([10, 128, 250]));
        let t = preprocess(&img, 32, 28).unwrap();
        assert_eq!(t.len(), 3 * 28 * 28);
        for c in 0..3 {
            let v = [10.0, 128.0, 250.0][c] / 255.0;
            let want = (v - IMAGENET_MEAN[c]) / IMAGENET_STD[c];
            for &x in &t[c * 784..(c + 1) * 784] {
                assert!((x - want).abs() < 1e-6, "{x} vs {want}");
            }
        }
    }

    /// A strip of a few kilobytes as a PNG asks for gigabytes once its shorter side is resized:
    /// refused with its size before anything is allocated (this test allocated ~11 GiB before).
    #[test]
    fn an_image_too_long_for_its_resize_is_refused_naming_its_size() {
        let strip = RgbImage::new(60_000, 1);
        let e = preprocess(&strip, 256, 224).unwrap_err();
        assert_eq!((e.width, e.height, e.resize), (60_000, 1, 256));
        let e = e.to_string();
        assert!(
            e.starts_with(
                "60000x1 pixels; resized to 256 on its shorter side it would take 11.0 GiB"
            ) && e.contains("at most 2730 times its shorter"),
            "{e}"
        );
        // Tall as well as wide, just past the bound the message gives.
        assert!(preprocess(&RgbImage::new(1, 2731), 256, 224).is_err());
        let d = tempfile::tempdir().unwrap();
        let p = d.path().join("strip.png");
        strip.save(&p).unwrap();
        let e = load_image_sized(&p, 224).unwrap_err().to_string();
        assert!(
            e.starts_with(&format!("image {}: 60000x1 pixels", p.display())),
            "{e}"
        );
    }

    #[test]
    fn device_links_and_fifos_are_no_images() {
        let d = tempfile::tempdir().unwrap();
        let p = d.path().join("a.png");
        std::os::unix::fs::symlink("/dev/zero", &p).unwrap();
        let e = decode(&p).unwrap_err().to_string();
        assert!(
            e.contains("is a character device, not a regular file"),
            "{e}"
        );
    }

    #[test]
    fn half_even() {
        assert_eq!(round_half_even(2.5), 2);
        assert_eq!(round_half_even(3.5), 4);
        assert_eq!(round_half_even(1.2), 1);
    }
}
