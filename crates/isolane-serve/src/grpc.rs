//! The KServe v2 / Triton gRPC front end (`inference.GRPCInferenceService`; docs/serve.md,
//! docs/protocol.md): health, metadata, model configuration, statistics, the repository index
//! and inference, over tonic. Like the HTTP front end it only decodes (isolane_protocol::grpc),
//! submits to the [`Server`] and encodes; a refusal is the [`Refusal`]'s gRPC code with its
//! message (RESOURCE_EXHAUSTED with the predicted lateness for a deadline that cannot be met).
//! Methods isolane does not serve answer UNIMPLEMENTED saying what to do instead.
//!
//! `ModelStreamInfer` answers each request of a stream through the same `infer` as
//! `ModelInfer`, in the requests' order, a request's error as its answer's `error_message`
//! ([`crate::stream`]: the window of requests in flight, the stream's end).
//!
//! The system shared memory extension is the HTTP front end's, over the same registry
//! ([`Server::shared_memory`]): regions registered either way are used by requests of both.
//!
//! Every call is one access-log line (`tracing`, target `isolane::access`, `protocol = "grpc"`).

use std::future::Future;
use std::time::Instant;

use isolane_protocol::grpc::inference::grpc_inference_service_server::{
    GrpcInferenceService, GrpcInferenceServiceServer,
};
use isolane_protocol::grpc::inference::{self as pb, ModelStreamInferResponse};
use isolane_protocol::grpc::{decode_infer_request, encode_infer_response, repository_index};
use isolane_protocol::{Limits, ProtocolError, ResponseMeta};
use isolane_runtime::clock;
use tokio::net::TcpListener;
use tonic::service::interceptor::InterceptedService;
use tonic::transport::server::Connected;
use tonic::{Code, Request, Response, Status, Streaming};

use crate::request::FrontStamps;
use crate::stats::Protocol;
use crate::{wire, InferRequest, ModelStatistics, Refusal, Server, StatDuration};

/// The front end's service: the server's handle.
#[derive(Clone)]
pub struct GrpcFrontEnd {
    server: Server,
    /// Raised when the front end stops (after the drain): open streams read no further
    /// request, answer those in flight and end.
    stopping: tokio::sync::watch::Receiver<bool>,
}

impl GrpcFrontEnd {
    pub fn new(server: Server, stopping: tokio::sync::watch::Receiver<bool>) -> Self {
        GrpcFrontEnd { server, stopping }
    }

    /// The tonic service, its message size bounded as the HTTP front end bounds a body: the
    /// largest of the models' request limits ([`wire::limits`]); a larger message is refused
    /// from its length prefix, before it is read. Messages tritonclient compresses
    /// (`compression_algorithm="gzip"|"deflate"`) are decompressed by tonic to at most that
    /// size too (RESOURCE_EXHAUSTED past it), then checked as any message is.
    pub fn into_service(
        self,
    ) -> InterceptedService<GrpcInferenceServiceServer<GrpcFrontEnd>, Stamp> {
        let largest = self
            .server
            .models()
            .map(|m| wire::limits(&m).max_body_bytes)
            .max()
            .unwrap_or(Limits::default().max_body_bytes);
        let largest = usize::try_from(largest).unwrap_or(usize::MAX);
        InterceptedService::new(
            GrpcInferenceServiceServer::new(self)
                .max_decoding_message_size(largest)
                .accept_compressed(tonic::codec::CompressionEncoding::Gzip)
                .accept_compressed(tonic::codec::CompressionEncoding::Deflate),
            stamp_header,
        )
    }
}

/// When a call's header arrived (ns, `isolane_runtime::clock`), for its stage breakdown: the
/// interceptor runs on the header, before tonic reads and parses the body.
#[derive(Clone, Copy)]
struct HeaderArrived(i64);

type Stamp = fn(Request<()>) -> Result<Request<()>, Status>;

fn stamp_header(mut r: Request<()>) -> Result<Request<()>, Status> {
    r.extensions_mut().insert(HeaderArrived(clock::now_ns()));
    Ok(r)
}

/// Client connections served at once, as many as the HTTP front end's; one accepted beyond
/// that is closed at once (the client sees UNAVAILABLE and may retry), never left waiting.
pub const MAX_CONNECTIONS: usize = crate::http::LIMITS.max_connections;
/// Calls under way at once on one connection (HTTP/2 streams; tritonclient and perf_analyzer
/// multiplex their concurrent requests on one): each holds at most one decoded message.
pub const MAX_STREAMS: u32 = 256;

/// HTTP/2 flow control and framing for frames of hundreds of KB: a stream may send 4 MiB
/// before the server acknowledges any (a 602 KB mobilenet_v2 frame never waits for a
/// WINDOW_UPDATE), the connection 16 MiB (several such requests in flight), and DATA frames
/// may be 1 MiB instead of 16 KiB (one 602 KB request in one frame rather than 38). Against
/// hyper's defaults (1 MiB windows, 16 KiB frames) this took a 602 KB request's added p50
/// from about 1.9 ms to 0.6 ms on the CPU (`examples/serve_overhead.rs`). Memory stays bounded
/// as before: a stream holds at most one decoded message, and flow control releases data as
/// tonic reads it.
pub const STREAM_WINDOW: u32 = 4 << 20;
pub const CONNECTION_WINDOW: u32 = 16 << 20;
pub const MAX_FRAME: u32 = 1 << 20;

/// Serves `server` over gRPC on `listener` until `shutdown` completes; calls under way then
/// finish (their connections close once answered).
pub async fn serve_grpc(
    server: Server,
    listener: TcpListener,
    shutdown: impl Future<Output = ()>,
) -> std::io::Result<()> {
    serve_capped(server, listener, shutdown, MAX_CONNECTIONS, PREFACE_WITHIN).await
}

/// How long a new connection has to send HTTP/2's connection preface (the 24 bytes every
/// gRPC client sends as it connects) before it is closed. hyper's HTTP/2 server waits for it
/// without a bound, so a connection that says nothing held its place under the cap for good:
/// [`MAX_CONNECTIONS`] silent sockets shut every client out of gRPC until they closed.
pub const PREFACE_WITHIN: std::time::Duration = std::time::Duration::from_secs(10);

/// HTTP/2's client connection preface.
const PREFACE: &[u8; 24] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";

async fn serve_capped(
    server: Server,
    listener: TcpListener,
    shutdown: impl Future<Output = ()>,
    max_connections: usize,
    preface_within: std::time::Duration,
) -> std::io::Result<()> {
    let incoming = capped_incoming(listener, max_connections, preface_within);
    // Streams end by themselves when the front end stops: tonic's graceful shutdown waits
    // for every call under way, and a stream's client need never close it.
    let (stop_streams, stopping) = tokio::sync::watch::channel(false);
    let shutdown = async move {
        shutdown.await;
        let _ = stop_streams.send(true);
    };
    tonic::transport::Server::builder()
        // A whole call's bound, queueing included, as the HTTP front end's request deadline;
        // a client's own `grpc-timeout` applies when shorter.
        .timeout(crate::http::LIMITS.request_deadline)
        .max_concurrent_streams(MAX_STREAMS)
        .initial_stream_window_size(STREAM_WINDOW)
        .initial_connection_window_size(CONNECTION_WINDOW)
        .max_frame_size(MAX_FRAME)
        .http2_keepalive_interval(Some(std::time::Duration::from_secs(30)))
        .serve_with_incoming_shutdown(
            GrpcFrontEnd::new(server, stopping).into_service(),
            incoming,
            shutdown,
        )
        .await
        .map_err(std::io::Error::other)
}

/// An accepted connection, holding its place under the cap until it closes.
struct Capped {
    io: tokio::net::TcpStream,
    _permit: tokio::sync::OwnedSemaphorePermit,
}

impl Connected for Capped {
    type ConnectInfo = tonic::transport::server::TcpConnectInfo;

    fn connect_info(&self) -> Self::ConnectInfo {
        self.io.connect_info()
    }
}

impl tokio::io::AsyncRead for Capped {
    fn poll_read(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        buf: &mut tokio::io::ReadBuf<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        std::pin::Pin::new(&mut self.io).poll_read(cx, buf)
    }
}

impl tokio::io::AsyncWrite for Capped {
    fn poll_write(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        buf: &[u8],
    ) -> std::task::Poll<std::io::Result<usize>> {
        std::pin::Pin::new(&mut self.io).poll_write(cx, buf)
    }

    fn poll_flush(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        std::pin::Pin::new(&mut self.io).poll_flush(cx)
    }

    fn poll_shutdown(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        std::pin::Pin::new(&mut self.io).poll_shutdown(cx)
    }

    fn poll_write_vectored(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        bufs: &[std::io::IoSlice<'_>],
    ) -> std::task::Poll<std::io::Result<usize>> {
        std::pin::Pin::new(&mut self.io).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.io.is_write_vectored()
    }
}

/// Whether `io` sends HTTP/2's whole connection preface within `within` (read with `peek`:
/// the bytes stay for hyper). Anything else (silence, a closed socket, other bytes) is no.
async fn sends_preface(io: &tokio::net::TcpStream, within: std::time::Duration) -> bool {
    let mut head = [0u8; PREFACE.len()];
    let wait = async {
        loop {
            match io.peek(&mut head).await {
                Ok(0) | Err(_) => return false,
                Ok(n) if head[..n] != PREFACE[..n] => return false,
                Ok(n) if n == PREFACE.len() => return true,
                // Part of it: the socket stays readable, so wait a moment for the rest.
                Ok(_) => tokio::time::sleep(std::time::Duration::from_millis(5)).await,
            }
        }
    };
    tokio::time::timeout(within, wait).await.unwrap_or(false)
}

/// The connections tonic serves: accepted on a task of their own, at most `max` open at once,
/// each handed over once it has sent the HTTP/2 preface (closed if it has not within
/// `preface_within`). The task ends, closing the listener, once tonic stops taking connections
/// (at shutdown).
fn capped_incoming(
    listener: TcpListener,
    max: usize,
    preface_within: std::time::Duration,
) -> tonic::codegen::tokio_stream::wrappers::ReceiverStream<std::io::Result<Capped>> {
    let permits = std::sync::Arc::new(tokio::sync::Semaphore::new(max));
    let (tx, rx) = tokio::sync::mpsc::channel(1);
    tokio::spawn(async move {
        loop {
            let accepted = tokio::select! {
                a = listener.accept() => a,
                () = tx.closed() => return,
            };
            let io = match accepted {
                Ok((io, _)) => io,
                Err(e) => {
                    // Out of descriptors, or a connection reset before it was taken: the
                    // listener is still good; a pause keeps a persistent error from spinning.
                    tracing::warn!(target: "isolane::serve", "gRPC accept: {e}");
                    tokio::time::sleep(std::time::Duration::from_millis(50)).await;
                    continue;
                }
            };
            let Ok(permit) = std::sync::Arc::clone(&permits).try_acquire_owned() else {
                tracing::warn!(
                    target: "isolane::serve",
                    "gRPC: a connection past the cap of {max} was closed"
                );
                continue;
            };
            let _ = io.set_nodelay(true);
            let tx = tx.clone();
            tokio::spawn(async move {
                if !sends_preface(&io, preface_within).await {
                    tracing::warn!(
                        target: "isolane::serve",
                        "gRPC: a connection that sent no HTTP/2 preface within {} s was closed",
                        preface_within.as_secs_f64()
                    );
                    return;
                }
                let connection = Capped {
                    io,
                    _permit: permit,
                };
                let _ = tx.send(Ok(connection)).await;
            });
        }
    });
    tonic::codegen::tokio_stream::wrappers::ReceiverStream::new(rx)
}

/// A [`Refusal`] as the status a client gets.
fn refused(r: &Refusal) -> Status {
    Status::new(r.grpc_code().tonic(), r.to_string())
}

fn not_served<T>(method: &str, why: &str) -> Result<Response<T>, Status> {
    logged(
        method,
        "",
        Instant::now(),
        false,
        Err(Status::unimplemented(format!("{method}: {why}"))),
    )
}

const CUDA_SHARED_MEMORY: &str = "CUDA shared memory is not served: register system shared \
     memory (SystemSharedMemoryRegister) or send each input's data in the request \
     (ModelInferRequest.raw_input_contents)";

/// Writes a call's access-log line and passes its result on.
fn logged<T>(
    method: &str,
    model: &str,
    began: Instant,
    late: bool,
    result: Result<T, Status>,
) -> Result<Response<T>, Status> {
    let code = match &result {
        Ok(_) => Code::Ok,
        Err(s) => s.code(),
    };
    tracing::info!(
        target: "isolane::access",
        protocol = "grpc",
        method,
        model,
        status = code as i32,
        late,
        us = began.elapsed().as_micros() as u64,
    );
    result.map(Response::new)
}

impl GrpcFrontEnd {
    /// Model `name` at `version` (empty: none asked), or NOT_FOUND for a model not served or
    /// a version it does not have, as Triton answers.
    fn model(&self, name: &str, version: &str) -> Result<std::sync::Arc<crate::ModelInfo>, Status> {
        self.server.model_at(name, version).map_err(|r| refused(&r))
    }

    /// Decodes, submits and encodes one inference (a `ModelInfer` call's, or one request of a
    /// stream's, as `protocol` says); whether it completed late.
    async fn infer(
        &self,
        req: pb::ModelInferRequest,
        mut stamps: FrontStamps,
        protocol: Protocol,
    ) -> (Result<pb::ModelInferResponse, Status>, bool) {
        let name = req.model_name.clone();
        let info = match self.model(&name, &req.model_version) {
            Ok(i) => i,
            Err(s) => return (Err(s), false),
        };
        let decoded = match decode_infer_request(
            req,
            &wire::limits(&info),
            Some(self.server.shared_memory()),
        ) {
            Ok(d) => d.request,
            Err(e) => return (Err(Status::from(&e)), false),
        };
        let selection = decoded.outputs.clone();
        let mut meta = ResponseMeta {
            model_name: name.clone(),
            model_version: Some("1".into()),
            id: decoded.id,
            parameters: Default::default(),
        };
        let request = InferRequest {
            outputs: decoded
                .outputs
                .requested
                .map(|r| r.into_iter().map(|o| o.name).collect()),
            deadline: decoded
                .deadline_ms
                .map(|ms| std::time::Duration::from_secs_f64(ms / 1e3)),
            inputs: decoded.inputs,
        };
        let response = match self.server.answer(&name, request).await {
            Ok(r) => r,
            Err(refusal) => return (Err(refused(&refusal)), false),
        };
        stamps.resumed = clock::now_ns();
        // Outputs asked for in shared memory are written there; the response only names them.
        for t in &response.outputs {
            if let Some(r) = selection.shared(t.name()) {
                let what = format!("output `{}`", t.name());
                if let Err(e) = self.server.shared_memory().write(r, t.data(), &what) {
                    return (Err(Status::from(&e)), false);
                }
            }
        }
        let late = response.late;
        meta.parameters.set_late(late);
        let core = response.stamps;
        let encoded = encode_infer_response(&meta, response.outputs, &selection)
            .map_err(|e| Status::from(&e));
        if encoded.is_ok() {
            stamps.encoded = clock::now_ns();
            if let Some(m) = self.server.find(&name) {
                m.stats.stages(protocol, &stamps.stages(&core));
            }
        }
        (encoded, late)
    }
}

impl GrpcFrontEnd {
    /// One request of a stream, answered as `ModelInfer` answers it, within the same bound on
    /// a request's whole time (a unary call's is tonic's timeout, which a stream's requests
    /// are not under).
    async fn stream_answer(&self, req: pb::ModelInferRequest) -> ModelStreamInferResponse {
        let began = Instant::now();
        let now = clock::now_ns();
        let (name, version, id) = (
            req.model_name.clone(),
            req.model_version.clone(),
            req.id.clone(),
        );
        // A message of a stream has no header of its own: its `receive` stage is 0.
        let stamps = FrontStamps {
            header: now,
            body: now,
            ..Default::default()
        };
        let bound = crate::http::LIMITS.request_deadline;
        let (answer, late) = match tokio::time::timeout(
            bound,
            self.infer(req, stamps, Protocol::GrpcStream),
        )
        .await
        {
            Ok(done) => done,
            Err(_) => (
                Err(Status::deadline_exceeded(format!(
                    "no answer within {} s, the server's bound on a request's whole time",
                    bound.as_secs()
                ))),
                false,
            ),
        };
        let (error_message, mut response) =
            match logged("ModelStreamInfer", &name, began, late, answer) {
                Ok(r) => (String::new(), r.into_inner()),
                // As Triton: the error's words, and the request's id (its model, its version) so
                // that the client knows which request failed.
                Err(status) => (
                    status.message().to_string(),
                    pb::ModelInferResponse {
                        model_name: name,
                        model_version: version,
                        id,
                        ..Default::default()
                    },
                ),
            };
        // Triton marks every answer on a stream with whether it is its request's last (always,
        // for a model that is not decoupled); clients of decoupled models wait for it.
        response
            .parameters
            .insert(FINAL_RESPONSE.into(), bool_parameter(true));
        ModelStreamInferResponse {
            error_message,
            infer_response: Some(response),
        }
    }
}

/// The parameter Triton sets on each answer of a stream: whether it is its request's last.
pub const FINAL_RESPONSE: &str = "triton_final_response";

fn bool_parameter(value: bool) -> pb::InferParameter {
    pb::InferParameter {
        parameter_choice: Some(pb::infer_parameter::ParameterChoice::BoolParam(value)),
    }
}

#[tonic::async_trait]
impl GrpcInferenceService for GrpcFrontEnd {
    async fn server_live(
        &self,
        _: Request<pb::ServerLiveRequest>,
    ) -> Result<Response<pb::ServerLiveResponse>, Status> {
        let live = self.server.is_live();
        logged(
            "ServerLive",
            "",
            Instant::now(),
            false,
            Ok(pb::ServerLiveResponse { live }),
        )
    }

    async fn server_ready(
        &self,
        _: Request<pb::ServerReadyRequest>,
    ) -> Result<Response<pb::ServerReadyResponse>, Status> {
        let ready = self.server.is_ready();
        logged(
            "ServerReady",
            "",
            Instant::now(),
            false,
            Ok(pb::ServerReadyResponse { ready }),
        )
    }

    /// Not ready (rather than an error) for a model that is not served or a version it does
    /// not have, as the HTTP side's 4xx: clients read either as "not ready".
    async fn model_ready(
        &self,
        request: Request<pb::ModelReadyRequest>,
    ) -> Result<Response<pb::ModelReadyResponse>, Status> {
        let pb::ModelReadyRequest { name, version } = request.into_inner();
        let ready = self.server.is_model_version_ready(&name, &version);
        logged(
            "ModelReady",
            &name,
            Instant::now(),
            false,
            Ok(pb::ModelReadyResponse { ready }),
        )
    }

    async fn server_metadata(
        &self,
        _: Request<pb::ServerMetadataRequest>,
    ) -> Result<Response<pb::ServerMetadataResponse>, Status> {
        let answer = pb::ServerMetadataResponse::from(&wire::server_metadata());
        logged("ServerMetadata", "", Instant::now(), false, Ok(answer))
    }

    async fn model_metadata(
        &self,
        request: Request<pb::ModelMetadataRequest>,
    ) -> Result<Response<pb::ModelMetadataResponse>, Status> {
        let began = Instant::now();
        let pb::ModelMetadataRequest { name, version } = request.into_inner();
        let answer = self
            .model(&name, &version)
            .map(|info| pb::ModelMetadataResponse::from(&wire::metadata(&info)));
        logged("ModelMetadata", &name, began, false, answer)
    }

    async fn model_config(
        &self,
        request: Request<pb::ModelConfigRequest>,
    ) -> Result<Response<pb::ModelConfigResponse>, Status> {
        let began = Instant::now();
        let pb::ModelConfigRequest { name, version } = request.into_inner();
        let answer = self
            .model(&name, &version)
            .map(|info| pb::ModelConfigResponse {
                config: Some(pb::ModelConfig::from(&wire::config(&info))),
            });
        logged("ModelConfig", &name, began, false, answer)
    }

    async fn model_infer(
        &self,
        request: Request<pb::ModelInferRequest>,
    ) -> Result<Response<pb::ModelInferResponse>, Status> {
        let began = Instant::now();
        let body = clock::now_ns();
        let header = request
            .extensions()
            .get::<HeaderArrived>()
            .map_or(body, |h| h.0);
        let request = request.into_inner();
        let name = request.model_name.clone();
        let stamps = FrontStamps {
            header,
            body,
            ..Default::default()
        };
        let (answer, late) = self.infer(request, stamps, Protocol::Grpc).await;
        logged("ModelInfer", &name, began, late, answer)
    }

    type ModelStreamInferStream = crate::stream::Answers;

    /// Each request read from the stream is answered as a `ModelInfer` call is (one access-log
    /// line each, method `ModelStreamInfer`), at most [`crate::stream::IN_FLIGHT`] at once, in
    /// the requests' order; a refusal or a bad request is that answer's `error_message`, with
    /// the request's id, and the stream goes on.
    async fn model_stream_infer(
        &self,
        request: Request<Streaming<pb::ModelInferRequest>>,
    ) -> Result<Response<Self::ModelStreamInferStream>, Status> {
        let front = self.clone();
        let answers = crate::stream::pump(
            request.into_inner(),
            crate::stream::IN_FLIGHT,
            self.stopping.clone(),
            move |req| {
                let front = front.clone();
                async move { front.stream_answer(req).await }
            },
        );
        Ok(Response::new(answers))
    }

    /// Triton's statistics extension (perf_analyzer reads it around each measurement): the
    /// model named, or every model for an empty name.
    async fn model_statistics(
        &self,
        request: Request<pb::ModelStatisticsRequest>,
    ) -> Result<Response<pb::ModelStatisticsResponse>, Status> {
        let began = Instant::now();
        let pb::ModelStatisticsRequest { name, version } = request.into_inner();
        let asked = Some(name.as_str()).filter(|n| !n.is_empty());
        let answer = match asked.map(|n| self.model(n, &version)) {
            Some(Err(status)) => Err(status),
            _ => match self.server.statistics(asked) {
                Some(stats) => Ok(pb::ModelStatisticsResponse {
                    model_stats: stats.iter().map(statistics).collect(),
                }),
                None => Err(refused(&self.server.unknown(&name))),
            },
        };
        logged("ModelStatistics", &name, began, false, answer)
    }

    async fn repository_index(
        &self,
        request: Request<pb::RepositoryIndexRequest>,
    ) -> Result<Response<pb::RepositoryIndexResponse>, Status> {
        let began = Instant::now();
        if !request.get_ref().repository_name.is_empty() {
            let refused = Err(Status::unimplemented(
                crate::http::REPOSITORY_NAME_NOT_SUPPORTED,
            ));
            return logged("RepositoryIndex", "", began, false, refused);
        }
        let asked = isolane_protocol::RepositoryIndexRequest::from(request.get_ref());
        let entries = self.server.repository_index(asked.ready);
        logged(
            "RepositoryIndex",
            "",
            began,
            false,
            Ok(repository_index(&entries)),
        )
    }

    async fn repository_model_load(
        &self,
        request: Request<pb::RepositoryModelLoadRequest>,
    ) -> Result<Response<pb::RepositoryModelLoadResponse>, Status> {
        let began = Instant::now();
        let request = request.into_inner();
        let name = request.model_name;
        let answer = if !request.repository_name.is_empty() {
            Err(Status::unimplemented(
                crate::http::REPOSITORY_NAME_NOT_SUPPORTED,
            ))
        } else if request.parameters.is_empty() {
            let (server, owned) = (self.server.clone(), name.clone());
            changed(tokio::task::spawn_blocking(move || server.load_model(&owned)).await)
                .map(|_| pb::RepositoryModelLoadResponse {})
        } else {
            let given: Vec<&str> = request.parameters.keys().map(String::as_str).collect();
            Err(Status::invalid_argument(format!(
                "load parameters ({}) are not taken: a served model is its scenario workload, \
                 loaded with the settings it last had; change those with isolane ctl resize",
                given.join(", ")
            )))
        };
        logged("RepositoryModelLoad", &name, began, false, answer)
    }

    async fn repository_model_unload(
        &self,
        request: Request<pb::RepositoryModelUnloadRequest>,
    ) -> Result<Response<pb::RepositoryModelUnloadResponse>, Status> {
        let began = Instant::now();
        let request = request.into_inner();
        let name = request.model_name;
        let answer = if request.repository_name.is_empty() {
            let (server, owned) = (self.server.clone(), name.clone());
            changed(tokio::task::spawn_blocking(move || server.unload_model(&owned)).await)
                .map(|_| pb::RepositoryModelUnloadResponse {})
        } else {
            Err(Status::unimplemented(
                crate::http::REPOSITORY_NAME_NOT_SUPPORTED,
            ))
        };
        logged("RepositoryModelUnload", &name, began, false, answer)
    }

    /// The region named, or every region for an empty name.
    async fn system_shared_memory_status(
        &self,
        request: Request<pb::SystemSharedMemoryStatusRequest>,
    ) -> Result<Response<pb::SystemSharedMemoryStatusResponse>, Status> {
        let began = Instant::now();
        let name = request.into_inner().name;
        let asked = Some(name.as_str()).filter(|n| !n.is_empty());
        let answer = self
            .server
            .shared_memory()
            .status(asked)
            .map(|regions| pb::SystemSharedMemoryStatusResponse {
                regions: regions
                    .into_iter()
                    .map(|r| {
                        let status = pb::system_shared_memory_status_response::RegionStatus {
                            name: r.name.clone(),
                            key: r.key,
                            offset: r.offset,
                            byte_size: r.byte_size,
                        };
                        (r.name, status)
                    })
                    .collect(),
            })
            .map_err(|e| Status::from(&e));
        logged("SystemSharedMemoryStatus", "", began, false, answer)
    }

    async fn system_shared_memory_register(
        &self,
        request: Request<pb::SystemSharedMemoryRegisterRequest>,
    ) -> Result<Response<pb::SystemSharedMemoryRegisterResponse>, Status> {
        let began = Instant::now();
        let r = request.into_inner();
        let answer = self
            .server
            .shared_memory()
            .register(&r.name, &r.key, r.offset, r.byte_size);
        logged(
            "SystemSharedMemoryRegister",
            "",
            began,
            false,
            done(answer, pb::SystemSharedMemoryRegisterResponse {}),
        )
    }

    /// The region named, or every region for an empty name.
    async fn system_shared_memory_unregister(
        &self,
        request: Request<pb::SystemSharedMemoryUnregisterRequest>,
    ) -> Result<Response<pb::SystemSharedMemoryUnregisterResponse>, Status> {
        let began = Instant::now();
        let name = request.into_inner().name;
        let asked = Some(name.as_str()).filter(|n| !n.is_empty());
        let answer = self.server.shared_memory().unregister(asked);
        logged(
            "SystemSharedMemoryUnregister",
            "",
            began,
            false,
            done(answer, pb::SystemSharedMemoryUnregisterResponse {}),
        )
    }

    /// Every region's status is an empty answer (none can be registered); one region's is
    /// refused, saying what to do instead.
    async fn cuda_shared_memory_status(
        &self,
        request: Request<pb::CudaSharedMemoryStatusRequest>,
    ) -> Result<Response<pb::CudaSharedMemoryStatusResponse>, Status> {
        if request.get_ref().name.is_empty() {
            let none = pb::CudaSharedMemoryStatusResponse {};
            return logged(
                "CudaSharedMemoryStatus",
                "",
                Instant::now(),
                false,
                Ok(none),
            );
        }
        cuda_shared_memory("CudaSharedMemoryStatus")
    }

    async fn cuda_shared_memory_register(
        &self,
        _: Request<pb::CudaSharedMemoryRegisterRequest>,
    ) -> Result<Response<pb::CudaSharedMemoryRegisterResponse>, Status> {
        cuda_shared_memory("CudaSharedMemoryRegister")
    }

    /// Succeeds: no CUDA region can be registered, so none is after it. Triton's clients clear
    /// both kinds of region before using shared memory (perf_analyzer's
    /// `UnregisterAllSharedMemory` asks for system and CUDA ones), which is no error here.
    async fn cuda_shared_memory_unregister(
        &self,
        _: Request<pb::CudaSharedMemoryUnregisterRequest>,
    ) -> Result<Response<pb::CudaSharedMemoryUnregisterResponse>, Status> {
        let done = pb::CudaSharedMemoryUnregisterResponse {};
        logged(
            "CudaSharedMemoryUnregister",
            "",
            Instant::now(),
            false,
            Ok(done),
        )
    }

    /// tritonclient's `get_trace_settings` / `update_trace_settings`, perf_analyzer's
    /// `--trace-*`: refused, saying how isolane traces instead.
    async fn trace_setting(
        &self,
        _: Request<pb::TraceSettingRequest>,
    ) -> Result<Response<pb::TraceSettingResponse>, Status> {
        not_served("TraceSetting", crate::http::TRACE_NOT_SERVED)
    }

    /// tritonclient's `get_log_settings` / `update_log_settings`: refused, saying where
    /// isolane's log goes instead.
    async fn log_settings(
        &self,
        _: Request<pb::LogSettingsRequest>,
    ) -> Result<Response<pb::LogSettingsResponse>, Status> {
        not_served("LogSettings", crate::http::LOGGING_NOT_SERVED)
    }
}

fn duration(d: &StatDuration) -> pb::StatisticDuration {
    pb::StatisticDuration {
        count: d.count,
        ns: d.ns,
    }
}

/// One model's statistics in the gRPC message, its `batch_stats` as HTTP's.
fn statistics(s: &ModelStatistics) -> pb::ModelStatistics {
    let i = &s.inference_stats;
    pb::ModelStatistics {
        name: s.name.clone(),
        version: s.version.clone(),
        last_inference: s.last_inference,
        inference_count: s.inference_count,
        execution_count: s.execution_count,
        inference_stats: Some(pb::InferStatistics {
            success: Some(duration(&i.success)),
            fail: Some(duration(&i.fail)),
            queue: Some(duration(&i.queue)),
            compute_input: Some(duration(&i.compute_input)),
            compute_infer: Some(duration(&i.compute_infer)),
            compute_output: Some(duration(&i.compute_output)),
            cache_hit: Some(duration(&i.cache_hit)),
            cache_miss: Some(duration(&i.cache_miss)),
        }),
        batch_stats: s
            .batch_stats
            .iter()
            .map(|b| pb::InferBatchStatistics {
                batch_size: b.batch_size,
                compute_input: Some(duration(&b.compute_input)),
                compute_infer: Some(duration(&b.compute_infer)),
                compute_output: Some(duration(&b.compute_output)),
            })
            .collect(),
    }
}

fn cuda_shared_memory<T>(method: &str) -> Result<Response<T>, Status> {
    logged(
        method,
        "",
        Instant::now(),
        false,
        Err(Status::unimplemented(format!(
            "{method}: {CUDA_SHARED_MEMORY}"
        ))),
    )
}

/// A registry call's outcome as the method's answer.
fn done<T>(r: Result<(), ProtocolError>, answer: T) -> Result<T, Status> {
    r.map(|()| answer).map_err(|e| Status::from(&e))
}

/// A load's or unload's outcome as a gRPC status (a refusal's code and words).
fn changed(
    done: Result<Result<crate::Change, crate::ControlError>, tokio::task::JoinError>,
) -> Result<crate::Change, Status> {
    match done {
        Ok(Ok(change)) => Ok(change),
        Ok(Err(e)) => {
            let code = match e.status {
                404 => Code::NotFound,
                409 => Code::FailedPrecondition,
                503 => Code::Unavailable,
                500 => Code::Internal,
                _ => Code::InvalidArgument,
            };
            Err(Status::new(code, e.message))
        }
        Err(e) => Err(Status::internal(format!("the change's thread failed: {e}"))),
    }
}

#[cfg(test)]
mod tests {
    //! A real tonic client against the front end on 127.0.0.1, over `spin:` models (they echo
    //! one value per row after their service time).

    use super::*;
    use crate::Server;
    use isolane_protocol::grpc::inference::grpc_inference_service_client::GrpcInferenceServiceClient;
    use isolane_protocol::grpc::inference::InferParameter;
    use isolane_protocol::grpc::{decode_infer_response, encode_infer_request};
    use isolane_protocol::{DataType, Parameters, SharedRef, Tensor};
    use isolane_runtime::exec::{SPIN_INPUT, SPIN_OUTPUT};
    use std::collections::BTreeMap;
    use std::path::Path;
    use std::time::Duration;
    use tonic::transport::Channel;

    /// The serving session's test server: one `spin:2ms` model `echo` of batch 4.
    fn server() -> Server {
        crate::tests::server(crate::tests::ONE)
    }

    fn rows(values: &[f32]) -> Tensor {
        let data = values.iter().flat_map(|v| v.to_le_bytes()).collect();
        Tensor::new(
            SPIN_INPUT,
            DataType::Fp32,
            vec![values.len() as u64, 1],
            data,
        )
        .unwrap()
    }

    fn floats(t: &Tensor) -> Vec<f32> {
        t.data()
            .chunks_exact(4)
            .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
            .collect()
    }

    /// Serves `server` on a free loopback port, runs `client` against it, then stops the
    /// front end and checks that it ends.
    fn with_client<F, Fut>(server: &Server, client: F)
    where
        F: FnOnce(GrpcInferenceServiceClient<Channel>) -> Fut,
        Fut: Future<Output = ()>,
    {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        rt.block_on(async {
            let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
            let addr = listener.local_addr().unwrap();
            let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
            let serving = tokio::spawn(serve_grpc(server.clone(), listener, async {
                let _ = stopped.await;
            }));
            let channel = tonic::transport::Endpoint::from_shared(format!("http://{addr}"))
                .unwrap()
                .connect()
                .await
                .unwrap();
            client(GrpcInferenceServiceClient::new(channel)).await;
            let _ = stop.send(());
            let ended = tokio::time::timeout(Duration::from_secs(30), serving).await;
            assert!(
                matches!(ended, Ok(Ok(Ok(())))),
                "the front end ends after its shutdown signal: {ended:?}"
            );
        });
    }

    #[test]
    fn a_tonic_client_gets_health_metadata_and_its_rows_back() {
        let s = server();
        with_client(&s, |mut c| async move {
            let live = c.server_live(pb::ServerLiveRequest {}).await.unwrap();
            assert!(live.get_ref().live);
            let ready = c.server_ready(pb::ServerReadyRequest {}).await.unwrap();
            assert!(ready.get_ref().ready);
            let ready = |name: &str| pb::ModelReadyRequest {
                name: name.into(),
                version: String::new(),
            };
            assert!(c.model_ready(ready("echo")).await.unwrap().get_ref().ready);
            assert!(!c.model_ready(ready("nope")).await.unwrap().get_ref().ready);

            let meta = c
                .server_metadata(pb::ServerMetadataRequest {})
                .await
                .unwrap();
            assert_eq!(meta.get_ref().name, "isolane");
            let m = c
                .model_metadata(pb::ModelMetadataRequest {
                    name: "echo".into(),
                    version: String::new(),
                })
                .await
                .unwrap()
                .into_inner();
            assert_eq!(m.inputs[0].name, SPIN_INPUT);
            assert_eq!(m.inputs[0].datatype, "FP32");
            assert_eq!(m.inputs[0].shape, vec![-1, 1]);
            let config = c
                .model_config(pb::ModelConfigRequest {
                    name: "echo".into(),
                    version: String::new(),
                })
                .await
                .unwrap()
                .into_inner()
                .config
                .unwrap();
            assert_eq!(config.max_batch_size, 4);
            assert_eq!(config.input[0].data_type(), pb::DataType::TypeFp32);
            assert_eq!(config.input[0].dims, vec![1]);
            let index = c
                .repository_index(pb::RepositoryIndexRequest {
                    repository_name: String::new(),
                    ready: true,
                })
                .await
                .unwrap()
                .into_inner();
            assert_eq!(index.models.len(), 1);
            assert_eq!(
                (
                    index.models[0].name.as_str(),
                    index.models[0].state.as_str()
                ),
                ("echo", "READY")
            );

            // Raw contents, as tritonclient sends them.
            let req = encode_infer_request(
                "echo",
                None,
                Some("q1"),
                &Parameters::new(),
                &[rows(&[1.5, -2.0, 3.25])],
                None,
            )
            .unwrap();
            let resp = c.model_infer(req).await.unwrap().into_inner();
            assert_eq!(resp.raw_output_contents.len(), 1);
            let back = decode_infer_response(resp, &Limits::default()).unwrap();
            assert_eq!(back.meta.id.as_deref(), Some("q1"));
            assert_eq!(back.meta.model_name, "echo");
            assert!(!back.late);
            assert_eq!(back.outputs[0].name(), SPIN_OUTPUT);
            assert_eq!(back.outputs[0].shape(), &[3, 1]);
            assert_eq!(floats(&back.outputs[0]), vec![1.5, -2.0, 3.25]);

            // Typed contents, and an output asked for by name.
            let mut req = encode_infer_request(
                "echo",
                None,
                None,
                &Parameters::new(),
                &[rows(&[7.0])],
                Some(&[isolane_protocol::OutputChoice {
                    name: SPIN_OUTPUT.into(),
                    binary: None,
                }]),
            )
            .unwrap();
            req.raw_input_contents.clear();
            req.inputs[0].contents = isolane_protocol::grpc::typed_contents(&rows(&[7.0]));
            let resp = c.model_infer(req).await.unwrap().into_inner();
            let back = decode_infer_response(resp, &Limits::default()).unwrap();
            assert_eq!(floats(&back.outputs[0]), vec![7.0]);

            // Statistics count what was answered: two requests, four rows.
            let stats = c
                .model_statistics(pb::ModelStatisticsRequest {
                    name: "echo".into(),
                    version: String::new(),
                })
                .await
                .unwrap()
                .into_inner();
            let echo = &stats.model_stats[0];
            assert_eq!((echo.name.as_str(), echo.version.as_str()), ("echo", "1"));
            assert_eq!(echo.inference_count, 4);
            let success = echo.inference_stats.unwrap().success.unwrap();
            assert_eq!(success.count, 2);
            assert!(success.ns > 0);
            // Per batch size, as HTTP's: a job of 1 row and one of 3, each with its 2 ms spin.
            let sizes: Vec<_> = echo
                .batch_stats
                .iter()
                .map(|b| (b.batch_size, b.compute_infer.unwrap().count))
                .collect();
            assert_eq!(sizes, [(1, 1), (3, 1)]);
            assert!(echo
                .batch_stats
                .iter()
                .all(|b| b.compute_infer.unwrap().ns >= 2_000_000));
            let all = c
                .model_statistics(pb::ModelStatisticsRequest::default())
                .await
                .unwrap();
            assert_eq!(all.get_ref().model_stats.len(), 1);
            let e = c
                .model_statistics(pb::ModelStatisticsRequest {
                    name: "nope".into(),
                    version: String::new(),
                })
                .await
                .unwrap_err();
            assert_eq!(e.code(), Code::NotFound);
        });
        // isolane's stage breakdown (the HTTP statistics' `isolane_stages`): both answers in
        // every stage, in order, the model's 2 ms spin in `infer`.
        let own = &s.statistics(Some("echo")).unwrap()[0].isolane_stages;
        let names: Vec<_> = own.iter().map(|t| (t.protocol, t.stage)).collect();
        let want: Vec<_> = crate::request::Stage::ALL
            .iter()
            .map(|st| ("grpc", st.name()))
            .collect();
        assert_eq!(names, want);
        assert!(own.iter().all(|t| t.count == 2), "{own:?}");
        let infer = own.iter().find(|t| t.stage == "infer").unwrap();
        assert!(infer.ns >= 4_000_000, "{own:?}");
        // HTTP's JSON has the same entries, in Triton's names.
        let json = serde_json::to_value(&s.statistics(Some("echo")).unwrap()[0]).unwrap();
        let batches = json["batch_stats"].as_array().unwrap();
        assert_eq!(batches.len(), 2, "{json}");
        assert_eq!(batches[1]["batch_size"], 3, "{json}");
        assert_eq!(batches[1]["compute_infer"]["count"], 1, "{json}");
        assert_eq!(s.drain(Duration::from_secs(5)).abandoned, 0);
    }

    /// HAN's findings over gRPC: tritonclient's `compression_algorithm` got UNIMPLEMENTED, a
    /// batch past the model's a RESOURCE_EXHAUSTED about bytes (the code clients retry on).
    #[test]
    fn compressed_messages_are_read_and_a_batch_too_large_is_an_invalid_argument() {
        use tonic::codec::CompressionEncoding;
        let s = server();
        with_client(&s, |c| async move {
            let infer = |values: &[f32]| {
                encode_infer_request(
                    "echo",
                    None,
                    None,
                    &Parameters::new(),
                    &[rows(values)],
                    None,
                )
                .unwrap()
            };
            for encoding in [CompressionEncoding::Gzip, CompressionEncoding::Deflate] {
                let mut c = c.clone().send_compressed(encoding);
                let resp = c.model_infer(infer(&[1.5, 2.5])).await;
                let resp = resp.unwrap_or_else(|e| panic!("{encoding:?}: {e}"));
                let back = decode_infer_response(resp.into_inner(), &Limits::default()).unwrap();
                assert_eq!(floats(&back.outputs[0]), vec![1.5, 2.5]);
                // 10 MB of zeros compress to about 10 KB: decompressed no further than the
                // message limit (echo's 65792 bytes).
                let mut bomb = infer(&[0.0]);
                bomb.raw_input_contents[0] = vec![0u8; 10 << 20].into();
                let e = c.model_infer(bomb).await.unwrap_err();
                assert_eq!(e.code(), Code::ResourceExhausted, "{e}");
            }
            let mut c = c;
            let e = c.model_infer(infer(&[1.0; 5])).await.unwrap_err();
            assert_eq!(e.code(), Code::InvalidArgument, "{e}");
            assert!(e.message().contains("1 ≤ n ≤ 4"), "{e}");
        });
        s.drain(Duration::from_secs(5));
    }

    #[test]
    fn refusals_carry_their_codes_and_reasons() {
        let s = server();
        with_client(&s, |mut c| async move {
            let infer = |model: &str, values: &[f32], deadline_ms: Option<u64>| {
                let mut params = Parameters::new();
                if let Some(ms) = deadline_ms {
                    params.set_deadline_ms(ms);
                }
                encode_infer_request(model, None, None, &params, &[rows(values)], None).unwrap()
            };
            // The spin takes 2 ms: a 1 ms deadline is refused up front, saying by how much.
            let e = c
                .model_infer(infer("echo", &[1.0], Some(1)))
                .await
                .unwrap_err();
            assert_eq!(e.code(), Code::ResourceExhausted, "{e:?}");
            assert!(
                e.message().contains("ms after its deadline"),
                "{}",
                e.message()
            );
            // Unknown model, bad shape, bad message.
            let e = c
                .model_infer(infer("nope", &[1.0], None))
                .await
                .unwrap_err();
            assert_eq!(e.code(), Code::NotFound);
            assert!(e.message().contains("`echo`"), "{}", e.message());
            // More rows than the model's batch: refused for its batch from the header, not for
            // its bytes (RESOURCE_EXHAUSTED is the deadline refusal's code, which clients retry).
            let e = c
                .model_infer(infer("echo", &[1.0; 5], None))
                .await
                .unwrap_err();
            assert_eq!(e.code(), Code::InvalidArgument);
            assert!(e.message().contains("1 ≤ n ≤ 4"), "{}", e.message());
            // A shape the model does not take.
            let mut wide = infer("echo", &[1.0, 2.0], None);
            wide.inputs[0].shape = vec![1, 2];
            let e = c.model_infer(wide).await.unwrap_err();
            assert_eq!(e.code(), Code::InvalidArgument);
            assert!(e.message().contains("1 ≤ n ≤ 4"), "{}", e.message());
            let mut bad = infer("echo", &[1.0], None);
            let short = bad.raw_input_contents[0].len() - 1;
            bad.raw_input_contents[0].truncate(short);
            let e = c.model_infer(bad).await.unwrap_err();
            assert_eq!(e.code(), Code::InvalidArgument);
            assert!(
                e.message().contains("`raw_input_contents`: 3 bytes"),
                "{}",
                e.message()
            );
            let e = c
                .model_metadata(pb::ModelMetadataRequest {
                    name: "nope".into(),
                    version: String::new(),
                })
                .await
                .unwrap_err();
            assert_eq!(e.code(), Code::NotFound);
            // A message past the model's limit is refused from its length, unread.
            let mut huge = infer("echo", &[1.0], None);
            huge.raw_input_contents[0] = vec![0; 1 << 20].into();
            let e = c.model_infer(huge).await.unwrap_err();
            assert_ne!(e.code(), Code::Ok);
            assert!(e.message().contains("too large"), "{}", e.message());
            // Not served: named, with what to do instead.
            let e = c
                .cuda_shared_memory_register(pb::CudaSharedMemoryRegisterRequest {
                    name: "r".into(),
                })
                .await
                .unwrap_err();
            assert_eq!(e.code(), Code::Unimplemented);
            assert!(
                e.message().contains("register system shared memory"),
                "{}",
                e.message()
            );
            // What a Triton client clearing every region asks (perf_analyzer's shared memory
            // mode does, for both kinds): no error, as none can be registered.
            c.cuda_shared_memory_unregister(pb::CudaSharedMemoryUnregisterRequest {
                name: String::new(),
            })
            .await
            .unwrap();
            c.cuda_shared_memory_status(pb::CudaSharedMemoryStatusRequest {
                name: String::new(),
            })
            .await
            .unwrap();
            let e = c
                .cuda_shared_memory_status(pb::CudaSharedMemoryStatusRequest { name: "r".into() })
                .await
                .unwrap_err();
            assert_eq!(e.code(), Code::Unimplemented);
            // A stream the client closes at once ends at once, answerless.
            let mut none = c
                .model_stream_infer(tonic::codegen::tokio_stream::empty())
                .await
                .unwrap()
                .into_inner();
            assert!(none.message().await.unwrap().is_none());
            // The server still answers after all that.
            let resp = c.model_infer(infer("echo", &[4.0], None)).await.unwrap();
            let back = decode_infer_response(resp.into_inner(), &Limits::default()).unwrap();
            assert_eq!(floats(&back.outputs[0]), vec![4.0]);
        });
        s.drain(Duration::from_secs(5));
    }

    /// Found by trying tritonclient: every version was served (ModelReady of version 2 was
    /// true, its metadata and inference answered as version 1's), and TraceSetting and
    /// LogSettings were UNIMPLEMENTED without a word. A version the model does not have is
    /// NOT_FOUND (and not ready), as Triton answers; the settings say what to use instead.
    #[test]
    fn an_unknown_version_is_not_found_and_trace_and_log_settings_say_why_not() {
        let s = server();
        with_client(&s, |mut c| async move {
            let ready = |version: &str| pb::ModelReadyRequest {
                name: "echo".into(),
                version: version.into(),
            };
            for (version, want) in [("", true), ("1", true), ("2", false), ("x", false)] {
                let got = c.model_ready(ready(version)).await.unwrap().into_inner();
                assert_eq!(got.ready, want, "version {version:?}");
            }
            let not_found = |e: Status, version: &str| {
                assert_eq!(e.code(), Code::NotFound, "{e:?}");
                assert!(
                    e.message()
                        .contains(&format!("'echo' version {version} is not found")),
                    "{}",
                    e.message()
                );
            };
            let e = c
                .model_metadata(pb::ModelMetadataRequest {
                    name: "echo".into(),
                    version: "2".into(),
                })
                .await
                .unwrap_err();
            not_found(e, "2");
            let e = c
                .model_config(pb::ModelConfigRequest {
                    name: "echo".into(),
                    version: "7".into(),
                })
                .await
                .unwrap_err();
            not_found(e, "7");
            let e = c
                .model_statistics(pb::ModelStatisticsRequest {
                    name: "echo".into(),
                    version: "3".into(),
                })
                .await
                .unwrap_err();
            not_found(e, "3");
            let params = Parameters::new();
            let two = encode_infer_request("echo", Some("2"), None, &params, &[rows(&[1.0])], None)
                .unwrap();
            not_found(c.model_infer(two).await.unwrap_err(), "2");
            let one = encode_infer_request("echo", Some("1"), None, &params, &[rows(&[3.0])], None)
                .unwrap();
            let back = c.model_infer(one).await.unwrap().into_inner();
            let back = decode_infer_response(back, &Limits::default()).unwrap();
            assert_eq!(floats(&back.outputs[0]), vec![3.0]);
            let e = c
                .trace_setting(pb::TraceSettingRequest {})
                .await
                .unwrap_err();
            assert_eq!(e.code(), Code::Unimplemented);
            assert!(e.message().contains("--trace"), "{}", e.message());
            let e = c.log_settings(pb::LogSettingsRequest {}).await.unwrap_err();
            assert_eq!(e.code(), Code::Unimplemented);
            assert!(e.message().contains("ISOLANE_LOG"), "{}", e.message());
        });
        s.drain(Duration::from_secs(5));
    }

    /// A POSIX shared memory object (a file in /dev/shm) of `bytes`, removed when dropped.
    struct Object(String);

    impl Object {
        fn new(tag: &str, bytes: &[u8]) -> Object {
            let name = format!("isolane-grpc-test-{tag}-{}", std::process::id());
            std::fs::write(Path::new("/dev/shm").join(&name), bytes).unwrap();
            Object(name)
        }

        fn key(&self) -> String {
            format!("/{}", self.0)
        }

        fn bytes(&self) -> Vec<u8> {
            std::fs::read(Path::new("/dev/shm").join(&self.0)).unwrap()
        }
    }

    impl Drop for Object {
        fn drop(&mut self) {
            let _ = std::fs::remove_file(Path::new("/dev/shm").join(&self.0));
        }
    }

    /// Parameters naming `byte_size` bytes at `offset` of `region`, as tritonclient sets them.
    fn in_region(region: &str, offset: u64, byte_size: u64) -> BTreeMap<String, InferParameter> {
        isolane_protocol::grpc::parameters_to_grpc(&in_region_parameters(region, offset, byte_size))
    }

    /// A request for the echo model reading `rows` rows from `input`, writing its output into
    /// `output`.
    fn shared_infer(
        input: BTreeMap<String, InferParameter>,
        rows: i64,
        output: BTreeMap<String, InferParameter>,
    ) -> pb::ModelInferRequest {
        pb::ModelInferRequest {
            model_name: "echo".into(),
            inputs: vec![pb::model_infer_request::InferInputTensor {
                name: SPIN_INPUT.into(),
                datatype: "FP32".into(),
                shape: vec![rows, 1],
                parameters: input,
                contents: None,
            }],
            outputs: vec![pb::model_infer_request::InferRequestedOutputTensor {
                name: SPIN_OUTPUT.into(),
                parameters: output,
            }],
            ..Default::default()
        }
    }

    #[test]
    fn system_shared_memory_feeds_inputs_and_takes_outputs() {
        let values = [1.5f32, -2.0, 3.25];
        let mut bytes: Vec<u8> = values.iter().flat_map(|v| v.to_le_bytes()).collect();
        bytes.resize(32, 0);
        let object = Object::new("io", &bytes);
        let s = server();
        let key = object.key();
        with_client(&s, |mut c| async move {
            let register = |name: &str, key: &str, offset: u64, byte_size: u64| {
                pb::SystemSharedMemoryRegisterRequest {
                    name: name.into(),
                    key: key.into(),
                    offset,
                    byte_size,
                }
            };
            c.system_shared_memory_register(register("in", &key, 0, 16))
                .await
                .unwrap();
            c.system_shared_memory_register(register("out", &key, 16, 16))
                .await
                .unwrap();
            let status = |name: &str| pb::SystemSharedMemoryStatusRequest { name: name.into() };
            let all = c
                .system_shared_memory_status(status(""))
                .await
                .unwrap()
                .into_inner();
            assert_eq!(all.regions.len(), 2);
            let out = &all.regions["out"];
            assert_eq!(
                (
                    out.name.as_str(),
                    out.key.as_str(),
                    out.offset,
                    out.byte_size
                ),
                ("out", key.as_str(), 16, 16)
            );
            let one = c.system_shared_memory_status(status("in")).await.unwrap();
            assert_eq!(one.get_ref().regions.len(), 1);
            assert_eq!(one.get_ref().regions["in"].byte_size, 16);
            // Refusals carry the registry's reasons.
            let e = c
                .system_shared_memory_register(register("in", &key, 0, 16))
                .await
                .unwrap_err();
            assert_eq!(e.code(), Code::AlreadyExists);
            assert!(
                e.message().contains("registered already"),
                "{}",
                e.message()
            );
            let e = c
                .system_shared_memory_register(register("x", &key, 24, 16))
                .await
                .unwrap_err();
            assert!(e.message().contains("holds 32 bytes"), "{}", e.message());
            let e = c
                .system_shared_memory_register(register("x", "/../etc/passwd", 0, 4))
                .await
                .unwrap_err();
            assert!(
                e.message().contains("not a shared memory"),
                "{}",
                e.message()
            );
            let e = c
                .system_shared_memory_status(status("x"))
                .await
                .unwrap_err();
            assert!(e.message().contains("no region `x`"), "{}", e.message());

            // Three rows read from `in`, echoed into `out` at offset 4: the response names the
            // region, with an empty raw entry in the output's place.
            let resp = c
                .model_infer(shared_infer(
                    in_region("in", 0, 12),
                    3,
                    in_region("out", 4, 12),
                ))
                .await
                .unwrap()
                .into_inner();
            assert_eq!(resp.raw_output_contents, vec![tonic::codegen::Bytes::new()]);
            let o = &resp.outputs[0];
            assert_eq!(
                (o.name.as_str(), o.shape.as_slice()),
                (SPIN_OUTPUT, &[3, 1][..])
            );
            let named = isolane_protocol::grpc::parameters_from_grpc(o.parameters.clone(), "o");
            assert_eq!(named.unwrap(), in_region_parameters("out", 4, 12));
            let written = object.bytes();
            let echoed: Vec<f32> = written[20..32]
                .chunks_exact(4)
                .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
                .collect();
            assert_eq!(echoed, values);

            // An output range too small for the output, a range past its region.
            let e = c
                .model_infer(shared_infer(
                    in_region("in", 0, 12),
                    3,
                    in_region("out", 0, 8),
                ))
                .await
                .unwrap_err();
            assert_eq!(e.code(), Code::InvalidArgument);
            assert!(e.message().contains("holds 8"), "{}", e.message());
            let e = c
                .model_infer(shared_infer(in_region("in", 8, 12), 3, BTreeMap::new()))
                .await
                .unwrap_err();
            assert!(
                e.message().contains("reach past region `in`"),
                "{}",
                e.message()
            );

            // Unregistered: named in the refusal; then every region at once.
            let unregister =
                |name: &str| pb::SystemSharedMemoryUnregisterRequest { name: name.into() };
            c.system_shared_memory_unregister(unregister("in"))
                .await
                .unwrap();
            let e = c
                .model_infer(shared_infer(in_region("in", 0, 4), 1, BTreeMap::new()))
                .await
                .unwrap_err();
            assert!(e.message().contains("no region `in`"), "{}", e.message());
            assert_eq!(e.code(), Code::NotFound, "as Triton's: {e:?}");
            // As Triton: unregistering a region not registered is no error; its status is
            // NOT_FOUND.
            c.system_shared_memory_unregister(unregister("in"))
                .await
                .unwrap();
            let e = c
                .system_shared_memory_status(status("in"))
                .await
                .unwrap_err();
            assert_eq!(e.code(), Code::NotFound, "{e:?}");
            c.system_shared_memory_unregister(unregister(""))
                .await
                .unwrap();
            let all = c.system_shared_memory_status(status("")).await.unwrap();
            assert!(all.get_ref().regions.is_empty());
        });
        s.drain(Duration::from_secs(5));
    }

    fn in_region_parameters(region: &str, offset: u64, byte_size: u64) -> Parameters {
        SharedRef {
            region: region.into(),
            offset,
            byte_size,
        }
        .parameters()
    }

    #[test]
    fn a_connection_past_the_cap_is_closed_and_its_place_comes_back() {
        let s = server();
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        rt.block_on(async {
            let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
            let url = format!("http://{}", listener.local_addr().unwrap());
            let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
            let serving = tokio::spawn(serve_capped(
                s.clone(),
                listener,
                async {
                    let _ = stopped.await;
                },
                1,
                PREFACE_WITHIN,
            ));
            // A connection and one call on it: live.
            let call = |url: String| async move {
                let channel = tonic::transport::Endpoint::from_shared(url)
                    .unwrap()
                    .connect()
                    .await
                    .map_err(|e| Status::unavailable(e.to_string()))?;
                let mut c = GrpcInferenceServiceClient::new(channel);
                c.server_live(pb::ServerLiveRequest {}).await?;
                Ok::<_, Status>(c)
            };
            let first = call(url.clone()).await.unwrap();
            // The second is past the cap of one: closed, not served.
            assert!(call(url.clone()).await.is_err());
            // Once the first closes, its place is free again (the server notices the close
            // asynchronously: retried for up to 30 s).
            drop(first);
            let began = Instant::now();
            while call(url.clone()).await.is_err() {
                assert!(
                    began.elapsed() < Duration::from_secs(30),
                    "the closed connection's place never came back"
                );
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            let _ = stop.send(());
            let ended = tokio::time::timeout(Duration::from_secs(30), serving).await;
            assert!(matches!(ended, Ok(Ok(Ok(())))), "{ended:?}");
        });
        s.drain(Duration::from_secs(5));
    }

    /// Found by holding silent sockets open: a connection that never sent HTTP/2's preface
    /// kept its place under the cap for good (80 s and counting), so the cap's worth of them
    /// shut every gRPC client out. It is closed after the preface's time, and a real client
    /// gets in; a client that sends garbage is closed too.
    #[test]
    fn a_connection_that_sends_no_preface_is_closed_and_frees_its_place() {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let s = server();
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        rt.block_on(async {
            let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
            let addr = listener.local_addr().unwrap();
            let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
            let serving = tokio::spawn(serve_capped(
                s.clone(),
                listener,
                async {
                    let _ = stopped.await;
                },
                1,
                Duration::from_millis(300),
            ));
            // The only place, taken by a socket that says nothing.
            let mut silent = tokio::net::TcpStream::connect(addr).await.unwrap();
            let mut rest = Vec::new();
            let closed =
                tokio::time::timeout(Duration::from_secs(30), silent.read_to_end(&mut rest)).await;
            assert!(
                matches!(closed, Ok(Ok(_))),
                "the silent connection was not closed: {closed:?}"
            );
            let mut garbage = tokio::net::TcpStream::connect(addr).await.unwrap();
            garbage.write_all(b"GET / HTTP/1.1\r\n\r\n").await.unwrap();
            let closed =
                tokio::time::timeout(Duration::from_secs(30), garbage.read_to_end(&mut rest)).await;
            // Closed with unread bytes in it: a reset, or the end.
            assert!(closed.is_ok(), "the garbage connection was not closed");
            // Its place came back: a client is served.
            let began = Instant::now();
            loop {
                let channel = tonic::transport::Endpoint::from_shared(format!("http://{addr}"))
                    .unwrap()
                    .connect()
                    .await;
                if let Ok(channel) = channel {
                    let mut c = GrpcInferenceServiceClient::new(channel);
                    if c.server_live(pb::ServerLiveRequest {}).await.is_ok() {
                        break;
                    }
                }
                assert!(
                    began.elapsed() < Duration::from_secs(30),
                    "no place came back"
                );
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            let _ = stop.send(());
            let ended = tokio::time::timeout(Duration::from_secs(30), serving).await;
            assert!(matches!(ended, Ok(Ok(Ok(())))), "{ended:?}");
        });
        s.drain(Duration::from_secs(5));
    }

    #[test]
    fn a_draining_server_is_not_ready_and_refuses_as_unavailable() {
        let s = server();
        s.drain(Duration::from_secs(5));
        with_client(&s, |mut c| async move {
            let ready = c.server_ready(pb::ServerReadyRequest {}).await.unwrap();
            assert!(!ready.get_ref().ready);
            let req = encode_infer_request(
                "echo",
                None,
                None,
                &Parameters::new(),
                &[rows(&[1.0])],
                None,
            )
            .unwrap();
            let e = c.model_infer(req).await.unwrap_err();
            assert_eq!(e.code(), Code::Unavailable);
            assert!(e.message().contains("shutting down"), "{}", e.message());
        });
    }

    #[test]
    fn repository_unload_and_load_over_grpc() {
        let s = server();
        with_client(&s, |mut c| async move {
            let infer_request = |values: &[f32]| {
                encode_infer_request(
                    "echo",
                    None,
                    None,
                    &Parameters::new(),
                    &[rows(values)],
                    None,
                )
                .unwrap()
            };
            let ready = |name: &str| pb::ModelReadyRequest {
                name: name.into(),
                version: String::new(),
            };
            c.repository_model_unload(pb::RepositoryModelUnloadRequest {
                model_name: "echo".into(),
                ..Default::default()
            })
            .await
            .unwrap();
            assert!(!c.model_ready(ready("echo")).await.unwrap().get_ref().ready);
            let e = c.model_infer(infer_request(&[1.0])).await.unwrap_err();
            assert_eq!(e.code(), Code::NotFound);
            assert!(
                e.message().contains("has no available versions"),
                "{}",
                e.message()
            );
            // A load carrying a configuration is refused rather than ignored.
            let mut with_config = pb::RepositoryModelLoadRequest {
                model_name: "echo".into(),
                ..Default::default()
            };
            with_config.parameters.insert(
                "config".into(),
                pb::ModelRepositoryParameter {
                    parameter_choice: Some(
                        pb::model_repository_parameter::ParameterChoice::StringParam("{}".into()),
                    ),
                },
            );
            let e = c.repository_model_load(with_config).await.unwrap_err();
            assert_eq!(e.code(), Code::InvalidArgument);
            assert!(e.message().contains("config"), "{}", e.message());
            c.repository_model_load(pb::RepositoryModelLoadRequest {
                model_name: "echo".into(),
                ..Default::default()
            })
            .await
            .unwrap();
            assert!(c.model_ready(ready("echo")).await.unwrap().get_ref().ready);
            let answer = c.model_infer(infer_request(&[2.0])).await.unwrap();
            assert_eq!(answer.get_ref().model_name, "echo");
            let e = c
                .repository_model_load(pb::RepositoryModelLoadRequest {
                    model_name: "nope".into(),
                    ..Default::default()
                })
                .await
                .unwrap_err();
            assert_eq!(e.code(), Code::NotFound);
            // A named repository is Triton's UNIMPLEMENTED, and changes nothing.
            let repo = || "mine".to_string();
            let e = c
                .repository_model_unload(pb::RepositoryModelUnloadRequest {
                    repository_name: repo(),
                    model_name: "echo".into(),
                    ..Default::default()
                })
                .await
                .unwrap_err();
            assert_eq!(e.code(), Code::Unimplemented);
            assert!(e.message().contains("'repository_name'"), "{}", e.message());
            assert!(c.model_ready(ready("echo")).await.unwrap().get_ref().ready);
            let e = c
                .repository_model_load(pb::RepositoryModelLoadRequest {
                    repository_name: repo(),
                    model_name: "echo".into(),
                    ..Default::default()
                })
                .await
                .unwrap_err();
            assert_eq!(e.code(), Code::Unimplemented);
            let e = c
                .repository_index(pb::RepositoryIndexRequest {
                    repository_name: repo(),
                    ready: false,
                })
                .await
                .unwrap_err();
            assert_eq!(e.code(), Code::Unimplemented);
        });
        s.drain(Duration::from_secs(5));
    }

    /// Front ends polling for their answers (`Server::set_answer_spin`), on one thread with
    /// the client: requests sent at once (the first polled for, those queued behind it more
    /// than 2 ms ahead parked) each get their own rows back.
    #[test]
    fn answers_polled_for_on_one_thread_still_serve_requests_at_once() {
        let s = server();
        s.set_answer_spin(Duration::from_millis(50));
        with_client(&s, |c| async move {
            let ask = |v: f32| {
                let mut c = c.clone();
                async move {
                    let req = encode_infer_request(
                        "echo",
                        None,
                        None,
                        &Parameters::new(),
                        &[rows(&[v, -v])],
                        None,
                    )
                    .unwrap();
                    let resp = c.model_infer(req).await.unwrap().into_inner();
                    let back = decode_infer_response(resp, &Limits::default()).unwrap();
                    floats(&back.outputs[0])
                }
            };
            let (a, b, d) = tokio::join!(ask(1.0), ask(2.0), ask(3.0));
            assert_eq!(
                (a, b, d),
                (vec![1.0, -1.0], vec![2.0, -2.0], vec![3.0, -3.0])
            );
        });
        s.drain(Duration::from_secs(5));
    }

    /// Two served models for the streams: `echo` (2 ms a job, batch 4) and `slow` (50 ms,
    /// batch 1).
    const TWO: &str = r#"
[[workload]]
name = "echo"
model = "spin:2ms"
batch = 4
rate_hz = 10
duration_s = 1
deadline_ms = 5000

[[workload]]
name = "slow"
model = "spin:50ms"
batch = 1
rate_hz = 10
duration_s = 1
deadline_ms = 5000
"#;

    fn request(
        model: &str,
        id: &str,
        values: &[f32],
        deadline_ms: Option<u64>,
    ) -> pb::ModelInferRequest {
        let mut params = Parameters::new();
        if let Some(ms) = deadline_ms {
            params.set_deadline_ms(ms);
        }
        encode_infer_request(model, None, Some(id), &params, &[rows(values)], None).unwrap()
    }

    /// A stream open on `c`: the sender of its requests and its answers.
    async fn open_stream(
        c: &mut GrpcInferenceServiceClient<Channel>,
    ) -> (
        tokio::sync::mpsc::Sender<pb::ModelInferRequest>,
        Streaming<ModelStreamInferResponse>,
    ) {
        let (tx, rx) = tokio::sync::mpsc::channel(64);
        let answers = c
            .model_stream_infer(tonic::codegen::tokio_stream::wrappers::ReceiverStream::new(
                rx,
            ))
            .await
            .unwrap()
            .into_inner();
        (tx, answers)
    }

    /// Requests for two models on one stream, some refused or invalid: every one answered, in
    /// the order sent, with its id; each answer equal to ModelInfer's for the same request;
    /// each error an `error_message`, the stream going on.
    #[test]
    fn a_stream_answers_each_request_as_model_infer_does_in_order_errors_included() {
        let s = crate::tests::server(TWO);
        with_client(&s, |mut c| async move {
            let sent = [
                request("echo", "a", &[1.0, 2.0], None),
                request("slow", "b", &[3.0], None),
                request("echo", "c", &[4.0], None),
                request("slow", "d", &[5.0], Some(1)),
                request("nope", "e", &[6.0], None),
                request("echo", "f", &[1.0; 5], None),
                request("echo", "g", &[7.0], Some(60_000)),
            ];
            let (tx, mut answers) = open_stream(&mut c).await;
            for r in &sent {
                tx.send(r.clone()).await.unwrap();
            }
            let mut got = Vec::new();
            for _ in &sent {
                got.push(
                    answers
                        .message()
                        .await
                        .unwrap()
                        .expect("an answer per request"),
                );
            }
            let ids: Vec<_> = got
                .iter()
                .map(|a| a.infer_response.as_ref().unwrap().id.as_str())
                .collect();
            assert_eq!(ids, ["a", "b", "c", "d", "e", "f", "g"]);
            for (i, says) in [
                (3, "after its deadline"),
                (4, "unknown model `nope`"),
                (5, "1 ≤ n ≤ 4"),
            ] {
                assert!(got[i].error_message.contains(says), "{:?}", got[i]);
            }
            // Every answer is its request's last, as Triton marks it.
            for a in &mut got {
                let r = a.infer_response.as_mut().unwrap();
                assert_eq!(
                    r.parameters.remove(FINAL_RESPONSE),
                    Some(bool_parameter(true)),
                    "{r:?}"
                );
            }
            // The others, as ModelInfer answers the same requests (a second time).
            for i in [0, 1, 2, 6] {
                assert_eq!(got[i].error_message, "", "{:?}", got[i]);
                let unary = c.model_infer(sent[i].clone()).await.unwrap().into_inner();
                assert_eq!(got[i].infer_response.as_ref(), Some(&unary), "request {i}");
            }
            let back =
                decode_infer_response(got[1].infer_response.clone().unwrap(), &Limits::default())
                    .unwrap();
            assert_eq!(floats(&back.outputs[0]), vec![3.0]);
            assert!(!back.late);
            // The client closes its side: the stream ends once all is answered.
            drop(tx);
            assert!(answers.message().await.unwrap().is_none());
        });
        // Counted as requests of the stream (`grpc-stream`), each of its successes once.
        let stages = |m: &str| s.statistics(Some(m)).unwrap()[0].isolane_stages.clone();
        let infer = |m: &str, p: &str| {
            stages(m)
                .iter()
                .find(|t| t.protocol == p && t.stage == "infer")
                .map_or(0, |t| t.count)
        };
        assert_eq!(
            (infer("echo", "grpc-stream"), infer("echo", "grpc")),
            (3, 3)
        );
        assert_eq!(
            (infer("slow", "grpc-stream"), infer("slow", "grpc")),
            (1, 1)
        );
        let metrics = s.metrics().encode();
        assert!(
            metrics.contains(r#"isolane_serve_rejections_total{model="slow",reason="deadline"} 1"#),
            "{metrics}"
        );
        assert_eq!(s.drain(Duration::from_secs(5)).abandoned, 0);
    }

    /// A client gone with requests in flight on its stream: they still run and are recorded
    /// (`--out`), and the server goes on serving.
    #[test]
    fn a_stream_clients_requests_run_and_are_recorded_after_it_is_gone() {
        let dir = tempfile::tempdir().unwrap();
        let jobs = isolane_runtime::jobs_stream::JobsStream::start(
            Some(dir.path()),
            &["echo".to_string(), "slow".to_string()],
            None,
        )
        .unwrap();
        let records = Some((
            vec![jobs.sender(0), jobs.sender(1)],
            isolane_runtime::clock::now_ns(),
        ));
        let s = crate::tests::server_recording(TWO, |_| {}, records);
        with_client(&s, |mut c| {
            let s = s.clone();
            async move {
                let (tx, answers) = open_stream(&mut c).await;
                for i in 0..4 {
                    tx.send(request("slow", &i.to_string(), &[i as f32], None))
                        .await
                        .unwrap();
                }
                let began = Instant::now();
                while s.in_flight() < 4 {
                    assert!(began.elapsed() < Duration::from_secs(30), "never taken");
                    tokio::time::sleep(Duration::from_millis(5)).await;
                }
                // Gone: its stream reset, its side closed.
                drop(answers);
                drop(tx);
                while s.in_flight() > 0 {
                    assert!(began.elapsed() < Duration::from_secs(30), "never answered");
                    tokio::time::sleep(Duration::from_millis(5)).await;
                }
                let r = c.model_infer(request("echo", "x", &[9.0], None)).await;
                let back = decode_infer_response(r.unwrap().into_inner(), &Limits::default());
                assert_eq!(floats(&back.unwrap().outputs[0]), vec![9.0]);
            }
        });
        let stats = &s.statistics(Some("slow")).unwrap()[0];
        assert_eq!(stats.inference_stats.success.count, 4);
        assert_eq!(s.drain(Duration::from_secs(5)).abandoned, 0);
        drop(s);
        jobs.finish().unwrap();
        let written =
            isolane_runtime::output::read_jobs_csv(&dir.path().join("jobs/slow.csv")).unwrap();
        assert_eq!(written.len(), 4, "{written:?}");
        assert!(written.iter().all(|j| j.completed()), "{written:?}");
    }

    /// SIGTERM's drain with a stream open: its request in flight is answered, one sent after
    /// is told the server is shutting down, then the front end's stop ends the stream (OK),
    /// though the client never closed its side.
    #[test]
    fn the_drain_answers_a_streams_request_then_refuses_then_ends_it() {
        let s = crate::tests::server(TWO);
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .unwrap();
        rt.block_on(async {
            let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
            let url = format!("http://{}", listener.local_addr().unwrap());
            let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
            let serving = tokio::spawn(serve_grpc(s.clone(), listener, async {
                let _ = stopped.await;
            }));
            let channel = tonic::transport::Endpoint::from_shared(url)
                .unwrap()
                .connect()
                .await
                .unwrap();
            let mut c = GrpcInferenceServiceClient::new(channel);
            let (tx, mut answers) = open_stream(&mut c).await;
            tx.send(request("slow", "in-flight", &[1.5], None))
                .await
                .unwrap();
            let began = Instant::now();
            while s.in_flight() < 1 {
                assert!(began.elapsed() < Duration::from_secs(30), "never taken");
                tokio::time::sleep(Duration::from_millis(2)).await;
            }
            let draining = s.clone();
            let drained =
                tokio::task::spawn_blocking(move || draining.drain(Duration::from_secs(30)));
            while s.is_ready() {
                tokio::time::sleep(Duration::from_millis(1)).await;
            }
            tx.send(request("echo", "after", &[2.5], None))
                .await
                .unwrap();
            let first = answers.message().await.unwrap().unwrap();
            assert_eq!(first.error_message, "", "{first:?}");
            let back =
                decode_infer_response(first.infer_response.unwrap(), &Limits::default()).unwrap();
            assert_eq!(
                (back.meta.id.as_deref(), floats(&back.outputs[0])),
                (Some("in-flight"), vec![1.5])
            );
            let second = answers.message().await.unwrap().unwrap();
            assert!(second.error_message.contains("shutting down"), "{second:?}");
            assert_eq!(second.infer_response.unwrap().id, "after");
            let d = drained.await.unwrap();
            assert_eq!((d.answered, d.abandoned), (1, 0));
            let _ = stop.send(());
            let end = tokio::time::timeout(Duration::from_secs(30), answers.message()).await;
            assert!(
                matches!(end, Ok(Ok(None))),
                "the stream did not end: {end:?}"
            );
            drop(tx);
            let ended = tokio::time::timeout(Duration::from_secs(30), serving).await;
            assert!(matches!(ended, Ok(Ok(Ok(())))), "{ended:?}");
        });
    }
}
