//! Programs on the CPU: ends, deadlines, the stop flag, output files and leftovers. Times are
//! checked only from below or with wide margins (2 loaded cores).

use super::*;
use std::collections::BTreeMap;

fn spec(command: &[&str], duration_s: Option<f64>, timeout_s: Option<f64>) -> ProgramSpec {
    ProgramSpec {
        command: command.iter().map(|s| s.to_string()).collect(),
        env: BTreeMap::new(),
        cwd: None,
        duration_s,
        timeout_s,
    }
}

fn run(spec: &ProgramSpec, dir: Option<&Path>, stop: &AtomicBool) -> ProgramOutcome {
    let launch = ProgramLaunch {
        name: "p",
        spec,
        cpu: &[],
        partition_env: &[("ISOLANE_TEST_PARTITION".into(), "mps 25%".into())],
        out_dir: dir,
    };
    run_program(&launch, clock::now_ns(), stop, &|_| {})
}

fn alive(pid: u32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .ok()
        .and_then(|s| stat_state_and_group(&s))
        .is_some_and(|(state, _)| state != 'Z' && state != 'X')
}

#[test]
fn a_program_that_succeeds_writes_its_output_and_environment_to_files() {
    let dir = tempfile::tempdir().unwrap();
    let mut s = spec(
        &[
            "sh",
            "-c",
            "sleep 0.2; echo hi; echo \"$GREETING $ISOLANE_TEST_PARTITION\" >&2",
        ],
        None,
        Some(60.0),
    );
    s.env.insert("GREETING".into(), "hello".into());
    let o = run(&s, Some(dir.path()), &AtomicBool::new(false));
    assert_eq!(o.end, ProgramEnd::Exited, "{o:?}");
    assert_eq!((o.exit_code, o.signal), (Some(0), None));
    assert_eq!(o.failure(&s), None);
    assert!(o.wall_s() >= 0.19, "{}", o.wall_s());
    assert_eq!(
        o.pids.first().copied(),
        o.pids.first().copied().filter(|&p| p > 0)
    );
    let out = std::fs::read_to_string(dir.path().join("p.stdout")).unwrap();
    let err = std::fs::read_to_string(dir.path().join("p.stderr")).unwrap();
    assert_eq!(out, "hi\n");
    assert_eq!(err, "hello mps 25%\n");
}

#[test]
fn a_failing_program_reports_its_exit_status() {
    let s = spec(&["sh", "-c", "exit 3"], None, None);
    let o = run(&s, None, &AtomicBool::new(false));
    assert_eq!((o.end, o.exit_code), (ProgramEnd::Exited, Some(3)));
    assert_eq!(
        o.failure(&s).as_deref(),
        Some("the program exited with status 3")
    );
}

#[test]
fn a_program_killed_by_a_signal_says_which() {
    let s = spec(&["sh", "-c", "kill -SEGV $$"], None, None);
    let o = run(&s, None, &AtomicBool::new(false));
    assert_eq!((o.end, o.signal), (ProgramEnd::Killed, Some(libc::SIGSEGV)));
    assert!(o.failure(&s).unwrap().contains("SIGSEGV"));
}

#[test]
fn a_hanging_program_is_stopped_at_its_timeout() {
    let s = spec(&["sleep", "100"], None, Some(0.3));
    let o = run(&s, None, &AtomicBool::new(false));
    assert_eq!(o.end, ProgramEnd::TimedOut, "{o:?}");
    assert_eq!(o.signal, Some(libc::SIGTERM));
    assert!(o.wall_s() >= 0.29 && o.wall_s() < 30.0, "{}", o.wall_s());
    assert!(o.failure(&s).unwrap().starts_with("timed out"));
}

#[test]
fn a_program_with_a_duration_is_stopped_then_and_that_is_a_success() {
    let s = spec(&["sleep", "100"], Some(0.2), Some(60.0));
    let o = run(&s, None, &AtomicBool::new(false));
    assert_eq!(o.end, ProgramEnd::StoppedAtDuration, "{o:?}");
    assert_eq!(o.failure(&s), None);
}

#[test]
fn a_program_ignoring_sigterm_is_killed_after_the_grace() {
    let s = spec(
        &["sh", "-c", "trap '' TERM; while :; do sleep 0.05; done"],
        Some(0.1),
        None,
    );
    let o = run(&s, None, &AtomicBool::new(false));
    assert_eq!(o.end, ProgramEnd::StoppedAtDuration);
    assert_eq!(o.signal, Some(libc::SIGKILL));
    assert!(o.wall_s() >= STOP_GRACE.as_secs_f64(), "{}", o.wall_s());
}

#[test]
fn the_stop_flag_interrupts_a_program() {
    let s = spec(&["sleep", "100"], None, None);
    let stop = AtomicBool::new(true);
    let o = run(&s, None, &stop);
    assert_eq!(o.end, ProgramEnd::Interrupted);
    assert_eq!(o.failure(&s), None);
}

#[test]
fn what_a_program_leaves_running_is_stopped_and_its_pids_are_known() {
    let dir = tempfile::tempdir().unwrap();
    // The background sleep outlives its shell unless isolane stops it.
    let s = spec(&["sh", "-c", "sleep 100 & echo $!; sleep 0.5"], None, None);
    let o = run(&s, Some(dir.path()), &AtomicBool::new(false));
    assert_eq!((o.end, o.exit_code), (ProgramEnd::Exited, Some(0)));
    let out = std::fs::read_to_string(dir.path().join("p.stdout")).unwrap();
    let child: u32 = out.trim().parse().unwrap();
    assert!(o.pids.contains(&child), "{:?} lacks {child}", o.pids);
    // Reaped by init or a subreaper soon after SIGTERM; a zombie counts as gone.
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    while alive(child) && std::time::Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(20));
    }
    assert!(
        !alive(child),
        "the program's background child {child} was left running"
    );
}

#[test]
fn cpu_time_is_measured() {
    let s = spec(
        &[
            "sh",
            "-c",
            "i=0; while [ $i -lt 20000 ]; do i=$((i+1)); done",
        ],
        None,
        None,
    );
    let o = run(&s, None, &AtomicBool::new(false));
    assert_eq!(o.exit_code, Some(0));
    assert!(o.usage.user_s + o.usage.system_s > 0.0, "{:?}", o.usage);
    assert!(o.usage.max_rss_mib > 0.0);
}

#[test]
fn a_program_that_cannot_start_says_why() {
    let s = spec(&["/no/such/program"], None, None);
    let o = run(&s, None, &AtomicBool::new(false));
    assert_eq!(o.end, ProgramEnd::NotStarted);
    let why = o.failure(&s).unwrap();
    assert!(why.contains("cannot start `/no/such/program`"), "{why}");
}

#[test]
fn stat_lines_with_odd_command_names_parse() {
    let line = "42 (a (b) c) S 1 42 42 0 -1 4194560";
    assert_eq!(stat_state_and_group(line), Some(('S', 42)));
    assert_eq!(stat_state_and_group("garbage"), None);
}
