//! The [`Stage`] trait and the built-in stages.
//!
//! **Extension point.** A new kind of stage (the Vulkan `graphics` render stage, a GPU
//! `preprocess`) is a type implementing [`Stage`], plus a `kind` name (`spec/raw.rs`:
//! `KindName` and its keys in `kind_keys`; `spec.rs`: a `StageKind`; `spec/validate.rs`: its
//! input and output types in `io_types`) and an arm in [`build`] (docs/apps.md, Extending). The run gives a stage, per frame, the source frame and one payload per
//! input (in the order of its `after`); what it returns goes to every stage that reads it. A
//! stage is built on the thread that runs it, so a stage holding a GPU context keeps it on one
//! thread; its partition (if any) comes with the [`StageContext`].

use std::borrow::Cow;
use std::collections::HashMap;
use std::sync::mpsc;
use std::sync::Arc;
use std::thread;

use isolane_core::spec::DeviceSpec;
use isolane_engine::CompiledModel;
use isolane_runtime::clock;
use isolane_runtime::partition::Partition;

use crate::data::{DeviceTensor, Frame, FramePool, Link, Payload, Tensor};
use crate::models::{GpuPreprocess, ModelBuilder};
use crate::ops;
use crate::spec::{ModelSpec, PreprocessDevice, StageKind, StageSpec, Transfer, Vote};

/// One step of an app's graph.
pub trait Stage: Send {
    /// Processes one frame: `inputs` has one payload per input of the stage, in `after`'s
    /// order; `frame` is the source frame they came from. An error stops the stage (the run
    /// drops its later frames and reports the message with the stage and frame).
    fn process(&mut self, frame: &Arc<Frame>, inputs: &[Arc<Payload>]) -> Result<Payload, String>;

    /// An ensemble's members' `(start, end)` times (ns, monotonic) for the frame just
    /// processed, in member order; empty for other stages.
    fn member_times(&self) -> &[(i64, i64)] {
        &[]
    }

    /// How long the frame just processed took to reach this stage's GPU from device memory
    /// (ns, waited for inside `process`), and by which link; `None` where its input was not
    /// on a GPU.
    fn transfer(&self) -> Option<(i64, Link)> {
        None
    }
}

/// What building a stage may use.
pub struct StageContext<'a> {
    pub device: &'a DeviceSpec,
    /// Shared with an ensemble's member threads.
    pub models: Arc<dyn ModelBuilder + Send>,
    pub seed: u64,
    /// Partitions by model name (`ModelSpec::name`); a model takes its own out.
    pub partitions: HashMap<String, Partition>,
    /// The output size of a preprocess that names none: `[width, height]`.
    pub preprocess_size: Option<[u32; 2]>,
    /// `[width, height]` of the source's frames (known before the run only where a stage
    /// needs it: a GPU preprocess is built for one frame size).
    pub frame_size: Option<[u32; 2]>,
    /// The cores the app's threads are pinned to (an ensemble's members pin theirs).
    pub cpu: Vec<usize>,
    /// Where a stage saves what it makes (`<out>/apps/<app>/`); `None`: nothing is saved.
    pub save_dir: Option<std::path::PathBuf>,
    /// The GPU the stage computes on ([`crate::spec::AppSpec::stage_gpu`]); `None`: the
    /// device's.
    pub gpu: Option<u32>,
    /// How values a GPU stage leaves in device memory reach the next GPU stage (the app's
    /// `transfer`).
    pub transfer: Transfer,
}

impl StageContext<'_> {
    /// The device as the stage's models see it: on the stage's GPU.
    fn stage_device(&self) -> DeviceSpec {
        DeviceSpec {
            gpu: self.gpu.unwrap_or(self.device.gpu),
            ..self.device.clone()
        }
    }
}

/// Builds stage `spec` (on the calling thread).
pub fn build(spec: &StageSpec, ctx: &mut StageContext<'_>) -> Result<Box<dyn Stage>, String> {
    Ok(match &spec.kind {
        StageKind::Preprocess(p) => {
            let [width, height] = p
                .size
                .or(ctx.preprocess_size)
                .ok_or("no size = [width, height], and it feeds no model whose input gives one")?;
            let op = ops::preprocess::Preprocess {
                width,
                height,
                spec: p.clone(),
            };
            match p.device {
                PreprocessDevice::Cpu => Box::new(PreprocessStage(op)),
                PreprocessDevice::Gpu => Box::new(GpuPreprocessStage::build(op, &spec.name, ctx)?),
            }
        }
        StageKind::Model(m) => Box::new(ModelStage::build(m, ctx)?),
        StageKind::Yolov8Decode { conf, iou, max_det } => {
            let (conf, iou, max_det) = (*conf, *iou, *max_det);
            Box::new(FnStage(move |_f: &Arc<Frame>, t: &Payload| {
                ops::yolo::decode(&*tensor(t)?, conf, iou, max_det)
                    .map(Payload::Detections)
                    .map_err(|e| e.to_string())
            }))
        }
        StageKind::SegArgmax { alpha } => {
            let alpha = *alpha;
            Box::new(FnStage(move |f: &Arc<Frame>, t: &Payload| {
                ops::seg::argmax_overlay(&*tensor(t)?, f, alpha)
                    .map(Payload::Mask)
                    .map_err(|e| e.to_string())
            }))
        }
        StageKind::Classify { top_k } => {
            let k = *top_k;
            Box::new(FnStage(move |_f: &Arc<Frame>, t: &Payload| {
                let p = ops::classify::probabilities(&*tensor(t)?).map_err(|e| e.to_string())?;
                Ok(Payload::Classes(ops::classify::top_k(&p, k)))
            }))
        }
        StageKind::Ensemble { members, vote } => Box::new(Ensemble::build(members, vote, ctx)?),
        StageKind::Graphics {
            device,
            alpha,
            save_every,
            ..
        } => {
            let mut g = GraphicsStage::new(device, *alpha)?;
            if let Some(size) = ctx.frame_size {
                g.warm_up(size)?;
            }
            if let (Some(n), Some(dir)) = (save_every, &ctx.save_dir) {
                g.save = Some(SaveFrames::new(dir.join(&spec.name), *n)?);
            }
            Box::new(g)
        }
        StageKind::Sink => Box::new(Sink),
    })
}

/// A tensor input in host memory: as it came, or downloaded from the GPU it was left on.
fn tensor(p: &Payload) -> Result<Cow<'_, Tensor>, String> {
    match p {
        Payload::Tensor(t) => Ok(Cow::Borrowed(t)),
        Payload::Device(t) => t.to_host().map(Cow::Owned),
        other => Err(format!("expected a tensor, got {}", other.type_name())),
    }
}

/// A one-input operator given as a function.
struct FnStage<F>(F);

impl<F> Stage for FnStage<F>
where
    F: FnMut(&Arc<Frame>, &Payload) -> Result<Payload, String> + Send,
{
    fn process(&mut self, frame: &Arc<Frame>, inputs: &[Arc<Payload>]) -> Result<Payload, String> {
        (self.0)(frame, &inputs[0])
    }
}

struct PreprocessStage(ops::preprocess::Preprocess);

impl Stage for PreprocessStage {
    fn process(&mut self, _frame: &Arc<Frame>, inputs: &[Arc<Payload>]) -> Result<Payload, String> {
        match &*inputs[0] {
            Payload::Frame(f) => self
                .0
                .run(f)
                .map(Payload::Tensor)
                .map_err(|e| e.to_string()),
            other => Err(format!("expected a frame, got {}", other.type_name())),
        }
    }
}

/// A preprocess on the GPU (`device = "gpu"`): the frame (its crop cut out on the host) is
/// copied to the device and the CUDA kernel resizes and normalises it there. The tensor stays
/// in device memory for the stages after it, which copy it to their GPU ([`Link`]), unless
/// the app says `transfer = "host"` (or the backend keeps none): then it comes back to host
/// memory. The kernel is built for one frame size, the source's first frame's; its partition
/// is the one of the model it feeds, when it runs on that model's GPU (the run hands it over
/// under the stage's name).
struct GpuPreprocessStage {
    op: ops::preprocess::Preprocess,
    kernel: Box<dyn GpuPreprocess>,
    transfer: Transfer,
    /// The frame size the kernel was built for.
    frame: [u32; 2],
    /// The crop's pixels, packed (reused between frames).
    cropped: Vec<u8>,
}

impl GpuPreprocessStage {
    fn build(
        op: ops::preprocess::Preprocess,
        name: &str,
        ctx: &mut StageContext<'_>,
    ) -> Result<GpuPreprocessStage, String> {
        let frame = ctx
            .frame_size
            .ok_or("a GPU preprocess needs the source's frame size before the run")?;
        let [_, _, cw, ch] = op
            .crop_of(&Frame {
                width: frame[0],
                height: frame[1],
                rgb: Vec::new(),
            })
            .map_err(|e| e.to_string())?;
        let plan = op.kernel_plan(cw, ch)?;
        let f16 = op.spec.dtype == crate::spec::Dtype::F16;
        let partition = ctx.partitions.remove(name);
        let kernel = ctx
            .models
            .preprocessor(&ctx.stage_device(), &plan, f16, partition)?;
        let mut stage = GpuPreprocessStage {
            op,
            kernel,
            transfer: ctx.transfer,
            frame,
            cropped: Vec::new(),
        };
        // One frame before the run, as a model's warm-up: the first launch pays for loading
        // the kernel and allocating the device buffers, which no frame should.
        let blank = Frame {
            width: frame[0],
            height: frame[1],
            rgb: vec![0; frame[0] as usize * frame[1] as usize * 3],
        };
        stage.run(&blank)?;
        Ok(stage)
    }

    fn run(&mut self, f: &Frame) -> Result<Payload, String> {
        if [f.width, f.height] != self.frame {
            return Err(format!(
                "a GPU preprocess takes frames of one size (the source's first, {}x{}); this \
                 one is {}x{} (give the source frames of one size, or device = \"cpu\")",
                self.frame[0], self.frame[1], f.width, f.height
            ));
        }
        let crop = self.op.crop_of(f).map_err(|e| e.to_string())?;
        let rgb: &[u8] = if self.op.spec.crop.is_some() {
            ops::preprocess::cut(f, crop, &mut self.cropped);
            &self.cropped
        } else {
            &f.rgb
        };
        let (w, h) = (self.op.width as usize, self.op.height as usize);
        let (shape, frame_map) = (vec![1, 3, h, w], Some(self.op.frame_map(crop)));
        if self.transfer != Transfer::Host {
            if let Some(values) = self.kernel.run_to_device(rgb)? {
                return Ok(Payload::Device(DeviceTensor {
                    shape,
                    values,
                    frame_map,
                }));
            }
        }
        let mut data = vec![0f32; 3 * w * h];
        self.kernel.run(rgb, &mut data)?;
        Ok(Payload::Tensor(Tensor {
            shape,
            data,
            frame_map,
        }))
    }
}

impl Stage for GpuPreprocessStage {
    fn process(&mut self, _frame: &Arc<Frame>, inputs: &[Arc<Payload>]) -> Result<Payload, String> {
        match &*inputs[0] {
            Payload::Frame(f) => self.run(f),
            other => Err(format!("expected a frame, got {}", other.type_name())),
        }
    }
}

/// Renders the source frame with the detections or mask it reads, offscreen through Vulkan
/// (`isolane_graphics::Renderer`, made at the first frame, whose size it takes), and passes the
/// rendered frame on. Its own time is the whole render: upload, draw, wait and read-back.
struct GraphicsStage {
    device: isolane_graphics::DevicePreference,
    alpha: f32,
    renderer: Option<isolane_graphics::Renderer>,
    /// Reused between frames: the frame as RGBA, the read-back, the boxes, the mask's classes
    /// and the frames handed on (a 1080p frame is 6–8 MB: allocating and converting it afresh
    /// per frame cost more than the render).
    rgba: Vec<u8>,
    rendered: Vec<u8>,
    boxes: Vec<isolane_graphics::BoxOverlay>,
    classes: Vec<u8>,
    outputs: FramePool<()>,
    save: Option<SaveFrames>,
}

/// Rendered frames a graphics stage keeps for reuse.
const RENDERED_BUFFERS: usize = 4;

impl Drop for GraphicsStage {
    fn drop(&mut self) {
        // The renderer's Vulkan device is left to the end of the process, not destroyed here:
        // with four or more graphics stages in one process (green partitions: every app's
        // threads share it) NVIDIA's driver 580 on the H100 hung in `vkDestroyDevice`, waiting
        // on a thread of its own, and the run never ended (docs/apps.md, Measured on the H100).
        // A stage is dropped once per run and `isolane run` is one run per process; the driver
        // frees the device when the process exits.
        if let Some(r) = self.renderer.take() {
            std::mem::forget(r);
        }
    }
}

/// Every `every`-th rendered frame of a graphics stage saved as a PNG, so that a user can look
/// at what the app drew: `<dir>/frame-<k>.png`, `k` counting the frames the stage rendered.
struct SaveFrames {
    dir: std::path::PathBuf,
    every: u64,
    rendered: u64,
}

impl SaveFrames {
    fn new(dir: std::path::PathBuf, every: u64) -> Result<SaveFrames, String> {
        std::fs::create_dir_all(&dir)
            .map_err(|e| format!("cannot create {}: {e}", dir.display()))?;
        Ok(SaveFrames {
            dir,
            every: every.max(1),
            rendered: 0,
        })
    }

    /// The path to save the frame just rendered at, if it is one to save.
    fn next(&mut self) -> Option<std::path::PathBuf> {
        let k = self.rendered;
        self.rendered += 1;
        k.is_multiple_of(self.every)
            .then(|| self.dir.join(format!("frame-{k:06}.png")))
    }
}

impl GraphicsStage {
    fn new(device: &str, alpha: f32) -> Result<GraphicsStage, String> {
        let device: isolane_graphics::DevicePreference =
            device.parse().map_err(|e| format!("device: {e}"))?;
        // A stage pinned to a CUDA GPU (crate::placement) checks now that Vulkan has that GPU,
        // so that a machine without its Vulkan driver fails the run before any frame; other
        // preferences are looked at with the first frame, as before.
        if let isolane_graphics::DevicePreference::Uuid(_) = device {
            isolane_graphics::find_device(&device).map_err(|e| format!("device: {e}"))?;
        }
        Ok(GraphicsStage {
            device,
            alpha,
            renderer: None,
            rgba: Vec::new(),
            rendered: Vec::new(),
            boxes: Vec::new(),
            classes: Vec::new(),
            outputs: FramePool::new(RENDERED_BUFFERS),
            save: None,
        })
    }

    /// Makes the renderer for the source's frame size and renders and reads back one black
    /// frame, before the run: on the H100 a renderer made at the first frame (its device,
    /// pipelines, staging and read-back buffers) held the app's first frames for 30–40 ms, the
    /// worst latency of most runs of paper 004's study (docs/apps.md).
    fn warm_up(&mut self, [width, height]: [u32; 2]) -> Result<(), String> {
        let black = Arc::new(Frame::black(width, height));
        let nothing = Arc::new(Payload::Detections(Vec::new()));
        self.process(&black, &[nothing]).map(drop)
    }

    /// Makes the renderer for `frame`'s size: at the first frame, and again when the size
    /// changes (a folder of images of several sizes; a renderer draws at one size).
    fn make_renderer(&mut self, frame: &Frame) -> Result<(), String> {
        let fits = self
            .renderer
            .as_ref()
            .is_some_and(|r| (r.config().width, r.config().height) == (frame.width, frame.height));
        if !fits {
            self.renderer = None;
            let config = isolane_graphics::RendererConfig {
                device: self.device.clone(),
                mask_alpha: self.alpha,
                ..isolane_graphics::RendererConfig::new(frame.width, frame.height)
            };
            let r = isolane_graphics::Renderer::new(config).map_err(|e| e.to_string())?;
            self.renderer = Some(r);
        }
        Ok(())
    }
}

impl Stage for GraphicsStage {
    fn process(&mut self, frame: &Arc<Frame>, inputs: &[Arc<Payload>]) -> Result<Payload, String> {
        self.make_renderer(frame)?;
        rgb_to_rgba(&frame.rgb, &mut self.rgba);
        self.boxes.clear();
        self.classes.clear();
        let mut mask = None;
        match &*inputs[0] {
            Payload::Detections(d) => {
                self.boxes
                    .extend(d.iter().map(|b| isolane_graphics::BoxOverlay {
                        x0: b.x1,
                        y0: b.y1,
                        x1: b.x2,
                        y1: b.y2,
                        class: b.class.min(255) as u8,
                        score: b.score,
                    }))
            }
            Payload::Mask(m) => {
                // The renderer's palette has 256 classes; larger ids share the last colour.
                self.classes
                    .extend(m.classes.iter().map(|&c| c.min(255) as u8));
                mask = Some((m.width, m.height));
            }
            other => {
                return Err(format!(
                    "expected detections or a mask, got {}",
                    other.type_name()
                ))
            }
        }
        let (boxes, classes) = (&self.boxes, &self.classes);
        let overlay = isolane_graphics::Overlay {
            boxes,
            mask: mask.map(|(width, height)| isolane_graphics::MaskRef {
                width,
                height,
                classes,
            }),
        };
        let frame_ref = isolane_graphics::FrameRef {
            width: frame.width,
            height: frame.height,
            rgba: &self.rgba,
        };
        let r = self.renderer.as_mut().expect("made above");
        r.render(frame_ref, &overlay).map_err(|e| e.to_string())?;
        r.read_back_into(&mut self.rendered)
            .map_err(|e| e.to_string())?;
        if let Some(path) = self.save.as_mut().and_then(SaveFrames::next) {
            r.save_png(&path).map_err(|e| e.to_string())?;
        }
        let (width, height, rendered) = (frame.width, frame.height, &self.rendered);
        let out = self.outputs.next(
            || {
                let mut f = Frame::black(width, height);
                rgba_to_rgb(rendered, &mut f.rgb);
                (f, ())
            },
            |f, ()| {
                (f.width, f.height) = (width, height);
                rgba_to_rgb(rendered, &mut f.rgb);
            },
        );
        Ok(Payload::Frame(out))
    }
}

fn rgb_to_rgba(rgb: &[u8], out: &mut Vec<u8>) {
    out.resize(rgb.len() / 3 * 4, 255);
    for (o, p) in out.chunks_exact_mut(4).zip(rgb.chunks_exact(3)) {
        o[..3].copy_from_slice(p);
        o[3] = 255;
    }
}

fn rgba_to_rgb(rgba: &[u8], out: &mut Vec<u8>) {
    out.resize(rgba.len() / 4 * 3, 0);
    for (o, p) in out.chunks_exact_mut(3).zip(rgba.chunks_exact(4)) {
        o.copy_from_slice(&p[..3]);
    }
}

/// Ends the graph; the time it finishes a frame is the frame's end to end.
struct Sink;

impl Stage for Sink {
    fn process(
        &mut self,
        _frame: &Arc<Frame>,
        _inputs: &[Arc<Payload>],
    ) -> Result<Payload, String> {
        Ok(Payload::Done)
    }
}

/// A compiled model at batch 1: input tensor in, its first output out. A tensor left on a
/// GPU is copied into the model's input on its GPU where the backend can (timed: the stage's
/// [`Stage::transfer`]), and else downloaded.
struct ModelStage {
    model: Box<dyn CompiledModel>,
    models: Arc<dyn ModelBuilder + Send>,
    transfer: Transfer,
    /// The last frame's input transfer.
    moved: Option<(i64, Link)>,
}

impl ModelStage {
    fn build(spec: &ModelSpec, ctx: &mut StageContext<'_>) -> Result<ModelStage, String> {
        let partition = ctx.partitions.remove(&spec.name);
        let model = ctx
            .models
            .build(&ctx.stage_device(), spec, ctx.seed, partition)?;
        let mut stage = ModelStage {
            model,
            models: ctx.models.clone(),
            transfer: ctx.transfer,
            moved: None,
        };
        // One forward pass before the run: first runs pay for lazy set-up (page faults, a
        // CUDA graph's first launch) that no frame should.
        stage.model.run().map_err(|e| e.to_string())?;
        Ok(stage)
    }

    fn check_shape(&self, shape: &[usize]) -> Result<(), String> {
        let want = self.model.input_shape();
        if shape != want {
            return Err(format!(
                "its input is a {shape:?} tensor; the model takes {want:?} (give the preprocess \
                 that size)"
            ));
        }
        Ok(())
    }

    fn infer(&mut self, t: &Tensor) -> Result<Tensor, String> {
        self.check_shape(&t.shape)?;
        self.model.input_mut().copy_from_slice(&t.data);
        self.run(t.frame_map)
    }

    /// A tensor on a GPU into the model: device to device where the backend can, else
    /// through host memory; the copy is timed either way.
    fn infer_device(&mut self, t: &DeviceTensor) -> Result<Tensor, String> {
        self.check_shape(&t.shape)?;
        let start = clock::now_ns();
        let fed = self
            .models
            .feed(&mut *self.model, &*t.values, self.transfer)?;
        let link = match fed {
            Some(link) => link,
            None => {
                t.values.to_host(self.model.input_mut())?;
                Link::Host
            }
        };
        self.moved = Some((clock::now_ns() - start, link));
        self.run(t.frame_map)
    }

    fn run(&mut self, frame_map: Option<crate::data::FrameMap>) -> Result<Tensor, String> {
        self.model.run().map_err(|e| e.to_string())?;
        Ok(Tensor {
            shape: self.model.output_shape().to_vec(),
            data: self.model.output().to_vec(),
            frame_map,
        })
    }
}

impl Stage for ModelStage {
    fn process(&mut self, _frame: &Arc<Frame>, inputs: &[Arc<Payload>]) -> Result<Payload, String> {
        self.moved = None;
        match &*inputs[0] {
            Payload::Device(t) => self.infer_device(t),
            other => self.infer(&*tensor(other)?),
        }
        .map(Payload::Tensor)
    }

    fn transfer(&self) -> Option<(i64, Link)> {
        self.moved
    }
}

/// A member's answer: its index, its output, its start and end.
type MemberReply = (usize, Result<Tensor, String>, i64, i64);

/// Fans one input out to its members, each a model on a thread of its own (in its own
/// partition), and votes once every member has answered.
struct Ensemble {
    jobs: Vec<mpsc::Sender<Arc<Tensor>>>,
    replies: mpsc::Receiver<MemberReply>,
    vote: EnsembleVote,
    times: Vec<(i64, i64)>,
    outputs: Vec<Option<Tensor>>,
    threads: Vec<thread::JoinHandle<()>>,
}

enum EnsembleVote {
    Majority,
    Mean,
    Model(ModelStage),
}

impl Ensemble {
    fn build(
        members: &[ModelSpec],
        vote: &Vote,
        ctx: &mut StageContext<'_>,
    ) -> Result<Ensemble, String> {
        let (reply_tx, replies) = mpsc::channel();
        let (ready_tx, ready_rx) = mpsc::channel::<Result<(), String>>();
        // Built up in place: on any error below, dropping it closes the members' job channels
        // and joins their threads, so that no member outlives a failed build (its model may
        // sit in a partition the caller is about to take down).
        let mut ens = Ensemble {
            jobs: Vec::new(),
            replies,
            vote: EnsembleVote::Majority,
            times: vec![(0, 0); members.len()],
            outputs: vec![None; members.len()],
            threads: Vec::new(),
        };
        for (i, spec) in members.iter().enumerate() {
            let (job_tx, job_rx) = mpsc::channel::<Arc<Tensor>>();
            let partition = ctx.partitions.remove(&spec.name);
            let builder = MemberBuild {
                spec: spec.clone(),
                device: ctx.stage_device(),
                seed: ctx.seed ^ (i as u64 + 1),
                index: i,
                cpu: ctx.cpu.clone(),
            };
            let (reply_tx, ready_tx) = (reply_tx.clone(), ready_tx.clone());
            let models = ctx.models.clone();
            let thread = thread::Builder::new()
                .name(format!("member {}", spec.name))
                .spawn(move || builder.serve(models, partition, job_rx, reply_tx, ready_tx))
                .map_err(|e| format!("cannot start a thread for member `{}`: {e}", spec.name))?;
            ens.jobs.push(job_tx);
            ens.threads.push(thread);
        }
        drop(ready_tx);
        // Every member answers once, built or not: wait for all before judging.
        let mut failed = None;
        for _ in members {
            match ready_rx.recv() {
                Ok(Ok(())) => {}
                Ok(Err(e)) => {
                    failed.get_or_insert(e);
                }
                Err(_) => {
                    failed.get_or_insert("a member thread ended before it was built".into());
                    break;
                }
            }
        }
        if let Some(e) = failed {
            return Err(e);
        }
        ens.vote = match vote {
            Vote::Majority => EnsembleVote::Majority,
            Vote::Mean => EnsembleVote::Mean,
            Vote::Onnx(m) => EnsembleVote::Model(ModelStage::build(m, ctx)?),
        };
        Ok(ens)
    }
}

struct MemberBuild {
    spec: ModelSpec,
    device: DeviceSpec,
    seed: u64,
    index: usize,
    cpu: Vec<usize>,
}

impl MemberBuild {
    fn serve(
        self,
        models: Arc<dyn ModelBuilder + Send>,
        partition: Option<Partition>,
        jobs: mpsc::Receiver<Arc<Tensor>>,
        replies: mpsc::Sender<MemberReply>,
        ready: mpsc::Sender<Result<(), String>>,
    ) {
        let pinned =
            isolane_runtime::affinity::pin_current_thread(&self.cpu).map_err(|e| e.to_string());
        let model = pinned
            .and_then(|()| models.build(&self.device, &self.spec, self.seed, partition))
            .and_then(|model| {
                let mut s = ModelStage {
                    model,
                    models: Arc::clone(&models),
                    transfer: Transfer::Host,
                    moved: None,
                };
                s.model.run().map_err(|e| e.to_string())?;
                Ok(s)
            });
        let mut stage = match model {
            Ok(s) => {
                let _ = ready.send(Ok(()));
                s
            }
            Err(e) => {
                let _ = ready.send(Err(format!("member `{}`: {e}", self.spec.name)));
                return;
            }
        };
        drop(ready);
        let index = self.index;
        while let Ok(input) = jobs.recv() {
            let start = clock::now_ns();
            // A panic must still answer: the ensemble waits for every member's reply.
            let out =
                std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| stage.infer(&input)))
                    .unwrap_or_else(|_| Err("the member's model panicked".to_string()));
            let end = clock::now_ns();
            if replies.send((index, out, start, end)).is_err() {
                break;
            }
        }
    }
}

impl Stage for Ensemble {
    fn process(&mut self, _frame: &Arc<Frame>, inputs: &[Arc<Payload>]) -> Result<Payload, String> {
        // Members take host tensors: one download for all of them.
        let input = Arc::new(tensor(&inputs[0])?.into_owned());
        for job in &self.jobs {
            job.send(input.clone())
                .map_err(|_| "a member thread has ended".to_string())?;
        }
        for _ in 0..self.jobs.len() {
            let (i, out, start, end) = self
                .replies
                .recv()
                .map_err(|_| "a member thread has ended".to_string())?;
            self.times[i] = (start, end);
            self.outputs[i] = Some(out?);
        }
        let outputs: Vec<&Tensor> = self.outputs.iter().flatten().collect();
        let vote = match &mut self.vote {
            EnsembleVote::Majority => ops::vote::majority(&outputs).map(Payload::Classes),
            EnsembleVote::Mean => ops::vote::mean(&outputs, 5).map(Payload::Classes),
            EnsembleVote::Model(m) => {
                let mut stacked = ops::vote::stack(&outputs).map_err(|e| e.to_string())?;
                // `[members, 1, K]` and a voter's `[1, members, K]` hold the same values in
                // the same order: the voter takes them in its own input shape.
                let want = m.model.input_shape();
                if want.iter().product::<usize>() == stacked.data.len() {
                    stacked.shape = want.to_vec();
                }
                return m.infer(&stacked).map(Payload::Tensor);
            }
        };
        vote.map_err(|e| e.to_string())
    }

    fn member_times(&self) -> &[(i64, i64)] {
        &self.times
    }
}

impl Drop for Ensemble {
    fn drop(&mut self) {
        // Closing the job channels ends the member loops; join them so that no member
        // outlives the ensemble (and its model, in its partition, is dropped before the run
        // takes the partitions down).
        self.jobs.clear();
        for t in self.threads.drain(..) {
            let _ = t.join();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::data::Detection;
    use isolane_core::system_packages::{skip_without, VULKAN};

    /// A stage told the frame size before the run has its renderer made and its read-back
    /// allocated then, so that the first frame pays neither.
    #[test]
    fn a_graphics_stage_warms_up_before_the_first_frame() {
        let mut stage = GraphicsStage::new("auto", 0.5).unwrap();
        match stage.warm_up([64, 48]) {
            Ok(()) => {}
            Err(e) if isolane_graphics::says_vulkan_missing(&e) => {
                skip_without(&VULKAN, &e);
                return;
            }
            Err(e) => panic!("{e}"),
        }
        assert_eq!(stage.rendered.len(), 64 * 48 * 4, "read back once");
        let size = |s: &GraphicsStage| {
            s.renderer
                .as_ref()
                .map(|r| (r.config().width, r.config().height))
        };
        assert_eq!(
            size(&stage),
            Some((64, 48)),
            "the renderer exists before any frame"
        );
        let frame = Arc::new(Frame::black(64, 48));
        let none = Payload::Detections(Vec::new());
        stage.process(&frame, &[Arc::new(none)]).unwrap();
        assert_eq!(size(&stage), Some((64, 48)));
    }

    /// The graphics stage draws a detection's box over the source frame and passes the frame
    /// on at its size; pixels away from the box are the frame's. Rendered through Vulkan
    /// (lavapipe in CI); it skips on a machine without Vulkan (fails under ISOLANE_STRICT=1).
    #[test]
    fn the_graphics_stage_draws_the_boxes_over_the_frame() {
        let mut stage = GraphicsStage::new("auto", 0.5).unwrap();
        let frame = Arc::new(Frame {
            width: 64,
            height: 48,
            rgb: [10u8, 20, 30].repeat(64 * 48),
        });
        let boxes = Payload::Detections(vec![Detection {
            x1: 8.0,
            y1: 8.0,
            x2: 40.0,
            y2: 30.0,
            score: 0.9,
            class: 1,
        }]);
        let out = match stage.process(&frame, &[Arc::new(boxes)]) {
            Ok(Payload::Frame(f)) => f,
            Ok(other) => panic!("expected a frame, got {}", other.type_name()),
            Err(e) if isolane_graphics::says_vulkan_missing(&e) => {
                skip_without(&VULKAN, &e);
                return;
            }
            Err(e) => panic!("{e}"),
        };
        assert_eq!((out.width, out.height), (64, 48));
        let px = |x: usize, y: usize| &out.rgb[(y * 64 + x) * 3..][..3];
        assert_eq!(px(60, 44), [10, 20, 30], "far from the box: the frame");
        assert_eq!(px(20, 20), [10, 20, 30], "inside the outline: the frame");
        assert_ne!(px(8, 20), [10, 20, 30], "the box's left edge is drawn");
        // A frame of another size (a folder of images) is rendered at its own size.
        let small = Arc::new(Frame {
            width: 32,
            height: 24,
            rgb: [10u8, 20, 30].repeat(32 * 24),
        });
        let none = Arc::new(Payload::Detections(Vec::new()));
        match stage.process(&small, &[none]).unwrap() {
            Payload::Frame(f) => {
                assert_eq!((f.width, f.height, f.rgb.len()), (32, 24, 32 * 24 * 3))
            }
            other => panic!("expected a frame, got {}", other.type_name()),
        }
        // A tensor is refused by name.
        let t = Payload::Tensor(Tensor {
            shape: vec![1],
            data: vec![0.0],
            frame_map: None,
        });
        let e = stage.process(&frame, &[Arc::new(t)]).unwrap_err();
        assert!(e.contains("detections or a mask"), "{e}");
    }
}
