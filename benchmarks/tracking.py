"""What MLflow tracking costs a training job: the same ``hetflow train`` job with tracking off and
on (a SQLite store in a temporary directory), side by side on one local Ray.

    .venv/bin/python benchmarks/tracking.py                 # about 2-3 minutes on 2 cores
    .venv/bin/python benchmarks/tracking.py --rounds 3 --steps 600

Both sides run ``run_training`` on the digits MLP, ``layout.dp: 2`` on CPU, ``log_every 10``,
a checkpoint every ``--steps/4`` steps, the same seed; rounds alternate off/on (the machine is
noisy), and each side's median is used. Reported: samples/s measured inside rank 0 (the steps
after warm-up), and the job's wall time (``run_training`` called -> returned: with tracking that
includes creating the run, logging ``train_loss`` of every step, the placement, the final
checkpoint, and waiting for the queue at the end).

Last line: ``RESULT tracked_over_untracked_samples=<x> tracked_over_untracked_wall=<x>``.
"""

from __future__ import annotations

import ray_home  # noqa: F401 - first: Ray's temp folder is this run's own (ray_home.py)

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))


def one_job(root: Path, steps: int, tracked: bool, tag: str) -> tuple[float, float]:
    from hetflow.workloads.train.config import config_from_dict
    from hetflow.workloads.train.job import run_training

    data = {"name": f"bench-{tag}", "model": {"kind": "mlp", "hidden": [128, 128]},
            "layout": {"dp": 2}, "train": {"steps": steps, "batch_size": 64, "log_every": 10},
            "checkpoint": {"dir": str(root / tag / "ckpt"), "interval": max(1, steps // 4)},
            "resources": {"devices": "cpu", "cpus_per_rank": 1}}
    if tracked:
        data["tracking"] = {"mlflow": {"uri": f"sqlite:///{root}/mlflow.db", "experiment": "bench"}}
    t0 = time.perf_counter()
    result = run_training(config_from_dict(data))
    return float(result.samples_per_s or 0.0), time.perf_counter() - t0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--steps", type=int, default=400)
    args = parser.parse_args()
    import ray

    ray.init(address="local", num_cpus=2, include_dashboard=False, _node_ip_address="127.0.0.1",
             log_to_driver=False)
    sides: dict[bool, list[tuple[float, float]]] = {False: [], True: []}
    with tempfile.TemporaryDirectory(prefix="hetflow-bench-tracking-") as tmp:
        os.chdir(tmp)  # the SQLite store's artifacts go to ./mlruns
        root = Path(tmp)
        for r in range(args.rounds):
            for tracked in (False, True):
                samples, wall = one_job(root, args.steps, tracked, f"{r}-{int(tracked)}")
                sides[tracked].append((samples, wall))
                print(f"round {r} tracking {'on ' if tracked else 'off'}: {samples:8.0f} samples/s  "
                      f"wall {wall:6.1f} s", flush=True)
    ray.shutdown()
    med = {k: (statistics.median(s for s, _ in v), statistics.median(w for _, w in v)) for k, v in sides.items()}
    print(f"median off: {med[False][0]:.0f} samples/s, wall {med[False][1]:.1f} s; "
          f"on: {med[True][0]:.0f} samples/s, wall {med[True][1]:.1f} s")
    print(f"RESULT tracked_over_untracked_samples={med[True][0] / med[False][0]:.3f} "
          f"tracked_over_untracked_wall={med[True][1] / med[False][1]:.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
