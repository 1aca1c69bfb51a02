"""``hetflow capacity``: which fleet to buy.

    hetflow capacity serve PROFILES --workload WORKLOAD [--slice-factor N] [--json]
    hetflow capacity serve MELANGE_CONFIG.json [--slice-factor N] [--json]
    hetflow capacity train --trace T --devices A100-80GB,H100-SXM,MI300X --price H100-SXM=4.5 ...
                           --target-avg-jct 12h [--node-size 8] [--max-nodes 4] [--out DIR]
                           [--serve PROFILES --workload WORKLOAD]   # training beside a serving load

``serve``: the cheapest mix of device models (and how many of each) that serves a request
load within its latency SLO - Melange's formulation (a mixed-integer program over request-size
buckets and per-device throughputs profiled at the SLO), extended to any device the profiles
name (AMD and NVIDIA models, CPU replicas). PROFILES gives each device model's price per hour
and the requests/s one device sustains per bucket; WORKLOAD the rate per bucket. Printed: the
mix, each bucket's split, each model's load, the best single-model fleet beside it, and the
``pools:`` lines for an ``engine: vllm`` model of ``hetflow serve``. PROFILES may also be
Melange's own solver config (``gpu_info``, ``workload_distribution``, ``total_request_rate``),
which holds its workload and slice factor. Exit 2 for malformed files, 3 when some bucket no
device can serve. docs/capacity.md.

``train``: the cheapest fleet (nodes of each candidate model) on which a job trace (any trace
``hetflow simulate`` reads) meets an average or P95 job-completion-time target, judged by
simulating the trace with the policy the live controller runs; the best single-model fleets and
the price/JCT Pareto front beside it. Exit 3 when no fleet up to --max-nodes meets the target.
With ``--serve PROFILES --workload WORKLOAD`` the fleet is shared: the serving plan's replicas
are bought first as whole nodes and reserved, and training gets the devices left on them plus
the cheapest training nodes that meet the target; printed beside the price of buying the two
apart.
"""

from __future__ import annotations

import argparse
import json
import math
import os


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("capacity", help="which fleet to buy: the cheapest device mix for a serving load",
                       description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    verbs = p.add_subparsers(dest="capacity_command", metavar="{serve}", parser_class=type(p))
    verbs.required = True
    s = verbs.add_parser("serve", help="the cheapest device mix for a request load at its SLO (Melange's program)")
    s.add_argument("profiles", metavar="PROFILES",
                   help="YAML/JSON: devices: {MODEL: {price_per_hour}}, throughput: {MODEL: {BUCKET: req/s}}")
    s.add_argument("--workload", metavar="FILE",
                   help="YAML/JSON: buckets: {BUCKET: req/s}, or rate: R with mix: {BUCKET: fraction} "
                        "(not with a Melange config, which holds its workload)")
    s.add_argument("--slice-factor", type=int, default=None, metavar="N",
                   help="cut each bucket's rate into N slices that go whole to one model (Melange's "
                        "program); default 0: a bucket's share of each model may be any fraction, the "
                        "cheapest (a Melange config's own slice_factor when it is one)")
    s.add_argument("--json", action="store_true", help="print the plan as JSON")
    s.set_defaults(func=run_serve)
    t = verbs.add_parser("train", help="the cheapest fleet on which a training trace meets a JCT target (simulated)")
    t.add_argument("--trace", required=True, metavar="T", help="a trace file or synthetic:jobs=N,rate=R,seed=S")
    t.add_argument("--devices", required=True, metavar="M,M", help="candidate catalog models, e.g. A100-80GB,MI300X")
    t.add_argument("--price", action="append", default=[], metavar="MODEL=USD",
                   help="dollars per device-hour of a candidate (repeat; or --prices FILE); default: the "
                        "catalog's cited on-demand cloud price (hetflow/accelerators/data/prices.yaml)")
    t.add_argument("--prices", metavar="FILE", help="YAML/JSON: MODEL: dollars per device-hour")
    target = t.add_mutually_exclusive_group(required=True)
    target.add_argument("--target-avg-jct", metavar="TIME", help="average job completion time to meet, e.g. 12h")
    target.add_argument("--target-p95-jct", metavar="TIME", help="P95 job completion time to meet, e.g. 2d")
    t.add_argument("--node-size", type=int, default=8, help="devices per node (default 8)")
    t.add_argument("--max-nodes", type=int, default=4, help="most nodes of each model to try (default 4)")
    t.add_argument("--max-simulations", type=int, default=400, help="stop after this many simulations")
    t.add_argument("--workers", type=int, default=None, metavar="N",
                   help="simulations side by side in N processes (default: the machine's cores)")
    t.add_argument("--full-runs", action="store_true",
                   help="run every simulated fleet to the end, for its JCT on the Pareto front (default: "
                        "a simulation stops once the fleet is sure to miss the target)")
    t.add_argument("--where-mix-pays", action="store_true",
                   help="when one model alone is cheapest, also find the cheapest mix that meets the target "
                        "(more simulations), so the output says at which prices a mix would be cheapest")
    t.add_argument("--policy", default="hetflow", help="the cluster policy (default hetflow, the controller's)")
    t.add_argument("--throughputs", metavar="F", help="measured job-type x device-type table (as simulate)")
    t.add_argument("--seed", type=int, default=0, help="seed for traces that draw job types")
    t.add_argument("--serve", metavar="PROFILES", help="a serving load shares the fleet: its device profiles "
                   "(as capacity serve's PROFILES, or a Melange config); its replicas are reserved")
    t.add_argument("--workload", metavar="FILE", help="with --serve: the request rate per bucket")
    t.add_argument("--slice-factor", type=int, default=None, metavar="N", help="with --serve: as capacity serve's")
    t.add_argument("--out", metavar="DIR", help="write plan.json and pareto.png here")
    t.add_argument("--json", action="store_true", help="print the plan as JSON")
    t.set_defaults(func=run_train)


def _read(path: str, what: str) -> object:
    from hetflow.core.yamlfile import read_yaml

    return read_yaml(path, what)  # YAML reads JSON too; a missing file is one line


def _serve_inputs(profiles: str, workload: str | None, slice_factor: int | None) -> tuple:
    """(throughput, prices, buckets, slice factor, SLO text) from a profiles file and a workload,
    or from a Melange config (which holds its workload)."""
    from hetflow.capacity.serve import is_melange, read_melange, read_profiles, read_workload
    from hetflow.core.errors import InputError

    doc = _read(profiles, "profiles file")
    if is_melange(doc):
        if workload:
            raise InputError(f"{profiles} is a Melange config, which holds its workload: drop --workload")
        throughput, prices, buckets, own_slices = read_melange(doc, profiles)
        return throughput, prices, buckets, own_slices if slice_factor is None else slice_factor, ""
    if not workload:
        raise InputError("--workload FILE is needed: the request rate per bucket "
                         "(buckets: {BUCKET: req/s}, or rate: with mix:)")
    throughput, prices, slo = read_profiles(doc, profiles)
    known = {b for row in throughput.values() for b in row}
    buckets = read_workload(_read(workload, "workload file"), workload, known)
    return throughput, prices, buckets, slice_factor or 0, slo


def run_serve(args: argparse.Namespace) -> int:
    from hetflow.capacity.serve import plan_serve

    throughput, prices, buckets, slices, slo = _serve_inputs(args.profiles, args.workload, args.slice_factor)
    fleet = plan_serve(buckets, throughput, prices, slice_factor=slices)
    out = fleet.to_dict()
    out.update(slo=slo, slice_factor=slices, rate=sum(b.rate for b in buckets))
    if args.json:
        print(json.dumps(out, indent=2))
        return 0
    print(f"cheapest fleet for {out['rate']:g} req/s" + (f" at {slo}" if slo else "")
          + f": ${fleet.cost_per_hour:,.2f}/h")
    for model, n in sorted(out["counts"].items()):
        print(f"  {model:12s} x {n:3d}   ${prices[model] * n:,.2f}/h   busy {out['load'][model]:.0%}")
    print("each bucket's requests:")
    for bucket, split in out["shares"].items():
        print(f"  {bucket:12s} " + ", ".join(f"{d} {f:.0%}" for d, f in sorted(split.items())))
    best = out["best_homogeneous"]
    if best:
        print(f"best single model: {best['device']} x {best['count']} at ${best['cost_per_hour']:,.2f}/h "
              f"(the mix costs {out['mixed_over_homogeneous']:.2f}x of it)")
    else:
        print("no single model serves every bucket")
    print("pools for an engine: vllm model of hetflow serve (set each pool's device; weight: the planned "
          "requests/s per replica, relative):")
    weights = out["weights"]
    for model, n in sorted(out["counts"].items()):
        if model.lower().startswith("cpu"):
            print(f"  - {{devices: cpu, replicas: {n}, weight: {weights[model]}}}   # {model}")
        else:
            print(f"  - {{devices: {{model: {model}}}, replicas: {n}, weight: {weights[model]}}}")
    return 0


def run_train(args: argparse.Namespace) -> int:
    from pathlib import Path

    from hetflow.accelerators.catalog import default_catalog
    from hetflow.accelerators.prices import default_prices, device_watts
    from hetflow.capacity.train import (
        fleet_lower_bound,
        is_mix,
        job_times,
        mix_price_ranges,
        parse_prices,
        parse_time,
        plan_train,
    )
    from hetflow.core.errors import InputError, Unschedulable
    from hetflow.scheduling.policies.capacity import ClusterModel
    from hetflow.scheduling.policies.registry import make_policy, parse_policy_list
    from hetflow.scheduling.throughput import default_model, load_throughputs
    from hetflow.sim.cluster import synthetic_cluster
    from hetflow.sim.engine import SimConfig, Simulator
    from hetflow.sim.metrics import summarise
    from hetflow.sim.traces import load_trace

    catalog = default_catalog()
    models = [catalog.lookup(m.strip()).name for m in args.devices.split(",") if m.strip()]
    if not models or len(set(models)) != len(models):
        raise InputError("--devices: give distinct catalog models, e.g. A100-80GB,H100-SXM,MI300X")
    raw = parse_prices(args.price, _read(args.prices, "prices file") if args.prices else None)
    prices = {}
    for name, value in raw.items():
        prices[catalog.lookup(name).name] = value
    price_source = {m: "given" for m in prices}
    listed = default_prices()
    for m in models:  # the catalog's cited on-demand price where the user gave none
        if m not in prices and m in listed and listed[m].cloud_usd_per_hour is not None:
            prices[m] = float(listed[m].cloud_usd_per_hour)  # type: ignore[arg-type]
            price_source[m] = f"catalog: {listed[m].cloud_offering or listed[m].cloud_source}"
    unpriced = [m for m in models if m not in prices]
    if unpriced:
        raise InputError(f"no price for {', '.join(unpriced)}: the catalog has no cited price for it; give "
                         "--price MODEL=DOLLARS_PER_DEVICE_HOUR (or a --prices file)")
    metric = "avg" if args.target_avg_jct else "p95"
    target_s = parse_time(args.target_avg_jct or args.target_p95_jct,
                          "--target-avg-jct" if args.target_avg_jct else "--target-p95-jct")
    (policy,) = parse_policy_list(args.policy)
    throughputs = default_model(load_throughputs(args.throughputs) if args.throughputs else None)
    trace = load_trace(args.trace, throughputs, tuple(models), seed=args.seed)
    config = SimConfig(stop_past=None if args.full_runs else (metric, target_s))
    if (args.workload or args.slice_factor is not None) and not args.serve:
        raise InputError("--workload and --slice-factor go with --serve PROFILES (a serving load beside training)")
    serving = _reserve(args, catalog, prices) if args.serve else None
    spare = {m: n for m, n in (serving.spare if serving else {}).items() if n and m in models}

    def simulator(with_spare: bool):
        def simulate(nodes: dict[str, int]) -> dict:
            parts = [(n, f"{args.node_size}x {m}") for m, n in nodes.items() if n]
            parts += [(1, f"{n}x {m}") for m, n in spare.items()] if with_spare else []
            if not parts:  # nothing to run on: every job unfinished
                return {"avg_jct_s": None, "p95_jct_s": None, "unfinished": len(trace.jobs)}
            model = ClusterModel.from_snapshot(synthetic_cluster(parts))
            result = Simulator(model, trace.jobs, make_policy(policy), throughputs, config).run()
            return {**summarise(result, 0.0), "stopped_past_s": result.stopped_past_s}
        return simulate

    times = job_times(trace.jobs, models, args.node_size, args.max_nodes, throughputs, policy)

    def bounder(with_spare: bool):
        def bound(devices: dict[str, int]) -> float:
            if with_spare:
                devices = {m: devices.get(m, 0) + spare.get(m, 0) for m in set(devices) | set(spare)}
            return fleet_lower_bound(times, devices, metric)
        return bound

    workers = args.workers if args.workers is not None else (os.cpu_count() or 1)
    plan = plan_train(models, prices, simulator(True), target_s, metric, args.node_size, args.max_nodes,
                      args.max_simulations, allow_empty=bool(spare), bound=bounder(True), workers=workers,
                      find_mix=args.where_mix_pays)
    out = plan.to_dict(metric)
    out.update(trace=trace.source, jobs=len(trace.jobs), policy=policy, metric=metric,
               target_h=target_s / 3600, node_size=args.node_size, prices=prices, price_sources=price_source)
    ranges = mix_price_ranges(plan, models, args.node_size, prices)
    out["mix_price_ranges"] = {m: [[round(lo, 4), None if math.isinf(hi) else round(hi, 4)] for lo, hi in r]
                               for m, r in ranges.items()}
    watts = {m: device_watts(m) for m in models}
    for e in [out["best"], out["best_homogeneous"], *out["homogeneous"].values()]:
        if e is not None:  # the fleet's board power at TDP (None when a model's TDP is not known)
            known = all(watts[m] is not None for m in e["nodes"])
            e["power_kw"] = round(sum(n * args.node_size * watts[m] for m, n in e["nodes"].items()) / 1000, 2) \
                if known else None
    if serving is not None:
        apart = None
        try:
            alone = plan_train(models, prices, simulator(False), target_s, metric, args.node_size, args.max_nodes,
                               args.max_simulations, bound=bounder(False), workers=workers)
            apart = serving.cost_per_hour + alone.best.cost_per_hour
        except Unschedulable:
            pass  # training alone meets the target on no fleet walked: only the shared one
        total = serving.cost_per_hour + plan.best.cost_per_hour
        out.update(serving={**serving.to_dict(), "idle": {m: n for m, n in serving.spare.items() if n and m not in spare}},
                   total_cost_per_hour=round(total, 4),
                   apart_cost_per_hour=None if apart is None else round(apart, 4),
                   shared_over_apart=None if apart is None else round(total / apart, 4))
    if args.out:
        folder = Path(args.out)
        folder.mkdir(parents=True, exist_ok=True)
        (folder / "plan.json").write_text(json.dumps(out, indent=2))
        _plot_pareto(plan, metric, target_s, folder / "pareto.png")
    if args.json:
        print(json.dumps(out, indent=2))
        return 0
    best, homog = out["best"], out["best_homogeneous"]
    if serving is not None:
        print("serving reserved: " + ", ".join(f"{n} x {args.node_size}x {m}" for m, n in serving.nodes.items())
              + "".join(f", {n} x {m}" for m, n in serving.replicas.items() if m not in serving.nodes)
              + f" (${serving.cost_per_hour:,.2f}/h); left to training: "
              + (", ".join(f"{n} x {m}" for m, n in spare.items()) or "none")
              + "".join(f"; idle: {n} x {m} (not in --devices)" for m, n in serving.spare.items()
                        if n and m not in spare))
        print(f"whole fleet ${out['total_cost_per_hour']:,.2f}/h" + (
            f"; bought apart ${out['apart_cost_per_hour']:,.2f}/h ({out['shared_over_apart']:.2f}x)"
            if out["apart_cost_per_hour"] is not None else "; training alone meets the target on no fleet walked"))
    print(("training nodes beside it" if serving is not None else "cheapest fleet")
          + f" for {len(trace.jobs)} jobs ({trace.source}) with {metric} JCT <= "
          f"{target_s / 3600:g} h under {policy}: ${best['cost_per_hour']:,.2f}/h")
    print("  " + (", ".join(f"{n} x {args.node_size}x {m}" for m, n in best["nodes"].items()) or "no training node")
          + f"   avg JCT {best['avg_jct_h']:.2f} h, p95 {best['p95_jct_h']:.2f} h"
          + ("" if best.get("power_kw") is None else f", {best['power_kw']:g} kW at TDP"))
    for m in models:
        if price_source[m] != "given":
            print(f"  price of {m}: ${prices[m]:g}/device-h from the {price_source[m]} (--price to override)")
    for m, e in out["homogeneous"].items():
        print(f"  only {m}: " + ("no fleet up to --max-nodes meets the target" if e is None else
                               f"{e['nodes'][m]} nodes, ${e['cost_per_hour']:,.2f}/h, avg JCT {e['avg_jct_h']:.2f} h"))
    if homog:
        print(f"the mix costs {out['mixed_over_homogeneous']:.2f}x of the best single model")
    mixes_met = sum(1 for e in plan.evaluated if e.meets and is_mix(e.counts.values()))
    if plan.best_mix is not None:
        e = plan.best_mix
        print("cheapest mix that meets the target: " + ", ".join(f"{n} x {args.node_size}x {m}"
                                                                 for m, n in e.counts.items() if n)
              + f", ${e.cost_per_hour:,.2f}/h, avg JCT {e.avg_jct_s / 3600:.2f} h")
    if len(models) > 1 and not mixes_met:
        print(f"no mix of the {out['simulated']} fleets simulated met the target, at any price"
              + ("" if args.where_mix_pays else " (--where-mix-pays walks on to the cheapest mix)"))
    elif len(models) > 1:
        print(f"where a mix is the cheapest fleet (one model's price moved, the others' as given; "
              f"among the {out['simulated']} fleets simulated, {mixes_met} "
              f"{'mix' if mixes_met == 1 else 'mixes'} met the target): " + "; ".join(
                  f"{m} " + (", ".join(_price_range(lo, hi) for lo, hi in r) if r else "at no price")
                  + f" (now ${prices[m]:g})" for m, r in ranges.items()))
    print(f"price/JCT Pareto front ({len(out['pareto'])} fleets), {out['simulated']} simulated "
          f"({out['stopped_early']} stopped once sure to miss), {out['skipped']} left out (below a miss or dearer), "
          f"{out['bounded']} ruled out by the trace's bound, {out['wall_s']:.1f} s" + (f"; wrote {args.out}/plan.json, pareto.png" if args.out else ""))
    return 0


def _price_range(lo: float, hi: float) -> str:
    if lo <= 0:
        return "at any price" if math.isinf(hi) else f"up to ${hi:.2f}/h"
    return f"${lo:.2f}/h and up" if math.isinf(hi) else f"${lo:.2f}-${hi:.2f}/h"


def _reserve(args: argparse.Namespace, catalog, prices: dict[str, float]):
    """The serving plan of ``--serve``/``--workload``, reserved as whole nodes of its catalog
    models (training's prices where both name a model: they must agree)."""
    from hetflow.capacity.serve import plan_serve
    from hetflow.capacity.train import reserve_serving
    from hetflow.core.errors import InputError

    throughput, serve_prices, buckets, slices, _ = _serve_inputs(args.serve, args.workload, args.slice_factor)
    fleet = plan_serve(buckets, throughput, serve_prices, slice_factor=slices)

    def catalog_name(model: str) -> str | None:
        if model.lower().startswith("cpu"):
            return None
        try:
            return catalog.lookup(model).name
        except InputError:
            return None

    replicas: dict[str, int] = {}
    unit: dict[str, float] = {}
    for model, n in fleet.counts.items():
        name = catalog_name(model) or model
        if name in prices and abs(prices[name] - serve_prices[model]) > 1e-9:
            raise InputError(f"{model}: {args.serve} prices it ${serve_prices[model]:g}/h, --price "
                             f"${prices[name]:g}/h; one fleet has one price per model")
        replicas[name] = replicas.get(name, 0) + n
        unit[name] = serve_prices[model]
    return reserve_serving(replicas, unit, args.node_size, lambda m: catalog_name(m) is not None)


def _plot_pareto(plan, metric: str, target_s: float, path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    key = "avg_jct_s" if metric == "avg" else "p95_jct_s"
    done = [e for e in plan.evaluated if e.unfinished == 0 and getattr(e, key) is not None]
    front = plan.pareto(metric)
    fig, ax = plt.subplots(figsize=(6, 4))
    ax.scatter([e.cost_per_hour for e in done], [getattr(e, key) / 3600 for e in done], s=12,
               color="0.6", label="fleets simulated")
    ax.plot([e.cost_per_hour for e in front], [getattr(e, key) / 3600 for e in front], "o-", label="Pareto front")
    if plan.best is not None:
        ax.scatter([plan.best.cost_per_hour], [getattr(plan.best, key) / 3600], s=80, marker="*",
                   color="red", zorder=5, label="cheapest meeting the target")
    ax.axhline(target_s / 3600, ls="--", color="0.3", lw=1, label="target")
    ax.set_xlabel("fleet price, $/h")
    ax.set_ylabel(f"{metric} JCT, h")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
