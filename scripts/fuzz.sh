#!/usr/bin/env bash
# The property tests of the parsers (scenario TOML and its [[app]]s, npy, safetensors, ONNX, the
# jobs CSV as summarize and compare read it and as trace and report do, summary.json, the
# planner's profile files, the inference protocol's request bodies), run longer than `cargo test`
# does (which runs 3000 scenario cases, 300 per engine target and for summary.json, 500 per jobs
# CSV and profile target, 500 to 1000 per protocol target).
#
#   scripts/fuzz.sh [CASES]      # default 20000 cases per target; a new random seed every run
#                                (ISOLANE_FUZZ_SEED=N replays seed N; `cargo test` replays a fixed one)
#
# Memory is capped (ulimit -v, 4 GiB) so that an input that makes a reader allocate without bound
# ends this run with "memory allocation of N bytes failed" instead of taking the machine's memory;
# rerun the failing target with --nocapture to see the input. A failure prints the shrunk input.
set -euo pipefail
cd "$(dirname "$0")/.."
cases=${1:-20000}
cargo test --release -p isolane-core --test fuzz_scenario --no-run
cargo test --release -p isolane-engine --test fuzz_parsers --no-run
cargo test --release -p isolane-app --test suite --no-run
cargo test --release -p isolane-runtime --lib --no-run
cargo test --release -p isolane-planner --lib --no-run
cargo test --release -p isolane-trace --lib --no-run
cargo test --release -p isolane-protocol --features grpc --lib --no-run
ulimit -v 4194304
export ISOLANE_FUZZ_CASES=$cases
export ISOLANE_FUZZ_SEED=${ISOLANE_FUZZ_SEED:-random}
status=0
cargo test --release -p isolane-core --test fuzz_scenario -- --test-threads=1 --nocapture || status=1
cargo test --release -p isolane-engine --test fuzz_parsers -- --test-threads=1 --nocapture || status=1
cargo test --release -p isolane-app --test suite fuzz_spec:: -- --test-threads=1 --nocapture || status=1
# The apps' targets are a module of their crate's test suite; the jobs CSV's and
# the profiles' are unit-test modules of their crates (output.rs, cache.rs, timeline.rs): only
# the fuzz_ tests.
cargo test --release -p isolane-runtime --lib fuzz_ -- --test-threads=1 --nocapture || status=1
cargo test --release -p isolane-planner --lib fuzz_ -- --test-threads=1 --nocapture || status=1
cargo test --release -p isolane-trace --lib fuzz_ -- --test-threads=1 --nocapture || status=1
# With its gRPC decoders (feature grpc): their targets are fuzz_grpc_*.
cargo test --release -p isolane-protocol --features grpc --lib fuzz_ -- --test-threads=1 --nocapture || status=1
exit $status
