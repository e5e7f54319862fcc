//! Every integration test of this crate in one binary: one link instead of one per file
//! (the test build's largest cost). Each file stays a module of its own name; a file
//! that must own its process (a global allocator, its own harness, environment
//! variables it sets) is a binary of its own (Cargo.toml, `autotests = false`).

// Each file keeps its own `mod common;`, as it had as a binary of its own, so that it still
// builds alone; the helpers are small and compiled once per module that uses them.
#![allow(clippy::duplicate_mod)]

#[path = "device_handoff.rs"]
mod device_handoff;
#[path = "fuzz_spec.rs"]
mod fuzz_spec;
#[path = "run.rs"]
mod run;
#[path = "workers.rs"]
mod workers;
