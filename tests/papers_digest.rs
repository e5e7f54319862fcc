//! `scenarios/papers/digest.py`, the markdown digest of a results root written by
//! `scenarios/papers/reproduce.py`:
//! - over a full CPU stand-in run (`--backend cpu --scale tiny`): a section per study, the
//!   stand-in warning, every model, and an IMS table whose numbers are ims.json's;
//! - over a root holding study a only: exit 0, the IMS table, the other studies "Not present";
//! - over a root that does not exist: exit 2.
//!
//! Needs python3 (standard library only). Without it the tests print a skip message, unless
//! `ISOLANE_REQUIRE_PYTHON=1`, where they fail.

mod common;

use std::path::Path;
use std::process::{Command, Output};

use common::papers::*;

fn digest(py: &str, root: &Path, extra: &[&str]) -> Output {
    Command::new(py)
        .arg(repo().join("scenarios/papers/digest.py"))
        .arg(root)
        .args(extra)
        .current_dir(repo())
        .output()
        .unwrap()
}

/// The cells of a markdown table row `| a | b |`.
fn cells(line: &str) -> Vec<String> {
    line.trim()
        .trim_matches('|')
        .split('|')
        .map(|c| c.trim().to_string())
        .collect()
}

/// Checks the digest's "### IMS (Hz)" table against a-maxrate/ims.json: a row per model of
/// ims.json, each number within rounding of its max_rate_hz, "-" only where ims.json has none.
fn check_ims_table(md: &str, ims: &serde_json::Value) {
    let lines: Vec<&str> = md.lines().collect();
    let start = lines
        .iter()
        .position(|l| l.trim() == "### IMS (Hz)")
        .unwrap_or_else(|| panic!("no IMS table in the digest:\n{md}"));
    let rows: Vec<&str> = lines[start + 1..]
        .iter()
        .skip_while(|l| !l.starts_with('|'))
        .take_while(|l| l.starts_with('|'))
        .copied()
        .collect();
    assert!(rows.len() >= 3, "IMS table too short: {rows:?}");
    let header = cells(rows[0]);
    assert_eq!(header[0], "model");
    let models = ims.as_object().unwrap();
    assert!(!models.is_empty(), "ims.json is empty");
    let mut checked = 0;
    for (model, configs) in models {
        let row = rows[2..]
            .iter()
            .map(|r| cells(r))
            .find(|c| &c[0] == model)
            .unwrap_or_else(|| panic!("no IMS row for {model}: {rows:?}"));
        assert_eq!(row.len(), header.len(), "{row:?} vs {header:?}");
        for (config, cell) in header.iter().zip(&row).skip(1) {
            match configs[config.as_str()]["max_rate_hz"].as_f64() {
                Some(hz) => {
                    let got: f64 = cell
                        .parse()
                        .unwrap_or_else(|_| panic!("{model} {config}: cell {cell:?}"));
                    assert!(
                        (got - hz).abs() <= 0.051,
                        "{model} {config}: digest {got}, ims.json {hz}"
                    );
                    checked += 1;
                }
                None => assert_eq!(cell, "-", "{model} {config}"),
            }
        }
        // Every config of ims.json has a column.
        for config in configs.as_object().unwrap().keys() {
            assert!(header.contains(config), "no column {config}: {header:?}");
        }
    }
    assert!(checked >= models.len(), "only {checked} IMS values checked");
}

const SECTIONS: [&str; 5] = [
    "## a. max stable inference rate",
    "## b. isolation, 2 workloads",
    "## c. isolation, 4 workloads",
    "## d. partition sweep",
    "## e. concurrency x batch sweep",
];

#[test]
fn digest_of_the_cpu_stand_in_and_of_study_a_alone() {
    let Some(py) = python() else { return };
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("results");
    let t0 = std::time::Instant::now();
    let o = driver(py, &out, &["--backend", "cpu", "--scale", "tiny"]);
    assert!(o.status.success(), "reproduce.py: {}", text(&o));
    eprintln!(
        "reproduce.py, cpu tiny: {:.1} s",
        t0.elapsed().as_secs_f64()
    );

    // The whole root, into a file.
    let md_path = out.join("digest.md");
    let o = digest(py, &out, &["--out", md_path.to_str().unwrap()]);
    assert!(o.status.success(), "digest.py: {}", text(&o));
    let md = std::fs::read_to_string(&md_path).unwrap();
    for s in SECTIONS {
        assert!(md.contains(s), "no section {s:?}:\n{md}");
    }
    assert!(
        md.contains("WARNING: backend `cpu`"),
        "no stand-in warning:\n{md}"
    );
    assert!(md.contains("- scale: **tiny**"), "no scale in the header");
    assert!(!md.contains("Not present"), "a study missing:\n{md}");
    assert!(!md.contains("could not read"), "a study unreadable:\n{md}");
    assert!(!md.contains("incomplete"), "a study incomplete:\n{md}");

    let ims = json(&out.join("a-maxrate/ims.json"));
    check_ims_table(&md, &ims);
    let studies = json(&repo().join("scenarios/papers/studies.json"));
    let mut models: Vec<String> = ims.as_object().unwrap().keys().cloned().collect();
    for s in ["b", "c"] {
        for m in studies[s]["models"].as_array().unwrap() {
            models.push(m.as_str().unwrap().to_string());
        }
    }
    for m in studies["e"]["models"].as_array().unwrap() {
        models.push(m.as_str().unwrap().to_string());
    }
    for m in &models {
        assert!(md.contains(m.as_str()), "model {m} not in the digest");
    }
    // b and c: a headline row per model and mechanism, with a number for the largest timeout %.
    for (study, next) in [("b", "## c."), ("c", "## d.")] {
        let sec = &md[md.find(&format!("## {study}.")).unwrap()..md.find(next).unwrap()];
        for m in studies[study]["models"].as_array().unwrap() {
            for mech in ["timeslice", "mps", "green"] {
                let row = sec
                    .lines()
                    .map(cells)
                    .find(|c| c.len() > 5 && c[0] == m.as_str().unwrap() && c[1] == mech)
                    .unwrap_or_else(|| panic!("study {study}: no headline row {m} {mech}"));
                let worst = row[5].split(' ').next().unwrap();
                assert!(
                    worst.parse::<f64>().is_ok(),
                    "study {study} {m} {mech}: max timeout % {:?}",
                    row[5]
                );
            }
        }
        // The victims' execution time per step, from the per-job files: a number per step
        // and the last / first ratio.
        let exec = &sec[sec
            .find("### Victim execution time per step")
            .unwrap_or_else(|| panic!("study {study}: no execution-time table:\n{sec}"))..];
        for m in studies[study]["models"].as_array().unwrap() {
            for mech in ["timeslice", "mps", "green"] {
                let row = exec
                    .lines()
                    .map(cells)
                    .find(|c| c.len() > 5 && c[0] == m.as_str().unwrap() && c[1] == mech)
                    .unwrap_or_else(|| panic!("study {study}: no execution-time row {m} {mech}"));
                let steps = &row[3..row.len() - 2];
                assert!(steps.len() >= 2, "{row:?}");
                for v in steps.iter().chain([&row[row.len() - 2]]) {
                    let x: f64 = v.parse().unwrap_or_else(|_| panic!("{m} {mech}: {row:?}"));
                    assert!(x > 0.0, "{m} {mech}: {row:?}");
                }
            }
        }
    }
    // d and e: a table per sweep folder.
    assert!(md.contains("### convnext_large-green") && md.contains("### convnext_large-mps"));
    assert!(md.contains("T/P, throughput per workload"));

    // A root with study a only.
    let only_a = dir.path().join("only-a");
    copy_dir(&out.join("a-maxrate"), &only_a.join("a-maxrate"));
    let o = digest(py, &only_a, &[]);
    assert!(o.status.success(), "digest.py, study a only: {}", text(&o));
    let md_a = String::from_utf8_lossy(&o.stdout).to_string();
    for s in SECTIONS {
        assert!(md_a.contains(s), "no section {s:?}:\n{md_a}");
    }
    check_ims_table(&md_a, &ims);
    assert_eq!(
        md_a.matches("Not present").count(),
        4,
        "b-e should be absent:\n{md_a}"
    );
    assert!(md_a.contains("commands.txt: absent."));
    eprintln!("total: {:.1} s", t0.elapsed().as_secs_f64());
}

#[test]
fn digest_of_a_missing_root_exits_2() {
    let Some(py) = python() else { return };
    let dir = tempfile::tempdir().unwrap();
    let o = digest(py, &dir.path().join("no-such-results"), &[]);
    assert_eq!(o.status.code(), Some(2), "{}", text(&o));
    assert!(
        String::from_utf8_lossy(&o.stderr).contains("no such results root"),
        "{}",
        text(&o)
    );
}
