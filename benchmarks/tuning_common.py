"""What benchmarks/tuning.py (real runs on Ray) and benchmarks/tuning_replay.py (replays) share:
the example whose space both tune, the two strategies, the search settings a command line may
override, the example's config for one strategy and seed, another space read from a file, the
line that describes a run's settings, and the geometric mean of per-seed ratios.
"""

from __future__ import annotations

import argparse
import math
import statistics
from pathlib import Path
from typing import Any

from hetflow.core.errors import InputError

REPO = Path(__file__).resolve().parents[1]
EXAMPLE = REPO / "examples" / "tune_digits.yaml"
STRATEGIES = {
    "random": {"algorithm": "random", "scheduler": "fifo"},
    "asha+tpe": {"algorithm": "tpe", "scheduler": "asha"},
}
# search settings of asha+tpe that the command line may override (default: the example's)
SEARCH_KEYS = ("startup_trials", "grace_epochs", "reduction_factor", "first_rung_quorum")


def add_search_arguments(parser: argparse.ArgumentParser) -> None:
    """``--target``, ``--first-seed``, ``--space``, the :data:`SEARCH_KEYS` options and
    ``--epochs`` (the per-trial budget of both strategies)."""
    parser.add_argument("--target", type=float, default=0.98,
                        help="validation accuracy to reach (digits, 359 validation images)")
    parser.add_argument("--first-seed", type=int, default=0)
    parser.add_argument("--space", type=Path, metavar="YAML",
                        help="a tuning YAML whose space section replaces the example's")
    parser.add_argument("--startup-trials", type=int, help="TPE's random trials first "
                        "(default: the example's)")
    parser.add_argument("--grace-epochs", type=int, help="ASHA's first rung (default: the "
                        "example's)")
    parser.add_argument("--reduction-factor", type=float, help="ASHA's reduction factor "
                        "(default: the example's)")
    parser.add_argument("--first-rung-quorum", type=int, help="trials ASHA stops at its first "
                        "rung before it promotes any (0: Ray's ASHA; default: the example's)")
    parser.add_argument("--epochs", type=int, help="most epochs per trial, for both strategies "
                        "(ASHA's max_t; default: the example's)")


def setup_line(args: argparse.Namespace, trials: int, epochs: int, concurrent: int,
               search: dict, space: Path = EXAMPLE) -> str:
    """One line naming what was compared: target, budget, seeds and ASHA + TPE's settings
    (``search`` holds the :data:`SEARCH_KEYS` in effect)."""
    shown = space.resolve().relative_to(REPO) if space.resolve().is_relative_to(REPO) else space
    return (f"digits MLP, space of {shown}, target val accuracy >= "
            f"{args.target}, budget {trials} trials x {epochs} epochs, {concurrent} at a time, "
            f"seeds {args.first_seed}..{args.first_seed + args.seeds - 1}; TPE startup "
            f"{search['startup_trials']}, ASHA grace {search['grace_epochs']} reduction "
            f"{search['reduction_factor']:g} first-rung quorum {search['first_rung_quorum']}")


def example_data(strategy: str, seed: int, search: dict[str, Any] | None = None,
                 space: dict[str, Any] | None = None) -> dict[str, Any]:
    """The example's tuning YAML as data for one strategy and seed: the searcher's seed and the
    models' (``train.seed``) set, ``search`` overriding keys of its search section (the
    :data:`SEARCH_KEYS`) and ``space`` replacing its space. The caller sets the budget."""
    import yaml

    data = yaml.safe_load(EXAMPLE.read_text())
    data["base"]["train"]["seed"] = seed
    data["search"] = {**data["search"], **STRATEGIES[strategy], "seed": seed, **(search or {})}
    if space is not None:
        data["space"] = space
    return data


def read_space(path: Path) -> dict[str, Any]:
    """The ``space`` section of a tuning YAML (the file's other sections are not used)."""
    import yaml

    try:
        data = yaml.safe_load(path.read_text())
    except (OSError, yaml.YAMLError) as exc:
        raise InputError(f"{path}: cannot read it as YAML: {exc}") from None
    if not isinstance(data, dict) or not isinstance(data.get("space"), dict):
        raise InputError(f"{path}: no 'space' section (a mapping of sections to fields)")
    return data["space"]


def geomean(values: list[float]) -> float:
    return math.exp(statistics.mean(math.log(v) for v in values))
