//! CUDA graph capture of the launch list: the whole job, the forward alone, pieces of a split job,
//! the L2 access-policy window.

use super::*;

impl CudaModel {
    /// One eager run (loads lazily-loaded library kernels outside capture), then the captures
    /// of the whole job and of the copy-free forward.
    pub(super) fn instantiate(&mut self) -> Result<()> {
        self.issue(true)?;
        // SAFETY: the stream is live.
        cu_check("cuStreamSynchronize", unsafe {
            cu::cuStreamSynchronize(self.stream)
        })?;
        self.whole = Some(self.capture(true)?);
        self.compute = Some(self.capture(false)?);
        Ok(())
    }

    /// Captures the launches (with or without the input/output copies) into a graph and
    /// instantiates it.
    /// Splits a job into consecutive pieces of about `piece_ms` of device time each (by the
    /// launches' own timings, [`CudaModel::profile`]), one CUDA graph per piece, so that the
    /// caller can pause between pieces ([`CudaModel::run_piece`]): how best-effort work is held
    /// back without giving up graphs. A launch longer than `piece_ms` is a piece of its own.
    /// Returns the number of pieces.
    pub fn split(&mut self, piece_ms: f64) -> Result<usize> {
        let times = self.profile()?;
        let mut bounds = vec![0];
        let mut acc = 0.0;
        for (i, (_, _, ms)) in times.iter().enumerate() {
            if acc > 0.0 && acc + ms > piece_ms {
                bounds.push(i);
                acc = 0.0;
            }
            acc += ms;
        }
        bounds.push(self.launches.len());
        self.pieces.clear();
        for w in bounds.windows(2) {
            let piece = self.capture_list(&self.launches[w[0]..w[1]], true)?;
            self.pieces.push(piece);
        }
        Ok(self.pieces.len())
    }

    /// Sets `mib` of the L2 aside in the model's context (CUDA's persisting-L2 limit, kept if
    /// already larger) and puts an access-policy window over the model's weights on its stream
    /// and on every kernel node of its graphs, captured again with it: a critical model's
    /// weights then stay in the L2 beside neighbours that stream through it
    /// (`[protection] l2_persist_mib`). Before [`CudaModel::split`] (pieces captured earlier
    /// would not have it). More than the device sets aside is an error naming the key.
    pub fn persist_weights_in_l2(&mut self, mib: u64) -> Result<crate::l2::Persisted> {
        make_current(self.ctx)?;
        let limits = crate::l2::limits()?;
        let bytes = crate::l2::persist_bytes(mib, &limits)?;
        let Some(window) = crate::l2::window(
            self.weights.ptr(),
            self.weights.bytes(),
            bytes,
            limits.max_window_bytes,
        ) else {
            return Err(EngineError::Unsupported(
                "[protection] l2_persist_mib: the model has no weights to keep in the L2".into(),
            ));
        };
        crate::l2::set_aside(bytes)?;
        // SAFETY: the model's own stream, live, of the current context.
        unsafe { crate::l2::on_stream(self.stream, &window)? };
        self.l2_window = Some(window);
        self.from_device = None;
        self.whole = Some(self.capture(true)?);
        self.compute = Some(self.capture(false)?);
        self.pieces.clear();
        Ok(crate::l2::Persisted {
            persist_bytes: bytes,
            window,
        })
    }

    pub(super) fn capture(&self, copies: bool) -> Result<CapturedGraph> {
        self.capture_list(&self.launches, copies)
    }

    pub(super) fn capture_list(&self, launches: &[Launch], copies: bool) -> Result<CapturedGraph> {
        self.capture_calls(&mut || self.issue_list(launches, copies))
    }

    /// Captures whatever `issue` puts on the model's stream into a graph and instantiates it.
    pub(super) fn capture_calls(
        &self,
        issue: &mut dyn FnMut() -> Result<()>,
    ) -> Result<CapturedGraph> {
        // SAFETY: the stream is live and not capturing. THREAD_LOCAL: other threads (other
        // partitions compiling their models) may keep allocating while we capture.
        cu_check("cuStreamBeginCapture", unsafe {
            cu::cuStreamBeginCapture_v2(
                self.stream,
                cu::CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_THREAD_LOCAL,
            )
        })?;
        let issued = issue();
        let mut graph: cu::CUgraph = std::ptr::null_mut();
        // SAFETY: the stream is capturing; ending the capture is required even after a failure.
        let ended = unsafe { cu::cuStreamEndCapture(self.stream, &mut graph) };
        if issued.is_err() || ended != cu::CUresult::CUDA_SUCCESS {
            if !graph.is_null() {
                // SAFETY: the graph the failed capture returned, destroyed once.
                unsafe {
                    cu::cuGraphDestroy(graph);
                }
            }
            issued?;
            cu_check("cuStreamEndCapture", ended)?;
        }
        if let Some(w) = &self.l2_window {
            // SAFETY: the captured graph, live and not instantiated yet.
            if let Err(e) = unsafe { crate::l2::on_graph(graph, w) } {
                // SAFETY: the graph is ours and has no instance.
                unsafe {
                    cu::cuGraphDestroy(graph);
                }
                return Err(e);
            }
        }
        let mut exec: cu::CUgraphExec = std::ptr::null_mut();
        // SAFETY: graph is a complete captured graph; valid out-pointer.
        let r = unsafe { cu::cuGraphInstantiateWithFlags(&mut exec, graph, 0) };
        if r != cu::CUresult::CUDA_SUCCESS {
            // SAFETY: the graph is ours and has no instance.
            unsafe {
                cu::cuGraphDestroy(graph);
            }
            cu_check("cuGraphInstantiate", r)?;
        }
        let captured = CapturedGraph::new(graph, exec);
        // SAFETY: exec and stream are live.
        cu_check("cuGraphUpload", unsafe {
            cu::cuGraphUpload(exec, self.stream)
        })?;
        // SAFETY: the stream is live.
        cu_check("cuStreamSynchronize", unsafe {
            cu::cuStreamSynchronize(self.stream)
        })?;
        Ok(captured)
    }
}
