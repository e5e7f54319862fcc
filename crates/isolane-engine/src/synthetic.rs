//! CPU versions of the synthetic `kernel:` workloads (core's `spec::kernel`): the same work per
//! job as on the GPU, on one thread, so that scenarios and the interference matrix with
//! kernel neighbours run (and are tested) on a machine without a GPU. The GEMM computes in f32
//! whatever precision the model names: the CPU has no tensor cores to exercise.

/// One synthetic kernel's buffers; [`CpuKernel::run`] is one job.
pub enum CpuKernel {
    /// `a = b + s·c`.
    Triad {
        a: Vec<f32>,
        b: Vec<f32>,
        c: Vec<f32>,
    },
    /// `c = a · b`, all `n`×`n` row-major.
    Gemm {
        n: usize,
        a: Vec<f32>,
        b: Vec<f32>,
        c: Vec<f32>,
    },
    /// `passes` sums over `buf`; the result is kept so the reads cannot be optimised away.
    L2 {
        buf: Vec<f32>,
        passes: u32,
        sink: f32,
    },
}

/// The triad's scalar (STREAM's 3.0).
const TRIAD_SCALAR: f32 = 3.0;

impl CpuKernel {
    pub fn triad(elems: usize) -> CpuKernel {
        CpuKernel::Triad {
            a: vec![0.0; elems],
            b: vec![1.0; elems],
            c: vec![2.0; elems],
        }
    }

    pub fn gemm(n: usize) -> CpuKernel {
        // Small values so that the sums stay finite at any n.
        let fill = |k: usize| (0..n * n).map(|i| ((i + k) % 7) as f32 * 0.01).collect();
        CpuKernel::Gemm {
            n,
            a: fill(0),
            b: fill(3),
            c: vec![0.0; n * n],
        }
    }

    pub fn l2(elems: usize, passes: u32) -> CpuKernel {
        CpuKernel::L2 {
            buf: vec![1.0; elems],
            passes,
            sink: 0.0,
        }
    }

    /// One job.
    pub fn run(&mut self) {
        match self {
            CpuKernel::Triad { a, b, c } => {
                for ((a, b), c) in a.iter_mut().zip(b.iter()).zip(c.iter()) {
                    *a = b + TRIAD_SCALAR * c;
                }
            }
            CpuKernel::Gemm { n, a, b, c } => gemm_f32(*n, a, b, c),
            CpuKernel::L2 { buf, passes, sink } => {
                for _ in 0..*passes {
                    *sink += std::hint::black_box(buf.iter().sum::<f32>());
                }
            }
        }
    }
}

/// `c = a · b` for row-major `n`×`n` matrices, on the calling thread.
fn gemm_f32(n: usize, a: &[f32], b: &[f32], c: &mut [f32]) {
    assert!(a.len() >= n * n && b.len() >= n * n && c.len() >= n * n);
    // SAFETY: the three slices hold n×n elements each (checked above); row stride n, column
    // stride 1; `c` is exclusively borrowed and does not overlap `a` or `b`.
    unsafe {
        gemm::gemm(
            n,
            n,
            n,
            c.as_mut_ptr(),
            1,
            n as isize,
            false,
            a.as_ptr(),
            1,
            n as isize,
            b.as_ptr(),
            1,
            n as isize,
            0.0,
            1.0,
            false,
            false,
            false,
            gemm::Parallelism::None,
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn triad_computes_b_plus_s_c() {
        let mut k = CpuKernel::triad(100);
        k.run();
        let CpuKernel::Triad { a, .. } = &k else {
            unreachable!()
        };
        assert!(a.iter().all(|&x| x == 1.0 + 3.0 * 2.0));
    }

    #[test]
    fn gemm_matches_a_naive_product() {
        let n = 16;
        let mut k = CpuKernel::gemm(n);
        k.run();
        let CpuKernel::Gemm { a, b, c, .. } = &k else {
            unreachable!()
        };
        for (i, j) in [(0, 0), (3, 7), (15, 15)] {
            let want: f32 = (0..n).map(|p| a[i * n + p] * b[p * n + j]).sum();
            assert!((c[i * n + j] - want).abs() < 1e-4, "c[{i},{j}]");
        }
        assert!(c.iter().any(|&x| x != 0.0));
    }

    #[test]
    fn l2_reads_its_buffer_once_per_pass() {
        let mut k = CpuKernel::l2(1000, 3);
        k.run();
        let CpuKernel::L2 { sink, .. } = k else {
            unreachable!()
        };
        assert_eq!(sink, 3000.0);
    }
}
