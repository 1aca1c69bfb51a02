#!/usr/bin/env bash
# Every GPU check hetflow has, in one bounded run on a GPU host (how docs/gpu.md was measured).
#
#   scripts/device_check.sh                     # needs python3 with a CUDA or ROCm torch
#   DEADLINE_S=540 OUT=/tmp/check scripts/device_check.sh
#   SITE=.devsite/site.tar.xz scripts/device_check.sh   # extra packages (Ray, pydantic, ...)
#   ONLY="record inventory tests" scripts/device_check.sh  # some steps only
#
# The tests step reads the recorded outputs and traces the repository carries
# (tests/fixtures/topology, data/traces): nothing else needs to travel with it but SITE.
#
# Run it on a host with no other Ray running: step 5 starts a Ray head here, and the end stops
# every Ray of this host (`ray stop`).
#
# Steps, in order, each under its own time limit and all under DEADLINE_S (default 540 s); a step
# that fails does not stop the next. At the end a table of every step's exit code.
#  1. record   the vendor tools' output (nvidia-smi -q -x, topo -m, --query-gpu; rocm-smi/amd-smi
#              where present) into recorded/, to become test fixtures
#  2. inventory `hetflow inventory` (live NVML/amdsmi discovery) and its --json
#  3. tests    tests/accelerators and tests/core with the real vendor library present (hermetic?),
#              and tests/serving/test_precision.py with HETFLOW_TEST_DEVICE=gpu (bf16/fp16 on GPU)
#  4. train    scripts/gpu_check.sh: the GPT in bf16 with nccl on Ray's own GPUs (a local Ray)
#  5. userserve `hetflow serve examples/serve_digits.yaml` as a user runs it: the embedded default
#              Ray (node IP not pinned), ready on /health, a prediction over HTTP, SIGTERM stops it
#  5b. node    `hetflow node start`: this host as a hetflow node (devices as hetflow resources)
#  6. workflow `hetflow run examples/digits_gpu.yaml --address auto`: train on a GPU rank bound by
#              hetflow, export bf16, two bf16 replicas sharing the GPU, a load test
#  7. serving  benchmarks/serving.py --quick (hetflow vs plain Ray Serve fastest/default, with
#              `hey`: apt-get install -y hey; SERVING_ARGS replaces --quick)
#  8. sampler  scripts/gpu_sampler_check.py: the metrics sampler (NVML/amdsmi) sees work we start
#  9. metrics  `hetflow top --once` on the node: its agents' device readings through Ray's KV
# 10. tune     `hetflow tune` (random + ASHA, 8 trials) with trials sharing the GPU by memory
#              (random search: Optuna is not needed on the host)
# Output under OUT (default results/device-check): log.txt and recorded.tar.gz.
set -u
cd "$(dirname "$0")/.."
REPO="$PWD"
OUT="${OUT:-$REPO/results/device-check}"
DEADLINE_S="${DEADLINE_S:-540}"
PYTHON="${PYTHON:-python3}"
mkdir -p "$OUT/recorded"
REC="$OUT/recorded"
exec > >(tee -a "$OUT/log.txt") 2>&1
START=$(date +%s)
touch "$OUT/.started"
declare -a SUMMARY=()

step() {  # step NAME LIMIT_S COMMAND...: run under min(LIMIT_S, time left), record its exit code
    local name=$1 limit=$2 left rc
    shift 2
    if [ -n "${ONLY:-}" ] && [[ " $ONLY " != *" $name "* ]]; then return; fi
    left=$(( DEADLINE_S - ($(date +%s) - START) - 15 ))
    if (( left < 10 )); then
        echo "=== $name: skipped, no time left"; SUMMARY+=("$name skipped"); return
    fi
    (( limit > left )) && limit=$left
    echo "=== $name (limit ${limit}s, at +$(( $(date +%s) - START ))s)"
    timeout -k 5 "$limit" "$@"
    rc=$?
    echo "=== $name: exit $rc (at +$(( $(date +%s) - START ))s)"
    SUMMARY+=("$name $rc")
}

if [ -n "${SITE:-}" ] && [ -f "$SITE" ]; then  # packages the host lacks, unpacked once
    mkdir -p /tmp/hetflow-site
    [ -d /tmp/hetflow-site/ray ] || tar -xJf "$SITE" -C /tmp/hetflow-site || "$PYTHON" -c \
        "import sys, tarfile; tarfile.open(sys.argv[1]).extractall(sys.argv[2])" "$SITE" /tmp/hetflow-site
    sed -i "1s|^#!.*python.*|#!$(command -v "$PYTHON")|" /tmp/hetflow-site/bin/* 2>/dev/null
    export PATH="/tmp/hetflow-site/bin:$PATH" PYTHONPATH="/tmp/hetflow-site:${PYTHONPATH:-}"
fi
export PYTHONPATH="$REPO/src:${PYTHONPATH:-}" PYTHONUNBUFFERED=1 RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0
BIN="$(mktemp -d)"
trap 'rm -rf "$BIN"' EXIT  # the `hetflow` command's folder (the steps' own go with their bash)
printf '#!/bin/sh\nexec %s -m hetflow.cli.main "$@"\n' "$(command -v "$PYTHON")" > "$BIN/hetflow"
chmod +x "$BIN/hetflow"
command -v hetflow >/dev/null || export PATH="$BIN:$PATH"

record() {
    date -u +%FT%TZ > "$REC/when.txt"; uname -a >> "$REC/when.txt"; nproc >> "$REC/when.txt"
    if command -v nvidia-smi >/dev/null; then
        nvidia-smi | tee "$REC/nvidia-smi.txt"
        nvidia-smi -L > "$REC/nvidia-smi-L.txt"
        nvidia-smi -q -x > "$REC/nvidia-smi-q.xml"
        nvidia-smi topo -m | tee "$REC/nvidia-smi-topo-m.txt"
        nvidia-smi --query-gpu=index,name,pci.bus_id,uuid,memory.total,memory.used,driver_version \
            --format=csv | tee "$REC/nvidia-smi-query.csv"
        nvidia-smi nvlink --status > "$REC/nvidia-smi-nvlink-status.txt" 2>&1
    fi
    for tool in rocm-smi amd-smi; do
        command -v "$tool" >/dev/null && "$tool" > "$REC/$tool.txt" 2>&1
    done
    "$PYTHON" - <<'PY' | tee "$REC/python.txt"
import importlib, sys
print("python", sys.version.split()[0])
for name in ("torch", "ray", "pydantic", "pynvml", "amdsmi", "numpy"):
    try:
        mod = importlib.import_module(name)
        print(name, getattr(mod, "__version__", "?"))
    except Exception as exc:  # what is missing is the finding here
        print(name, "MISSING", type(exc).__name__, exc)
import torch
if torch.cuda.is_available():
    runtime = f"ROCm {torch.version.hip}" if torch.version.hip else f"CUDA {torch.version.cuda}"
    print("gpus", torch.cuda.device_count(), torch.cuda.get_device_name(0), runtime)
PY
}

inventory() {
    hetflow inventory && hetflow inventory --json > "$REC/inventory.json"
}

unit_tests() {
    "$PYTHON" -m pytest -q -p no:cacheprovider tests/accelerators tests/core
    local a=$?
    HETFLOW_TEST_DEVICE=gpu "$PYTHON" -m pytest -q -s -p no:cacheprovider \
        tests/serving/test_precision.py
    local b=$?
    return $(( a | b ))
}

tune_gpu() {
    local dir
    dir=$(mktemp -d)
    trap "rm -rf '$dir'" EXIT  # now: the local is gone at exit (each step runs in a bash of its own)
    cat > "$dir/tune.yaml" <<YAML
name: tune-gpu-check
base:
  model: {kind: mlp, hidden: [64]}
  data: {dataset: digits, val_fraction: 0.2, seed: 0}
  train: {optimizer: adamw, batch_size: 64, lr: 0.003}
  resources: {device: gpu}
space:
  train: {lr: {loguniform: [1.0e-4, 0.1]}, batch_size: {choice: [32, 64, 128]}}
search: {algorithm: random, scheduler: asha, metric: val_accuracy, seed: 0, grace_epochs: 1,
         reduction_factor: 3, first_rung_quorum: 2}
budget: {trials: 8, epochs: 9, time: 3m, concurrent: 4}
trial: {cpus: 1, threads: 1, memory: 1GiB}
output: {dir: $dir/out, live: false, plot: true}
YAML
    hetflow tune "$dir/tune.yaml" --address auto --quiet --json > "$dir/result.json"
    local rc=$?
    "$PYTHON" - "$dir/result.json" <<'PY'
import json, sys
r = json.load(open(sys.argv[1]))
trials = r.get("trials", [])
for t in trials:
    print(f"  {t.get('trial_id')}: {t.get('status')} {t.get('epochs')} epochs, device "
          f"{t.get('device')}, visible {t.get('visible_devices')!r}, units {t.get('device_units')}, "
          f"torch {t.get('torch_device')}")
best = r.get("best") or {}
print(f"best {best.get('value')} ({best.get('trial_id')}); {len(trials)} trials; "
      f"placement {r.get('placement')}")
on_gpu = [t for t in trials if str(t.get("torch_device", "")).startswith("cuda")]
sys.exit(0 if trials and len(on_gpu) == len([t for t in trials if t.get("epochs")]) else 1)
PY
    return $(( rc | $? ))
}

user_serve() {
    local log pid rc=1
    log=$(mktemp)
    trap "rm -f '$log'" EXIT
    "$PYTHON" -c "from ray.util import get_node_ip_address as g; print('node IP Ray picks here:', g())"
    hetflow serve examples/serve_digits.yaml > "$log" 2>&1 &
    pid=$!
    LOG="$log" "$PYTHON" - <<'PY'
import json, os, sys, time, urllib.request
t0 = time.monotonic()
healthy = None
while time.monotonic() - t0 < 150:  # the CLI's own "ready:" line, and when /health first says 200
    if healthy is None:
        try:
            with urllib.request.urlopen("http://127.0.0.1:8000/health", timeout=2) as r:
                healthy = time.monotonic() - t0 if r.status == 200 else None
        except OSError:
            pass
    if "ready: serving" in open(os.environ["LOG"]).read():
        break
    time.sleep(0.5)
else:
    sys.exit(f"no ready line in 150 s (/health 200 after {healthy} s)")
print(f"ready line after {time.monotonic() - t0:.1f} s; /health 200 after {healthy} s")
body = json.dumps({"inputs": [[0.0] * 64, [1.0] * 64]}).encode()
req = urllib.request.Request("http://127.0.0.1:8000/v1/models/digits/predict", body,
                             {"Content-Type": "application/json"})
with urllib.request.urlopen(req, timeout=30) as r:
    print("predict", r.status, r.read()[:200].decode())
with urllib.request.urlopen("http://127.0.0.1:8000/v1/models", timeout=30) as r:
    print("models", r.read()[:600].decode())
PY
    rc=$?
    kill -TERM "$pid"; wait "$pid"; echo "hetflow serve exited $? (SIGTERM)"
    cat "$log"
    return $rc
}

node() {
    hetflow node start --print && hetflow node start --num-cpus "$(nproc)"
}

workflow() {
    hetflow run examples/digits_gpu.yaml --address auto --fresh --no-progress
    local rc=$?
    local report
    report=$(find results -name report.md -newer "$OUT/.started" 2>/dev/null | head -1)
    [ -n "$report" ] && cp "$report" "$REC/workflow-report.md"
    return $rc
}

step record 40 bash -c "$(declare -f record); PYTHON=$PYTHON REC=$REC record"
step inventory 40 bash -c "$(declare -f inventory); REC=$REC inventory"
step tests 120 bash -c "$(declare -f unit_tests); PYTHON=$PYTHON unit_tests"
step train 150 env PYTHON="$PYTHON" STEPS=200 scripts/gpu_check.sh
step userserve 180 bash -c "$(declare -f user_serve); PYTHON=$PYTHON user_serve"
step node 60 bash -c "$(declare -f node); node"
step workflow 180 bash -c "$(declare -f workflow); OUT=$OUT REC=$REC workflow"
step serving 300 "$PYTHON" benchmarks/serving.py ${SERVING_ARGS:---quick}
step sampler 40 "$PYTHON" scripts/gpu_sampler_check.py
step metrics 60 bash -c "hetflow top --once --address auto && hetflow top --once --json --address auto > $REC/top.json"
step tune 200 bash -c "$(declare -f tune_gpu); PYTHON=$PYTHON tune_gpu"
if [[ " ${SUMMARY[*]} " == *" node 0 "* ]]; then ray stop --force >/dev/null 2>&1; fi

echo "=== summary (exit codes; total $(( $(date +%s) - START ))s)"
printf '  %s\n' "${SUMMARY[@]}"
tar -czf "$OUT/recorded.tar.gz" -C "$OUT" recorded && rm -rf "$REC"
