//! Per-job records streamed to `jobs/<workload>.csv` while a run goes on, so that a run killed
//! with `kill -9` leaves every job measured up to its last flush on disk (docs/runtime.md,
//! "Output files").
//!
//! The release loop never touches a file: its sink hands batches of records to a channel (a
//! batch at a time, not a job), and one writer thread per run appends them as CSV rows and
//! writes each batch out in one call. The same thread shows each batch to the run's
//! [`RecordObserver`] (live metrics), so an observer never runs on a release loop's thread. Rows are whole lines; a kill in the middle of a write can
//! cut only the last one, which [`crate::output::read_jobs_csv_partial`] leaves out.

use std::fs::File;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::{mpsc, Arc};
use std::thread::JoinHandle;

use isolane_core::files::jobs_file_name;
use isolane_core::JobRecord;

use crate::clock;
use crate::output::{push_job_rows, JOBS_CSV_HEADER};
use crate::release::RecordSink;

/// While the loop waits for a release, a sink flushes once this many records wait ...
pub const FLUSH_RECORDS: usize = 256;
/// ... or once the oldest of them is this old: a workload's jobs reach the disk within about
/// this time, in batches of about `rate × FLUSH_AGE` records.
pub const FLUSH_AGE_NS: i64 = 100_000_000;
/// Without idle time (overload: every job starts late), between jobs, at these 4× bounds.
const BUSY_FACTOR: i64 = 4;

/// Sees every workload's records while a run goes on (`--metrics-addr`), on the jobs writer
/// thread: in batches, in each workload's order, a little after they were measured (at most
/// about [`FLUSH_AGE_NS`] while a loop waits for releases, 4× that under overload).
pub trait RecordObserver: Send + Sync {
    /// `records` of the run's workload `slot`, following the ones of its previous call.
    fn records(&self, slot: usize, records: &[JobRecord]);
}

/// A batch of one workload's records, for the writer.
struct Batch {
    slot: usize,
    records: Vec<JobRecord>,
}

/// Hands batches of one workload's records to the run's writer thread.
#[derive(Clone)]
pub struct BatchSender {
    slot: usize,
    tx: mpsc::Sender<Batch>,
}

impl BatchSender {
    /// Queues `records` for writing; never blocks and never touches a file.
    pub fn send(&self, records: &[JobRecord]) {
        if records.is_empty() {
            return;
        }
        // A writer that has stopped (a write failed) leaves the records in memory only; the
        // run's final files are written from memory anyway.
        let _ = self.tx.send(Batch {
            slot: self.slot,
            records: records.to_vec(),
        });
    }
}

/// The writer thread of one run and the channel to it.
pub struct JobsStream {
    tx: mpsc::Sender<Batch>,
    writer: JoinHandle<Result<(), String>>,
}

impl JobsStream {
    /// Creates `dir/jobs/` and one CSV per workload, each with its header (no files without
    /// `dir`), and starts the writer, which also shows every batch to `observer`.
    /// `names[slot]` is the workload of slot `slot`.
    pub fn start(
        dir: Option<&Path>,
        names: &[String],
        observer: Option<Arc<dyn RecordObserver>>,
    ) -> std::io::Result<JobsStream> {
        let mut files = Vec::with_capacity(names.len());
        if let Some(dir) = dir {
            let jobs = dir.join("jobs");
            std::fs::create_dir_all(&jobs)?;
            for name in names {
                let path = jobs.join(jobs_file_name(name));
                let mut f = File::create(&path)?;
                f.write_all(format!("{JOBS_CSV_HEADER}\n").as_bytes())?;
                files.push((path, f));
            }
        }
        let (tx, rx) = mpsc::channel::<Batch>();
        let writer = std::thread::Builder::new()
            .name("isolane:jobs-csv".into())
            .spawn(move || write_batches(rx, files, observer))?;
        Ok(JobsStream { tx, writer })
    }

    /// The sender for workload `slot`.
    pub fn sender(&self, slot: usize) -> BatchSender {
        BatchSender {
            slot,
            tx: self.tx.clone(),
        }
    }

    /// Waits until every batch sent so far is written (after every sender is dropped). `Err`
    /// says which file could not be written and why.
    pub fn finish(self) -> Result<(), String> {
        drop(self.tx);
        self.writer
            .join()
            .unwrap_or_else(|_| Err("the jobs CSV writer panicked".into()))
    }
}

/// The writer thread: shows each batch to the observer, then appends it to its workload's
/// file, one `write_all` per batch. After a failed write it stops writing files (the run's
/// final files are written from memory) but goes on feeding the observer.
fn write_batches(
    rx: mpsc::Receiver<Batch>,
    mut files: Vec<(PathBuf, File)>,
    observer: Option<Arc<dyn RecordObserver>>,
) -> Result<(), String> {
    let mut text = String::new();
    let mut failed = None;
    for batch in rx {
        if let Some(o) = &observer {
            o.records(batch.slot, &batch.records);
        }
        let Some((path, file)) = files.get_mut(batch.slot).filter(|_| failed.is_none()) else {
            continue;
        };
        text.clear();
        push_job_rows(&mut text, &batch.records);
        if let Err(e) = file.write_all(text.as_bytes()) {
            failed = Some(format!("{}: {e}", path.display()));
        }
    }
    failed.map_or(Ok(()), Err)
}

/// A release-loop sink that keeps every record in memory (for the summary) and hands them to
/// the writer in batches, while the loop waits for a release once [`FLUSH_RECORDS`] wait or the
/// oldest is [`FLUSH_AGE_NS`] old; under overload (no waiting) between jobs at 4× those bounds.
/// Pushing a record does not allocate (the vector is pre-sized); a batch costs one copy and one
/// channel send, never a file operation.
pub struct StreamingSink<'a> {
    pub records: Vec<JobRecord>,
    counter: Option<&'a std::sync::atomic::AtomicU64>,
    out: Option<BatchSender>,
    /// Records before this index have been handed to the writer.
    sent: usize,
    /// When the first record not yet sent was taken.
    oldest_ns: i64,
}

impl<'a> StreamingSink<'a> {
    pub fn new(
        capacity: usize,
        counter: Option<&'a std::sync::atomic::AtomicU64>,
        out: Option<BatchSender>,
    ) -> Self {
        StreamingSink {
            records: Vec::with_capacity(capacity),
            counter,
            out,
            sent: 0,
            oldest_ns: 0,
        }
    }

    /// Whether the records waiting pass `factor` × the flush bounds.
    fn due(&self, factor: i64) -> bool {
        let waiting = self.records.len() - self.sent;
        waiting > 0
            && (waiting >= FLUSH_RECORDS * factor as usize
                || clock::now_ns() - self.oldest_ns >= FLUSH_AGE_NS * factor)
    }

    /// Hands every record not yet sent to the writer.
    pub fn flush(&mut self) {
        if let Some(out) = &self.out {
            out.send(&self.records[self.sent..]);
        }
        self.sent = self.records.len();
    }
}

impl RecordSink for StreamingSink<'_> {
    fn record(&mut self, rec: &JobRecord) {
        self.records.push(*rec);
        if let Some(c) = self.counter {
            c.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        }
        if self.out.is_none() {
            return;
        }
        if self.records.len() - self.sent == 1 {
            self.oldest_ns = clock::now_ns();
        } else if self.due(BUSY_FACTOR) {
            self.flush();
        }
    }

    fn idle(&mut self, _until_ns: i64) {
        if self.due(1) {
            self.flush();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::output::read_jobs_csv;

    fn rec(index: u64) -> JobRecord {
        JobRecord {
            index,
            release_ns: index as i64 * 1_000_000,
            start_ns: Some(index as i64 * 1_000_000 + 10),
            end_ns: Some(index as i64 * 1_000_000 + 500_000),
            timeout: index % 2 == 1,
            held_ns: 0,
        }
    }

    #[test]
    fn batches_reach_each_workloads_file_in_order() {
        let dir = tempfile::tempdir().unwrap();
        let names = vec!["a".to_string(), "b c".to_string()];
        let stream = JobsStream::start(Some(dir.path()), &names, None).unwrap();
        let mut sink = StreamingSink::new(1000, None, Some(stream.sender(0)));
        for k in 0..600 {
            sink.record(&rec(k));
        }
        // 600 back to back: no idle time, so 1024 would be the bound; idle flushes past 256.
        assert_eq!(sink.sent, 0);
        sink.idle(0);
        assert_eq!(sink.sent, 600);
        sink.record(&rec(600));
        sink.idle(0);
        assert_eq!(sink.sent, 600, "one young record waits for more");
        sink.flush();
        stream.sender(1).send(&[rec(0)]);
        drop(sink);
        stream.finish().unwrap();
        let a = read_jobs_csv(&dir.path().join("jobs/a.csv")).unwrap();
        assert_eq!(a, (0..601).map(rec).collect::<Vec<_>>());
        let b = read_jobs_csv(&dir.path().join("jobs/b_c.csv")).unwrap();
        assert_eq!(b, vec![rec(0)]);
    }

    /// Keeps what it was shown, per slot.
    #[derive(Default)]
    struct Seen(std::sync::Mutex<Vec<(usize, u64)>>);

    impl RecordObserver for Seen {
        fn records(&self, slot: usize, records: &[JobRecord]) {
            let mut seen = self.0.lock().unwrap();
            seen.extend(records.iter().map(|r| (slot, r.index)));
        }
    }

    #[test]
    fn the_observer_sees_every_batch_in_order_with_or_without_files() {
        let dir = tempfile::tempdir().unwrap();
        for folder in [Some(dir.path()), None] {
            let seen = Arc::new(Seen::default());
            let names = vec!["a".to_string(), "b".to_string()];
            let stream = JobsStream::start(folder, &names, Some(seen.clone())).unwrap();
            let mut sink = StreamingSink::new(8, None, Some(stream.sender(1)));
            for k in 0..3 {
                sink.record(&rec(k));
            }
            sink.flush();
            stream.sender(0).send(&[rec(9)]);
            drop(sink);
            stream.finish().unwrap();
            let mut got = seen.0.lock().unwrap().clone();
            // The two slots' batches may interleave; each slot's own order is kept.
            got.sort_by_key(|(slot, _)| *slot);
            assert_eq!(got, vec![(0, 9), (1, 0), (1, 1), (1, 2)]);
        }
        assert_eq!(
            read_jobs_csv(&dir.path().join("jobs/b.csv")).unwrap().len(),
            3
        );
    }

    #[test]
    fn a_sink_without_a_writer_only_keeps_records() {
        let mut sink = StreamingSink::new(4, None, None);
        sink.record(&rec(0));
        sink.idle(0);
        assert_eq!(sink.records, vec![rec(0)]);
    }
}
