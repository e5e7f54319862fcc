//! `isolane report DIR... --out report.html`: one self-contained HTML page from results folders.

use std::path::PathBuf;

use clap::Args;
use isolane_report::ReportError;

use super::user;

#[derive(Args)]
#[command(
    about = "Render results folders as one self-contained HTML report with SVG plots",
    long_about = "Render one HTML file (inline SVG plots, no external resource) from results \
                  folders: run and isolation folders (summary.json: latency CDFs, telemetry over \
                  time, victim timeouts against interferer rate per mechanism), maxrate folders \
                  (maxrate.json: max stable rate per model and mechanism), interference folders \
                  (interference.json: heatmap of each victim's p99 stretch beside each \
                  neighbour), coexec folders (coexec.json: heatmap of each pair's speedup per \
                  mechanism, bars of each job's slowdown) and sweep folders \
                  (sweep.json: throughput, memory and power against partition size or against \
                  workloads × batch). A section appears when its data exists. A folder that is \
                  none of these is searched for results folders (a study folder, or a results \
                  root such as results/h100 that holds study folders); files and folders without \
                  results are skipped with a note. No results folder at all is an error (exit \
                  2). See docs/report.md."
)]
pub struct ReportArgs {
    /// Results folders (run, isolation, maxrate, sweep, interference or coexec), or folders
    /// that hold them.
    #[arg(required = true, value_name = "DIR")]
    dirs: Vec<PathBuf>,
    /// The HTML file to write. Default: DIR/report.html for one folder, ./report.html for several.
    #[arg(long, short = 'o', value_name = "FILE")]
    out: Option<PathBuf>,
    /// Title of the page.
    #[arg(long, default_value = "isolane report")]
    title: String,
}

pub fn run(args: ReportArgs) -> anyhow::Result<u8> {
    let found = isolane_report::data::find_results(&args.dirs).map_err(user)?;
    for (path, why) in &found.skipped {
        eprintln!("note: skipped {}: {why}", path.display());
    }
    let html = isolane_report::render_report(&found.dirs, &args.title).map_err(|e| match e {
        ReportError::Data(_) => user(e),
        ReportError::Draw(_) => anyhow::Error::new(e),
    })?;
    let out = match (&args.out, args.dirs.as_slice()) {
        (Some(o), _) => o.clone(),
        (None, [one]) if one.is_dir() => one.join("report.html"),
        (None, _) => PathBuf::from("report.html"),
    };
    super::write_output(&out, html.as_bytes())?;
    println!("report: {}", out.display());
    Ok(0)
}
