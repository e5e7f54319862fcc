//! `GET /metrics` over HTTP/1.1 from a [`BoundedServer`] (crate::http): a thread and tokio
//! runtime of its own, connections served concurrently under [`Limits::METRICS`] (256 open at
//! most, 5 s for a whole request, one request per connection), so that a slow or silent client
//! cannot hold a scrape up.

use std::net::{SocketAddr, TcpListener, ToSocketAddrs};
use std::sync::Arc;

use http_body_util::Full;
use hyper::body::Bytes;
use hyper::{Method, Response, StatusCode};

use crate::http::{text_response, BoundedServer, Limits};
use crate::RunMetrics;

/// OpenMetrics' content type (Prometheus negotiates it and also reads it as plain text).
const CONTENT_TYPE: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";

#[derive(Debug, thiserror::Error)]
pub enum ServeError {
    #[error(
        "--metrics-addr `{0}`: expected HOST:PORT, e.g. 127.0.0.1:9464 (port 0: any free one)"
    )]
    BadAddress(String),
    #[error("--metrics-addr {addr}: cannot listen there: {source}")]
    Bind {
        addr: String,
        source: std::io::Error,
    },
    #[error("starting the metrics thread: {0}")]
    Thread(std::io::Error),
}

impl ServeError {
    /// An address the user gave that cannot be used (exit code 2).
    pub fn is_user_error(&self) -> bool {
        !matches!(self, ServeError::Thread(_))
    }
}

/// The endpoint; dropping it stops it (the port is free again when the drop returns).
pub struct MetricsServer {
    server: BoundedServer,
}

impl MetricsServer {
    /// Where it listens (the real port when 0 was asked for).
    pub fn addr(&self) -> SocketAddr {
        self.server.addr()
    }

    /// Connections open now.
    pub fn open_connections(&self) -> usize {
        self.server.open_connections()
    }
}

/// Listens on `addr` (HOST:PORT) and serves `metrics` until the returned server is dropped.
pub fn serve(addr: &str, metrics: Arc<RunMetrics>) -> Result<MetricsServer, ServeError> {
    serve_with(addr, metrics, Limits::METRICS)
}

pub(crate) fn serve_with(
    addr: &str,
    metrics: Arc<RunMetrics>,
    limits: Limits,
) -> Result<MetricsServer, ServeError> {
    let resolved: Vec<SocketAddr> = addr
        .to_socket_addrs()
        .map_err(|_| ServeError::BadAddress(addr.into()))?
        .collect();
    if resolved.is_empty() {
        return Err(ServeError::BadAddress(addr.into()));
    }
    let listener = TcpListener::bind(&resolved[..]).map_err(|source| ServeError::Bind {
        addr: addr.into(),
        source,
    })?;
    let handler = move |request: hyper::Request<hyper::body::Incoming>| {
        let response = answer(&metrics, request.method(), request.uri().path());
        std::future::ready(response)
    };
    let server = BoundedServer::spawn("isolane:metrics", listener, limits, handler)
        .map_err(ServeError::Thread)?;
    Ok(MetricsServer { server })
}

/// The metrics for `GET /metrics`, 404 for another path, 405 for another method.
fn answer(metrics: &RunMetrics, method: &Method, path: &str) -> Response<Full<Bytes>> {
    match (method, path) {
        (&Method::GET, "/metrics") => text_response(StatusCode::OK, CONTENT_TYPE, metrics.encode()),
        (&Method::GET, _) => text_response(
            StatusCode::NOT_FOUND,
            "text/plain",
            "isolane serves /metrics only\n",
        ),
        _ => {
            let mut r = text_response(
                StatusCode::METHOD_NOT_ALLOWED,
                "text/plain",
                "GET /metrics\n",
            );
            r.headers_mut().insert(
                hyper::header::ALLOW,
                hyper::header::HeaderValue::from_static("GET"),
            );
            r
        }
    }
}
