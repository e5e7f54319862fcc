//! The report rendered from the committed samples (tests/data, see its README) and opened in
//! headless Chromium: a screenshot, and a DOM check that every plot is laid out with visible
//! text and drawn data.
//!
//! Chromium is found at `$CHROMIUM`, else /usr/bin/chromium (Debian's package). The browser
//! test is `#[ignore]`d, so a plain `cargo test` reports it as ignored (skipped), never as
//! passed; `-- --ignored` runs it. Run that way without a browser it prints SKIPPED, unless
//! `ISOLANE_REQUIRE_BROWSER=1` (set by .ci/run, which installs Chromium and runs it), where a
//! missing browser fails the test.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

fn data_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data")
}

/// Every results folder among the samples (one level of grouping folders allowed).
fn sample_dirs() -> Vec<PathBuf> {
    let is_results = |p: &Path| {
        ["summary.json", "maxrate.json", "sweep.json"]
            .iter()
            .any(|f| p.join(f).is_file())
    };
    let mut out = Vec::new();
    let mut top: Vec<PathBuf> = std::fs::read_dir(data_dir())
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.is_dir())
        .collect();
    top.sort();
    for d in top {
        if is_results(&d) {
            out.push(d);
        } else {
            let mut sub: Vec<PathBuf> = std::fs::read_dir(&d)
                .unwrap()
                .map(|e| e.unwrap().path())
                .filter(|p| is_results(p))
                .collect();
            sub.sort();
            out.extend(sub);
        }
    }
    out
}

fn render() -> String {
    isolane_report::render_report(&sample_dirs(), "isolane report (test samples)").unwrap()
}

#[test]
fn the_samples_render_every_section() {
    let html = render();
    for section in [
        "Max stable inference rate",
        "Isolation: victim timeouts against interferer rate",
        "Partition sweeps",
        "Concurrency sweeps",
        "latency CDF",
        "SM clock",
        "temperature",
        "power",
        "timeline around the worst job",
        "mean frame by stage",
        "end-to-end latency CDF",
        "made the vote late",
    ] {
        assert!(html.contains(section), "section `{section}` missing");
    }
    // Tables II–III: a row per model, a column per mechanism.
    for cell in [
        "green (64 SMs)",
        "mps (50%)",
        "timeslice",
        "convnext_large",
        "spin:2ms",
    ] {
        assert!(
            html.contains(cell),
            "{cell} missing from the max-rate table"
        );
    }
    // Figs. 8–11: one chart per victim model, one line per mechanism (from scenario.toml).
    assert!(html.contains("resnet18: victim"));
    for mech in ["timeslice", "mps", "green"] {
        assert!(
            html.contains(&format!("\n{mech}\n</text>")),
            "no {mech} line"
        );
    }
    // Self-contained: nothing fetched from elsewhere.
    for external in ["src=\"http", "href=\"http", "<link", "<script", "@import"] {
        assert!(!html.contains(external), "external resource: {external}");
    }
    let figures = html.matches("<figure class=\"plot").count();
    assert_eq!(figures, html.matches("<svg").count());
    assert!(figures >= 15, "{figures} figures");
    // A timeline per run folder with jobs/*.csv (run-cpu, run-telemetry, two isolation runs),
    // each with a job bar per workload lane.
    let timelines = html.matches("<figure class=\"plot timeline\"").count();
    assert_eq!(timelines, 4, "{timelines} timelines");
}

fn chromium() -> Option<PathBuf> {
    if let Some(p) = std::env::var_os("CHROMIUM") {
        return Some(PathBuf::from(p));
    }
    ["/usr/bin/chromium", "/usr/bin/chromium-browser"]
        .iter()
        .map(PathBuf::from)
        .find(|p| p.is_file())
}

/// Runs the browser with a deadline, so a hung browser fails the test instead of CI.
fn run_browser(exe: &Path, args: &[String], limit: Duration) -> (bool, String, String) {
    let mut child = Command::new(exe)
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("starting {}: {e}", exe.display()));
    let stdout = child.stdout.take().unwrap();
    let stderr = child.stderr.take().unwrap();
    let out_t = std::thread::spawn(move || std::io::read_to_string(stdout).unwrap_or_default());
    let err_t = std::thread::spawn(move || std::io::read_to_string(stderr).unwrap_or_default());
    let start = Instant::now();
    let status = loop {
        if let Some(s) = child.try_wait().unwrap() {
            break s;
        }
        if start.elapsed() > limit {
            let _ = child.kill();
            let _ = child.wait();
            panic!("{} did not finish within {limit:?}", exe.display());
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    (
        status.success(),
        out_t.join().unwrap_or_default(),
        err_t.join().unwrap_or_default(),
    )
}

/// Runs in the page after it is laid out; its verdict goes into <pre id="isolane-check"> for
/// --dump-dom. A plot passes when its <svg> has a real size, at least 4 visible labels (title,
/// two axis names, ticks) and, per series, at least one visible element in a series colour with
/// real extent (a line of more than 2 points, a marker, a timeline's job bar, or a bar taller
/// than a legend swatch).
const CHECK_JS: &str = r#"
<script>
(function () {
  const palette = PALETTE;
  const figs = [...document.querySelectorAll('figure.plot')];
  const res = {figures: figs.length, svgs: document.querySelectorAll('svg').length, bad: []};
  figs.forEach((f, i) => {
    const svg = f.querySelector('svg');
    const why = [];
    if (!svg) { why.push('no svg'); }
    else {
      const r = svg.getBoundingClientRect();
      if (r.width < 200 || r.height < 150) why.push('svg is ' + r.width + 'x' + r.height);
      const texts = [...svg.querySelectorAll('text')]
        .filter(t => t.textContent.trim() !== '' && t.getBBox().width > 0);
      if (texts.length < 4) why.push(texts.length + ' visible texts');
      const coloured = [...svg.querySelectorAll('polyline,path,circle,line,rect')].filter(e => {
        const c = ((e.getAttribute('stroke') || '') + ' ' + (e.getAttribute('fill') || '')).toUpperCase();
        if (!palette.some(p => c.includes(p))) return false;
        const b = e.getBBox();
        return b.width + b.height > 0;
      });
      // a stacked bar's segment is a rect taller than a legend's 10-px swatch
      const drawn = coloured.filter(e => e.tagName === 'circle' || e.hasAttribute('data-job')
        || (e.tagName === 'rect' && e.getBBox().height > 12)
        || (e.getAttribute('points') || '').trim().split(/\s+/).length > 2);
      const series = parseInt(f.dataset.series || '1', 10);
      if (coloured.length < series) why.push(coloured.length + ' coloured elements for ' + series + ' series');
      if (drawn.length < 1) why.push('no data line or marker drawn');
    }
    if (why.length) res.bad.push({i: i, title: svg ? (svg.querySelector('text') || {}).textContent : '', why: why});
  });
  const pre = document.createElement('pre');
  pre.id = 'isolane-check';
  pre.textContent = JSON.stringify(res);
  document.body.appendChild(pre);
})();
</script>
"#;

// Ignored by default so that a machine without Chromium shows it as skipped ("1 ignored")
// instead of counting it as passed; .ci/run installs Chromium and runs it with --ignored.
#[test]
#[ignore = "needs headless Chromium: cargo test -p isolane-report --test browser -- --ignored"]
fn the_report_renders_in_headless_chromium() {
    let required = std::env::var("ISOLANE_REQUIRE_BROWSER").is_ok_and(|v| v == "1");
    let Some(exe) = chromium() else {
        assert!(
            !required,
            "ISOLANE_REQUIRE_BROWSER=1 but no Chromium: install Debian's `chromium` \
             (apt-get install -y chromium) or set CHROMIUM to the browser's path"
        );
        eprintln!(
            "SKIPPED the_report_renders_in_headless_chromium: no Chromium at /usr/bin/chromium \
             and CHROMIUM is not set (apt-get install -y chromium to run it)"
        );
        return;
    };
    let html = render();
    let figures = html.matches("<figure class=\"plot").count();
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join("report-browser");
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let report = dir.join("report.html");
    std::fs::write(&report, &html).unwrap();
    let palette: Vec<String> = isolane_report::plot::palette_hex()
        .iter()
        .map(|c| format!("'{c}'"))
        .collect();
    let js = CHECK_JS.replace("PALETTE", &format!("[{}]", palette.join(",")));
    let checked = dir.join("checked.html");
    std::fs::write(&checked, html.replace("</body>", &format!("{js}</body>"))).unwrap();

    let profile = tempfile::tempdir().unwrap();
    let common = |extra: &[String]| -> Vec<String> {
        let mut a = vec![
            "--headless".to_string(),
            // Root in a container: Chromium's sandbox cannot start there.
            "--no-sandbox".into(),
            "--disable-gpu".into(),
            "--disable-dev-shm-usage".into(),
            "--no-first-run".into(),
            "--hide-scrollbars".into(),
            format!("--user-data-dir={}", profile.path().display()),
        ];
        a.extend_from_slice(extra);
        a
    };
    let limit = Duration::from_secs(90);

    let url = |p: &Path| format!("file://{}", p.display());
    let (ok, dom, err) = run_browser(&exe, &common(&["--dump-dom".into(), url(&checked)]), limit);
    assert!(ok, "chromium --dump-dom failed:\n{err}");
    let start = dom
        .find("<pre id=\"isolane-check\">")
        .unwrap_or_else(|| panic!("the check script did not run; stderr:\n{err}"));
    let json = &dom[start + "<pre id=\"isolane-check\">".len()..];
    let json = &json[..json.find("</pre>").unwrap()];
    let v: serde_json::Value =
        serde_json::from_str(&json.replace("&quot;", "\"").replace("&amp;", "&")).unwrap();
    assert_eq!(v["figures"], figures, "{v}");
    assert_eq!(v["svgs"], figures, "an <svg> outside a figure: {v}");
    assert_eq!(v["bad"], serde_json::json!([]), "plots not drawn: {v}");

    let png = dir.join("report.png");
    let (ok, _, err) = run_browser(
        &exe,
        &common(&[
            format!("--screenshot={}", png.display()),
            "--window-size=1400,9000".into(),
            url(&report),
        ]),
        limit,
    );
    assert!(ok, "chromium --screenshot failed:\n{err}");
    let bytes = std::fs::read(&png).unwrap();
    assert_eq!(&bytes[..8], b"\x89PNG\r\n\x1a\n", "not a PNG");
    // A blank page of this size compresses to a few KB; drawn plots make it far larger.
    assert!(
        bytes.len() > 100_000,
        "screenshot only {} bytes",
        bytes.len()
    );
    eprintln!(
        "report and screenshot: {} {}",
        report.display(),
        png.display()
    );
}
