//! NumPy `.npy` files (format versions 1.0–3.0), f32 only, C-order.
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

/// Reads an f32 (or f64, converted) C-order array.
pub fn read_npy(path: impl AsRef<Path>) -> Result<NpyTensor, NpyError> {
    let path = path.as_ref();
    let bytes = std::fs::read(path).map_err(|source| NpyError::Read {
        path: path.to_path_buf(),
        source,
    })?;
    parse_npy(&bytes).map_err(|what| NpyError::Format {
        path: path.to_path_buf(),
        what,
    })
}

/// Parses the bytes of a `.npy` file.
pub fn parse_npy(bytes: &[u8]) -> Result<NpyTensor, String> {
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
    let elem = match descr {
        "<f4" | "=f4" | "|f4" => 4,
        "<f8" | "=f8" => 8,
        other => {
            return Err(format!(
                "dtype {other:?} is not supported (isolane reads float32 '<f4' or float64 '<f8')"
            ))
        }
    };
    let shape = parse_shape(shape_s)?;
    let numel = shape
        .iter()
        .try_fold(1usize, |a, &d| a.checked_mul(d))
        .ok_or("shape overflows")?;
    let data = &bytes[end..];
    let want = numel.checked_mul(elem).ok_or("shape overflows")?;
    if data.len() != want {
        return Err(format!(
            "data holds {} bytes, but shape {shape:?} of {descr} needs {want} (truncated?)",
            data.len()
        ));
    }
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
}
