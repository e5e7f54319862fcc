//! What a client asks a served model for and what it gets back, independent of the wire
//! (HTTP or gRPC): checked tensors in, tensors out, and the reasons a request is refused.

use std::time::Duration;

use isolane_protocol::{DataType, GrpcCode, ProtocolError, Tensor};
use isolane_runtime::exec::TensorInfo;

/// One inference request, decoded by a front end.
#[derive(Debug)]
pub struct InferRequest {
    /// The client's inputs, in any order; each model input exactly once.
    pub inputs: Vec<Tensor>,
    /// The outputs asked for (`None`: all of them).
    pub outputs: Option<Vec<String>>,
    /// The request's own deadline (`deadline_ms`); `None`: the model's.
    pub deadline: Option<Duration>,
}

/// A completed request.
#[derive(Debug)]
pub struct InferResponse {
    /// The outputs asked for, in the model's order, FP32 with the request's rows.
    pub outputs: Vec<Tensor>,
    /// Completed after its deadline (answered all the same, and counted).
    pub late: bool,
    /// Time in the queue and in the job it ran in (µs), for access logs.
    pub queued_us: u64,
    pub job_us: u64,
    /// Rows of the job it ran in (more than the request's own when batched).
    pub job_rows: usize,
    /// When it passed each stage of its model's queue and job, for the front ends' stage
    /// breakdown ([`Stage`]).
    pub stamps: Stamps,
}

/// When a request passed each stage inside the serving core (ns on
/// `isolane_runtime::clock`'s monotonic clock).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Stamps {
    /// Handed to its model (admission's start).
    pub arrived: i64,
    /// Its job took it from the queue (the input copy's start).
    pub picked: i64,
    /// The model began.
    pub started: i64,
    /// The model ended.
    pub done: i64,
    /// Its answer, outputs copied, was handed back to the front end.
    pub answered: i64,
}

/// The stages of a request's time in the server, in order, from its header's arrival to its
/// response built; what the statistics extension reports per front end (`isolane_stages`),
/// so that the time outside them (the socket, the client) is what a client's latency has on
/// top of their sum.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Stage {
    /// Header to body read in full (gRPC: and parsed as protobuf by tonic).
    Receive,
    /// The body decoded as a KServe request, up to its submission to the model.
    Decode,
    /// Submission to its job taking it: admission, the queue, the model thread's wake-up.
    Queue,
    /// The job's input copy.
    Input,
    /// The model's run.
    Infer,
    /// The outputs copied into the response.
    Output,
    /// The answer handed over to the front end's task running again.
    Wake,
    /// The response encoded (and shared-memory outputs written).
    Encode,
}

impl Stage {
    pub const ALL: [Stage; 8] = [
        Stage::Receive,
        Stage::Decode,
        Stage::Queue,
        Stage::Input,
        Stage::Infer,
        Stage::Output,
        Stage::Wake,
        Stage::Encode,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Stage::Receive => "receive",
            Stage::Decode => "decode",
            Stage::Queue => "queue",
            Stage::Input => "input",
            Stage::Infer => "infer",
            Stage::Output => "output",
            Stage::Wake => "wake",
            Stage::Encode => "encode",
        }
    }
}

/// What a front end saw of one answered request (ns, the same clock as [`Stamps`]): its
/// header's arrival, its body read, its task resumed with the answer, its response built.
#[derive(Debug, Clone, Copy, Default)]
pub struct FrontStamps {
    pub header: i64,
    pub body: i64,
    pub resumed: i64,
    pub encoded: i64,
}

impl FrontStamps {
    /// Each stage's ns for a request the core stamped `core`, in [`Stage::ALL`]'s order.
    pub fn stages(&self, core: &Stamps) -> [i64; 8] {
        let points = [
            self.header,
            self.body,
            core.arrived,
            core.picked,
            core.started,
            core.done,
            core.answered,
            self.resumed,
            self.encoded,
        ];
        let mut out = [0; 8];
        for (i, o) in out.iter_mut().enumerate() {
            *o = (points[i + 1] - points[i]).max(0);
        }
        out
    }
}

/// Why a request got no answer from its model. Each maps to one HTTP status and gRPC code.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum Refusal {
    #[error("unknown model `{name}`; served models: {served}")]
    UnknownModel { name: String, served: String },
    /// Triton's answer for a version a model does not have (404 / NOT_FOUND, its words): a
    /// served model has version 1 only.
    #[error(
        "Request for unknown model: '{model}' version {version} is not found (a served model \
         has version 1 only; a request without a version asks for it)"
    )]
    UnknownVersion { model: String, version: String },
    #[error("{0}")]
    BadRequest(String),
    #[error(
        "model `{model}`: refused, its queue is full ({limit} requests waiting; \
         [workload.serve] queue_limit)"
    )]
    QueueFull { model: String, limit: u32 },
    #[error(
        "model `{model}`: refused, predicted to complete {lateness_ms:.3} ms after its \
         deadline ({predicted_ms:.3} ms predicted against a deadline of {deadline_ms:.3} ms: \
         {ahead} queued ahead, {service_ms:.3} ms per job)"
    )]
    WouldBeLate {
        model: String,
        predicted_ms: f64,
        deadline_ms: f64,
        lateness_ms: f64,
        ahead: usize,
        service_ms: f64,
    },
    #[error(
        "model `{model}`: dropped from a full queue for a newer request \
         ([workload.serve] when_full = \"drop_oldest\")"
    )]
    Dropped { model: String },
    #[error("the server is shutting down; model `{model}` takes no new requests")]
    Draining { model: String },
    /// A request taken, then dropped unanswered when the drain's time ran out: it was queued,
    /// not refused at the door, and `--out` records it as a job that did not run.
    #[error(
        "model `{model}`: the request was taken but dropped unanswered at shutdown: the \
         drain's time (--drain-timeout) ran out, or a second stop signal ended it, before it ran"
    )]
    Abandoned { model: String },
    /// Triton's answer for a model unloaded through the repository extension (404 /
    /// NOT_FOUND, its words).
    #[error(
        "Request for unknown model: '{model}' has no available versions (unloaded; \
         POST /v2/repository/models/{model}/load loads it again)"
    )]
    Unloaded { model: String },
    #[error("model `{model}`: the inference failed: {message}")]
    Failed { model: String, message: String },
}

impl Refusal {
    /// The reason label of `isolane_serve_rejections_total`.
    pub fn reason(&self) -> &'static str {
        match self {
            Refusal::UnknownModel { .. } | Refusal::UnknownVersion { .. } => "unknown_model",
            Refusal::BadRequest(_) => "bad_request",
            Refusal::QueueFull { .. } => "queue_full",
            Refusal::WouldBeLate { .. } => "deadline",
            Refusal::Dropped { .. } => "dropped",
            Refusal::Draining { .. } | Refusal::Abandoned { .. } => "draining",
            Refusal::Unloaded { .. } => "unloaded",
            Refusal::Failed { .. } => "failed",
        }
    }

    /// 429 for the refusals a client may retry later (queue, deadline), as the issue's
    /// interface fixes; 503 while draining.
    pub fn http_status(&self) -> u16 {
        match self {
            Refusal::UnknownModel { .. }
            | Refusal::UnknownVersion { .. }
            | Refusal::Unloaded { .. } => 404,
            Refusal::BadRequest(_) => 400,
            Refusal::QueueFull { .. } | Refusal::WouldBeLate { .. } | Refusal::Dropped { .. } => {
                429
            }
            Refusal::Draining { .. } | Refusal::Abandoned { .. } => 503,
            Refusal::Failed { .. } => 500,
        }
    }

    pub fn grpc_code(&self) -> GrpcCode {
        match self {
            Refusal::UnknownModel { .. }
            | Refusal::UnknownVersion { .. }
            | Refusal::Unloaded { .. } => GrpcCode::NotFound,
            Refusal::BadRequest(_) => GrpcCode::InvalidArgument,
            Refusal::QueueFull { .. } | Refusal::WouldBeLate { .. } | Refusal::Dropped { .. } => {
                GrpcCode::ResourceExhausted
            }
            Refusal::Draining { .. } | Refusal::Abandoned { .. } => GrpcCode::Unavailable,
            Refusal::Failed { .. } => GrpcCode::Internal,
        }
    }
}

impl From<ProtocolError> for Refusal {
    fn from(e: ProtocolError) -> Self {
        Refusal::BadRequest(e.to_string())
    }
}

/// A request's inputs checked against its model and put in the model's input order, with
/// their row count.
#[derive(Debug)]
pub(crate) struct CheckedInputs {
    pub tensors: Vec<Tensor>,
    pub rows: usize,
    /// Indices (into the model's outputs) to answer with.
    pub outputs: Vec<usize>,
}

/// Checks `req` against a model's tensors: every input present once, FP32, `[rows, ...]` with
/// the compiled shape after the batch and `1 ≤ rows ≤ max_batch`, the same rows in every
/// input; outputs asked for exist.
pub(crate) fn check_inputs(
    model: &str,
    inputs: &[TensorInfo],
    outputs: &[TensorInfo],
    max_batch: usize,
    req: InferRequest,
) -> Result<CheckedInputs, Refusal> {
    let bad = |m: String| Refusal::BadRequest(format!("model `{model}`: {m}"));
    let mut given = req.inputs;
    if let Some(extra) = given
        .iter()
        .find(|t| !inputs.iter().any(|i| i.name == t.name()))
    {
        return Err(bad(format!(
            "unknown input `{}`; its inputs: {}",
            extra.name(),
            names(inputs)
        )));
    }
    let mut ordered = Vec::with_capacity(inputs.len());
    let mut rows: Option<usize> = None;
    for info in inputs {
        let Some(at) = given.iter().position(|t| t.name() == info.name) else {
            return Err(bad(format!(
                "input `{}` is missing; its inputs: {}",
                info.name,
                names(inputs)
            )));
        };
        let t = given.swap_remove(at);
        if t.datatype() != DataType::Fp32 {
            return Err(bad(format!(
                "input `{}` is {}; the model takes FP32",
                info.name,
                t.datatype().name()
            )));
        }
        let want = &info.shape[1..];
        let shape = t.shape();
        let n = shape.first().copied().unwrap_or(0);
        if shape.len() != info.shape.len()
            || shape[1..].iter().zip(want).any(|(&a, &b)| a != b as u64)
            || n == 0
            || n > max_batch as u64
        {
            return Err(bad(format!(
                "input `{}` has shape {:?}; the model takes [n, {}] with 1 ≤ n ≤ {max_batch}",
                info.name,
                shape,
                want.iter()
                    .map(|d| d.to_string())
                    .collect::<Vec<_>>()
                    .join(", ")
            )));
        }
        let n = n as usize;
        if *rows.get_or_insert(n) != n {
            return Err(bad(format!(
                "input `{}` has {n} rows where another input has {}; every input needs the \
                 same batch",
                info.name,
                rows.unwrap_or(0)
            )));
        }
        ordered.push(t);
    }
    let outputs = match req.outputs {
        None => (0..outputs.len()).collect(),
        Some(asked) => asked
            .iter()
            .map(|name| {
                outputs.iter().position(|o| o.name == *name).ok_or_else(|| {
                    bad(format!(
                        "unknown output `{name}`; its outputs: {}",
                        names(outputs)
                    ))
                })
            })
            .collect::<Result<Vec<_>, _>>()?,
    };
    Ok(CheckedInputs {
        tensors: ordered,
        rows: rows.unwrap_or(1),
        outputs,
    })
}

fn names(ts: &[TensorInfo]) -> String {
    ts.iter()
        .map(|t| format!("`{}` {:?}", t.name, t.shape))
        .collect::<Vec<_>>()
        .join(", ")
}

/// Writes little-endian f32 bytes into `dst` (the model's buffer).
pub(crate) fn copy_le_f32(dst: &mut [f32], src: &[u8]) {
    let n = dst.len().min(src.len() / 4);
    if cfg!(target_endian = "little") {
        // One memcpy where the bytes are the floats' own (every x86 and Arm host): the loop
        // below is per element, and this copy is a request's whole input (602 KB).
        // SAFETY: `n * 4` bytes fit in both; any bytes are a valid f32 and u8 has no
        // alignment; `src` (a request's) and `dst` (the model's buffer) cannot overlap.
        unsafe {
            std::ptr::copy_nonoverlapping(src.as_ptr(), dst.as_mut_ptr().cast::<u8>(), n * 4)
        };
        return;
    }
    for (d, c) in dst.iter_mut().zip(src.chunks_exact(4)) {
        *d = f32::from_le_bytes([c[0], c[1], c[2], c[3]]);
    }
}

/// `src` as little-endian f32 bytes.
pub(crate) fn le_bytes(src: &[f32]) -> Vec<u8> {
    if cfg!(target_endian = "little") {
        // SAFETY: the floats' memory is `len * 4` initialised bytes, readable as u8.
        let bytes = unsafe { std::slice::from_raw_parts(src.as_ptr().cast::<u8>(), src.len() * 4) };
        return bytes.to_vec();
    }
    let mut out = Vec::with_capacity(src.len() * 4);
    for v in src {
        out.extend_from_slice(&v.to_le_bytes());
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The copy and its inverse give every float's bits back, a short source fills only what
    /// it holds, and a longer one only what the buffer takes.
    #[test]
    fn floats_copy_to_and_from_little_endian_bytes_bit_for_bit() {
        let values = [
            1.5f32,
            -0.0,
            f32::NAN,
            f32::MIN_POSITIVE / 2.0,
            f32::INFINITY,
            3e38,
        ];
        let bytes: Vec<u8> = values.iter().flat_map(|v| v.to_le_bytes()).collect();
        assert_eq!(le_bytes(&values), bytes);
        let mut out = [7.0f32; 6];
        copy_le_f32(&mut out, &bytes);
        assert!(out
            .iter()
            .zip(&values)
            .all(|(a, b)| a.to_bits() == b.to_bits()));
        let mut out = [7.0f32; 6];
        copy_le_f32(&mut out, &bytes[..9]);
        assert_eq!(out[0].to_bits(), values[0].to_bits());
        assert_eq!(out[1].to_bits(), values[1].to_bits());
        assert_eq!(out[2..], [7.0; 4]);
        let mut out = [0.0f32; 2];
        copy_le_f32(&mut out, &bytes);
        assert_eq!(out, [1.5, -0.0]);
    }

    fn info(name: &str, shape: &[usize]) -> TensorInfo {
        TensorInfo {
            name: name.into(),
            shape: shape.to_vec(),
        }
    }

    fn fp32(name: &str, shape: &[u64]) -> Tensor {
        let n: u64 = shape.iter().product();
        Tensor::new(
            name,
            DataType::Fp32,
            shape.to_vec(),
            vec![0; n as usize * 4],
        )
        .unwrap()
    }

    fn req(inputs: Vec<Tensor>) -> InferRequest {
        InferRequest {
            inputs,
            outputs: None,
            deadline: None,
        }
    }

    #[test]
    fn inputs_are_put_in_the_models_order_and_rows_counted() {
        let ins = [info("a", &[4, 3]), info("b", &[4, 2])];
        let outs = [info("y", &[4, 1])];
        let c = check_inputs(
            "m",
            &ins,
            &outs,
            4,
            req(vec![fp32("b", &[2, 2]), fp32("a", &[2, 3])]),
        )
        .unwrap();
        assert_eq!(c.rows, 2);
        assert_eq!(c.tensors[0].name(), "a");
        assert_eq!(c.outputs, vec![0]);
    }

    #[test]
    fn each_mismatch_is_refused_by_name() {
        let ins = [info("a", &[4, 3])];
        let outs = [info("y", &[4, 1])];
        let e = |r| {
            check_inputs("m", &ins, &outs, 4, r)
                .unwrap_err()
                .to_string()
        };
        assert!(e(req(vec![fp32("a", &[5, 3])])).contains("1 ≤ n ≤ 4"));
        assert!(e(req(vec![fp32("a", &[1, 2])])).contains("[n, 3]"));
        assert!(e(req(vec![])).contains("input `a` is missing"));
        assert!(e(req(vec![fp32("a", &[1, 3]), fp32("z", &[1])])).contains("unknown input `z`"));
        let half = Tensor::new("a", DataType::Fp16, vec![1, 3], vec![0; 6]).unwrap();
        assert!(e(req(vec![half])).contains("FP16; the model takes FP32"));
        let mut r = req(vec![fp32("a", &[1, 3])]);
        r.outputs = Some(vec!["nope".into()]);
        assert!(e(r).contains("unknown output `nope`"));
    }

    #[test]
    fn refusals_map_to_the_interfaces_codes() {
        let late = Refusal::WouldBeLate {
            model: "m".into(),
            predicted_ms: 3.0,
            deadline_ms: 1.0,
            lateness_ms: 2.0,
            ahead: 1,
            service_ms: 1.5,
        };
        assert_eq!(late.http_status(), 429);
        assert_eq!(late.grpc_code(), GrpcCode::ResourceExhausted);
        assert!(late.to_string().contains("2.000 ms after its deadline"));
        let full = Refusal::QueueFull {
            model: "m".into(),
            limit: 3,
        };
        assert_eq!((full.http_status(), full.reason()), (429, "queue_full"));
    }

    #[test]
    fn stages_are_the_gaps_between_stamps_in_order() {
        let front = FrontStamps {
            header: 100,
            body: 150,
            resumed: 1_000,
            encoded: 1_010,
        };
        let core = Stamps {
            arrived: 160,
            picked: 200,
            started: 230,
            done: 900,
            answered: 950,
        };
        assert_eq!(front.stages(&core), [50, 10, 40, 30, 670, 50, 50, 10]);
        // A stamp missing (0) or out of order counts as no time, never as negative time.
        let early = FrontStamps {
            resumed: 0,
            ..front
        };
        assert_eq!(early.stages(&core), [50, 10, 40, 30, 670, 50, 0, 1_010]);
        assert_eq!(Stage::ALL.map(Stage::name)[6], "wake");
    }

    #[test]
    fn le_round_trip() {
        let v = [1.5f32, -0.0, f32::MAX];
        let mut back = [0f32; 3];
        copy_le_f32(&mut back, &le_bytes(&v));
        assert_eq!(v.map(f32::to_bits), back.map(f32::to_bits));
    }
}
