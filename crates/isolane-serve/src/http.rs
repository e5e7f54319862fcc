//! The KServe v2 / Triton HTTP/REST front end (docs/serve.md, docs/protocol.md): health,
//! metadata, model configuration, the repository index, inference (JSON tensors and the
//! binary tensor data extension) and `GET /metrics`, on the bounded HTTP/1.1 server of
//! `isolane_metrics::http` (connection cap, whole-request deadline, keep-alive).
//!
//! Every request is one access-log line (`tracing`, target `isolane::access`).

use std::future::Future;
use std::time::Instant;

use http_body_util::{BodyExt, Full, Limited};
use hyper::body::Body as _;
use hyper::body::{Bytes, Incoming};
use hyper::header::{HeaderMap, HeaderValue, CONTENT_ENCODING, CONTENT_TYPE};
use hyper::{Method, Request, Response, StatusCode};
use isolane_metrics::http::{text_response, Limits};
use isolane_protocol::{
    decode_request_bytes, encode_response, health_status, parse_header_length, ProtocolError,
    RepositoryIndexEntry, RepositoryIndexRequest, ResponseMeta, HEADER_LENGTH,
};
use isolane_runtime::clock;
use tokio::net::TcpListener;

use crate::request::FrontStamps;
use crate::stats::Protocol;
use crate::{wire, InferRequest, Refusal, Server};

/// The server's HTTP limits: many long-lived client connections (perf_analyzer and
/// tritonclient keep theirs open), a minute for a whole request (queueing included).
///
/// The read buffer is 1 MiB (the metrics endpoint's is 16 KiB): hyper reads a body through it,
/// so that a 602 KB frame comes in a few reads instead of 38 of 16 KiB, each a round trip
/// between the connection and the handler (about 0.2 ms per request on the CPU,
/// `examples/serve_overhead.rs`). hyper bounds the request line and header by the same buffer:
/// a body of a model's request limit already holds more per connection.
pub const LIMITS: Limits = Limits {
    max_connections: 1024,
    request_deadline: std::time::Duration::from_secs(60),
    // As a gRPC connection's preface (grpc.rs): a client has no reason to connect and wait.
    first_byte_timeout: std::time::Duration::from_secs(10),
    keep_alive: true,
    idle_timeout: std::time::Duration::from_secs(120),
    shutdown_grace: std::time::Duration::from_secs(5),
    max_header_bytes: 1 << 20,
    max_headers: 100,
};

const JSON: &str = "application/json";

/// Triton's trace extension (`/v2/trace/setting`, a model's `.../trace/setting`, gRPC
/// `TraceSetting`) is not served; the refusal says what traces requests instead.
pub const TRACE_NOT_SERVED: &str = "Triton's trace extension (trace settings) is not served; \
     isolane traces every request into a Perfetto trace with `isolane serve --out DIR --trace` \
     (`isolane trace DIR` shows it), and times each request's stages in the statistics \
     extension's `isolane_stages`";
/// Triton's logging extension (`/v2/logging`, gRPC `LogSettings`) is not served either.
pub const LOGGING_NOT_SERVED: &str = "Triton's logging extension (log settings) is not served; \
     isolane writes one access-log line per request on stderr, filtered by the environment \
     variable ISOLANE_LOG (as RUST_LOG) and turned off with `isolane serve --no-access-log`";
/// A repository named in a repository request (`/v2/repository/REPO/...`, gRPC's
/// `repository_name`): Triton's words and code (UNSUPPORTED: HTTP 501, gRPC UNIMPLEMENTED). A
/// served model is its scenario's workload; there is one repository, unnamed.
pub const REPOSITORY_NAME_NOT_SUPPORTED: &str = "'repository_name' specification is not supported";
const OPENMETRICS: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";

/// Serves `server` on `listener` until `shutdown` completes.
pub async fn serve_http(server: Server, listener: TcpListener, shutdown: impl Future<Output = ()>) {
    let handler = move |request: Request<Incoming>| {
        let server = server.clone();
        async move { answer(&server, request).await }
    };
    isolane_metrics::http::run(listener, LIMITS, handler, shutdown).await;
}

async fn answer(server: &Server, request: Request<Incoming>) -> Response<Full<Bytes>> {
    let began = Instant::now();
    let method = request.method().clone();
    let path = request.uri().path().to_string();
    let (response, model, late) = route(server, request).await;
    let status = response.status().as_u16();
    tracing::info!(
        target: "isolane::access",
        protocol = "http",
        method = %method,
        path = %path,
        model = model.as_deref().unwrap_or(""),
        status,
        late,
        us = began.elapsed().as_micros() as u64,
    );
    response
}

type Routed = (Response<Full<Bytes>>, Option<String>, bool);

async fn route(server: &Server, request: Request<Incoming>) -> Routed {
    let method = request.method().clone();
    let path = request.uri().path().trim_end_matches('/').to_string();
    let parts: Vec<&str> = path.split('/').skip(1).collect();
    let plain = |r| (r, None, false);
    if let Some(takes) = endpoint_method(&parts) {
        if method != takes {
            return plain(method_not_allowed(&method, &path, takes));
        }
    }
    match (&method, parts.as_slice()) {
        (&Method::GET, ["metrics"]) => plain(text_response(
            StatusCode::OK,
            OPENMETRICS,
            server.metrics().encode(),
        )),
        (&Method::GET, ["v2", "health", "live"]) => plain(health(server.is_live())),
        (&Method::GET, ["v2", "health", "ready"]) => plain(health(server.is_ready())),
        (&Method::GET, ["v2"]) => plain(json(StatusCode::OK, &wire::server_metadata())),
        (&Method::POST, ["v2", "repository", "index"]) => {
            plain(repository_index(server, request).await)
        }
        (&Method::POST, ["v2", "repository", "models", name, action @ ("load" | "unload")]) => {
            let (r, model) =
                crate::control_http::repository(server, &percent_decode(name), action, request)
                    .await;
            (r, model, false)
        }
        (&Method::POST, ["v2", "repository", _, "index"])
        | (&Method::POST, ["v2", "repository", _, "models", _, "load" | "unload"]) => plain(error(
            StatusCode::NOT_IMPLEMENTED,
            REPOSITORY_NAME_NOT_SUPPORTED,
        )),
        (_, ["isolane", "v1", rest @ ..]) => {
            let (r, model) = crate::control_http::admin(server, &method, rest, request).await;
            (r, model, false)
        }
        (&Method::GET, ["v2", "models", "stats"]) => plain(statistics(server, None)),
        (_, ["v2", "systemsharedmemory", rest @ ..]) => {
            plain(shared_memory(server, &method, rest, request).await)
        }
        // No CUDA region can be registered: unregistering leaves none, as asked, and every
        // region's status is an empty list (Triton's clients clear both kinds of region before
        // using shared memory; perf_analyzer's shared memory mode does).
        (&Method::POST, ["v2", "cudasharedmemory", "unregister"])
        | (&Method::POST, ["v2", "cudasharedmemory", "region", _, "unregister"]) => {
            plain(text_response(StatusCode::OK, JSON, Bytes::new()))
        }
        (&Method::GET, ["v2", "cudasharedmemory", "status"]) => plain(text_response(
            StatusCode::OK,
            JSON,
            Bytes::from_static(b"[]"),
        )),
        (_, ["v2", "cudasharedmemory", ..]) => plain(error(
            StatusCode::BAD_REQUEST,
            "CUDA shared memory is not served; register system shared memory \
             (/v2/systemsharedmemory) or send the data in the body",
        )),
        (_, ["v2", "models", name, rest @ ..]) => {
            let name = percent_decode(name);
            let (version, rest) = match rest {
                ["versions", v, tail @ ..] => (percent_decode(v), tail),
                tail => (String::new(), tail),
            };
            model_route(server, &method, &name, &version, rest, request).await
        }
        (&Method::GET | &Method::POST, ["v2", "trace", "setting"]) => {
            plain(error(StatusCode::BAD_REQUEST, TRACE_NOT_SERVED))
        }
        (&Method::GET | &Method::POST, ["v2", "logging"]) => {
            plain(error(StatusCode::BAD_REQUEST, LOGGING_NOT_SERVED))
        }
        (&Method::GET | &Method::POST, _) => plain(error(
            StatusCode::NOT_FOUND,
            format!("no such endpoint: {method} {path}"),
        )),
        _ => plain(error(
            StatusCode::METHOD_NOT_ALLOWED,
            format!("{method} is not served; GET and POST are"),
        )),
    }
}

/// The one method an endpoint takes; None for a path that is no endpoint, or one that takes
/// both (the trace and logging settings, refused either way).
fn endpoint_method(parts: &[&str]) -> Option<Method> {
    let get = Some(Method::GET);
    let post = Some(Method::POST);
    match parts {
        ["metrics"] | ["v2"] | ["v2", "health", "live" | "ready"] | ["v2", "models", "stats"] => {
            get
        }
        ["v2", "repository", "index"]
        | ["v2", "repository", "models", _, "load" | "unload"]
        | ["v2", "repository", _, "index"]
        | ["v2", "repository", _, "models", _, "load" | "unload"]
        | ["isolane", "v1", "models", _, "resize"] => post,
        ["isolane", "v1", "status"] => get,
        ["v2", "models", _, rest @ ..] => {
            let rest = match rest {
                ["versions", _, tail @ ..] => tail,
                tail => tail,
            };
            match rest {
                [] | ["ready" | "config" | "stats"] => get,
                ["infer"] => post,
                _ => None,
            }
        }
        ["v2", "systemsharedmemory" | "cudasharedmemory", rest @ ..] => match rest {
            ["status"] | ["region", _, "status"] => get,
            ["unregister"] | ["region", _, "unregister" | "register"] => post,
            _ => None,
        },
        _ => None,
    }
}

/// Triton answers each endpoint asked with another method (HEAD included) 405 "Method Not
/// Allowed" (http_server.cc's handlers); isolane answered 404 "no such endpoint", or for HEAD a
/// 405 naming GET and POST whatever the path took.
fn method_not_allowed(method: &Method, path: &str, takes: Method) -> Response<Full<Bytes>> {
    // Every endpoint takes GET or POST (endpoint_method).
    let allow = if takes == Method::POST { "POST" } else { "GET" };
    let mut r = error(
        StatusCode::METHOD_NOT_ALLOWED,
        format!("Method Not Allowed: {path} takes {takes}, not {method}"),
    );
    r.headers_mut()
        .insert(hyper::header::ALLOW, HeaderValue::from_static(allow));
    r
}

/// A model's routes, at `version` (empty: none in the URL); a version the model does not have
/// is refused as Triton refuses it (404, "Request for unknown model: ... version 2 is not
/// found"), and is not ready.
async fn model_route(
    server: &Server,
    method: &Method,
    name: &str,
    version: &str,
    rest: &[&str],
    request: Request<Incoming>,
) -> Routed {
    let with = |r| (r, Some(name.to_string()), false);
    if let (&Method::GET, ["ready"]) = (method, rest) {
        if server.model(name).is_some() {
            return with(health(server.is_model_version_ready(name, version)));
        }
    }
    let info = match server.model_at(name, version) {
        Ok(info) => info,
        Err(refusal) => return with(refused(&refusal)),
    };
    match (method, rest) {
        (&Method::GET, []) => with(json(StatusCode::OK, &wire::metadata(&info))),
        (&Method::GET, ["config"]) => with(json(StatusCode::OK, &wire::config(&info))),
        (&Method::GET, ["stats"]) => with(statistics(server, Some(name))),
        (&Method::POST, ["infer"]) => infer(server, name, request).await,
        (&Method::GET | &Method::POST, ["trace", "setting"]) => {
            with(error(StatusCode::BAD_REQUEST, TRACE_NOT_SERVED))
        }
        _ => with(error(
            StatusCode::NOT_FOUND,
            format!(
                "no such endpoint for model `{name}`: {method} /{}",
                rest.join("/")
            ),
        )),
    }
}

async fn infer(server: &Server, name: &str, request: Request<Incoming>) -> Routed {
    // hyper calls the handler once the header is in, before the body is read.
    let mut stamps = FrontStamps {
        header: clock::now_ns(),
        ..Default::default()
    };
    let fail = |r| (r, Some(name.to_string()), false);
    let header_len = match request.headers().get(HEADER_LENGTH) {
        None => None,
        Some(v) => match parse_header_length(v.as_bytes()) {
            Ok(n) => Some(n),
            Err(e) => return fail(protocol_error(&e)),
        },
    };
    let Some(info) = server.model(name) else {
        return fail(refused(&server.unknown(name)));
    };
    let limits = wire::limits(&info);
    let encoding = match content_encoding(request.headers()) {
        Ok(e) => e,
        Err(m) => return fail(error(StatusCode::UNSUPPORTED_MEDIA_TYPE, m)),
    };
    let body = match read_body(request, limits.max_body_bytes).await {
        Ok(b) => b,
        Err(e) => return fail(protocol_error(&e)),
    };
    let body = match decompress(body, encoding, limits.max_body_bytes) {
        Ok(b) => b,
        Err(e) => return fail(protocol_error(&e)),
    };
    stamps.body = clock::now_ns();
    // Binary inputs stay slices of the body (no copy); it is freed with the last of them.
    let decoded =
        match decode_request_bytes(&body, header_len, &limits, Some(server.shared_memory())) {
            Ok(d) => d,
            Err(e) => return fail(protocol_error(&e)),
        };
    drop(body);
    let selection = decoded.outputs.clone();
    let meta = ResponseMeta {
        model_name: name.to_string(),
        model_version: Some("1".into()),
        id: decoded.id.clone(),
        parameters: Default::default(),
    };
    let request = InferRequest {
        outputs: selection
            .requested
            .as_ref()
            .map(|r| r.iter().map(|o| o.name.clone()).collect()),
        deadline: decoded
            .deadline_ms
            .map(|ms| std::time::Duration::from_secs_f64(ms / 1e3)),
        inputs: decoded.inputs,
    };
    let response = match server.answer(name, request).await {
        Ok(r) => r,
        Err(refusal) => return fail(refused(&refusal)),
    };
    stamps.resumed = clock::now_ns();
    // Outputs asked for in shared memory are written there; the response only names them.
    for t in &response.outputs {
        if let Some(r) = selection.shared(t.name()) {
            let what = format!("output `{}`", t.name());
            if let Err(e) = server.shared_memory().write(r, t.data(), &what) {
                return fail(protocol_error(&e));
            }
        }
    }
    let late = response.late;
    let mut meta = meta;
    if late {
        meta.parameters.set_late(true);
    }
    match encode_response(&meta, &response.outputs, &selection) {
        Ok(encoded) => {
            stamps.encoded = clock::now_ns();
            if let Some(m) = server.find(name) {
                m.stats
                    .stages(Protocol::Http, &stamps.stages(&response.stamps));
            }
            let content_type = encoded.content_type();
            let mut r = Response::new(Full::new(Bytes::from(encoded.body)));
            r.headers_mut()
                .insert(CONTENT_TYPE, HeaderValue::from_static(content_type));
            if let Some(n) = encoded.header_len {
                r.headers_mut().insert(HEADER_LENGTH, HeaderValue::from(n));
            }
            (r, Some(name.to_string()), late)
        }
        Err(e) => fail(protocol_error(&e)),
    }
}

/// How an inference request's body is encoded: tritonclient compresses it when asked
/// (`request_compression_algorithm`: gzip, or zlib's format for deflate, as HTTP's `deflate`
/// is), and Triton decodes both.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Encoding {
    Identity,
    Gzip,
    Deflate,
}

/// The request's `Content-Encoding`; any other is refused (a 415) naming the ones read.
fn content_encoding(headers: &HeaderMap) -> Result<Encoding, String> {
    let Some(value) = headers.get(CONTENT_ENCODING) else {
        return Ok(Encoding::Identity);
    };
    let text = String::from_utf8_lossy(value.as_bytes());
    match text.trim().to_ascii_lowercase().as_str() {
        "" | "identity" => Ok(Encoding::Identity),
        "gzip" | "x-gzip" => Ok(Encoding::Gzip),
        "deflate" => Ok(Encoding::Deflate),
        _ => Err(format!(
            "Content-Encoding `{}` is not read; an inference request's body is sent as it \
                 is (identity), gzip or deflate",
            text.chars().take(40).collect::<String>()
        )),
    }
}

/// The body as the client wrote it: decompressed to at most `limit` bytes, the same bound
/// as a plain body, so that a small body inflating to gigabytes (a zip bomb) is a 413 that
/// costs no more than `limit` bytes of memory and the work of reading them.
fn decompress(body: Bytes, encoding: Encoding, limit: u64) -> Result<Bytes, ProtocolError> {
    use std::io::Read;
    let (name, reader): (&str, Box<dyn Read + '_>) = match encoding {
        Encoding::Identity => return Ok(body),
        Encoding::Gzip => (
            "gzip",
            Box::new(flate2::read::MultiGzDecoder::new(&body[..])),
        ),
        Encoding::Deflate => (
            "deflate",
            Box::new(flate2::read::ZlibDecoder::new(&body[..])),
        ),
    };
    let mut out = Vec::new();
    reader
        .take(limit.saturating_add(1))
        .read_to_end(&mut out)
        .map_err(|e| ProtocolError::Json {
            what: "the request body",
            message: format!("is not {name} data, as its Content-Encoding says: {e}"),
        })?;
    if out.len() as u64 > limit {
        return Err(ProtocolError::OverLimit {
            what: format!("the request body decompressed (Content-Encoding: {name})"),
            limit,
        });
    }
    Ok(Bytes::from(out))
}

/// Reads a body of at most `limit` bytes (413 beyond). A `Content-Length` past the limit is
/// answered from the header at once, without waiting for a body that would be refused.
pub(crate) async fn read_body(
    request: Request<Incoming>,
    limit: u64,
) -> Result<Bytes, ProtocolError> {
    let declared = request.body().size_hint().lower();
    if declared > limit {
        return Err(ProtocolError::TooLarge {
            what: "the request body (its Content-Length)".into(),
            size: u128::from(declared),
            limit,
        });
    }
    let limit_usize = usize::try_from(limit).unwrap_or(usize::MAX);
    match Limited::new(request.into_body(), limit_usize)
        .collect()
        .await
    {
        Ok(c) => Ok(c.to_bytes()),
        Err(e) if e.is::<http_body_util::LengthLimitError>() => Err(ProtocolError::OverLimit {
            what: "the request body".into(),
            limit,
        }),
        Err(e) => Err(ProtocolError::Json {
            what: "the request body",
            message: format!("could not be read: {e}"),
        }),
    }
}

async fn repository_index(server: &Server, request: Request<Incoming>) -> Response<Full<Bytes>> {
    let body = match read_body(request, 64 * 1024).await {
        Ok(b) => b,
        Err(e) => return protocol_error(&e),
    };
    let asked = match RepositoryIndexRequest::decode(&body) {
        Ok(a) => a,
        Err(e) => return protocol_error(&e),
    };
    let entries: Vec<RepositoryIndexEntry> = server.repository_index(asked.ready);
    json(StatusCode::OK, &entries)
}

/// The system shared memory extension: register, unregister and status of regions.
async fn shared_memory(
    server: &Server,
    method: &Method,
    rest: &[&str],
    request: Request<Incoming>,
) -> Response<Full<Bytes>> {
    #[derive(serde::Deserialize)]
    struct Register {
        key: String,
        #[serde(default)]
        offset: u64,
        byte_size: u64,
    }
    let regions = server.shared_memory();
    let done = |r: Result<(), ProtocolError>| match r {
        Ok(()) => text_response(StatusCode::OK, JSON, Bytes::new()),
        Err(e) => protocol_error(&e),
    };
    // tritonclient quotes a region's name in each of its URLs (`quote(name)`): a name is the
    // same region whichever route names it (status and unregister read it undecoded, so a
    // region registered as `my region` was not found, and unregistering it answered 200 and
    // kept it).
    match (method, rest) {
        (&Method::GET, ["status"]) => status_of(regions.status(None)),
        (&Method::GET, ["region", name, "status"]) => {
            status_of(regions.status(Some(&percent_decode(name))))
        }
        (&Method::POST, ["unregister"]) => done(regions.unregister(None)),
        (&Method::POST, ["region", name, "unregister"]) => {
            done(regions.unregister(Some(&percent_decode(name))))
        }
        (&Method::POST, ["region", name, "register"]) => {
            let name = percent_decode(name);
            let body = match read_body(request, 64 * 1024).await {
                Ok(b) => b,
                Err(e) => return protocol_error(&e),
            };
            match serde_json::from_slice::<Register>(&body) {
                Ok(r) => done(regions.register(&name, &r.key, r.offset, r.byte_size)),
                Err(e) => error(
                    StatusCode::BAD_REQUEST,
                    format!(
                        "registering region `{name}`: expected {{\"key\": \"/name\", \"offset\": N, \
                         \"byte_size\": N}}: {e}"
                    ),
                ),
            }
        }
        _ => error(
            StatusCode::NOT_FOUND,
            format!(
                "no such endpoint: {method} /v2/systemsharedmemory/{}",
                rest.join("/")
            ),
        ),
    }
}

fn status_of(s: Result<Vec<crate::shm::RegionStatus>, ProtocolError>) -> Response<Full<Bytes>> {
    match s {
        Ok(list) => json(StatusCode::OK, &list),
        Err(e) => protocol_error(&e),
    }
}

/// `{"model_stats": [...]}` (Triton's statistics extension; perf_analyzer reads it).
fn statistics(server: &Server, name: Option<&str>) -> Response<Full<Bytes>> {
    match server.statistics(name) {
        Some(stats) => json(StatusCode::OK, &serde_json::json!({ "model_stats": stats })),
        None => refused(&server.unknown(name.unwrap_or(""))),
    }
}

fn health(ok: bool) -> Response<Full<Bytes>> {
    let status = StatusCode::from_u16(health_status(ok)).unwrap_or(StatusCode::BAD_REQUEST);
    text_response(status, "text/plain", Bytes::new())
}

pub(crate) fn json<T: serde::Serialize>(status: StatusCode, value: &T) -> Response<Full<Bytes>> {
    match serde_json::to_vec(value) {
        Ok(body) => text_response(status, JSON, body),
        Err(e) => error(StatusCode::INTERNAL_SERVER_ERROR, e.to_string()),
    }
}

/// `{"error": message}` with `status`.
pub(crate) fn error(status: StatusCode, message: impl AsRef<str>) -> Response<Full<Bytes>> {
    let message = message.as_ref();
    let body = serde_json::json!({ "error": message }).to_string();
    text_response(status, JSON, body)
}

fn protocol_error(e: &ProtocolError) -> Response<Full<Bytes>> {
    let status = StatusCode::from_u16(e.http_status()).unwrap_or(StatusCode::BAD_REQUEST);
    error(status, e.to_string())
}

fn refused(r: &Refusal) -> Response<Full<Bytes>> {
    let status = StatusCode::from_u16(r.http_status()).unwrap_or(StatusCode::BAD_REQUEST);
    let mut response = error(status, r.to_string());
    if status == StatusCode::TOO_MANY_REQUESTS || status == StatusCode::SERVICE_UNAVAILABLE {
        response
            .headers_mut()
            .insert("retry-after", HeaderValue::from_static("1"));
    }
    response
}

/// `%XX` escapes of a path segment (a model name with a space or slash as a client sends it);
/// stray `%`s stay as they are.
pub(crate) fn percent_decode(s: &str) -> String {
    percent_encoding::percent_decode_str(s)
        .decode_utf8_lossy()
        .into_owned()
}

#[cfg(test)]
mod tests {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    /// One request on its own connection to the front end at `addr`: the status line and the
    /// body.
    async fn ask(addr: std::net::SocketAddr, method: &str, path: &str) -> (String, String) {
        ask_with(addr, method, path, "").await
    }

    /// A request with a body on its own connection (closed after the answer): the whole
    /// answer, head and body.
    async fn answer_to(addr: std::net::SocketAddr, method: &str, path: &str, body: &str) -> String {
        let mut io = tokio::net::TcpStream::connect(addr).await.unwrap();
        let head = format!(
            "{method} {path} HTTP/1.1\r\nHost: {addr}\r\nContent-Length: {}\r\n\
             Connection: close\r\n\r\n{body}",
            body.len()
        );
        io.write_all(head.as_bytes()).await.unwrap();
        let mut answer = String::new();
        io.read_to_string(&mut answer).await.unwrap();
        answer
    }

    /// Triton answers an endpoint asked with a method it does not take 405 (HEAD on the health
    /// routes included, as a load balancer's probe may send); isolane answered 404 "no such
    /// endpoint" for most. A path that is no endpoint stays a 404.
    #[test]
    fn an_endpoint_asked_with_another_method_is_a_405_naming_its_own() {
        with_http(|addr| async move {
            for (method, path, takes) in [
                ("HEAD", "/v2/health/live", "GET"),
                ("HEAD", "/v2/health/ready", "GET"),
                ("POST", "/v2/health/ready", "GET"),
                ("GET", "/v2/repository/index", "POST"),
                ("GET", "/v2/models/echo/infer", "POST"),
                ("GET", "/v2/models/echo/versions/1/infer", "POST"),
                ("POST", "/v2/models/echo/config", "GET"),
                ("PUT", "/v2/models/echo", "GET"),
                ("DELETE", "/v2/systemsharedmemory/region/r/register", "POST"),
                ("POST", "/v2/systemsharedmemory/status", "GET"),
                ("GET", "/v2/repository/models/echo/unload", "POST"),
            ] {
                let answer = answer_to(addr, method, path, "").await;
                assert!(
                    answer.starts_with("HTTP/1.1 405"),
                    "{method} {path}: {answer}"
                );
                assert!(
                    answer
                        .to_ascii_lowercase()
                        .contains(&format!("allow: {}", takes.to_ascii_lowercase())),
                    "{method} {path}: {answer}"
                );
                if method == "HEAD" {
                    assert!(answer.ends_with("\r\n\r\n"), "a body for HEAD: {answer}");
                } else {
                    assert!(answer.contains("Method Not Allowed"), "{answer}");
                }
            }
            // Still served: each with its own method, and a path that is no endpoint.
            let (status, _) = ask(addr, "GET", "/v2/health/live").await;
            assert!(status.starts_with("HTTP/1.1 200"), "{status}");
            let (status, _) = ask(addr, "POST", "/v2/repository/index").await;
            assert!(status.starts_with("HTTP/1.1 200"), "{status}");
            let (status, _) = ask(addr, "GET", "/v2/nothing/here").await;
            assert!(status.starts_with("HTTP/1.1 404"), "{status}");
        });
    }

    /// A repository named in the path (`/v2/repository/REPO/...`) is Triton's 501 with its
    /// words (one repository, unnamed, is served); it was a 404 "no such endpoint". Asked with
    /// GET it is a 405 like the unnamed routes.
    #[test]
    fn a_named_repository_is_triton_s_501() {
        with_http(|addr| async move {
            for path in [
                "/v2/repository/models/index",
                "/v2/repository/mine/index",
                "/v2/repository/mine/models/echo/load",
                "/v2/repository/mine/models/echo/unload",
            ] {
                let (status, body) = ask_with(addr, "POST", path, "{}").await;
                assert!(status.starts_with("HTTP/1.1 501"), "{path}: {status}");
                assert!(
                    body.contains(super::REPOSITORY_NAME_NOT_SUPPORTED),
                    "{path}: {body}"
                );
            }
            let (status, _) = ask(addr, "GET", "/v2/repository/mine/index").await;
            assert!(status.starts_with("HTTP/1.1 405"), "{status}");
            // The echo model was not unloaded by the refused request.
            let (status, _) = ask(addr, "GET", "/v2/models/echo/ready").await;
            assert!(status.starts_with("HTTP/1.1 200"), "{status}");
        });
    }

    /// HTTP/1.1 pipelining on one keep-alive connection, as a client may send it: three
    /// requests in one write (an inference between two health checks) are answered in order,
    /// and the last one's `Connection: close` ends the connection after its answer.
    #[test]
    fn pipelined_requests_on_one_connection_are_answered_in_order() {
        with_http(|addr| async move {
            let body = two_rows("");
            let mut io = tokio::net::TcpStream::connect(addr).await.unwrap();
            let text = format!(
                "GET /v2/health/ready HTTP/1.1\r\nHost: {addr}\r\n\r\n\
                 POST /v2/models/echo/infer HTTP/1.1\r\nHost: {addr}\r\n\
                 Content-Length: {}\r\n\r\n{body}\
                 GET /v2/models/echo/ready HTTP/1.1\r\nHost: {addr}\r\n\
                 Connection: close\r\n\r\n",
                body.len()
            );
            io.write_all(text.as_bytes()).await.unwrap();
            let mut answer = String::new();
            let read = io.read_to_string(&mut answer);
            tokio::time::timeout(std::time::Duration::from_secs(30), read)
                .await
                .expect("the connection was not closed after the last answer")
                .unwrap();
            let statuses: Vec<&str> = answer
                .match_indices("HTTP/1.1 ")
                .map(|(i, _)| &answer[i..i + 12])
                .collect();
            assert_eq!(
                statuses,
                ["HTTP/1.1 200", "HTTP/1.1 200", "HTTP/1.1 200"],
                "{answer}"
            );
            let infer = answer.find(r#""data":[1.5,2.5]"#).expect(&answer);
            assert!(answer[..infer].matches("HTTP/1.1").count() == 2, "{answer}");
        });
    }

    /// A request with a body, on its own connection: the status line and the body.
    async fn ask_with(
        addr: std::net::SocketAddr,
        method: &str,
        path: &str,
        body: &str,
    ) -> (String, String) {
        let answer = answer_to(addr, method, path, body).await;
        let status = answer.lines().next().unwrap_or("").to_string();
        let body = answer.split_once("\r\n\r\n").map_or("", |(_, b)| b);
        (status, body.to_string())
    }

    /// tritonclient quotes a region's name in every shared-memory URL; registering decoded it
    /// and status and unregister did not: `my region`'s status was a 404, and unregistering it
    /// answered 200 and left it registered (a later register: "already registered").
    #[test]
    fn a_quoted_region_name_is_the_same_region_on_every_route() {
        let object = format!("isolane-test-quoted-{}", std::process::id());
        let file = std::path::Path::new("/dev/shm").join(&object);
        std::fs::write(&file, [0u8; 16]).unwrap();
        with_http(|addr| {
            let object = object.clone();
            async move {
                let register = format!(r#"{{"key":"/{object}","offset":0,"byte_size":16}}"#);
                let path = "/v2/systemsharedmemory/region/my%20region";
                let (status, body) =
                    ask_with(addr, "POST", &format!("{path}/register"), &register).await;
                assert!(status.starts_with("HTTP/1.1 200"), "{status} {body}");
                let (status, body) = ask(addr, "GET", &format!("{path}/status")).await;
                assert!(status.starts_with("HTTP/1.1 200"), "{status} {body}");
                assert!(body.contains(r#""name":"my region""#), "{body}");
                let (status, _) = ask(addr, "POST", &format!("{path}/unregister")).await;
                assert!(status.starts_with("HTTP/1.1 200"), "{status}");
                let (status, body) = ask(addr, "GET", "/v2/systemsharedmemory/status").await;
                assert!(status.starts_with("HTTP/1.1 200"), "{status}");
                assert_eq!(body, "[]");
                // Registered again under the same name: it was really gone.
                let (status, body) =
                    ask_with(addr, "POST", &format!("{path}/register"), &register).await;
                assert!(status.starts_with("HTTP/1.1 200"), "{status} {body}");
            }
        });
        let _ = std::fs::remove_file(&file);
    }

    /// Clearing every CUDA region and reading their status, as a Triton client does before it
    /// uses shared memory, succeed (none can be registered); registering one is still
    /// refused, saying what to do instead.
    #[test]
    fn cuda_regions_unregister_and_list_as_none_and_registering_one_is_refused() {
        let s = crate::tests::server(crate::tests::ONE);
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        rt.block_on(async {
            let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
            let addr = listener.local_addr().unwrap();
            let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
            let serving = tokio::spawn(super::serve_http(s.clone(), listener, async {
                let _ = stopped.await;
            }));
            let (status, _) = ask(addr, "POST", "/v2/cudasharedmemory/unregister").await;
            assert!(status.starts_with("HTTP/1.1 200"), "{status}");
            let (status, _) = ask(addr, "POST", "/v2/cudasharedmemory/region/r/unregister").await;
            assert!(status.starts_with("HTTP/1.1 200"), "{status}");
            let (status, body) = ask(addr, "GET", "/v2/cudasharedmemory/status").await;
            assert!(status.starts_with("HTTP/1.1 200"), "{status}");
            assert_eq!(body, "[]");
            let (status, body) = ask(addr, "POST", "/v2/cudasharedmemory/region/r/register").await;
            assert!(status.starts_with("HTTP/1.1 400"), "{status}");
            assert!(body.contains("register system shared memory"), "{body}");
            let _ = stop.send(());
            let _ = serving.await;
        });
        s.drain(std::time::Duration::from_secs(5));
    }

    /// Serves the test server's `echo` (spin, batch 4, so a body limit of 65792 bytes) on a
    /// free loopback port while `client` runs against it.
    fn with_http<F, Fut>(client: F)
    where
        F: FnOnce(std::net::SocketAddr) -> Fut,
        Fut: std::future::Future<Output = ()>,
    {
        let s = crate::tests::server(crate::tests::ONE);
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        rt.block_on(async {
            let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
            let addr = listener.local_addr().unwrap();
            let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
            let serving = tokio::spawn(super::serve_http(s.clone(), listener, async {
                let _ = stopped.await;
            }));
            client(addr).await;
            let _ = stop.send(());
            let _ = serving.await;
        });
        s.drain(std::time::Duration::from_secs(5));
    }

    /// POSTs `body` with the extra header lines `headers` to echo's infer endpoint: the status
    /// line and the body, read within 30 s (the server's own bound on a request is 60 s).
    async fn infer(addr: std::net::SocketAddr, headers: &str, body: &[u8]) -> (String, String) {
        infer_declared(addr, headers, body.len() as u64, body).await
    }

    async fn infer_declared(
        addr: std::net::SocketAddr,
        headers: &str,
        length: u64,
        body: &[u8],
    ) -> (String, String) {
        let answer = infer_raw(addr, headers, length, body).await;
        let answer = String::from_utf8_lossy(&answer).into_owned();
        let status = answer.lines().next().unwrap_or("").to_string();
        let body = answer.split_once("\r\n\r\n").map_or("", |(_, b)| b);
        (status, body.to_string())
    }

    /// The whole answer, head and body, as bytes.
    async fn infer_raw(
        addr: std::net::SocketAddr,
        headers: &str,
        length: u64,
        body: &[u8],
    ) -> Vec<u8> {
        let mut io = tokio::net::TcpStream::connect(addr).await.unwrap();
        let head = format!(
            "POST /v2/models/echo/infer HTTP/1.1\r\nHost: {addr}\r\n{headers}\
             Content-Length: {length}\r\nConnection: close\r\n\r\n"
        );
        io.write_all(head.as_bytes()).await.unwrap();
        io.write_all(body).await.unwrap();
        let mut answer = Vec::new();
        let read = io.read_to_end(&mut answer);
        match tokio::time::timeout(std::time::Duration::from_secs(30), read).await {
            Ok(r) => {
                r.unwrap();
            }
            Err(_) => panic!("no answer within 30 s"),
        }
        answer
    }

    fn two_rows(parameters: &str) -> String {
        format!(
            r#"{{"inputs":[{{"name":"{}","shape":[2,1],"datatype":"FP32","data":[1.5,2.5]}}]{parameters}}}"#,
            isolane_runtime::exec::SPIN_INPUT
        )
    }

    /// Issue 32: an output holding NaN or an infinity, asked for as JSON, was a 500; Triton
    /// writes them as `NaN`, `Infinity` and `-Infinity`, which tritonclient's json reads.
    #[test]
    fn nan_and_infinities_are_answered_in_json_as_triton_writes_them() {
        let values = [1.1f32, f32::NAN, f32::INFINITY, f32::NEG_INFINITY];
        let t = isolane_protocol::Tensor::new(
            isolane_runtime::exec::SPIN_INPUT,
            isolane_protocol::DataType::Fp32,
            vec![4, 1],
            values.iter().flat_map(|v| v.to_le_bytes()).collect(),
        )
        .unwrap();
        let enc = isolane_protocol::encode_request(
            None,
            &isolane_protocol::Parameters::new(),
            &[(&t, true)],
            None,
        )
        .unwrap();
        let header = format!(
            "Inference-Header-Content-Length: {}\r\n",
            enc.header_len.unwrap()
        );
        with_http(|addr| async move {
            let (status, body) = infer(addr, &header, &enc.body).await;
            assert!(status.starts_with("HTTP/1.1 200"), "{status} {body}");
            assert!(
                body.contains(r#""data":[1.1,NaN,Infinity,-Infinity]"#),
                "{body}"
            );
        });
    }

    /// Triton reads request JSON with rapidjson's kParseNanAndInfFlag, so `NaN`, `Infinity`
    /// and `-Infinity` in FP32 data are taken; isolane answered 400 (standard JSON only). The
    /// spin echoes its input, so the binary output is the tensor the model ran on.
    #[test]
    fn json_data_with_nan_and_infinities_reaches_the_model_as_those_bits() {
        let body = format!(
            r#"{{"inputs":[{{"name":"{}","shape":[4,1],"datatype":"FP32","data":[NaN, Infinity, -Infinity, 1.0]}}],"outputs":[{{"name":"{}","parameters":{{"binary_data":true}}}}]}}"#,
            isolane_runtime::exec::SPIN_INPUT,
            isolane_runtime::exec::SPIN_OUTPUT
        );
        with_http(|addr| async move {
            let answer = infer_raw(addr, "", body.len() as u64, body.as_bytes()).await;
            let split = answer.windows(4).position(|w| w == b"\r\n\r\n").unwrap();
            let head = String::from_utf8_lossy(&answer[..split]).to_ascii_lowercase();
            assert!(head.starts_with("http/1.1 200"), "{head}");
            let header_len: usize = head
                .lines()
                .find_map(|l| l.strip_prefix("inference-header-content-length:"))
                .unwrap()
                .trim()
                .parse()
                .unwrap();
            let data = &answer[split + 4 + header_len..];
            let bits: Vec<u32> = data
                .chunks_exact(4)
                .map(|c| u32::from_le_bytes(c.try_into().unwrap()))
                .collect();
            // Triton's `float = double` of rapidjson's quiet NaN and infinities.
            assert_eq!(bits, [0x7fc0_0000, 0x7f80_0000, 0xff80_0000, 0x3f80_0000]);
        });
    }

    /// HAN's finding: `Content-Length: 50000000000` with 5 bytes sent waited for the body
    /// (until the 60 s bound) and then named limit+1 bytes; it is a 413 at once, naming the
    /// declared size.
    #[test]
    fn a_declared_length_past_the_limit_is_a_413_from_the_header_at_once() {
        with_http(|addr| async move {
            let (status, body) = infer_declared(addr, "", 50_000_000_000, b"{\"in").await;
            assert!(status.starts_with("HTTP/1.1 413"), "{status} {body}");
            assert!(
                body.contains("50000000000 bytes") && body.contains("65792"),
                "{body}"
            );
        });
    }

    /// HAN's findings: a batch past the model's was a 413 about bytes (RESOURCE_EXHAUSTED's
    /// status, which clients retry on); a request in a sequence was taken silently.
    #[test]
    fn a_batch_past_the_models_and_a_sequence_are_400s_naming_why() {
        with_http(|addr| async move {
            let rows = (1..=5)
                .map(|i| format!("{i}"))
                .collect::<Vec<_>>()
                .join(",");
            let five = format!(
                r#"{{"inputs":[{{"name":"{}","shape":[5,1],"datatype":"FP32","data":[{rows}]}}]}}"#,
                isolane_runtime::exec::SPIN_INPUT
            );
            let (status, body) = infer(addr, "", five.as_bytes()).await;
            assert!(status.starts_with("HTTP/1.1 400"), "{status} {body}");
            assert!(body.contains("1 ≤ n ≤ 4"), "{body}");
            let in_sequence = two_rows(r#","parameters":{"sequence_id":42,"sequence_start":true}"#);
            let (status, body) = infer(addr, "", in_sequence.as_bytes()).await;
            assert!(status.starts_with("HTTP/1.1 400"), "{status} {body}");
            assert!(
                body.contains("sequence_id") && body.contains("sequence model"),
                "{body}"
            );
        });
    }

    /// HAN's finding: tritonclient's `request_compression_algorithm` body was read raw (a 400
    /// about the header length); gzip and deflate are decoded, bounded by the body limit.
    #[test]
    fn gzip_and_deflate_bodies_are_decoded_and_a_zip_bomb_is_a_413() {
        use flate2::write::{GzEncoder, ZlibEncoder};
        use flate2::Compression;
        use std::io::Write;
        let gzip = |b: &[u8]| {
            let mut e = GzEncoder::new(Vec::new(), Compression::default());
            e.write_all(b).unwrap();
            e.finish().unwrap()
        };
        let zlib = |b: &[u8]| {
            let mut e = ZlibEncoder::new(Vec::new(), Compression::default());
            e.write_all(b).unwrap();
            e.finish().unwrap()
        };
        with_http(|addr| async move {
            let json = two_rows("");
            for (encoding, body) in [
                ("gzip", gzip(json.as_bytes())),
                ("deflate", zlib(json.as_bytes())),
            ] {
                let (status, answer) =
                    infer(addr, &format!("Content-Encoding: {encoding}\r\n"), &body).await;
                assert!(
                    status.starts_with("HTTP/1.1 200"),
                    "{encoding}: {status} {answer}"
                );
                assert!(answer.contains("1.5") && answer.contains("2.5"), "{answer}");
            }
            // The binary extension's header length counts the decompressed JSON header.
            let header = format!(
                r#"{{"inputs":[{{"name":"{}","shape":[1,1],"datatype":"FP32","parameters":{{"binary_data_size":4}}}}]}}"#,
                isolane_runtime::exec::SPIN_INPUT
            );
            let mut raw = header.as_bytes().to_vec();
            raw.extend_from_slice(&7.5f32.to_le_bytes());
            let extra = format!(
                "Content-Encoding: gzip\r\nInference-Header-Content-Length: {}\r\n",
                header.len()
            );
            let (status, answer) = infer(addr, &extra, &gzip(&raw)).await;
            assert!(status.starts_with("HTTP/1.1 200"), "{status} {answer}");
            assert!(answer.contains("7.5"), "{answer}");
            // 10 MB of spaces gzip to about 10 KB: refused past the 65792-byte limit.
            let bomb = gzip(&vec![b' '; 10 << 20]);
            assert!(bomb.len() < 65792);
            let (status, answer) = infer(addr, "Content-Encoding: gzip\r\n", &bomb).await;
            assert!(status.starts_with("HTTP/1.1 413"), "{status} {answer}");
            assert!(
                answer.contains("decompressed") && answer.contains("65792"),
                "{answer}"
            );
            let (status, answer) = infer(addr, "Content-Encoding: gzip\r\n", json.as_bytes()).await;
            assert!(status.starts_with("HTTP/1.1 400"), "{status} {answer}");
            assert!(answer.contains("is not gzip data"), "{answer}");
            let (status, answer) = infer(addr, "Content-Encoding: br\r\n", json.as_bytes()).await;
            assert!(status.starts_with("HTTP/1.1 415"), "{status} {answer}");
            assert!(
                answer.contains("`br`") && answer.contains("gzip or deflate"),
                "{answer}"
            );
        });
    }

    /// Found by trying tritonclient: every version was served (`is_model_ready("echo", "2")`
    /// was true, version 2's metadata and inference answered as version 1's); a version the
    /// model does not have is now Triton's 404, and not ready.
    #[test]
    fn a_version_the_model_does_not_have_is_a_404_and_not_ready() {
        with_http(|addr| async move {
            for path in [
                "/v2/models/echo/versions/1",
                "/v2/models/echo/versions/01/ready",
            ] {
                let (status, body) = ask(addr, "GET", path).await;
                assert!(
                    status.starts_with("HTTP/1.1 200"),
                    "{path}: {status} {body}"
                );
            }
            for path in [
                "/v2/models/echo/versions/2",
                "/v2/models/echo/versions/2/config",
                "/v2/models/echo/versions/latest/stats",
            ] {
                let (status, body) = ask(addr, "GET", path).await;
                assert!(
                    status.starts_with("HTTP/1.1 404"),
                    "{path}: {status} {body}"
                );
                assert!(
                    body.contains("Request for unknown model: 'echo' version")
                        && body.contains("version 1 only"),
                    "{path}: {body}"
                );
            }
            let (status, _) = ask(addr, "GET", "/v2/models/echo/versions/2/ready").await;
            assert!(status.starts_with("HTTP/1.1 400"), "{status}");
            let mut io = tokio::net::TcpStream::connect(addr).await.unwrap();
            let body = two_rows("");
            let head = format!(
                "POST /v2/models/echo/versions/3/infer HTTP/1.1\r\nHost: {addr}\r\n\
                 Content-Length: {}\r\nConnection: close\r\n\r\n{body}",
                body.len()
            );
            io.write_all(head.as_bytes()).await.unwrap();
            let mut answer = String::new();
            io.read_to_string(&mut answer).await.unwrap();
            assert!(answer.starts_with("HTTP/1.1 404"), "{answer}");
            assert!(answer.contains("'echo' version 3 is not found"), "{answer}");
        });
    }

    /// Found by trying tritonclient: `get_trace_settings` and `get_log_settings` were a 404
    /// "no such endpoint"; they are refused saying what isolane has instead.
    #[test]
    fn trace_and_log_settings_are_refused_saying_what_to_use_instead() {
        with_http(|addr| async move {
            for (method, path, says) in [
                ("GET", "/v2/trace/setting", "--trace"),
                ("POST", "/v2/trace/setting", "--trace"),
                ("GET", "/v2/models/echo/trace/setting", "--trace"),
                ("GET", "/v2/logging", "ISOLANE_LOG"),
                ("POST", "/v2/logging", "--no-access-log"),
            ] {
                let (status, body) = ask(addr, method, path).await;
                assert!(status.starts_with("HTTP/1.1 400"), "{path}: {status}");
                assert!(
                    body.contains("is not served") && body.contains(says),
                    "{path}: {body}"
                );
            }
        });
    }

    #[test]
    fn percent_escapes_decode_and_stray_ones_stay() {
        assert_eq!(super::percent_decode("a%20b"), "a b");
        assert_eq!(super::percent_decode("50%"), "50%");
        assert_eq!(super::percent_decode("%zz%é"), "%zz%é");
    }
}
