//! `GET /metrics` over HTTP/1.x on a thread of its own, with std's `TcpListener`: one request
//! per connection, answered and closed. A scrape is a few KB every few seconds, so no web
//! framework or connection pool is worth its weight; a slow or silent client is cut off after
//! a read timeout so it cannot hold the next scrape up for long.

use std::io::{BufRead, BufReader, Write};
use std::net::{SocketAddr, TcpListener, TcpStream, ToSocketAddrs};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;

use crate::RunMetrics;

/// OpenMetrics' content type (Prometheus negotiates it and also reads it as plain text).
const CONTENT_TYPE: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";
/// How long a client may take to send its request line and headers.
const READ_TIMEOUT: Duration = Duration::from_secs(2);

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

/// The endpoint's thread; dropping it stops the thread.
pub struct MetricsServer {
    addr: SocketAddr,
    stop: Arc<AtomicBool>,
    handle: Option<JoinHandle<()>>,
}

impl MetricsServer {
    /// Where it listens (the real port when 0 was asked for).
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }
}

impl Drop for MetricsServer {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        // `accept` blocks: a connection of our own wakes it to see the flag.
        let _ = TcpStream::connect_timeout(&self.addr, Duration::from_secs(1));
        if let Some(h) = self.handle.take() {
            let _ = h.join();
        }
    }
}

/// Listens on `addr` (HOST:PORT) and serves `metrics` until the returned server is dropped.
pub fn serve(addr: &str, metrics: Arc<RunMetrics>) -> Result<MetricsServer, ServeError> {
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
    let local = listener.local_addr().map_err(|source| ServeError::Bind {
        addr: addr.into(),
        source,
    })?;
    let stop = Arc::new(AtomicBool::new(false));
    let flag = Arc::clone(&stop);
    let handle = std::thread::Builder::new()
        .name("isolane:metrics".into())
        .spawn(move || accept_loop(&listener, &metrics, &flag))
        .map_err(ServeError::Thread)?;
    Ok(MetricsServer {
        addr: local,
        stop,
        handle: Some(handle),
    })
}

fn accept_loop(listener: &TcpListener, metrics: &RunMetrics, stop: &AtomicBool) {
    for conn in listener.incoming() {
        if stop.load(Ordering::SeqCst) {
            return;
        }
        // A failed accept (the client gave up) or answer concerns that client only.
        if let Ok(stream) = conn {
            let _ = answer(stream, metrics);
        }
    }
}

/// Reads one request and answers it: the metrics for `GET /metrics`, 404 for another path,
/// 405 for another method.
fn answer(stream: TcpStream, metrics: &RunMetrics) -> std::io::Result<()> {
    stream.set_read_timeout(Some(READ_TIMEOUT))?;
    stream.set_write_timeout(Some(READ_TIMEOUT))?;
    let mut reader = BufReader::new(stream.try_clone()?);
    let mut request = String::new();
    reader.read_line(&mut request)?;
    // The headers are read and dropped, so the client is not reset before it reads the answer.
    let mut header = String::new();
    while reader.read_line(&mut header)? > 2 {
        header.clear();
    }
    let mut parts = request.split_whitespace();
    let (method, path) = (parts.next().unwrap_or(""), parts.next().unwrap_or(""));
    let path = path.split('?').next().unwrap_or("");
    let (status, content_type, body) = match (method, path) {
        ("GET", "/metrics") => ("200 OK", CONTENT_TYPE, metrics.encode()),
        ("GET", _) => (
            "404 Not Found",
            "text/plain",
            "isolane serves /metrics only\n".to_string(),
        ),
        _ => (
            "405 Method Not Allowed",
            "text/plain",
            "GET /metrics\n".to_string(),
        ),
    };
    let mut out = stream;
    write!(
        out,
        "HTTP/1.1 {status}\r\nContent-Type: {content_type}\r\nContent-Length: {}\r\n\
         Connection: close\r\n\r\n{body}",
        body.len()
    )?;
    out.flush()
}
