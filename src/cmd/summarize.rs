//! `isolane summarize DIR`: rebuilds summary.json of a run that was cut short (killed before it
//! could write it) from the resolved scenario and the per-job records it streamed to jobs/.

use std::path::PathBuf;

use clap::Args;
use isolane_runtime::coordinator::RunPlan;

use super::user;

#[derive(Args)]
#[command(
    about = "Rebuild summary.json of a run that was killed, from its jobs/*.csv",
    long_about = "A run streams every job's record to DIR/jobs/<workload>.csv while it goes on, \
                  so a run killed before it could write summary.json (kill -9, a crash, a lost \
                  machine) still holds what it measured. This rebuilds summary.json from \
                  DIR/scenario.toml and those records with the same metric code as `isolane \
                  run`, marks it \"complete\": false and the run's status \"interrupted\", and \
                  prints the results table. A last row cut off by the kill is left out (and \
                  said so). Device telemetry and partitions are not in the records, so they are \
                  absent.\n\nExit codes: 0 rebuilt; 2 DIR is not a run folder, has a \
                  summary.json already (without --force), or a record is malformed (named by file, \
                  line and field: a time that is NaN, negative or past 1e12 ms, a job index \
                  repeated or out of order, an end before its start or release)."
)]
pub struct SummarizeArgs {
    /// The run's output folder (holds scenario.toml and jobs/).
    pub dir: PathBuf,
    /// Rebuild even if DIR has a summary.json (which the finished run wrote; it is replaced).
    #[arg(long)]
    pub force: bool,
}

pub fn run(args: SummarizeArgs) -> anyhow::Result<u8> {
    let dir = &args.dir;
    isolane_session::rebuild::check_folder(dir, args.force).map_err(user)?;
    let file = super::ScenarioFile::read(&dir.join("scenario.toml"))?;
    let (scenario, _) = file.scenario()?;
    if !file.apps()?.is_empty() {
        return Err(user(format!(
            "{}: a run of [[app]]s; summarize does not rebuild those yet (their frames are \
             written when the run ends, docs/apps.md)",
            dir.display()
        )));
    }
    let plan = RunPlan::from_scenario(&scenario);
    // A malformed record is the user's (exit 2).
    let (mut summary, notes) =
        isolane_session::rebuild::folder_summary(dir, &plan, "run").map_err(user)?;
    summary.rebuilt_by = Some("isolane summarize".into());
    isolane_core::results::write_json(&dir.join("summary.json"), &summary)?;
    println!("{}", super::run::results_table(&scenario, &summary, false));
    for n in &notes {
        eprintln!("note: {n}");
    }
    if let Some(note) = isolane_session::rebuild::cut_short_note(&summary, &plan) {
        eprintln!("{note}");
    }
    println!("summary: {}", dir.join("summary.json").display());
    Ok(0)
}
