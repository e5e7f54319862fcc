//! The launch list's parts: the kernels' argument structs (laid out as in the NVRTC source) and
//! [`Launch`], one thing issued on the stream with every pointer resolved.

use super::*;

#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub(super) struct Space {
    pub(super) rank: i32,
    pub(super) dims: [i64; MAX_RANK],
    pub(super) s0: [i64; MAX_RANK],
    pub(super) s1: [i64; MAX_RANK],
    pub(super) s2: [i64; MAX_RANK],
}

impl Space {
    pub(super) fn from(s: &Strided) -> Space {
        let mut sp = Space {
            rank: s.dims.len() as i32,
            ..Default::default()
        };
        for d in 0..s.dims.len() {
            sp.dims[d] = s.dims[d] as i64;
            sp.s0[d] = s.strides[0][d] as i64;
            sp.s1[d] = s.strides.get(1).map_or(0, |v| v[d] as i64);
            sp.s2[d] = s.strides.get(2).map_or(0, |v| v[d] as i64);
        }
        sp
    }
}

#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub(super) struct PoolP {
    pub(super) v: [i32; 16],
    pub(super) xs: [i64; 4],
    pub(super) ys: [i64; 4],
}

/// `ResizeP` of the NVRTC source: (n, c, h, w, oh, ow, linear, coord, nearest, pad), the
/// coordinate scales, then the strides of x and y along (n, c, h, w).
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub(super) struct ResizeP {
    pub(super) v: [i32; 10],
    pub(super) scales: [f32; 2],
    pub(super) xs: [i64; 4],
    pub(super) ys: [i64; 4],
}

#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub(super) struct DwP {
    pub(super) v: [i32; 16],
    pub(super) p0: f32,
    pub(super) p1: f32,
    pub(super) whwc: i32,
    pub(super) pad: i32,
    pub(super) xs: [i64; 4],
    pub(super) ys: [i64; 4],
}

pub(super) fn strides4(shape: &[usize; 4], nhwc: bool) -> [i64; 4] {
    let s = crate::plan::phys_strides(shape, nhwc);
    [s[0] as i64, s[1] as i64, s[2] as i64, s[3] as i64]
}

/// `StemP` of the `conv_stem_*` kernels: n, h, w, c, oh, ow, m, kh, kw, sh, sw, ph, pw, dh,
/// dw, kp, act, tiles_x, tiles_y, cinv; then the activation's p0, p1.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub(super) struct StemP {
    pub(super) v: [i32; 20],
    pub(super) p0: f32,
    pub(super) p1: f32,
}

/// `CastQ` of `cast_in_nhwc`: whether to fake-quantize, whether as float8, whether
/// saturating; then scale, zero point and the integer range's ends.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub(super) struct CastQ {
    pub(super) flags: [i32; 3],
    pub(super) v: [f32; 4],
}

#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub(super) struct ImP {
    pub(super) v: [i32; 14],
}

/// `AttnP` of the attention kernel: s, heads, qtiles, pad; scale_log2, oscale; the (image,
/// head) strides of q, k, v, y; their row strides (elements).
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub(super) struct AttnP {
    pub(super) v: [i32; 4],
    pub(super) scale_log2: f32,
    pub(super) oscale: f32,
    pub(super) bh: [i64; 8],
    pub(super) rows: [i32; 4],
}

/// Rescales a copy's iteration space to words of `w` bytes (elements of `es` bytes) when the
/// innermost dim is contiguous in both operands and every size, stride and address allows it.
pub(super) fn widen_copy(s: &Strided, es: usize, w: usize, ptrs: [u64; 2]) -> Option<Strided> {
    let r = s.dims.len();
    if r == 0 || w <= es || ptrs.iter().any(|p| p % w as u64 != 0) {
        return None;
    }
    let f = w / es;
    if s.strides.iter().any(|st| st[r - 1] != 1) || !s.dims[r - 1].is_multiple_of(f) {
        return None;
    }
    if s.strides
        .iter()
        .any(|st| st[..r - 1].iter().any(|x| x % f != 0))
    {
        return None;
    }
    let mut dims = s.dims.clone();
    dims[r - 1] /= f;
    let strides = s
        .strides
        .iter()
        .map(|st| {
            let mut v: Vec<usize> = st.iter().map(|x| x / f).collect();
            v[r - 1] = 1;
            v
        })
        .collect();
    Some(Strided { dims, strides })
}

#[derive(Clone, Debug)]
pub(super) enum Arg {
    Ptr(u64),
    I64(i64),
    I32(i32),
    F32(f32),
    Space(Box<Space>),
    Pool(Box<PoolP>),
    Resize(Box<ResizeP>),
    Dw(Box<DwP>),
    Im(Box<ImP>),
    Attn(Box<AttnP>),
    Stem(Box<StemP>),
    CastQ(Box<CastQ>),
}

impl Arg {
    pub(super) fn as_ptr(&self) -> *mut c_void {
        match self {
            Arg::Ptr(v) => v as *const u64 as *mut c_void,
            Arg::I64(v) => v as *const i64 as *mut c_void,
            Arg::I32(v) => v as *const i32 as *mut c_void,
            Arg::F32(v) => v as *const f32 as *mut c_void,
            Arg::Space(b) => &**b as *const Space as *mut c_void,
            Arg::Pool(b) => &**b as *const PoolP as *mut c_void,
            Arg::Resize(b) => &**b as *const ResizeP as *mut c_void,
            Arg::Dw(b) => &**b as *const DwP as *mut c_void,
            Arg::Im(b) => &**b as *const ImP as *mut c_void,
            Arg::Attn(b) => &**b as *const AttnP as *mut c_void,
            Arg::Stem(b) => &**b as *const StemP as *mut c_void,
            Arg::CastQ(b) => &**b as *const CastQ as *mut c_void,
        }
    }
}

/// One thing issued on the stream, with every pointer resolved.
#[derive(Clone, Debug)]
pub(super) enum Launch {
    Kernel {
        func: usize,
        grid: u32,
        block: u32,
        /// Dynamic shared memory in bytes (0 for kernels that declare theirs statically).
        shared: u32,
        args: Vec<Arg>,
    },
    Conv {
        conv: usize,
        x: u64,
        w: u64,
        y: u64,
    },
    /// A cuDNN graph-API plan (`dnn_graph`), its epilogue fused or not.
    ConvGraph {
        graph: usize,
        ptrs: Box<ConvGraphPtrs>,
    },
    Matmul {
        mm: usize,
        a: u64,
        b: u64,
        /// Added with beta = 1 when non-zero (a fused residual).
        c: u64,
        y: u64,
    },
    HtoD {
        dst: u64,
        src: *const c_void,
        bytes: usize,
    },
    DtoH {
        dst: *mut c_void,
        src: u64,
        bytes: usize,
    },
}

#[cfg(test)]
mod tests {
    use crate::plan::DType;

    /// The launch's `CastQ` is `cast_in_nhwc`'s: three ints, then four floats, no padding.
    #[test]
    fn the_cast_quantization_matches_the_kernels_struct() {
        let src = crate::kernels::source(DType::F16);
        let at = src.find("struct CastQ {").expect("the kernel's struct") + "struct CastQ {".len();
        let body = &src[at..at + src[at..].find("};").expect("closed")];
        let fields: Vec<&str> = body.split(';').map(str::trim).collect();
        assert_eq!(
            fields[..2],
            ["int fq, fp8, saturate", "float s, z, lo, hi"],
            "{body}"
        );
        assert_eq!(std::mem::size_of::<super::CastQ>(), 7 * 4);
    }
}
