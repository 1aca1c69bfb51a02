"""``hetflow capacity``: which fleet to buy.

    hetflow capacity serve PROFILES --workload WORKLOAD [--slice-factor N] [--json]
    hetflow capacity serve MELANGE_CONFIG.json [--slice-factor N] [--json]

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
"""

from __future__ import annotations

import argparse
import json


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


def _read(path: str, what: str) -> object:
    from hetflow.core.yamlfile import read_yaml

    return read_yaml(path, what)  # YAML reads JSON too; a missing file is one line


def run_serve(args: argparse.Namespace) -> int:
    from hetflow.capacity.serve import is_melange, plan_serve, read_melange, read_profiles, read_workload
    from hetflow.core.errors import InputError

    doc = _read(args.profiles, "profiles file")
    if is_melange(doc):
        if args.workload:
            raise InputError(f"{args.profiles} is a Melange config, which holds its workload: drop --workload")
        throughput, prices, buckets, own_slices = read_melange(doc, args.profiles)
        slo = ""
        slices = own_slices if args.slice_factor is None else args.slice_factor
    else:
        if not args.workload:
            raise InputError("--workload FILE is needed: the request rate per bucket "
                             "(buckets: {BUCKET: req/s}, or rate: with mix:)")
        throughput, prices, slo = read_profiles(doc, args.profiles)
        known = {b for row in throughput.values() for b in row}
        buckets = read_workload(_read(args.workload, "workload file"), args.workload, known)
        slices = args.slice_factor or 0
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
    print("pools for an engine: vllm model of hetflow serve (set each pool's device):")
    for model, n in sorted(out["counts"].items()):
        if model.lower().startswith("cpu"):
            print(f"  - {{device: cpu, replicas: {n}}}   # {model}")
        else:
            print(f"  - {{accelerator: {model}, device: gpu, replicas: {n}}}")
    return 0
