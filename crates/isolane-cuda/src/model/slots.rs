//! [`Slots`]: several sets of pinned input and output buffers for one model, so that a server
//! writes the next job's input while the job before runs on the GPU (docs/serve.md, "Input
//! slots"). The model's own buffers and graph stay as they are for `run`.

use super::*;

/// `n` sets of pinned host buffers for a model's inputs and outputs, each launched as a job on
/// the model's stream: the copies from the slot's inputs, the model's forward, the copies to the
/// slot's outputs, then the slot's event. Each slot has its own graph of all three (captured as
/// the model's whole job is, with the slot's buffers), launched as one call as `run` launches
/// its job; a launch whose input comes from elsewhere ([`Slots::input_from`]) issues the copies
/// around the model's forward graph instead. Jobs of several
/// slots queue on the one stream, in launch order, so they share the model's arena safely.
///
/// A slot whose job is launched and not seen done is *in flight*: its buffers are not handed
/// out ([`Slots::input_mut`], [`Slots::output`] say `None`), so nothing writes an input the
/// copy engine may still read, nor reads an output it may still write.
///
/// An input may instead be copied from host memory the caller holds ([`Slots::input_from`]: a
/// client's shared memory region, page-locked), for the slot's next launch only: the request's
/// input then crosses to the device once, without a copy into the slot's buffer first.
pub struct Slots {
    ins: Vec<Vec<PinnedF32>>,
    /// Per slot and input, the host address its next launch copies from instead of its own
    /// buffer (taken by that launch; given back to the buffer by [`Slots::input_mut`]).
    sources: Vec<Vec<Option<*const u8>>>,
    outs: Vec<Vec<PinnedF32>>,
    events: Vec<cu::CUevent>,
    in_flight: Vec<bool>,
    /// The model's stream and context, checked at each launch: the device addresses below
    /// belong to that model's arena.
    stream: cu::CUstream,
    ctx: cu::CUcontext,
    /// Device addresses and bytes of the model's input and output staging.
    to_device: Vec<Span>,
    from_device: Vec<Span>,
    /// Per slot, its copies and the forward as one graph (`None`: its capture failed, and the
    /// slot's launches issue the copies around the forward graph).
    fused: Vec<Option<CapturedGraph>>,
}

/// A device address and a size in bytes.
type Span = (u64, usize);

// SAFETY: the buffers and events are owned by this value and used only through `&mut self`
// (or `&self` for reading an output that is not in flight); the driver allows events and
// pinned memory to be used from any thread. The sources are addresses the caller of
// `input_from` keeps mapped, only handed to the driver.
unsafe impl Send for Slots {}

impl CudaModel {
    /// Device addresses and sizes (bytes) of the input copies' destinations and the output
    /// copies' sources: the first launches are the input copies and the last the output copies
    /// (`record_launches`).
    fn staging(&self) -> (Vec<Span>, Vec<Span>) {
        let n_in = self.host_in.len();
        let n_out = self.host_out.len();
        let ins = self.launches[..n_in.min(self.launches.len())]
            .iter()
            .filter_map(|l| match l {
                Launch::HtoD { dst, bytes, .. } => Some((*dst, *bytes)),
                _ => None,
            })
            .collect();
        let outs = self.launches[self.launches.len().saturating_sub(n_out)..]
            .iter()
            .filter_map(|l| match l {
                Launch::DtoH { src, bytes, .. } => Some((*src, *bytes)),
                _ => None,
            })
            .collect();
        (ins, outs)
    }
}

/// `model`'s whole job (input copies, forward, output copies) as one graph whose copies read
/// `ins` and write `outs` instead of the model's own buffers.
fn fused_graph(model: &CudaModel, ins: &[PinnedF32], outs: &[PinnedF32]) -> Result<CapturedGraph> {
    let n = model.launches.len();
    let (n_in, n_out) = (ins.len(), outs.len());
    let mut launches = model.launches.clone();
    for (l, buf) in launches[..n_in.min(n)].iter_mut().zip(ins) {
        match l {
            Launch::HtoD { src, bytes, .. } if *bytes == buf.len() * 4 => {
                *src = buf.ptr() as *const c_void
            }
            _ => {
                return Err(EngineError::Runtime(
                    "an input copy that is not the slot's".into(),
                ))
            }
        }
    }
    for (l, buf) in launches[n.saturating_sub(n_out)..].iter_mut().zip(outs) {
        match l {
            Launch::DtoH { dst, bytes, .. } if *bytes == buf.len() * 4 => {
                *dst = buf.ptr() as *mut c_void
            }
            _ => {
                return Err(EngineError::Runtime(
                    "an output copy that is not the slot's".into(),
                ))
            }
        }
    }
    model.capture_list(&launches, true)
}

/// Whether slots launch their job as one graph: on unless `ISOLANE_CUDA_SLOT_GRAPH=0`, which
/// keeps session 22's four launches for comparison. The H200 checked it in session 24 (the
/// slots' GPU tests bit-identical, docs/serve.md "Input slots").
fn slot_graphs_on() -> bool {
    std::env::var_os("ISOLANE_CUDA_SLOT_GRAPH").is_none_or(|v| v != "0")
}

impl Slots {
    /// `n` slots (at least 1) for `model`, in its context.
    pub fn new(model: &CudaModel, n: usize) -> Result<Slots> {
        make_current(model.ctx)?;
        let (to_device, from_device) = model.staging();
        if to_device.len() != model.host_in.len() || from_device.len() != model.host_out.len() {
            return Err(EngineError::Runtime(
                "the model's launches do not start with its input copies and end with its \
                 output copies"
                    .into(),
            ));
        }
        let mut s = Slots {
            ins: Vec::new(),
            sources: Vec::new(),
            outs: Vec::new(),
            events: Vec::new(),
            in_flight: Vec::new(),
            stream: model.stream,
            ctx: model.ctx,
            to_device,
            from_device,
            fused: Vec::new(),
        };
        for _ in 0..n.max(1) {
            let ins = s
                .to_device
                .iter()
                .map(|&(_, bytes)| PinnedF32::new(bytes / 4))
                .collect::<Result<Vec<_>>>()?;
            let outs = s
                .from_device
                .iter()
                .map(|&(_, bytes)| PinnedF32::new(bytes / 4))
                .collect::<Result<Vec<_>>>()?;
            let mut ev: cu::CUevent = std::ptr::null_mut();
            // SAFETY: valid out-pointer; the model's context is current. No timing: the
            // event only marks a job's end, and timing makes record and query dearer.
            cu_check("cuEventCreate", unsafe {
                cu::cuEventCreate(&mut ev, cu::CUevent_flags::CU_EVENT_DISABLE_TIMING as u32)
            })?;
            s.events.push(ev);
            s.fused.push(
                slot_graphs_on()
                    .then(|| fused_graph(model, &ins, &outs).ok())
                    .flatten(),
            );
            s.sources.push(vec![None; ins.len()]);
            s.ins.push(ins);
            s.outs.push(outs);
            s.in_flight.push(false);
        }
        Ok(s)
    }

    /// How many slots there are.
    pub fn len(&self) -> usize {
        self.events.len()
    }

    /// Never true: there is at least one slot.
    pub fn is_empty(&self) -> bool {
        self.events.is_empty()
    }

    /// Whether `slot`'s job is launched and not yet seen done.
    pub fn in_flight(&self, slot: usize) -> bool {
        self.in_flight.get(slot).copied().unwrap_or(false)
    }

    /// Input `i` of `slot`, which its next launch then copies from (in place of a source
    /// given by [`Slots::input_from`]); `None` out of range or while the slot is in flight.
    pub fn input_mut(&mut self, slot: usize, i: usize) -> Option<&mut [f32]> {
        if self.in_flight(slot) {
            return None;
        }
        let buf = self.ins.get_mut(slot)?.get_mut(i)?;
        self.sources[slot][i] = None;
        Some(buf.as_mut_slice())
    }

    /// Has `slot`'s next launch copy input `i` from the `len` bytes at `src` instead of from
    /// the slot's buffer. `false` (nothing changed) while the slot is in flight, out of range,
    /// or when `len` is not the input's size. The copy is asynchronous: from page-locked memory
    /// the copy engine reads it while the job runs; from pageable memory the driver stages it
    /// before the launch returns.
    ///
    /// # Safety
    /// `src..src + len` must stay mapped until the slot's job is seen done ([`Slots::is_done`],
    /// [`Slots::wait`]), or until the slot is waited for after a failed launch.
    pub unsafe fn input_from(&mut self, slot: usize, i: usize, src: *const u8, len: usize) -> bool {
        if self.in_flight(slot) || src.is_null() {
            return false;
        }
        match (self.to_device.get(i), self.sources.get_mut(slot)) {
            (Some(&(_, bytes)), Some(sources)) if bytes == len => {
                sources[i] = Some(src);
                true
            }
            _ => false,
        }
    }

    /// Output `i` of `slot` after its job; `None` out of range or while it is in flight.
    pub fn output(&self, slot: usize, i: usize) -> Option<&[f32]> {
        if self.in_flight(slot) {
            return None;
        }
        self.outs.get(slot)?.get(i).map(PinnedF32::as_slice)
    }

    /// Launches `slot`'s job on `model`'s stream behind whatever is queued there, without
    /// waiting. The slot is in flight until [`Slots::is_done`] or [`Slots::wait`] sees it end.
    pub fn launch(&mut self, model: &mut CudaModel, slot: usize) -> Result<()> {
        if model.stream != self.stream || model.ctx != self.ctx {
            return Err(EngineError::InvalidArgument(
                "input slots launched on another model than theirs".into(),
            ));
        }
        if slot >= self.len() || self.in_flight[slot] {
            return Err(EngineError::InvalidArgument(format!(
                "input slot {slot} of {} is not free",
                self.len()
            )));
        }
        let exec = model
            .compute
            .as_ref()
            .map(CapturedGraph::exec)
            .ok_or_else(|| EngineError::Runtime("the model has no graph".into()))?;
        make_current(self.ctx)?;
        // From here the copy engine may read the slot's inputs: in flight even if a later
        // call fails, so that no one writes them until the stream is seen past it.
        self.in_flight[slot] = true;
        // Every source is taken now, whatever fails below: none outlives this launch.
        let given: Vec<Option<*const u8>> =
            self.sources[slot].iter_mut().map(Option::take).collect();
        if let (true, Some(fused)) = (given.iter().all(Option::is_none), &self.fused[slot]) {
            // SAFETY: the graph copies from and to this slot's pinned buffers, owned by self and
            // not handed out while in flight, and runs the model's forward on its arena; the
            // graph and stream are live.
            cu_check("cuGraphLaunch", unsafe {
                cu::cuGraphLaunch(fused.exec(), self.stream)
            })?;
            // SAFETY: the event and stream are live, of the current context.
            cu_check("cuEventRecord", unsafe {
                cu::cuEventRecord(self.events[slot], self.stream)
            })?;
            return Ok(());
        }
        for ((&(dst, bytes), own), given) in self.to_device.iter().zip(&self.ins[slot]).zip(given) {
            let src = match given {
                Some(given) => given as *const c_void,
                None => own.ptr() as *const c_void,
            };
            // SAFETY: src is either a pinned buffer of bytes / 4 f32s owned by self and not
            // handed out while in flight, or `bytes` of host memory that `input_from`'s caller
            // keeps mapped until the slot is seen done; dst is the model's input staging of
            // `bytes` (checked to be this model's by its stream above); the stream is live.
            cu_check("cuMemcpyHtoDAsync", unsafe {
                cu::cuMemcpyHtoDAsync_v2(dst, src, bytes, self.stream)
            })?;
        }
        // SAFETY: exec and stream are live; the graph's buffers are owned by the model.
        cu_check("cuGraphLaunch", unsafe {
            cu::cuGraphLaunch(exec, self.stream)
        })?;
        for (&(src, bytes), dst) in self.from_device.iter().zip(&self.outs[slot]) {
            // SAFETY: as for the input copies, the other way.
            cu_check("cuMemcpyDtoHAsync", unsafe {
                cu::cuMemcpyDtoHAsync_v2(dst.ptr() as *mut c_void, src, bytes, self.stream)
            })?;
        }
        // SAFETY: the event and stream are live, of the current context.
        cu_check("cuEventRecord", unsafe {
            cu::cuEventRecord(self.events[slot], self.stream)
        })?;
        Ok(())
    }

    /// Whether `slot`'s job has ended (never blocks); a slot not in flight is done.
    pub fn is_done(&mut self, slot: usize) -> Result<bool> {
        if !self.in_flight(slot) {
            return Ok(true);
        }
        // SAFETY: the event is live and was recorded by `launch`.
        match unsafe { cu::cuEventQuery(self.events[slot]) } {
            cu::CUresult::CUDA_SUCCESS => {
                self.in_flight[slot] = false;
                Ok(true)
            }
            cu::CUresult::CUDA_ERROR_NOT_READY => Ok(false),
            e => cu_check("cuEventQuery", e).map(|_| false),
        }
    }

    /// Waits for `slot`'s job as [`CudaModel::wait`] waits for a whole job (the context's own
    /// scheduling: the same wait as `run`'s).
    pub fn wait(&mut self, slot: usize) -> Result<()> {
        if !self.in_flight(slot) {
            return Ok(());
        }
        // SAFETY: the event is live and was recorded by `launch`.
        cu_check("cuEventSynchronize", unsafe {
            cu::cuEventSynchronize(self.events[slot])
        })?;
        self.in_flight[slot] = false;
        Ok(())
    }
}

impl Drop for Slots {
    fn drop(&mut self) {
        if make_current(self.ctx).is_err() {
            return;
        }
        for &ev in &self.events {
            // SAFETY: each event was created in `new` and is destroyed once, here, after the
            // job that recorded it (if any) has ended: the buffers it copies are freed next.
            unsafe {
                cu::cuEventSynchronize(ev);
                cu::cuEventDestroy_v2(ev);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use isolane_engine::{build_model, Weights};

    fn input(n: usize, seed: u32) -> Vec<f32> {
        (0..n)
            .map(|i| ((i as u32).wrapping_mul(2_654_435_761) ^ seed) as f32 / u32::MAX as f32 - 0.5)
            .collect()
    }

    /// Two jobs launched from the two slots back to back (the second queued behind the first on
    /// the stream) each give their slot the output `run` gives that input, bit for bit, whichever
    /// input each slot holds; a slot in flight hands out no buffer and refuses a second launch;
    /// the model's own buffers still run as before.
    #[test]
    #[ignore = "needs a CUDA GPU"]
    fn input_slots_give_each_job_its_own_output() {
        let g = build_model("mobilenet_v2", Weights::Synthetic { seed: 3 }).unwrap();
        let gpu = crate::CudaBackend::new(0).expect("cuda backend");
        let mut m = gpu.compile_cuda(&g, 1, Precision::Fp16).expect("compile");
        let n = m.input_mut_at(0).len();
        let xs = [input(n, 1), input(n, 2)];
        let mut reference = Vec::new();
        for x in &xs {
            m.input_mut_at(0).copy_from_slice(x);
            m.run().expect("run");
            reference.push(m.output_at(0).to_vec());
        }
        assert_ne!(reference[0], reference[1], "two inputs, one output");
        let mut s = Slots::new(&m, 2).expect("two slots");
        assert_eq!(s.len(), 2);
        for round in 0..50 {
            // Odd rounds swap the inputs, so a slot that read the other's buffer would show.
            let which = |slot: usize| (slot + round) % 2;
            for slot in 0..2 {
                s.input_mut(slot, 0)
                    .expect("a free slot's input")
                    .copy_from_slice(&xs[which(slot)]);
                s.launch(&mut m, slot).expect("launch");
                assert!(s.in_flight(slot));
                assert!(
                    s.input_mut(slot, 0).is_none(),
                    "a slot in flight was handed out"
                );
                assert!(s.output(slot, 0).is_none());
                assert!(
                    s.launch(&mut m, slot).is_err(),
                    "a slot in flight launched twice"
                );
            }
            for slot in 0..2 {
                s.wait(slot).expect("wait");
                assert_eq!(
                    s.output(slot, 0).expect("a done slot's output"),
                    &reference[which(slot)][..],
                    "round {round}, slot {slot}"
                );
            }
        }
        // Polled to its end as a server polls it.
        s.input_mut(0, 0).unwrap().copy_from_slice(&xs[1]);
        s.launch(&mut m, 0).unwrap();
        while !s.is_done(0).unwrap() {
            std::hint::spin_loop();
        }
        assert_eq!(s.output(0, 0).unwrap(), &reference[1][..]);
        m.input_mut_at(0).copy_from_slice(&xs[0]);
        m.run().expect("run after the slots");
        assert_eq!(m.output_at(0), &reference[0][..]);
    }

    /// An input given by address (page-locked host memory, as a served client's shared memory
    /// region; and pageable memory, which the driver stages) gives the output its copy into the
    /// slot gives, bit for bit; the address is used by that one launch only (the next copies
    /// from the slot's buffer again), and is refused while the slot is in flight or for a size
    /// that is not the input's.
    #[test]
    #[ignore = "needs a CUDA GPU"]
    fn an_input_copied_from_host_memory_in_place_gives_the_slots_output() {
        let g = build_model("mobilenet_v2", Weights::Synthetic { seed: 3 }).unwrap();
        let gpu = crate::CudaBackend::new(0).expect("cuda backend");
        let mut m = gpu.compile_cuda(&g, 1, Precision::Fp16).expect("compile");
        let n = m.input_mut_at(0).len();
        let xs = [input(n, 1), input(n, 2)];
        let mut s = Slots::new(&m, 2).expect("two slots");
        let mut reference = Vec::new();
        for x in &xs {
            s.input_mut(0, 0).unwrap().copy_from_slice(x);
            s.launch(&mut m, 0).unwrap();
            s.wait(0).unwrap();
            reference.push(s.output(0, 0).unwrap().to_vec());
        }
        assert_ne!(reference[0], reference[1]);
        // Whole pages, as a registered region's mapping.
        let page = 1 << 16;
        let bytes = (n * 4).div_ceil(page) * page;
        let layout = std::alloc::Layout::from_size_align(bytes, page).unwrap();
        // SAFETY: the layout's size is not zero.
        let host = unsafe { std::alloc::alloc_zeroed(layout) };
        assert!(!host.is_null());
        // SAFETY: `host` holds `bytes` bytes, at least n f32s, and is written before any launch
        // reads it.
        let as_f32 = unsafe { std::slice::from_raw_parts_mut(host as *mut f32, n) };
        as_f32.copy_from_slice(&xs[1]);
        // SAFETY: the allocation outlives the pin, dropped before it is freed below.
        let pin = unsafe { isolane_gpu::host_pin::pin_host(0, host, bytes) }.expect("pin");
        for round in 0..3 {
            // SAFETY: `host` stays allocated until after the slot is waited for.
            assert!(unsafe { s.input_from(1, 0, host, n * 4) });
            s.input_mut(0, 0).unwrap().copy_from_slice(&xs[0]);
            s.launch(&mut m, 1).unwrap();
            s.launch(&mut m, 0).unwrap();
            // SAFETY: as above; the slot is in flight, so the call must refuse it.
            let taken = unsafe { s.input_from(1, 0, host, n * 4) };
            assert!(!taken, "taken in flight");
            s.wait(1).unwrap();
            s.wait(0).unwrap();
            assert_eq!(s.output(1, 0).unwrap(), &reference[1][..], "round {round}");
            assert_eq!(s.output(0, 0).unwrap(), &reference[0][..], "round {round}");
        }
        // SAFETY: a size that is not the input's is refused before anything is kept.
        assert!(!unsafe { s.input_from(1, 0, host, n * 4 - 4) });
        // The next launch copies from the slot's own buffer again.
        s.input_mut(1, 0).unwrap().copy_from_slice(&xs[0]);
        as_f32.copy_from_slice(&xs[0]);
        s.launch(&mut m, 1).unwrap();
        s.wait(1).unwrap();
        assert_eq!(s.output(1, 0).unwrap(), &reference[0][..]);
        drop(pin);
        // Pageable memory: the driver stages it; the output is the same.
        let pageable = xs[1].clone();
        // SAFETY: `pageable` lives until after the slot is waited for.
        assert!(unsafe { s.input_from(1, 0, pageable.as_ptr() as *const u8, n * 4) });
        s.launch(&mut m, 1).unwrap();
        s.wait(1).unwrap();
        assert_eq!(s.output(1, 0).unwrap(), &reference[1][..]);
        // SAFETY: allocated above with this layout; no launch reads it any more.
        unsafe { std::alloc::dealloc(host, layout) };
    }

    /// Where a served job's `infer` time goes (docs/serve.md, "Where a request's time goes"):
    /// mobilenet_v2 at batch 1 (its 602 KB input), p50 over 300 jobs each of `run` (one graph,
    /// the stream waited for), a slot from its own buffer (its graph, the event polled as the
    /// server polls it), from page-locked host memory and from pageable memory (the copies
    /// around the forward graph), the host's copy into a slot's buffer, and the forward alone.
    /// Prints the table (`--nocapture`); every mode's output is the same, bit for bit.
    #[test]
    #[ignore = "needs a CUDA GPU"]
    fn where_a_slot_jobs_time_goes() {
        use std::time::Instant;
        let g = build_model("mobilenet_v2", Weights::Synthetic { seed: 3 }).unwrap();
        let gpu = crate::CudaBackend::new(0).expect("cuda backend");
        let mut m = gpu.compile_cuda(&g, 1, Precision::Fp16).expect("compile");
        let n = m.input_mut_at(0).len();
        let x = input(n, 7);
        m.input_mut_at(0).copy_from_slice(&x);
        m.run().unwrap();
        let reference = m.output_at(0).to_vec();
        let p50 = |mut v: Vec<f64>| {
            v.sort_by(f64::total_cmp);
            v[v.len() / 2]
        };
        let us = |t: Instant| t.elapsed().as_secs_f64() * 1e6;
        const JOBS: usize = 300;
        let mut rows: Vec<(String, f64, f64)> = Vec::new();
        let mut run = Vec::new();
        for _ in 0..JOBS {
            let t = Instant::now();
            m.run().unwrap();
            run.push(us(t));
        }
        assert_eq!(m.output_at(0), &reference[..]);
        rows.push(("run (whole graph, stream waited for)".into(), 0.0, p50(run)));
        let mut s = Slots::new(&m, 2).expect("two slots");
        let page = 1 << 16;
        let bytes = (n * 4).div_ceil(page) * page;
        let layout = std::alloc::Layout::from_size_align(bytes, page).unwrap();
        // SAFETY: the layout's size is not zero.
        let host = unsafe { std::alloc::alloc_zeroed(layout) };
        assert!(!host.is_null());
        // SAFETY: `host` holds at least n f32s; written before any launch reads it.
        unsafe { std::slice::from_raw_parts_mut(host as *mut f32, n) }.copy_from_slice(&x);
        // SAFETY: the allocation outlives the pin, dropped before it is freed below.
        let pin = unsafe { isolane_gpu::host_pin::pin_host(0, host, bytes) }.expect("pin");
        let pageable = x.clone();
        let mut copy = Vec::new();
        for mode in [
            "own buffer (slot graph)",
            "page-locked host memory",
            "pageable host memory",
        ] {
            let (mut call, mut done) = (Vec::new(), Vec::new());
            for _ in 0..JOBS {
                let src = match mode {
                    "own buffer (slot graph)" => {
                        let t = Instant::now();
                        s.input_mut(0, 0).unwrap().copy_from_slice(&x);
                        copy.push(us(t));
                        None
                    }
                    "page-locked host memory" => Some(host as *const u8),
                    _ => Some(pageable.as_ptr() as *const u8),
                };
                if let Some(src) = src {
                    // SAFETY: `host` (pinned) and `pageable` outlive the wait below.
                    let taken = unsafe { s.input_from(0, 0, src, n * 4) };
                    assert!(taken);
                }
                let t = Instant::now();
                s.launch(&mut m, 0).unwrap();
                call.push(us(t));
                while !s.is_done(0).unwrap() {
                    std::hint::spin_loop();
                }
                done.push(us(t));
            }
            assert_eq!(s.output(0, 0).unwrap(), &reference[..], "{mode}");
            rows.push((format!("slot from {mode}"), p50(call), p50(done)));
        }
        drop(pin);
        // SAFETY: allocated above with this layout; no launch reads it any more.
        unsafe { std::alloc::dealloc(host, layout) };
        let forward = m.device_ms(JOBS).unwrap() * 1e3;
        println!(
            "| mobilenet_v2 fp16, batch 1, {} KB input | launch call µs | launch to done µs |",
            n * 4 / 1000
        );
        println!("| --- | ---: | ---: |");
        for (what, call, done) in rows {
            println!("| {what} | {call:.1} | {done:.1} |");
        }
        println!(
            "| the host's copy into a slot's buffer | - | {:.1} |",
            p50(copy)
        );
        println!("| the forward alone (events, no copies) | - | {forward:.1} |");
    }
}
