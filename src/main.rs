//! The `isolane` command line: thin, clap. Each subcommand lives in `cmd/<name>.rs`; this file
//! only declares them and maps results to exit codes (0 ok, 1 runtime failure, 2 user mistake,
//! 130 interrupted — see docs/runtime.md).

mod cmd;

use std::process::ExitCode;

use clap::{CommandFactory, FromArgMatches, Parser, Subcommand};

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
    /// reports, not a silent death.
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

fn restore_default_sigpipe() {
    // SAFETY: signal(2) with a valid signal number and SIG_DFL; called before any thread starts.
    unsafe {
        libc::signal(libc::SIGPIPE, libc::SIG_DFL);
    }
}

/// Whether a panic is `println!`'s on a closed stdout (or stderr): `isolane trace DIR | head -c
/// 0` closes the pipe before anything is printed.
fn closed_pipe_panic(payload: &(dyn std::any::Any + Send)) -> bool {
    let text = payload
        .downcast_ref::<String>()
        .map(String::as_str)
        .or_else(|| payload.downcast_ref::<&str>().copied())
        .unwrap_or("");
    let epipe = std::io::Error::from_raw_os_error(libc::EPIPE).to_string();
    text.starts_with("failed printing to std") && text.ends_with(&epipe)
}

/// A closed pipe ends a command quietly, as it ends other Unix tools (killed by SIGPIPE), for
/// every command: the ones that start processes keep SIGPIPE ignored (see
/// [`Command::only_prints`]), so their `println!` panics instead. The panic says nothing, the
/// command unwinds (partitions and processes are released on the way, as for an error), and
/// [`main`] then ends by SIGPIPE.
fn quiet_on_closed_pipe() {
    let report = std::panic::take_hook();
    std::panic::set_hook(Box::new(move |info| {
        if !closed_pipe_panic(info.payload()) {
            report(info);
        }
    }));
}

/// Ends the process as a closed pipe ends a Unix filter: by SIGPIPE (a shell sees 141).
fn end_by_sigpipe() -> ExitCode {
    restore_default_sigpipe();
    // SAFETY: raise(3) with a valid signal number; SIGPIPE's action is the default (end).
    unsafe {
        libc::raise(libc::SIGPIPE);
    }
    ExitCode::from(128 + libc::SIGPIPE as u8)
}

fn main() -> ExitCode {
    let parsed = match Cli::from_arg_matches(&cli().get_matches()) {
        Ok(c) => c,
        Err(e) => e.exit(),
    };
    if parsed.command.only_prints() {
        restore_default_sigpipe();
    }
    quiet_on_closed_pipe();
    match std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| run(parsed.command))) {
        Ok(code) => code,
        Err(payload) if closed_pipe_panic(payload.as_ref()) => end_by_sigpipe(),
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
