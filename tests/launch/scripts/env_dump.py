"""A torchrun-style test script: writes the launcher's environment contract as JSON to
OUT/rank-<RANK>-attempt-<TORCHELASTIC_RESTART_COUNT>.json, then (optionally) fails.

    env_dump.py OUT [--fail-rank R] [--fail-attempts N] [--code C] [--fail-delay D] [--sleep S] [--init]

``--fail-rank R --fail-attempts N``: rank R exits with code C in attempts 0..N-1.
``--init``: also join the process group (env://) and all-reduce once, as a script would.
"""

import argparse
import json
import os
import sys
import time

KEYS = ["RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "GROUP_RANK", "GROUP_WORLD_SIZE",
        "ROLE_RANK", "ROLE_WORLD_SIZE", "ROLE_NAME", "MASTER_ADDR", "MASTER_PORT",
        "TORCHELASTIC_RESTART_COUNT", "TORCHELASTIC_MAX_RESTARTS", "TORCHELASTIC_RUN_ID",
        "OMP_NUM_THREADS", "CUDA_VISIBLE_DEVICES", "HIP_VISIBLE_DEVICES", "MY_FLAG"]

parser = argparse.ArgumentParser()
parser.add_argument("out")
parser.add_argument("--fail-rank", type=int, default=-1)
parser.add_argument("--fail-attempts", type=int, default=0)
parser.add_argument("--code", type=int, default=3)
parser.add_argument("--sleep", type=float, default=0.0)
parser.add_argument("--fail-delay", type=float, default=0.0,
                    help="the failing rank waits this long first (its peers have written by then)")
parser.add_argument("--init", action="store_true")
args = parser.parse_args()

rank, attempt = int(os.environ["RANK"]), int(os.environ["TORCHELASTIC_RESTART_COUNT"])
record = {k: os.environ.get(k) for k in KEYS}
record.update(pid=os.getpid(), cwd=os.getcwd(), argv=sys.argv[1:])
if args.init:
    import torch
    import torch.distributed as dist

    dist.init_process_group("gloo")
    t = torch.tensor([rank + 1.0])
    dist.all_reduce(t)
    record["allreduce"] = float(t)
    dist.barrier()  # as the examples do (examples/launch/fsdp2.py: torch's gloo exit abort)
    dist.destroy_process_group()
os.makedirs(args.out, exist_ok=True)
with open(os.path.join(args.out, f"rank-{rank}-attempt-{attempt}.json"), "w") as f:
    json.dump(record, f)
print(f"rank {rank} attempt {attempt} wrote its environment", flush=True)
if rank == args.fail_rank and attempt < args.fail_attempts:
    time.sleep(args.fail_delay)
    print(f"rank {rank} fails on purpose with code {args.code}", file=sys.stderr, flush=True)
    sys.exit(args.code)
time.sleep(args.sleep)
