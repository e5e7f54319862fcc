//! Building a [`CudaModel`] from its plan: memory, the kernels' module, the library handles, the
//! recorded launch list, then the captured graphs.

use super::*;

impl CudaModel {
    pub(crate) fn build(plan: Plan, target: &Target) -> Result<CudaModel> {
        Self::build_logged(plan, target, crate::saved::ChoiceLog::none()).map(|(m, _)| m)
    }

    /// [`CudaModel::build`], its choices among timed candidates recorded in `log` and
    /// returned, or taken from it (a replaying log: nothing timed).
    pub(crate) fn build_logged(
        plan: Plan,
        target: &Target,
        mut log: crate::saved::ChoiceLog,
    ) -> Result<(CudaModel, crate::saved::ChoiceLog)> {
        let t0 = Instant::now();
        make_current(target.ctx)?;
        let free_before = free_mem()?;
        let arch = device_arch()?;
        let sm = crate::saved::SmTargets::new(log.sm_count, device_sm_count()?);
        log.sm_count = sm.matmul as u32;
        let mut m = CudaModel::unbuilt(&plan, target);
        let block = m.upload_weights(&plan)?;
        m.alloc_pinned_io(&plan)?;
        // The own int8 kernel's Hopper form needs the module built for sm_90a; only a build that
        // builds the own path asks for it (crate::quant_gemm: by default on compute capability
        // 9.0, QuantPaths::builds_own), so a forced path keeps the plain sm_90 module.
        let own = target.build.quant_paths.builds_own(arch);
        let smem_optin = device_smem_optin()?;
        let half_names = m.load_kernels(plan.dtype, (arch, smem_optin), own)?;
        m.programmatic =
            arch.0 >= 9 && target.build.programmatic_launch && m.programmatic_launch_works();
        m.create_library_handles()?;

        // Algorithms that need more workspace than the cap are not considered.
        let ws_cap = target.build.workspace_cap(plan.arena_bytes);
        let scratch = DeviceBuffer::new(ws_cap)
            .map_err(|e| e.for_allocation("the algorithm search's workspace"))?;
        let mm_ws_cap = ws_cap.min(MM_WORKSPACE_CAP);
        let mm_scratch = DeviceBuffer::zeroed(mm_ws_cap)
            .map_err(|e| e.for_allocation("the matrix products' search workspace"))?;
        let rec = Recorder {
            plan: &plan,
            const_offs: &block.const_offs,
            arena: m.arena,
            weights: m.weights,
            dtype: plan.dtype,
            es: plan.dtype.size(),
            half_names,
            arch,
            smem_optin,
            scratch: scratch.ptr,
            ws_cap,
            mm_scratch: mm_scratch.ptr,
            mm_ws_cap,
            events: Events::new()?,
            options: target.build,
            choices: std::cell::RefCell::new(log),
            sm,
            barred: &target.barred,
        };
        let recorded = m.record_launches(&rec);
        let mut log = rec.choices.into_inner();
        // The algorithm search is over: nothing uses the scratch any more (the workspaces
        // point at it only while candidates are timed).
        drop(scratch);
        drop(mm_scratch);
        recorded?;
        log.finish()?;
        if log.recording() {
            log.matmuls = m
                .algo_cache
                .iter()
                .map(|(k, algo, _)| (k.clone(), algo.data))
                .collect();
        }
        m.place_workspace(&plan, &block)?;
        m.instantiate()?;
        m.mem.device_delta_bytes = free_before.saturating_sub(free_mem()?);
        m.build_ms = t0.elapsed().as_secs_f64() * 1e3;
        Ok((m, log))
    }

    /// The model with its shapes and layout from `plan` and nothing allocated yet.
    pub(super) fn unbuilt(plan: &Plan, target: &Target) -> CudaModel {
        CudaModel {
            ctx: target.ctx,
            stream: target.stream,
            precision: plan.precision,
            block: None,
            weights: DeviceSpan::EMPTY,
            arena: DeviceSpan::EMPTY,
            workspace: DeviceSpan::EMPTY,
            mm_workspace: DeviceSpan::EMPTY,
            own_workspaces: Vec::new(),
            mem: MemoryReport::default(),
            host_in: Vec::new(),
            host_out: Vec::new(),
            in_shapes: plan.inputs.iter().map(|i| i.shape.clone()).collect(),
            out_shapes: plan.outputs.iter().map(|o| o.shape.clone()).collect(),
            module: None,
            funcs: Vec::new(),
            programmatic: false,
            early_ok: Vec::new(),
            conv_graphs: Vec::new(),
            cudnn: None,
            cublaslt: None,
            convs: Vec::new(),
            mms: Vec::new(),
            launches: Vec::new(),
            plain_float_layers: Vec::new(),
            quant_choices: Vec::new(),
            conv_paths: Vec::new(),
            names: Vec::new(),
            algo_cache: Vec::new(),
            whole: None,
            compute: None,
            from_device: None,
            pieces: Vec::new(),
            steps: plan.steps.len(),
            step_start: Vec::with_capacity(plan.steps.len() + 1),
            storage_offsets: plan.storages.iter().map(|st| st.offset).collect(),
            const_offsets: plan.const_layout().0,
            dtype: plan.dtype,
            build_ms: 0.0,
            l2_window: None,
            check: None,
            _keep: target.keep.clone(),
        }
    }

    /// Loads the NVRTC module for `dtype` and looks up every kernel; returns the names of the
    /// f16/bf16-only kernels loaded after [`KERNEL_NAMES`] (none at f32).
    pub(super) fn load_kernels(
        &mut self,
        dtype: DType,
        (arch, smem_optin): ((i32, i32), usize),
        wgmma: bool,
    ) -> Result<&'static [&'static str]> {
        let cubin = kernel_cubin(dtype, arch, wgmma)?;
        let module = Module::load(&cubin)?;
        let raw = module.raw();
        self.module = Some(module);
        let half_names: &'static [&'static str] = if dtype == DType::F32 {
            &[]
        } else {
            HALF_KERNEL_NAMES
        };
        for name in KERNEL_NAMES.iter().chain(half_names) {
            let c = CString::new(*name).expect("kernel names have no NUL");
            let mut f: cu::CUfunction = std::ptr::null_mut();
            // SAFETY: module is loaded; c is NUL-terminated.
            cu_check("cuModuleGetFunction", unsafe {
                cu::cuModuleGetFunction(&mut f, raw, c.as_ptr())
            })?;
            let optin = match *name {
                // The own quantized GEMM is offered only where the device allows its shared
                // memory (crate::quant_gemm::own_gemm_refusal).
                "qgemm_i8" | "qgemm_f8"
                    if arch.0 >= 8 && smem_optin >= kernels::QGEMM_SHARED_BYTES =>
                {
                    Some(kernels::QGEMM_SHARED_BYTES)
                }
                "qgemm_i8_wg"
                    if wgmma && arch == (9, 0) && smem_optin >= kernels::QGEMM_WG_SHARED_BYTES =>
                {
                    Some(kernels::QGEMM_WG_SHARED_BYTES)
                }
                _ => None,
            };
            if let Some(bytes) = optin {
                // SAFETY: f is a function of the module just loaded.
                cu_check("cuFuncSetAttribute", unsafe {
                    cu::cuFuncSetAttribute(
                        f,
                        cu::CUfunction_attribute::CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
                        bytes as i32,
                    )
                })?;
            }
            if *name == "attention" && arch.0 >= 8 {
                // Its larger block shapes take more than the 48 KiB of dynamic shared memory
                // a kernel gets without opting in (it runs on sm_80 and newer only: every one
                // allows at least 99 KiB).
                // SAFETY: f is a function of the module just loaded.
                cu_check("cuFuncSetAttribute", unsafe {
                    cu::cuFuncSetAttribute(
                        f,
                        cu::CUfunction_attribute::CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
                        kernels::ATTN_MAX_SHARED_BYTES as i32,
                    )
                })?;
            }
            self.funcs.push(f);
            self.early_ok.push(!kernels::PLAIN_LAUNCH.contains(name));
        }
        Ok(half_names)
    }

    /// Library handles, bound to our stream.
    pub(super) fn create_library_handles(&mut self) -> Result<()> {
        self.cudnn = Some(Cudnn::new(self.stream)?);
        self.cublaslt = Some(CublasLt::new()?);
        Ok(())
    }

    /// The cuDNN handle (null before the libraries are created).
    pub(super) fn cudnn(&self) -> dnn::cudnnHandle_t {
        self.cudnn.as_ref().map_or(std::ptr::null_mut(), Cudnn::raw)
    }

    /// The cuBLASLt handle (null before the libraries are created).
    pub(super) fn cublaslt(&self) -> lt::cublasLtHandle_t {
        self.cublaslt
            .as_ref()
            .map_or(std::ptr::null_mut(), CublasLt::raw)
    }

    /// Records the job's launches: the input copies, every step's launches (each named after
    /// its step), the output copies.
    pub(super) fn record_launches(&mut self, rec: &Recorder) -> Result<()> {
        let plan = rec.plan;
        let staging = |id: usize| rec.arena.ptr() + plan.storages[id].offset as u64;
        let mut caches = LibraryCaches::default();
        for (i, io) in plan.inputs.iter().enumerate() {
            self.launches.push(Launch::HtoD {
                dst: staging(io.staging),
                src: self.host_in[i].ptr() as *const c_void,
                bytes: self.host_in[i].len() * 4,
            });
        }
        let mut prev = String::from("input copy");
        for step in &plan.steps {
            while self.names.len() < self.launches.len() {
                self.names.push(prev.clone());
            }
            prev = step.name.clone();
            self.step_start.push(self.launches.len());
            // A library call's failure names the step's node (the steps' own errors do already).
            record_step(self, rec, &mut caches, step).map_err(|e| match e {
                EngineError::Library(_) => e.at_node(&step.name),
                e => e,
            })?;
        }
        while self.names.len() < self.launches.len() {
            self.names.push(prev.clone());
        }
        self.step_start.push(self.launches.len());
        quant_gemm::keep_faster_whole(self, rec, &mut caches)?;
        for (i, io) in plan.outputs.iter().enumerate() {
            self.names.push("output copy".into());
            self.launches.push(Launch::DtoH {
                dst: self.host_out[i].ptr() as *mut c_void,
                src: staging(io.staging),
                bytes: self.host_out[i].len() * 4,
            });
        }
        Ok(())
    }
}
