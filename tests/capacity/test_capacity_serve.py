"""``hetflow capacity serve``: the cheapest device mix for a request load (Melange's program).

The program's answers are checked against a hand-worked case and against brute force (every
count vector up to a bound, each checked for a feasible split with a linear program) on random
instances; the command is run as a user runs it, bad input included."""

from __future__ import annotations

import itertools
import json
import math
import random
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import yaml
from scipy.optimize import linprog

from hetflow.capacity.serve import Bucket, plan_serve
from hetflow.core.errors import InputError, Unschedulable

SCRIPT = Path(sys.executable).with_name("hetflow")
HETFLOW = [str(SCRIPT)] if SCRIPT.exists() else [sys.executable, "-m", "hetflow.cli.main"]

# short requests are cheapest on the small GPU, long ones need the big one
THROUGHPUT = {"A10G": {"short": 4.0, "long": 0.1}, "H100": {"short": 20.0, "long": 4.0}}
PRICES = {"A10G": 1.0, "H100": 7.5}


def test_a_mix_beats_every_single_model_where_request_sizes_differ() -> None:
    fleet = plan_serve([Bucket("short", 10), Bucket("long", 4)], THROUGHPUT, PRICES, slice_factor=0)
    # long on one H100 (4 req/s: full), short on three A10G (2.5 of 3): $10.50/h
    assert fleet.counts == {"A10G": 3, "H100": 1} and fleet.cost_per_hour == pytest.approx(10.5)
    assert fleet.shares["long"] == {"H100": 1.0} and fleet.shares["short"] == {"A10G": 1.0}
    assert fleet.homogeneous == {"A10G": (43, 43.0), "H100": (2, 15.0)}
    assert fleet.best_homogeneous == ("H100", 2, 15.0)
    assert fleet.to_dict()["mixed_over_homogeneous"] == pytest.approx(10.5 / 15.0, abs=1e-4)
    assert fleet.load["H100"] == pytest.approx(1.0) and fleet.load["A10G"] == pytest.approx(2.5 / 3)
    # the pools' routing weights: planned req/s per replica (H100 4/1, A10G 10/3), relative to the top
    assert fleet.carried == pytest.approx({"A10G": 10.0, "H100": 4.0})
    assert fleet.weights() == {"H100": 100, "A10G": round(100 * (10 / 3) / 4)}


def feasible(counts: dict[str, int], buckets: list[Bucket], tput: dict[str, dict[str, float]]) -> bool:
    """Can these devices carry the load with some split of each bucket? (a linear program)"""
    devices = sorted(tput)
    nv = len(buckets) * len(devices)
    a_eq, a_ub = [], []
    for bi in range(len(buckets)):
        row = np.zeros(nv)
        row[bi * len(devices):(bi + 1) * len(devices)] = 1
        a_eq.append(row)
    for gi, d in enumerate(devices):
        row = np.zeros(nv)
        for bi, b in enumerate(buckets):
            row[bi * len(devices) + gi] = b.rate / tput[d][b.name] if tput[d][b.name] > 0 else 0
        a_ub.append(row)
    bounds = [(0, 1 if tput[d][b.name] > 0 else 0) for b in buckets for d in devices]
    res = linprog(np.zeros(nv), A_ub=a_ub, b_ub=[counts[d] + 1e-9 for d in devices], A_eq=a_eq,
                  b_eq=[1] * len(buckets), bounds=bounds, method="highs")
    return res.status == 0


@pytest.mark.parametrize("seed", range(12))
def test_the_program_finds_the_cheapest_fleet_brute_force_finds(seed) -> None:
    rng = random.Random(seed)
    devices = [f"d{i}" for i in range(rng.randint(2, 3))]
    names = [f"b{i}" for i in range(rng.randint(1, 3))]
    tput = {d: {b: (0.0 if rng.random() < 0.15 else round(rng.uniform(0.5, 6), 2)) for b in names}
            for d in devices}
    for b in names:  # every bucket servable by someone
        if all(tput[d][b] == 0 for d in devices):
            tput[devices[0]][b] = 1.0
    prices = {d: round(rng.uniform(0.5, 8), 2) for d in devices}
    buckets = [Bucket(b, round(rng.uniform(0.2, 6), 2)) for b in names]
    fleet = plan_serve(buckets, tput, prices, slice_factor=0)
    assert feasible(fleet.counts, buckets, tput)
    best = math.inf
    for combo in itertools.product(range(9), repeat=len(devices)):
        counts = dict(zip(devices, combo))
        cost = sum(prices[d] * n for d, n in counts.items())
        if cost < best - 1e-9 and feasible(counts, buckets, tput):
            best = cost
    assert fleet.cost_per_hour == pytest.approx(best, abs=1e-6)


def test_slices_go_whole_to_one_model() -> None:
    fleet = plan_serve([Bucket("short", 10), Bucket("long", 4)], THROUGHPUT, PRICES, slice_factor=4)
    for split in fleet.shares.values():
        assert all(abs(f * 4 - round(f * 4)) < 1e-6 for f in split.values())
    assert fleet.cost_per_hour >= plan_serve([Bucket("short", 10), Bucket("long", 4)], THROUGHPUT,
                                             PRICES, slice_factor=0).cost_per_hour - 1e-9


def test_bad_input_is_one_clear_error() -> None:
    with pytest.raises(Unschedulable, match="no device meets the SLO on bucket"):
        plan_serve([Bucket("huge", 1)], {"A10G": {"huge": 0.0}}, {"A10G": 1.0})
    with pytest.raises(InputError, match="no price for H100"):
        plan_serve([Bucket("short", 1)], THROUGHPUT, {"A10G": 1.0})
    with pytest.raises(InputError, match="positive number"):
        plan_serve([Bucket("short", 1)], THROUGHPUT, {"A10G": 1.0, "H100": -2})
    assert plan_serve([Bucket("short", 0)], THROUGHPUT, PRICES).cost_per_hour == 0


def run(tmp_path: Path, profiles: object, workload: object, *flags: str) -> subprocess.CompletedProcess:
    (tmp_path / "p.yaml").write_text(yaml.safe_dump(profiles))
    (tmp_path / "w.yaml").write_text(yaml.safe_dump(workload))
    return subprocess.run([*HETFLOW, "capacity", "serve", str(tmp_path / "p.yaml"), "--workload",
                           str(tmp_path / "w.yaml"), *flags], capture_output=True, text=True, timeout=120)


PROFILES = {"slo": "TPOT <= 120 ms", "devices": {"A10G": {"price_per_hour": 1.0}, "H100": {"price_per_hour": 7.5}},
            "throughput": THROUGHPUT}


def test_the_command_as_a_user_runs_it(tmp_path) -> None:
    out = run(tmp_path, PROFILES, {"rate": 14, "mix": {"short": 10 / 14, "long": 4 / 14}}, "--json",
              "--slice-factor", "0")
    assert out.returncode == 0, out.stderr
    plan = json.loads(out.stdout)
    assert plan["counts"] == {"A10G": 3, "H100": 1} and plan["cost_per_hour"] == pytest.approx(10.5)
    assert plan["best_homogeneous"] == {"device": "H100", "count": 2, "cost_per_hour": 15.0}
    text = run(tmp_path, PROFILES, {"buckets": {"short": 10, "long": 4}})  # default: free shares
    assert text.returncode == 0 and "$10.50/h" in text.stdout and "replicas: 3, weight: 83" in text.stdout
    assert plan["weights"] == {"A10G": 83, "H100": 100}


@pytest.mark.parametrize("profiles, workload, code, words", [
    (PROFILES, {"buckets": {"giant": 1}}, 2, "in no device's profile"),
    (PROFILES, {"rate": 5, "mix": {"short": 0.5, "long": 0.2}}, 2, "sum to 0.7"),
    (PROFILES, {"buckets": {"short": -1}}, 2, "requests/s >= 0"),
    ({"devices": {"A10G": {}}, "throughput": {"A10G": {"short": 1}}}, {"buckets": {"short": 1}}, 2, "price_per_hour"),
    ({**PROFILES, "throughput": {"B200": {"short": 1}}}, {"buckets": {"short": 1}}, 2, "which devices: does not"),
    ({**PROFILES, "throughput": {"A10G": {"short": 1, "long": 0}}}, {"buckets": {"long": 1}}, 3, "no device meets"),
    ("just text", {"buckets": {}}, 2, "expected a mapping"),
])
def test_bad_files_are_one_line(tmp_path, profiles, workload, code, words) -> None:
    out = run(tmp_path, profiles, workload)
    assert out.returncode == code, out.stderr
    assert words in out.stderr and len(out.stderr.strip().splitlines()) == 1 and "Traceback" not in out.stderr


# Melange's own example (tyler-griggs/melange-release, melange/config/example.json at d46ab43;
# the repository has no licence file, so its numbers are cited here, not its file copied):
# A10G $1.01/h and A100-80GB $3.67/h, throughput per (input, output) bucket, 30 req/s.
# Its README's answer for slice_factor 1 is {"A10G": 3, "A100-80GB": 1, "cost": 6.7}; its solver
# (PuLP + CBC), run here on the same file, gave the costs below for other slice factors.
MELANGE = {"gpu_info": {"A10G": {"cost": 1.01, "tputs": [[2, 1], [5, 2]]},
                        "A100-80GB": {"cost": 3.67, "tputs": [[20, 20], [40, 20]]}},
           "workload_distribution": [[0.2, 0.1], [0.5, 0.2]], "total_request_rate": 30.0,
           "slice_factor": 1}
MELANGE_COSTS = {1: 6.7, 2: 5.69, 3: 4.68, 4: 5.69, 6: 4.68, 8: 5.69}


@pytest.mark.parametrize("slices", sorted(MELANGE_COSTS))
def test_melanges_example_gives_melanges_answers(slices) -> None:
    from hetflow.capacity.serve import read_melange

    tput, prices, buckets, own = read_melange(MELANGE, "example")
    assert own == 1 and sum(b.rate for b in buckets) == pytest.approx(30)
    fleet = plan_serve(buckets, tput, prices, slice_factor=slices)
    assert fleet.cost_per_hour == pytest.approx(MELANGE_COSTS[slices], abs=1e-9)
    if slices == 1:
        assert fleet.counts == {"A10G": 3, "A100-80GB": 1}


def test_a_melange_config_runs_as_is(tmp_path) -> None:
    (tmp_path / "m.json").write_text(json.dumps(MELANGE))
    out = subprocess.run([*HETFLOW, "capacity", "serve", str(tmp_path / "m.json"), "--json"],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    plan = json.loads(out.stdout)
    assert plan["counts"] == {"A10G": 3, "A100-80GB": 1} and plan["slice_factor"] == 1
    free = subprocess.run([*HETFLOW, "capacity", "serve", str(tmp_path / "m.json"), "--json", "--slice-factor", "0"],
                          capture_output=True, text=True, timeout=120)
    assert json.loads(free.stdout)["cost_per_hour"] == pytest.approx(4.68)  # shares split freely
    both = subprocess.run([*HETFLOW, "capacity", "serve", str(tmp_path / "m.json"), "--workload", "x.yaml"],
                          capture_output=True, text=True, timeout=120)
    assert both.returncode == 2 and "drop --workload" in both.stderr
