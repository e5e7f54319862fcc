//! The coordinator's side of a request/reply worker: an `isolane worker` child process in the
//! probe or maxrate role ([`crate::protocol`]), started with its partition's environment. (A
//! run's workloads are driven by the coordinator itself, which streams their records.)

use std::ffi::OsStr;
use std::io::{BufRead as _, BufReader, Write as _};
use std::os::unix::process::CommandExt as _;
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::mpsc::{self, Receiver, RecvTimeoutError};
use std::time::Duration;

use crate::protocol::{check_version, truncate, FromWorker, ProtocolError, ToWorker};

/// How long a worker may take to say hello (process start; no CUDA yet).
const HELLO_TIMEOUT: Duration = Duration::from_secs(60);

#[derive(Debug, thiserror::Error)]
pub enum WorkerClientError {
    #[error("{label}: cannot start the worker {program}: {source}")]
    Spawn {
        label: String,
        program: String,
        source: std::io::Error,
    },
    #[error("{label}: writing to the worker: {source}")]
    Write {
        label: String,
        source: std::io::Error,
    },
    #[error("{label}: {source}")]
    Protocol {
        label: String,
        source: ProtocolError,
    },
    /// The worker reported a failure (`error` message).
    #[error("{label}: {message}")]
    Failed { label: String, message: String },
    #[error("{label}: no answer within {timeout:?}")]
    NoAnswer { label: String, timeout: Duration },
    #[error("{label}: the worker exited ({status})")]
    Exited { label: String, status: String },
    #[error("{label}: unexpected {message} from the worker")]
    Unexpected { label: String, message: String },
}

/// How to start `isolane worker`: the program (this executable unless overridden), its first
/// arguments, and environment for every worker.
#[derive(Debug, Clone)]
pub struct WorkerCommand {
    pub program: PathBuf,
    pub args: Vec<String>,
    pub env: Vec<(String, String)>,
}

impl WorkerCommand {
    /// `isolane worker` of this executable; `ISOLANE_WORKER_EXE` overrides the program, as for
    /// a run's workers.
    pub fn isolane() -> std::io::Result<Self> {
        let program = match std::env::var_os("ISOLANE_WORKER_EXE") {
            Some(p) => PathBuf::from(p),
            None => std::env::current_exe()?,
        };
        Ok(WorkerCommand {
            program,
            args: vec!["worker".into()],
            env: Vec::new(),
        })
    }
}

/// The command of a worker process, as every parent starts one: `program args…` with extra
/// `env`, stdin and stdout piped for the protocol, in its own process group (a terminal's
/// Ctrl-C reaches only the parent, which stops the worker through the protocol, so that it
/// still reports what it has), and ended by the kernel when the thread that spawns it ends
/// (`PR_SET_PDEATHSIG`), even on a `kill -9` of the parent. The caller says where stderr goes.
pub fn worker_process<S: AsRef<OsStr>>(
    program: &Path,
    args: &[S],
    env: &[(String, String)],
) -> Command {
    let mut cmd = Command::new(program);
    cmd.args(args)
        .envs(env.iter().map(|(k, v)| (k, v)))
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .process_group(0);
    isolane_core::process::die_with_parent(&mut cmd);
    cmd
}

/// A worker process after its hello, in the role its first message gave it.
pub struct WorkerClient {
    label: String,
    child: Child,
    stdin: Option<ChildStdin>,
    messages: Receiver<Result<FromWorker, ProtocolError>>,
}

impl WorkerClient {
    /// Starts `command` as the worker `label` (named in its errors) with extra `env`, checks its hello, and sends `role` (a `probe` or `maxrate` message). The
    /// worker is in its own process group (a terminal's Ctrl-C reaches only this process, which
    /// tells the worker to stop) and dies with this thread's process (`PR_SET_PDEATHSIG`).
    pub fn start(
        label: &str,
        command: &WorkerCommand,
        env: &[(String, String)],
        role: &ToWorker,
    ) -> Result<Self, WorkerClientError> {
        let env: Vec<(String, String)> = command.env.iter().chain(env).cloned().collect();
        let mut cmd = worker_process(&command.program, &command.args, &env);
        cmd.stderr(Stdio::inherit());
        let mut child = cmd.spawn().map_err(|source| WorkerClientError::Spawn {
            label: label.into(),
            program: command.program.display().to_string(),
            source,
        })?;
        let stdin = child.stdin.take();
        let messages = match child.stdout.take() {
            Some(stdout) => read_messages(stdout),
            // Never without `Stdio::piped()`; an empty channel reads as a worker that exited.
            None => mpsc::channel().1,
        };
        let mut client = WorkerClient {
            label: label.into(),
            child,
            stdin,
            messages,
        };
        match client.recv(HELLO_TIMEOUT)? {
            FromWorker::Hello { .. } => {}
            other => return Err(client.unexpected(&other)),
        }
        if let Err(write_error) = client.send(role) {
            // A worker that exited at once (a broken pipe) says why in its last message or
            // its exit status, which is what a person needs to see.
            return Err(match client.recv(HELLO_TIMEOUT) {
                Err(e @ (WorkerClientError::Failed { .. } | WorkerClientError::Exited { .. })) => e,
                _ => write_error,
            });
        }
        Ok(client)
    }

    pub fn label(&self) -> &str {
        &self.label
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    pub fn send(&mut self, msg: &ToWorker) -> Result<(), WorkerClientError> {
        let write_error = |source| WorkerClientError::Write {
            label: self.label.clone(),
            source,
        };
        let stdin = self
            .stdin
            .as_mut()
            .ok_or_else(|| write_error(std::io::Error::from(std::io::ErrorKind::BrokenPipe)))?;
        let mut line = serde_json::to_vec(msg)
            .map_err(|e| write_error(std::io::Error::other(e.to_string())))?;
        line.push(b'\n');
        stdin
            .write_all(&line)
            .and_then(|_| stdin.flush())
            .map_err(write_error)
    }

    /// The worker's next message; its `error` message is a [`WorkerClientError::Failed`].
    pub fn recv(&mut self, timeout: Duration) -> Result<FromWorker, WorkerClientError> {
        match self.messages.recv_timeout(timeout) {
            Ok(Ok(FromWorker::Error { message })) => Err(WorkerClientError::Failed {
                label: self.label.clone(),
                message,
            }),
            Ok(Ok(msg)) => Ok(msg),
            Ok(Err(source)) => Err(WorkerClientError::Protocol {
                label: self.label.clone(),
                source,
            }),
            Err(RecvTimeoutError::Timeout) => Err(WorkerClientError::NoAnswer {
                label: self.label.clone(),
                timeout,
            }),
            Err(RecvTimeoutError::Disconnected) => Err(WorkerClientError::Exited {
                label: self.label.clone(),
                status: self
                    .child
                    .wait()
                    .map(|s| s.to_string())
                    .unwrap_or_else(|e| e.to_string()),
            }),
        }
    }

    /// The error for a message that has no place here.
    pub fn unexpected(&self, msg: &FromWorker) -> WorkerClientError {
        let text = serde_json::to_string(msg).unwrap_or_else(|e| e.to_string());
        WorkerClientError::Unexpected {
            label: self.label.clone(),
            message: truncate(&text, 200).to_string(),
        }
    }

    /// Tells the worker to stop, closes its input and waits up to `grace` for it to exit
    /// before killing it.
    pub fn finish(mut self, grace: Duration) {
        self.end(grace);
    }

    fn end(&mut self, grace: Duration) {
        let _ = self.send(&ToWorker::Stop);
        self.stdin = None; // EOF also ends the worker
                           // The worker's stdout closes when it exits; its messages until then are not needed.
        let deadline = std::time::Instant::now() + grace;
        loop {
            match self
                .messages
                .recv_timeout(deadline.saturating_duration_since(std::time::Instant::now()))
            {
                Ok(_) => continue,
                Err(RecvTimeoutError::Disconnected) => break,
                Err(RecvTimeoutError::Timeout) => {
                    let _ = self.child.kill();
                    break;
                }
            }
        }
        let _ = self.child.wait();
    }
}

impl Drop for WorkerClient {
    fn drop(&mut self) {
        if self.stdin.is_some() {
            self.end(Duration::from_secs(5));
        }
    }
}

/// The worker's messages, parsed on a thread of their own (so that a reply can be waited for
/// with a timeout); the first is checked for the protocol version before it is parsed.
fn read_messages(stdout: std::process::ChildStdout) -> Receiver<Result<FromWorker, ProtocolError>> {
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        let mut first = true;
        for line in BufReader::new(stdout).lines() {
            let Ok(line) = line else { break };
            let parsed = if std::mem::take(&mut first) {
                check_version(&line, "worker").and_then(|v| {
                    serde_json::from_value(v).map_err(|e| malformed("first message", e))
                })
            } else {
                serde_json::from_str(&line).map_err(|e| malformed("message", e))
            };
            if tx.send(parsed).is_err() {
                break;
            }
        }
    });
    rx
}

fn malformed(what: &'static str, e: serde_json::Error) -> ProtocolError {
    ProtocolError::Malformed {
        peer: "worker",
        what,
        detail: e.to_string(),
    }
}
