//! Limits up front: every count, size and rate that this machine cannot hold is refused with
//! exit code 2 and a message naming the field, the value and the limit, before any output
//! exists (docs/scenario.md and docs/runtime.md, "Limits").

mod common;

use std::path::Path;
use std::process::Output;

use common::*;

/// A batch no machine holds: 4e9 images of 3×224×224 are petabytes of activations.
const HUGE_BATCH: &str = "4000000000";

fn one_workload(lines: &str) -> String {
    format!("[[workload]]\nname = \"a\"\n{lines}")
}

/// `isolane run SCENARIO --out DIR` in a fresh folder: the output, and whether anything was
/// created there (the out folder or a runs/ folder).
fn run_scenario(text: &str) -> (Output, bool) {
    let tmp = tempfile::tempdir().unwrap();
    let sc = scenario(tmp.path(), "s.toml", text);
    let out = tmp.path().join("out");
    let o = isolane()
        .arg("run")
        .arg(&sc)
        .arg("--out")
        .arg(&out)
        .current_dir(tmp.path())
        .output()
        .unwrap();
    let created = out.exists() || tmp.path().join("runs").exists();
    (o, created)
}

/// Exit code 2 and a stderr holding every needle.
#[track_caller]
fn refused(o: &Output, needles: &[&str]) -> String {
    let stderr = String::from_utf8_lossy(&o.stderr).into_owned();
    assert_eq!(o.status.code(), Some(2), "{stderr}");
    for n in needles {
        assert!(stderr.contains(n), "expected {n:?} in:\n{stderr}");
    }
    stderr
}

#[test]
fn an_absurd_rate_is_refused_before_anything_runs() {
    let (o, created) = run_scenario(&one_workload(
        "model = \"spin:1ms\"\nrate_hz = 1e300\nduration_s = 1\n",
    ));
    refused(&o, &["s.toml:4:", "workload[0].rate_hz", "1e300", "<= 1e9"]);
    assert!(!created);
}

#[test]
fn job_records_beyond_this_machines_memory_are_refused() {
    let (o, created) = run_scenario(&one_workload(
        "model = \"spin:1ms\"\nrate_hz = 1000000000\njobs = 1000000000000\n",
    ));
    refused(
        &o,
        &[
            "job records",
            "workload `a`: 1000000000000 jobs (jobs)",
            "of this machine's memory",
        ],
    );
    assert!(!created);
    // Warm-up jobs count as well (it used to panic with a capacity overflow).
    let (o, created) = run_scenario(&one_workload(
        "model = \"spin:1ms\"\nrate_hz = 10\njobs = 1\nwarmup_jobs = 1000000000000\n",
    ));
    refused(&o, &["job records", "1000000000000 warm-up jobs"]);
    assert!(!created);
}

#[test]
fn a_too_large_warmup_names_the_real_bound() {
    let (o, created) = run_scenario(&one_workload(
        "model = \"spin:1ms\"\nrate_hz = 10\njobs = 1\nwarmup_jobs = 9223372036854775807\n",
    ));
    refused(
        &o,
        &[
            "workload[0].warmup_jobs",
            "9223372036854775807",
            "(at most 1000000000000)",
        ],
    );
    assert!(!created);
}

/// Issue 31: `jobs = 2` at `rate_hz = 1e-12` passed validation, then the release loop
/// overflowed computing the second release (1e21 ns); at 1e-9 Hz it waited 31 years. A count of
/// periods is bounded as a duration is.
#[test]
fn a_job_count_spanning_more_than_100_days_is_refused() {
    for rate in ["1e-12", "1e-9", "1e-7"] {
        let (o, created) = run_scenario(&one_workload(&format!(
            "model = \"spin:1ms\"\nrate_hz = {rate}\njobs = 2\n"
        )));
        refused(
            &o,
            &[
                "s.toml:5:",
                "workload[0].jobs",
                &format!(
                    "found 2 jobs at rate_hz = {:?}",
                    rate.parse::<f64>().unwrap()
                ),
                "at most 8.64e6 s (100 days)",
            ],
        );
        assert!(!created);
    }
    // 100 days exactly is allowed (checked without running it: `plan` validates).
    let tmp = tempfile::tempdir().unwrap();
    let sc = scenario(
        tmp.path(),
        "s.toml",
        &one_workload("model = \"spin:1ms\"\nrate_hz = 0.5\njobs = 4320000\n"),
    );
    let o = isolane().arg("plan").arg(&sc).output().unwrap();
    assert_eq!(
        o.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&o.stderr)
    );
}

/// Issue 31: `summarize` accepted NaN, negative and overflowing times, duplicate job indices
/// and index 2^63-1, and printed negative latencies with exit 0. Each is refused with exit 2,
/// naming the file, the line and the field, and no summary.json is written.
#[test]
fn summarize_refuses_malformed_records_by_file_line_and_field() {
    let header = "job,release_ms,start_ms,end_ms,latency_ms,timeout,held_ms";
    let good = "0,0.000000,0.001500,4.001500,4.001500,0,0";
    for (row, field) in [
        ("1,10.0,10.1,5.0,-5.0,0,0", "end_ms"),
        ("1,nan,10.1,15.0,5.0,0,0", "release_ms"),
        ("1,-10.0,10.1,15.0,25.0,0,0", "release_ms"),
        ("1,1e300,,,,1,0", "release_ms"),
        ("0,10.0,10.1,15.0,5.0,0,0", "job"),
        ("9223372036854775807,10.0,10.1,15.0,5.0,0,0", "job"),
        ("1,10.0,10.1,15.0,5.0,0,inf", "held_ms"),
    ] {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().join("run");
        std::fs::create_dir_all(dir.join("jobs")).unwrap();
        scenario(
            &dir,
            "scenario.toml",
            &one_workload("model = \"spin:1ms\"\nrate_hz = 100\njobs = 3\n"),
        );
        let csv = dir.join("jobs/a.csv");
        std::fs::write(&csv, format!("{header}\n{good}\n{row}\n")).unwrap();
        let o = isolane().arg("summarize").arg(&dir).output().unwrap();
        refused(
            &o,
            &[
                &format!("{}: line 3: field `{field}`", csv.display()),
                "expected",
            ],
        );
        assert!(!dir.join("summary.json").exists(), "{row}");
    }
}

/// Issue 31: `sweep concurrency --workloads 100000` found its limit (the job records of
/// 100000 closed-loop workloads) only once its first point ran: exit 1, and a folder left.
/// Every point's limits are checked before any output exists.
#[test]
fn a_sweep_beyond_its_limits_is_refused_before_any_output() {
    let tmp = tempfile::tempdir().unwrap();
    let out = tmp.path().join("sweep");
    let o = isolane()
        .args([
            "sweep",
            "concurrency",
            "--backend",
            "cpu",
            "--model",
            "spin:1ms",
            "--workloads",
            "100000",
            "--batch",
            "1",
            "--quiet",
            "--out",
        ])
        .arg(&out)
        .current_dir(tmp.path())
        .output()
        .unwrap();
    refused(&o, &["sweep point w100000-b01", "job records"]);
    assert!(!out.exists());
    assert!(!tmp.path().join("runs").exists());
}

#[test]
fn a_duration_too_short_for_any_job_is_refused() {
    let (o, created) = run_scenario(&one_workload(
        "model = \"spin:1ms\"\nrate_hz = 100\nduration_s = 1e-300\n",
    ));
    refused(
        &o,
        &["workload[0].duration_s", "1e-300", "from 1e-9 (1 ns)"],
    );
    assert!(!created);
}

#[test]
fn nan_and_infinity_are_refused() {
    for (line, field) in [
        ("rate_hz = nan\njobs = 1\n", "workload[0].rate_hz"),
        (
            "rate_hz = 10\njobs = 1\ndeadline_ms = inf\n",
            "workload[0].deadline_ms",
        ),
        (
            "rate_hz = 10\nduration_s = -inf\n",
            "workload[0].duration_s",
        ),
    ] {
        let (o, created) = run_scenario(&one_workload(&format!("model = \"spin:1ms\"\n{line}")));
        refused(&o, &[field, "finite"]);
        assert!(!created);
    }
}

#[test]
fn a_batch_beyond_this_machines_memory_is_refused_everywhere() {
    // run: refused before the output folder (and its scenario.toml) exists.
    let (o, created) = run_scenario(&one_workload(&format!(
        "model = \"resnet18\"\nbatch = {HUGE_BATCH}\nrate_hz = 1\njobs = 1\n"
    )));
    refused(
        &o,
        &[
            "workload `a`",
            &format!("batch = {HUGE_BATCH}: needs at least"),
            "for its activations",
            "this machine's memory",
        ],
    );
    assert!(!created);
    // infer and maxrate, named by their flag.
    let o = isolane()
        .args([
            "infer", "--model", "resnet18", "--random", "--batch", HUGE_BATCH,
        ])
        .output()
        .unwrap();
    refused(
        &o,
        &[&format!("--batch {HUGE_BATCH}: needs at least"), "memory"],
    );
    let o = isolane()
        .args(["maxrate", "--model", "resnet18", "--batch", HUGE_BATCH])
        .output()
        .unwrap();
    let stderr = refused(&o, &[&format!("--batch {HUGE_BATCH}: needs at least")]);
    assert!(!stderr.contains("workload"), "{stderr}");
}

#[test]
fn more_threads_than_cores_are_refused() {
    for cmd in [
        &[
            "infer",
            "--model",
            "resnet18",
            "--random",
            "--threads",
            "100000",
        ][..],
        &[
            "bench",
            "--backend",
            "cpu",
            "--model",
            "resnet18",
            "--threads",
            "100000",
        ][..],
    ] {
        let o = isolane().args(cmd).output().unwrap();
        refused(
            &o,
            &[
                "--threads 100000",
                "CPU core(s)",
                "expected 0 (one thread per core) to",
            ],
        );
    }
}

#[test]
fn maxrate_speaks_in_flags_not_in_a_generated_file() {
    let o = isolane()
        .args(["maxrate", "--model", "foo"])
        .output()
        .unwrap();
    let stderr = refused(&o, &["--model: unknown model \"foo\""]);
    assert!(
        !stderr.contains("generated scenario") && !stderr.contains("workload[0]"),
        "{stderr}"
    );
    let o = isolane()
        .args([
            "maxrate",
            "--model",
            "spin:1ms",
            "--warmup",
            "18446744073709551615",
        ])
        .output()
        .unwrap();
    refused(
        &o,
        &[
            "--warmup: found integer 18446744073709551615",
            "(at most 1000000000000)",
        ],
    );
    let o = isolane()
        .args(["maxrate", "--model", "spin:1ms", "--jobs", "1000000000000"])
        .output()
        .unwrap();
    refused(&o, &["--jobs 1000000000000", "job records"]);
}

/// Occurrences of `needle` in `hay`.
fn count(hay: &str, needle: &str) -> usize {
    hay.matches(needle).count()
}

#[test]
fn an_unusable_out_folder_is_the_users_mistake_said_once() {
    let tmp = tempfile::tempdir().unwrap();
    let sc = scenario(
        tmp.path(),
        "s.toml",
        &one_workload("model = \"spin:1ms\"\nrate_hz = 100\njobs = 2\n"),
    );
    // A folder below a plain file cannot exist, whoever runs the test (root included).
    let file = tmp.path().join("file.txt");
    std::fs::write(&file, "x").unwrap();
    let out = file.join("out");
    let o = isolane()
        .arg("run")
        .arg(&sc)
        .arg("--out")
        .arg(&out)
        .output()
        .unwrap();
    let stderr = refused(
        &o,
        &["cannot use", "as the output folder", "choose an --out"],
    );
    assert!(stderr.contains(&out.display().to_string()), "{stderr}");
    assert_eq!(count(&stderr, "Not a directory"), 1, "{stderr}");
    assert!(!Path::new(&out).exists());
}

/// Data rows of a jobs CSV (header excluded) as text, and whether the file ends on a newline.
fn csv_rows(path: &Path) -> (Vec<String>, bool) {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    let rows = text.lines().skip(1).map(str::to_string).collect();
    (rows, text.ends_with('\n'))
}

#[test]
fn a_killed_run_keeps_its_measured_jobs_and_summarize_rebuilds_the_summary() {
    let tmp = tempfile::tempdir().unwrap();
    // Long enough that the kill always comes first; one thread-hosted and one process-hosted
    // workload, so both ways records reach the coordinator stream to the CSV.
    let sc = scenario(
        tmp.path(),
        "k.toml",
        "[[workload]]\nname = \"t\"\nmodel = \"spin:1ms\"\nrate_hz = 200\nduration_s = 120\n\
         warmup_jobs = 2\n\n\
         [[workload]]\nname = \"p\"\nmodel = \"spin:1ms\"\nrate_hz = 100\nduration_s = 120\n\
         warmup_jobs = 2\nhost = \"process\"\n",
    );
    let out = tmp.path().join("out");
    let mut child = isolane()
        .arg("run")
        .arg(&sc)
        .arg("--out")
        .arg(&out)
        .arg("--quiet")
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    // Poll until both workloads' first batches are on disk (no blind sleep); bounded so that a
    // run that never streams fails the test instead of hanging it.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(90);
    let csv = |name: &str| out.join("jobs").join(format!("{name}.csv"));
    while csv_rows(&csv("t")).0.len() < 10 || csv_rows(&csv("p")).0.len() < 10 {
        assert!(
            std::time::Instant::now() < deadline,
            "no streamed records within 90 s"
        );
        assert!(child.try_wait().unwrap().is_none(), "the run ended early");
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    child.kill().unwrap(); // SIGKILL: no handler runs, nothing is written at the end.
    child.wait().unwrap();
    assert!(!out.join("summary.json").exists());

    // Every row on disk is a whole record, in job order (a row cut by the kill is the only
    // exception `summarize` tolerates, and it can only be the last one).
    let mut kept = Vec::new();
    for name in ["t", "p"] {
        let (rows, ends_whole) = csv_rows(&csv(name));
        let whole = if ends_whole {
            rows.len()
        } else {
            rows.len() - 1
        };
        for (k, row) in rows[..whole].iter().enumerate() {
            let fields: Vec<&str> = row.split(',').collect();
            assert_eq!(fields.len(), 7, "{name}: row {k}: {row}");
            assert_eq!(fields[0], k.to_string(), "{name}: rows in job order");
        }
        kept.push(whole);
    }

    let o = isolane().arg("summarize").arg(&out).output().unwrap();
    let stderr = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(0), "{stderr}");
    assert!(stderr.contains("the run was cut short"), "{stderr}");
    let s = summary(&out);
    assert_eq!(s["complete"], false);
    assert_eq!(s["status"], "interrupted");
    for (name, whole) in ["t", "p"].iter().zip(kept) {
        let w = workload(&s, name);
        assert_eq!(w["jobs"].as_u64(), Some(whole as u64), "{name}");
        assert_eq!(w["status"], "interrupted");
        assert!(f(&w["latency_ms"]["p50"]) >= 1.0, "{w}");
    }
    // The report says the run was cut short.
    let o = isolane()
        .arg("report")
        .arg(&out)
        .arg("--out")
        .arg(tmp.path().join("r.html"))
        .output()
        .unwrap();
    if o.status.success() {
        let html = std::fs::read_to_string(tmp.path().join("r.html")).unwrap();
        assert!(
            html.contains("CUT SHORT"),
            "report without the cut-short note"
        );
    } else {
        panic!("report failed: {}", String::from_utf8_lossy(&o.stderr));
    }
    // A second summarize would replace a summary: refused without --force.
    let o = isolane().arg("summarize").arg(&out).output().unwrap();
    assert_eq!(o.status.code(), Some(2));
}

#[test]
fn a_closed_loop_spin_run_that_would_outgrow_memory_is_refused() {
    // 100 days of 1 µs jobs, back to back: 8.6e12 records.
    let (o, created) = run_scenario(&one_workload(
        "model = \"spin:1us\"\nrate_hz = \"max\"\nduration_s = 8640000\n",
    ));
    refused(
        &o,
        &["job records", "(duration_s / the spin time, closed loop)"],
    );
    assert!(!created);
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn a_batch_beyond_the_gpus_memory_is_refused_by_the_cuda_plan() {
    // resnet50 at fp16, batch 100000: about 57 GiB of pinned input on the host (fits the GPU
    // machines' 128 GiB) but hundreds of GiB of activation arena, more than any GPU has.
    let o = isolane()
        .args([
            "infer",
            "--model",
            "resnet50",
            "--backend",
            "cuda",
            "--precision",
            "fp16",
            "--random",
            "--batch",
            "100000",
        ])
        .output()
        .unwrap();
    refused(
        &o,
        &[
            "--batch 100000: needs at least",
            "for its activation arena",
            "GPU 0's memory",
        ],
    );
}

#[test]
fn duration_flags_are_bounded_like_scenario_durations() {
    let tmp = tempfile::tempdir().unwrap();
    let sc = scenario(
        tmp.path(),
        "s.toml",
        &one_workload("model = \"spin:1ms\"\nrate_hz = 100\njobs = 2\n"),
    );
    // verify used to panic converting 1e300 s to a Duration.
    let o = isolane()
        .arg("verify")
        .arg(&sc)
        .args(["--duration-s", "1e300"])
        .output()
        .unwrap();
    refused(&o, &["--duration-s 1e300", "at most 8.64e6 (100 days)"]);
    // sweep named its own staging file and field; the flag is checked as given.
    let o = isolane()
        .args([
            "sweep",
            "partition",
            "--model",
            "spin:1ms",
            "--mechanism",
            "green",
            "--backend",
            "cpu",
            "--duration-s",
            "1e300",
        ])
        .current_dir(tmp.path())
        .output()
        .unwrap();
    let stderr = refused(&o, &["--duration-s", "1e300", "(100 days)"]);
    assert!(!stderr.contains("scenario.toml"), "{stderr}");
    let o = isolane()
        .args([
            "sweep",
            "partition",
            "--model",
            "spin:1ms",
            "--mechanism",
            "green",
            "--backend",
            "cpu",
            "--rate",
            "1e300",
        ])
        .current_dir(tmp.path())
        .output()
        .unwrap();
    refused(&o, &["--rate", "above 1e9 Hz"]);
}

#[test]
fn a_closed_loop_model_is_checked_against_memory_once_its_warm_up_timed_it() {
    // A real model's service time is known only once it runs: after the warm-up, before t0,
    // 100 days of back-to-back jobs of this tiny network (well under a ms each) are refused
    // instead of growing until an out-of-memory abort. Both hosts check.
    let model = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("crates/isolane-engine/tests/fixtures/onnx/tiny_cnn_op14.onnx");
    let workload = |name: &str, host: &str| {
        format!(
            "[[workload]]\nname = \"{name}\"\nmodel = \"{}\"\nrate_hz = \"max\"\n\
             duration_s = 8640000\nwarmup_jobs = 3\nhost = \"{host}\"\n\n",
            model.display()
        )
    };
    let (o, _) = run_scenario(&(workload("t", "thread") + &workload("p", "process")));
    let stderr = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(1), "{stderr}");
    for name in ["t", "p"] {
        assert!(
            stderr.contains(&format!("workload `{name}` failed: the job records"))
                && stderr.contains("closed loop"),
            "{stderr}"
        );
    }
}

// Issue 31, bad input campaign: output files, input files, error output.

/// A finished run's folder (5 `spin:` jobs) in `tmp`.
fn finished_run(tmp: &Path) -> std::path::PathBuf {
    let sc = scenario(
        tmp,
        "run.toml",
        "[[workload]]\nname = \"a\"\nmodel = \"spin:1ms\"\nrate_hz = 100\njobs = 5\n",
    );
    let out = tmp.join("run");
    run_ok(isolane().arg("run").arg(&sc).arg("--out").arg(&out));
    out
}

fn mkfifo(path: &Path) {
    assert!(std::process::Command::new("mkfifo")
        .arg(path)
        .status()
        .unwrap()
        .success());
}

/// The machine's own devices, as every test must leave them.
fn devices_intact() {
    use std::os::unix::fs::FileTypeExt;
    for d in ["/dev/null", "/dev/full"] {
        let t = std::fs::symlink_metadata(d).unwrap().file_type();
        assert!(t.is_char_device(), "{d} is no longer a character device");
    }
}

#[test]
fn output_files_replace_only_regular_files_and_make_no_folders() {
    use std::os::unix::fs::FileTypeExt;
    let tmp = tempfile::tempdir().unwrap();
    let run = finished_run(tmp.path());
    // A FIFO (and a link to one) is refused, and stays a FIFO.
    let fifo = tmp.path().join("fifo");
    mkfifo(&fifo);
    let link = tmp.path().join("link");
    std::os::unix::fs::symlink(&fifo, &link).unwrap();
    for out in [&fifo, &link] {
        for cmd in ["trace", "report"] {
            let o = isolane()
                .arg(cmd)
                .arg(&run)
                .arg("--out")
                .arg(out)
                .output()
                .unwrap();
            refused(&o, &["FIFO", "not a regular file"]);
        }
    }
    assert!(std::fs::symlink_metadata(&fifo)
        .unwrap()
        .file_type()
        .is_fifo());
    assert!(std::fs::symlink_metadata(&link)
        .unwrap()
        .file_type()
        .is_symlink());
    // A missing folder is named, and not made.
    let missing = tmp.path().join("no-such/report.html");
    let o = isolane()
        .args(["report"])
        .arg(&run)
        .arg("-o")
        .arg(&missing)
        .output()
        .unwrap();
    refused(&o, &["no-such does not exist"]);
    assert!(!tmp.path().join("no-such").exists());
    // A link to a regular file is written through, and stays a link.
    let target = tmp.path().join("target.json");
    std::fs::write(&target, "old").unwrap();
    let to_file = tmp.path().join("to-file.json");
    std::os::unix::fs::symlink(&target, &to_file).unwrap();
    run_ok(isolane().arg("trace").arg(&run).arg("-o").arg(&to_file));
    assert!(std::fs::read_to_string(&target)
        .unwrap()
        .contains("traceEvents"));
    assert!(std::fs::symlink_metadata(&to_file)
        .unwrap()
        .file_type()
        .is_symlink());
    // A character device is written through, never replaced.
    devices_intact();
    run_ok(isolane().arg("trace").arg(&run).arg("-o").arg("/dev/null"));
    devices_intact();
}

#[test]
fn an_output_never_replaces_a_runs_records_or_the_commands_own_input() {
    let tmp = tempfile::tempdir().unwrap();
    let run = finished_run(tmp.path());
    let records = ["summary.json", "workloads.csv", "jobs/a.csv"];
    let before: Vec<Vec<u8>> = records
        .iter()
        .map(|f| std::fs::read(run.join(f)).unwrap())
        .collect();
    for cmd in ["trace", "report"] {
        for f in records {
            let o = isolane()
                .arg(cmd)
                .arg(&run)
                .arg("--out")
                .arg(run.join(f))
                .output()
                .unwrap();
            refused(&o, &[f, "a record of the results folder"]);
        }
    }
    for (f, was) in records.iter().zip(&before) {
        assert_eq!(&std::fs::read(run.join(f)).unwrap(), was, "{f} changed");
    }
    // A saved plan written through a link to the model it is built from.
    let onnx = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("crates/isolane-engine/tests/fixtures/onnx/tiny_cnn_op14.onnx");
    let model = tmp.path().join("m.onnx");
    std::fs::copy(&onnx, &model).unwrap();
    let model_bytes = std::fs::read(&model).unwrap();
    let link = tmp.path().join("m.isoplan");
    std::os::unix::fs::symlink(&model, &link).unwrap();
    let o = isolane()
        .args(["build", "--device", "cpu", "--out"])
        .arg(&link)
        .arg(&model)
        .output()
        .unwrap();
    refused(&o, &["same file as the model"]);
    assert_eq!(std::fs::read(&model).unwrap(), model_bytes);
    // infer's output over its own input.
    let input = tmp.path().join("x.npy");
    std::fs::copy(onnx.with_file_name("tiny_cnn_op14.input.npy"), &input).unwrap();
    let input_bytes = std::fs::read(&input).unwrap();
    let o = isolane()
        .args(["infer", "--threads", "1", "--model"])
        .arg(&model)
        .arg("--input")
        .arg(&input)
        .arg("--save-output")
        .arg(&input)
        .output()
        .unwrap();
    refused(&o, &["--save-output is the same file as the input"]);
    assert_eq!(std::fs::read(&input).unwrap(), input_bytes);
    // A built-in model's name is no file: an earlier output of that name may be replaced.
    std::fs::write(tmp.path().join("mobilenet_v2"), "earlier").unwrap();
    run_ok(
        isolane()
            .args([
                "infer",
                "--threads",
                "1",
                "--random",
                "--model",
                "mobilenet_v2",
            ])
            .args(["--save-output", "mobilenet_v2"])
            .current_dir(tmp.path()),
    );
}

/// `cmd`'s output, or a failed test (and the process killed) when it runs past `limit`: a
/// reader that blocks must fail its test, not hang the suite.
fn output_within(cmd: &mut std::process::Command, limit: std::time::Duration) -> Output {
    use std::process::Stdio;
    let child = cmd
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let pid = child.id();
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(child.wait_with_output());
    });
    match rx.recv_timeout(limit) {
        Ok(o) => o.unwrap(),
        Err(_) => {
            let _ = std::process::Command::new("kill")
                .args(["-KILL", &pid.to_string()])
                .status();
            panic!("{cmd:?} still ran after {limit:?}");
        }
    }
}

/// A jobs CSV made a FIFO by hand blocked `isolane compare` forever (it waited for a writer),
/// and a FIFO, a link to /dev/zero or a folder in its place was taken as missing: `report` and
/// `trace` left the workload's jobs out, and `summarize --force` wrote over summary.json one
/// saying the run was cut short. Every reader now refuses it, naming the file and what it is.
#[test]
fn a_record_that_is_no_regular_file_is_refused_by_every_reader() {
    use std::time::Duration;
    let tmp = tempfile::tempdir().unwrap();
    let run = finished_run(tmp.path());
    let jobs = run.join("jobs/a.csv");
    std::fs::remove_file(&jobs).unwrap();
    let summary = std::fs::read(run.join("summary.json")).unwrap();
    let html = tmp.path().join("r.html");
    let trace = tmp.path().join("t.json");
    for what in ["FIFO", "character device", "folder"] {
        match what {
            "FIFO" => mkfifo(&jobs),
            "character device" => std::os::unix::fs::symlink("/dev/zero", &jobs).unwrap(),
            _ => std::fs::create_dir(&jobs).unwrap(),
        }
        let commands: [Vec<&std::ffi::OsStr>; 5] = [
            vec!["compare".as_ref(), run.as_os_str(), run.as_os_str()],
            vec![
                "report".as_ref(),
                run.as_os_str(),
                "-o".as_ref(),
                html.as_os_str(),
            ],
            vec![
                "trace".as_ref(),
                run.as_os_str(),
                "-o".as_ref(),
                trace.as_os_str(),
            ],
            vec!["explain".as_ref(), run.as_os_str()],
            vec!["summarize".as_ref(), "--force".as_ref(), run.as_os_str()],
        ];
        for args in commands {
            let o = output_within(isolane().args(&args), Duration::from_secs(120));
            refused(
                &o,
                &["jobs/a.csv", &format!("is a {what}"), "not a regular file"],
            );
        }
        assert_eq!(std::fs::read(run.join("summary.json")).unwrap(), summary);
        assert!(!html.exists() && !trace.exists());
        match what {
            "folder" => std::fs::remove_dir(&jobs).unwrap(),
            _ => std::fs::remove_file(&jobs).unwrap(),
        }
    }
    devices_intact();
}

/// A trace window past the run's end once wrote an empty trace and exited 0.
#[test]
fn a_trace_window_without_jobs_is_refused_naming_the_runs_span() {
    let tmp = tempfile::tempdir().unwrap();
    let run = finished_run(tmp.path());
    let out = tmp.path().join("t.json");
    let o = isolane()
        .arg("trace")
        .arg(&run)
        .args(["--from-ms", "99999999", "-o"])
        .arg(&out)
        .output()
        .unwrap();
    refused(
        &o,
        &["no job of the run is in that window", "its jobs run from"],
    );
    assert!(!out.exists());
    run_ok(
        isolane()
            .arg("trace")
            .arg(&run)
            .args(["--from-ms", "0", "-o"])
            .arg(&out),
    );
}

/// explain's --memory file, missing or wrong, is named with its flag.
#[test]
fn explain_names_a_bad_memory_file_by_its_flag() {
    let tmp = tempfile::tempdir().unwrap();
    let run = finished_run(tmp.path());
    let missing = tmp.path().join("nosuch.toml");
    let o = isolane()
        .arg("explain")
        .arg(&run)
        .arg("--memory")
        .arg(&missing)
        .output()
        .unwrap();
    refused(&o, &["--memory ", "nosuch.toml"]);
}

#[test]
fn an_output_file_under_proc_gets_one_clear_message() {
    let tmp = tempfile::tempdir().unwrap();
    let run = finished_run(tmp.path());
    let o = isolane()
        .arg("trace")
        .arg(&run)
        .arg("--out")
        .arg("/proc/x.json")
        .output()
        .unwrap();
    let stderr = refused(&o, &["/proc/x.json"]);
    // The OS error once, and no word of disk space.
    let os_error = stderr.find("(os error").expect(&stderr);
    assert!(!stderr[os_error + 1..].contains("(os error"), "{stderr}");
    assert!(
        !stderr.contains("free") && !stderr.contains("  "),
        "{stderr}"
    );
    let o = isolane()
        .args(["run", "--out", "/proc/x"])
        .current_dir(tmp.path())
        .output()
        .unwrap();
    let stderr = refused(&o, &["/proc/x"]);
    assert!(!stderr.contains("free"), "{stderr}");
}

#[test]
fn a_closed_stdout_ends_quietly() {
    let tmp = tempfile::tempdir().unwrap();
    let run = finished_run(tmp.path());
    // `trace DIR | head -c 0`: the reader is gone before anything is printed.
    let mut child = isolane()
        .arg("trace")
        .arg(&run)
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    drop(child.stdout.take());
    let o = child.wait_with_output().unwrap();
    let stderr = String::from_utf8_lossy(&o.stderr);
    assert_ne!(o.status.code(), Some(101), "{stderr}");
    assert!(!stderr.contains("panicked"), "{stderr}");
    use std::os::unix::process::ExitStatusExt;
    assert_eq!(o.status.signal(), Some(libc::SIGPIPE), "{stderr}");
}

#[test]
fn a_scenario_through_a_pipe_is_read_once() {
    // An [[app]] scenario on stdin used to run nothing and say ok: its apps were read from a
    // second, empty read of the pipe.
    let app = "[[app]]\nname = \"a\"\ndeadline_ms = 500\nframes = 30\n[app.source]\n\
               kind = \"synthetic\"\nwidth = 32\nheight = 32\nfps = 100\n[[app.stage]]\n\
               name = \"pre\"\nkind = \"preprocess\"\nsize = [8, 8]\n[[app.stage]]\n\
               name = \"out\"\nkind = \"sink\"\n";
    let tmp = tempfile::tempdir().unwrap();
    let out = tmp.path().join("out");
    let mut child = isolane()
        .args(["run", "/dev/stdin", "--out"])
        .arg(&out)
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    use std::io::Write as _;
    child
        .stdin
        .take()
        .unwrap()
        .write_all(app.as_bytes())
        .unwrap();
    let o = child.wait_with_output().unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let s = summary(&out);
    assert_eq!(s["apps"][0]["name"], "a", "{s}");
    assert!(out.join("apps/a.csv").is_file());
    // A named FIFO: read once, so no second open waits for a writer that never comes.
    let fifo = tmp.path().join("s.toml");
    mkfifo(&fifo);
    let writer = {
        let fifo = fifo.clone();
        std::thread::spawn(move || {
            std::fs::write(
                &fifo,
                "[[workload]]\nname = \"a\"\nmodel = \"spin:1ms\"\nrate_hz = 10\njobs = 1\n",
            )
            .unwrap()
        })
    };
    let o = isolane().arg("plan").arg(&fifo).output().unwrap();
    writer.join().unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
}

#[test]
fn an_endless_scenario_file_is_refused_at_the_cap() {
    let (o, created) = {
        let tmp = tempfile::tempdir().unwrap();
        let out = tmp.path().join("out");
        let o = isolane()
            .args(["run", "/dev/zero", "--out"])
            .arg(&out)
            .output()
            .unwrap();
        (o, out.exists())
    };
    refused(
        &o,
        &[
            "/dev/zero: cannot read the scenario file",
            "larger than 16 MiB",
        ],
    );
    assert!(!created);
}

#[test]
fn thousands_of_problems_print_a_bounded_list() {
    let mut text = one_workload("model = \"spin:1ms\"\nrate_hz = 10\njobs = 5\n");
    for k in 0..20_000 {
        text += &format!("unknown_{k} = 1\n");
    }
    let (o, created) = run_scenario(&text);
    let stderr = refused(&o, &["unknown_0", "and 19950 more problem(s), not shown"]);
    assert!(
        stderr.lines().count() <= 60,
        "{} lines",
        stderr.lines().count()
    );
    assert!(!created);
}
