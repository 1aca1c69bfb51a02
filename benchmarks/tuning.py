"""ASHA + Optuna TPE against plain random search: the compute and time to reach a target.

    .venv/bin/python benchmarks/tuning.py                 # seeds 0-7, about 2 minutes on 2 cores
    .venv/bin/python benchmarks/tuning.py --seeds 5 --epochs 27   # 27 epochs per trial
    .venv/bin/python benchmarks/tuning.py --space benchmarks/spaces/digits_wide.yaml

Both strategies tune the digits MLP over the search space of ``examples/tune_digits.yaml``
(learning rate over five decades, batch size, weight decay, hidden layers; ``--space`` takes
the ``space`` section of another tuning YAML instead) with the same budget: ``--trials``
trials of at most ``--epochs`` epochs (default: the example's 64), ``--concurrent`` trials at a
time, one CPU and one torch thread each.

* **random**: Tune's random search (``BasicVariantGenerator``), every trial trained to the
  end (FIFO): what a user gets without early stopping.
* **asha+tpe**: Optuna's TPE (``--startup-trials`` random trials first) with hetflow's ASHA
  (grace 1 epoch, reduction factor 4, so rungs at 1, 4 and 16 of at most 64 epochs; the first
  3 trials to reach the first rung stop there, ``--first-rung-quorum 0`` is Ray's ASHA). All as
  in the example unless overridden on the command line.

A run stops as soon as any trial reports a validation accuracy of at least ``--target``
(``budget.target``). Measured from the trials' own reports (each carries its wall time):

* **compute**: trial-epochs reported, over all trials, up to and including the first report
  at or above the target;
* **wall**: seconds from the moment the first trial started training to that report. What
  comes before - Tune starting the trial processes, importing torch, loading the data - is the
  same for both strategies (about 10 s here, on a loaded 2-core machine) and would only dilute
  the ratio; it is printed separately as ``start-up``.

Each seed changes the searchers' seeds and the model's initial weights (``train.seed``); the
validation split is fixed. Strategies alternate which goes first. The figures are the ratios
of the sums over seeds (asha+tpe / random), i.e. of the mean cost; per-seed ratios are printed
too. A run that never reaches the target counts every trial-epoch it ran and is flagged.

Last line: ``RESULT asha_over_random_compute=<x> asha_over_random_wall=<x>``.
"""

from __future__ import annotations

import ray_home  # noqa: F401 - first: Ray's temp folder is this run's own (ray_home.py)

import argparse
import math
import os
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from hetflow.core.errors import InputError

os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")

sys.path.insert(0, str(Path(__file__).resolve().parent))  # tuning_common, beside this file
from tuning_common import (  # noqa: E402
    EXAMPLE, SEARCH_KEYS, STRATEGIES, add_search_arguments, example_data, geomean,
    read_space, setup_line)


@dataclass
class Outcome:
    """One strategy's run on one seed."""

    strategy: str
    seed: int
    reached: bool
    compute: int  # trial-epochs up to the first report at or above the target
    wall_s: float  # first trial's start -> that report
    startup_s: float  # fitting start -> first trial's start
    trials: int  # trials started by then
    best: float  # best validation accuracy seen in the run
    total_epochs: int  # all trial-epochs of the run (a run stops at the target)
    stopped_early: int


def tuning_config(strategy: str, seed: int, args: argparse.Namespace, root: Path) -> Any:
    """The example's tuning config for one strategy and seed, with the command line's budget,
    search settings and ``--space`` (InputError naming what the config refuses)."""
    from hetflow.workloads.tune.config import tuning_config_from_dict

    search = {key: getattr(args, key) for key in SEARCH_KEYS if getattr(args, key) is not None}
    data = example_data(strategy, seed, search,
                        None if args.space is None else read_space(args.space))
    data["name"] = f"bench-{strategy.replace('+', '-')}-{seed}"
    epochs = data["budget"]["epochs"] if args.epochs is None else args.epochs
    data["budget"] = {"trials": args.trials, "epochs": epochs, "concurrent": args.concurrent,
                      "target": args.target}
    data["trial"] = {"cpus": 1, "threads": 1}
    data["output"] = {"dir": str(root / data["name"]), "live": False, "plot": False}
    return tuning_config_from_dict(data, source=str(args.space or EXAMPLE))


def run_one(strategy: str, seed: int, args: argparse.Namespace, root: Path) -> Outcome:
    from hetflow.workloads.tune.runner import run_tuning

    result = run_tuning(tuning_config(strategy, seed, args, root), quiet=True)
    reports = sorted((point["reported_at"], point["val_accuracy"], trial.trial_id)
                     for trial in result.trials for point in trial.curve)
    first_start = min(p["started_at"] for trial in result.trials for p in trial.curve)
    hit = next((i for i, (_, value, _) in enumerate(reports) if value >= args.target), None)
    if hit is None:
        compute, wall = len(reports), result.started_at + result.wall_s - first_start
        started = len(result.trials)
    else:
        compute = hit + 1
        wall = reports[hit][0] - first_start
        started = len({trial_id for _, _, trial_id in reports[:hit + 1]})
    return Outcome(strategy, seed, hit is not None, compute, wall, first_start -
                   result.started_at, started, max((v for _, v, _ in reports), default=math.nan),
                   len(reports), len(result.stopped_early))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seeds", type=int, default=8)
    parser.add_argument("--trials", type=int, default=32, help="trial budget per run")
    parser.add_argument("--concurrent", type=int, default=2)
    add_search_arguments(parser)
    args = parser.parse_args()
    try:  # the config's own checks, before Ray starts
        checked = tuning_config("asha+tpe", args.first_seed, args, Path("unused"))
    except InputError as exc:
        parser.error(str(exc))

    import ray

    ray.init(address="local", num_cpus=args.concurrent, include_dashboard=False,
             log_to_driver=False)
    outcomes: list[Outcome] = []
    try:
        with tempfile.TemporaryDirectory(prefix="hetflow-bench-tune-") as tmp:
            for seed in range(args.first_seed, args.first_seed + args.seeds):
                order = list(STRATEGIES) if seed % 2 == 0 else list(reversed(STRATEGIES))
                for strategy in order:
                    t0 = time.time()
                    outcome = run_one(strategy, seed, args, Path(tmp))
                    outcomes.append(outcome)
                    flag = "" if outcome.reached else "  NOT REACHED (every epoch it ran counted)"
                    print(f"seed {seed} {strategy:9s}: {outcome.compute:4d} trial-epochs "
                          f"{outcome.wall_s:6.1f} s (start-up {outcome.startup_s:4.1f} s)  "
                          f"trials started {outcome.trials:2d}  "
                          f"best {outcome.best:.4f}  stopped early {outcome.stopped_early:2d}  "
                          f"(run {time.time() - t0:.0f} s){flag}", flush=True)
    finally:
        ray.shutdown()
    return report(outcomes, args, checked)


def report(outcomes: list[Outcome], args: argparse.Namespace, config: Any) -> int:
    """Print the comparison; ``config`` is ASHA + TPE's config (search settings and budget in
    effect)."""
    by = {s: [o for o in outcomes if o.strategy == s] for s in STRATEGIES}
    asha, rand = by["asha+tpe"], by["random"]
    compute = sum(o.compute for o in asha) / sum(o.compute for o in rand)
    wall = sum(o.wall_s for o in asha) / sum(o.wall_s for o in rand)
    per_seed_compute = [a.compute / r.compute for a, r in zip(asha, rand)]
    per_seed_wall = [a.wall_s / r.wall_s for a, r in zip(asha, rand)]
    print()
    search, budget = config.search, config.budget
    print(setup_line(args, budget.trials, budget.epochs, budget.concurrent,
                     {key: getattr(search, key) for key in SEARCH_KEYS}, args.space or EXAMPLE))
    for name, runs in by.items():
        print(f"{name:9s}: mean {statistics.mean(o.compute for o in runs):6.1f} trial-epochs, "
              f"{statistics.mean(o.wall_s for o in runs):6.1f} s to target; "
              f"reached {sum(o.reached for o in runs)}/{len(runs)}")
    print("per seed asha+tpe/random: compute "
          + " ".join(f"{x:.3f}" for x in per_seed_compute)
          + "  wall " + " ".join(f"{x:.3f}" for x in per_seed_wall))
    print(f"geometric mean of per-seed ratios: compute {geomean(per_seed_compute):.3f}  "
          f"wall {geomean(per_seed_wall):.3f}")
    if not all(o.reached for o in outcomes):
        print("WARNING: some runs did not reach the target; every epoch they ran was counted")
    print(f"RESULT asha_over_random_compute={compute:.3f} asha_over_random_wall={wall:.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
