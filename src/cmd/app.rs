//! `isolane run` of a scenario with `[[app]]`s: flags into an `isolane_app::command`
//! configuration (which checks, admits and places the apps, then runs them into the results
//! folder, feeding `--metrics-addr`; docs/apps.md), then the tables and `--trace`.

use std::sync::Arc;

use isolane_app::command::{self, AppCommand};
use isolane_app::spec::AppSpec;
use isolane_core::spec::Scenario;

use super::run::RunArgs;

/// The apps' models as the workloads of a scenario on the same device, checked by core's
/// rules (a partition key the mechanism does not take, a precision the CPU does not run).
pub fn model_workloads(
    scenario: &Scenario,
    apps: &[AppSpec],
    file: &str,
) -> anyhow::Result<Scenario> {
    isolane_app::session::model_workloads(scenario, apps, file).map_err(command::error)
}

/// `text`: the scenario file's text, as read once by the caller (written to scenario.toml and
/// given to the workers).
pub fn run(
    scenario: Scenario,
    scenario_name: String,
    text: &str,
    apps: Vec<AppSpec>,
    args: &RunArgs,
) -> anyhow::Result<u8> {
    let checked = command::check(
        &scenario,
        &scenario_name,
        apps,
        args.no_plan_check,
        &|workloads, file| super::admit_or_refuse(workloads, file),
    )?;
    // Served before anything runs (a bad address is refused with nothing written).
    let live = super::serve_metrics(args.metrics_addr.as_deref())?;
    let done = command::run(
        checked,
        AppCommand {
            scenario: &scenario,
            file: &scenario_name,
            text,
            out: args.out.as_deref(),
            force: args.force,
            quiet: args.quiet,
            no_plan_check: args.no_plan_check,
            choices: args.partitions.choices(),
            models: Arc::new(isolane_executors::app_models::AppModels),
            share: isolane_executors::app_models::shared_partition,
            metrics: live.as_ref().map(|l| &l.metrics),
        },
    )?;
    let (summary, out) = (&done.ran.summary, &done.out);
    let title = super::device_title(&scenario);
    println!(
        "{}",
        isolane_report::run_text::apps_tables(&title, &summary.apps)
    );
    for (app, rec) in done.apps.iter().zip(&done.ran.outcome.apps) {
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
        super::trace::write(out, &out.join("trace.json"))?;
    }
    println!("results: {}", out.display());
    Ok(super::exit_for(summary.status))
}
