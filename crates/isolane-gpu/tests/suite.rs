//! Every integration test of this crate in one binary: one link instead of one per file
//! (the test build's largest cost). Each file stays a module of its own name; a file
//! that must own its process (a global allocator, its own harness, environment
//! variables it sets) is a binary of its own (Cargo.toml, `autotests = false`).

#[path = "gpu.rs"]
mod gpu;
#[path = "mig_fake.rs"]
mod mig_fake;
#[path = "mps_fake.rs"]
mod mps_fake;
#[path = "two_gpus.rs"]
mod two_gpus;
#[path = "verify_scenarios.rs"]
mod verify_scenarios;
