//! `isolane isolation SCENARIO`: victims at a fixed rate while interferers ramp theirs.

use std::path::PathBuf;

use clap::Args;
use isolane_session::isolation_run;

#[derive(Args)]
#[command(
    about = "Measure how interferers ramping their rate disturb victims at a fixed rate",
    long_about = "The isolation experiment: workloads with role = \"victim\" run at their fixed \
                  rate for the whole experiment; workloads with role = \"interferer\" step \
                  through ramp.rates() (steps rates from from_hz to to_hz, each held step_s). \
                  It is one continuous run: victims never stop, and each victim job is \
                  attributed to the step in which it was released. Writes summary.json (with a \
                  steps array), isolation.csv, jobs/<workload>.csv and scenario.toml, and prints \
                  a table per step and victim."
)]
pub struct IsolationArgs {
    /// Scenario file with victims and interferers.
    scenario: PathBuf,
    /// Output directory. Default: a new runs/<YYYYmmdd-HHMMSS>.
    #[arg(long, short = 'o', value_name = "DIR")]
    out: Option<PathBuf>,
    /// Use --out even if it is not empty, replacing isolation's files (not another command's).
    #[arg(long)]
    force: bool,
    /// No progress bar.
    #[arg(long, short = 'q')]
    quiet: bool,
    /// Every column of the results table (default: the ones that fit 80 columns).
    #[arg(long)]
    wide: bool,
    /// Also write DIR/trace.json, the run's timeline for ui.perfetto.dev (as `isolane trace`).
    #[arg(long)]
    trace: bool,
    /// Serve live metrics (OpenMetrics / Prometheus) at http://HOST:PORT/metrics while the run
    /// goes on; port 0 picks a free port (the address is printed on stderr).
    #[arg(long, value_name = "HOST:PORT")]
    metrics_addr: Option<String>,
    #[command(flatten)]
    partitions: super::PartitionFlags,
}

pub fn run(args: IsolationArgs, engine: &isolane_runtime::exec::Engine) -> anyhow::Result<u8> {
    let (scenario, scenario_name) = super::load_scenario(Some(&args.scenario))?;
    let machine = super::studies::Executors;
    let checked = isolation_run::check(&scenario, &scenario_name, &machine)?;
    let live = super::serve_metrics(args.metrics_addr.as_deref())?;
    let flags = isolation_run::IsolationRun {
        machine: &machine,
        out: args.out.as_deref(),
        force: args.force,
        quiet: args.quiet,
        choices: args.partitions.choices(),
        engine,
    };
    let done = isolation_run::run(
        &scenario,
        scenario_name,
        checked,
        &flags,
        live.as_ref().map(|l| &l.metrics),
    )?;
    let m = &done.measured;
    println!("{}", done.steps_table);
    if args.trace {
        super::trace::write(&m.out, &m.out.join("trace.json"))?;
    }
    println!(
        "{}",
        super::run::results_table(&scenario, &m.summary, args.wide)
    );
    super::run::report_failures(&m.summary);
    println!("results: {}", m.out.display());
    Ok(super::exit_for(m.summary.status))
}
