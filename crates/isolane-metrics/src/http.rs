//! A bounded HTTP/1.1 server: the discipline every isolane endpoint follows, so that slow,
//! idle or numerous clients never stall the one that matters (a scrape, a request).
//!
//! It lives in isolane-metrics because `--metrics-addr` is its first user; `isolane serve` (the
//! KServe v2 inference server) is meant to reuse it as it is, or to move it into a crate of its
//! own when it does: nothing here knows about metrics. [`run`] serves on any tokio runtime
//! (beside tonic, say); [`BoundedServer`] runs it on a thread and runtime of its own, never a
//! release loop's.
//!
//! What it bounds ([`Limits`]):
//! - **connections**: at most `max_connections` are open at once; one accepted beyond that is
//!   answered `503 Service Unavailable` (with `Retry-After`) and closed at once, by the accept
//!   loop itself, so a flood costs an accept and a write per connection and nothing is queued.
//! - **a whole request**: from its first byte (or from the accept, for a connection's first
//!   request) until its response is written out, however the client trickles it: the header,
//!   the body the handler reads, the handler, and the response write. Past `request_deadline`
//!   the connection is closed. This is not a per-read timeout: a client sending a byte a second
//!   is cut off at the deadline all the same.
//! - **a silent connection**: one that has sent no byte `first_byte_timeout` after its accept
//!   is closed (the request deadline when that is shorter), so that silent sockets cannot hold
//!   the connection cap for a whole request deadline.
//! - **keep-alive** (when `keep_alive` is on): a connection with no request under way is
//!   closed after `idle_timeout`. Off, each response says `Connection: close` and ends its
//!   connection.
//! - **the header**: at most `max_header_bytes` bytes (hyper's read buffer) and `max_headers`
//!   fields; beyond either, hyper answers `431` and closes.
//! - **shutdown**: when told to stop it stops accepting (the port is free when [`run`] returns),
//!   closes idle connections, lets requests under way finish for up to `shutdown_grace`, then
//!   drops the rest.
//!
//! Parsing is hyper's (HTTP/1.x); a handler sees a parsed [`Request`] and returns a
//! [`Response`]; it may await (the request body, a queue) within the request deadline.

use std::convert::Infallible;
use std::future::Future;
use std::io;
use std::net::SocketAddr;
use std::pin::{pin, Pin};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::thread::JoinHandle;
use std::time::Duration;

use http_body_util::Full;
use hyper::body::{Body, Bytes, Frame, Incoming, SizeHint};
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper::{Request, Response};
use hyper_util::rt::TokioIo;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{oneshot, watch, OwnedSemaphorePermit, Semaphore};
use tokio::task::JoinSet;
use tokio::time::{Instant, Sleep};

/// What a server allows its clients (module docs).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Limits {
    /// Connections open at once; one more is answered 503 and closed.
    pub max_connections: usize,
    /// From a request's first byte (a connection's first request: from the accept) to the end
    /// of its response.
    pub request_deadline: Duration,
    /// How long a new connection may stay silent: one that has sent no byte by then is closed
    /// (the request deadline applies when shorter). Without it a silent socket would hold
    /// one of `max_connections` places for the whole request deadline, and that many of them
    /// would shut every client out for that long.
    pub first_byte_timeout: Duration,
    /// Whether a connection may carry more than one request.
    pub keep_alive: bool,
    /// How long a kept-alive connection may wait for its next request.
    pub idle_timeout: Duration,
    /// How long requests under way may take to finish once the server is stopped.
    pub shutdown_grace: Duration,
    /// The request line and header, in bytes (hyper's read buffer: 8192 at least).
    pub max_header_bytes: usize,
    /// Header fields per request.
    pub max_headers: usize,
}

impl Limits {
    /// `--metrics-addr`'s: a scrape is one small GET answered in well under a millisecond, so
    /// 5 s for all of it is generous even across a slow link (Prometheus' own scrape timeout
    /// is 10 s), and 256 connections are far more than the scrapers of one run. One request
    /// per connection, as the endpoint always had: clients written for it read the answer to
    /// the close (a scrape every few seconds gains nothing from reusing its connection), and
    /// no idle connection holds one of the 256 places.
    pub const METRICS: Limits = Limits {
        max_connections: 256,
        request_deadline: Duration::from_secs(5),
        first_byte_timeout: Duration::from_secs(5),
        keep_alive: false,
        idle_timeout: Duration::from_secs(10),
        shutdown_grace: Duration::from_secs(1),
        max_header_bytes: 16 * 1024,
        max_headers: 64,
    };
}

/// hyper refuses a smaller read buffer (it asserts).
const MIN_HEADER_BYTES: usize = 8192;

/// The answer to a connection beyond the cap.
const BUSY: &[u8] = b"HTTP/1.1 503 Service Unavailable\r\nContent-Type: text/plain\r\n\
Content-Length: 21\r\nRetry-After: 1\r\nConnection: close\r\n\r\ntoo many connections\n";

/// A server on a thread of its own with a single-threaded tokio runtime: what a small
/// endpoint next to a run needs (one thread, whatever the number of clients). Dropping it
/// stops it as [`run`] does and joins the thread.
pub struct BoundedServer {
    addr: SocketAddr,
    permits: Arc<Semaphore>,
    max_connections: usize,
    stop: Option<oneshot::Sender<()>>,
    thread: Option<JoinHandle<()>>,
}

impl BoundedServer {
    /// Serves `listener` (bound already, so that a bad address is the caller's error to word)
    /// on a new thread named `name`, answering each request with `handler`.
    pub fn spawn<H, F, B>(
        name: &str,
        listener: std::net::TcpListener,
        limits: Limits,
        handler: H,
    ) -> io::Result<BoundedServer>
    where
        H: Fn(Request<Incoming>) -> F + Send + Sync + 'static,
        F: Future<Output = Response<B>> + Send + 'static,
        B: Body<Data = Bytes> + Send + 'static,
        B::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
    {
        let addr = listener.local_addr()?;
        listener.set_nonblocking(true)?;
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_io()
            .enable_time()
            .build()?;
        let listener = {
            // Registering the socket needs the runtime's reactor.
            let _in_runtime = runtime.enter();
            TcpListener::from_std(listener)?
        };
        let max_connections = connection_cap(&limits);
        let permits = Arc::new(Semaphore::new(max_connections));
        let (stop, stopped) = oneshot::channel::<()>();
        let shared = Arc::clone(&permits);
        let thread = std::thread::Builder::new()
            .name(name.into())
            .spawn(move || {
                let until = async {
                    // A dropped sender stops it too.
                    let _ = stopped.await;
                };
                runtime.block_on(serve(listener, limits, handler, until, shared));
            })?;
        Ok(BoundedServer {
            addr,
            permits,
            max_connections,
            stop: Some(stop),
            thread: Some(thread),
        })
    }

    /// Where it listens (the real port when 0 was asked for).
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// Connections open now (within the cap; refused ones are never counted).
    pub fn open_connections(&self) -> usize {
        self.max_connections - self.permits.available_permits()
    }
}

impl Drop for BoundedServer {
    fn drop(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

fn connection_cap(limits: &Limits) -> usize {
    limits.max_connections.clamp(1, Semaphore::MAX_PERMITS)
}

/// Serves `listener` until `shutdown` completes, then stops as the module docs say.
pub async fn run<H, F, B>(
    listener: TcpListener,
    limits: Limits,
    handler: H,
    shutdown: impl Future<Output = ()>,
) where
    H: Fn(Request<Incoming>) -> F + Send + Sync + 'static,
    F: Future<Output = Response<B>> + Send + 'static,
    B: Body<Data = Bytes> + Send + 'static,
    B::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
{
    let permits = Arc::new(Semaphore::new(connection_cap(&limits)));
    serve(listener, limits, handler, shutdown, permits).await;
}

async fn serve<H, F, B>(
    listener: TcpListener,
    limits: Limits,
    handler: H,
    shutdown: impl Future<Output = ()>,
    permits: Arc<Semaphore>,
) where
    H: Fn(Request<Incoming>) -> F + Send + Sync + 'static,
    F: Future<Output = Response<B>> + Send + 'static,
    B: Body<Data = Bytes> + Send + 'static,
    B::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
{
    let handler = Arc::new(handler);
    let (stop, stopping) = watch::channel(false);
    let mut connections = JoinSet::new();
    let mut shutdown = pin!(shutdown);
    loop {
        tokio::select! {
            biased;
            () = &mut shutdown => break,
            // Reaps finished connections, so that the set holds the open ones only.
            Some(_) = connections.join_next(), if !connections.is_empty() => {}
            accepted = listener.accept() => match accepted {
                Ok((stream, _)) => match Arc::clone(&permits).try_acquire_owned() {
                    Ok(permit) => {
                        let conn = connection(
                            stream,
                            limits,
                            Arc::clone(&handler),
                            stopping.clone(),
                            permit,
                        );
                        connections.spawn(conn);
                    }
                    Err(_) => refuse(stream),
                },
                // Out of file descriptors, say: accepting again at once would spin, and the
                // pending connections wait in the backlog meanwhile.
                Err(_) => tokio::time::sleep(Duration::from_millis(50)).await,
            },
        }
    }
    drop(listener);
    let _ = stop.send(true);
    let drained = async { while connections.join_next().await.is_some() {} };
    let _ = tokio::time::timeout(limits.shutdown_grace, drained).await;
    connections.shutdown().await;
}

/// A connection beyond the cap: answered 503 and closed on the accept loop, without a task.
/// What the client sent already is read first (without waiting), since closing a socket with
/// unread data resets it and the client may then lose the answer.
fn refuse(stream: TcpStream) {
    let mut sink = [0u8; 4096];
    for _ in 0..4 {
        match stream.try_read(&mut sink) {
            Ok(n) if n > 0 => continue,
            _ => break,
        }
    }
    // A fresh socket's send buffer takes these bytes at once; if not, the client gets the
    // close alone, which says the same.
    let _ = stream.try_write(BUSY);
}

/// One accepted connection, from the accept to its close: hyper serves it, and the watchdog
/// ([`Expiry`]) closes it when its request or idle time is up.
async fn connection<H, F, B>(
    stream: TcpStream,
    limits: Limits,
    handler: Arc<H>,
    mut stopping: watch::Receiver<bool>,
    _permit: OwnedSemaphorePermit,
) where
    H: Fn(Request<Incoming>) -> F + Send + Sync + 'static,
    F: Future<Output = Response<B>> + Send + 'static,
    B: Body<Data = Bytes> + Send + 'static,
    B::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
{
    // Small answers go out at once instead of waiting for the client's ACK.
    let _ = stream.set_nodelay(true);
    let clock = Arc::new(Clock::new(&limits));
    let io = TokioIo::new(Watched {
        stream,
        clock: Arc::clone(&clock),
    });
    let for_requests = Arc::clone(&clock);
    let service = service_fn(move |request| {
        for_requests.request();
        let clock = Arc::clone(&for_requests);
        let answer = handler(request);
        async move {
            let response = answer.await;
            Ok::<_, Infallible>(response.map(|body| Tracked {
                body: Box::pin(body),
                clock,
            }))
        }
    });
    let conn = http1::Builder::new()
        // The watchdog times the header along with the rest; hyper's own timer is not used.
        .header_read_timeout(None)
        .max_buf_size(limits.max_header_bytes.max(MIN_HEADER_BYTES))
        .max_headers(limits.max_headers)
        // `Content-Type`, not `content-type`: the same to HTTP, friendlier to a `grep` of curl -i.
        .title_case_headers(true)
        .keep_alive(limits.keep_alive)
        .serve_connection(io, service);
    let mut conn = pin!(conn);
    let mut expiry = Expiry {
        clock,
        sleep: Box::pin(tokio::time::sleep(Duration::ZERO)),
    };
    let mut stopped = false;
    loop {
        tokio::select! {
            // The connection first, then the watchdog, which reads the clock the connection
            // has just moved.
            biased;
            _ = conn.as_mut() => return,
            () = &mut expiry => return,
            // A dropped sender (the server gone) stops it too.
            _ = stopping.changed(), if !stopped => {
                stopped = true;
                // Closes it if idle; otherwise after the response under way.
                conn.as_mut().graceful_shutdown();
            }
        }
    }
}

/// Where a connection is in its life, for its watchdog.
struct Clock {
    request_deadline: Duration,
    first_byte_timeout: Duration,
    idle_timeout: Duration,
    state: Mutex<ClockState>,
}

struct ClockState {
    /// A request is under way (else the connection waits for one).
    busy: bool,
    /// Since when it has been busy, or idle.
    since: Instant,
    /// The response body is all with hyper: the next flush that completes ends the request.
    answered: bool,
    /// The client has sent nothing yet.
    silent: bool,
}

impl Clock {
    /// A new connection is busy with its first request from the start (its deadline counts
    /// from the accept), and until its first byte it has the shorter first-byte timeout: a
    /// client that connects and says nothing is closed then, not at the idle timeout.
    fn new(limits: &Limits) -> Clock {
        Clock {
            request_deadline: limits.request_deadline,
            first_byte_timeout: limits.first_byte_timeout.min(limits.request_deadline),
            idle_timeout: limits.idle_timeout,
            state: Mutex::new(ClockState {
                busy: true,
                since: Instant::now(),
                answered: false,
                silent: true,
            }),
        }
    }

    fn state(&self) -> std::sync::MutexGuard<'_, ClockState> {
        // Nothing panics while holding it; if something did, the state is still whole.
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// When the connection is to be closed, as things stand.
    fn limit(&self) -> Instant {
        let s = self.state();
        s.since
            + if s.silent {
                self.first_byte_timeout
            } else if s.busy {
                self.request_deadline
            } else {
                self.idle_timeout
            }
    }

    /// Bytes came in, or hyper handed a request over (one pipelined behind the previous one
    /// arrives without a read): a request is under way from now if none was.
    fn request(&self) {
        let mut s = self.state();
        s.silent = false;
        if !s.busy {
            s.busy = true;
            s.since = Instant::now();
            s.answered = false;
        }
    }

    fn answered(&self) {
        self.state().answered = true;
    }

    /// A flush completed: if it carried the end of a response, the connection is idle now.
    fn flushed(&self) {
        let mut s = self.state();
        if s.busy && s.answered {
            s.busy = false;
            s.since = Instant::now();
            s.answered = false;
        }
    }
}

/// The socket, telling the clock about bytes read and flushes completed.
struct Watched {
    stream: TcpStream,
    clock: Arc<Clock>,
}

impl AsyncRead for Watched {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let before = buf.filled().len();
        let polled = Pin::new(&mut self.stream).poll_read(cx, buf);
        if matches!(polled, Poll::Ready(Ok(()))) && buf.filled().len() > before {
            self.clock.request();
        }
        polled
    }
}

impl AsyncWrite for Watched {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.stream).poll_write(cx, buf)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.stream).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.stream.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let polled = Pin::new(&mut self.stream).poll_flush(cx);
        if matches!(polled, Poll::Ready(Ok(()))) {
            self.clock.flushed();
        }
        polled
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.stream).poll_shutdown(cx)
    }
}

/// A response body that tells the clock when hyper is done with it (hyper drops a body once
/// its last frame is in the write buffer; the flush after that ends the request).
struct Tracked<B> {
    body: Pin<Box<B>>,
    clock: Arc<Clock>,
}

impl<B> Drop for Tracked<B> {
    fn drop(&mut self) {
        self.clock.answered();
    }
}

impl<B: Body> Body for Tracked<B> {
    type Data = B::Data;
    type Error = B::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Self::Data>, Self::Error>>> {
        self.body.as_mut().poll_frame(cx)
    }

    fn is_end_stream(&self) -> bool {
        self.body.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.body.size_hint()
    }
}

/// Completes when the connection's time is up; re-reads the clock at every poll, so that it
/// follows the connection from request to idle and back.
struct Expiry {
    clock: Arc<Clock>,
    sleep: Pin<Box<Sleep>>,
}

impl Future for Expiry {
    type Output = ();

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
        let limit = self.clock.limit();
        if self.sleep.deadline() != limit {
            self.sleep.as_mut().reset(limit);
        }
        self.sleep.as_mut().poll(cx)
    }
}

/// A small complete answer: `status`, a content type, and `body`.
pub fn text_response(
    status: hyper::StatusCode,
    content_type: &'static str,
    body: impl Into<Bytes>,
) -> Response<Full<Bytes>> {
    let mut response = Response::new(Full::new(body.into()));
    *response.status_mut() = status;
    response.headers_mut().insert(
        hyper::header::CONTENT_TYPE,
        hyper::header::HeaderValue::from_static(content_type),
    );
    response
}
