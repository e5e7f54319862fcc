//! `isolane ctl`'s side of the wire: one HTTP/1.1 request to a running server's control or
//! repository route, and its answer in words (docs/serve.md, "Control while serving"). The
//! server makes and checks the change; this only asks and says what it answered.

use std::io::{Read, Write};
use std::net::{TcpStream, ToSocketAddrs};
use std::time::{Duration, Instant};

use serde_json::Value;

/// What `isolane ctl` asks of the server.
#[derive(Debug, Clone)]
pub enum Action {
    /// Each model's state, partition, criticality, deadline, load and last change.
    Status,
    /// A change while serving: `KEY=VALUE` settings, all checked by the server before any is made.
    Resize { name: String, settings: Vec<String> },
    /// Triton's repository load.
    Load { name: String },
    /// Triton's repository unload.
    Unload { name: String },
}

/// A failed `ctl`: the user's to fix (a refused or malformed change, a server not there) or not
/// (a failed build, an answer that is not HTTP or JSON).
#[derive(Debug, thiserror::Error)]
pub enum CtlError {
    #[error("{0}")]
    User(String),
    #[error("{0}")]
    Failed(String),
}

impl CtlError {
    /// Whether the exit code is 2 (the user's mistake) rather than 1.
    pub fn is_user_error(&self) -> bool {
        matches!(self, CtlError::User(_))
    }
}

fn failed(e: impl std::fmt::Display) -> CtlError {
    CtlError::Failed(e.to_string())
}

/// How long a change may take to be answered: building and warming a model; the server cuts
/// an HTTP request at 60 s.
const ANSWER_WITHIN: Duration = Duration::from_secs(90);

/// The most of an answer read: the largest one (`ctl status` of the most models a server
/// holds) is a few KiB. Without a cap, a server that streams without end filled memory
/// (7.8 GB in 30 s).
const MAX_ANSWER: usize = 4 << 20;

/// Why an answer was not read whole.
#[derive(Debug)]
enum ReadEnd {
    Io(std::io::Error),
    TooLarge,
    Late,
}

/// Reads the connection to its end, at most `limit` bytes and within `within` in all: a
/// per-read timeout alone let a server that trickles bytes hold the client forever. On an
/// error, what was read before it is in `answer`.
fn read_answer(
    stream: &mut TcpStream,
    answer: &mut Vec<u8>,
    limit: usize,
    within: Duration,
) -> Result<(), ReadEnd> {
    let deadline = Instant::now() + within;
    let mut buf = [0u8; 16 * 1024];
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Err(ReadEnd::Late);
        }
        stream.set_read_timeout(Some(left)).map_err(ReadEnd::Io)?;
        match stream.read(&mut buf) {
            Ok(0) => return Ok(()),
            Ok(n) if answer.len() + n > limit => return Err(ReadEnd::TooLarge),
            Ok(n) => answer.extend_from_slice(&buf[..n]),
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e)
                if matches!(
                    e.kind(),
                    std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                ) =>
            {
                return Err(ReadEnd::Late)
            }
            Err(e) => return Err(ReadEnd::Io(e)),
        }
    }
}

/// Sends `action` to the server at `server` (HOST:PORT of `isolane serve --http`) and returns
/// the text to print: the server's JSON answer pretty-printed (`json`), or words.
pub fn call(server: &str, action: &Action, json: bool) -> Result<String, CtlError> {
    let (method, path, body) = match action {
        Action::Status => ("GET", "/isolane/v1/status".to_string(), None),
        Action::Resize { name, settings } => (
            "POST",
            format!("/isolane/v1/models/{}/resize", escape(name)),
            Some(settings_json(settings)?),
        ),
        Action::Load { name } => (
            "POST",
            format!("/v2/repository/models/{}/load", escape(name)),
            None,
        ),
        Action::Unload { name } => (
            "POST",
            format!("/v2/repository/models/{}/unload", escape(name)),
            None,
        ),
    };
    let (status, answer) = request(server, method, &path, body.as_deref())?;
    // isolane serve answers every route ctl asks with JSON: another HTTP server is there.
    let value: Value = serde_json::from_slice(&answer).map_err(|e| {
        not_serve(
            server,
            &format!("its answer to {method} {path} (HTTP {status}) is not JSON ({e})"),
        )
    })?;
    if !(200..300).contains(&status) {
        let message = value
            .get("error")
            .and_then(Value::as_str)
            .unwrap_or("no reason given");
        let text = format!("{server} refused: {message} (HTTP {status})");
        // A change refused or malformed is the user's to fix; a failed build is not.
        return if (400..500).contains(&status) || status == 503 {
            Err(CtlError::User(text))
        } else {
            Err(CtlError::Failed(text))
        };
    }
    if json {
        return serde_json::to_string_pretty(&value).map_err(failed);
    }
    Ok(match action {
        Action::Status => status_table(&value),
        _ => change_words(&value),
    })
}

/// `KEY=VALUE`s as the resize body (`{"KEY": "VALUE", ...}`), each key once.
fn settings_json(settings: &[String]) -> Result<String, CtlError> {
    let mut map = serde_json::Map::new();
    for s in settings {
        let Some((key, value)) = s.split_once('=') else {
            return Err(CtlError::User(format!(
                "`{s}`: expected KEY=VALUE, e.g. cpu=2,3, deadline_ms=20 or \
                 criticality=best_effort"
            )));
        };
        if map
            .insert(key.to_string(), Value::String(value.to_string()))
            .is_some()
        {
            return Err(CtlError::User(format!("`{key}` is given twice")));
        }
    }
    Ok(Value::Object(map).to_string())
}

/// A model name as one path segment (`%XX` for anything but unreserved characters).
fn escape(name: &str) -> String {
    name.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => {
                (b as char).to_string()
            }
            _ => format!("%{b:02X}"),
        })
        .collect()
}

/// An address that answers, but not as isolane serve's HTTP front end does: the user's slip
/// (most often the gRPC port, one above the HTTP one by default).
fn not_serve(server: &str, why: &str) -> CtlError {
    CtlError::User(format!(
        "{server} is not isolane serve's HTTP address: {why}; --server names the HTTP address \
         that `isolane serve` printed when ready (default 127.0.0.1:8000), not its gRPC one \
         (default 127.0.0.1:8001)"
    ))
}

/// Whether `raw` opens with an HTTP/2 frame header, as a gRPC server's first bytes do: its
/// SETTINGS frame (type 4), or a GOAWAY (type 7) once it reads an HTTP/1.1 request where the
/// HTTP/2 preface should be, both on stream 0.
fn is_http2(raw: &[u8]) -> bool {
    raw.len() >= 9 && matches!(raw[3], 4 | 7) && raw[5..9] == [0; 4]
}

/// One HTTP/1.1 request, the connection closed after it: the status and the body.
fn request(
    server: &str,
    method: &str,
    path: &str,
    body: Option<&str>,
) -> Result<(u16, Vec<u8>), CtlError> {
    let unreachable = |why: String| {
        CtlError::User(format!(
            "cannot reach isolane serve at {server}: {why}; --server names the HTTP address \
             that `isolane serve` printed when ready (default 127.0.0.1:8000)"
        ))
    };
    let addr = server
        .to_socket_addrs()
        .map_err(|e| unreachable(format!("not a HOST:PORT ({e})")))?
        .next()
        .ok_or_else(|| unreachable("no address".into()))?;
    let mut stream = TcpStream::connect_timeout(&addr, Duration::from_secs(5))
        .map_err(|e| unreachable(e.to_string()))?;
    let body = body.unwrap_or("");
    let head = format!(
        "{method} {path} HTTP/1.1\r\nHost: {server}\r\nContent-Type: application/json\r\n\
         Content-Length: {}\r\nConnection: close\r\n\r\n",
        body.len()
    );
    stream.write_all(head.as_bytes()).map_err(failed)?;
    stream.write_all(body.as_bytes()).map_err(failed)?;
    let mut answer = Vec::new();
    let read = read_answer(&mut stream, &mut answer, MAX_ANSWER, ANSWER_WITHIN);
    if is_http2(&answer) {
        return Err(not_serve(
            server,
            "it answers in HTTP/2, as a gRPC port does",
        ));
    }
    match read {
        Ok(()) => {}
        Err(ReadEnd::TooLarge) => {
            return Err(failed(format!(
                "{server}: the answer to {method} {path} is more than {} MiB, more than any \
                 answer of isolane serve; is --server an isolane serve's HTTP address?",
                MAX_ANSWER >> 20
            )))
        }
        Err(ReadEnd::Late) => {
            return Err(failed(format!(
                "{server}: no whole answer to {method} {path} within {} s",
                ANSWER_WITHIN.as_secs()
            )))
        }
        Err(ReadEnd::Io(e)) => {
            // An HTTP/2 server resets a connection whose first bytes are not its preface,
            // often before its own SETTINGS frame is read.
            if answer.is_empty() && e.kind() == std::io::ErrorKind::ConnectionReset {
                return Err(not_serve(
                    server,
                    &format!(
                        "it reset the connection on an HTTP/1.1 request ({e}), as a gRPC \
                     (HTTP/2) port does"
                    ),
                ));
            }
            return Err(failed(format!(
                "{server}: no answer to {method} {path}: {e}"
            )));
        }
    }
    parse_response(&answer).ok_or_else(|| {
        not_serve(
            server,
            &format!(
                "its answer to {method} {path} is not HTTP/1.1: {:?}",
                String::from_utf8_lossy(&answer[..answer.len().min(200)])
            ),
        )
    })
}

/// The status and body of a whole HTTP/1.1 response with a Content-Length (or none, then
/// the rest of the connection).
fn parse_response(raw: &[u8]) -> Option<(u16, Vec<u8>)> {
    let end = raw.windows(4).position(|w| w == b"\r\n\r\n")?;
    let head = std::str::from_utf8(&raw[..end]).ok()?;
    let status: u16 = head.split(' ').nth(1)?.parse().ok()?;
    let body = &raw[end + 4..];
    let length = head.lines().find_map(|l| {
        let (k, v) = l.split_once(':')?;
        k.trim()
            .eq_ignore_ascii_case("content-length")
            .then(|| v.trim().parse::<usize>().ok())?
    });
    let body = match length {
        Some(n) => body.get(..n)?,
        None => body,
    };
    Some((status, body.to_vec()))
}

/// `ctl status`'s table, one line per model under a header.
fn status_table(value: &Value) -> String {
    let rows: Vec<Vec<String>> = value
        .get("models")
        .and_then(Value::as_array)
        .map(|models| models.iter().map(status_row).collect())
        .unwrap_or_default();
    let header = [
        "model",
        "state",
        "partition",
        "criticality",
        "deadline",
        "rate",
        "queue",
        "p99",
        "last change",
    ];
    let mut widths: Vec<usize> = header.iter().map(|h| h.len()).collect();
    for r in &rows {
        for (w, c) in widths.iter_mut().zip(r) {
            *w = (*w).max(c.chars().count());
        }
    }
    let line = |cells: Vec<String>| {
        let text: Vec<String> = cells
            .iter()
            .zip(&widths)
            .map(|(c, w)| format!("{c:<w$}"))
            .collect();
        text.join("  ").trim_end().to_string()
    };
    let mut lines = vec![line(header.iter().map(|h| h.to_string()).collect())];
    lines.extend(rows.into_iter().map(line));
    lines.join("\n")
}

fn status_row(m: &Value) -> Vec<String> {
    let s = |k: &str| m.get(k).and_then(Value::as_str).unwrap_or("").to_string();
    let load = m.get("load").cloned().unwrap_or(Value::Null);
    let num = |v: &Value, k: &str| v.get(k).and_then(Value::as_f64);
    vec![
        s("name"),
        s("state"),
        s("partition"),
        s("criticality").replace('_', " "),
        num(m, "deadline_ms").map_or("none".into(), |d| format!("{d} ms")),
        num(&load, "rate_hz").map_or(String::new(), |r| format!("{r:.1}/s")),
        num(&load, "queued").map_or(String::new(), |q| format!("{q}")),
        num(&load, "p99_ms").map_or("-".into(), |p| format!("{p:.3} ms")),
        m.get("last_change")
            .filter(|c| !c.is_null())
            .map_or("-".into(), |c| {
                let words = change_words(c);
                // The row names the model already.
                match words.split_once(": ") {
                    Some((_, rest)) => rest.to_string(),
                    None => words,
                }
            }),
    ]
}

/// `model `echo`: resize (cpu 0 → 1), serving after 41.2 ms, paused 0.120 ms; partition cpu 1`.
fn change_words(c: &Value) -> String {
    let s = |k: &str| c.get(k).and_then(Value::as_str).unwrap_or("");
    let what: Vec<&str> = c
        .get("what")
        .and_then(Value::as_array)
        .map(|w| w.iter().filter_map(Value::as_str).collect())
        .unwrap_or_default();
    let took = c.get("took_ms").and_then(Value::as_f64).unwrap_or(0.0);
    let mut text = format!("model `{}`: {}", s("model"), s("kind"));
    if !what.is_empty() {
        text += &format!(" ({})", what.join("; "));
    }
    text += &match s("kind") {
        "unload" => format!(", unloaded after {took:.1} ms"),
        "settings" => format!(", in effect after {took:.3} ms, no new instance"),
        _ => format!(", new instance serving after {took:.1} ms"),
    };
    if let Some(p) = c.get("pause_ms").and_then(Value::as_f64) {
        text += &format!(", paused {p:.3} ms");
    }
    if let Some(n) = c
        .get("abandoned")
        .and_then(Value::as_u64)
        .filter(|&n| n > 0)
    {
        text += &format!(", {n} queued requests refused");
    }
    text + &format!("; partition {}", s("partition"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn settings_become_one_object_and_a_key_twice_is_refused() {
        let body = settings_json(&["cpu=2,3".into(), "deadline_ms=20".into()]).unwrap();
        let v: Value = serde_json::from_str(&body).unwrap();
        assert_eq!(v["cpu"], "2,3");
        assert_eq!(v["deadline_ms"], "20");
        assert!(settings_json(&["cpu".into()]).unwrap_err().is_user_error());
        assert!(settings_json(&["cpu=1".into(), "cpu=2".into()])
            .unwrap_err()
            .is_user_error());
        assert_eq!(escape("a b/c"), "a%20b%2Fc");
    }

    #[test]
    fn a_response_is_read_up_to_its_length() {
        let raw = b"HTTP/1.1 409 Conflict\r\ncontent-length: 2\r\n\r\n{}junk";
        assert_eq!(parse_response(raw), Some((409, b"{}".to_vec())));
        assert_eq!(parse_response(b"garbage"), None);
    }

    /// A server that answers a head, then `chunk` bytes every `every`, never closing; the thread
    /// ends when the client goes.
    fn streamer(chunk: usize, every: Duration) -> String {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap().to_string();
        std::thread::spawn(move || {
            let (mut s, _) = listener.accept().unwrap();
            let mut head = [0u8; 4096];
            let _ = s.read(&mut head);
            let _ = s.write_all(b"HTTP/1.1 200 OK\r\n\r\n");
            let data = vec![b'x'; chunk];
            while s.write_all(&data).is_ok() {
                std::thread::sleep(every);
            }
        });
        addr
    }

    /// Issue 32's finding: `ctl` against a server that streams without end grew without
    /// bound (7.8 GB in 30 s); the answer is capped and the client fails as on other
    /// connection failures (exit 1).
    #[test]
    fn an_answer_without_end_is_cut_at_its_cap() {
        let addr = streamer(64 * 1024, Duration::ZERO);
        let e = request(&addr, "GET", "/v2/isolane/status", None).unwrap_err();
        assert!(!e.is_user_error(), "{e}");
        assert!(e.to_string().contains("more than 4 MiB"), "{e}");
    }

    /// A server that trickles bytes passed every per-read timeout; the whole exchange has a
    /// deadline.
    #[test]
    fn an_answer_that_trickles_is_cut_at_the_deadline() {
        let addr = streamer(1, Duration::from_millis(20));
        let mut stream = TcpStream::connect(&addr).unwrap();
        stream.write_all(b"GET / HTTP/1.1\r\n\r\n").unwrap();
        let mut answer = Vec::new();
        let r = read_answer(
            &mut stream,
            &mut answer,
            MAX_ANSWER,
            Duration::from_millis(500),
        );
        assert!(matches!(r, Err(ReadEnd::Late)), "{r:?}");
        assert!(answer.starts_with(b"HTTP/1.1 200 OK"));
    }

    /// HAN's finding: `ctl --server` at the gRPC port exited 1 with "Connection reset by
    /// peer"; it is the user's slip (exit 2), named as such.
    #[test]
    fn the_grpc_port_and_other_servers_are_named_as_not_serves_http_address() {
        let s = crate::tests::server(crate::tests::ONE);
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .enable_all()
            .build()
            .unwrap();
        let listener = rt
            .block_on(tokio::net::TcpListener::bind("127.0.0.1:0"))
            .unwrap();
        let grpc = listener.local_addr().unwrap().to_string();
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let serving = rt.spawn(crate::grpc::serve_grpc(s.clone(), listener, async {
            let _ = stopped.await;
        }));
        let e = call(&grpc, &Action::Status, false).unwrap_err();
        let _ = stop.send(());
        let _ = rt.block_on(serving);
        s.drain(Duration::from_secs(5));
        assert!(e.is_user_error(), "{e}");
        let msg = e.to_string();
        assert!(
            msg.contains("is not isolane serve's HTTP address") && msg.contains("gRPC"),
            "{msg}"
        );

        // Something else that answers once and closes: not HTTP, and HTTP but not JSON.
        for (answer, says) in [
            (&b"SSH-2.0-OpenSSH_9.6\r\n"[..], "is not HTTP/1.1"),
            (
                &b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\n<html"[..],
                "is not JSON",
            ),
        ] {
            let other = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
            let addr = other.local_addr().unwrap().to_string();
            let answering = std::thread::spawn(move || {
                let (mut c, _) = other.accept().unwrap();
                let mut head = [0u8; 4096];
                let _ = c.read(&mut head);
                c.write_all(answer).unwrap();
            });
            let e = call(&addr, &Action::Status, false).unwrap_err();
            answering.join().unwrap();
            assert!(e.is_user_error(), "{e}");
            let msg = e.to_string();
            assert!(
                msg.contains("is not isolane serve's HTTP address") && msg.contains(says),
                "{msg}"
            );
        }
        assert!(is_http2(&[0, 0, 6, 4, 0, 0, 0, 0, 0, 0, 3]));
        assert!(!is_http2(b"HTTP/1.1 200 OK"));
    }

    #[test]
    fn a_change_is_said_in_one_line() {
        let c = serde_json::json!({
            "model": "echo", "kind": "resize", "what": ["cpu 0 → 1"], "took_ms": 41.0,
            "pause_ms": 0.12, "abandoned": 0, "partition": "cpu 1"
        });
        assert_eq!(
            change_words(&c),
            "model `echo`: resize (cpu 0 → 1), new instance serving after 41.0 ms, paused \
             0.120 ms; partition cpu 1"
        );
    }

    #[test]
    fn the_status_table_aligns_its_columns_under_the_header() {
        let v = serde_json::json!({"models": [{
            "name": "echo", "state": "ready", "partition": "cpu 0",
            "criticality": "best_effort", "deadline_ms": 20.0,
            "load": {"rate_hz": 3.0, "queued": 0, "p99_ms": 1.5}, "last_change": null
        }]});
        let t = status_table(&v);
        let lines: Vec<&str> = t.lines().collect();
        assert_eq!(lines.len(), 2, "{t}");
        assert!(lines[0].starts_with("model  state  partition"), "{t}");
        assert!(
            lines[1].contains("best effort") && lines[1].ends_with('-'),
            "{t}"
        );
        assert_eq!(lines[0].find("state"), lines[1].find("ready"), "{t}");
    }
}
