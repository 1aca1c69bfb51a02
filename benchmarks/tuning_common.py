"""What benchmarks/tuning.py (real runs on Ray) and benchmarks/tuning_replay.py (replays) share:
the example whose space both tune, the two strategies, the search settings a command line may
override, the line that describes a run's settings, and the geometric mean of per-seed ratios.
"""

from __future__ import annotations

import argparse
import math
import statistics
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
EXAMPLE = REPO / "examples" / "tune_digits.yaml"
STRATEGIES = {
    "random": {"algorithm": "random", "scheduler": "fifo"},
    "asha+tpe": {"algorithm": "tpe", "scheduler": "asha"},
}
# search settings of asha+tpe that the command line may override (default: the example's)
SEARCH_KEYS = ("startup_trials", "grace_epochs", "reduction_factor", "first_rung_quorum")


def add_search_arguments(parser: argparse.ArgumentParser) -> None:
    """``--target``, ``--first-seed`` and the :data:`SEARCH_KEYS` options."""
    parser.add_argument("--target", type=float, default=0.98,
                        help="validation accuracy to reach (digits, 359 validation images)")
    parser.add_argument("--first-seed", type=int, default=0)
    parser.add_argument("--startup-trials", type=int, help="TPE's random trials first "
                        "(default: the example's)")
    parser.add_argument("--grace-epochs", type=int, help="ASHA's first rung (default: the "
                        "example's)")
    parser.add_argument("--reduction-factor", type=float, help="ASHA's reduction factor "
                        "(default: the example's)")
    parser.add_argument("--first-rung-quorum", type=int, help="trials ASHA stops at its first "
                        "rung before it promotes any (0: Ray's ASHA; default: the example's)")


def setup_line(args: argparse.Namespace, trials: int, epochs: int, concurrent: int,
               search: dict) -> str:
    """One line naming what was compared: target, budget, seeds and ASHA + TPE's settings
    (``search`` holds the :data:`SEARCH_KEYS` in effect)."""
    return (f"digits MLP, space of {EXAMPLE.relative_to(REPO)}, target val accuracy >= "
            f"{args.target}, budget {trials} trials x {epochs} epochs, {concurrent} at a time, "
            f"seeds {args.first_seed}..{args.first_seed + args.seeds - 1}; TPE startup "
            f"{search['startup_trials']}, ASHA grace {search['grace_epochs']} reduction "
            f"{search['reduction_factor']:g} first-rung quorum {search['first_rung_quorum']}")


def geomean(values: list[float]) -> float:
    return math.exp(statistics.mean(math.log(v) for v in values))
