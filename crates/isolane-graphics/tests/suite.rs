//! Every integration test of this crate in one binary: one link instead of one per file
//! (the test build's largest cost). Each file stays a module of its own name; a file
//! that must own its process (a global allocator, its own harness, environment
//! variables it sets) is a binary of its own (Cargo.toml, `autotests = false`).

#[path = "gpu.rs"]
mod gpu;
#[path = "render.rs"]
mod render;
