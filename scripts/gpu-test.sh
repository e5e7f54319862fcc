#!/usr/bin/env bash
# Build here, stage, run there. The GPU machine has no Rust toolchain, so:
#
#   scripts/gpu-test.sh stage            # here: release build of the binary and of every test
#                                        # binary, debug info stripped, copied into ./stage
#   (device run, carry ["stage"])  bash scripts/gpu-test.sh run [FILTER...]
#                                        # there: runs each staged test binary with --ignored
#                                        # (the GPU tests) and the reference checks; logs to $OUT
#
# ./stage is git-ignored and must stay under the 64 MiB carry limit.
set -euo pipefail
cd "$(dirname "$0")/.."

stage() {
    rm -rf stage && mkdir -p stage/tests
    cargo build --release --bin isolane
    cp target/release/isolane stage/isolane
    # Test binaries: ask cargo for their paths instead of guessing hashed names.
    # STAGE_PACKAGES="-p isolane-gpu" stages only those crates' tests (default: all).
    # shellcheck disable=SC2086
    cargo test --release ${STAGE_PACKAGES:---workspace} --no-run --message-format=json 2>/dev/null |
        python3 -c '
import json, sys
for line in sys.stdin:
    try: m = json.loads(line)
    except ValueError: continue
    if m.get("reason") == "compiler-artifact" and m.get("profile", {}).get("test") and m.get("executable"):
        # Prefix the crate folder name
        # so that tests/gpu.rs of two crates do not overwrite each other in stage/.
        pkg = m["manifest_path"].split("/")[-2]
        print(pkg + "--" + m["target"]["name"], m["executable"])
' | while read -r name exe; do cp "$exe" "stage/tests/$name"; done
    strip stage/isolane stage/tests/* 2>/dev/null || true
    # The Vulkan loader for isolane-graphics' GPU test: the GPU machine has the NVIDIA driver
    # but no loader, and this one needs only libc (Debian 12's, 450 KB).
    if [ -e /usr/lib/x86_64-linux-gnu/libvulkan.so.1 ]; then
        mkdir -p stage/lib && cp -L /usr/lib/x86_64-linux-gnu/libvulkan.so.1 stage/lib/
    fi
    du -sh stage
}

# There: makes the staged Vulkan loader and the NVIDIA driver's Vulkan ICD findable. The loader
# reads ICD manifests from the usual folders; where the driver library (libGLX_nvidia.so.0) is
# present without a manifest, one is written and named in VK_ICD_FILENAMES.
vulkan_setup() {
    # NVIDIA's Vulkan driver needs the GL vendor-neutral dispatch libraries (glvnd) beside the
    # loader, which the GPU machine lacks: bring them as Debian packages, once, here:
    #   mkdir -p .gl /tmp/amd64/partial; o='-oAPT::Architecture=amd64 -oAPT::Architectures=amd64
    #   -oDir::State::Lists=/tmp/amd64'; apt-get $o update; (cd .gl && apt-get $o download
    #   libvulkan1 libegl1 libglvnd0 libopengl0 libgl1 libglx0 libgles2)
    # and carry ".gl" with "stage": they are unpacked here (the H200 rendered with them).
    if ls .gl/*.deb >/dev/null 2>&1; then
        for f in .gl/*.deb; do dpkg -x "$f" /; done
        ldconfig
    fi
    if [ -e stage/lib/libvulkan.so.1 ]; then
        export LD_LIBRARY_PATH="$PWD/stage/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
    fi
    local f lib
    for f in /usr/share/vulkan/icd.d/nvidia_icd*.json /etc/vulkan/icd.d/nvidia_icd*.json; do
        if [ -e "$f" ]; then echo "vulkan: $f"; return 0; fi
    done
    # Where the GPU machine's container keeps the driver's manifest (outside the loader's path).
    f=/usr/local/nvidia/share/vulkan/icd.d/nvidia_icd.json
    if [ -e "$f" ]; then
        export VK_DRIVER_FILES=$f VK_ICD_FILENAMES=$f
        echo "vulkan: $f"
        return 0
    fi
    # (awk reads all of ldconfig's output: no SIGPIPE for pipefail to report)
    lib=$(ldconfig -p | awk '/libGLX_nvidia\.so\.0/ { p = $NF } END { print p }')
    if [ -z "$lib" ] && [ -e /usr/local/nvidia/lib64/libGLX_nvidia.so.0 ]; then
        lib=/usr/local/nvidia/lib64/libGLX_nvidia.so.0
    fi
    if [ -z "$lib" ]; then
        echo "vulkan: no NVIDIA Vulkan driver found (no nvidia_icd.json, no libGLX_nvidia.so.0)"
        return 0
    fi
    mkdir -p /tmp/isolane-vulkan
    printf '{"file_format_version": "1.0.0", "ICD": {"library_path": "%s", "api_version": "1.3"}}\n' \
        "$lib" >/tmp/isolane-vulkan/nvidia_icd.json
    export VK_ICD_FILENAMES=/tmp/isolane-vulkan/nvidia_icd.json
    echo "vulkan: wrote an ICD manifest for $lib"
}

run() {
    out=${OUT:-/tmp/isolane-out}
    mkdir -p "$out"
    export ISOLANE_BIN="$PWD/stage/isolane"
    nvidia-smi --query-gpu=name,driver_version,memory.total,mig.mode.current --format=csv | tee "$out/gpu.txt"
    vulkan_setup
    status=0
    for t in stage/tests/*; do
        name=$(basename "$t")
        # The CPU timing tests have no GPU test, and their harness rejects --nocapture.
        if [ "$name" = isolane--timing ]; then continue; fi
        # Filters match a whole staged name or its part after "--" (the test target), or a test
        # file of a crate's "suite" binary (every integration test file of a crate is a module
        # of tests/suite.rs): `isolane-gpu--gpu` or `gpu` runs isolane-gpu--suite's gpu::.
        modules=()
        if [ "$#" -gt 0 ]; then
            crate=${name%%--*}
            dir=crates/$crate
            [ "$crate" = isolane ] && dir=.
            whole=0
            for f in "$@"; do
                if [ "$f" = "$name" ] || [ "$f" = "${name#*--}" ]; then whole=1; fi
                m=${f#*--}
                if [ "${name#*--}" = suite ] && [ -f "$dir/tests/$m.rs" ] &&
                    { [ "$f" = "$m" ] || [ "${f%%--*}" = "$crate" ]; }; then
                    modules+=("$m::")
                fi
            done
            if [ "$whole" = 1 ]; then modules=(); elif [ "${#modules[@]}" -eq 0 ]; then continue; fi
        fi
        echo "=== $name (--ignored) ${modules[*]}"
        if ! "$t" "${modules[@]}" --ignored --test-threads=1 --nocapture 2>&1 | tee "$out/test-$name.log" | tail -n 60; then status=1; fi
    done
    return $status
}

# There: isolane's cuda backend and PyTorch (eager, CUDA graphs) on the same models, batches
# and precisions, in one call, then one table with the ratios.
#   bash scripts/gpu-test.sh bench [MODELS] [BATCHES] [PRECISIONS] [REPLAYS]
bench() {
    local out=${OUT:-/tmp/isolane-out}
    mkdir -p "$out"
    models=${1:-resnet18,resnet50,mobilenet_v2,convnext_base,convnext_large,vit_b_16,vit_l_32}
    batches=${2:-1}
    precs=${3:-fp16,tf32}
    replays=${4:-200}
    nvidia-smi --query-gpu=name,driver_version,clocks.sm,temperature.gpu --format=csv,noheader | tee "$out/gpu.txt"
    ./stage/isolane bench --model "$models" --batch "$batches" --precision "$precs" \
        --replays "$replays" --json | tee "$out/ours.jsonl"
    # COMPILE=MODE (e.g. reduce-overhead) adds torch.compile's column: minutes per model.
    PYTHONUNBUFFERED=1 python3 bench/pytorch_baseline.py --models "$models" --batch "$batches" \
        --precisions "$precs" --replays "$replays" ${COMPILE:+--compile "$COMPILE"} \
        --ours "$out/ours.jsonl" | tee "$out/table.txt"
}

# There: what the engine issue still has to show on the GPU, in two calls (10 minutes each at
# most): `engine-checks correctness`, then `engine-checks memory,batch64,quickstart`.
#   bash scripts/gpu-test.sh engine-checks [correctness,memory,batch64,quickstart]
# correctness: the cuda backend against PyTorch directly, same exported weights, 7 models ×
#   fp32/tf32/fp16/bf16 (tools/reference); memory: the free-memory drop per model with and without
#   cuDNN's algorithm search (ISOLANE_CUDA_CONV=gemm) and for a second copy of the model in the same
#   process; batch64: the batch-64 fp16 table against PyTorch + graphs; quickstart: `isolane run`
#   with no scenario (the GPU quickstart).
engine_checks() {
    out=${OUT:-/tmp/isolane-out}
    mkdir -p "$out"
    parts=${1:-correctness,memory,batch64,quickstart}
    # MODELS=a,b narrows or widens the list (fcn_resnet50 works too; yolov8n needs Ultralytics
    # for the PyTorch side, which the GPU machine lacks).
    models=${MODELS:-resnet18,resnet50,mobilenet_v2,convnext_base,convnext_large,vit_b_16,vit_l_32}
    nvidia-smi --query-gpu=name,driver_version,clocks.sm,temperature.gpu --format=csv,noheader | tee "$out/gpu.txt"
    status=0
    if [[ $parts == *correctness* ]]; then
        echo "=== correctness: cuda backend vs PyTorch (same weights and input)"
        PYTHONUNBUFFERED=1 python3 tools/reference/export.py --no-onnx --torch-cuda fp32,tf32,fp16,bf16 --out /tmp/ref ${models//,/ } >"$out/export.log" 2>&1 \
            || { tail -n 20 "$out/export.log"; status=1; }
        for p in fp32 tf32 fp16 bf16; do
            PYTHONUNBUFFERED=1 python3 tools/reference/compare.py --isolane stage/isolane --ref /tmp/ref \
                --backend cuda --precision "$p" --kinds safetensors --no-ort \
                --markdown "$out/correctness-$p.md" ${models//,/ } || status=1
        done
    fi
    if [[ $parts == *memory* ]]; then
        echo "=== memory: free-memory drop, default vs no cuDNN search (ISOLANE_CUDA_CONV=gemm)"
        ./stage/isolane bench --model "$models" --batch 1 --precision fp16 --replays 20 --json \
            | tee "$out/memory-default.jsonl" || status=1
        ISOLANE_CUDA_CONV=gemm ./stage/isolane bench --model "$models" --batch 1 --precision fp16 \
            --replays 20 --json | tee "$out/memory-gemm.jsonl" || status=1
        # The same model twice in one process (the first is freed before the second compiles):
        # the second drop is what a model costs once the libraries' code is loaded; the rest of
        # the first drop is paid once per process.
        ./stage/isolane bench --model resnet18,resnet18,mobilenet_v2,mobilenet_v2 --batch 1 \
            --precision fp16 --replays 20 --json | tee "$out/memory-twice.jsonl" || status=1
    fi
    if [[ $parts == *batch64* ]]; then
        echo "=== batch 64, fp16"
        OUT="$out/b64" bench "$models" 64 fp16 20 || status=1
    fi
    if [[ $parts == *quickstart* ]]; then
        echo "=== quickstart (no scenario: the GPU quickstart when a GPU is present)"
        ./stage/isolane run --quiet --out "$out/quickstart" | tail -n 20 || status=1
    fi
    return $status
}

# There: `kill -9` of an isolane process that runs an MPS scenario leaves nothing behind: no
# nvidia-cuda-mps-control/-server, no worker, no private directory (issue 11). For `run` and
# `verify`: start it, wait (polling) until the MPS server has a client, kill -9 isolane, then
# poll up to 30 s for every trace to be gone.
#   bash scripts/gpu-test.sh leaks
leaks() {
    out=${OUT:-/tmp/isolane-out}
    mkdir -p "$out"
    if pgrep -f nvidia-cuda-mps >/dev/null; then
        echo "leaks: an MPS daemon is already running; cannot tell ours from it" >&2
        pgrep -af nvidia-cuda-mps >&2
        return 1
    fi
    status=0
    leak_case run ./stage/isolane run scenarios/gpu/mps-4x25-resnet18.toml --quiet --out "$out/leaks-run" || status=1
    leak_case verify ./stage/isolane verify crates/isolane-gpu/scenarios/verify-mps-4x25.toml || status=1
    return $status
}

# leak_case NAME COMMAND...: one kill -9 case of `leaks`.
leak_case() {
    local name=$1
    shift
    "$@" >"$out/leaks-$name.log" 2>&1 &
    local pid=$! i
    for i in $(seq 1 1200); do
        pgrep -f nvidia-cuda-mps-server >/dev/null && break
        kill -0 "$pid" 2>/dev/null || { echo "leaks $name: isolane ended before MPS started"; cat "$out/leaks-$name.log"; return 1; }
        sleep 0.1
    done
    pgrep -f nvidia-cuda-mps-server >/dev/null || { echo "leaks $name: no MPS server after 120 s"; kill -9 "$pid"; return 1; }
    echo "leaks $name: before kill -9:"
    pgrep -af 'nvidia-cuda-mps|isolane' | grep -v gpu-test.sh || true
    kill -9 "$pid"
    wait "$pid" 2>/dev/null || true
    local left=""
    for i in $(seq 1 300); do
        left=$(pgrep -af 'nvidia-cuda-mps|isolane worker' || true)
        dirs=$(ls -d "${TMPDIR:-/tmp}"/isolane-mps-* 2>/dev/null || true)
        [ -z "$left$dirs" ] && { echo "leaks $name: nothing left $((i / 10)).$((i % 10)) s after kill -9"; return 0; }
        sleep 0.1
    done
    echo "leaks $name: LEFT BEHIND 30 s after kill -9:"
    echo "$left"
    echo "$dirs"
    return 1
}


# There: memory admission's estimates against measurement (docs/partitions.md). Runs
# scenarios/gpu/memory-*.toml and prints, per workload, what admission control counted
# (memory_estimate_mib) beside what was measured (gpu_memory_mib: NVML's per-process peak for a
# worker, the engine's own allocations for a thread-hosted workload sharing the process).
#   bash scripts/gpu-test.sh memory
memory() {
    local out=${OUT:-/tmp/isolane-out} status=0
    mkdir -p "$out"
    for s in scenarios/gpu/memory-*.toml; do
        local dir="$out/memory-$(basename "$s" .toml)"
        ./stage/isolane run "$s" --quiet --out "$dir" >"$dir.log" 2>&1 || { status=1; tail -5 "$dir.log"; }
        python3 - "$dir/summary.json" <<'PY'
import json, sys
s = json.load(open(sys.argv[1]))
print(f"{sys.argv[1]}:")
print(f"  {'workload':16} {'host':8} {'estimate MiB':>12} {'measured MiB':>12} {'ratio':>6}")
for w in s["workloads"]:
    e, m = w.get("memory_estimate_mib"), w.get("gpu_memory_mib")
    r = f"{e / m:.2f}" if e and m else "-"
    print(f"  {w['name']:16} {w['host']:8} {e or '-':>12} {m if m is not None else '-':>12} {r:>6}")
PY
    done
    return $status
}

# There: the planner on the H100 (issue 15). For each scenarios/planner/*.toml (or the names
# given): plan --auto with a profile cache, verify the plan by running it, then plan again from
# the warm cache and time that. The profiles and the verification runs come back as
# $OUT/plan.tgz (commit the profiles: offline planning reads them); the printed plans and
# tables as text files. PROFILES=DIR starts from a cache carried in. STRETCH_FROM=DIR gives
# three-cameras its --stretch-from (default: the committed green fp16 matrix). PLAN_ARGS adds
# flags to every plan (e.g. "--phases stagger"), VERIFY_ARGS to the verified ones (e.g.
# "--verify-duration 30").
#   bash scripts/gpu-test.sh plan [NAME...]
plan() {
    local out=${OUT:-/tmp/isolane-out} status=0 s name rc work=/tmp/isolane-plan
    mkdir -p "$out" "$work/profiles"
    [ -n "${PROFILES:-}" ] && cp -r "$PROFILES"/. "$work/profiles/"
    local names=("$@")
    [ ${#names[@]} -eq 0 ] && names=(three-cameras inspection-line heavy-inspection five-mps)
    for name in "${names[@]}"; do
        s="scenarios/planner/$name.toml"
        local extra=()
        [ "$name" = three-cameras ] && extra=(--stretch-from "${STRETCH_FROM:-results/h100-interference/green-fp16}")
        # shellcheck disable=SC2206 # PLAN_ARGS is a list of flags
        extra+=(${PLAN_ARGS:-})
        # Twice: the second plan starts from the stretch the first verification measured.
        for pass in 1 2; do
            local tag=$name
            [ "$pass" = 2 ] && tag=$name.2
            echo "=== plan --auto --verify $name (pass $pass)"
            rc=0
            ./stage/isolane plan --auto "$s" --profile-cache "$work/profiles" "${extra[@]}" \
                -o "$work/$tag.planned.toml" --verify --verify-out "$work/verify-$tag" ${VERIFY_ARGS:-} \
                >"$work/plan-$tag.txt" 2>"$work/plan-$tag.err" || rc=$?
            echo "exit $rc" | tee -a "$work/plan-$tag.txt"
            [ "$rc" -eq 0 ] || status=1
            cat "$work/plan-$tag.txt"
            grep -v '^telemetry:' "$work/plan-$tag.err" | grep -v '^profiled' | tail -n 30
        done
        echo "=== warm-cache planning time, $name"
        local t0 t1
        t0=$(date +%s.%N)
        ./stage/isolane plan --auto "$s" --profile-cache "$work/profiles" "${extra[@]}" \
            >"$work/replan-$name.toml" 2>"$work/replan-$name.err" || true
        t1=$(date +%s.%N)
        python3 -c "print(f'planning from the warm cache: {$t1 - $t0:.3f} s')" | tee "$work/replan-$name.time"
    done
    # The device tool brings back only a few files: one archive with everything.
    tar czf "$out/plan.tgz" -C "$work" --exclude='*.csv' .
    return $status
}

# There: paper 004's study of concurrent apps (scripts/apps_study.py, docs/apps.md), with the
# Vulkan driver made findable for the graphics stage (carry ".gl" with "stage"):
#   RESULTS=results/h100-apps-study bash scripts/gpu-test.sh apps-study --apps 1,2,3 --duration 15
# The results folder (per-job CSVs left out) comes back as $OUT/apps-study.tgz.
apps_study() {
    local out=${OUT:-/tmp/isolane-out} results=${RESULTS:-results/apps-study} status=0
    mkdir -p "$out"
    vulkan_setup
    # STUDY_TIMEOUT=S stops the study after S seconds and still archives the runs it finished
    # (a device call has 10 minutes); 0, the default, sets no limit.
    timeout "${STUDY_TIMEOUT:-0}" python3 scripts/apps_study.py --isolane stage/isolane \
        --out "$results" "$@" || status=$?
    tar czf "$out/apps-study.tgz" --exclude='*/jobs/*.csv' "$results"
    return $status
}

case "${1:-}" in
    stage) stage ;;
    apps-study) shift; apps_study "$@" ;;
    run) shift; run "$@" ;;
    bench) shift; bench "$@" ;;
    engine-checks) shift; engine_checks "$@" ;;
    leaks) leaks ;;
    memory) memory ;;
    plan) shift; plan "$@" ;;
    *) echo "usage: $0 stage | apps-study [ARGS] | run [TEST_BINARY_NAME...] | bench [MODELS] [BATCHES] [PRECISIONS] [REPLAYS] | engine-checks [PARTS] | leaks | memory | plan [NAME...]" >&2; exit 2 ;;
esac
