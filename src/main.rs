//! The `isolane` command line: thin, clap. Each subcommand lives in `cmd/<name>.rs`; this file
//! only declares them and maps results to exit codes (0 ok, 1 runtime failure, 2 user mistake,
//! 130 interrupted — see docs/runtime.md).

mod cmd;

use std::process::ExitCode;

use clap::{CommandFactory, FromArgMatches, Parser, Subcommand};
use isolane_session::signals::closed_pipe;

#[derive(Parser)]
#[command(
    name = "isolane",
    version,
    about = "Run several DNN inference workloads at once, each in its own partition, at fixed \
             rates with deadlines, and measure how well their deadlines are kept.",
    arg_required_else_help = true
)]
pub struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    Run(cmd::run::RunArgs),
    Maxrate(cmd::maxrate::MaxrateArgs),
    Isolation(cmd::isolation::IsolationArgs),
    Interference(cmd::interference::InterferenceArgs),
    Coexec(cmd::coexec::CoexecArgs),
    Compare(cmd::compare::CompareArgs),
    Bench(cmd::bench::BenchArgs),
    Build(cmd::build::BuildArgs),
    Plan(cmd::plan::PlanArgs),
    Devices(cmd::devices::DevicesArgs),
    Verify(cmd::verify::VerifyArgs),
    Models(cmd::models::ModelsArgs),
    Infer(cmd::infer::InferArgs),
    Report(cmd::report::ReportArgs),
    Sweep(cmd::sweep::SweepArgs),
    Completions(cmd::completions::CompletionsArgs),
    Man(cmd::completions::ManArgs),
    Summarize(cmd::summarize::SummarizeArgs),
    Trace(cmd::trace::TraceArgs),
    Explain(cmd::explain::ExplainArgs),
    Serve(cmd::serve::ServeArgs),
    Ctl(cmd::ctl::CtlArgs),
    Export(cmd::export::ExportArgs),
    /// Internal: one workload of a `host = "process"` run, driven by the coordinator over
    /// stdin/stdout.
    #[command(hide = true)]
    Worker(cmd::worker::WorkerArgs),
}

/// The whole command line as clap sees it: the derived definition plus what every command
/// shares (exit codes in each help, negative numbers reaching the value checks). Completions
/// and the man page are generated from this same definition.
pub fn cli() -> clap::Command {
    cmd::help::finish(Cli::command())
}

impl Command {
    /// Commands that only print and start no process: for them a closed pipe (`isolane models |
    /// head`) ends the process quietly, as for any Unix filter. The others keep Rust's default
    /// (SIGPIPE ignored) so that a coordinator writing to a worker that died gets an error it
    /// reports, not a silent death; their `println!` on a closed pipe ends them quietly too
    /// ([`closed_pipe`]).
    fn only_prints(&self) -> bool {
        matches!(
            self,
            Command::Models(_)
                | Command::Plan(cmd::plan::PlanArgs { auto: false, .. })
                | Command::Devices(_)
                | Command::Compare(_)
                | Command::Completions(_)
                | Command::Man(_)
        )
    }
}

fn main() -> ExitCode {
    let parsed = match Cli::from_arg_matches(&cli().get_matches()) {
        Ok(c) => c,
        Err(e) => e.exit(),
    };
    if parsed.command.only_prints() {
        closed_pipe::restore_default_sigpipe();
    }
    closed_pipe::quiet_on_closed_pipe();
    match std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| run(parsed.command))) {
        Ok(code) => code,
        Err(payload) if closed_pipe::is_closed_pipe_panic(payload.as_ref()) => {
            closed_pipe::end_by_sigpipe()
        }
        Err(payload) => std::panic::resume_unwind(payload),
    }
}

fn run(command: Command) -> ExitCode {
    // The one engine of this process, passed to every command that runs workloads.
    let engine = isolane_executors::engine::EngineExecutorsImpl::shared();
    let result = match command {
        Command::Run(a) => cmd::run::run(a, &engine),
        Command::Maxrate(a) => cmd::maxrate::run(a, &engine),
        Command::Isolation(a) => cmd::isolation::run(a, &engine),
        Command::Interference(a) => cmd::interference::run(a, &engine),
        Command::Coexec(a) => cmd::coexec::run(a, &engine),
        Command::Compare(a) => cmd::compare::run(a),
        Command::Bench(a) => cmd::bench::run(a),
        Command::Build(a) => cmd::build::run(a),
        Command::Plan(a) => cmd::plan::run(a, &engine),
        Command::Devices(a) => cmd::devices::run(a),
        Command::Verify(a) => cmd::verify::run(a),
        Command::Models(a) => cmd::models::run(a),
        Command::Infer(a) => cmd::infer::run(a),
        Command::Report(a) => cmd::report::run(a),
        Command::Sweep(a) => cmd::sweep::run(a, &engine),
        Command::Completions(a) => cmd::completions::completions(a, cli()),
        Command::Man(a) => cmd::completions::man(a, cli()),
        Command::Summarize(a) => cmd::summarize::run(a),
        Command::Trace(a) => cmd::trace::run(a),
        Command::Explain(a) => cmd::explain::run(a),
        Command::Serve(a) => cmd::serve::run(a, &engine),
        Command::Ctl(a) => cmd::ctl::run(a),
        Command::Export(a) => cmd::export::run(a),
        Command::Worker(a) => cmd::worker::run(a, &engine),
    };
    cmd::exit_code(result)
}
