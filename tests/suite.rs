//! Every integration test of this crate in one binary: one link instead of one per file
//! (the test build's largest cost). Each file stays a module of its own name; a file
//! that must own its process (a global allocator, its own harness, environment
//! variables it sets) is a binary of its own (Cargo.toml, `autotests = false`).

// Each file keeps its own `mod common;`, as it had as a binary of its own, so that it still
// builds alone; the helpers are small and compiled once per module that uses them.
#![allow(clippy::duplicate_mod)]

#[path = "cli.rs"]
mod cli;
#[path = "cli_help.rs"]
mod cli_help;
#[path = "coexec_cli.rs"]
mod coexec_cli;
#[path = "infer_cli.rs"]
mod infer_cli;
#[path = "interference_cli.rs"]
mod interference_cli;
#[path = "limits_cli.rs"]
mod limits_cli;
#[path = "observability.rs"]
mod observability;
#[path = "papers_digest.rs"]
mod papers_digest;
#[path = "papers_driver.rs"]
mod papers_driver;
#[path = "plan_auto.rs"]
mod plan_auto;
#[path = "plan_cli.rs"]
mod plan_cli;
#[path = "plan_offline.rs"]
mod plan_offline;
#[path = "readme.rs"]
mod readme;
#[path = "scenarios.rs"]
mod scenarios;
#[path = "serve.rs"]
mod serve;
#[path = "sweep_report_cli.rs"]
mod sweep_report_cli;
