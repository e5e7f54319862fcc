//! What the property tests of every parser share (scenario TOML here, npy, safetensors and
//! ONNX in the engine): how many cases, and which seed (`test-support` feature only).

use proptest::test_runner::{Config, RngSeed};

/// `ISOLANE_FUZZ_CASES` cases (default `default_cases`), no failure files written into the
/// tree (a failure is reported with its shrunk input), and the seed of [`seed`].
pub fn config(default_cases: u32) -> Config {
    Config {
        cases: std::env::var("ISOLANE_FUZZ_CASES")
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or(default_cases),
        failure_persistence: None,
        rng_seed: seed(),
        ..Config::default()
    }
}

/// `cargo test` replays one fixed seed, so CI is deterministic: a new input found by
/// `scripts/fuzz.sh` (which sets `ISOLANE_FUZZ_SEED=random`) fails there first, not on a random
/// later CI run. A number replays that seed.
pub fn seed() -> RngSeed {
    match std::env::var("ISOLANE_FUZZ_SEED").ok().as_deref() {
        // Drawn here and printed (not proptest's own random seed) so that a run that aborts
        // (an allocation failure under scripts/fuzz.sh's memory cap) can still be replayed.
        Some("random") => {
            let n = std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| d.as_nanos() as u64);
            eprintln!("fuzz seed {n} (ISOLANE_FUZZ_SEED={n} replays it)");
            RngSeed::Fixed(n)
        }
        Some(v) => RngSeed::Fixed(
            v.parse()
                .expect("ISOLANE_FUZZ_SEED is a number or `random`"),
        ),
        None => RngSeed::Fixed(0x15_01a4e),
    }
}

pub mod alloc;
