//! Timing on the device: event pairs, and the build's choice among candidate paths, each timed as a
//! captured graph.

use super::*;

pub(crate) struct Events {
    a: cu::CUevent,
    b: cu::CUevent,
}

impl Events {
    pub(crate) fn new() -> Result<Events> {
        let (mut a, mut b) = (std::ptr::null_mut(), std::ptr::null_mut());
        // SAFETY: valid out-pointers, a context is current.
        unsafe {
            cu_check("cuEventCreate", cu::cuEventCreate(&mut a, 0))?;
            cu_check("cuEventCreate", cu::cuEventCreate(&mut b, 0))?;
        }
        Ok(Events { a, b })
    }
    /// Milliseconds between two records on `stream` around `f`.
    pub(crate) fn time(
        &self,
        stream: cu::CUstream,
        f: &mut dyn FnMut() -> Result<()>,
    ) -> Result<f32> {
        let mut ms = 0f32;
        // SAFETY: events and stream are live.
        unsafe {
            cu_check("cuEventRecord", cu::cuEventRecord(self.a, stream))?;
            f()?;
            cu_check("cuEventRecord", cu::cuEventRecord(self.b, stream))?;
            cu_check("cuEventSynchronize", cu::cuEventSynchronize(self.b))?;
            cu_check(
                "cuEventElapsedTime",
                cu::cuEventElapsedTime_v2(&mut ms, self.a, self.b),
            )?;
        }
        Ok(ms)
    }
}

impl Drop for Events {
    fn drop(&mut self) {
        // SAFETY: created in `new`, destroyed once.
        unsafe {
            cu::cuEventDestroy_v2(self.a);
            cu::cuEventDestroy_v2(self.b);
        }
    }
}

/// A convolution's candidate launches and their best time (∞ until timed).
pub(super) type TimedPath = (Vec<Launch>, f32);

/// Times each candidate path as it will run, on the search scratch as workspace.
///
/// "As it will run" means captured in a CUDA graph, as the job is: timed as eager launches, each
/// kernel paid its launch overhead, which the job's graph does not, and a path of fewer kernels
/// won where it was slower on the GPU (resnet18 fp16 in 32 SMs chose the GEMM path for some
/// convolutions in some builds and not in others, and ran 0.45–0.78 ms per job against
/// 0.41 ms with cuDNN throughout: docs/interference.md). The paths are timed in alternation,
/// [`TIMING_ROUNDS`] times, each keeping its best: the build is often the GPU's first work after
/// idle, and a path timed only before the clocks had risen lost to one timed after.
///
/// A path that cannot run here is left out (its time NaN), as long as another can: in a green
/// context of a few SMs some library kernels launch thread-block clusters the context cannot
/// place (`CUDA_ERROR_INVALID_CLUSTER_SIZE` at instantiation, or cuDNN's
/// `CUDNN_STATUS_EXECUTION_FAILED`; mobilenet_v2 in 8 SMs and resnet50 in 104 SMs beside it on
/// the H100), and a build must not fail for a candidate it need not keep.
pub(super) fn time_candidates(
    m: &mut CudaModel,
    rec: &Recorder,
    paths: &mut [TimedPath],
) -> Result<()> {
    if paths.len() < 2 {
        return Ok(());
    }
    (m.workspace, m.mm_workspace) = (
        DeviceSpan::new(rec.scratch, rec.ws_cap),
        DeviceSpan::new(rec.mm_scratch, rec.mm_ws_cap),
    );
    let timed = time_paths_as_graphs(m, rec, paths);
    (m.workspace, m.mm_workspace) = (DeviceSpan::EMPTY, DeviceSpan::EMPTY);
    timed
}

/// Times `paths` (unless the build times nothing) and returns the index of the fastest: the
/// first where nothing was timed, on a tie, or where every path failed to run (NaN).
pub(super) fn fastest_of(
    m: &mut CudaModel,
    rec: &Recorder,
    paths: &mut [TimedPath],
) -> Result<usize> {
    let what = m.names.last().cloned().unwrap_or_default();
    if let Some(i) = rec.choices.borrow_mut().pick(paths.len(), &what)? {
        return Ok(i);
    }
    if !rec.options.first_choice {
        time_candidates(m, rec, paths)?;
    }
    let i = (0..paths.len())
        .min_by(|&a, &b| paths[a].1.total_cmp(&paths[b].1))
        .unwrap_or(0);
    rec.choices
        .borrow_mut()
        .note(crate::saved::Choice::Pick(i as u32));
    Ok(i)
}

/// Rounds of alternating timings of competing candidates (each keeps its best round).
pub(super) const TIMING_ROUNDS: usize = 5;

/// Replays of a candidate's graph per timing (their mean is the round's time): one replay of a
/// few microseconds is close to the events' resolution.
pub(super) const REPLAYS_PER_TIMING: usize = 2;

/// Copies of a candidate, back to back, in the graph that times it. With one copy a graph of
/// one small kernel was timed at its launch's cost, not the kernel's: vit_b_16's matmuls at
/// batch 1 all timed 13–20 µs (the H200, session 26), where in the job's graph each follows the
/// one before without that cost, so the choice among them was noise. Back to back, as in the
/// job, the differences between candidates are what is measured.
pub(super) const COPIES_PER_GRAPH: usize = 8;

/// Captures each present path, [`COPIES_PER_GRAPH`] times over, into a graph and sets its time
/// (per copy) to the best of [`TIMING_ROUNDS`] alternating rounds of [`REPLAYS_PER_TIMING`]
/// replays ([`time_candidates`] says why).
pub(super) fn time_paths_as_graphs(
    m: &CudaModel,
    rec: &Recorder,
    paths: &mut [TimedPath],
) -> Result<()> {
    let mut timed: Vec<(&mut f32, CapturedGraph)> = Vec::with_capacity(paths.len());
    let mut first_failure = None;
    for (launches, best) in paths.iter_mut() {
        let copies = m.capture_calls(&mut || {
            (0..COPIES_PER_GRAPH).try_for_each(|_| m.issue_list(launches, true))
        });
        match copies {
            Ok(graph) => timed.push((best, graph)),
            Err(e) => {
                *best = f32::NAN;
                first_failure.get_or_insert(e);
            }
        }
    }
    if let (true, Some(e)) = (timed.is_empty(), first_failure) {
        return Err(e);
    }
    for _ in 0..TIMING_ROUNDS {
        for (best, graph) in timed.iter_mut() {
            let ms = rec.events.time(m.stream, &mut || {
                for _ in 0..REPLAYS_PER_TIMING {
                    // SAFETY: the graph's instance and the stream are live; its buffers (the
                    // model's arena and the search scratch) outlive the timing.
                    cu_check("cuGraphLaunch", unsafe {
                        cu::cuGraphLaunch(graph.exec(), m.stream)
                    })?;
                }
                Ok(())
            })? / (REPLAYS_PER_TIMING * COPIES_PER_GRAPH) as f32;
            **best = best.min(ms);
        }
    }
    Ok(())
}
