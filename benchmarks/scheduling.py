"""Scheduling benchmark: every cluster policy on the same traces, in one process.

    .venv/bin/python benchmarks/scheduling.py            # everything but Sia's part, ~14 minutes on 2 cores
    .venv/bin/python benchmarks/scheduling.py --sia DIR  # and Sia's (DIR: `hetflow traces fetch sia`), ~24
    .venv/bin/python benchmarks/scheduling.py --quick    # smaller traces, 2 calibration traces, no FTF, 1 FGD seed
    .venv/bin/python benchmarks/scheduling.py --calibration-only   # only the reference protocols

Three experiments, one table:

1. **Gavel's setting** (Narayanan et al., OSDI'20): 36 V100 + 36 P100 + 36 K80 (nodes of 4,
   25 Gb/s between nodes, as the AWS instances Gavel measured on), Gavel's measured throughput
   file, and Gavel's job mix from its generator: Poisson arrivals, job types uniform over its
   26 templates, durations 10^U(1.5,3) min (p=0.8) or 10^U(3,4) min on a V100, gangs of 1/2/4/8
   GPUs with p=.70/.10/.15/.05. Average JCT over the steady-state window of jobs 4000-4999 by
   arrival (the paper's window); targets: hetflow <= 0.9 x max_min_fairness and <= 0.7 x fifo.
2. **1,024 mixed GPUs**: 32 nodes each of 8x H100, 8x MI300X, 8x A100-80GB, 8x L40S (25 GB/s
   network), speeds estimated from the catalog by the roofline of the built-in job profiles,
   10,000 jobs of the same mix arriving faster than the cluster drains them (durations on an
   A100-80GB). Reported: wall time of each simulation (target < 2 min), utilisation and effective
   utilisation while demand exceeds capacity (target >= 0.9), average JCT.
3. **Alibaba openb** (Weng et al., ATC'23): the real 1,213-node, 6,212-GPU node list and its pod
   requests (shared GPUs, CPU, memory), replayed as requests that never leave until they ask for
   1.3 x the GPUs; the share of GPU capacity left unallocated while demand exceeds capacity.
   Baseline: plain best fit.

0. **Calibration** against the reference simulators' own results (docs/simulator.md, "Reference
   protocols"): every Gavel reference policy and hetflow under Gavel's rules on the four
   calibration traces (ours vs Gavel's window average; hetflow vs the best of Gavel's own
   results), and BestFit, DotProd, GpuPacking, FGD and hetflow under FGD's rules on the
   published seeds (worst gap to the published rows in points; hetflow's mean allocation over
   the 100-130 % points). Their figures join the RESULT line: ``gavel_fidelity_worst
   fgd_fidelity_worst_points hetflow_over_gavel_best fgd_alloc_hetflow elastic_over_rigid
   fgd_run_wall_s gavel_gap_closed_worst fgd_lead_points one_policy``: the smallest share, over the traces,
   of the gap between Gavel's best policy and the no-queueing bound (every job alone on its
   fastest type from its arrival) that hetflow closes, ``(best - hetflow) / (best - bound)``;
   and hetflow's mean allocation minus FGD's at the 100 % arrival point, in points.

S. **Sia's protocol** (``--sia DIR``, a ``hetflow traces fetch sia`` folder: Sia's workloads
   carry no licence, so the repository ships none and this part runs only when given one):
   the live policy, 60 s rounds, on every Philly and Helios (saturn) workload with a reference
   run of Sia's own simulator (hetflow/sim/data/sia_reference.yaml), run as each reference ran
   its jobs: ``hetflow_over_sia`` - every job adaptive (GPU count from the policy, batch size
   from the job's goodput model) against Sia's runs (the same); ``hetflow_over_sia_rigid`` -
   every job rigid against Sia's runs with every job rigid; ``hetflow_over_sia_gavel`` - every
   job rigid against Gavel's; each the mean over those workloads of the ratio of average JCTs.
   ``sia_fidelity_worst``: Sia's and Gavel's policies re-stated (hetflow/sim/sia_reference.py)
   on the same workloads, run as their references ran - the largest ``|avg JCT / reference's -
   1|``. They join the RESULT line; ``--sia-only`` prints just them.

E. **Elastic jobs**: hetflow on the gavel-108 and mixed-1024 traces with ``--elastic-fraction``
   (0.5) of the jobs elastic (``hetflow.scheduling.elastic.mark_elastic``, ``--elastic-scaling``
   eff:0.85), against the same policy on the same jobs kept rigid; ``elastic_over_rigid`` is
   the worse of the two average-JCT ratios. ``--elastic-only`` runs just these four simulations
   (a few minutes) and prints ``RESULT elastic_over_rigid=<x> elastic_over_rigid_gavel_108=<x>
   elastic_over_rigid_mixed_1024=<x>``.

Independent runs go to worker processes (``--workers``). Wall times are of this machine. Seeded. The
last line is machine-readable: ``RESULT hetflow_over_max_min=<x> hetflow_over_fifo=<x>
sim_1024_wall_s=<x> effective_utilisation=<x> openb_unallocated_hetflow=<x>
openb_unallocated_bestfit=<x>`` (wall and utilisation: the hetflow run).
"""

from __future__ import annotations

import argparse
import contextlib
import math
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np

from hetflow.scheduling.elastic import DEFAULT_SCALING, mark_elastic, rigid
from hetflow.scheduling.policies.capacity import ClusterModel
from hetflow.scheduling.policies.hetflow import HetflowPolicy
from hetflow.scheduling.policies.registry import make_policy
from hetflow.scheduling.throughput import default_model, load_gavel_throughputs
from hetflow.sim.cluster import parse_shorthand
from hetflow.sim.engine import SimConfig, Simulator
from hetflow.sim.metrics import summarise
from hetflow.sim.traces import load_openb_nodes, load_openb_pods, openb_packing_jobs, synthetic_trace
from hetflow.sim.calibration import fgd_expected, gavel_cases
from hetflow.sim.fgd import (FGD_CSV_NAMES, load_fgd_nodes, load_fgd_pods, read_arrival_order, read_node_ranks,
                             simulate_fgd, typical_pods)
from hetflow.sim.gavel import GAVEL_REFERENCE, load_gavel_jobs, simulate_gavel

TRACES = Path(__file__).resolve().parents[1] / "data" / "traces"  # in the repository (data/README.md)
GAVEL_CLUSTER = "9 * 4x V100 + 9 * 4x P100 + 9 * 4x K80 @ 3.125"
MIXED_CLUSTER = "32 * 8x H100 + 32 * 8x MI300X + 32 * 8x A100-80GB + 32 * 8x L40S @ 25"
JCT_POLICIES = ("fifo", "srtf", "las", "max_min_fairness", "hetflow")
PACKING_POLICIES = ("bestfit", "fifo", "hetflow")


def _run(model: ClusterModel, jobs: Any, policy: str, speeds: Any, config: SimConfig) -> dict[str, Any]:
    start = time.perf_counter()
    result = Simulator(model, jobs, make_policy(policy), speeds, config).run()
    return summarise(result, time.perf_counter() - start)


def _progress(text: str) -> None:
    print(text, file=sys.stderr, flush=True)


def gavel(jobs: int, window: tuple[int, int], rate: float, seed: int,
          policies: tuple[str, ...] = JCT_POLICIES) -> dict[str, dict[str, Any]]:
    speeds = load_gavel_throughputs(TRACES / "gavel" / "simulation_throughputs.json")
    model = ClusterModel.from_snapshot(parse_shorthand(GAVEL_CLUSTER))
    trace = synthetic_trace(speeds, jobs, rate, seed=seed, reference_types=("V100-16GB",))
    out = {}
    for p in policies:
        out[p] = _run(model, trace.jobs, p, speeds, SimConfig(window=window))
        _progress(f"  gavel {p}: {out[p]['wall_s']:.0f} s")
    return out


def mixed(jobs: int, rate: float, seed: int, policies: tuple[str, ...] = JCT_POLICIES) -> dict[str, dict[str, Any]]:
    speeds = default_model()
    model = ClusterModel.from_snapshot(parse_shorthand(MIXED_CLUSTER))
    assert model.total_devices == 1024
    trace = synthetic_trace(speeds, jobs, rate, seed=seed, reference_types=("A100-80GB",))
    out = {}
    for p in policies:
        out[p] = _run(model, trace.jobs, p, speeds, SimConfig())
        _progress(f"  1024 {p}: {out[p]['wall_s']:.0f} s")
    return out


def openb(overload: float, seed: int, pods_limit: int | None,
          policies: tuple[str, ...] = PACKING_POLICIES) -> dict[str, dict[str, Any]]:
    base = TRACES / "alibaba-gpu-2023"
    model = ClusterModel.from_snapshot(load_openb_nodes(base / "openb_node_list_gpu_node.csv"))
    pods = load_openb_pods(base / "openb_pod_list_default.csv").jobs[:pods_limit]
    jobs = openb_packing_jobs(pods, model.total_devices, overload, seed=seed)
    out = {}
    for p in policies:
        out[p] = _run(model, jobs, p, default_model(), SimConfig())
        _progress(f"  openb {p}: {out[p]['wall_s']:.0f} s")
    return out


# --------------------------------------------------------------------- elastic jobs

ELASTIC_FRACTION = 0.5


def elastic_pair(workload: str, jobs: int, window: tuple[int, int] | None, rate: float, seed: int,
                 fraction: float, scaling: str, eager: bool = False) -> dict[str, dict[str, Any]]:
    """hetflow on one workload twice, on the same trace: with a seeded ``fraction`` of the jobs
    elastic (``mark_elastic``: min = ceil(n/2), max = min(2n, one node), ``scaling``), and
    rigid (the same jobs at their declared sizes: the same policy without resizing)."""
    if workload == "gavel-108":
        speeds = load_gavel_throughputs(TRACES / "gavel" / "simulation_throughputs.json")  # as gavel()
        model = ClusterModel.from_snapshot(parse_shorthand(GAVEL_CLUSTER))
        trace = synthetic_trace(speeds, jobs, rate, seed=seed, reference_types=("V100-16GB",))
    else:
        speeds = default_model()
        model = ClusterModel.from_snapshot(parse_shorthand(MIXED_CLUSTER))
        trace = synthetic_trace(speeds, jobs, rate, seed=seed, reference_types=("A100-80GB",))
    marked = mark_elastic(trace.jobs, fraction, seed, model.max_devices, scaling)
    out: dict[str, Any] = {}
    jcts = {}
    for name, js in (("rigid", rigid(marked)), ("elastic", marked)):
        start = time.perf_counter()
        policy = HetflowPolicy(eager_growth=eager)  # = make_policy("hetflow") unless --eager-growth
        result = Simulator(model, js, policy, speeds, SimConfig(window=window)).run()
        out[name] = summarise(result, time.perf_counter() - start)
        jcts[name] = {r.job.job_id: r.jct_s for i, r in enumerate(result.jobs) if i in result.measured}
        if name == "elastic":
            groups = {}
            for i in result.measured:
                r = result.jobs[i]
                alone_h = r.job.total_work / r.best_rate / 3600 if r.best_rate > 0 else math.inf
                length = "<1 h" if alone_h < 1 else "1-10 h" if alone_h < 10 else ">=10 h"
                kind = "elastic" if len(r.job.sizes) > 1 else "rigid"
                groups.setdefault((kind, length), []).append(r.job.job_id)
        _progress(f"  {workload} hetflow {name}: {out[name]['avg_jct_s'] / 3600:.2f} h, {out[name]['wall_s']:.0f} s")
    out["elastic"]["elastic_jobs"] = sum(1 for j in marked if len(j.sizes) > 1)
    out["groups"] = {}  # (kind, length alone on the best type) -> (jobs, avg JCT elastic / rigid)
    for key, ids in sorted(groups.items()):
        both = [i for i in ids if jcts["elastic"][i] is not None and jcts["rigid"][i] is not None]
        if both:
            out["groups"][key] = (len(both), sum(jcts["elastic"][i] for i in both) / sum(jcts["rigid"][i] for i in both))
    return out


def print_elastic(pairs: dict[str, dict[str, dict[str, Any]]], fraction: float, scaling: str,
                  eager: bool = False) -> float:
    """The elastic table; returns the worse avg JCT ratio (elastic / rigid) of the workloads."""
    print(f"\nElastic jobs: hetflow with {fraction:.0%} of the jobs elastic (min ceil(n/2), max min(2n, one node), "
          f"scaling {scaling}, a resize = checkpoint-restart of 30 s{', eager growth' if eager else ''}) against the "
          f"same jobs rigid; hours.")
    print("| workload | jobs | avg JCT | p95 JCT | makespan | util | resizes | preemptions | wall s |")
    print("|---|---|---|---|---|---|---|---|---|")
    ratios = []
    for workload, pair in pairs.items():
        for name in ("rigid", "elastic"):
            s = pair[name]
            print(f"| {workload} | {name} | {s['avg_jct_s'] / 3600:.2f} | {s['p95_jct_s'] / 3600:.1f} | "
                  f"{s['makespan_s'] / 3600:.1f} | {_f(s['utilisation'])} | {s['resizes']} | {s['preemptions']} | "
                  f"{s['wall_s']:.1f} |")
        r, e = pair["rigid"], pair["elastic"]
        ratios.append(e["avg_jct_s"] / r["avg_jct_s"])
        print(f"| {workload} | elastic / rigid | {ratios[-1]:.3f} | {e['p95_jct_s'] / r['p95_jct_s']:.3f} | "
              f"{e['makespan_s'] / r['makespan_s']:.3f} | | | | |")
    print("\nWhere it comes from: avg JCT elastic run / rigid run, same jobs, by kind and run time alone "
          "on the best type (jobs in brackets).")
    order = {"<1 h": 0, "1-10 h": 1, ">=10 h": 2}
    keys = sorted({k for pair in pairs.values() for k in pair["groups"]}, key=lambda k: (k[0], order[k[1]]))
    print("| workload | " + " | ".join(f"{kind} {length}" for kind, length in keys) + " |")
    print("|---|" + "---|" * len(keys))
    for workload, pair in pairs.items():
        cells = [f"{pair['groups'][k][1]:.2f} ({pair['groups'][k][0]})" if k in pair["groups"] else "-" for k in keys]
        print(f"| {workload} | " + " | ".join(cells) + " |")
    return max(ratios)


# --------------------------------------------------------------------- calibration runs

GAVEL_WINDOW = (500, 1000)
FGD_BENCH_POLICIES = ("BestFit", "DotProd", "GpuPacking", "FGD", "hetflow")
FGD_POINTS = (80, 90, 95, 100, 110, 120, 130)


def gavel_case(index: int, policies: tuple[str, ...]) -> list[dict[str, Any]]:
    """Every given policy on one calibration trace, in Gavel's protocol; each row with the
    reference's window average where Gavel has one, and the bound: every job alone on its
    fastest type from its arrival."""
    case = gavel_cases(TRACES / "gavel-calibration")[index]
    jobs = load_gavel_jobs(case.trace_path, case.throughputs_path)
    window_jobs = [j for j in jobs if GAVEL_WINDOW[0] <= j.job_id < GAVEL_WINDOW[1]]
    bound = float(np.mean([j.total_steps / max(j.thr.values()) for j in window_jobs]))
    rows = []
    for p in GAVEL_REFERENCE:  # Gavel's own figures for every reference policy, whether we rerun it or not
        ref = case.reference(p)
        jct = case.reference_jct(p)
        window = [v for k, v in jct.items() if GAVEL_WINDOW[0] <= k < GAVEL_WINDOW[1] and v is not None]
        rows.append({"seed": case.seed, "trace": case.trace, "policy": p, "source": "gavel",
                     "avg_jct_s": ref["avg_jct_s_window"], "p95_jct_s": float(np.percentile(window, 95)),
                     "makespan_s": ref["makespan_s"]})
    for p in policies:
        run = simulate_gavel(jobs, p, seed=case.seed)
        s = run.summary(GAVEL_WINDOW)
        ref = case.reference(p) if p in GAVEL_REFERENCE else None
        rows.append({"seed": case.seed, "trace": case.trace, "policy": p, "source": "hetflow", **s, "bound_s": bound,
                     "ref_avg_jct_s": ref["avg_jct_s_window"] if ref else None})
        _progress(f"  gavel seed{case.seed} {case.trace} {p}: {s['avg_jct_s'] / 3600:.3f} h"
                  + (f" (Gavel {ref['avg_jct_s_window'] / 3600:.3f} h)" if ref else "") + f", {run.wall_s:.0f} s")
    return rows


def fgd_seed(seed: int) -> dict[str, tuple[dict[int, float], float]]:
    """Every packing policy on one seed of FGD's protocol, replaying the artifact's arrival order
    and node ranks: {policy: (allocation % by arrived %, wall s)}."""
    base = TRACES / "alibaba-gpu-2023"
    ref_dir = base / "fgd-reference"
    nodes = load_fgd_nodes(base / "openb_node_list_gpu_node.csv")
    pods = load_fgd_pods(base / "openb_pod_list_default.csv")
    typical = typical_pods(pods)
    order = read_arrival_order(ref_dir / "arrival_order_seed42-51.csv.xz", seed, len(pods))
    ranks = read_node_ranks(ref_dir / "node_tiebreak_rank_seed42-51.csv", seed, nodes)
    out = {}
    for p in FGD_BENCH_POLICIES:
        run = simulate_fgd(nodes, pods, p, seed=seed, arrival_order=order, node_ranks=ranks, typical=typical)
        out[p] = (run.alloc_by_arrival, run.wall_s)
        _progress(f"  fgd seed {seed} {p}: {run.alloc_by_arrival.get(100)} % at 100 %, {run.wall_s:.1f} s")
    return out


def one_policy() -> int:
    """1 when every reference protocol's ``hetflow`` is the live controller's registry class (the
    policy object the protocol's adapter drives is the one ``make_policy("hetflow")`` builds), else 0."""
    from hetflow.scheduling.policies.registry import make_policy
    from hetflow.sim.fgd import make_packing_policy
    from hetflow.sim.gavel import make_gavel_policy
    from hetflow.sim.live_sia import live_sia_policy

    live = type(make_policy("hetflow"))
    drivers = (make_gavel_policy("hetflow"), make_packing_policy("hetflow"), live_sia_policy("hetflow"))
    return int(all(type(getattr(d, "policy", None)) is live for d in drivers))


def fgd_summary(by_seed: dict[int, dict[str, tuple[dict[int, float], float]]]) -> dict[str, Any]:
    seeds = sorted(by_seed)
    expected = fgd_expected(TRACES / "alibaba-gpu-2023" / "fgd-reference")
    out: dict[str, Any] = {}
    for p in FGD_BENCH_POLICIES:
        runs = {s: by_seed[s][p][0] for s in seeds}
        r: dict[str, Any] = {"runs": runs, "wall_s": [by_seed[s][p][1] for s in seeds]}
        xs = sorted(set.intersection(*(set(v) for v in runs.values())))
        r["mean"] = {x: float(np.mean([runs[s][x] for s in seeds])) for x in xs}
        csv_name = FGD_CSV_NAMES.get(p)
        if csv_name:
            r["worst_gap"] = max(abs(runs[s][x] - expected[(csv_name, s)][x]) for s in seeds for x in runs[s]
                                 if x in expected[(csv_name, s)])
            r["ref_mean"] = {x: float(np.mean([expected[(csv_name, s)][x] for s in seeds])) for x in xs}
        out[p] = r
    return out


def print_calibration(g_rows: list[dict[str, Any]], f: dict[str, Any] | None, seeds: list[int]) -> dict[str, float]:
    figures: dict[str, float] = {}
    print("\nGavel protocol (Gavel's own simulator's rules; 36 V100 + 36 P100 + 36 K80, rounds of 360 s), "
          "calibration traces, jobs 500-999; hours. 'bound' = every job alone on its fastest type.")
    print("| seed | trace | policy | avg JCT (ours) | avg JCT (Gavel) | ours/Gavel | p95 JCT | makespan |")
    print("|---|---|---|---|---|---|---|---|")
    worst = 0.0
    for r in (r for r in g_rows if r["source"] == "hetflow"):
        ratio = None if r["ref_avg_jct_s"] is None else r["avg_jct_s"] / r["ref_avg_jct_s"]
        if ratio is not None:
            worst = max(worst, abs(ratio - 1))
        print(f"| {r['seed']} | {r['trace']} | {r['policy']} | {r['avg_jct_s'] / 3600:.3f} | "
              + ("-" if ratio is None else f"{r['ref_avg_jct_s'] / 3600:.3f}") + " | "
              + ("-" if ratio is None else f"{ratio:.4f}") + f" | {r['p95_jct_s'] / 3600:.1f} | {r['makespan_s'] / 3600:.1f} |")
    figures["gavel_fidelity_worst"] = worst
    lead = []
    print("\nhetflow against the best reference policy by Gavel's own results (results.json, per-job CSVs); "
          "p95 against that policy's, makespan against the smallest reference makespan.")
    print("| seed | trace | best Gavel policy | hetflow / best avg JCT | p95 ratio | makespan ratio | bound / best "
          "| gap closed |")
    print("|---|---|---|---|---|---|---|---|")
    closed = []
    for key in sorted({(r["seed"], r["trace"]) for r in g_rows}):
        rows = [r for r in g_rows if (r["seed"], r["trace"]) == key]
        ref_rows = [r for r in rows if r["source"] == "gavel"]  # Gavel's own simulator's figures
        ours = [r for r in rows if r["policy"] == "hetflow" and r["source"] == "hetflow"]
        if not ref_rows or not ours:
            continue
        best = min(ref_rows, key=lambda r: r["avg_jct_s"])
        h = ours[0]
        ratio = h["avg_jct_s"] / best["avg_jct_s"]
        lead.append(ratio)
        # the share of the gap between Gavel's best policy and the no-queueing bound that hetflow closes
        gap = (best["avg_jct_s"] - h["avg_jct_s"]) / (best["avg_jct_s"] - h["bound_s"])
        closed.append(gap)
        print(f"| {key[0]} | {key[1]} | {best['policy']} | {ratio:.3f} | {h['p95_jct_s'] / best['p95_jct_s']:.3f} | "
              f"{h['makespan_s'] / min(r['makespan_s'] for r in ref_rows):.3f} | {h['bound_s'] / best['avg_jct_s']:.3f} "
              f"| {gap:.3f} |")
    figures["hetflow_over_gavel_best"] = max(lead) if lead else float("nan")
    figures["gavel_gap_closed_worst"] = min(closed) if closed else float("nan")
    if f is not None:
        print(f"\nFGD protocol (the artifact's rules; openb_pod_list_default, 1,213 nodes, 6,212 GPUs, tune 1.3), "
              f"GPU allocation % at arrived x %, mean of seeds {seeds[0]}-{seeds[-1]}; (published) in brackets.")
        print("| policy | " + " | ".join(str(x) for x in FGD_POINTS) + " | worst gap (points) | wall s/seed |")
        print("|---|" + "---|" * (len(FGD_POINTS) + 2))
        for p, r in f.items():
            cells = [f"{r['mean'][x]:.2f}" + (f" ({r['ref_mean'][x]:.2f})" if "ref_mean" in r else "") for x in FGD_POINTS]
            print(f"| {p} | " + " | ".join(cells) + f" | {r.get('worst_gap', float('nan')):.2f} | "
                  f"{np.mean(r['wall_s']):.1f} |")
        figures["fgd_fidelity_worst_points"] = max(r["worst_gap"] for r in f.values() if "worst_gap" in r)
        high = [x for x in f["hetflow"]["mean"] if 100 <= x <= 130]
        figures["fgd_alloc_hetflow"] = float(np.mean([f["hetflow"]["mean"][x] for x in high])) / 100
        figures["fgd_alloc_fgd"] = float(np.mean([f["FGD"]["mean"][x] for x in high])) / 100
        figures["hetflow_minus_fgd_min_points"] = min(f["hetflow"]["mean"][x] - f["FGD"]["mean"][x]
                                                      for x in f["hetflow"]["mean"] if x >= 50)
        figures["fgd_run_wall_s"] = max(f["FGD"]["wall_s"])
        figures["fgd_lead_points"] = f["hetflow"]["mean"][100] - f["FGD"]["mean"][100]  # at the 100 % point
    return figures


def _h(seconds: float | None) -> str:
    return "-" if seconds is None else f"{seconds / 3600:.1f}"


def _f(x: float | None, digits: int = 3) -> str:
    return "-" if x is None else f"{x:.{digits}f}"


def print_table(sections: list[tuple[str, dict[str, dict[str, Any]]]]) -> None:
    header = ("experiment", "policy", "avg JCT h", "p95 JCT h", "vs hetflow", "util", "eff util",
              "best-type util", "unalloc", "preempt", "wall s")
    rows = []
    for name, results in sections:
        ours = results["hetflow"]["avg_jct_s"]
        for policy, s in results.items():
            ratio = "-" if s["avg_jct_s"] is None or not ours else f"{s['avg_jct_s'] / ours:.2f}x"
            rows.append((name, policy, _h(s["avg_jct_s"]), _h(s["p95_jct_s"]), ratio, _f(s["utilisation"]),
                         _f(s["effective_utilisation"]), _f(s["best_type_utilisation"]),
                         _f(s["unallocated_gpu_share"]), str(s["preemptions"]), f"{s['wall_s']:.1f}"))
    widths = [max(len(str(r[i])) for r in rows + [header]) for i in range(len(header))]
    line = lambda r: "| " + " | ".join(str(c).ljust(w) for c, w in zip(r, widths)) + " |"  # noqa: E731
    print(line(header))
    print("|" + "|".join("-" * (w + 2) for w in widths) + "|")
    for r in rows:
        print(line(r))


def sia_workload(path: str, profiles: str, policy: str, kind: str) -> tuple[str, str, str, float | None]:
    """A policy's average JCT on one of Sia's workloads with every job ``kind`` (a worker
    process): ``hetflow`` (the live policy, 60 s rounds) or one of Sia's simulator's own
    policies re-stated (hetflow/sim/sia_reference.py, at their runs' rounds)."""
    from hetflow.sim.live_sia import simulate_sia
    from hetflow.sim.sia import SiaProfiles, SiaSimulator, load_workload
    from hetflow.sim.sia_reference import REFERENCE_POLICIES

    specs, profs = load_workload(Path(path)), SiaProfiles(Path(profiles))
    with one_blas_thread():
        if policy == "hetflow":
            run = simulate_sia(specs, profs, "hetflow", default_kind=kind)
        else:
            ref = REFERENCE_POLICIES[policy]()
            run = SiaSimulator(specs, profs, ref, round_s=ref.round_s, default_kind=kind).run()
    return path, policy, kind, run.summary()["avg_jct_s"]


def one_blas_thread():
    """OpenBLAS's own threads limited to one in this worker process (threadpoolctl, where
    installed): the workers are one a core already, and on Sia's runs - small matrices, many
    solves - the extra threads only spun: a re-stated Sia run (philly 3) took 52 CPU-s with
    them, 19.5 within this limit, the same result."""
    try:
        from threadpoolctl import threadpool_limits
    except ImportError:  # comes with scikit-learn (make's .[dev])
        return contextlib.nullcontext()
    return threadpool_limits(limits=1, user_api="blas")


def sia_part(root: Path, workers: int) -> str:
    """Part S (module docstring): the RESULT fragment, after a per-workload table."""
    from hetflow.cli.simulate_protocols import load_sia_reference, sia_reference_of

    reference = load_sia_reference()["results"]
    todo = []  # (workload file, (trace, workload), the reference policies run on it)
    for trace in ("philly", "saturn"):
        for f in sorted((root / "workloads" / trace).glob("workload-*.csv")):
            ref = sia_reference_of(f)
            got = reference.get(ref[0], {}).get(ref[1], {}) if ref else {}
            if got:
                todo.append((f, ref, got))
    if not any("sia" in got for _, _, got in todo):
        raise SystemExit(f"--sia {root}: no workload of Sia's with a reference run there "
                         "(hetflow traces fetch sia --dest DIR, then --sia DIR)")
    # each reference ran its jobs one way: Sia adaptive; Sia rigid and Gavel rigid. hetflow runs
    # them the same way; Sia's and Gavel's policies re-stated run where their reference ran
    pairs = {"sia": ("sia", "adaptive"), "sia_rigid": ("sia", "rigid"), "gavel": ("gavel", "rigid")}
    runs = sorted({(str(f), "hetflow", kind) for f, _, got in todo for k, (_, kind) in pairs.items() if k in got}
                  | {(str(f), policy, kind) for f, _, got in todo for k, (policy, kind) in pairs.items() if k in got},
                  key=lambda r: (r[1] == "gavel", r))  # the long ones first
    from hetflow.sim.sia_reference import cbc_available

    _progress(f"Sia's protocol: {len(todo)} workloads with references, {len(runs)} runs (hetflow; Sia's and "
              f"Gavel's policies re-stated; Sia's program solved with {'CBC' if cbc_available() else 'HiGHS: no cylp'})")
    with ProcessPoolExecutor(max_workers=workers) as pool:
        got_runs = {(p, pol, k): v for p, pol, k, v in pool.map(
            sia_workload, [r[0] for r in runs], [str(root / "profiles")] * len(runs), [r[1] for r in runs],
            [r[2] for r in runs])}
    ratios: dict[str, list[float]] = {k: [] for k in pairs}
    fidelity: list[float] = []
    print("Sia's protocol (avg JCT, h): hetflow | Sia's simulator (reference) | its policy re-stated here")
    for f, (trace, workload), ref in todo:
        cells = []
        for k, (policy, kind) in pairs.items():
            if k not in ref:
                continue
            mine, again = got_runs.get((str(f), "hetflow", kind)), got_runs.get((str(f), policy, kind))
            want = ref[k]["avg_jct_s"]
            cells.append(f"{k}: hetflow {mine / 3600:.3f} | {want / 3600:.3f} | {again / 3600:.3f}")
            ratios[k].append(mine / want)
            fidelity.append(abs(again / want - 1))
        print(f"  {trace:7s} {workload:12s} " + "   ".join(cells))
    mean = {k: sum(v) / len(v) for k, v in ratios.items() if v}
    return (f"sia_fidelity_worst={max(fidelity):.4f} "
            f"hetflow_over_sia={mean['sia']:.3f} hetflow_over_sia_rigid={mean.get('sia_rigid', float('nan')):.3f} "
            f"hetflow_over_sia_gavel={mean.get('gavel', float('nan')):.3f} sia_workloads={len(ratios['sia'])}")


def quick_cases() -> list[int]:
    """``--quick``'s Gavel calibration traces: one of each kind (single-, multi-GPU), each of
    another seed."""
    picked: list[int] = []
    seeds: set[int] = set()
    kinds: set[str] = set()
    for i, c in enumerate(gavel_cases(TRACES / "gavel-calibration")):
        if c.seed not in seeds and c.trace not in kinds:
            picked.append(i)
            seeds.add(c.seed)
            kinds.add(c.trace)
    return picked


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="a smoke run under 3 minutes: smaller traces, 2 of the 4 Gavel calibration traces, "
                        "no FTF, one FGD seed")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--gavel-rate", type=float, default=2.6, help="jobs per hour (multi-GPU mix)")
    parser.add_argument("--mixed-rate", type=float, default=150.0, help="jobs per hour on 1,024 GPUs")
    parser.add_argument("--fgd-seeds", default="42-51", help="FGD protocol seeds (the published 42-51)")
    parser.add_argument("--gavel-policies", default=",".join(GAVEL_REFERENCE + ("hetflow",)),
                        help="policies rerun in Gavel's protocol (hetflow's lead is taken against Gavel's own results)")
    parser.add_argument("--workers", type=int, default=3, help="worker processes for independent runs")
    parser.add_argument("--calibration-only", action="store_true",
                        help="only the runs against Gavel's and FGD's own results (no hetflow-protocol experiments)")
    parser.add_argument("--elastic-only", action="store_true",
                        help="only the elastic-against-rigid runs on gavel-108 and mixed-1024 (a few minutes)")
    parser.add_argument("--elastic-fraction", type=float, default=ELASTIC_FRACTION,
                        help="share of jobs made elastic (seeded)")
    parser.add_argument("--elastic-scaling", default=DEFAULT_SCALING, help="their scaling curve")
    parser.add_argument("--eager-growth", action="store_true",
                        help="hetflow's eager_growth for the elastic runs (ask for more than the size under load)")
    parser.add_argument("--sia", metavar="DIR", help="a `hetflow traces fetch sia` folder: adds Sia's protocol")
    parser.add_argument("--sia-only", action="store_true", help="only Sia's protocol (needs --sia)")
    args = parser.parse_args()
    from hetflow.cli.simulate_protocols import parse_seeds

    if args.sia_only and not args.sia:
        parser.error("--sia-only needs --sia DIR (a `hetflow traces fetch sia --dest DIR` folder)")
    sia_line = sia_part(Path(args.sia), args.workers) if args.sia else ""
    if args.sia_only:
        print(f"RESULT {sia_line}")
        return

    fgd_seeds = parse_seeds(args.fgd_seeds, 42)
    if args.quick:
        fgd_seeds = fgd_seeds[:1]
    gavel_policies = tuple(p for p in args.gavel_policies.split(",") if p)
    if args.quick:  # FTF's program is Gavel's slowest (~10 s a trace; ~2 min before e627083)
        gavel_policies = tuple(p for p in gavel_policies if p != "finish_time_fairness_perf")
    # Independent runs go to worker processes (the machine has 2 cores); the longest first.
    cases = list(range(len(gavel_cases(TRACES / "gavel-calibration"))))
    if args.quick:
        cases = quick_cases()
    legacy = not args.calibration_only
    if args.quick:
        g_jobs, g_window, m_jobs, limit = 1200, (600, 900), 2000, 2000
    else:
        g_jobs, g_window, m_jobs, limit = 6000, (4000, 5000), 10000, None
    elastic_runs = (("gavel-108", g_jobs, g_window, args.gavel_rate), ("mixed-1024", m_jobs, None, args.mixed_rate))
    if args.elastic_only:
        with ProcessPoolExecutor(max_workers=min(args.workers, 2)) as pool:
            futs = {w: pool.submit(elastic_pair, w, n, win, rate, args.seed, args.elastic_fraction,
                                   args.elastic_scaling, args.eager_growth) for w, n, win, rate in elastic_runs}
            pairs = {w: fut.result() for w, fut in futs.items()}
        worst = print_elastic(pairs, args.elastic_fraction, args.elastic_scaling, args.eager_growth)
        ratios = {w: p["elastic"]["avg_jct_s"] / p["rigid"]["avg_jct_s"] for w, p in pairs.items()}
        print(f"RESULT elastic_over_rigid={worst:.3f} elastic_over_rigid_gavel_108={ratios['gavel-108']:.3f} "
              f"elastic_over_rigid_mixed_1024={ratios['mixed-1024']:.3f}")
        return
    _progress(f"Calibration: Gavel's protocol on {len(cases)} of its traces, FGD's on seeds {fgd_seeds}"
              + ("; then hetflow's own experiments" if legacy else "") + f"; {args.workers} worker processes")
    with ProcessPoolExecutor(max_workers=args.workers) as pool:
        # the longest first: openb's policies (one a process; each replays the whole 1.3x
        # demand) and the elastic pairs
        o_futs = [pool.submit(openb, 1.3, args.seed, limit, (p,)) for p in PACKING_POLICIES] if legacy else []
        e_futs = {w: pool.submit(elastic_pair, w, n, win, rate, args.seed, args.elastic_fraction,
                                 args.elastic_scaling, args.eager_growth) for w, n, win, rate in elastic_runs}
        g_futs = [pool.submit(gavel_case, i, gavel_policies) for i in cases]
        f_futs = {s: pool.submit(fgd_seed, s) for s in fgd_seeds}
        if legacy:  # a process a policy: the pool balances them
            g_legacy = [pool.submit(gavel, g_jobs, g_window, args.gavel_rate, args.seed, (p,)) for p in JCT_POLICIES]
            m_legacy = [pool.submit(mixed, m_jobs, args.mixed_rate, args.seed, (p,)) for p in JCT_POLICIES]
        g_rows = [r for fut in g_futs for r in fut.result()]
        f = fgd_summary({s: fut.result() for s, fut in f_futs.items()})
        cal = print_calibration(g_rows, f, fgd_seeds)
        elastic_worst = print_elastic({w: fut.result() for w, fut in e_futs.items()}, args.elastic_fraction,
                                      args.elastic_scaling, args.eager_growth)
        cal_line = (f"gavel_fidelity_worst={cal['gavel_fidelity_worst']:.4f} "
                    f"fgd_fidelity_worst_points={cal['fgd_fidelity_worst_points']:.2f} "
                    f"hetflow_over_gavel_best={cal['hetflow_over_gavel_best']:.3f} "
                    f"fgd_alloc_hetflow={cal['fgd_alloc_hetflow']:.4f} elastic_over_rigid={elastic_worst:.3f} "
                    f"fgd_run_wall_s={cal['fgd_run_wall_s']:.1f} "
                    f"gavel_gap_closed_worst={cal['gavel_gap_closed_worst']:.3f} "
                    f"fgd_lead_points={cal['fgd_lead_points']:.2f} one_policy={one_policy()}"
                    + (f" {sia_line}" if sia_line else ""))
        print(f"(FGD's own mean allocation over 100-130 %: {cal['fgd_alloc_fgd']:.4f}; hetflow - FGD at the worst "
              f"point from 50 %: {cal['hetflow_minus_fgd_min_points']:+.2f} points)", flush=True)
        if legacy:
            g, m, o = ({p: r for fut in futs for p, r in fut.result().items()} for futs in (g_legacy, m_legacy, o_futs))
    if args.calibration_only:
        print(f"RESULT {cal_line}")
        return

    print(f"Gavel setting ({GAVEL_CLUSTER}; {g_jobs} jobs at {args.gavel_rate}/h, jobs {g_window[0]}-"
          f"{g_window[1] - 1} measured); 1,024 GPUs ({MIXED_CLUSTER}; {m_jobs} jobs at {args.mixed_rate}/h); "
          f"openb (1,213 nodes, 6,212 GPUs, pods until 1.3x capacity). Utilisation while demand exceeds capacity.")
    print_table([("gavel-108", g), ("mixed-1024", m), ("openb", o)])
    hetflow = m["hetflow"]
    print(f"RESULT hetflow_over_max_min={g['hetflow']['avg_jct_s'] / g['max_min_fairness']['avg_jct_s']:.3f} "
          f"hetflow_over_fifo={g['hetflow']['avg_jct_s'] / g['fifo']['avg_jct_s']:.3f} "
          f"sim_1024_wall_s={hetflow['wall_s']:.1f} "
          f"effective_utilisation={hetflow['effective_utilisation']:.3f} "
          f"openb_unallocated_hetflow={o['hetflow']['unallocated_gpu_share']:.3f} "
          f"openb_unallocated_bestfit={o['bestfit']['unallocated_gpu_share']:.3f} {cal_line}")


if __name__ == "__main__":
    main()
