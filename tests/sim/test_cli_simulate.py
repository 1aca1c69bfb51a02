"""``hetflow simulate``: outputs on small real inputs, and one-line errors for bad input."""

from __future__ import annotations

import argparse
import csv
import json

import pytest

from hetflow.cli import simulate
from hetflow.core.errors import InputError
from tests.conftest import TRACES

GAVEL_SPEEDS = TRACES / "gavel" / "simulation_throughputs.json"
KEYS = {"avg_jct_s", "p95_jct_s", "makespan_s", "utilisation", "effective_utilisation",
        "unallocated_gpu_share", "wall_s"}


def _run(*argv: str) -> int:
    parser = argparse.ArgumentParser(prog="hetflow")
    simulate.register(parser.add_subparsers())
    args = parser.parse_args(["simulate", *argv])
    return args.func(args)


def test_simulate_a_gavel_trace_writes_summary_jobs_and_plots(tmp_path) -> None:
    out = tmp_path / "run"
    rc = _run("--cluster", "2 * 4x V100 + 2 * 4x K80 @ 3.125",
              "--trace", str(TRACES / "gavel" / "philly_vc_traces_seed0" / "51b7ef.trace"),
              "--throughputs", str(GAVEL_SPEEDS), "--window", "2:12",
              "--policies", "fifo,max_min_fairness,hetflow", "--out", str(out))
    assert rc == 0
    summary = json.loads((out / "summary.json").read_text())
    inputs = json.loads((out / "inputs.json").read_text())
    assert inputs["schema"] == "hetflow.simulation/v1"
    assert inputs["jobs"] == 18 and inputs["window"] == [2, 12]
    assert inputs["device_types"] == {"V100-16GB": 8, "K80": 8}
    assert list(summary) == ["fifo", "max_min_fairness", "hetflow"]
    for s in summary.values():
        assert KEYS <= set(s) and s["jobs_measured"] == 10 and s["finished"] == 10
    rows = list(csv.DictReader((out / "jobs-hetflow.csv").open()))
    assert len(rows) == 18 and sum(r["measured"] == "True" for r in rows) == 10
    assert len(json.loads((out / "jobs-fifo.json").read_text())) == 18
    for png in ("jct_cdf.png", "utilisation.png"):
        assert (out / png).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_simulate_openb_packing(tmp_path) -> None:
    out = tmp_path / "openb"
    nodes = tmp_path / "nodes.csv"
    # the first 40 nodes of the real list (P100 and T4 nodes)
    nodes.write_text("".join((TRACES / "alibaba-gpu-2023" / "openb_node_list_gpu_node.csv").open().readlines()[:41]))
    pods = tmp_path / "pods.csv"
    pods.write_text("".join((TRACES / "alibaba-gpu-2023" / "openb_pod_list_default.csv").open().readlines()[:301]))
    assert _run("--cluster", str(nodes), "--trace", str(pods), "--packing", "1.2",
                "--policies", "bestfit,hetflow", "--out", str(out)) == 0
    s = json.loads((out / "summary.json").read_text())
    for name in ("bestfit", "hetflow"):
        assert 0.0 <= s[name]["unallocated_gpu_share"] < 0.5


@pytest.mark.parametrize("argv, message", [
    (["--window", "9:3"], "--window '9:3'"),
    (["--policies", "fifo,nope"], "unknown policy 'nope'"),
    (["--cluster", "nowhere.yaml"], "no such file"),
    (["--trace", "missing.trace"], "no such trace file"),
    (["--cluster", "4 * 8x Z999"], "unknown accelerator"),
    (["--packing", "0"], "--packing"),
    # huge counts: refused at once (each once ran until killed)
    (["--cluster", "100000000 * 8x V100"], "a cluster of 100,000,000 nodes is past the 100,000"),
    (["--trace", "synthetic:jobs=100000000,rate=4"], "100,000,000 jobs is past the 1,000,000"),
    (["--elastic-fraction", "2"], "--elastic-fraction 2.0: give a share between 0 and 1"),
    (["--elastic-fraction", "0.5", "--elastic-scaling", "eff:2"], "the efficiency must be in (0, 1]"),
    (["--elastic-fraction", "0.5", "--protocol", "gavel"], "apply to hetflow's own model"),
    (["--trace", str(TRACES / "gavel" / "philly_vc_traces_seed0" / "795a4c.trace"), "--throughputs",
      str(GAVEL_SPEEDS)], "no job of the trace can run on this cluster's device types (H100-SXM)"),
])
def test_bad_input_is_one_clear_input_error(tmp_path, argv, message) -> None:
    base = {"--cluster": "1 * 2x H100", "--trace": "synthetic:jobs=5,rate=10", "--out": str(tmp_path / "o")}
    for flag, value in zip(argv[::2], argv[1::2]):
        base[flag] = value
    flat = [x for kv in base.items() for x in kv]
    with pytest.raises(InputError) as e:
        _run(*flat)
    assert message in str(e.value) and "\n" not in str(e.value)


def test_rank_planner_flag_lets_the_planner_decide_every_start(tmp_path) -> None:
    """``--rank-planner``: each policy's run plans its starts' ranks (as the live controller
    does); the counts land in the summary. Without the flag the policy's devices are kept."""
    argv = ["--cluster", "2 * 8x V100 + 2 * 8x H100", "--trace", "synthetic:jobs=60,rate=40,seed=1",
            "--policies", "fifo,hetflow"]
    assert _run(*argv, "--out", str(tmp_path / "plain")) == 0
    assert _run(*argv, "--rank-planner", "--out", str(tmp_path / "ranked")) == 0
    plain = json.loads((tmp_path / "plain" / "summary.json").read_text())
    ranked = json.loads((tmp_path / "ranked" / "summary.json").read_text())
    assert all("rank_planner" not in s for s in plain.values())
    assert json.loads((tmp_path / "ranked" / "inputs.json").read_text())["rank_planner"] is True
    for policy, s in ranked.items():
        counts = s["rank_planner"]
        # every job of the trace started at least once, each start planned
        assert counts["planned"] >= 60 - s.get("rejected", 0), (policy, counts)
        assert 0 <= counts["moved"] <= counts["changed"] <= counts["planned"]
        assert counts["refused"] == 0
