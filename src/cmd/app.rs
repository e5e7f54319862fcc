//! `isolane run` of a scenario with `[[app]]`s: flags into an `isolane_app::session::AppRun`
//! (which checks the apps, sets their partitions up, runs them, feeds `--metrics-addr` and
//! writes summary.json's `apps` and `apps/<app>.csv`; docs/apps.md), admission, then the
//! tables and `--trace`.

use std::sync::Arc;

use isolane_app::session::{self, AppRun, AppRunError};
use isolane_app::spec::AppSpec;
use isolane_core::spec::Scenario;
use isolane_runtime::output;

use super::run::RunArgs;

/// A library error at the CLI's edge: the user's mistakes exit 2.
fn cli_error(e: AppRunError) -> anyhow::Error {
    blame!(e)
}

/// The apps' models as the workloads of a scenario on the same device, checked by core's
/// rules (a partition key the mechanism does not take, a precision the CPU does not run).
pub fn model_workloads(
    scenario: &Scenario,
    apps: &[AppSpec],
    file: &str,
) -> anyhow::Result<Scenario> {
    session::model_workloads(scenario, apps, file).map_err(cli_error)
}

/// `text`: the scenario file's text, as read once by the caller (written to scenario.toml and
/// given to the workers).
pub fn run(
    scenario: Scenario,
    scenario_name: String,
    text: &str,
    mut apps: Vec<AppSpec>,
    args: &RunArgs,
) -> anyhow::Result<u8> {
    let workloads = session::check(&scenario, &mut apps, &scenario_name, args.no_plan_check)
        .map_err(cli_error)?;
    let admitted = super::admit_or_refuse(&workloads, &scenario_name)?;
    session::place(&mut apps, &scenario, &scenario_name).map_err(cli_error)?;
    // Served before anything runs (a bad address is refused with nothing written).
    let live = super::serve_metrics(args.metrics_addr.as_deref())?;
    let out = super::run::prepare_out(args.out.as_deref(), args.force)?;
    output::write_atomic(&out.join("scenario.toml"), text.as_bytes())?;
    let stop = super::install_stop_handler()?;
    let mut view = super::ProgressView::new(args.quiet);
    let ran = session::run(AppRun {
        scenario: &scenario,
        file: &scenario_name,
        text,
        apps: &apps,
        workloads: &workloads,
        admitted,
        choices: args.partitions.choices(),
        stop: &stop,
        out: &out,
        no_plan_check: args.no_plan_check,
        models: Arc::new(isolane_executors::app_models::AppModels),
        share: isolane_executors::app_models::shared_partition,
        metrics: live.as_ref().map(|l| &l.metrics),
        observer: &mut view,
    })
    .map_err(cli_error)?;
    let summary = &ran.summary;
    let title = super::device_title(&scenario);
    println!(
        "{}",
        isolane_report::run_text::apps_tables(&title, &summary.apps)
    );
    for (app, rec) in apps.iter().zip(&ran.outcome.apps) {
        if let Some(e) = &rec.error {
            eprintln!("app `{}` failed: {e}", app.name);
        }
    }
    for warning in summary
        .apps
        .iter()
        .filter_map(isolane_app::metrics::late_source_warning)
    {
        eprintln!("{warning}");
    }
    if args.trace {
        super::trace::write(&out, &out.join("trace.json"))?;
    }
    println!("results: {}", out.display());
    Ok(super::exit_for(summary.status))
}
