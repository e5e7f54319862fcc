//! Streaming inference's plumbing (gRPC `ModelStreamInfer`, which `tritonclient.grpc`'s
//! `start_stream` / `async_stream_infer` and `perf_analyzer --streaming` use): how requests are
//! read from a stream and their answers written back. Each request is answered by the unary
//! path ([`crate::grpc`]'s `infer`: admission, queue, deadline, guard, batching, access log,
//! metrics and `--out` records alike); this module only decides when to read the next one and
//! in which order the answers go.
//!
//! As Triton does for a model that is not decoupled, answers go back in the order their
//! requests came (a fast model's answer waits behind a slower model's taken before it), each
//! a `ModelStreamInferResponse`; a request's error is its answer's `error_message`, and the
//! stream stays open for the next request.
//!
//! Memory is bounded: at most `window` requests of a stream are in flight (read and not yet
//! answered); the next is read from the client only once one is answered, so a client that
//! sends faster than it is answered is held back by HTTP/2 flow control, not buffered here.
//!
//! The stream ends when the client closes its side (once every request read is answered), or
//! when the front end stops (`stop`, raised after the drain has answered every request taken):
//! then no further request is read, those in flight are answered and the stream ends with OK.
//! A client that goes away mid-stream loses only its answers: the requests it had sent run to
//! their end on tasks of their own, and are counted and recorded as any.

use std::future::Future;
use std::sync::Arc;

use isolane_protocol::grpc::inference::ModelStreamInferResponse;
use tokio::sync::{mpsc, watch, OwnedSemaphorePermit, Semaphore};
use tonic::codegen::tokio_stream::wrappers::ReceiverStream;
use tonic::codegen::tokio_stream::{Stream, StreamExt};
use tonic::Status;

/// Requests of one stream in flight at once, at most. Enough for a client to keep a batching
/// model's largest batch queued and a pipeline of frames on the wire; each holds at most one
/// decoded message, as a unary call does.
pub const IN_FLIGHT: usize = 16;

/// A stream's answers, as tonic sends them.
pub type Answers = ReceiverStream<Result<ModelStreamInferResponse, Status>>;

/// What the reader hands the writer, in the order the requests were read.
enum Next {
    /// A request's answer to come, and its place in the window (freed once it is sent).
    Answer(
        tokio::task::JoinHandle<ModelStreamInferResponse>,
        OwnedSemaphorePermit,
    ),
    /// The stream cannot be read further (a message past the size limit, a broken stream):
    /// its last item, after the answers before it.
    Failed(Status),
}

/// Reads requests from `input`, at most `window` in flight, each answered by `answer` on a task
/// of its own, and returns the answers in the requests' order. Must run within a tokio runtime.
pub(crate) fn pump<Req, In, F, Fut>(
    input: In,
    window: usize,
    stop: watch::Receiver<bool>,
    mut answer: F,
) -> Answers
where
    Req: Send + 'static,
    In: Stream<Item = Result<Req, Status>> + Send + 'static,
    F: FnMut(Req) -> Fut + Send + 'static,
    Fut: Future<Output = ModelStreamInferResponse> + Send + 'static,
{
    let permits = Arc::new(Semaphore::new(window.max(1)));
    // Unbounded, but never holds more than `window` answers: each carries a permit.
    let (order, mut ordered) = mpsc::unbounded_channel::<Next>();
    let (out, answers) = mpsc::channel(1);
    let gone = out.clone();
    let mut stop = stop;
    tokio::spawn(async move {
        let mut input = std::pin::pin!(input);
        loop {
            // A stopped front end (or one gone: the sender dropped) ends the reading; so does a
            // client gone (tonic dropped the answers).
            let permit = tokio::select! {
                biased;
                _ = stop.wait_for(|s| *s) => break,
                () = gone.closed() => break,
                p = Arc::clone(&permits).acquire_owned() => match p {
                    Ok(p) => p,
                    Err(_) => break,
                },
            };
            let next = tokio::select! {
                biased;
                _ = stop.wait_for(|s| *s) => break,
                () = gone.closed() => break,
                m = input.next() => m,
            };
            let (item, last) = match next {
                None => break,
                Some(Ok(req)) => (Next::Answer(tokio::spawn(answer(req)), permit), false),
                Some(Err(status)) => (Next::Failed(status), true),
            };
            if order.send(item).is_err() || last {
                break;
            }
        }
        // `gone` drops here: once the writer has sent what it holds, the stream ends.
    });
    tokio::spawn(async move {
        while let Some(next) = ordered.recv().await {
            let (item, permit) = match next {
                Next::Answer(task, permit) => (
                    task.await.map_err(|e| {
                        Status::internal(format!("a streamed request's task failed: {e}"))
                    }),
                    Some(permit),
                ),
                Next::Failed(status) => (Err(status), None),
            };
            // The client is gone: the tasks still running finish by themselves (a dropped
            // JoinHandle detaches its task), their answers unsent.
            if out.send(item).await.is_err() {
                return;
            }
            drop(permit);
        }
    });
    ReceiverStream::new(answers)
}

#[cfg(test)]
mod tests {
    use super::*;
    use isolane_protocol::grpc::inference::ModelInferResponse;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::time::{Duration, Instant};

    fn response(id: u32) -> ModelStreamInferResponse {
        ModelStreamInferResponse {
            error_message: String::new(),
            infer_response: Some(ModelInferResponse {
                id: id.to_string(),
                ..Default::default()
            }),
        }
    }

    fn id(r: &Result<ModelStreamInferResponse, Status>) -> u32 {
        r.as_ref()
            .unwrap()
            .infer_response
            .as_ref()
            .unwrap()
            .id
            .parse()
            .unwrap()
    }

    fn runtime() -> tokio::runtime::Runtime {
        tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .unwrap()
    }

    /// Waits (up to 30 s: a loaded machine) until `n` reads `want`.
    async fn reaches(n: &AtomicUsize, want: usize) {
        let began = Instant::now();
        while n.load(Ordering::SeqCst) < want {
            assert!(
                began.elapsed() < Duration::from_secs(30),
                "{} of {want}",
                n.load(Ordering::SeqCst)
            );
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    }

    /// A client that sends 10 requests at once: 3 (the window) are read; each answer sent lets
    /// one more in; the answers come in the requests' order.
    #[test]
    fn no_more_than_the_window_is_read_before_one_is_answered() {
        runtime().block_on(async {
            let (client, sent) = mpsc::channel::<Result<u32, Status>>(100);
            for i in 0..10 {
                client.send(Ok(i)).await.unwrap();
            }
            let taken = Arc::new(AtomicUsize::new(0));
            // Request i is answered once `released` passes i.
            let (release, released) = watch::channel(0u32);
            let (_stop, stop) = watch::channel(false);
            let counted = Arc::clone(&taken);
            let mut answers = pump(ReceiverStream::new(sent), 3, stop, move |i: u32| {
                counted.fetch_add(1, Ordering::SeqCst);
                let mut released = released.clone();
                async move {
                    let _ = released.wait_for(|r| *r > i).await;
                    response(i)
                }
            });
            reaches(&taken, 3).await;
            // Long enough for an unbounded reader to take the rest; it must not.
            tokio::time::sleep(Duration::from_millis(200)).await;
            assert_eq!(taken.load(Ordering::SeqCst), 3, "read past the window");
            release.send(1).unwrap();
            assert_eq!(id(&answers.next().await.unwrap()), 0);
            reaches(&taken, 4).await;
            tokio::time::sleep(Duration::from_millis(200)).await;
            assert_eq!(taken.load(Ordering::SeqCst), 4, "one answer, one more read");
            release.send(10).unwrap();
            drop(client);
            let mut rest = Vec::new();
            while let Some(a) = answers.next().await {
                rest.push(id(&a));
            }
            assert_eq!(rest, (1..10).collect::<Vec<_>>());
        });
    }

    /// Answers that finish in the reverse order still go back in the requests' order.
    #[test]
    fn answers_go_back_in_the_order_of_their_requests() {
        runtime().block_on(async {
            let (client, sent) = mpsc::channel::<Result<u32, Status>>(8);
            let (_stop, stop) = watch::channel(false);
            let answers = pump(ReceiverStream::new(sent), 8, stop, |i: u32| async move {
                tokio::time::sleep(Duration::from_millis(u64::from(5 - i) * 20)).await;
                response(i)
            });
            for i in 0..5 {
                client.send(Ok(i)).await.unwrap();
            }
            drop(client);
            let got: Vec<u32> = answers.map(|a| id(&a)).collect().await;
            assert_eq!(got, vec![0, 1, 2, 3, 4]);
        });
    }

    /// A client gone mid-stream: what it sent still runs to its end; nothing more is read.
    #[test]
    fn a_client_gone_mid_stream_loses_only_its_answers() {
        runtime().block_on(async {
            let (client, sent) = mpsc::channel::<Result<u32, Status>>(100);
            for i in 0..6 {
                client.send(Ok(i)).await.unwrap();
            }
            let (taken, done) = (Arc::new(AtomicUsize::new(0)), Arc::new(AtomicUsize::new(0)));
            let (release, released) = watch::channel(false);
            let (_stop, stop) = watch::channel(false);
            let (t, d) = (Arc::clone(&taken), Arc::clone(&done));
            let answers = pump(ReceiverStream::new(sent), 3, stop, move |i: u32| {
                t.fetch_add(1, Ordering::SeqCst);
                let (d, mut released) = (Arc::clone(&d), released.clone());
                async move {
                    let _ = released.wait_for(|r| *r).await;
                    d.fetch_add(1, Ordering::SeqCst);
                    response(i)
                }
            });
            reaches(&taken, 3).await;
            drop(answers);
            release.send(true).unwrap();
            reaches(&done, 3).await;
            tokio::time::sleep(Duration::from_millis(200)).await;
            assert_eq!(
                taken.load(Ordering::SeqCst),
                3,
                "read after the client left"
            );
            assert_eq!(done.load(Ordering::SeqCst), 3);
            drop(client);
        });
    }

    /// The front end stopping: nothing more is read, what is in flight is answered, then the
    /// stream ends though the client never closed its side; a broken stream ends with its error
    /// after the answers before it.
    #[test]
    fn a_stop_ends_the_stream_after_its_answers_and_a_broken_one_ends_with_its_error() {
        runtime().block_on(async {
            let (client, sent) = mpsc::channel::<Result<u32, Status>>(100);
            let (stop_tx, stop) = watch::channel(false);
            let (release, released) = watch::channel(false);
            let taken = Arc::new(AtomicUsize::new(0));
            let t = Arc::clone(&taken);
            let answers = pump(ReceiverStream::new(sent), 4, stop, move |i: u32| {
                t.fetch_add(1, Ordering::SeqCst);
                let mut released = released.clone();
                async move {
                    let _ = released.wait_for(|r| *r).await;
                    response(i)
                }
            });
            client.send(Ok(0)).await.unwrap();
            client.send(Ok(1)).await.unwrap();
            reaches(&taken, 2).await;
            stop_tx.send(true).unwrap();
            // Sent after the stop: never read.
            tokio::time::sleep(Duration::from_millis(50)).await;
            let _ = client.send(Ok(2)).await;
            release.send(true).unwrap();
            let got: Vec<u32> = answers.map(|a| id(&a)).collect().await;
            assert_eq!(got, vec![0, 1]);
            assert_eq!(taken.load(Ordering::SeqCst), 2);

            let (client, sent) = mpsc::channel::<Result<u32, Status>>(100);
            let (_stop, stop) = watch::channel(false);
            let answers = pump(ReceiverStream::new(sent), 4, stop, |i: u32| async move {
                response(i)
            });
            client.send(Ok(7)).await.unwrap();
            client
                .send(Err(Status::resource_exhausted("too large")))
                .await
                .unwrap();
            // Never read: the reader stops at the error (and may have gone already).
            let _ = client.send(Ok(8)).await;
            let got: Vec<_> = answers.collect().await;
            assert_eq!(got.len(), 2, "{got:?}");
            assert_eq!(id(&got[0]), 7);
            assert_eq!(
                got[1].as_ref().unwrap_err().code(),
                tonic::Code::ResourceExhausted
            );
        });
    }
}
