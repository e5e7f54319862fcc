//! `isolane ctl [--server ADDR] status|resize|load|unload`: control a running `isolane serve`
//! through its HTTP address (docs/serve.md, "Control while serving"). Flags → one request of
//! `isolane_serve::ctl_client`; the server makes and checks the change.

use clap::{Args, Subcommand};
use isolane_serve::ctl_client::{self, Action};

#[derive(Args)]
#[command(
    about = "Control a running `isolane serve`: status, resize, load, unload",
    long_about = "Talks to a running `isolane serve` through its HTTP address. `status` lists \
                  each model's partition, criticality, deadline and load (request rate, queue, \
                  p99 over the last 10 s) and its last change. `resize NAME KEY=VALUE…` moves a \
                  model to another partition (cpu=2,3: the cores of a CPU model) or changes its \
                  deadline_ms or criticality: the server checks every setting first, builds the \
                  model's new instance and warms it while the old one serves, then switches; \
                  the reply says how long that took and how long the model served nothing. \
                  `load` and `unload` are Triton's repository load and unload. A refused change \
                  exits 2 with the server's reason."
)]
pub struct CtlArgs {
    /// The server's HTTP address (`isolane serve --http`).
    #[arg(
        long,
        value_name = "HOST:PORT",
        default_value = "127.0.0.1:8000",
        global = true
    )]
    pub server: String,
    /// Print the server's JSON answer instead of words.
    #[arg(long, global = true)]
    pub json: bool,
    #[command(subcommand)]
    pub action: CtlAction,
}

#[derive(Subcommand)]
pub enum CtlAction {
    /// Each model's state, partition, criticality, deadline, load and last change.
    Status,
    /// Change a model while it serves: cpu=LIST (cores), sms=N (green SMs on a GPU),
    /// thread_pct=P (MPS), deadline_ms=MS, criticality=critical|best_effort.
    Resize {
        /// The model (its workload's name).
        name: String,
        /// KEY=VALUE settings, all checked before any is made.
        #[arg(required = true, value_name = "KEY=VALUE")]
        settings: Vec<String>,
    },
    /// Load a model again (a loaded one is rebuilt and its new instance takes over).
    Load {
        /// The model (its workload's name).
        name: String,
    },
    /// Unload a model: new requests are refused, those taken are answered, its instance ends.
    Unload {
        /// The model (its workload's name).
        name: String,
    },
}

pub fn run(args: CtlArgs) -> anyhow::Result<u8> {
    let action = match args.action {
        CtlAction::Status => Action::Status,
        CtlAction::Resize { name, settings } => Action::Resize { name, settings },
        CtlAction::Load { name } => Action::Load { name },
        CtlAction::Unload { name } => Action::Unload { name },
    };
    let text = ctl_client::call(&args.server, &action, args.json).map_err(|e| blame!(e))?;
    println!("{text}");
    Ok(0)
}
