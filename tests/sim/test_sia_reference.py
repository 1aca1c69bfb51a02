"""Sia's simulator's own policies, re-stated (hetflow/sim/sia_reference.py), against the artifact.

The fixture ``reference-policies-philly-workload-1-bert-deepspeech2.json`` holds what Sia's own
simulator did with the 19-job slice alone (tests/fixtures/sia/README.md has the commands): per
policy, every job's JCT and restart count. Both programs are solved as the artifact solves them
(Gavel's linear one with ECOS, Sia's mixed-integer one with CBC), so every job's JCT and restart
count must match exactly. With HiGHS (no CBC installed) Sia's program reaches the same optimum
but breaks its many ties its own way, so that run is only held to the issue's 5 %.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from hetflow.scheduling.goodput import GoodputModel, GradParams, PerfParams
from hetflow.sim.sia import SiaProfiles, SiaSimulator, load_workload
from hetflow.sim.sia_reference import (REFERENCE_POLICIES, SiaGavelPolicy, SiaMipPolicy, cbc_available,
                                       config_goodputs, max_sum_throughput, place_fast, restart_penalty, solve_cbc,
                                       solve_highs, type_configs)

FIX = Path(__file__).resolve().parents[1] / "fixtures" / "sia"
SLICE = FIX / "workloads" / "philly-workload-1-bert-deepspeech2.csv"
REF = json.loads((FIX / "reference-policies-philly-workload-1-bert-deepspeech2.json").read_text())["runs"]


@pytest.fixture(scope="module")
def profiles() -> SiaProfiles:
    return SiaProfiles(FIX / "profiles")


def _run(policy, profiles: SiaProfiles, kind: str):
    return SiaSimulator(load_workload(SLICE), profiles, policy, round_s=policy.round_s, default_kind=kind).run()


def test_gavel_gives_the_artifacts_jcts_and_restarts_exactly(profiles) -> None:
    run = _run(SiaGavelPolicy(), profiles, "rigid")
    ref = REF["gavel"]
    assert run.jcts == {k: float(v) for k, v in ref["jcts"].items()}
    assert run.restarts == ref["restarts"]


@pytest.mark.parametrize("name,kind", [("sia", "adaptive"), ("sia_rigid", "rigid")])
def test_sia_policy_gives_the_artifacts_jcts_and_restarts_exactly(profiles, name, kind) -> None:
    assert cbc_available(), "CBC (cylp) is part of the dev install: pip install -e '.[dev]'"
    run = _run(SiaMipPolicy(solver="cbc"), profiles, kind)
    ref = REF[name]
    assert run.jcts == {k: float(v) for k, v in ref["jcts"].items()}
    assert run.restarts == ref["restarts"]


def test_sia_policy_with_highs_within_five_percent(profiles) -> None:
    run = _run(SiaMipPolicy(solver="highs"), profiles, "rigid")
    ref = REF["sia_rigid"]
    assert set(run.jcts) == set(ref["jcts"])
    got, want = np.mean(list(run.jcts.values())), np.mean(list(ref["jcts"].values()))
    assert abs(got / want - 1) <= 0.05, (got, want)


@pytest.mark.parametrize("seed", range(4))
def test_highs_and_cbc_reach_the_same_optimum(seed) -> None:
    """The two formulations of Sia's program (cvxpy for CBC, a matrix for HiGHS) are the same
    program: equal optimal objectives, capacities and one-configuration rows kept, fixed jobs fixed."""
    rng = np.random.default_rng(seed)
    configs = [(t, n, g) for t, (nodes, per) in enumerate(((6, 4), (2, 8), (3, 8))) for n, g in type_configs(nodes, per)]
    nc, nt, na, nr = len(configs), 3, 7, 4
    reduce = np.zeros((nc, nt), dtype=np.uint32)
    for c, (t, _, g) in enumerate(configs):
        reduce[c, t] = g
    a_pow = np.round(rng.uniform(0.2, 1.0, (na, nc)), 2).astype(np.float32)
    a_pow[rng.uniform(size=(na, nc)) < 0.4] = 100.0  # configurations a job cannot use
    r_pow = np.round(rng.uniform(0.1, 0.5, (nr, nt)), 2)
    replicas = rng.choice([4, 6, 8, 12], size=(nr, 1)).astype(np.uint32)
    capacity = np.array([24, 16, 24], dtype=np.uint32)
    fix_a, fix_r = [(0, 2)], [(1, 1)]
    objective = {}
    for solve in (solve_cbc, solve_highs):
        xa, xr = solve(a_pow, r_pow, reduce, replicas, capacity, fix_a, fix_r, 1.1, 0.0)
        assert np.all(xa.sum(axis=1) <= 1) and np.all(xr.sum(axis=1) <= 1)
        assert np.all(xa.astype(int) @ reduce + (xr * replicas).sum(axis=0) <= capacity)
        assert xa[0, 2] == 1 and xr[1, 1] == 1
        objective[solve.__name__] = float((xa * a_pow).sum() + (xr * r_pow).sum() + 1.1 * (na + nr - xa.sum() - xr.sum()))
    assert objective["solve_cbc"] == pytest.approx(objective["solve_highs"], abs=1e-6)


def test_place_fast_fills_whole_nodes_then_goes_round() -> None:
    # largest first; a node pointer that moves on after each job
    assert place_fast({"a": 4, "b": 8, "c": 2}, nodes=3, per_node=8) == {"b": [0] * 8, "a": [1] * 4, "c": [2] * 2}
    # the third job takes what is left, over two nodes (the artifact's placement, not a packed one)
    assert place_fast({"a": 3, "b": 3, "c": 2}, nodes=2, per_node=4) == {"a": [0, 0, 0], "b": [1, 1, 1], "c": [0, 1]}
    # a two-node gang takes two whole nodes
    assert place_fast({"x": 1, "y": 16}, nodes=3, per_node=8) == {"y": [0] * 8 + [1] * 8, "x": [2]}


def test_configs_and_penalties_are_the_artifacts() -> None:
    assert type_configs(2, 8) == [(1, 1), (1, 2), (1, 4), (1, 8), (2, 16)]
    assert type_configs(6, 4)[-1] == (6, 24) and len(type_configs(6, 4)) == 8
    assert type_configs(3, 8)[-1] == (3, 24)
    assert [restart_penalty(n) for n in ("deepspeech2-1", "imagenet-3", "cifar10-9", "bert-2", "yolov3-7", "ncf-1")] \
        == [25, 250, 30, 120, 45, 30]
    assert set(REFERENCE_POLICIES) == {"gavel", "sia"}


def test_config_goodputs_is_optimize_over_many_placements() -> None:
    model = GoodputModel(PerfParams(0.02, 0.001, 0.05, 0.01, 0.1, 0.02, 1.2), GradParams(0.5, 2.0), 64)
    nodes = np.array([1, 1, 1, 2, 3])
    gpus = np.array([1, 2, 8, 16, 24])
    got = config_goodputs(model, nodes, gpus, 4096, (16, 256), tune_bsz=True)
    want = [model.optimize(int(n), int(g), 4096, (16, 256))[0] for n, g in zip(nodes, gpus)]
    assert got == pytest.approx(want, rel=1e-5)
    # batch-size tuning off: the job's own batch only, so never more than tuned
    fixed = config_goodputs(model, nodes, gpus, 4096, (16, 256), tune_bsz=False)
    assert np.all(fixed <= got * (1 + 1e-6)) and np.any(fixed < got * 0.99)


def test_max_sum_throughput_gives_the_fast_type_to_whom_it_speeds_most() -> None:
    # two one-GPU jobs, one fast GPU and one slow: job 0 gains 4x on the fast one, job 1 only 1.5x
    thr = np.array([[4.0, 1.0], [1.5, 1.0]])
    x = max_sum_throughput(thr, np.array([1.0, 1.0]), np.array([1.0, 1.0]))
    assert x[0] == pytest.approx([1.0, 0.0], abs=1e-4) and x[1] == pytest.approx([0.0, 1.0], abs=1e-4)


def test_cli_runs_the_reference_policies_at_their_own_rounds(tmp_path) -> None:
    from hetflow.cli.main import main

    out = tmp_path / "s"
    args = ["simulate", "--protocol", "sia", "--trace", str(SLICE), "--throughputs", str(FIX / "profiles"),
            "--policies", "gavel", "--out", str(out)]
    assert main(args) == 0
    inputs = json.loads((out / "inputs.json").read_text())
    assert inputs["round_s"] == {"gavel": 360} and inputs["job_kind"] == {"gavel": "rigid"}
    rows = [r.split(",") for r in (out / "jobs.csv").read_text().splitlines()[1:]]
    assert {r[2]: float(r[4]) for r in rows} == {k: float(v) for k, v in REF["gavel"]["jcts"].items()}
    # Gavel cannot tune batch sizes: adaptive jobs are refused, one line, exit 2
    assert main(args[:-2] + ["--out", str(tmp_path / "a"), "--job-kind", "adaptive"]) == 2
