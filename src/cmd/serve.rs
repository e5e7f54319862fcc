//! `isolane serve SCENARIO`: the scenario's workloads as models served over the KServe v2 /
//! Triton protocol until SIGTERM or SIGINT (docs/serve.md). Flags → configuration; the
//! session is `isolane_serve::cli_session`'s.

use std::path::PathBuf;

use clap::Args;
use isolane_executors::run_input::workloads_here;
use isolane_runtime::exec::Engine;
use isolane_serve::cli_session::{self, AutoplanFlags, ServeConfig};

use super::user;

#[derive(Args)]
#[command(
    about = "Serve a scenario's models over the KServe v2 / Triton protocol (HTTP and gRPC)",
    long_about = "Loads every workload of SCENARIO into its partition, keeps it warm and serves \
                  it under the workload's name over the KServe v2 / Triton inference protocol \
                  until SIGTERM or SIGINT: HTTP/REST (with the binary tensor data extension and \
                  GET /metrics) and gRPC. A request may carry its own deadline (parameter \
                  `deadline_ms`; default the workload's): one predicted to complete late is \
                  refused at once (HTTP 429, gRPC RESOURCE_EXHAUSTED), one that completes late \
                  is answered with `late = true`. Critical models are protected from best-effort \
                  ones by the guard; best-effort ones batch their queued requests \
                  ([workload.serve], docs/serve.md). On SIGTERM or SIGINT it stops taking \
                  requests, answers those it took, and exits 0."
)]
pub struct ServeArgs {
    /// Scenario file (TOML): its workloads are the models served.
    pub scenario: PathBuf,
    /// HTTP/REST address (HOST:PORT; port 0: any free one).
    #[arg(long, value_name = "HOST:PORT", default_value = "127.0.0.1:8000")]
    pub http: String,
    /// gRPC address (HOST:PORT; port 0: any free one).
    #[arg(long, value_name = "HOST:PORT", default_value = "127.0.0.1:8001")]
    pub grpc: String,
    /// `cpu` serves the workloads on the CPU backend whatever the scenario's [device] says
    /// (as `run --backend cpu`).
    #[arg(long, value_parser = ["cpu", "cuda"])]
    pub backend: Option<String>,
    /// Record every request taken as a job of its model in DIR/jobs/<model>.csv while serving
    /// (released at its arrival; late counts as a timeout), and write DIR/summary.json and
    /// workloads.csv when stopped, as `run` does (`isolane trace DIR` shows the requests).
    #[arg(long, short = 'o', value_name = "DIR")]
    pub out: Option<PathBuf>,
    /// Use --out even if it is not empty, replacing a run's files in it (not another command's).
    #[arg(long, requires = "out")]
    pub force: bool,
    /// Also write DIR/trace.json when stopped, the requests' timeline for ui.perfetto.dev.
    #[arg(long, requires = "out")]
    pub trace: bool,
    /// On SIGTERM/SIGINT, how long the requests already taken may take to be answered.
    #[arg(long, value_name = "SECONDS", default_value_t = 30.0)]
    pub drain_timeout: f64,
    /// No access log lines (one per request on stderr otherwise; ISOLANE_LOG filters them as
    /// RUST_LOG does, e.g. ISOLANE_LOG=warn).
    #[arg(long)]
    pub no_access_log: bool,
    /// Release this workload of the scenario on its own fixed-rate schedule (rate_hz,
    /// duration_s, deadline_ms, as `run` releases it) beside the served models instead of
    /// serving it; repeatable. Its jobs go to --out's jobs/ like the requests', and a line
    /// per workload says what it ran when serve stops.
    #[arg(long = "release", value_name = "WORKLOAD")]
    pub release: Vec<String>,
    /// Re-plan the partitions while serving: when a critical model's p99 passes the margin
    /// or a model's request rate moves past --autoplan-load-change, plan again with the
    /// planner from the profiles in --profile-cache (measuring nothing) and resize the models
    /// live (CPU cores, green SMs, MPS thread %). A critical model is never shrunk.
    #[arg(long)]
    pub autoplan: bool,
    /// The planner's margin: a predicted tail holds within this fraction of the deadline, and
    /// a critical model's measured p99 past it triggers a re-plan.
    #[arg(
        long,
        value_name = "FRACTION",
        default_value_t = 0.9,
        requires = "autoplan"
    )]
    pub autoplan_margin: f64,
    /// A model's request rate this fraction away from the rate it was planned for (0.5: ±50 %)
    /// triggers a re-plan.
    #[arg(
        long,
        value_name = "FRACTION",
        default_value_t = 0.5,
        requires = "autoplan"
    )]
    pub autoplan_load_change: f64,
    /// At least this long between two re-plans (and from the start to the first).
    #[arg(
        long,
        value_name = "SECONDS",
        default_value_t = 10.0,
        requires = "autoplan"
    )]
    pub autoplan_dwell: f64,
    /// Where --autoplan reads the profiles it plans from (`isolane plan --auto`'s cache;
    /// default as there: $XDG_CACHE_HOME/isolane/profiles or ~/.cache/isolane/profiles).
    #[arg(long, value_name = "DIR", requires = "autoplan")]
    pub profile_cache: Option<PathBuf>,
    #[command(flatten)]
    pub partitions: super::PartitionFlags,
}

pub fn run(args: ServeArgs, engine: &Engine) -> anyhow::Result<u8> {
    cli_session::check_drain_timeout(args.drain_timeout)?;
    let file = super::ScenarioFile::read(&args.scenario)?;
    let (mut scenario, name) = file.scenario()?;
    if !file.apps()?.is_empty() {
        return Err(user(format!(
            "{}: [[app]]s are not served yet; serve takes a scenario of [[workload]]s",
            args.scenario.display()
        )));
    }
    let note = &mut |n: &str| eprintln!("{n}");
    workloads_here(&mut scenario, &name, args.backend.as_deref(), note).map_err(|e| blame!(e))?;
    let admitted = super::admit_or_refuse(&scenario, &name)?;
    // As `run` does: a critical deadline predicted to miss beside its neighbours is said (or
    // refused) before any model is built ([protection] admission).
    isolane_executors::foresee::foresee_or_refuse(&scenario, &name, &mut |l| eprintln!("{l}"))?;
    // And each change while serving (ctl, --autoplan) beside the models it leaves loaded.
    let admission =
        isolane_executors::foresee::live_admission(&scenario, args.profile_cache.as_deref());
    let config = ServeConfig {
        scenario_path: args.scenario,
        http: args.http,
        grpc: args.grpc,
        out: args.out,
        force: args.force,
        trace: args.trace,
        drain_timeout: args.drain_timeout,
        access_log: !args.no_access_log,
        release: args.release,
        autoplan: args.autoplan.then_some(AutoplanFlags {
            margin: args.autoplan_margin,
            load_change: args.autoplan_load_change,
            dwell: args.autoplan_dwell,
            profile_cache: args.profile_cache,
        }),
        partitions: args.partitions.choices(),
    };
    cli_session::serve(
        &scenario,
        admitted.as_ref(),
        &config,
        engine,
        &isolane_executors::engine::memory_profile,
        admission,
    )
}
