#!/usr/bin/env bash
# GPU check for hetflow training: trains the small GPT on every GPU this machine has (CUDA or
# ROCm), one rank per GPU (data parallel), with nccl (RCCL on ROCm) and bf16, through
# `hetflow train` on a fresh local Ray. Prints the runtime, throughput and losses; exits non-zero
# when no GPU is visible, a rank did not use nccl on a GPU, or the loss did not go down.
#
#   scripts/gpu_check.sh                 # 200 steps
#   STEPS=500 scripts/gpu_check.sh
#   PYTHON=/opt/venv/bin/python scripts/gpu_check.sh
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON="${PYTHON:-$( [ -x .venv/bin/python ] && echo .venv/bin/python || echo python3 )}"
STEPS="${STEPS:-200}"
WORK="$(mktemp -d)"
trap 'rm -rf "$WORK"' EXIT

GPUS="$("$PYTHON" - <<'PY'
import torch
if not torch.cuda.is_available():
    raise SystemExit("no GPU visible to torch " + torch.__version__)
runtime = f"ROCm {torch.version.hip}" if torch.version.hip else f"CUDA {torch.version.cuda}"
names = sorted({torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())})
print(f"torch {torch.__version__}, {runtime}, {torch.cuda.device_count()} x {', '.join(names)}",
      file=__import__('sys').stderr)
print(torch.cuda.device_count())
PY
)"
echo "ranks: $GPUS (one per GPU)"

cat > "$WORK/gpu.yaml" <<YAML
name: gpu-check
model: {kind: gpt, layers: 4, heads: 8, dim: 256, seq_len: 256}
layout: {dp: $GPUS, data_parallel: ddp}
train: {steps: $STEPS, batch_size: $((32 * GPUS)), lr: 0.001, precision: bf16, log_every: 50, warmup_steps: 10}
checkpoint: {dir: $WORK/checkpoints, interval: 100}
resources: {device: gpu, cpus_per_rank: 1, max_failures: 0}
YAML

"$PYTHON" -m hetflow.cli.train "$WORK/gpu.yaml" --address local --json > "$WORK/result.json"

"$PYTHON" - "$WORK/result.json" <<'PY'
import json, sys
r = json.load(open(sys.argv[1]))
seq = 256
losses = {int(k): v for k, v in r["losses"].items()}
first, last = losses[min(losses)], losses[max(losses)]
for rank in r["ranks"]:
    print(f"rank {rank['rank']}: {rank['device']} {rank['runtime']} backend {rank['backend']} "
          f"visible {rank['visible_devices']}")
print(f"throughput: {r['samples_per_s']:.0f} samples/s = {r['samples_per_s'] * seq:.0f} tokens/s "
      f"(bf16, after warm-up); start-up {r['startup_s']:.1f} s")
print(f"loss: step 1 {first:.4f} -> step {max(losses)} {last:.4f}; "
      f"validation loss {r['metrics']['val_loss']:.4f}")
bad = [x for x in r["ranks"] if x["backend"] != "nccl" or x["runtime"] == "cpu"]
if bad:
    sys.exit(f"ranks not on a GPU with nccl: {bad}")
if not last < first:
    sys.exit("the loss did not go down")
print("gpu check: OK")
PY
