"""``hetflow simulate``: replay a job trace on a described cluster under several policies.

    hetflow simulate --cluster "9 * 4x V100 + 9 * 4x P100 + 9 * 4x K80 @ 3.125" \\
        --trace synthetic:jobs=6000,rate=6.5,seed=0,multi_gpu=0 \\
        --throughputs data/traces/gavel/simulation_throughputs.json \\
        --window 4000:5000 --policies fifo,max_min_fairness,hetflow --out runs/gavel
    hetflow traces fetch philly --dest traces/philly    # the full Philly log (the repo has 2,000 rows)
    hetflow simulate --cluster cluster.yaml --trace traces/philly/philly.csv ...
    hetflow simulate --cluster data/traces/alibaba-gpu-2023/openb_node_list_gpu_node.csv \\
        --trace data/traces/alibaba-gpu-2023/openb_pod_list_default.csv --packing 1.3 \\
        --policies bestfit,fifo,hetflow --out runs/openb

Paths are from a checkout's root: the repository carries these traces in data/traces
(data/README.md; `hetflow traces list`).

--protocol gavel|fgd|sia: the reference simulators' own rules instead of hetflow's model (Gavel's
rounds and policies; FGD's online packing and policies; Sia's cluster, job model and 60 s rounds,
with --trace a Sia workload CSV or a folder of them and --throughputs Sia's profiles folder;
see hetflow.cli.simulate_protocols).

--cluster: a cluster YAML, a snapshot JSON, an openb node list, or shorthand
"COUNT * NODE + ..." with an optional "@ GBPS" network speed. --trace: a Gavel .trace
(7 or 10 columns), a Philly CSV, an openb pod CSV, or synthetic:jobs=N,rate=R,seed=S,multi_gpu=0|1
(format detected; a .gz or .xz file is read decompressed). --window A:B measures the jobs with arrival index A..B-1 (Gavel's
steady-state window). Elastic jobs: a trace's min_gpus/max_gpus/scaling fields, or
--elastic-fraction F (a seeded share of the jobs, --elastic-scaling their curve). Writes DIR/summary.json (per policy: avg_jct_s, p95_jct_s, makespan_s,
utilisation, effective_utilisation, unallocated_gpu_share, wall_s and more), per-job
DIR/jobs-<policy>.json and .csv, DIR/utilisation.json, and the plots DIR/jct_cdf.png and
DIR/utilisation.png. The model and every metric are described in docs/simulator.md.
"""

from __future__ import annotations

import argparse
import csv
import json
import time
from pathlib import Path
from typing import Any, Sequence

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from hetflow.core.errors import InputError
from hetflow.sim.window import parse_window

SUMMARY_SCHEMA = "hetflow.simulation/v1"
DEFAULT_POLICIES = "fifo,max_min_fairness,hetflow"
# Device types whose speed the trace's durations are taken to be measured on (Gavel used V100s);
# the first one where a job runs is used.
DEFAULT_REFERENCE = ("V100-16GB", "A100-80GB")


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "simulate",
        help="replay a job trace on a described cluster under several scheduling policies",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--cluster", metavar="C", help="cluster YAML/JSON, openb node CSV or shorthand "
                   "(--protocol gavel: TYPE:COUNT,... default v100:36,p100:36,k80:36; --protocol sia: "
                   "Sia's cluster only)")
    p.add_argument("--trace", required=True, metavar="T", help="trace file or synthetic:jobs=N,rate=R,seed=S")
    p.add_argument("--throughputs", metavar="F", help="measured job-type x device-type table (Gavel JSON or CSV; "
                   "--protocol sia: the folder of Sia's profiles)")
    p.add_argument("--window", metavar="A:B", help="measure jobs by arrival index A..B-1 (e.g. 4000:5000)")
    p.add_argument("--policies", metavar="P,P", help=f"default {DEFAULT_POLICIES} ({GAVEL_DEFAULT} with "
                   f"--protocol gavel, {FGD_DEFAULT} with --protocol fgd, {SIA_DEFAULT} with --protocol sia)")
    p.add_argument("--protocol", choices=("hetflow", "gavel", "fgd", "sia"), default="hetflow",
                   help="simulation rules: hetflow's own (default), Gavel's rounds, FGD's packing, or Sia's "
                        "rounds and job model (docs/simulator.md)")
    p.add_argument("--seeds", metavar="S,S", help="--protocol fgd: seeds to run (e.g. 42,43 or 42-51; default --seed)")
    p.add_argument("--arrival-order", metavar="F", help="--protocol fgd: replay the artifact's pod sequence per seed "
                   "(arrival_order_seed42-51.csv)")
    p.add_argument("--node-ranks", metavar="F", help="--protocol fgd: the artifact's tie-break node ranks per seed")
    p.add_argument("--job-kind", choices=("adaptive", "rigid", "scale-gpus"), default=None,
                   help="--protocol sia: how jobs without a category column run - adaptive (GPU count from the "
                        "policy, batch size from the job's goodput model: Sia's simulator under its own policy; "
                        "the default), rigid (their num_replicas and batch_size, as under Gavel's), scale-gpus "
                        "(their batch_size, any GPU count)")
    p.add_argument("--out", required=True, metavar="DIR", help="directory for summary.json, per-job files, plots")
    p.add_argument("--round-s", type=float, default=None,
                   help="lease length of preemptive policies (s; default 360, --protocol sia 60)")
    p.add_argument("--restore-s", type=float, default=30.0, help="default checkpoint-restore cost (s)")
    p.add_argument("--reference-type", action="append", metavar="TYPE",
                   help="device type trace durations were measured on (repeatable; default V100-16GB, A100-80GB)")
    p.add_argument("--packing", type=float, metavar="X",
                   help="fragmentation experiment: requests never leave, arrive until they ask X x the GPUs")
    p.add_argument("--rank-planner", action="store_true",
                   help="the placement planner decides each started job's devices and ranks inside the "
                        "policy's choice (as in the live controller; slower)")
    p.add_argument("--elastic-fraction", type=float, default=0.0, metavar="F",
                   help="make a seeded share F of the jobs that declare no device range elastic: min ceil(n/2), "
                        "max min(2n, the largest node) (docs/simulator.md, 'Elastic jobs')")
    p.add_argument("--elastic-scaling", default=None, metavar="CURVE",
                   help="their scaling curve: eff:E (per-doubling efficiency, default eff:0.85), table, or "
                        "N:X,N:X points")
    p.add_argument("--seed", type=int, default=None, help="seed: job types drawn for duration-only traces (0); "
                   "Gavel's scheduler seed (0); FGD's pod shuffle and ranks (42)")
    p.set_defaults(func=run)


GAVEL_DEFAULT = "fifo,fifo_perf,max_min_fairness,max_min_fairness_perf,finish_time_fairness_perf,hetflow"
FGD_DEFAULT = "BestFit,DotProd,GpuPacking,FGD,hetflow"
SIA_DEFAULT = "hetflow"


def run(args: argparse.Namespace) -> int:
    if args.protocol != "hetflow" and (args.elastic_fraction or args.elastic_scaling):
        raise InputError(f"--elastic-fraction/--elastic-scaling apply to hetflow's own model; --protocol "
                         f"{args.protocol} replays the reference simulator's rigid jobs (drop them, or the --protocol)")
    if args.protocol != "sia" and args.job_kind:
        raise InputError(f"--job-kind applies to --protocol sia (Sia's job categories); drop it for --protocol "
                         f"{args.protocol}")
    if args.protocol != "hetflow":
        from hetflow.cli.simulate_protocols import PROTOCOLS

        return PROTOCOLS[args.protocol](args)
    if args.round_s is None:
        args.round_s = 360.0
    if args.cluster is None:
        raise InputError("--cluster is required: a cluster YAML/JSON, an openb node list or shorthand "
                         "such as '32 * 8x H100'")
    if args.seed is None:
        args.seed = 0
    if args.policies is None:
        args.policies = DEFAULT_POLICIES
    from hetflow.scheduling.policies.registry import parse_policy_list
    from hetflow.scheduling.throughput import default_model, load_throughputs
    from hetflow.scheduling.policies.capacity import ClusterModel
    from hetflow.sim.cluster import load_sim_snapshot
    from hetflow.sim.engine import SimConfig
    from hetflow.sim.traces import load_trace, openb_packing_jobs

    policies = parse_policy_list(args.policies)
    window = parse_window(args.window)
    out = Path(args.out)
    if out.exists() and not out.is_dir():
        raise InputError(f"--out {out}: exists and is not a directory")
    if args.packing is not None and not args.packing > 0:
        raise InputError("--packing X needs X > 0 (e.g. 1.3: arrivals ask 130% of the GPUs)")
    snapshot = load_sim_snapshot(args.cluster)
    model = ClusterModel.from_snapshot(snapshot)
    measured = load_throughputs(args.throughputs) if args.throughputs else None
    throughputs = default_model(measured)
    reference = tuple(args.reference_type or DEFAULT_REFERENCE) + tuple(model.device_types)
    trace = load_trace(args.trace, throughputs, reference, seed=args.seed)
    jobs: Sequence[Any] = trace.jobs
    if args.packing is not None:
        jobs = openb_packing_jobs(trace.jobs, model.total_devices, args.packing, seed=args.seed)
    if args.elastic_fraction or args.elastic_scaling:
        from hetflow.scheduling.elastic import DEFAULT_SCALING, mark_elastic

        jobs = mark_elastic(jobs, args.elastic_fraction, args.seed, model.max_devices,
                            args.elastic_scaling or DEFAULT_SCALING)
    config = SimConfig(round_s=args.round_s, restore_s=args.restore_s, window=window)
    console = Console(stderr=True)
    check_runnable(model, jobs, throughputs, config, console)
    out.mkdir(parents=True, exist_ok=True)
    results = simulate_all(model, jobs, policies, throughputs, config, console,
                           snapshot if args.rank_planner else None)
    write_outputs(out, results, {
        "cluster": args.cluster, "trace": trace.source, "trace_format": trace.format,
        "jobs": len(jobs), "window": list(window) if window else None,
        "throughputs": args.throughputs, "devices": model.total_devices,
        "device_types": {t: model.capacity_by_type[t] for t in model.device_types},
        "round_s": config.round_s, "restore_s": config.restore_s, "packing": args.packing,
        "elastic_jobs": sum(1 for j in jobs if len(j.sizes) > 1), "elastic_fraction": args.elastic_fraction,
        "rank_planner": args.rank_planner,
    })
    print_summary(Console(width=max(110, Console().width)), {p: r["summary"] for p, r in results.items()})
    Console(stderr=True).print(f"wrote {out}/summary.json, inputs.json, jobs-*.json/.csv, jct_cdf.png, utilisation.png")
    return 0


def check_runnable(model: Any, jobs: Sequence[Any], throughputs: Any, config: Any, console: Console) -> None:
    """Jobs no device type of the cluster can run are rejected by the simulation; when that is
    every job, the inputs do not match: say so instead of printing an empty table."""
    from hetflow.scheduling.policies.registry import make_policy
    from hetflow.sim.engine import Simulator

    probe = Simulator(model, jobs, make_policy("fifo"), throughputs, config)
    stuck = [j for j in jobs if not probe.ideal_rates(j)]
    if not stuck:
        return
    kinds = sorted({f"{j.job_type} x{j.num_gpus}" for j in stuck})
    example = ", ".join(kinds[:3]) + (f" and {len(kinds) - 3} more" if len(kinds) > 3 else "")
    types = ", ".join(model.device_types)
    if len(stuck) == len(jobs):
        raise InputError(f"no job of the trace can run on this cluster's device types ({types}): no speed for "
                         f"{example}; give --throughputs with rows for these types, or a cluster they cover")
    console.print(f"[yellow]warning:[/] {len(stuck)} of {len(jobs)} jobs cannot run on {types} "
                  f"({example}); they are counted as rejected")


def simulate_all(model: Any, jobs: Sequence[Any], policies: Sequence[str], throughputs: Any, config: Any,
                 console: Console | None = None, snapshot: Any = None) -> dict[str, dict[str, Any]]:
    """Run every policy on the same jobs; returns per policy its summary, job rows and series.
    ``snapshot``: let the planner decide ranks (``RankPlanner``, one per policy's run)."""
    from hetflow.scheduling.rank_planner import RankPlanner
    from hetflow.scheduling.policies.registry import make_policy
    from hetflow.sim.engine import Simulator
    from hetflow.sim.metrics import job_rows, summarise, utilisation_series

    results: dict[str, dict[str, Any]] = {}
    columns = (TextColumn("{task.description:>18}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn())
    with Progress(*columns, console=console, transient=False, disable=console is None) as progress:
        for name in policies:
            task = progress.add_task(name, total=None)

            def tick(done: int, total: int, task: Any = task) -> None:
                progress.update(task, completed=done, total=total)

            ranks = RankPlanner(snapshot, model) if snapshot is not None else None
            start = time.perf_counter()
            result = Simulator(model, jobs, make_policy(name), throughputs, config, progress=tick,
                               ranks=ranks).run()
            wall = time.perf_counter() - start
            summary = summarise(result, wall)
            if ranks is not None:
                summary["rank_planner"] = {"planned": ranks.calls, "changed": ranks.changed,
                                           "moved": ranks.moved, "refused": ranks.refused}
            results[name] = {
                "summary": summary,
                "rows": job_rows(result),
                "series": utilisation_series(result),
            }
    return results


def write_outputs(out: Path, results: dict[str, dict[str, Any]], inputs: dict[str, Any]) -> None:
    from hetflow.sim.plots import plot_jct_cdf, plot_utilisation

    # summary.json is keyed by policy name at the top level (the shape the issue fixes);
    # what was simulated, with the schema version, goes beside it in inputs.json.
    summary = {p: r["summary"] for p, r in results.items()}
    (out / "summary.json").write_text(json.dumps(summary, indent=2, allow_nan=False) + "\n")
    (out / "inputs.json").write_text(
        json.dumps({"schema": SUMMARY_SCHEMA, **inputs}, indent=2, allow_nan=False) + "\n")
    for policy, r in results.items():
        rows = r["rows"]
        (out / f"jobs-{policy}.json").write_text(json.dumps(rows, allow_nan=False) + "\n")
        with (out / f"jobs-{policy}.csv").open("w", newline="") as f:
            writer = csv.DictWriter(f, fieldnames=list(rows[0]) if rows else ["job_id"])
            writer.writeheader()
            writer.writerows(rows)
    (out / "utilisation.json").write_text(json.dumps({p: r["series"] for p, r in results.items()}) + "\n")
    plot_jct_cdf({p: r["rows"] for p, r in results.items()}, out / "jct_cdf.png")
    plot_utilisation({p: r["series"] for p, r in results.items()}, out / "utilisation.png")


def _fmt(value: Any, scale: float = 1.0, digits: int = 2) -> str:
    return "-" if value is None else f"{value / scale:.{digits}f}"


def print_summary(console: Console, summaries: dict[str, dict[str, Any]]) -> None:
    table = Table(title="simulation summary (JCT in hours)")
    for col in ("policy", "avg JCT", "p95 JCT", "makespan", "util", "eff. util", "unalloc.", "unfinished", "wall s"):
        table.add_column(col, justify="right" if col != "policy" else "left")
    for policy, s in summaries.items():
        table.add_row(policy, _fmt(s["avg_jct_s"], 3600), _fmt(s["p95_jct_s"], 3600), _fmt(s["makespan_s"], 3600),
                      _fmt(s["utilisation"], digits=3), _fmt(s["effective_utilisation"], digits=3),
                      _fmt(s["unallocated_gpu_share"], digits=3), str(s["unfinished"]), _fmt(s["wall_s"], digits=1))
    console.print(table)
