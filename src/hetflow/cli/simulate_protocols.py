"""``hetflow simulate --protocol gavel|fgd|sia``: the reference simulators' own rules.

    hetflow simulate --protocol gavel --trace seed3/trace_single_r4.0_n1500_seed3.trace \\
        --throughputs seed3/throughputs_isolated.csv --seed 3 --window 500:1000 --out runs/g3
    hetflow simulate --protocol fgd --cluster openb_node_list_gpu_node.csv \\
        --trace openb_pod_list_default.csv --seeds 42-51 --arrival-order arrival_order_seed42-51.csv \\
        --node-ranks node_tiebreak_rank_seed42-51.csv --out runs/fgd
    hetflow traces fetch sia --dest sia
    hetflow simulate --protocol sia --trace sia/workloads/philly --out runs/sia-philly

Gavel: DIR/summary.json ``{policy: {avg_jct_s, p95_jct_s, makespan_s, ...}}`` (over --window's
jobs; ``all_jobs`` over every job) and DIR/jobs-<policy>.csv in Gavel's per-job layout
(job_id, arrival_s, jct_s, completion_s). FGD: DIR/summary.json ``{policy: {seeds, alloc_pct:
{x: mean over seeds}, frag_pct, failed, wall_s}}`` and DIR/alloc.csv / frag.csv in the
artifact's layout (workload, sc_policy, tune, seed, 0..130). Sia: DIR/summary.json ``{policy:
{avg_jct_s (mean over the workloads), workloads: {name: {avg_jct_s, p95_jct_s, makespan_s, restarts,
..., reference: Sia's own simulator's avg JCT per policy when the workload is one of Sia's}}}}`` and
DIR/jobs.csv (policy, workload, job, arrival_s, jct_s, restarts). Rules: docs/simulator.md.
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
from pathlib import Path
from typing import Any, Callable

import numpy as np
from rich.console import Console
from rich.table import Table

from hetflow.core.errors import InputError


def _out_dir(text: str) -> Path:
    out = Path(text)
    if out.exists() and not out.is_dir():
        raise InputError(f"--out {out}: exists and is not a directory")
    out.mkdir(parents=True, exist_ok=True)
    return out


def _write_atomic(path: Path, text: str) -> None:
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    with os.fdopen(fd, "w") as f:
        f.write(text)
    os.replace(tmp, path)


def _policies(text: str | None, default: str, known: tuple[str, ...], aliases: dict[str, str] | None = None) -> list[str]:
    names = [n.strip() for n in (text or default).split(",") if n.strip()]
    if not names:
        raise InputError(f"--policies is empty; give names such as {default}")
    lower = {k.lower(): k for k in known}
    out = []
    for n in names:
        name = (aliases or {}).get(n, n)
        name = lower.get(name.lower(), name)
        if name not in known:
            raise InputError(f"unknown policy {n!r} in --policies; choose from {', '.join(known)}")
        out.append(name)
    if len(set(out)) != len(out):
        raise InputError(f"--policies names a policy twice: {text!r}")
    return out


def parse_gavel_cluster(text: str | None) -> dict[str, int]:
    """``"v100:36,p100:36,k80:36"`` -> worker counts (one GPU per server, as Gavel's runs)."""
    from hetflow.sim.gavel import DEFAULT_CLUSTER

    if text is None:
        return dict(DEFAULT_CLUSTER)
    out = {}
    for part in text.split(","):
        name, colon, count = part.strip().partition(":")
        if not colon or not count.strip().isdigit() or int(count) <= 0:
            raise InputError(f"--cluster {text!r}: with --protocol gavel write TYPE:COUNT,..., e.g. v100:36,p100:36,k80:36")
        out[name.strip().lower()] = int(count)
    return out


def run_gavel(args: argparse.Namespace) -> int:
    from hetflow.sim.window import parse_window
    from hetflow.sim.gavel import GAVEL_ALIASES, GAVEL_DEFAULT_POLICIES, load_gavel_jobs, simulate_gavel

    if not args.throughputs:
        raise InputError("--protocol gavel needs --throughputs (Gavel's simulation_throughputs.json or a CSV "
                         "job_type,scale_factor,<type>_steps_per_s)")
    policies = _policies(args.policies, ",".join(GAVEL_DEFAULT_POLICIES), GAVEL_DEFAULT_POLICIES, GAVEL_ALIASES)
    window = parse_window(args.window)
    cluster = parse_gavel_cluster(args.cluster)
    jobs = load_gavel_jobs(args.trace, args.throughputs)
    seed = 0 if args.seed is None else args.seed
    out = _out_dir(args.out)
    summary: dict[str, Any] = {}
    for name in policies:
        run = simulate_gavel(jobs, name, seed=seed, cluster=cluster)
        s = run.summary(window)
        s["all_jobs"] = run.summary(None)
        summary[name] = s
        lines = ["job_id,arrival_s,jct_s,completion_s"]
        for j in run.jobs:
            c = run.completion_s.get(j.job_id)
            lines.append(f"{j.job_id},{j.arrival_s:.6f}," + ("," if c is None else f"{c - j.arrival_s:.3f},{c:.3f}"))
        _write_atomic(out / f"jobs-{name}.csv", "\n".join(lines) + "\n")
    _write_atomic(out / "summary.json", json.dumps(summary, indent=2) + "\n")
    _write_atomic(out / "inputs.json", json.dumps({
        "schema": "hetflow.simulation/v1", "protocol": "gavel", "trace": args.trace, "throughputs": args.throughputs,
        "cluster": cluster, "seed": seed, "window": list(window) if window else None, "round_s": 360,
        "jobs": len(jobs)}, indent=2) + "\n")
    table = Table(title=f"Gavel protocol ({', '.join(f'{c} {t}' for t, c in cluster.items())}; JCT in hours"
                        + (f", jobs {window[0]}-{window[1] - 1}" if window else "") + ")")
    for col in ("policy", "avg JCT", "p95 JCT", "makespan", "completed", "dropped", "rounds", "wall s"):
        table.add_column(col, justify="left" if col == "policy" else "right")
    for name, s in summary.items():
        h = (lambda v: "-" if v is None else f"{v / 3600:.3f}")  # noqa: E731
        table.add_row(name, h(s["avg_jct_s"]), h(s["p95_jct_s"]), h(s["makespan_s"]), str(s["completed"]),
                      str(s["dropped"]), str(s["rounds"]), f"{s['wall_s']:.1f}")
    Console(width=110).print(table)
    Console(stderr=True).print(f"wrote {out}/summary.json, inputs.json, jobs-*.csv")
    return 0


def parse_seeds(text: str | None, default: int) -> list[int]:
    if not text:
        return [default]
    seeds: list[int] = []
    for part in text.split(","):
        a, dash, b = part.strip().partition("-")
        try:
            seeds += list(range(int(a), int(b) + 1)) if dash else [int(a)]
        except ValueError:
            raise InputError(f"--seeds {text!r}: write numbers or ranges, e.g. 42,43 or 42-51") from None
    return seeds


def run_fgd(args: argparse.Namespace) -> int:
    from hetflow.sim.fgd import (FGD_CSV_NAMES, FGD_POLICIES, load_fgd_nodes, load_fgd_pods, make_packing_policy,
                                 read_arrival_order, read_node_ranks, simulate_fgd, typical_pods)
    from hetflow.sim.live_fgd import UNEXPRESSED

    if args.cluster is None:
        raise InputError("--protocol fgd needs --cluster: the openb node list (openb_node_list_gpu_node.csv)")
    # registry policies the protocol cannot express are named, so that they are refused with the reason
    policies = _policies(args.policies, "BestFit,DotProd,GpuPacking,FGD,hetflow", FGD_POLICIES + tuple(UNEXPRESSED))
    for name in policies:
        make_packing_policy(name)  # refuses before any run (InputError)
    ratio = 1.3 if args.packing is None else args.packing
    if not ratio > 0:
        raise InputError("--packing X needs X > 0 (e.g. 1.3: pods arrive until they ask 130% of the GPUs)")
    seeds = parse_seeds(args.seeds, 42 if args.seed is None else args.seed)
    nodes = load_fgd_nodes(args.cluster)
    pods = load_fgd_pods(args.trace)
    typical = typical_pods(pods)
    out = _out_dir(args.out)
    workload = Path(args.trace).stem
    summary: dict[str, Any] = {}
    rows_alloc, rows_frag = [], []
    for name in policies:
        runs = []
        for seed in seeds:
            order = read_arrival_order(args.arrival_order, seed, len(pods)) if args.arrival_order else None
            ranks = read_node_ranks(args.node_ranks, seed, nodes) if args.node_ranks else None
            run = simulate_fgd(nodes, pods, name, seed=seed, ratio=ratio, arrival_order=order, node_ranks=ranks,
                               typical=typical)
            runs.append(run)
            label = FGD_CSV_NAMES.get(name, name)
            rows_alloc.append((workload, label, ratio, seed, run.alloc_by_arrival))
            rows_frag.append((workload, label, ratio, seed, run.frag_by_arrival))
        xs = sorted(set.intersection(*(set(r.alloc_by_arrival) for r in runs)))
        summary[name] = {
            "seeds": seeds,
            "alloc_pct": {x: round(float(np.mean([r.alloc_by_arrival[x] for r in runs])), 2) for x in xs},
            "frag_pct": {x: round(float(np.mean([r.frag_by_arrival[x] for r in runs])), 2) for x in xs},
            "failed": [r.failed for r in runs],
            "wall_s": [round(r.wall_s, 2) for r in runs],
        }
    for fname, rows in (("alloc.csv", rows_alloc), ("frag.csv", rows_frag)):
        top = max(max(v) for *_, v in rows)
        lines = [",".join(["workload", "sc_policy", "tune", "seed"] + [str(x) for x in range(top + 1)])]
        for w, p, t, s, v in rows:
            lines.append(",".join([w, p, str(t), str(s)] + ["" if x not in v else str(v[x]) for x in range(top + 1)]))
        _write_atomic(out / fname, "\n".join(lines) + "\n")
    _write_atomic(out / "summary.json", json.dumps(summary, indent=2) + "\n")
    _write_atomic(out / "inputs.json", json.dumps({
        "schema": "hetflow.simulation/v1", "protocol": "fgd", "cluster": args.cluster, "trace": args.trace,
        "seeds": seeds, "tune": ratio, "arrival_order": args.arrival_order, "node_ranks": args.node_ranks,
        "nodes": len(nodes), "gpus": sum(n.gpus for n in nodes), "pods": len(pods), "typical_pods": len(typical)},
        indent=2) + "\n")
    points = [x for x in (80, 90, 95, 100, 110, 120, 130) if all(x in s["alloc_pct"] for s in summary.values())]
    table = Table(title=f"FGD protocol: GPU allocation % at arrived demand x % of capacity (mean of {len(seeds)} "
                        f"seed{'s' if len(seeds) > 1 else ''})")
    table.add_column("policy")
    for x in points:
        table.add_column(str(x), justify="right")
    table.add_column("wall s/seed", justify="right")
    for name, s in summary.items():
        table.add_row(name, *[f"{s['alloc_pct'][x]:.2f}" for x in points], f"{np.mean(s['wall_s']):.1f}")
    Console(width=110).print(table)
    Console(stderr=True).print(f"wrote {out}/summary.json, inputs.json, alloc.csv, frag.csv")
    return 0


def _sia_profiles_dir(args: argparse.Namespace) -> Path:
    """--throughputs, else the ``profiles`` folder of a fetched ``sia`` dataset the trace is in,
    else the default fetch destination's."""
    from hetflow.sim.tracedata import default_dest

    if args.throughputs:
        return Path(args.throughputs)
    trace = Path(args.trace)
    for parent in (*trace.absolute().parents, *trace.resolve().parents):  # as given, then links followed
        if (parent / "profiles").is_dir():
            return parent / "profiles"
    cached = default_dest("sia") / "profiles"
    if cached.is_dir():
        return cached
    raise InputError("--protocol sia needs Sia's profiles: `hetflow traces fetch sia --dest DIR`, then "
                     "--throughputs DIR/profiles (or a --trace under DIR/workloads)")


def sia_reference_of(path: Path) -> tuple[str, str] | None:
    """(trace, workload) of one of Sia's workload files, recognised by its SHA-256 in the catalogue."""
    from hetflow.sim.tracedata import load_catalogue, sha256_of
    from hetflow.sim.textio import existing

    ds = load_catalogue().get("sia")
    if ds is None:
        return None
    digest = sha256_of(existing(path)) if existing(path).is_file() else None
    for f in ds.files:
        parts = f.name.split("/")
        if f.sha256 == digest and len(parts) == 3 and parts[0] == "workloads":
            return parts[1], parts[2].rsplit(".", 1)[0]
    return None


def load_sia_reference() -> dict[str, Any]:
    """Sia's own simulator's results (hetflow/sim/data/sia_reference.yaml; how they were made: its
    ``about``)."""
    import yaml

    path = Path(__file__).resolve().parents[1] / "sim" / "data" / "sia_reference.yaml"
    return yaml.safe_load(path.read_text(encoding="utf-8"))


def run_sia(args: argparse.Namespace) -> int:
    from hetflow.scheduling.policies.registry import POLICIES
    from hetflow.sim.live_sia import UNEXPRESSED
    from dataclasses import replace

    from hetflow.sim.sia import (DEFAULT_ROUND_S, SIA_CLUSTER, SiaJobSpec, SiaProfiles, SiaSimulator, load_workload,
                                 workload_files)
    from hetflow.sim.sia_reference import REFERENCE_POLICIES
    from hetflow.sim.live_sia import live_sia_policy

    for flag, value in (("--cluster", args.cluster), ("--window", args.window), ("--packing", args.packing),
                        ("--seeds", args.seeds), ("--arrival-order", args.arrival_order),
                        ("--node-ranks", args.node_ranks), ("--reference-type", args.reference_type)):
        if value:
            raise InputError(f"{flag} does not apply to --protocol sia (Sia's cluster: 6 x 4 T4, 2 x 8 A100, "
                             f"3 x 8 RTX 2080Ti; every job of each workload is measured); drop it")
    if args.rank_planner:
        raise InputError("--rank-planner does not apply to --protocol sia (Sia's simulator prices placements "
                         "by GPUs per node); drop it")
    policies = _policies(args.policies, "hetflow", tuple(POLICIES) + tuple(REFERENCE_POLICIES))
    for name in policies:
        if name in UNEXPRESSED:
            raise InputError(f"policy {name!r} cannot run on --protocol sia: {UNEXPRESSED[name]}")
        if name == "gavel" and args.job_kind not in (None, "rigid"):
            raise InputError(f"policy gavel runs every job rigid (Sia's simulator turns batch-size tuning off "
                             f"under Gavel); drop --job-kind {args.job_kind} or run it without gavel")

    def setting(name: str) -> tuple[float, str, Callable[[], Any]]:
        """(round length, kind of jobs without a category, a fresh policy) for one policy: Sia's
        reference policies at their own runs' rounds (gavel 360 s, every job rigid; sia 60 s)."""
        ref = REFERENCE_POLICIES.get(name)
        if ref is not None:
            return (float(ref.round_s if args.round_s is None else args.round_s),
                    args.job_kind or ref.job_kind, ref)
        return (float(DEFAULT_ROUND_S if args.round_s is None else args.round_s), args.job_kind or "adaptive",
                lambda: live_sia_policy(name))

    def specs_for(name: str, specs: list[SiaJobSpec]) -> list[SiaJobSpec]:
        # Sia's simulator builds Gavel's jobs without their category: every one rigid
        return [replace(s, category=None) for s in specs] if name == "gavel" else specs

    files = workload_files(args.trace)
    workloads = [(f, load_workload(f)) for f in files]
    profiles = SiaProfiles(_sia_profiles_dir(args))
    for _, specs in workloads:  # a job no GPU type can run: exit 2 before any simulation
        for name in policies:
            round_s, kind, make = setting(name)
            SiaSimulator(specs_for(name, specs), profiles, make(), round_s=round_s, default_kind=kind)
    out = _out_dir(args.out)
    reference = load_sia_reference()
    refs = {f: sia_reference_of(f) for f, _ in workloads}
    summary: dict[str, Any] = {}
    rows = ["policy,workload,job,arrival_s,jct_s,restarts"]
    table_rows = []
    for name in policies:
        per: dict[str, Any] = {}
        round_s, kind, make = setting(name)
        for f, specs in workloads:
            run = SiaSimulator(specs_for(name, specs), profiles, make(), round_s=round_s, default_kind=kind).run()
            s = run.summary()
            ref = refs[f]
            if ref is not None:
                got = reference["results"].get(ref[0], {}).get(ref[1], {})
                s["reference"] = {"trace": ref[0], "workload": ref[1],
                                  **{p: r["avg_jct_s"] for p, r in got.items()}}
            label = f"{ref[0]}/{ref[1]}" if ref else f.name
            per[label] = s
            for spec in specs:
                jct = run.jcts.get(spec.name)
                rows.append(f"{name},{label},{spec.name},{spec.submission_s:.6f},"
                            f"{'' if jct is None else f'{jct:.3f}'},{run.restarts.get(spec.name, 0)}")
            table_rows.append((name, label, s))
        avgs = [s["avg_jct_s"] for s in per.values() if s["avg_jct_s"] is not None]
        summary[name] = {"avg_jct_s": float(np.mean(avgs)) if avgs else None, "round_s": round_s, "job_kind": kind,
                         "workloads": per}
    _write_atomic(out / "summary.json", json.dumps(summary, indent=2) + "\n")
    _write_atomic(out / "jobs.csv", "\n".join(rows) + "\n")
    _write_atomic(out / "inputs.json", json.dumps({
        "schema": "hetflow.simulation/v1", "protocol": "sia", "trace": args.trace,
        "workloads": [str(f) for f, _ in workloads], "profiles": str(profiles.root),
        "round_s": {name: setting(name)[0] for name in policies},
        "job_kind": {name: setting(name)[1] for name in policies},
        "cluster": {t: {"sia_name": c[0], "nodes": c[1], "gpus_per_node": c[2]} for t, c in SIA_CLUSTER.items()},
        "jobs": sum(len(s) for _, s in workloads)}, indent=2) + "\n")
    table = Table(title="Sia protocol (6 x 4 T4 + 2 x 8 A100 + 3 x 8 RTX 2080Ti; kind: how jobs without a category "
                        "run; JCT in hours; Sia, Sia rigid, Gavel: Sia's own simulator)")
    for col in ("policy", "round s", "kind", "workload", "avg JCT", "p95 JCT", "makespan", "restarts", "Sia",
                "Sia rigid", "Gavel", "wall s"):
        table.add_column(col, justify="left" if col in ("policy", "kind", "workload") else "right",
                         min_width=max((len(r[1]) for r in table_rows), default=8) if col == "workload" else None)
    h = (lambda v: "-" if v is None else f"{v / 3600:.3f}")  # noqa: E731
    for name, label, s in table_rows:
        r = s.get("reference", {})
        round_s, kind, _ = setting(name)
        table.add_row(name, f"{round_s:g}", kind, label, h(s["avg_jct_s"]), h(s["p95_jct_s"]), h(s["makespan_s"]),
                      str(s["restarts"]), h(r.get("sia")), h(r.get("sia_rigid")), h(r.get("gavel")),
                      f"{s['wall_s']:.1f}")
    Console(width=140).print(table)
    Console(stderr=True).print(f"wrote {out}/summary.json, inputs.json, jobs.csv")
    return 0


PROTOCOLS: dict[str, Callable[[argparse.Namespace], int]] = {
    "gavel": run_gavel, "fgd": run_fgd, "sia": run_sia}
"""``hetflow simulate --protocol NAME``: each reference protocol's command (its rules in
``hetflow.sim.{gavel,fgd,sia}``, driven by ``hetflow.sim.mechanism``)."""
