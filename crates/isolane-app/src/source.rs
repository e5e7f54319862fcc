//! Frame sources: deterministic synthetic frames, a folder of PNG/JPEG images, an
//! uncompressed `.y4m` video. Each produces the next frame on demand; the run asks for it
//! before the frame's release time, so reading and decoding are not part of the frame's
//! latency (a camera delivers a finished frame at its release).

use std::fs::File;
use std::io::{BufRead, BufReader, Read, Seek, SeekFrom};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use crate::data::{Frame, FramePool};
use crate::spec::SourceKind;

#[derive(Debug, thiserror::Error)]
pub enum SourceError {
    #[error("{path}: {message}")]
    File { path: PathBuf, message: String },
    #[error(transparent)]
    Image(#[from] isolane_engine::io::image::ImageError),
}

fn file_err(path: &Path, message: impl Into<String>) -> SourceError {
    SourceError::File {
        path: path.to_path_buf(),
        message: message.into(),
    }
}

/// Something that yields frames, forever (files are cycled).
pub trait FrameSource: Send {
    fn next_frame(&mut self) -> Result<Arc<Frame>, SourceError>;
}

/// Opens the source a spec describes (checks the files now, before any run starts).
pub fn open(kind: &SourceKind) -> Result<Box<dyn FrameSource>, SourceError> {
    Ok(match kind {
        SourceKind::Synthetic { width, height } => Box::new(Synthetic::new(*width, *height)),
        SourceKind::Images { dir } => Box::new(ImageFolder::open(dir)?),
        SourceKind::Video { path } => Box::new(Y4m::open(path)?),
    })
}

/// Deterministic frames: a fixed colour gradient with a bright square that moves by a few
/// pixels per frame, so consecutive frames differ and every run sees the same ones.
///
/// The gradient is drawn once; each frame is a buffer of a small pool ([`FramePool`]) whose
/// readers have all let go, repainted only where its old square was and where the new one is.
/// Drawing every pixel of a 1080p frame anew took 10–25 ms of CPU, more than a 60 fps period
/// on the GPU machine, so the source itself fell behind its schedule.
pub struct Synthetic {
    width: u32,
    height: u32,
    index: u64,
    background: Vec<u8>,
    /// Each buffer's tag: the top-left corner of the square it holds.
    pool: FramePool<(usize, usize)>,
}

/// Buffers a synthetic source keeps: enough for the frames of a few periods in flight.
const SYNTHETIC_BUFFERS: usize = 8;

impl Synthetic {
    pub fn new(width: u32, height: u32) -> Synthetic {
        Synthetic {
            width,
            height,
            index: 0,
            background: Synthetic::gradient(width as usize, height as usize),
            pool: FramePool::new(SYNTHETIC_BUFFERS),
        }
    }

    /// Frame `k` of this size.
    pub fn frame(width: u32, height: u32, k: u64) -> Frame {
        let (w, h) = (width as usize, height as usize);
        let mut rgb = Synthetic::gradient(w, h);
        Synthetic::paint_square(&mut rgb, None, w, h, Synthetic::square_at(w, h, k));
        Frame { width, height, rgb }
    }

    fn gradient(w: usize, h: usize) -> Vec<u8> {
        let mut rgb = Vec::with_capacity(w * h * 3);
        for y in 0..h {
            let g = (y * 255 / h.max(1)) as u8;
            for x in 0..w {
                rgb.push((x * 255 / w.max(1)) as u8);
                rgb.push(g);
                rgb.push(((x + y) * 127 / (w + h).max(1)) as u8);
            }
        }
        rgb
    }

    fn side(w: usize, h: usize) -> usize {
        (w.min(h) / 4).max(1)
    }

    /// The top-left corner of frame `k`'s square.
    fn square_at(w: usize, h: usize, k: u64) -> (usize, usize) {
        ((k as usize * 7) % w.max(1), (k as usize * 3) % h.max(1))
    }

    /// Paints the square at `at` (clipped to the frame): bright, or back to `background`.
    fn paint_square(
        rgb: &mut [u8],
        background: Option<&[u8]>,
        w: usize,
        h: usize,
        at: (usize, usize),
    ) {
        let side = Synthetic::side(w, h);
        let (x0, x1) = (at.0.min(w), (at.0 + side).min(w));
        for y in at.1.min(h)..(at.1 + side).min(h) {
            let row = (y * w + x0) * 3..(y * w + x1) * 3;
            match background {
                Some(bg) => rgb[row.clone()].copy_from_slice(&bg[row]),
                None => rgb[row].fill(240),
            }
        }
    }
}

impl FrameSource for Synthetic {
    fn next_frame(&mut self) -> Result<Arc<Frame>, SourceError> {
        let (w, h) = (self.width as usize, self.height as usize);
        let at = Synthetic::square_at(w, h, self.index);
        self.index += 1;
        let background = &self.background;
        let (width, height) = (self.width, self.height);
        Ok(self.pool.next(
            || {
                let mut rgb = background.clone();
                Synthetic::paint_square(&mut rgb, None, w, h, at);
                (Frame { width, height, rgb }, at)
            },
            |f, old| {
                Synthetic::paint_square(&mut f.rgb, Some(background), w, h, *old);
                Synthetic::paint_square(&mut f.rgb, None, w, h, at);
                *old = at;
            },
        ))
    }
}

/// The PNG and JPEG files of a folder, in name order, cycled.
pub struct ImageFolder {
    files: Vec<PathBuf>,
    next: usize,
}

impl ImageFolder {
    pub fn open(dir: &Path) -> Result<ImageFolder, SourceError> {
        let entries = std::fs::read_dir(dir).map_err(|e| file_err(dir, e.to_string()))?;
        let mut files: Vec<PathBuf> = entries
            .filter_map(|e| e.ok().map(|e| e.path()))
            .filter(|p| {
                let ext = p
                    .extension()
                    .and_then(|e| e.to_str())
                    .map(str::to_lowercase);
                matches!(ext.as_deref(), Some("png" | "jpg" | "jpeg"))
            })
            .collect();
        files.sort();
        if files.is_empty() {
            return Err(file_err(dir, "no .png, .jpg or .jpeg files in this folder"));
        }
        for f in &files {
            check_header(f)?;
        }
        Ok(ImageFolder { files, next: 0 })
    }
}

/// A file's format and size from its header, not its pixels (cheap for a large folder): one
/// that is not a PNG or JPEG, or is cut off before its size, is refused before the run starts
/// (exit 2) instead of failing its app at its frame while the run goes on (exit 1).
fn check_header(path: &Path) -> Result<(), SourceError> {
    let (width, height) = image::ImageReader::open(path)
        .and_then(|r| r.with_guessed_format())
        .map_err(|e| file_err(path, format!("cannot read: {e}")))?
        .into_dimensions()
        .map_err(|e| {
            file_err(
                path,
                format!("not a PNG or JPEG image that can be read: {e}"),
            )
        })?;
    if width == 0 || height == 0 {
        return Err(file_err(
            path,
            format!("an empty image ({width}x{height}); an image needs pixels"),
        ));
    }
    Ok(())
}

impl FrameSource for ImageFolder {
    fn next_frame(&mut self) -> Result<Arc<Frame>, SourceError> {
        let path = &self.files[self.next];
        self.next = (self.next + 1) % self.files.len();
        let img = isolane_engine::io::image::decode(path)?;
        Ok(Arc::new(Frame {
            width: img.width(),
            height: img.height(),
            rgb: img.into_raw(),
        }))
    }
}

/// Chroma layout of a `.y4m` file.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Chroma {
    /// 4:2:0, chroma at half width and half height (C420, C420jpeg, C420paldv, C420mpeg2).
    C420,
    C444,
    Mono,
}

/// An uncompressed YUV4MPEG2 video (8-bit 4:2:0, 4:4:4 or mono), converted to RGB with the
/// BT.601 limited-range matrix, cycled at its end.
pub struct Y4m {
    path: PathBuf,
    reader: BufReader<File>,
    width: u32,
    height: u32,
    chroma: Chroma,
    /// Where the first FRAME starts.
    data_start: u64,
    buf: Vec<u8>,
}

impl Y4m {
    pub fn open(path: &Path) -> Result<Y4m, SourceError> {
        let file = File::open(path).map_err(|e| file_err(path, e.to_string()))?;
        let mut reader = BufReader::new(file);
        let mut header = String::new();
        reader
            .read_line(&mut header)
            .map_err(|e| file_err(path, e.to_string()))?;
        let (width, height, chroma) = parse_header(&header).map_err(|m| file_err(path, m))?;
        let data_start = header.len() as u64;
        let mut y4m = Y4m {
            path: path.to_path_buf(),
            reader,
            width,
            height,
            chroma,
            data_start,
            buf: Vec::new(),
        };
        // A file without one whole frame would fail on the first release; fail now instead.
        y4m.read_frame()?;
        y4m.rewind()?;
        Ok(y4m)
    }

    fn frame_bytes(&self) -> usize {
        let luma = self.width as usize * self.height as usize;
        match self.chroma {
            Chroma::C420 => {
                let cw = (self.width as usize).div_ceil(2);
                let ch = (self.height as usize).div_ceil(2);
                luma + 2 * cw * ch
            }
            Chroma::C444 => 3 * luma,
            Chroma::Mono => luma,
        }
    }

    fn rewind(&mut self) -> Result<(), SourceError> {
        self.reader
            .seek(SeekFrom::Start(self.data_start))
            .map(|_| ())
            .map_err(|e| file_err(&self.path, e.to_string()))
    }

    /// Reads the next FRAME into `buf`; `false` at the end of the file.
    fn read_frame(&mut self) -> Result<bool, SourceError> {
        let mut line = Vec::new();
        let n = self
            .reader
            .read_until(b'\n', &mut line)
            .map_err(|e| file_err(&self.path, e.to_string()))?;
        if n == 0 {
            return Ok(false);
        }
        if !line.starts_with(b"FRAME") {
            return Err(file_err(&self.path, "expected a FRAME header"));
        }
        self.buf.resize(self.frame_bytes(), 0);
        self.reader
            .read_exact(&mut self.buf)
            .map_err(|e| file_err(&self.path, format!("a frame is cut short: {e}")))?;
        Ok(true)
    }

    fn to_rgb(&self) -> Frame {
        let (w, h) = (self.width as usize, self.height as usize);
        let luma = &self.buf[..w * h];
        let mut rgb = Vec::with_capacity(w * h * 3);
        let cw = w.div_ceil(2);
        let chroma_plane = w.div_ceil(2) * h.div_ceil(2);
        for y in 0..h {
            for x in 0..w {
                let yy = luma[y * w + x];
                let (u, v) = match self.chroma {
                    Chroma::Mono => (128, 128),
                    Chroma::C444 => (self.buf[w * h + y * w + x], self.buf[2 * w * h + y * w + x]),
                    Chroma::C420 => {
                        let c = (y / 2) * cw + x / 2;
                        (self.buf[w * h + c], self.buf[w * h + chroma_plane + c])
                    }
                };
                rgb.extend_from_slice(&yuv_to_rgb(yy, u, v));
            }
        }
        Frame {
            width: self.width,
            height: self.height,
            rgb,
        }
    }
}

impl FrameSource for Y4m {
    fn next_frame(&mut self) -> Result<Arc<Frame>, SourceError> {
        if !self.read_frame()? {
            self.rewind()?;
            self.read_frame()?;
        }
        Ok(Arc::new(self.to_rgb()))
    }
}

/// `YUV4MPEG2 W.. H.. [F.. I.. A.. C.. X..]`: width, height and chroma. Only 8-bit layouts.
fn parse_header(line: &str) -> Result<(u32, u32, Chroma), String> {
    let mut fields = line.trim_end().split(' ');
    if fields.next() != Some("YUV4MPEG2") {
        return Err("not a YUV4MPEG2 (.y4m) file: it must start with `YUV4MPEG2 `".into());
    }
    let (mut w, mut h, mut chroma) = (None, None, Chroma::C420);
    for f in fields {
        let (tag, value) = f.split_at(f.len().min(1));
        match tag {
            "W" => w = value.parse::<u32>().ok(),
            "H" => h = value.parse::<u32>().ok(),
            "C" => {
                chroma = match value {
                    "420" | "420jpeg" | "420paldv" | "420mpeg2" => Chroma::C420,
                    "444" => Chroma::C444,
                    "mono" => Chroma::Mono,
                    other => {
                        return Err(format!(
                            "colour space C{other} is not read; expected C420, C420jpeg, \
                             C420paldv, C420mpeg2, C444 or Cmono (8 bits)"
                        ))
                    }
                }
            }
            _ => {}
        }
    }
    match (w, h) {
        (Some(w), Some(h)) if w > 0 && h > 0 && w <= 16384 && h <= 16384 => Ok((w, h, chroma)),
        _ => Err("the header needs W<width> and H<height> of 1 to 16384".into()),
    }
}

/// BT.601 limited range (Y 16..235, Cb/Cr 16..240), the usual matrix of uncompressed video.
fn yuv_to_rgb(y: u8, u: u8, v: u8) -> [u8; 3] {
    let c = (y as f32 - 16.0) * 1.164;
    let d = u as f32 - 128.0;
    let e = v as f32 - 128.0;
    let clamp = |x: f32| x.round().clamp(0.0, 255.0) as u8;
    [
        clamp(c + 1.596 * e),
        clamp(c - 0.392 * d - 0.813 * e),
        clamp(c + 2.017 * d),
    ]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn synthetic_frames_are_deterministic_and_move() {
        let a = Synthetic::frame(64, 48, 3);
        assert_eq!(a, Synthetic::frame(64, 48, 3));
        assert_ne!(a, Synthetic::frame(64, 48, 4));
        assert_eq!(a.rgb.len(), 64 * 48 * 3);
        // the square of frame 0 starts at (0, 0)
        assert_eq!(Synthetic::frame(64, 48, 0).pixel(0, 0), [240, 240, 240]);
        // gradient outside it: red follows x
        assert_eq!(
            Synthetic::frame(64, 48, 0).pixel(63, 47)[0],
            (63 * 255 / 64) as u8
        );
    }

    #[test]
    fn a_synthetic_source_reusing_its_buffers_gives_the_same_frames() {
        let mut src = Synthetic::new(64, 48);
        let mut held = Vec::new();
        for k in 0..40u64 {
            let f = src.next_frame().unwrap();
            assert_eq!(*f, Synthetic::frame(64, 48, k), "frame {k}");
            // Hold some frames across several periods, as later stages do, so that buffers are
            // both reused and, while all are held, made anew.
            held.push(f);
            if held.len() > (k % 11) as usize {
                held.remove(0);
            }
        }
    }

    fn write_y4m(dir: &Path, header: &str, frames: &[Vec<u8>]) -> PathBuf {
        let p = dir.join("v.y4m");
        let mut bytes = format!("{header}\n").into_bytes();
        for f in frames {
            bytes.extend_from_slice(b"FRAME\n");
            bytes.extend_from_slice(f);
        }
        std::fs::write(&p, bytes).unwrap();
        p
    }

    #[test]
    fn y4m_420_reads_converts_and_cycles() {
        let dir = tempfile::tempdir().unwrap();
        // 2x2 4:2:0: 4 luma + 1 Cb + 1 Cr; frame 0 black (Y 16), frame 1 white (Y 235)
        let f0 = vec![16, 16, 16, 16, 128, 128];
        let f1 = vec![235, 235, 235, 235, 128, 128];
        let p = write_y4m(
            dir.path(),
            "YUV4MPEG2 W2 H2 F30:1 Ip A1:1 C420jpeg",
            &[f0, f1],
        );
        let mut v = Y4m::open(&p).unwrap();
        assert_eq!(v.next_frame().unwrap().pixel(1, 1), [0, 0, 0]);
        assert_eq!(v.next_frame().unwrap().pixel(0, 0), [255, 255, 255]);
        // cycles back to frame 0
        assert_eq!(v.next_frame().unwrap().pixel(0, 0), [0, 0, 0]);
    }

    #[test]
    fn y4m_bad_files_are_named() {
        let dir = tempfile::tempdir().unwrap();
        let p = write_y4m(dir.path(), "YUV4MPEG2 W2 H2 C422", &[vec![0; 8]]);
        let e = Y4m::open(&p).err().unwrap().to_string();
        assert!(e.contains("C422") && e.contains("v.y4m"), "{e}");
        let p = write_y4m(dir.path(), "YUV4MPEG2 W2 H2", &[vec![0; 3]]);
        let e = Y4m::open(&p).err().unwrap().to_string();
        assert!(e.contains("cut short"), "{e}");
        std::fs::write(dir.path().join("x.y4m"), b"RIFF\n").unwrap();
        let e = Y4m::open(&dir.path().join("x.y4m"))
            .err()
            .unwrap()
            .to_string();
        assert!(e.contains("not a YUV4MPEG2"), "{e}");
    }

    #[test]
    fn image_folder_cycles_in_name_order() {
        let dir = tempfile::tempdir().unwrap();
        for (name, colour) in [("b.png", [0u8, 0, 255]), ("a.png", [255, 0, 0])] {
            image::RgbImage::from_pixel(3, 2, image::Rgb(colour))
                .save(dir.path().join(name))
                .unwrap();
        }
        std::fs::write(dir.path().join("notes.txt"), "skip me").unwrap();
        let mut s = ImageFolder::open(dir.path()).unwrap();
        assert_eq!(s.next_frame().unwrap().pixel(0, 0), [255, 0, 0]);
        let b = s.next_frame().unwrap();
        assert_eq!((b.width, b.height, b.pixel(2, 1)), (3, 2, [0, 0, 255]));
        assert_eq!(s.next_frame().unwrap().pixel(0, 0), [255, 0, 0]);
        let empty = tempfile::tempdir().unwrap();
        assert!(ImageFolder::open(empty.path()).is_err());
    }

    /// A file of the folder that is no image, or a PNG cut off before its size, failed its app
    /// at its frame while the run went on (exit 1): refused at open now, named.
    #[test]
    fn an_image_folder_with_a_bad_file_is_refused_at_open_naming_it() {
        let good = tempfile::tempdir().unwrap();
        image::RgbImage::from_pixel(3, 2, image::Rgb([1, 2, 3]))
            .save(good.path().join("a.png"))
            .unwrap();
        let png = std::fs::read(good.path().join("a.png")).unwrap();
        for (name, bytes) in [("b.png", &b"not an image"[..]), ("c.jpg", &png[..12])] {
            let dir = tempfile::tempdir().unwrap();
            std::fs::write(dir.path().join("a.png"), &png).unwrap();
            std::fs::write(dir.path().join(name), bytes).unwrap();
            let e = ImageFolder::open(dir.path()).err().unwrap().to_string();
            assert!(
                e.contains(&dir.path().join(name).display().to_string())
                    && e.contains("not a PNG or JPEG"),
                "{name}: {e}"
            );
        }
        assert!(ImageFolder::open(good.path()).is_ok());
    }
}
