//! Running a built model: graph launches and waits, eager issue of the launches (the plan check's
//! replay, profiles), and host I/O through [`CompiledModel`].

use super::*;

impl CudaModel {
    /// Pieces a job runs as: 1 until [`CudaModel::split`].
    pub fn pieces(&self) -> usize {
        self.pieces.len().max(1)
    }

    /// Runs piece `i` of a split job and waits for it (unsplit: the whole job).
    pub fn run_piece(&mut self, i: usize) -> Result<()> {
        if i >= self.pieces.len() {
            return self.run();
        }
        self.run_pieces(i..i + 1)
    }

    /// Runs pieces `range` of a split job back to back and waits once, after the last (the
    /// guard's run of fine pieces, `[protection] fine_piece_us`): their graphs are launched on
    /// the one stream, which orders them as waiting for each would, without a round trip to
    /// the host between them. Unsplit, `0..1` is the whole job. An empty range runs nothing.
    pub fn run_pieces(&mut self, range: std::ops::Range<usize>) -> Result<()> {
        if self.pieces.is_empty() {
            return match range.len() {
                0 => Ok(()),
                _ if range == (0..1) => self.run(),
                _ => Err(EngineError::Runtime(format!(
                    "pieces {range:?} of an unsplit job (1 piece)"
                ))),
            };
        }
        if range.end > self.pieces.len() {
            return Err(EngineError::Runtime(format!(
                "pieces {range:?} of a job of {} pieces",
                self.pieces.len()
            )));
        }
        if range.is_empty() {
            return Ok(());
        }
        make_current(self.ctx)?;
        for piece in &self.pieces[range] {
            let exec = piece.exec();
            // SAFETY: exec and stream are live; the piece's buffers are owned by self.
            cu_check("cuGraphLaunch", unsafe {
                cu::cuGraphLaunch(exec, self.stream)
            })?;
        }
        self.wait()
    }

    /// Device time of the forward alone (the graph without the input/output copies): the
    /// median of `replays` replays, each timed with events, in milliseconds.
    pub fn device_ms(&mut self, replays: usize) -> Result<f64> {
        make_current(self.ctx)?;
        let ev = Events::new()?;
        let mut t = Vec::with_capacity(replays.max(1));
        for _ in 0..replays.max(1) {
            let exec = self
                .compute
                .as_ref()
                .map_or(std::ptr::null_mut(), CapturedGraph::exec);
            let stream = self.stream;
            let ms = ev.time(stream, &mut || {
                // SAFETY: exec and stream are live.
                cu_check("cuGraphLaunch", unsafe { cu::cuGraphLaunch(exec, stream) })
            })?;
            t.push(ms as f64);
        }
        t.sort_by(|a, b| a.total_cmp(b));
        Ok(t[t.len() / 2])
    }

    /// One replay of the forward inside a profiler range (`cuProfilerStart` … `cuProfilerStop`),
    /// so that a profiler started with its collection off (`ncu --profile-from-start off`)
    /// records this replay's kernels and none of the build's timing launches.
    pub fn profiled_replay(&mut self) -> Result<()> {
        make_current(self.ctx)?;
        let exec = self
            .compute
            .as_ref()
            .map_or(std::ptr::null_mut(), CapturedGraph::exec);
        // SAFETY: the context is current; start/stop take no arguments.
        cu_check("cuProfilerStart", unsafe { cu::cuProfilerStart() })?;
        // SAFETY: exec and stream are live.
        let launched = cu_check("cuGraphLaunch", unsafe {
            cu::cuGraphLaunch(exec, self.stream)
        });
        let waited = launched.and_then(|()| self.wait());
        // SAFETY: as for the start.
        let stopped = cu_check("cuProfilerStop", unsafe { cu::cuProfilerStop() });
        waited.and(stopped)
    }

    /// Issues every launch on the stream (eagerly, or into a capture); `copies`: include the
    /// input and output copies.
    pub(super) fn issue(&self, copies: bool) -> Result<()> {
        self.issue_list(&self.launches, copies)
    }

    pub(super) fn issue_list(&self, launches: &[Launch], copies: bool) -> Result<()> {
        // Whether the last operation issued is a kernel (ours or a matrix product's): only
        // then may the next kernel of ours be scheduled before it ends. After a copy or
        // cuDNN's work (which may end with a memset), and first in a list, it waits plainly.
        let mut after_kernel = false;
        for l in launches {
            if !copies && matches!(l, Launch::HtoD { .. } | Launch::DtoH { .. }) {
                continue;
            }
            match l {
                Launch::Kernel {
                    func,
                    grid,
                    block,
                    shared,
                    args,
                } => {
                    let mut ps: Vec<*mut c_void> = args.iter().map(|a| a.as_ptr()).collect();
                    let early = self.programmatic && after_kernel && self.early_ok[*func];
                    launch_kernel(
                        self.funcs[*func],
                        (*grid, *block, *shared),
                        self.stream,
                        &mut ps,
                        early,
                    )?;
                }
                Launch::Conv { conv, x, w, y } => {
                    let c = &self.convs[*conv];
                    let (one, zero) = (1f32, 0f32);
                    // SAFETY: descriptors match the buffers (planned together); the workspace
                    // holds at least c.workspace bytes; alpha/beta are f32 as cuDNN requires
                    // for float, half and bfloat16 data.
                    dnn_check("cudnnConvolutionForward", unsafe {
                        dnn::cudnnConvolutionForward(
                            self.cudnn(),
                            &one as *const f32 as *const c_void,
                            c.x,
                            *x as *const c_void,
                            c.w,
                            *w as *const c_void,
                            c.conv,
                            c.algo,
                            self.workspace.ptr() as *mut c_void,
                            c.workspace,
                            &zero as *const f32 as *const c_void,
                            c.y,
                            *y as *mut c_void,
                        )
                    })?;
                }
                Launch::ConvGraph { graph, ptrs } => {
                    let ptrs = ConvGraphPtrs {
                        workspace: self.workspace.ptr(),
                        ..**ptrs
                    };
                    // SAFETY: the plan was made for these buffers' shapes (planned together);
                    // the workspace holds at least the plan's workspace bytes.
                    unsafe { self.conv_graphs[*graph].execute(self.cudnn(), &ptrs) }
                        .map_err(crate::error::engine)?;
                }
                Launch::Matmul { mm, a, b, c, y } => {
                    run_matmul(
                        self.cublaslt(),
                        &self.mms[*mm],
                        *a,
                        *b,
                        *c,
                        *y,
                        self.mm_workspace.ptr(),
                        self.stream,
                    )?;
                }
                Launch::HtoD { dst, src, bytes } => {
                    // SAFETY: src is a pinned host buffer of `bytes` owned by this model; dst
                    // is its staging storage in the arena.
                    cu_check("cuMemcpyHtoDAsync", unsafe {
                        cu::cuMemcpyHtoDAsync_v2(*dst, *src, *bytes, self.stream)
                    })?;
                }
                Launch::DtoH { dst, src, bytes } => {
                    // SAFETY: as above, in the other direction.
                    cu_check("cuMemcpyDtoHAsync", unsafe {
                        cu::cuMemcpyDtoHAsync_v2(*dst, *src, *bytes, self.stream)
                    })?;
                }
            }
            after_kernel = matches!(l, Launch::Kernel { .. } | Launch::Matmul { .. });
        }
        Ok(())
    }

    /// Runs the launches one by one (not the graph), each timed with events: (step name,
    /// what ran, milliseconds), in order. For finding slow steps; allocates.
    pub fn profile(&mut self) -> Result<Vec<(String, String, f64)>> {
        make_current(self.ctx)?;
        let ev = Events::new()?;
        let mut out = Vec::new();
        for (i, l) in self.launches.iter().enumerate() {
            let what = match l {
                Launch::Kernel { func, .. } => kernels::kernel_name(*func)
                    .map_or_else(|| format!("kernel {func}"), |k| k.to_string()),
                Launch::Conv { conv, .. } => format!("cudnn algo {:?}", self.convs[*conv].algo),
                Launch::ConvGraph { graph, .. } => {
                    format!("cudnn engine {}", self.conv_graphs[*graph].engine)
                }
                Launch::Matmul { .. } => "cublasLt".to_string(),
                Launch::HtoD { .. } => "HtoD".to_string(),
                Launch::DtoH { .. } => "DtoH".to_string(),
            };
            let one = std::slice::from_ref(l);
            let ms = ev.time(self.stream, &mut || self.issue_list(one, true))?;
            out.push((
                self.names.get(i).cloned().unwrap_or_default(),
                what,
                ms as f64,
            ));
        }
        Ok(out)
    }

    /// Where input `i`'s f32 values live on the device — the staging the job's input copy
    /// fills — and its bytes. A producer may write the input there on this model's stream (e.g.
    /// [`crate::Preprocessor::launch_into_model`] on the same backend) and run the job with
    /// [`CudaModel::launch_from_device`].
    pub fn device_input(&self, i: usize) -> Option<(cu::CUdeviceptr, usize)> {
        let mut copies = self.launches.iter().filter_map(|l| match l {
            Launch::HtoD { dst, bytes, .. } => Some((*dst, *bytes)),
            _ => None,
        });
        copies.nth(i)
    }

    /// Launches one job without its input copies (the inputs already written to
    /// [`CudaModel::device_input`], on this model's stream) and without waiting; pair with
    /// [`CudaModel::wait`]. The outputs are copied to the host as in [`CudaModel::launch`].
    pub fn launch_from_device(&mut self) -> Result<()> {
        make_current(self.ctx)?;
        if self.from_device.is_none() {
            // The input copies are the launches before the first step's.
            let first = self.step_start.first().copied().unwrap_or(0);
            self.from_device = Some(self.capture_list(&self.launches[first..], true)?);
        }
        let exec = self
            .from_device
            .as_ref()
            .map(CapturedGraph::exec)
            .ok_or_else(|| EngineError::Runtime("the model has no graph".into()))?;
        // SAFETY: exec and stream are live; the graph's buffers are owned by self.
        cu_check("cuGraphLaunch", unsafe {
            cu::cuGraphLaunch(exec, self.stream)
        })
    }

    /// Launches one job (the graph) without waiting; pair with [`CudaModel::wait`].
    pub fn launch(&mut self) -> Result<()> {
        let exec = self
            .whole
            .as_ref()
            .map(CapturedGraph::exec)
            .ok_or_else(|| EngineError::Runtime("the model has no graph".into()))?;
        make_current(self.ctx)?;
        // SAFETY: exec and stream are live; the graph's buffers are owned by self.
        cu_check("cuGraphLaunch", unsafe {
            cu::cuGraphLaunch(exec, self.stream)
        })
    }

    /// True when the last launched job has finished (never blocks).
    pub fn is_done(&self) -> Result<bool> {
        // SAFETY: the stream is live.
        let r = unsafe { cu::cuStreamQuery(self.stream) };
        match r {
            cu::CUresult::CUDA_SUCCESS => Ok(true),
            cu::CUresult::CUDA_ERROR_NOT_READY => Ok(false),
            e => cu_check("cuStreamQuery", e).map(|_| false),
        }
    }

    /// Waits for the last launched job (the output copy is its last node).
    pub fn wait(&self) -> Result<()> {
        // SAFETY: the stream is live.
        cu_check("cuStreamSynchronize", unsafe {
            cu::cuStreamSynchronize(self.stream)
        })
    }
}

/// The plan check's step-by-step replay: the same launches the graph holds, issued eagerly.
impl crate::check::StepRunner for CudaModel {
    fn run_plan(&mut self, inputs: &[Vec<f32>]) -> Result<Vec<Vec<f32>>> {
        self.write_inputs(inputs)?;
        self.run()?;
        Ok((0..self.num_outputs())
            .map(|i| self.output_at(i).to_vec())
            .collect())
    }

    fn write_inputs(&mut self, inputs: &[Vec<f32>]) -> Result<()> {
        for (i, x) in inputs.iter().enumerate() {
            let buf = self.input_mut_at(i);
            if buf.len() != x.len() {
                return Err(EngineError::InvalidArgument(format!(
                    "input {i}: {} values for a buffer of {}",
                    x.len(),
                    buf.len()
                )));
            }
            buf.copy_from_slice(x);
        }
        Ok(())
    }

    fn run_steps(&mut self, from: usize, to: usize) -> Result<()> {
        make_current(self.ctx)?;
        // Step 0 starts with the input copies (the launches before the first step).
        let first = if from == 0 {
            0
        } else {
            self.step_start[from.min(self.steps)]
        };
        let last = self.step_start[to.min(self.steps)];
        let launches = self.launches.get(first..last).ok_or_else(|| {
            EngineError::InvalidArgument(format!("steps {from}..{to} of {}", self.steps))
        })?;
        self.issue_list(launches, true)?;
        self.wait()
    }

    fn read(&mut self, loc: Loc, len: usize) -> Result<Vec<f32>> {
        make_current(self.ctx)?;
        let src = self.device_span(loc, len).ok_or_else(|| {
            EngineError::InvalidArgument(format!("{len} elements at {loc:?} are outside the model"))
        })?;
        let mut raw = vec![0u8; src.bytes()];
        // SAFETY: src lies inside this model's arena or weights (checked above); raw holds
        // its bytes; synchronous copy (the stream was synchronised after the last step).
        cu_check("cuMemcpyDtoH", unsafe {
            cu::cuMemcpyDtoH_v2(raw.as_mut_ptr() as *mut c_void, src.ptr(), raw.len())
        })?;
        Ok(crate::convert::to_f32(&raw, self.dtype))
    }
}

impl CompiledModel for CudaModel {
    fn num_inputs(&self) -> usize {
        self.host_in.len()
    }
    fn num_outputs(&self) -> usize {
        self.host_out.len()
    }
    fn input_shape_at(&self, i: usize) -> &[usize] {
        self.in_shapes.get(i).map_or(&[], |s| s.as_slice())
    }
    fn output_shape_at(&self, i: usize) -> &[usize] {
        self.out_shapes.get(i).map_or(&[], |s| s.as_slice())
    }
    fn input_mut_at(&mut self, i: usize) -> &mut [f32] {
        match self.host_in.get_mut(i) {
            Some(b) => b.as_mut_slice(),
            None => &mut [],
        }
    }
    fn output_at(&self, i: usize) -> &[f32] {
        match self.host_out.get(i) {
            Some(b) => b.as_slice(),
            None => &[],
        }
    }
    fn run(&mut self) -> Result<()> {
        self.launch()?;
        self.wait()
    }
    fn arena_bytes(&self) -> usize {
        self.mem.arena_bytes
    }
}

impl CudaModel {
    /// Whether a kernel launched early after another runs here: two empty launches of
    /// `cast_out` (nothing read or written), the second with programmatic stream
    /// serialization, then a wait. Where the driver refuses the attribute (an MPS client on a
    /// driver or GPU without it, say), the model's kernels are launched plainly instead of the
    /// build failing.
    pub(super) fn programmatic_launch_works(&self) -> bool {
        let f = self.funcs[KERNEL_NAMES
            .iter()
            .position(|k| *k == "cast_out")
            .expect("cast_out is a kernel of the module")];
        let args = [Arg::Ptr(0), Arg::Ptr(0), Arg::I64(0)];
        let mut ps: Vec<*mut c_void> = args.iter().map(Arg::as_ptr).collect();
        let launched = launch_kernel(f, (1, 32, 0), self.stream, &mut ps, false)
            .and_then(|()| launch_kernel(f, (1, 32, 0), self.stream, &mut ps, true));
        // SAFETY: the model's stream, live; nothing else is queued on it during the build.
        let waited = cu_check("cuStreamSynchronize", unsafe {
            cu::cuStreamSynchronize(self.stream)
        });
        launched.and(waited).is_ok()
    }
}

/// Launches `f` on `stream`; `early`: with programmatic stream serialization, so that it may be
/// scheduled while the kernel ahead of it finishes (its `grid_dep_wait` holds it until that one
/// has completed).
fn launch_kernel(
    f: cu::CUfunction,
    (grid, block, shared): (u32, u32, u32),
    stream: cu::CUstream,
    params: &mut [*mut c_void],
    early: bool,
) -> Result<()> {
    if !early {
        // SAFETY: the caller's argument list matches the kernel's signature (built next to it
        // when the launches were recorded); every pointer is into the model's arena or weights.
        return cu_check("cuLaunchKernel", unsafe {
            cu::cuLaunchKernel(
                f,
                grid,
                1,
                1,
                block,
                1,
                1,
                shared,
                stream,
                params.as_mut_ptr(),
                std::ptr::null_mut(),
            )
        });
    }
    // SAFETY: a zeroed attribute is a valid value of this plain C struct; the union member
    // written is the one the id names.
    let mut attr: cu::CUlaunchAttribute = unsafe { std::mem::zeroed() };
    attr.id = cu::CUlaunchAttributeID::CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION;
    attr.value.programmaticStreamSerializationAllowed = 1;
    let config = cu::CUlaunchConfig {
        gridDimX: grid,
        gridDimY: 1,
        gridDimZ: 1,
        blockDimX: block,
        blockDimY: 1,
        blockDimZ: 1,
        sharedMemBytes: shared,
        hStream: stream,
        attrs: &mut attr,
        numAttrs: 1,
    };
    // SAFETY: as above; `config` and `attr` outlive the call, which copies them.
    cu_check("cuLaunchKernelEx", unsafe {
        cu::cuLaunchKernelEx(&config, f, params.as_mut_ptr(), std::ptr::null_mut())
    })
}
