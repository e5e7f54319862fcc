#!/usr/bin/env bash
# The fuzz targets (the parsers' and the footprint check's property tests, as scripts/fuzz.sh
# lists them) run for a set time each, all at once, each with a new random seed per round:
# for a long run on a machine with many cores, such as the GPU machine, which has no Rust
# toolchain.
#
#   scripts/fuzz-soak.sh stage                 # here: release test binaries into stage-fuzz/
#   (device run, carry ["stage-fuzz"])  bash scripts/fuzz-soak.sh run MINUTES [JOBS]
#                                              # there: every target for MINUTES, JOBS at once
#                                              # (default: the cores); figures in $OUT
#
# A round is one run of a target's test with ISOLANE_FUZZ_CASES cases (doubled while a round
# takes under 20 s, up to 2^30) and ISOLANE_FUZZ_SEED=random; a failing round keeps its log
# (seed, shrunk input) in $OUT/fuzz-failures/. Memory is capped per target (ulimit -v, 4 GiB), as in
# scripts/fuzz.sh. The summary, $OUT/fuzz-summary.md, has a row per target: rounds, cases,
# seconds, failures.
set -euo pipefail
cd "$(dirname "$0")/.."

# The property tests: package | cargo's target arguments | the test's name in its binary.
TESTS=(
    "isolane-core|--test fuzz_scenario|mutated_scenarios_never_panic"
    "isolane-core|--test fuzz_scenario|assembled_scenarios_never_panic"
    "isolane-core|--test fuzz_scenario|fuzz_mutated_summaries_are_read_or_refused"
    "isolane-engine|--test fuzz_parsers|edited_onnx_models_never_panic"
    "isolane-engine|--test fuzz_parsers|mutated_npy_files_never_panic"
    "isolane-engine|--test fuzz_parsers|assembled_npy_headers_never_panic"
    "isolane-engine|--test fuzz_parsers|mutated_safetensors_files_never_panic"
    "isolane-engine|--test fuzz_parsers|assembled_safetensors_headers_never_panic"
    "isolane-engine|--test fuzz_parsers|mutated_onnx_files_never_panic"
    "isolane-engine|--test fuzz_parsers|crafted_shapes_through_the_footprint_check_never_panic_nor_allocate_past_a_cap"
    "isolane-app|--test suite|fuzz_spec::a_replaced_value_is_read_or_refused"
    "isolane-app|--test suite|fuzz_spec::a_mutated_file_is_read_or_refused"
    "isolane-runtime|--lib|output::tests::fuzz::fuzz_jobs_csv_rows_are_refused_or_sound"
    "isolane-runtime|--lib|output::tests::fuzz::fuzz_jobs_csv_bytes_never_panic"
    "isolane-runtime|--lib|output::tests::fuzz::fuzz_jobs_csv_round_trips"
    "isolane-planner|--lib|cache::tests::fuzz::fuzz_profile_files_are_refused_or_usable"
    "isolane-trace|--lib|timeline::tests::fuzz::fuzz_jobs_files_are_refused_or_finite"
    "isolane-metrics|--lib|tests::arbitrary_requests_are_answered_or_closed_and_scrapes_go_on"
    "isolane-protocol|--lib|tests::fuzz::fuzz_encoded_requests_and_responses_round_trip"
    "isolane-protocol|--lib|tests::fuzz::fuzz_mutated_request_bodies_are_decoded_or_refused"
    "isolane-protocol|--lib|tests::fuzz::fuzz_edited_request_headers_are_decoded_or_refused"
    "isolane-protocol|--lib|tests::fuzz::fuzz_assembled_request_headers_are_decoded_or_refused"
    "isolane-protocol|--lib|tests::fuzz::fuzz_arbitrary_bodies_and_header_lengths_are_refused_or_decoded"
)

stage() {
    rm -rf stage-fuzz && mkdir -p stage-fuzz
    local t pkg args test name exe
    for t in "${TESTS[@]}"; do
        IFS='|' read -r pkg args test <<<"$t"
        name="$pkg--$(echo "$args" | sed 's/^--test //; s/^--lib$/lib/')"
        if [ ! -f "stage-fuzz/$name" ]; then
            # shellcheck disable=SC2086
            exe=$(cargo test --release -p "$pkg" $args --no-run --message-format=json 2>/dev/null |
                python3 -c '
import json, sys
for line in sys.stdin:
    m = json.loads(line)
    if m.get("reason") == "compiler-artifact" and m.get("profile", {}).get("test") and m.get("executable"):
        print(m["executable"])' | tail -n 1)
            cp "$exe" "stage-fuzz/$name"
        fi
        # A test that is not there (renamed) stops the staging here rather than on the machine.
        if ! "stage-fuzz/$name" --list 2>/dev/null | grep -x "$test: test" >/dev/null; then
            echo "no test $test in $name" >&2
            exit 1
        fi
        echo "$test" >>"stage-fuzz/$name.tests"
    done
    for f in stage-fuzz/*; do
        case $f in *.tests) ;; *) strip "$f" 2>/dev/null || true ;; esac
    done
    # Packed: the device tool carries at most 64 MiB with the whole work tree.
    tar cJf pack.tar.xz stage-fuzz && rm -rf stage-fuzz && mkdir stage-fuzz &&
        mv pack.tar.xz stage-fuzz/
    du -sh stage-fuzz
}

# One test for $2 minutes: rounds until the time is up.
soak_one() {
    local bin=$1 test=$2 minutes=$3 out=$4
    local end=$((SECONDS + minutes * 60)) cases=200 rounds=0 total=0 failures=0 spent=0
    local log
    log=$(mktemp)
    while [ "$SECONDS" -lt "$end" ]; do
        local left=$((end - SECONDS)) t0=$SECONDS
        if (ulimit -v 4194304 && ISOLANE_FUZZ_CASES=$cases ISOLANE_FUZZ_SEED=random \
            timeout "$left" "$bin" --exact "$test" --test-threads=1 --nocapture) >"$log" 2>&1; then
            rounds=$((rounds + 1))
            total=$((total + cases))
            spent=$((spent + SECONDS - t0))
            # Doubled up to 2^30 (ISOLANE_FUZZ_CASES is read as a u32).
            if [ $((SECONDS - t0)) -lt 20 ] && [ "$cases" -lt $((1 << 30)) ]; then cases=$((cases * 2)); fi
        elif [ $((SECONDS)) -ge "$end" ]; then
            break # cut off by the time limit: not a failure, not counted
        else
            failures=$((failures + 1))
            spent=$((spent + SECONDS - t0))
            mkdir -p "$out/fuzz-failures"
            cp "$log" "$out/fuzz-failures/$(basename "$bin")--${test//::/-}.$failures.log"
        fi
    done
    rm -f "$log"
    printf '| %s | %s | %d | %d | %d | %d |\n' "$(basename "$bin")" "$test" "$rounds" "$total" \
        "$spent" "$failures"
}

run() {
    local minutes=${1:?minutes}
    local jobs=${2:-$(nproc)}
    local out=${OUT:-/tmp/isolane-fuzz}
    mkdir -p "$out"
    if [ -f stage-fuzz/pack.tar.xz ]; then
        tar xJf stage-fuzz/pack.tar.xz && rm stage-fuzz/pack.tar.xz
    fi
    export -f soak_one
    {
        echo "| binary | test | rounds | cases | seconds | failures |"
        echo "| --- | --- | ---: | ---: | ---: | ---: |"
        for list in stage-fuzz/*.tests; do
            bin=${list%.tests}
            while read -r test; do
                printf '%s\0%s\0' "$PWD/$bin" "$test"
            done <"$list"
        done | xargs -0 -n 2 -P "$jobs" bash -c 'soak_one "$0" "$1" '"$minutes"' '"$out"
    } | tee "$out/fuzz-summary.md"
    awk -F'|' 'NR > 2 { r += $4; c += $5; s += $6; f += $7 }
        END { printf "total: %d rounds, %d cases, %.1f target-hours, %d failures\n", r, c, s / 3600, f }' \
        "$out/fuzz-summary.md" | tee -a "$out/fuzz-summary.md"
}

case "${1:-}" in
    stage) stage ;;
    run) shift; run "$@" ;;
    *) sed -n '2,16p' "$0"; exit 2 ;;
esac
