//! `isolane isolation SCENARIO`: victims at a fixed rate while interferers ramp theirs.

use std::path::PathBuf;

use anyhow::Context as _;
use clap::Args;
use isolane_runtime::coordinator::RunOptions;
use isolane_runtime::isolation::{self, StepResult};
use isolane_runtime::output;
use isolane_runtime::results::{self, RunInfo};

use super::{user, ProgressView};

#[derive(Args)]
#[command(
    about = "Measure how interferers ramping their rate disturb victims at a fixed rate",
    long_about = "The isolation experiment: workloads with role = \"victim\" run at their fixed \
                  rate for the whole experiment; workloads with role = \"interferer\" step \
                  through ramp.rates() (steps rates from from_hz to to_hz, each held step_s). \
                  It is one continuous run: victims never stop, and each victim job is \
                  attributed to the step in which it was released. Writes summary.json (with a \
                  steps array), isolation.csv, jobs/<workload>.csv and scenario.toml, and prints \
                  a table per step and victim. Exit codes as for `isolane run`."
)]
pub struct IsolationArgs {
    /// Scenario file with victims and interferers.
    scenario: PathBuf,
    /// Output directory. Default: a new runs/<YYYYmmdd-HHMMSS>.
    #[arg(long, short = 'o', value_name = "DIR")]
    out: Option<PathBuf>,
    /// Use --out even if it is not empty.
    #[arg(long)]
    force: bool,
    /// No progress bar.
    #[arg(long, short = 'q')]
    quiet: bool,
    #[command(flatten)]
    partitions: super::PartitionFlags,
}

pub fn run(args: IsolationArgs) -> anyhow::Result<u8> {
    let (scenario, scenario_name) = super::load_scenario(Some(&args.scenario))?;
    let admitted = super::admit_or_refuse(&scenario, &scenario_name)?;
    let (plan, grid) = isolation::plan(&scenario).map_err(user)?;
    super::run::preflight(&plan)?;
    let toml = scenario
        .to_toml_string()
        .context("writing the resolved scenario")?;
    let out = super::run::prepare_out(args.out.as_deref(), args.force)?;
    output::write_atomic(&out.join("scenario.toml"), toml.as_bytes())?;

    let stop = super::install_stop_handler()?;
    let started_at = chrono::Utc::now();
    let view = ProgressView::new(args.quiet);
    let telemetry = super::telemetry::start(&scenario);
    let (result, partitions) = super::run_partitioned(
        &scenario,
        admitted.as_ref(),
        &args.partitions,
        &plan,
        RunOptions::new(stop),
        &mut |p| view.update(p),
    )?;
    view.finish();

    let steps = isolation::per_step(&plan, grid, &result);
    let info = RunInfo {
        command: "isolation",
        started_at,
        scenario: scenario_name,
    };
    let mut summary = results::summarize_run(&info, &plan.workloads, &result);
    super::telemetry::finish(telemetry, &out, &result, &mut summary);
    for w in &result.workloads {
        output::write_jobs_csv(&out, &w.name, &w.records)?;
    }
    output::write_atomic(
        &out.join("isolation.csv"),
        isolation::isolation_csv(&steps).as_bytes(),
    )?;
    let mut value = serde_json::to_value(&summary).context("encoding summary.json")?;
    if let Some(obj) = value.as_object_mut() {
        obj.insert("step_s".into(), grid.step_s.into());
        obj.insert(
            "steps".into(),
            serde_json::to_value(&steps).context("encoding steps")?,
        );
        if !partitions.is_empty() {
            obj.insert(
                "partitions".into(),
                serde_json::to_value(&partitions).context("encoding partitions")?,
            );
        }
    }
    output::write_json(&out.join("summary.json"), &value)?;

    println!("{}", steps_table(&steps));
    println!("{}", super::run::results_table(&summary));
    super::run::report_failures(&summary);
    println!("results: {}", out.display());
    Ok(super::run::exit_for(summary.status))
}

fn steps_table(steps: &[StepResult]) -> String {
    use isolane_report::num;
    let rows: Vec<Vec<String>> = steps
        .iter()
        .flat_map(|s| {
            s.victims.iter().map(move |v| {
                let m = &v.metrics;
                vec![
                    s.step.to_string(),
                    format!("{:.1}", s.interferer_rate_hz),
                    v.victim.clone(),
                    m.jobs.to_string(),
                    format!("{:.2}", m.timeout_pct),
                    num(m.latency_ms.p50, 3),
                    num(m.latency_ms.p99, 3),
                    num(m.latency_ms.max, 3),
                ]
            })
        })
        .collect();
    isolane_report::plain_table(
        &[
            "step",
            "interferer /s",
            "victim",
            "jobs",
            "timeouts %",
            "p50 ms",
            "p99 ms",
            "max ms",
        ],
        &rows,
        &[2],
    )
}
