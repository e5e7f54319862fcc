//! Convolution as an implicit GEMM: no im2col matrix is ever written.
//!
//! The input is copied, band by band, into zero-padded *phase planes*: for strides `(sh, sw)`, plane
//! `(ry, rx)` of channel `ci` holds `xpad[sh·Y + ry][sw·X + rx]` (`xpad` = the input with the
//! convolution's zero padding) on a `hv × wv` grid. Output pixel `(oy, ox)` becomes GEMM column
//! `j = oy·wv + ox`, and the GEMM row of tap `(ci, ki, kj)` is then a *contiguous* run of plane
//! `(ki mod sh, kj mod sw)` starting at `(ki div sh)·wv + (kj div sw)`: B's rows are shifted views
//! of the planes (`BRows::Offsets`), which the packed GEMM copies into an L1-resident panel as it
//! goes. The `wv − ow` columns at the end of each output row are computed and dropped; the
//! kernel preparation (`Kernel::prepare`) uses this path only where that waste costs less than the im2col copy it saves.
//!
//! Each task (a band of output rows × a range of output channels) fills the planes for its own
//! band (with the kernel's halo) in its thread's part of the scratch, multiplies, and lands the
//! product in a per-thread block (`Ctmp`, rows = output channels, columns = whole output rows in
//! the `wv` grid); bias, residual and activation are applied while copying its valid columns to
//! the output. Filling per task needs no barrier between filling and multiplying, and each core
//! reads planes it wrote itself, from its own L2.

use super::math::SharedMut;
use super::packed::{copy_epilogue, BRows, CopyEpilogue, Epi, Isa, PackedA};
use crate::ir::Unary;
use rayon::prelude::*;

/// Largest per-thread product block, in floats (256 KiB: with the band's planes it stays in a
/// 2 MiB L2 next to the weights; bands this tall keep the halo rows that every band fills again
/// a small fraction, e.g. 3 of 11 plane rows for the 7×7 stem instead of 3 of 7).
const CTMP_FLOATS: usize = 65536;

#[derive(Clone, Debug)]
pub(crate) struct Implicit {
    n: usize,
    c: usize,
    h: usize,
    w: usize,
    m: usize,
    oh: usize,
    ow: usize,
    sh: usize,
    sw: usize,
    pt: usize,
    pl: usize,
    /// Phases per axis: `min(stride, kernel)`.
    py: usize,
    px: usize,
    kh: usize,
    kw: usize,
    wv: usize,
    /// The split for the model's thread count (`configure`); unset, the path is not used.
    cfg: Option<Config>,
}

#[derive(Clone, Debug)]
struct Config {
    threads: usize,
    t: Tiling,
    /// Plane rows per task: its output rows plus the kernel's halo.
    hvt: usize,
    /// Per GEMM row `(ci, ki, kj)`: where its run starts within a task's planes.
    offs: Vec<usize>,
    /// Floats of one thread's planes and of its Ctmp block (multiples of 16).
    planes_len: usize,
    ctmp_len: usize,
}

/// How a run is split into tasks for a given thread count.
#[derive(Clone, Debug)]
struct Tiling {
    /// Output rows per task.
    rows: usize,
    tiles: usize,
    /// Output-channel chunks (whole panels) per row tile.
    mchunks: usize,
    panels_per: usize,
    /// Row stride of a Ctmp block (whole tile, rounded to 16 floats).
    ld: usize,
}

impl Implicit {
    /// The implicit-GEMM layout for a dense (groups = 1, dilation 1) convolution, or `None` where the
    /// dropped columns would cost more than an im2col copy: the waste is `m` multiply-adds per
    /// dropped column against roughly one copied element per GEMM column and row, so the path is
    /// taken when `waste · m` stays under ~48 (e.g. 64 channels at any size, 256 channels at
    /// 14×14; not 512 channels at 7×7).
    #[allow(clippy::too_many_arguments)]
    pub fn prepare(
        x: &[usize],
        m: usize,
        o: &[usize],
        k: [usize; 2],
        s: [usize; 2],
        pads: [usize; 2],
        dil: [usize; 2],
        groups: usize,
    ) -> Option<Implicit> {
        let (n, c, h, w) = (x[0], x[1], x[2], x[3]);
        let (oh, ow) = (o[2], o[3]);
        let ([kh, kw], [sh, sw], [pt, pl]) = (k, s, pads);
        if groups != 1
            || dil != [1, 1]
            || kh == 0
            || kw == 0
            || oh == 0
            || ow == 0
            || sh == 0
            || sw == 0
        {
            return None;
        }
        let (py, px) = (sh.min(kh), sw.min(kw));
        let wv = ow + (kw - 1) / sw;
        let cols = (oh - 1) * wv + ow;
        let waste = (cols - oh * ow) as f64 / (oh * ow) as f64;
        if waste * m as f64 > 48.0 {
            return None;
        }
        Some(Implicit {
            n,
            c,
            h,
            w,
            m,
            oh,
            ow,
            sh,
            sw,
            pt,
            pl,
            py,
            px,
            kh,
            kw,
            wv,
            cfg: None,
        })
    }

    /// This layout, configured for a pool of `threads` threads and the micro-kernel's `mr`.
    pub fn configure(&self, threads: usize, mr: usize) -> Implicit {
        let threads = threads.max(1);
        let t = self.tiling(threads, mr);
        let hvt = t.rows + (self.kh - 1) / self.sh;
        let plane = hvt * self.wv;
        let mut offs = Vec::with_capacity(self.c * self.kh * self.kw);
        for ci in 0..self.c {
            for ki in 0..self.kh {
                for kj in 0..self.kw {
                    let ph = (ki % self.sh) * self.px + kj % self.sw;
                    offs.push((ph * self.c + ci) * plane + (ki / self.sh) * self.wv + kj / self.sw);
                }
            }
        }
        let planes_len = (self.py * self.px * self.c * plane).next_multiple_of(16);
        let ctmp_len = t.panels_per * mr * t.ld;
        Implicit {
            cfg: Some(Config {
                threads,
                t,
                hvt,
                offs,
                planes_len,
                ctmp_len,
            }),
            ..self.clone()
        }
    }

    pub fn is_configured(&self) -> bool {
        self.cfg.is_some()
    }

    fn tiling(&self, threads: usize, mr: usize) -> Tiling {
        let threads = threads.max(1);
        let panels = self.m.div_ceil(mr);
        let rows_for = |ch: usize| (CTMP_FLOATS / ch.max(1) / self.wv).clamp(1, self.oh);
        let mut rows = rows_for(self.m);
        let mut tiles = self.oh.div_ceil(rows);
        let mut mchunks = 1;
        if threads > 1 {
            // A multiple of the thread count of (image, tile) units, with the rows spread evenly;
            // where rows cannot be spread evenly (few, odd rows), split the output channels.
            let units = (tiles * self.n).next_multiple_of(threads);
            let t = units.div_ceil(self.n).min(self.oh);
            let r = self.oh.div_ceil(t);
            let t = self.oh.div_ceil(r);
            let balance = self.oh as f64 / (r * t) as f64;
            let even = (t * self.n).is_multiple_of(threads) && balance >= 0.9;
            if even || panels < 2 * threads {
                rows = r;
                tiles = t;
            } else {
                mchunks = threads;
                rows = rows_for(self.m.div_ceil(threads));
                tiles = self.oh.div_ceil(rows);
            }
        }
        let panels_per = panels.div_ceil(mchunks);
        Tiling {
            rows,
            tiles,
            mchunks,
            panels_per,
            ld: ((rows - 1) * self.wv + self.ow).next_multiple_of(16),
        }
    }

    /// Scratch floats: per thread, its planes and its Ctmp block.
    pub fn scratch_len(&self) -> usize {
        self.cfg
            .as_ref()
            .map_or(0, |c| c.threads * (c.planes_len + c.ctmp_len))
    }

    /// Fills planes `0..n` (phase-major, then channel) of image `img` for plane rows `y0 ..`,
    /// each `plane` floats of `dst`; compiled for AVX2 where the CPU has it, so that the
    /// stride-2 gathers of strided convolutions vectorise.
    fn fill_planes(
        &self,
        isa: Isa,
        x: &[f32],
        img: usize,
        y0: usize,
        plane: usize,
        dst: &mut [f32],
    ) {
        #[cfg(target_arch = "x86_64")]
        if isa != Isa::Portable {
            // SAFETY: AVX2 and FMA were detected (every ISA but Portable implies them).
            return unsafe { self.fill_planes_avx2(x, img, y0, plane, dst) };
        }
        let _ = isa;
        for (pi, d) in dst.chunks_mut(plane).enumerate() {
            self.fill_plane(x, img, pi, y0, d);
        }
    }

    #[cfg(target_arch = "x86_64")]
    #[target_feature(enable = "avx2,fma")]
    unsafe fn fill_planes_avx2(
        &self,
        x: &[f32],
        img: usize,
        y0: usize,
        plane: usize,
        dst: &mut [f32],
    ) {
        for (pi, d) in dst.chunks_mut(plane).enumerate() {
            self.fill_plane(x, img, pi, y0, d);
        }
    }

    /// Fills plane `pi` (phase-major, then channel) of image `img` for plane rows
    /// `y0 .. y0 + dst.len() / wv`.
    #[inline(always)]
    fn fill_plane(&self, x: &[f32], img: usize, pi: usize, y0: usize, dst: &mut [f32]) {
        let ci = pi % self.c;
        let ph = pi / self.c;
        let (ry, rx) = (ph / self.px, ph % self.px);
        let src = &x[(img * self.c + ci) * self.h * self.w..][..self.h * self.w];
        let xoff = rx as isize - self.pl as isize;
        let (xlo, xhi) = super::math::valid_range(xoff, self.sw, self.w, self.wv);
        for (yl, row) in dst.chunks_mut(self.wv).enumerate() {
            let iy = (self.sh * (y0 + yl) + ry) as isize - self.pt as isize;
            if iy < 0 || iy >= self.h as isize || xlo >= xhi {
                row.fill(0.0);
                continue;
            }
            let srow = &src[iy as usize * self.w..][..self.w];
            row[..xlo].fill(0.0);
            row[xhi..].fill(0.0);
            let s0 = (xlo as isize * self.sw as isize + xoff) as usize;
            let d = &mut row[xlo..xhi];
            if self.sw == 1 {
                d.copy_from_slice(&srow[s0..s0 + d.len()]);
            } else if self.sw == 2 {
                let s = &srow[s0..s0 + 2 * d.len() - 1];
                for (v, e) in d.iter_mut().zip(s.chunks(2)) {
                    *v = e[0];
                }
            } else {
                for (v, &e) in d.iter_mut().zip(srow[s0..].iter().step_by(self.sw)) {
                    *v = e;
                }
            }
        }
    }

    /// Runs the convolution. `scratch` starts on a cache line and holds `scratch_len` floats;
    /// `out` is `n × m × oh × ow`; `res`, if any, is laid out like `out`. Must be configured.
    ///
    /// # Safety
    /// `out` and `scratch` are valid for writes of their lengths, overlap nothing else passed
    /// in, and no one else touches them while this runs.
    #[allow(clippy::too_many_arguments)]
    pub unsafe fn run(
        &self,
        pa: &PackedA,
        x: &[f32],
        bias: Option<&[f32]>,
        res: Option<&[f32]>,
        act: Option<Unary>,
        out: *mut f32,
        scratch: *mut f32,
        threads: usize,
    ) {
        let Some(cfg) = &self.cfg else { return };
        let (t, mr) = (&cfg.t, pa.isa.mr());
        // Scratch blocks are per thread of the configured pool; in any other pool (not the
        // case in a compiled model) run on this thread alone, in block 0.
        let par = threads == cfg.threads && threads > 1;
        let (scratch, out) = (SharedMut(scratch), SharedMut(out));
        let nplanes = self.py * self.px * self.c;
        let tasks = self.n * t.tiles * t.mchunks;
        let task = |ti: usize| {
            let mc = ti % t.mchunks;
            let tile = (ti / t.mchunks) % t.tiles;
            let img = ti / (t.mchunks * t.tiles);
            let (oy0, oy1) = (tile * t.rows, ((tile + 1) * t.rows).min(self.oh));
            let (p0, p1) = (mc * t.panels_per, ((mc + 1) * t.panels_per).min(pa.panels));
            if oy0 >= oy1 || p0 >= p1 {
                return;
            }
            let ncols = (oy1 - oy0 - 1) * self.wv + self.ow;
            let tid = if par {
                rayon::current_thread_index().unwrap_or(0) % cfg.threads
            } else {
                0
            };
            // SAFETY: thread `tid` owns scratch block `tid` (its planes, then its Ctmp): a thread
            // runs one task at a time and never yields to rayon inside one. The GEMM reads rows
            // `offs[k] .. + ncols` of the planes: inside them, since a plane has the band's rows
            // plus the halo and `wv` leaves room for every tap's column shift (see `prepare`).
            unsafe {
                let base = scratch.get().add(tid * (cfg.planes_len + cfg.ctmp_len));
                let plane = cfg.hvt * self.wv;
                let planes = std::slice::from_raw_parts_mut(base, nplanes * plane);
                self.fill_planes(pa.isa, x, img, oy0, plane, planes);
                let ctmp = base.add(cfg.planes_len);
                let none = Epi {
                    bias: None,
                    col_bias: None,
                    res: None,
                    act: None,
                };
                pa.gemm_rows(
                    0,
                    p0,
                    p1,
                    ncols,
                    BRows::Offsets(base, &cfg.offs),
                    ctmp,
                    t.ld,
                    &none,
                );
                for r in p0 * mr..(p1 * mr).min(self.m) {
                    let o = ((img * self.m + r) * self.oh + oy0) * self.ow;
                    let rows = oy1 - oy0;
                    let src = std::slice::from_raw_parts(
                        ctmp.add((r - p0 * mr) * t.ld),
                        (rows - 1) * self.wv + self.ow,
                    );
                    let dst = std::slice::from_raw_parts_mut(out.get().add(o), rows * self.ow);
                    let res = res.map(|rs| &rs[o..o + rows * self.ow]);
                    let b = bias.map_or(0.0, |b| b[r]);
                    let e = CopyEpilogue {
                        src,
                        lds: self.wv,
                        ow: self.ow,
                        b,
                        res,
                        act,
                    };
                    copy_epilogue(pa.isa, &e, dst);
                }
            }
        };
        if par {
            (0..tasks).into_par_iter().for_each(task);
        } else {
            (0..tasks).for_each(task);
        }
    }
}
