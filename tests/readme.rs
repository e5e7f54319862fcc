//! The README's ten-minute tour runs as written: every fenced block marked `sh test` is run with
//! bash, in order, in a scratch folder holding a copy of `scenarios/`, with this build's
//! `isolane` first on PATH. Each must succeed and print at most 80 columns on stdout (the
//! tables' promise), and the tour must end with the report it promises.

mod common;

use std::path::Path;
use std::process::Command;

/// The bodies of the README's ```` ```sh test ```` blocks, in order.
fn test_blocks(readme: &str) -> Vec<String> {
    let mut blocks = Vec::new();
    let mut current: Option<Vec<&str>> = None;
    for line in readme.lines() {
        match (&mut current, line.trim_end()) {
            (None, "```sh test") => current = Some(Vec::new()),
            (Some(lines), "```") => {
                blocks.push(lines.join("\n"));
                current = None;
            }
            (Some(lines), l) => lines.push(l),
            (None, _) => {}
        }
    }
    assert!(current.is_none(), "an unclosed ```sh test block");
    blocks
}

#[test]
fn test_blocks_are_found_with_their_heredocs_intact() {
    let md = "a\n```sh test\nisolane run\n```\n```sh\nnot this\n```\n```sh test\ncat > f <<'EOF'\nx = 1\nEOF\n```\n";
    assert_eq!(
        test_blocks(md),
        vec![
            "isolane run".to_string(),
            "cat > f <<'EOF'\nx = 1\nEOF".to_string()
        ]
    );
}

#[test]
fn the_readme_tour_runs_as_written() {
    let repo = Path::new(env!("CARGO_MANIFEST_DIR"));
    let readme = std::fs::read_to_string(repo.join("README.md")).unwrap();
    let blocks = test_blocks(&readme);
    assert!(blocks.len() >= 6, "only {} `sh test` blocks", blocks.len());

    let scratch = tempfile::tempdir().unwrap();
    common::papers::copy_dir(&repo.join("scenarios"), &scratch.path().join("scenarios"));
    let bin_dir = Path::new(env!("CARGO_BIN_EXE_isolane")).parent().unwrap();
    let path = format!(
        "{}:{}",
        bin_dir.display(),
        std::env::var("PATH").unwrap_or_default()
    );
    for block in &blocks {
        let o = Command::new("bash")
            .args(["-euo", "pipefail", "-c", block])
            .current_dir(scratch.path())
            .env("PATH", &path)
            .output()
            .unwrap();
        let stdout = String::from_utf8_lossy(&o.stdout);
        let stderr = String::from_utf8_lossy(&o.stderr);
        assert!(
            o.status.success(),
            "README block failed ({}):\n{block}\n--- stdout\n{stdout}\n--- stderr\n{stderr}",
            o.status
        );
        for line in stdout.lines() {
            assert!(
                line.chars().count() <= 80,
                "wider than 80 columns ({}):\n{line}\nin the output of:\n{block}",
                line.chars().count()
            );
        }
    }
    assert!(scratch.path().join("report.html").is_file());
    for dir in ["runs/quickstart", "runs/mine", "runs/isolation"] {
        assert!(
            scratch.path().join(dir).join("summary.json").is_file(),
            "{dir}"
        );
    }
    assert!(scratch.path().join("runs/maxrate/maxrate.json").is_file());

    // Issue 31: on an idle machine the tour's victim missed nothing, and the step showed no
    // interference. It shares its core with the interferer and has less slack than one of the
    // interferer's jobs, so at the interferer's top rate some of its jobs are late.
    let csv = std::fs::read_to_string(scratch.path().join("runs/isolation/isolation.csv")).unwrap();
    let header: Vec<&str> = csv.lines().next().unwrap_or("").split(',').collect();
    let col = header.iter().position(|h| *h == "timeouts").unwrap();
    let missed: Vec<u64> = csv
        .lines()
        .skip(1)
        .map(|l| l.split(',').nth(col).unwrap().parse().unwrap())
        .collect();
    assert_eq!(missed.len(), 4, "{csv}");
    assert!(
        missed[3] > 0,
        "the victim missed no deadline at the interferer's top rate:\n{csv}"
    );
}
