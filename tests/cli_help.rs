//! What the command line says about itself: one flag name per concept, help texts that match
//! the flags, the no-GPU hints, shell completions and man pages generated from the definition.

mod common;

use common::*;

fn text(args: &[&str]) -> (Option<i32>, String, String) {
    let o = isolane().args(args).output().unwrap();
    (
        o.status.code(),
        String::from_utf8_lossy(&o.stdout).into_owned(),
        String::from_utf8_lossy(&o.stderr).into_owned(),
    )
}

#[test]
fn join_mps_is_one_flag_and_the_old_verify_name_still_parses() {
    for cmd in [
        &["run"][..],
        &["verify"],
        &["sweep", "partition"],
        &["sweep", "concurrency"],
    ] {
        let (_, help, _) = text(&[cmd, &["--help"]].concat());
        assert!(help.contains("--join-mps"), "{cmd:?}:\n{help}");
        assert!(!help.contains("--mps-join-existing\n"), "{cmd:?}:\n{help}");
    }
    // The old name is a hidden alias: parsing gets past it (to the missing scenario file).
    let (code, _, err) = text(&["verify", "/no/such.toml", "--mps-join-existing"]);
    assert_eq!(code, Some(2), "{err}");
    assert!(!err.contains("unexpected argument"), "{err}");
    assert!(err.contains("/no/such.toml"), "{err}");
}

#[test]
fn sweep_concurrency_help_names_only_its_own_flags() {
    let (_, help, _) = text(&["sweep", "concurrency", "--help"]);
    assert!(!help.contains("--device-model"), "{help}");
    let (_, help, _) = text(&["sweep", "partition", "--help"]);
    assert!(help.contains("--device-model"), "{help}");
}

#[test]
fn plan_help_lists_the_no_gpu_exit_code() {
    let (_, help, _) = text(&["plan", "--help"]);
    let help = help.split_whitespace().collect::<Vec<_>>().join(" ");
    assert!(
        help.contains("1 no GPU here to plan a backend = \"cuda\" scenario for"),
        "{help}"
    );
}

#[test]
fn bench_without_a_gpu_falls_back_to_the_cpu_as_run_does() {
    if std::path::Path::new("/dev/nvidiactl").exists() {
        return; // a GPU machine benches on the GPU
    }
    // Issue 31: the default backend was cuda, so a plain `bench` failed (exit 1) where `run`
    // falls back with a note.
    let (code, out, err) = text(&[
        "bench",
        "--model",
        "resnet18",
        "--replays",
        "1",
        "--warmup",
        "0",
        "--json",
    ]);
    assert_eq!(code, Some(0), "{err}");
    assert!(
        err.contains("note: measuring on the CPU backend: cuda cannot run here"),
        "{err}"
    );
    assert!(out.contains(r#""backend":"cpu""#), "{out}");
    // Asking for cuda still insists on it, and says what to do instead.
    let (code, _, err) = text(&[
        "bench",
        "--model",
        "resnet18",
        "--replays",
        "1",
        "--backend",
        "cuda",
    ]);
    assert_eq!(code, Some(1), "{err}");
    assert!(err.contains("--backend cpu"), "{err}");
}

#[test]
fn completions_and_man_pages_come_from_the_cli_definition() {
    let (code, bash, _) = text(&["completions", "bash"]);
    assert_eq!(code, Some(0));
    for word in ["maxrate", "--join-mps", "--wide", "completions"] {
        assert!(
            bash.contains(word),
            "{word} missing from the bash completions"
        );
    }
    let (code, _, err) = text(&["completions", "tcsh"]);
    assert_eq!(code, Some(2), "{err}");

    let (code, page, _) = text(&["man"]);
    assert_eq!(code, Some(0));
    assert!(
        page.contains(".TH isolane 1") && page.contains("maxrate"),
        "{page}"
    );
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("man1");
    let (code, said, err) = text(&["man", "--out", out.to_str().unwrap()]);
    assert_eq!(code, Some(0), "{err}");
    assert!(said.contains("man pages into"), "{said}");
    for page in ["isolane.1", "isolane-run.1", "isolane-sweep-partition.1"] {
        assert!(out.join(page).is_file(), "{page} not written");
    }
    assert!(
        !out.join("isolane-worker.1").exists(),
        "the internal worker has no page"
    );
}
