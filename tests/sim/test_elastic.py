"""Elastic jobs: the device range is kept, resizes pay their restart, growing into an empty
cluster helps, trace fields parse, and a bad range is one line with exit 2."""

from __future__ import annotations

import subprocess
import sys

import pytest

from hetflow.core.errors import InputError, ParseError
from hetflow.scheduling.elastic import elastic_sizes, mark_elastic, parse_scaling, rigid
from hetflow.scheduling.policies.hetflow import HetflowPolicy
from hetflow.scheduling.throughput import load_gavel_throughputs
from hetflow.sim.engine import SimConfig, Simulator
from hetflow.sim.traces import Job, load_gavel_trace, load_philly_csv, synthetic_trace
from tests.conftest import TRACES
from tests.sim.world import cluster, jct, job, node, table

LINEAR = table({("a", 1, "fast"): 1.0})  # larger gangs scale linearly from the 1-GPU rate


def _run(model, jobs, speeds, policy=None, **config):
    return Simulator(model, jobs, policy or HetflowPolicy(), speeds, SimConfig(**config)).run()


def test_policy_keeps_every_elastic_job_inside_its_range_and_uses_both_ends() -> None:
    speeds = load_gavel_throughputs(TRACES / "gavel" / "simulation_throughputs.json")
    model = cluster(node("v0", "V100-16GB", 4), node("v1", "V100-16GB", 4), node("k0", "K80", 4),
                    inter_node_gbps=3.125)
    trace = synthetic_trace(speeds, 80, 12.0, seed=3, reference_types=("V100-16GB",))
    jobs = mark_elastic(trace.jobs, 0.7, seed=3, largest_node=4)
    by_id = {j.job_id: j for j in jobs}
    elastic = {i for i, j in enumerate(sorted(jobs, key=lambda j: j.arrival_s)) if len(j.sizes) > 1}
    assert len(elastic) > 20
    r = _run(model, jobs, speeds)
    assert all(rec.finish is not None for rec in r.jobs)
    below = above = 0
    for seg in r.segments:
        j = r.jobs[seg.job].job
        n = len(seg.slots)
        if seg.job in elastic:
            assert j.min_gpus <= n <= j.max_gpus and n in j.sizes
            below += n < j.num_gpus
            above += n > j.num_gpus
        else:
            assert n == by_id[j.job_id].num_gpus
    assert below and above  # it both shrank (or started small) and grew
    assert sum(rec.resizes for rec in r.jobs) > 0


def test_resize_pays_the_checkpoint_restart_delay() -> None:
    # 2 GPUs. t=0: the short rigid job 1 (100 steps) goes first on one GPU; elastic job 0
    # (1..2 GPUs, 1000 steps, linear) cannot get 2, so it starts on the other at 1 step/s. Job
    # 1 ends at 100 (nothing waits: no decision). At the round boundary t=360 job 0 (640 steps
    # left) grows to 2 GPUs: restart, 30 s without progress, then 2 steps/s -> 360+30+320 = 710.
    model = cluster(node("n0", "fast", 2))
    jobs = [job(0, "a", 0, 1, 1000, min_gpus=1, max_gpus=2, scaling="eff:1"), job(1, "a", 0, 1, 100)]
    r = _run(model, jobs, LINEAR, restore_s=30.0)
    assert jct(r) == {"0": pytest.approx(710.0), "1": pytest.approx(100.0)}
    assert r.jobs[0].resizes == 1 and r.jobs[0].preemptions == 0 and r.jobs[0].migrations == 0
    free = _run(model, jobs, LINEAR, restore_s=0.0)
    assert jct(free)["0"] == pytest.approx(680.0)  # the 30 s is the resize's, nothing else
    assert jct(_run(model, rigid(jobs), LINEAR))["0"] == pytest.approx(1000.0)


@pytest.mark.parametrize("curve, speedup", [("eff:0.85", 4 * 0.85 ** 2), ("table", 4.0),
                                            ("1:1,2:1.5,4:2.5", 2.5)])
def test_elastic_job_on_an_empty_cluster_finishes_no_later_than_rigid(curve, speedup) -> None:
    model = cluster(node("n0", "fast", 4))
    elastic = [job(0, "a", 0, 1, 3600, min_gpus=1, max_gpus=4, scaling=curve)]
    e, r = jct(_run(model, elastic, LINEAR))["0"], jct(_run(model, rigid(elastic), LINEAR))["0"]
    assert r == pytest.approx(3600.0)
    assert e == pytest.approx(3600.0 / speedup) and e <= r


def test_shrinks_to_make_room_for_a_short_arrival_then_grows_back() -> None:
    # Elastic job 0 (2..4 GPUs, declared 4) has the node of 4; a short rigid 2-GPU job arrives
    # at t=100. At the boundary t=360 it is admitted by shrinking job 0 to 2 (it runs 360..460);
    # at t=720 job 0 grows back to 4. Rigid, job 0 would have been preempted instead.
    model = cluster(node("n0", "fast", 4))
    jobs = [job(0, "a", 0, 4, 20000, min_gpus=2, max_gpus=4), job(1, "a", 100, 2, 200)]
    r = _run(model, jobs, LINEAR)
    assert [len(s.slots) for s in r.segments if s.job == 0] == [4, 2, 4]
    assert r.jobs[0].resizes == 2 and r.jobs[0].preemptions == 0
    assert jct(r)["1"] == pytest.approx(360.0)
    off = _run(model, jobs, LINEAR, policy=HetflowPolicy(elastic=False))
    assert {len(s.slots) for s in off.segments if s.job == 0} == {4}  # without resizing: rigid
    assert jct(off) == jct(_run(model, rigid(jobs), LINEAR))


def test_sizes_and_curves() -> None:
    assert elastic_sizes(1, 8, 2) == (1, 2, 4, 8)
    assert elastic_sizes(3, 12, 6) == (3, 4, 6, 8, 12)
    assert parse_scaling("1:1,2:1.8").relative(2, 1) == pytest.approx(1.8)
    assert parse_scaling("eff:0.5").relative(4, 1) == pytest.approx(1.0)
    for bad in ("eff:0", "eff:1.5", "1:1", "x", "2:1,2:3", "1:-1,2:1"):
        with pytest.raises(InputError):
            parse_scaling(bad)


def test_mark_elastic_is_seeded_and_follows_the_rule() -> None:
    jobs = [Job(str(i), "a", float(i), n, 100.0) for i, n in enumerate([1, 2, 4, 8] * 50)]
    a, b = mark_elastic(jobs, 0.5, 7, 8), mark_elastic(jobs, 0.5, 7, 8)
    assert a == b and a != mark_elastic(jobs, 0.5, 8, 8)
    marked = [j for j in a if j.max_gpus is not None]
    assert 70 < len(marked) < 130
    for j in marked:
        assert (j.min_gpus, j.max_gpus) == ((j.num_gpus + 1) // 2, max(j.num_gpus, min(2 * j.num_gpus, 8)))
    assert rigid(a) == tuple(jobs)
    with pytest.raises(InputError):
        mark_elastic(jobs, 1.5, 0, 8)


def test_gavel_13_columns_and_philly_columns_carry_the_fields(tmp_path) -> None:
    g = tmp_path / "e.trace"
    row = "ResNet-18 (batch size 16)\tcmd\tdir\t--steps\tFalse\t{steps}\t{k}\t1\t-1\t{t}\t{extra}\n"
    g.write_text(row.format(steps=500, k=2, t=0, extra="1\t4\teff:0.9")
                 + row.format(steps=300, k=1, t=10, extra="\t\t"))
    t = load_gavel_trace(g)
    assert t.format == "gavel-13"
    j0, j1 = t.jobs
    assert (j0.min_gpus, j0.max_gpus, j0.scaling, j0.sizes) == (1, 4, "eff:0.9", (1, 2, 4))
    assert j1.max_gpus is None and j1.sizes == (1,)
    p = tmp_path / "p.csv"
    p.write_text("timestamp,duration,num_gpus,min_gpus,max_gpus,scaling\n"
                 '2017-10-03 00:00:00,600,2,1,4,"1:1,2:1.9,4:3.5"\n'
                 "2017-10-03 00:01:00,600,1,,,\n")
    a, b = load_philly_csv(p).jobs
    assert (a.min_gpus, a.max_gpus, a.scaling) == (1, 4, "1:1,2:1.9,4:3.5") and b.max_gpus is None


@pytest.mark.parametrize("extra, message", [
    ("4\t8\t", "min_gpus 4, num_gpus 2, max_gpus 8: an elastic job needs 1 <= min_gpus"),
    ("1\t\t", "give both min_gpus and max_gpus"),
    ("1\t4\t1:1,2:2", "does not cover 1..4"),
    ("1\t4\teff:7", "the efficiency must be in (0, 1]"),
])
def test_bad_elastic_fields_name_the_line(tmp_path, extra, message) -> None:
    g = tmp_path / "bad.trace"
    g.write_text("A3C\tcmd\tdir\t--steps\tFalse\t500\t1\t1\t-1\t0\t\t\t\n"
                 f"A3C\tcmd\tdir\t--steps\tFalse\t500\t2\t1\t-1\t5\t{extra}\n")
    with pytest.raises(ParseError) as e:
        load_gavel_trace(g)
    assert e.value.line == 2 and message in str(e.value) and "\n" not in str(e.value)


def test_cli_bad_range_exits_2_with_one_line(tmp_path) -> None:
    p = tmp_path / "p.csv"
    p.write_text("timestamp,duration,num_gpus,min_gpus,max_gpus,scaling\n2017-10-03 00:00:00,600,2,3,1,\n")
    proc = subprocess.run([sys.executable, "-m", "hetflow.cli.main", "simulate", "--cluster", "1 * 4x V100",
                           "--trace", str(p), "--out", str(tmp_path / "o")],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "p.csv:2" in lines[0] and "min_gpus 3, num_gpus 2, max_gpus 1" in lines[0]


def test_cli_elastic_fraction_marks_jobs_and_reports_resizes(tmp_path) -> None:
    import argparse
    import json

    from hetflow.cli import simulate

    parser = argparse.ArgumentParser(prog="hetflow")
    simulate.register(parser.add_subparsers())
    out = tmp_path / "o"
    args = parser.parse_args(["simulate", "--cluster", "2 * 4x V100 @ 3.125", "--trace",
                              "synthetic:jobs=40,rate=30,seed=1", "--elastic-fraction", "1", "--throughputs",
                              str(TRACES / "gavel" / "simulation_throughputs.json"), "--policies", "hetflow",
                              "--out", str(out)])
    assert args.func(args) == 0
    inputs = json.loads((out / "inputs.json").read_text())
    summary = json.loads((out / "summary.json").read_text())["hetflow"]
    assert inputs["elastic_jobs"] >= 20 and inputs["elastic_fraction"] == 1.0
    assert summary["finished"] + summary["rejected"] == 40 and summary["finished"] >= 20 and summary["resizes"] > 0
    rows = json.loads((out / "jobs-hetflow.json").read_text())
    assert sum(r["resizes"] for r in rows) == summary["resizes"]


def test_eager_growth_takes_devices_a_waiting_job_could_use_only_when_asked() -> None:
    # 4 GPUs; the short elastic job 0 (1..4, linear) and the long rigid job 1 arrive together.
    # Default: job 0 asks for 1, job 1 takes 1, and job 0 grows into what is idle (to 2; 4 would
    # need 3). eager_growth: with linear scaling the extra devices cost the others nothing
    # in device-seconds, so job 0 asks for 4 and job 1 waits for it.
    model = cluster(node("n0", "fast", 4))
    jobs = [job(0, "a", 0, 1, 400, min_gpus=1, max_gpus=4, scaling="eff:1"), job(1, "a", 0, 1, 5000)]
    default = _run(model, jobs, LINEAR)
    eager = _run(model, jobs, LINEAR, policy=HetflowPolicy(eager_growth=True))
    assert [len(s.slots) for s in default.segments if s.job == 0] == [2]
    assert [len(s.slots) for s in eager.segments if s.job == 0] == [4]
    assert jct(default)["0"] == pytest.approx(200.0) and jct(eager)["0"] == pytest.approx(100.0)
    assert jct(default)["1"] == pytest.approx(5000.0) and jct(eager)["1"] == pytest.approx(5100.0)
