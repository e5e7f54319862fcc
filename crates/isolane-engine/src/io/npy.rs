//! NumPy `.npy` files (format versions 1.0–3.0), f32 only, C-order (and integer class labels,
//! [`read_npy_labels`]).
//!
//! A small implementation rather than `ndarray-npy`: isolane needs one dtype and no ndarray, and the
//! format is a short text header plus raw little-endian data. Reading also accepts `<f8` (converted
//! to f32, as the engine computes in f32) so that arrays saved from float64 NumPy code work.

use std::io::Write;
use std::path::{Path, PathBuf};

#[derive(Debug, thiserror::Error)]
pub enum NpyError {
    #[error("cannot read {path}: {source}")]
    Read {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("cannot write {path}: {source}")]
    Write {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("{path} is not a usable .npy file: {what}")]
    Format { path: PathBuf, what: String },
}

/// An f32 array: shape and C-order data.
#[derive(Debug, Clone, PartialEq)]
pub struct NpyTensor {
    pub shape: Vec<usize>,
    pub data: Vec<f32>,
}

const MAGIC: &[u8] = b"\x93NUMPY";

/// The largest `.npy` file isolane reads (an input batch, a calibration set, labels): far
/// beyond any input of the models it runs, and a bound on what a wrong path can take.
pub const MAX_NPY_BYTES: u64 = 4 << 30;

/// The bytes of the `.npy` file `path`: a regular file of at most [`MAX_NPY_BYTES`]
/// (`isolane_core::files::read_file_capped`), so a device or a FIFO is refused, not read
/// without end.
fn read_bytes(path: &Path) -> Result<Vec<u8>, NpyError> {
    isolane_core::files::read_file_capped(path, MAX_NPY_BYTES).map_err(|source| NpyError::Read {
        path: path.to_path_buf(),
        source,
    })
}

/// Reads an f32 (or f64, converted) C-order array.
pub fn read_npy(path: impl AsRef<Path>) -> Result<NpyTensor, NpyError> {
    let path = path.as_ref();
    let bytes = read_bytes(path)?;
    parse_npy(&bytes).map_err(|what| NpyError::Format {
        path: path.to_path_buf(),
        what,
    })
}

/// Parses the bytes of a `.npy` file.
pub fn parse_npy(bytes: &[u8]) -> Result<NpyTensor, String> {
    let (descr, shape, data) = split_npy(bytes)?;
    let elem = match descr {
        "<f4" | "=f4" | "|f4" => 4,
        "<f8" | "=f8" => 8,
        other => {
            return Err(format!(
                "dtype {other:?} is not supported (isolane reads float32 '<f4' or float64 '<f8')"
            ))
        }
    };
    let data = checked_data(descr, &shape, elem, data)?;
    let data = if elem == 4 {
        data.chunks_exact(4)
            .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
            .collect()
    } else {
        data.chunks_exact(8)
            .map(|c| f64::from_le_bytes([c[0], c[1], c[2], c[3], c[4], c[5], c[6], c[7]]) as f32)
            .collect()
    };
    Ok(NpyTensor { shape, data })
}

/// Reads class labels: a C-order array of integers (any of NumPy's little-endian int or uint
/// dtypes, as `np.save(labels)` writes them; int64 by default) or of floats that are whole
/// numbers, of shape `[N]` or `[N, 1]`. Negative or fractional labels are errors.
pub fn read_npy_labels(path: impl AsRef<Path>) -> Result<Vec<usize>, NpyError> {
    let path = path.as_ref();
    let bytes = read_bytes(path)?;
    parse_npy_labels(&bytes).map_err(|what| NpyError::Format {
        path: path.to_path_buf(),
        what,
    })
}

/// Parses the bytes of a labels `.npy` file ([`read_npy_labels`]).
pub fn parse_npy_labels(bytes: &[u8]) -> Result<Vec<usize>, String> {
    let (descr, shape, data) = split_npy(bytes)?;
    if !(shape.len() == 1 || (shape.len() == 2 && shape[1] == 1)) {
        return Err(format!(
            "labels have shape {shape:?}; expected [N] or [N, 1] (one class per item)"
        ));
    }
    let code = descr.trim_start_matches(['<', '=', '|']);
    let (elem, kind) = match code {
        "i1" | "u1" | "b1" => (1, code.as_bytes()[0]),
        "i2" | "u2" => (2, code.as_bytes()[0]),
        "i4" | "u4" | "f4" => (4, code.as_bytes()[0]),
        "i8" | "u8" | "f8" => (8, code.as_bytes()[0]),
        _ => {
            return Err(format!(
                "labels of dtype {descr:?} are not supported (expected little-endian integers \
                 such as int64 '<i8', or whole-number floats)"
            ))
        }
    };
    let data = checked_data(descr, &shape, elem, data)?;
    data.chunks_exact(elem)
        .enumerate()
        .map(|(i, c)| {
            let mut b = [0u8; 8];
            b[..elem].copy_from_slice(c);
            let v: f64 = match (kind, elem) {
                (b'i', _) => {
                    // Sign-extend from the element's width.
                    let shift = 64 - 8 * elem as u32;
                    ((i64::from_le_bytes(b) << shift) >> shift) as f64
                }
                (b'f', 4) => f32::from_le_bytes([b[0], b[1], b[2], b[3]]) as f64,
                (b'f', _) => f64::from_le_bytes(b),
                _ => u64::from_le_bytes(b) as f64,
            };
            if v >= 0.0 && v.fract() == 0.0 && v < u32::MAX as f64 {
                Ok(v as usize)
            } else {
                Err(format!(
                    "label {i} is {v}; labels are class indices (whole numbers >= 0)"
                ))
            }
        })
        .collect()
}

/// The dtype, the shape and the data of a C-order `.npy` file.
fn split_npy(bytes: &[u8]) -> Result<(&str, Vec<usize>, &[u8]), String> {
    if bytes.len() < 10 || &bytes[..6] != MAGIC {
        return Err("no NUMPY magic (not a .npy file?)".into());
    }
    let major = bytes[6];
    let (header_len, start) = match major {
        1 => (u16::from_le_bytes([bytes[8], bytes[9]]) as usize, 10usize),
        2 | 3 => {
            if bytes.len() < 12 {
                return Err("truncated header".into());
            }
            (
                u32::from_le_bytes([bytes[8], bytes[9], bytes[10], bytes[11]]) as usize,
                12,
            )
        }
        v => return Err(format!("format version {v} is not supported")),
    };
    let end = start
        .checked_add(header_len)
        .filter(|&e| e <= bytes.len())
        .ok_or("truncated header")?;
    let header =
        std::str::from_utf8(&bytes[start..end]).map_err(|_| "header is not text".to_string())?;
    let descr = dict_value(header, "descr").ok_or("header has no 'descr'")?;
    let fortran = dict_value(header, "fortran_order").ok_or("header has no 'fortran_order'")?;
    let shape_s = dict_value(header, "shape").ok_or("header has no 'shape'")?;

    if fortran.trim() != "False" {
        return Err(
            "Fortran-order arrays are not supported (save with np.ascontiguousarray)".into(),
        );
    }
    let descr = descr.trim().trim_matches(|c| c == '\'' || c == '"');
    let shape = parse_shape(shape_s)?;
    Ok((descr, shape, &bytes[end..]))
}

/// `data`, checked to hold exactly the `shape`'s elements of `elem` bytes.
fn checked_data<'a>(
    descr: &str,
    shape: &[usize],
    elem: usize,
    data: &'a [u8],
) -> Result<&'a [u8], String> {
    let numel = shape
        .iter()
        .try_fold(1usize, |a, &d| a.checked_mul(d))
        .ok_or("shape overflows")?;
    let want = numel.checked_mul(elem).ok_or("shape overflows")?;
    if data.len() != want {
        return Err(format!(
            "data holds {} bytes, but shape {shape:?} of {descr} needs {want} (truncated?)",
            data.len()
        ));
    }
    Ok(data)
}

/// The text after `'key':` up to the next top-level comma or closing brace. Enough for the fixed
/// dictionary NumPy writes (`descr`, `fortran_order`, `shape`); a tuple's commas are skipped.
fn dict_value<'a>(header: &'a str, key: &str) -> Option<&'a str> {
    let pat_s = format!("'{key}'");
    let pat_d = format!("\"{key}\"");
    let i = header.find(&pat_s).or_else(|| header.find(&pat_d))? + pat_s.len();
    let rest = header[i..].trim_start().strip_prefix(':')?;
    let mut depth = 0;
    for (j, c) in rest.char_indices() {
        match c {
            '(' => depth += 1,
            ')' => depth -= 1,
            ',' | '}' if depth == 0 => return Some(&rest[..j]),
            _ => {}
        }
    }
    None
}

fn parse_shape(s: &str) -> Result<Vec<usize>, String> {
    let inner = s
        .trim()
        .strip_prefix('(')
        .and_then(|s| s.strip_suffix(')'))
        .ok_or_else(|| format!("bad shape {s:?}"))?;
    inner
        .split(',')
        .map(str::trim)
        .filter(|p| !p.is_empty())
        .map(|p| {
            p.trim_end_matches('L')
                .parse::<usize>()
                .map_err(|_| format!("bad shape {s:?}"))
        })
        .collect()
}

/// Encodes an f32 C-order array as `.npy` version 1.0 bytes.
pub fn encode_npy(shape: &[usize], data: &[f32]) -> Vec<u8> {
    let shape_s = match shape.len() {
        0 => "()".to_string(),
        1 => format!("({},)", shape[0]),
        _ => format!(
            "({})",
            shape
                .iter()
                .map(usize::to_string)
                .collect::<Vec<_>>()
                .join(", ")
        ),
    };
    let mut header = format!("{{'descr': '<f4', 'fortran_order': False, 'shape': {shape_s}, }}");
    // Pad with spaces so that magic + length + header + '\n' is a multiple of 64 (NumPy's rule,
    // so that the data is aligned when memory-mapped).
    let total = MAGIC.len() + 4 + header.len() + 1;
    header.push_str(&" ".repeat((64 - total % 64) % 64));
    header.push('\n');
    let mut out = Vec::with_capacity(10 + header.len() + data.len() * 4);
    out.extend_from_slice(MAGIC);
    out.extend_from_slice(&[1, 0]);
    out.extend_from_slice(&(header.len() as u16).to_le_bytes());
    out.extend_from_slice(header.as_bytes());
    for x in data {
        out.extend_from_slice(&x.to_le_bytes());
    }
    out
}

/// Writes an f32 C-order array to `path` atomically (temp file + rename), so a reader never sees a
/// half-written file.
pub fn write_npy(path: impl AsRef<Path>, shape: &[usize], data: &[f32]) -> Result<(), NpyError> {
    let path = path.as_ref();
    debug_assert_eq!(shape.iter().product::<usize>(), data.len());
    let werr = |source| NpyError::Write {
        path: path.to_path_buf(),
        source,
    };
    let mut tmp = path.as_os_str().to_owned();
    tmp.push(".tmp");
    let tmp = PathBuf::from(tmp);
    let result = (|| {
        let mut f = std::fs::File::create(&tmp)?;
        f.write_all(&encode_npy(shape, data))?;
        f.sync_all()?;
        std::fs::rename(&tmp, path)
    })();
    if result.is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
    result.map_err(werr)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `--input x.npy` linked to /dev/zero took all of memory, and a FIFO blocked for good:
    /// both are refused naming the file and what it is, before a byte is read.
    #[test]
    fn a_device_or_a_fifo_is_no_npy_file() {
        let d = tempfile::tempdir().unwrap();
        let cases = isolane_core::files::a_device_and_a_fifo(d.path(), ".npy");
        for (p, what) in &cases {
            for e in [
                read_npy(p).unwrap_err().to_string(),
                read_npy_labels(p).unwrap_err().to_string(),
            ] {
                assert!(
                    e.starts_with(&format!("cannot read {}: is {what}", p.display())),
                    "{e}"
                );
            }
        }
    }

    #[test]
    fn roundtrip_shapes() {
        for shape in [vec![], vec![3], vec![2, 3], vec![1, 3, 4, 5], vec![0, 2]] {
            let n: usize = shape.iter().product();
            let data: Vec<f32> = (0..n).map(|i| i as f32 * 0.5 - 1.0).collect();
            let bytes = encode_npy(&shape, &data);
            assert_eq!(bytes.len() % 64, (n * 4) % 64);
            let t = parse_npy(&bytes).unwrap();
            assert_eq!(t.shape, shape);
            assert_eq!(t.data, data);
        }
    }

    #[test]
    fn rejects_bad_files() {
        assert!(parse_npy(b"hello").is_err());
        let mut b = encode_npy(&[4], &[1.0, 2.0, 3.0, 4.0]);
        b.truncate(b.len() - 3);
        assert!(parse_npy(&b).unwrap_err().contains("truncated"));
        let mut b = encode_npy(&[2], &[1.0, 2.0]);
        let at = b.windows(3).position(|w| w == b"<f4").unwrap();
        b[at + 1] = b'i';
        assert!(parse_npy(&b).unwrap_err().contains("<i4"));
    }

    /// `bytes` of a 1.0 `.npy` file of dtype `descr` and `shape` holding `data`.
    fn npy_of(descr: &str, shape: &str, data: &[u8]) -> Vec<u8> {
        let mut header =
            format!("{{'descr': '{descr}', 'fortran_order': False, 'shape': {shape}, }}");
        header.push('\n');
        let mut b = MAGIC.to_vec();
        b.extend_from_slice(&[1, 0]);
        b.extend_from_slice(&(header.len() as u16).to_le_bytes());
        b.extend_from_slice(header.as_bytes());
        b.extend_from_slice(data);
        b
    }

    #[test]
    fn labels_read_numpys_integer_and_whole_float_dtypes() {
        let i8s: Vec<u8> = [3i64, 0, 9].iter().flat_map(|v| v.to_le_bytes()).collect();
        assert_eq!(
            parse_npy_labels(&npy_of("<i8", "(3,)", &i8s)),
            Ok(vec![3, 0, 9])
        );
        assert_eq!(
            parse_npy_labels(&npy_of("|u1", "(3, 1)", &[7, 1, 255])),
            Ok(vec![7, 1, 255])
        );
        let f4s: Vec<u8> = [2f32, 5.0].iter().flat_map(|v| v.to_le_bytes()).collect();
        assert_eq!(
            parse_npy_labels(&npy_of("<f4", "(2,)", &f4s)),
            Ok(vec![2, 5])
        );
        let i2s: Vec<u8> = [4i16, 1].iter().flat_map(|v| v.to_le_bytes()).collect();
        assert_eq!(
            parse_npy_labels(&npy_of("<i2", "(2,)", &i2s)),
            Ok(vec![4, 1])
        );
    }

    #[test]
    fn labels_that_are_not_class_indices_are_refused_by_item() {
        let neg: Vec<u8> = [1i32, -1].iter().flat_map(|v| v.to_le_bytes()).collect();
        let e = parse_npy_labels(&npy_of("<i4", "(2,)", &neg)).unwrap_err();
        assert!(e.contains("label 1 is -1"), "{e}");
        let frac: Vec<u8> = [0.5f64].iter().flat_map(|v| v.to_le_bytes()).collect();
        let e = parse_npy_labels(&npy_of("<f8", "(1,)", &frac)).unwrap_err();
        assert!(e.contains("label 0 is 0.5"), "{e}");
        let e = parse_npy_labels(&npy_of("<i8", "(1, 2)", &[0; 16])).unwrap_err();
        assert!(e.contains("expected [N] or [N, 1]"), "{e}");
        let e = parse_npy_labels(&npy_of("<U1", "(1,)", &[0; 4])).unwrap_err();
        assert!(e.contains("not supported"), "{e}");
        let e = parse_npy_labels(&npy_of("<i8", "(2,)", &[0; 12])).unwrap_err();
        assert!(e.contains("truncated"), "{e}");
    }
}
