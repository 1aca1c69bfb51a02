"""Scheduling benchmark: every cluster policy on the same traces, in one process.

    .venv/bin/python benchmarks/scheduling.py            # the issue's settings, ~6 minutes on 2 cores
    .venv/bin/python benchmarks/scheduling.py --quick    # smaller traces, ~2 minutes

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

Policies run on identical inputs in this process; wall times are of this machine. Seeded. The
last line is machine-readable: ``RESULT hetflow_over_max_min=<x> hetflow_over_fifo=<x>
sim_1024_wall_s=<x> effective_utilisation=<x> openb_unallocated_hetflow=<x>
openb_unallocated_bestfit=<x>`` (wall and utilisation: the hetflow run).
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import Any

from hetflow.scheduling.policies.capacity import ClusterModel
from hetflow.scheduling.policies.registry import make_policy
from hetflow.scheduling.throughput import default_model, load_gavel_throughputs
from hetflow.sim.cluster import parse_shorthand
from hetflow.sim.engine import SimConfig, Simulator
from hetflow.sim.metrics import summarise
from hetflow.sim.traces import load_openb_nodes, load_openb_pods, openb_packing_jobs, synthetic_trace

TRACES = Path(__file__).resolve().parents[1].parent / "shared" / "traces"
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


def gavel(jobs: int, window: tuple[int, int], rate: float, seed: int) -> dict[str, dict[str, Any]]:
    speeds = load_gavel_throughputs(TRACES / "gavel" / "simulation_throughputs.json")
    model = ClusterModel.from_snapshot(parse_shorthand(GAVEL_CLUSTER))
    trace = synthetic_trace(speeds, jobs, rate, seed=seed, reference_types=("V100-16GB",))
    out = {}
    for p in JCT_POLICIES:
        out[p] = _run(model, trace.jobs, p, speeds, SimConfig(window=window))
        _progress(f"  gavel {p}: {out[p]['wall_s']:.0f} s")
    return out


def mixed(jobs: int, rate: float, seed: int) -> dict[str, dict[str, Any]]:
    speeds = default_model()
    model = ClusterModel.from_snapshot(parse_shorthand(MIXED_CLUSTER))
    assert model.total_devices == 1024
    trace = synthetic_trace(speeds, jobs, rate, seed=seed, reference_types=("A100-80GB",))
    out = {}
    for p in JCT_POLICIES:
        out[p] = _run(model, trace.jobs, p, speeds, SimConfig())
        _progress(f"  1024 {p}: {out[p]['wall_s']:.0f} s")
    return out


def openb(overload: float, seed: int, pods_limit: int | None) -> dict[str, dict[str, Any]]:
    base = TRACES / "alibaba-gpu-2023"
    model = ClusterModel.from_snapshot(load_openb_nodes(base / "openb_node_list_gpu_node.csv"))
    pods = load_openb_pods(base / "openb_pod_list_default.csv").jobs[:pods_limit]
    jobs = openb_packing_jobs(pods, model.total_devices, overload, seed=seed)
    out = {}
    for p in PACKING_POLICIES:
        out[p] = _run(model, jobs, p, default_model(), SimConfig())
        _progress(f"  openb {p}: {out[p]['wall_s']:.0f} s")
    return out


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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="smaller traces (about 2 minutes)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--gavel-rate", type=float, default=2.6, help="jobs per hour (multi-GPU mix)")
    parser.add_argument("--mixed-rate", type=float, default=150.0, help="jobs per hour on 1,024 GPUs")
    args = parser.parse_args()
    if args.quick:
        g_jobs, g_window, m_jobs, limit = 2000, (1000, 1500), 3000, 3000
    else:
        g_jobs, g_window, m_jobs, limit = 6000, (4000, 5000), 10000, None

    _progress(f"Gavel setting: 108 GPUs, {g_jobs} jobs at {args.gavel_rate}/h, window {g_window[0]}:{g_window[1]}")
    g = gavel(g_jobs, g_window, args.gavel_rate, args.seed)
    _progress(f"1,024 GPUs: {m_jobs} jobs at {args.mixed_rate}/h")
    m = mixed(m_jobs, args.mixed_rate, args.seed)
    _progress("openb: 6,212 GPUs, requests until 1.3x capacity")
    o = openb(1.3, args.seed, limit)

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
          f"openb_unallocated_bestfit={o['bestfit']['unallocated_gpu_share']:.3f}")


if __name__ == "__main__":
    main()
