//! isolane-runtime: hosts (thread/process workers), the release loop, the coordinator,
//! experiments and result files.
