"""``hetflow launch``: an existing torchrun script, unchanged, on planned devices of a Ray cluster.

    hetflow launch --nproc 2 examples/launch/ddp_snapshot.py --steps 200
    hetflow launch --nproc 8 --tp 4 --device gpu --vendor amd train.py --config big.yaml
    hetflow launch --nproc 4 --max-restarts 3 --address HEAD:6379 --working-dir . -m pkg.train
    hetflow launch --nproc 2 --dry-run train.py     # where the ranks would go; starts nothing

Each rank is one process on its node with exactly its device visible and the environment
torchrun gives (RANK, LOCAL_RANK, WORLD_SIZE, MASTER_ADDR, ...), so a script that calls
``init_process_group()`` runs as under torchrun. Everything after SCRIPT (or after ``-m
MODULE``) goes to the script. Without ``--address`` (and RAY_ADDRESS) the ranks run on an
embedded local Ray. Exit codes: 0 every rank exited 0; a failing rank's own code (128+N when
killed by signal N); 2 bad input; 3 the ranks cannot be placed; 130 interrupted (Ctrl-C).
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any, get_args

from pydantic import ValidationError

from hetflow.core.errors import InputError
from hetflow.core.topology import AcceleratorVendor


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "launch",
        help="run an unchanged torchrun script as N ranks on planned devices (restarts, logs)",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--nproc", type=int, default=1, metavar="N", help="ranks in all (default 1)")
    p.add_argument("--tp", type=int, default=1, metavar="T",
                   help="layout hint: ranks per tensor-parallel group, on the fastest links")
    p.add_argument("--pp", type=int, default=1, metavar="P", help="layout hint: pipeline stages")
    p.add_argument("--device", choices=["auto", "cpu", "gpu"], default="auto",
                   help="auto: GPUs when the cluster has them, else CPU (default)")
    p.add_argument("--vendor", choices=list(get_args(AcceleratorVendor)), help="only this vendor's GPUs")
    p.add_argument("--model", help="only GPUs of this catalog model, e.g. H100, MI300X")
    p.add_argument("--memory", metavar="SIZE", help="device memory each rank needs, e.g. 40GiB")
    p.add_argument("--cpus-per-rank", type=float, metavar="C",
                   help="CPUs reserved per rank (default 1; embedded local Ray: cores / N, at most 1)")
    p.add_argument("--visible-devices", choices=["node", "own"], default="node",
                   help="node: a rank sees its job's devices on its node in local-rank order, so "
                        "cuda:LOCAL_RANK is its own (default); own: only its own device, as cuda:0")
    p.add_argument("--max-restarts", type=int, default=0, metavar="R",
                   help="restart the whole group after a failure up to R times (as torchrun)")
    p.add_argument("--address", help="Ray cluster to join (default RAY_ADDRESS, else an embedded local Ray)")
    p.add_argument("--working-dir", metavar="DIR",
                   help="ship DIR to every rank's node and run there (SCRIPT is a path inside it)")
    p.add_argument("--env", action="append", default=[], metavar="K=V",
                   help="environment variable for every rank (repeatable)")
    p.add_argument("--log-dir", metavar="DIR",
                   help="where each rank's output is kept (default results/launch/<run-id>)")
    p.add_argument("--run-id", help="TORCHELASTIC_RUN_ID and the log directory's name")
    p.add_argument("--stop-grace", type=float, default=5.0, metavar="S",
                   help="seconds between SIGTERM and SIGKILL when ranks are stopped (default 5)")
    p.add_argument("--placement-timeout", type=float, default=120.0, metavar="S",
                   help="how long to wait for the ranks' placement (default 120)")
    p.add_argument("--quiet", action="store_true", help="no launcher lines on stderr (rank output only)")
    p.add_argument("--json", action="store_true", help="print the result as JSON on stdout at the end")
    p.add_argument("--dry-run", action="store_true",
                   help="print the Ray it would join or start, where each rank would go and what it would "
                        "run; start nothing")
    from hetflow.cli.main import add_tracking_flags

    add_tracking_flags(p)
    p.add_argument("-m", "--module", action="store_true",
                   help="run the target as a module (python -m), as torchrun -m")
    p.add_argument("target", nargs=argparse.REMAINDER, metavar="SCRIPT [ARGS ...]",
                   help="the script (or module with -m) and its own arguments")
    p.set_defaults(func=run)


def parse_env(items: list[str]) -> dict[str, str]:
    env = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise InputError(f"--env {item!r}: expected K=V, e.g. --env NCCL_DEBUG=INFO")
        env[key] = value
    return env


def spec_from_args(args: argparse.Namespace) -> Any:
    from hetflow.workloads.launch.spec import LaunchSpec

    if not args.target:
        raise InputError("no script given: hetflow launch [OPTIONS] SCRIPT [ARGS ...] "
                         "(or -m MODULE [ARGS ...])")
    name, *script_args = args.target
    fields = {
        "script": None if args.module else name, "module": name if args.module else None,
        "args": tuple(script_args), "nproc": args.nproc, "tp": args.tp, "pp": args.pp,
        "device": args.device, "vendor": args.vendor, "model": args.model, "memory": args.memory,
        "cpus_per_rank": args.cpus_per_rank, "max_restarts": args.max_restarts,
        "working_dir": args.working_dir, "visible_devices": args.visible_devices, "env": parse_env(args.env), "address": args.address,
        "stop_grace_s": args.stop_grace, "placement_timeout_s": args.placement_timeout,
        "run_id": args.run_id, "log_dir": args.log_dir,
    }
    if args.mlflow is not None or args.mlflow_experiment is not None:
        from hetflow.runtime.tracking import with_cli

        fields["tracking"] = with_cli(None, args.mlflow, args.mlflow_experiment)
    try:
        spec = LaunchSpec(**fields)
    except ValidationError as exc:
        raise InputError(_describe(exc)) from None
    if spec.memory:
        from hetflow.core.units import parse_bytes

        parse_bytes(spec.memory)  # an unreadable size is an InputError naming it
    return spec


def _describe(exc: ValidationError) -> str:
    parts = []
    for error in exc.errors():
        msg = str(error["msg"]).removeprefix("Value error, ")
        flag = "--" + str(error["loc"][0]).removesuffix("_s").replace("_", "-") if error["loc"] else ""
        parts.append(f"{flag} {msg}" if flag else msg)
    return "; ".join(parts)


def run(args: argparse.Namespace) -> int:
    spec = spec_from_args(args)
    if args.dry_run:
        return dry_run(spec, args.json)
    from hetflow.workloads.launch.launcher import launch

    if spec.tracking.enabled:
        from hetflow.cli.main import require

        require("mlflow")
    result = launch(spec, quiet=args.quiet)
    if args.json:
        json.dump({"exit_code": result.exit_code, "restarts": result.restarts,
                   "failures": result.failures, "log_dir": str(result.log_dir),
                   "placement": result.placement, "wall_s": result.wall_s,
                   "startup_s": result.startup_s, "ranks": result.ranks}, sys.stdout, indent=2)
        sys.stdout.write("\n")
    return result.exit_code


def dry_run(spec: Any, as_json: bool) -> int:
    """What ``hetflow launch`` would join or start and run on each rank (the launcher's rules:
    an embedded local Ray shares its cores among the ranks), starting nothing."""
    import os
    import shlex

    from hetflow.cli.dryrun import show
    from hetflow.runtime.preview import preview_cluster, preview_ranks
    from hetflow.runtime.session import Session, check_embedded
    from hetflow.workloads.launch.launcher import resolve_target
    from hetflow.workloads.train.config import ResourcesConfig

    target = resolve_target(spec)
    # the launcher's rule: --address, else RAY_ADDRESS, else an embedded Ray (no recorded cluster)
    cluster = preview_cluster(spec.address, None if os.environ.get("RAY_ADDRESS") else "local")
    cores = check_embedded(spec.nproc) if cluster.address is None else None
    cpus = Session(False, cores).cpus_per_rank(spec.nproc, spec.cpus_per_rank)
    res = ResourcesConfig(devices=spec.devices(), cpus_per_rank=cpus,
                          placement_timeout_s=spec.placement_timeout_s)
    ranks = preview_ranks(spec.layout, res, cluster, spec.run_id or "launch")
    command = shlex.join(target.argv)
    lines = [("ray", cluster.describe()),
             ("placement", ranks.how + (f": {' '.join(ranks.where)}" if ranks.where else "")),
             ("would start", f"{spec.nproc} rank process(es), each `{command}`"
                             + (f" in {target.cwd}" if target.cwd else "")
                             + (f", {target.working_dir} shipped as working_dir" if target.working_dir else "")),
             ("environment", f"torchrun's per rank (RANK 0..{spec.nproc - 1}, WORLD_SIZE {spec.nproc}, "
                             "LOCAL_RANK, MASTER_ADDR/PORT, ...)"
                             + (f" and {', '.join(sorted(spec.env))}" if spec.env else "")),
             ("restarts", f"up to {spec.max_restarts}")]
    data = {"ray": cluster.to_dict(), "placement": ranks.to_dict(), "argv": target.argv, "cwd": target.cwd,
            "working_dir": target.working_dir, "nproc": spec.nproc, "env": dict(spec.env),
            "max_restarts": spec.max_restarts}
    return show(lines, data, as_json)


def main(argv: list[str] | None = None) -> int:
    """``python -m hetflow.cli.launch ...`` = ``hetflow launch ...``."""
    from hetflow.cli.main import main as hetflow_main

    argv = list(sys.argv[1:] if argv is None else argv)
    return hetflow_main(["launch", *argv])


if __name__ == "__main__":
    sys.exit(main())
