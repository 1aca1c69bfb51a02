"""hetflow DDP on Ray vs a plain ``torchrun`` DDP script, side by side, and recovery time.

    .venv/bin/python benchmarks/training.py              # about 1-2 minutes on 2 cores
    .venv/bin/python benchmarks/training.py --rounds 3 --steps 600

Both sides train the same MLP (hetflow's digits model) on the same batches (hetflow's step
order) for the same number of steps, 2 CPU processes with gloo and 1 torch thread each:

* **hetflow**: ``run_training`` with ``layout.dp: 2`` (two Ray actors, DDP). Checkpoints only
  at the end, which is outside the timed steps.
* **torchrun**: ``torchrun --standalone --nproc_per_node 2`` running this file's ``--worker``
  mode: a plain DDP loop, nothing else.

Throughput is samples/s over the steps after ``--warmup`` steps, measured inside rank 0 on both
sides, so start-up (Ray actors, imports, rendezvous) is excluded and reported separately:
hetflow's is ``run_training`` called -> first step done (Ray itself already running), torchrun's
is launch -> first step done. Rounds alternate between the two; each side's median is used.

Recovery: a job with a checkpoint every ``--steps/4`` steps; rank 1's process is SIGKILLed once
rank 0 has reported a step past the first checkpoint; recovery_s is the time from the kill to
the first step the restarted group completes (tear-down, new actors, rendezvous, checkpoint
load, one step).

Last line: ``RESULT ddp_over_torchrun=<x> startup_s=<x> recovery_s=<x>``.
"""

from __future__ import annotations

import ray_home  # noqa: F401 - first: Ray's temp folder is this run's own (ray_home.py)

import argparse
import json
import os
import signal
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")

HIDDEN = [256, 256]


def _config(args: argparse.Namespace, name: str, ckpt: str, interval: int = 0):
    from hetflow.workloads.train.config import config_from_dict

    return config_from_dict({
        "name": name,
        "model": {"kind": "mlp", "hidden": HIDDEN},
        "layout": {"dp": 2, "data_parallel": "ddp"},
        "train": {"steps": args.steps, "batch_size": args.batch, "log_every": args.log_every,
                  "warmup_steps": args.warmup, "lr": 1e-3},
        "checkpoint": {"dir": ckpt, "interval": interval, "resume": False},
        "resources": {"devices": "cpu", "cpus_per_rank": 1, "threads_per_rank": 1,
                      "max_failures": 1},
    })


# --------------------------------------------------------------------------------------------
# the plain torchrun side
# --------------------------------------------------------------------------------------------


def worker(args: argparse.Namespace) -> None:
    """A plain DDP loop under torchrun: rank 0 prints one JSON line with its figures."""
    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel

    from hetflow.workloads.train.config import MLPConfig
    from hetflow.workloads.train.data import StepOrder, load_dataset
    from hetflow.workloads.train.models import MLP, loss_fn

    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(0)
    model = DistributedDataParallel(MLP(MLPConfig(hidden=tuple(HIDDEN))))
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    data = load_dataset("digits", val_fraction=0.2, seed=0).train
    order = StepOrder(len(data), args.batch, seed=0)
    first_step_at, t0 = None, None
    for step in range(args.steps):
        if step == args.warmup:
            t0 = time.perf_counter()
        inputs, targets = data.take(order.replica_batch(step, rank, world))
        loss = loss_fn(model(inputs), targets)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        if (step + 1) % args.log_every == 0 and rank == 0:
            loss.item()  # what a training script logs
        if first_step_at is None:
            first_step_at = time.time()
    elapsed = time.perf_counter() - t0
    if rank == 0:
        print(json.dumps({"samples_per_s": (args.steps - args.warmup) * args.batch / elapsed,
                          "first_step_at": first_step_at}), flush=True)
    dist.destroy_process_group()


def run_torchrun(args: argparse.Namespace) -> dict:
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2",
           __file__, "--worker", "--steps", str(args.steps), "--batch", str(args.batch),
           "--warmup", str(args.warmup), "--log-every", str(args.log_every)]
    launched = time.time()
    out = subprocess.run(cmd, env=env, capture_output=True, text=True, check=True)
    figures = json.loads([line for line in out.stdout.splitlines() if line.startswith("{")][-1])
    figures["startup_s"] = figures["first_step_at"] - launched
    return figures


# --------------------------------------------------------------------------------------------
# the hetflow side
# --------------------------------------------------------------------------------------------


def run_hetflow(args: argparse.Namespace, root: Path, index: int) -> dict:
    from hetflow.workloads.train.job import run_training

    result = run_training(_config(args, f"bench-{index}", str(root / f"run{index}")))
    return {"samples_per_s": result.samples_per_s, "startup_s": result.startup_s}


def run_recovery(args: argparse.Namespace, root: Path) -> float:
    from hetflow.workloads.train.job import TrainingJob

    interval = max(1, args.steps // 4)
    config = _config(args, "bench-recovery", str(root / "recovery"), interval=interval)
    config = config.with_overrides(train={"log_every": 1})
    killed: dict[str, float] = {}

    def kill_once(record: dict, job: TrainingJob) -> None:
        if not killed and record["step"] > interval and job.worker_pids:
            os.kill(job.worker_pids[1], signal.SIGKILL)
            killed["at"] = time.time()

    job = TrainingJob(config, on_progress=kill_once)
    result = job.run()
    assert result.restarts == 1, "the kill did not land before the end; use more --steps"
    resumed = min(r["time"] for r in job.records if r["attempt"] == 1)
    return resumed - killed["at"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=400)
    parser.add_argument("--batch", type=int, default=256, help="global batch (both sides)")
    parser.add_argument("--warmup", type=int, default=20)
    parser.add_argument("--log-every", type=int, default=50)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        worker(args)
        return

    import ray

    t = time.time()
    ray.init(address="local", num_cpus=4, include_dashboard=False, log_to_driver=False)
    ray_init_s = time.time() - t
    root = Path(tempfile.mkdtemp(prefix="hetflow-bench-"))
    hetflow_runs, torchrun_runs = [], []
    try:
        for i in range(args.rounds):
            hetflow_runs.append(run_hetflow(args, root, i))
            torchrun_runs.append(run_torchrun(args))
            print(f"round {i + 1}: hetflow {hetflow_runs[-1]['samples_per_s']:.0f} samples/s, "
                  f"torchrun {torchrun_runs[-1]['samples_per_s']:.0f} samples/s", flush=True)
        recovery_s = run_recovery(args, root)
    finally:
        ray.shutdown()
        shutil.rmtree(root, ignore_errors=True)

    def median(runs: list[dict], key: str) -> float:
        return statistics.median(r[key] for r in runs)

    h, tr = median(hetflow_runs, "samples_per_s"), median(torchrun_runs, "samples_per_s")
    h_start, t_start = median(hetflow_runs, "startup_s"), median(torchrun_runs, "startup_s")
    print(f"model MLP {HIDDEN} on digits, global batch {args.batch}, {args.steps} steps "
          f"({args.warmup} warm-up), 2 CPU processes, gloo, 1 thread each")
    print(f"hetflow DDP on Ray : {h:9.0f} samples/s   start-up {h_start:5.1f} s "
          f"(Ray already up; ray.init took {ray_init_s:.1f} s)")
    print(f"torchrun DDP       : {tr:9.0f} samples/s   start-up {t_start:5.1f} s")
    print(f"recovery (kill -> first step after resume): {recovery_s:.1f} s")
    print(f"RESULT ddp_over_torchrun={h / tr:.3f} startup_s={h_start:.2f} recovery_s={recovery_s:.2f}")


if __name__ == "__main__":
    main()
