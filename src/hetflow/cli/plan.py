"""``hetflow plan``: choose devices for one job on a described cluster, and say why.

    hetflow plan --cluster cluster.yaml --tp 4 --pp 2 --dp 2 --mem 40GiB
    hetflow plan --cluster snapshot.json --count 2 --vendor amd --json
    hetflow plan --cluster cluster.yaml --tp 8 --dp -1 --params 70B --mode train
    hetflow plan --cluster cluster.yaml --count 1 --mem 20GiB --share

The cluster is a cluster YAML or a snapshot JSON (``hetflow inventory --cluster ... --json``),
whose allocations count as occupied. A degree of -1 means "as many as fit". Exit codes: 0 with
the placement, 2 for bad input, 3 when the request cannot be placed (the message says which
constraint excluded which nodes, and what would make it fit).
"""

from __future__ import annotations

import argparse
import json
import sys

from hetflow.core.errors import InputError
from hetflow.core.request import ParallelLayout, PlacementRequest, Strategy
from hetflow.core.units import parse_bytes


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "plan",
        help="choose devices for a job (tensor-parallel groups on the fastest links) and say why",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--cluster", required=True, metavar="CLUSTER",
                   help="cluster description (YAML) or snapshot JSON")
    shape = p.add_argument_group("what to place (a layout dp x pp x tp, or a device count)")
    shape.add_argument("--tp", type=int, default=None, help="tensor-parallel degree (devices per group)")
    shape.add_argument("--pp", type=int, default=None, help="pipeline stages per replica")
    shape.add_argument("--dp", type=int, default=None, help="data-parallel replicas (-1: as many as fit)")
    shape.add_argument("--count", type=int, default=None,
                       help="N devices that talk to each other (one gang); instead of --tp/--pp/--dp")
    mem = p.add_argument_group("memory per device (give it, or estimate it from the model size)")
    mem.add_argument("--mem", metavar="SIZE", help="memory per device, e.g. 40GiB or 80GB")
    mem.add_argument("--params", metavar="N", help="model parameters, e.g. 7B, to estimate --mem")
    mem.add_argument("--mode", choices=["train", "inference"], default="train",
                     help="for --params: training (Adam, mixed precision) or inference")
    mem.add_argument("--dtype", default="bf16", help="for --params: weight dtype (bf16, fp16, fp8, fp32, int4)")
    which = p.add_argument_group("which devices")
    which.add_argument("--vendor", help="nvidia, amd or cpu")
    which.add_argument("--model", help="accelerator model as the catalog names it, e.g. MI300X")
    which.add_argument("--arch", help="architecture, e.g. gfx942 or sm_90")
    which.add_argument("--min-memory", metavar="SIZE", help="only devices with at least this much memory")
    which.add_argument("--share", action="store_true",
                       help="share devices with other jobs by free memory (needs --mem or --params)")
    which.add_argument("--mixed-models", action="store_true",
                       help="let a tensor-parallel group mix device models of one vendor (by default "
                            "a group shares one model; a job never mixes vendors)")
    which.add_argument("--spread", action="store_true",
                       help="put replicas on different nodes instead of packing them")
    p.add_argument("--job", default="job", help="job id shown in the plan (default: job)")
    p.add_argument("--json", action="store_true", help="print the placement as JSON")
    p.set_defaults(func=run)


def build_request(args: argparse.Namespace) -> PlacementRequest:
    """The request the arguments describe (InputError for contradictions)."""
    degrees = {k: getattr(args, k) for k in ("dp", "pp", "tp")}
    if args.count is not None and any(v is not None for v in degrees.values()):
        raise InputError("give either --count or --dp/--pp/--tp, not both")
    if args.mem and args.params:
        raise InputError("give either --mem or --params (to estimate it), not both")
    layout = None
    if args.count is None:
        layout = ParallelLayout(**{k: (1 if v is None else v) for k, v in degrees.items()})
    memory, note = _memory(args, layout)
    return PlacementRequest.parse(
        args.job, count=args.count, layout=layout, memory=memory, memory_note=note,
        vendor=args.vendor, model=args.model, arch=args.arch, min_memory=args.min_memory,
        share=args.share, strategy=Strategy.SPREAD if args.spread else Strategy.PACK,
        mixed_models=args.mixed_models,
    )


def _memory(args: argparse.Namespace, layout: ParallelLayout | None) -> tuple[int | None, str | None]:
    if args.mem:
        return parse_bytes(args.mem), None
    if not args.params:
        return None, None
    from hetflow.scheduling.memory import (
        describe_estimate, estimate_memory_per_device, parse_param_count,
    )

    tp = args.count if layout is None else layout.tp
    pp = 1 if layout is None else layout.pp
    if tp == -1 or pp == -1:
        raise InputError("to estimate memory from --params, give --tp and --pp (not -1)")
    params = parse_param_count(args.params)
    memory = estimate_memory_per_device(params, mode=args.mode, dtype=args.dtype, tp=tp, pp=pp)
    return memory, describe_estimate(params, mode=args.mode, dtype=args.dtype, tp=tp, pp=pp)


def run(args: argparse.Namespace) -> int:
    from hetflow.accelerators.load import load_cluster
    from hetflow.scheduling.planner import plan

    request = build_request(args)  # bad arguments fail before the cluster is read
    snapshot = load_cluster(args.cluster)
    placement = plan(snapshot, request)
    if args.json:
        sys.stdout.write(json.dumps(placement.to_dict(), indent=2) + "\n")
    else:
        sys.stdout.write(placement.explain() + "\n")
    return 0
