"""Gavel's and FGD's protocols against the reference simulators' own per-job results.

Small slices keep this cheap. A Gavel run is causal (a round's length is fixed when it starts),
so on the first N jobs of a calibration trace every job whose reference completion comes before
job N's arrival must finish at exactly the reference time. FGD's run is online with no
departures, so the first pods of a seed must land exactly where the artifact put them.
"""

from __future__ import annotations

import csv
import gzip
import json

import pytest

from hetflow.sim.calibration import fgd_expected, gavel_cases
from hetflow.sim.fgd import (load_fgd_nodes, load_fgd_pods, read_arrival_order, read_node_ranks, simulate_fgd,
                             typical_pods)
from hetflow.sim.gavel import load_gavel_jobs, simulate_gavel
from tests.conftest import TRACES

GAVEL = TRACES / "gavel-calibration"  # in the repository (data/README.md): a missing file fails, never skips
OPENB = TRACES / "alibaba-gpu-2023"
FGD_REF = OPENB / "fgd-reference"
ARRIVALS = FGD_REF / "arrival_order_seed42-51.csv.xz"


def _case(seed: int, trace: str):
    cases = [c for c in gavel_cases(GAVEL) if (c.seed, c.trace) == (seed, trace)]
    assert cases, f"no Gavel calibration run seed {seed} {trace} under {GAVEL}"
    return cases[0]


@pytest.mark.parametrize("seed,trace,policy,n", [
    (3, "single", "fifo", 120),  # agnostic FIFO with Gavel's stale-type quirk and seeded draws
    (5, "multi", "fifo_perf", 120),
    (5, "single", "max_min_fairness", 60),  # agnostic LAS: worker-type order shuffled per round
    (3, "multi", "max_min_fairness_perf", 50),
    (5, "multi", "finish_time_fairness_perf", 25),
])
def test_gavel_reference_policy_matches_gavel_per_job(seed, trace, policy, n):
    case = _case(seed, trace)
    all_jobs = load_gavel_jobs(case.trace_path, case.throughputs_path)
    cut = all_jobs[n].arrival_s
    run = simulate_gavel(all_jobs[:n], policy, seed=seed)
    ref = case.reference_jct(policy)
    settled = [j for j in all_jobs[:n] if ref[j.job_id] is not None and j.arrival_s + ref[j.job_id] < cut]
    assert len(settled) >= n // 3  # the slice must actually test something
    for j in settled:
        assert run.jct_s(j.job_id) == pytest.approx(ref[j.job_id], abs=1e-2), f"job {j.job_id}"


def test_gavel_policies_differ_on_the_same_slice():
    case = _case(3, "multi")
    jobs = load_gavel_jobs(case.trace_path, case.throughputs_path)[:70]
    fifo = simulate_gavel(jobs, "fifo", seed=3).summary()["avg_jct_s"]
    perf = simulate_gavel(jobs, "fifo_perf", seed=3).summary()["avg_jct_s"]
    ours = simulate_gavel(jobs, "hetflow", seed=3).summary()["avg_jct_s"]
    assert perf < fifo and ours < fifo


@pytest.fixture(scope="module")
def openb():
    nodes = load_fgd_nodes(OPENB / "openb_node_list_gpu_node.csv")
    pods = load_fgd_pods(OPENB / "openb_pod_list_default.csv")
    return nodes, pods


def test_typical_pods_match_the_artifacts_list(openb):
    _, pods = openb
    ours = typical_pods(pods)
    with (FGD_REF / "typical_pods_openb_pod_list_default.csv").open() as f:
        ref = list(csv.DictReader(f))
    assert [(t.cpu_milli, t.gpu_milli, t.num_gpu) for t in ours] == [
        (int(r["cpu_milli"]), int(r["gpu_milli"]), int(r["num_gpu"])) for r in ref]
    assert [t.weight for t in ours] == pytest.approx([float(r["weight"]) for r in ref], abs=1e-12)


@pytest.mark.parametrize("policy,column", [("BestFit", "bestfit"), ("FGD", "fgd")])
def test_fgd_protocol_places_like_the_artifact(openb, policy, column):
    nodes, pods = openb
    order = read_arrival_order(ARRIVALS, 42, len(pods))[:500]
    ranks = read_node_ranks(FGD_REF / "node_tiebreak_rank_seed42-51.csv", 42, nodes)
    run = simulate_fgd(nodes, pods, policy, seed=42, arrival_order=order, node_ranks=ranks)
    with gzip.open(FGD_REF / "rerun_seed42" / "placements_default_seed42_BestFit_FGD.csv.gz", "rt") as f:
        ref = [r for _, r in zip(range(len(order)), csv.DictReader(f))]
    names = [n.name for n in nodes]
    for k, (r, got) in enumerate(zip(ref, run.placements)):
        want_node = r[f"{column}_node"] or None
        assert (names[got[0]] if got else None) == want_node, f"pod {k}"
        if got and r[f"{column}_gpu_index"]:
            assert "-".join(map(str, got[1])) == r[f"{column}_gpu_index"], f"pod {k}"


def test_fgd_binning_matches_published_row_on_the_low_points(openb):
    """The first ~25 % of arrivals: every policy allocates what arrived; the binned columns
    must equal the published row there (sampling and rounding rules)."""
    nodes, pods = openb
    order = read_arrival_order(ARRIVALS, 43, len(pods))[:2200]
    ranks = read_node_ranks(FGD_REF / "node_tiebreak_rank_seed42-51.csv", 43, nodes)
    run = simulate_fgd(nodes, pods, "GpuPacking", seed=43, arrival_order=order, node_ranks=ranks)
    ref = fgd_expected(FGD_REF)[("04-GpuPacking", 43)]
    got = run.alloc_by_arrival
    top = max(got) - 2  # the last bins of a prefix are incomplete
    assert top >= 20
    frag = run.frag_by_arrival
    ref_frag = fgd_expected(FGD_REF, metric="frag")[("04-GpuPacking", 43)]
    for x in range(0, top):
        assert got[x] == ref[x], f"column {x}"
        assert frag[x] == ref_frag[x], f"fragmentation column {x}"


def test_cli_protocols_write_their_outputs(tmp_path, openb):
    from hetflow.cli.main import main

    case = _case(3, "single")
    lines = case.trace_path.read_text().splitlines()[:40]
    trace = tmp_path / "slice.trace"
    trace.write_text("\n".join(lines) + "\n")
    out = tmp_path / "g"
    assert main(["simulate", "--protocol", "gavel", "--trace", str(trace), "--throughputs",
                 str(case.throughputs_path), "--seed", "3", "--policies", "fifo_perf,hetflow", "--out", str(out)]) == 0
    summary = json.loads((out / "summary.json").read_text())
    assert set(summary) == {"fifo_perf", "hetflow"}
    run = simulate_gavel(load_gavel_jobs(trace, case.throughputs_path), "fifo_perf", seed=3)
    with (out / "jobs-fifo_perf.csv").open() as f:
        rows = list(csv.DictReader(f))
    assert len(rows) == 40
    assert float(rows[7]["jct_s"]) == pytest.approx(run.jct_s(7), abs=1e-3)
    assert main(["simulate", "--protocol", "gavel", "--trace", str(trace), "--throughputs",
                 str(case.throughputs_path), "--policies", "nope", "--out", str(out)]) == 2


def test_cli_fgd_rejects_missing_cluster(tmp_path):
    from hetflow.cli.main import main

    assert main(["simulate", "--protocol", "fgd", "--trace", str(OPENB / "openb_pod_list_default.csv"),
                 "--out", str(tmp_path / "f")]) == 2
