"""``hetflow train CONFIG.yaml``: train a model on Ray with the config's parallel layout.

    hetflow train examples/train_digits.yaml
    hetflow train examples/train_digits.yaml --set train.steps=50 --set layout.dp=1
    hetflow train job.yaml --address auto --json
    hetflow train examples/train_digits.yaml --dry-run   # where the ranks would go; starts nothing

The job resumes from the newest complete checkpoint in its checkpoint directory, restarts
itself from the last checkpoint when a worker dies (up to ``resources.max_failures``), and at
the end prints the validation metrics of the final checkpoint. Exit codes: 0 done, 2 bad
config, 3 the layout cannot be placed, 1 the job failed.
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

import yaml

from hetflow.cli.main import add_tracking_flags, require
from hetflow.core.errors import InputError
from hetflow.runtime.session import check_reachable


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "train",
        help="train a model (data, tensor, pipeline parallel) on Ray, with checkpoints and recovery",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("config", metavar="CONFIG.yaml", help="training config (see docs/training.md)")
    p.add_argument("--set", action="append", default=[], metavar="SECTION.KEY=VALUE",
                   help="override one config value, e.g. train.steps=50 or "
                        "resources.devices.kind=cpu (repeatable)")
    p.add_argument("--address", help="Ray cluster to join (default: resources.ray_address, "
                                     "else a running local cluster, else a new local one)")
    p.add_argument("--json", action="store_true", help="print the result as JSON")
    p.add_argument("--quiet", action="store_true", help="no progress lines")
    p.add_argument("--dry-run", action="store_true",
                   help="print the Ray it would join or start, the layout and where each rank would go; "
                        "start nothing")
    add_tracking_flags(p)
    p.set_defaults(func=run)


def parse_overrides(items: list[str]) -> dict[str, dict[str, Any]]:
    """``["train.steps=50", "resources.devices.kind=cpu"]`` -> ``{"train": {"steps": 50},
    "resources": {"devices": {"kind": "cpu"}}}`` (values read as YAML scalars; ``devices`` is
    the one section inside a section, merged key by key: hetflow.core.devices)."""
    sections: dict[str, dict[str, Any]] = {}
    for item in items:
        key, sep, value = item.partition("=")
        section, dot, field = key.strip().partition(".")
        field, dot2, sub = field.partition(".")
        if (not sep or not dot or not section or not field or (dot2 and field != "devices")
                or (dot2 and (not sub or "." in sub))):
            raise InputError(f"--set {item!r}: expected SECTION.KEY=VALUE, e.g. train.steps=50 "
                             "(or SECTION.devices.KEY=VALUE, e.g. resources.devices.kind=cpu)")
        parsed = yaml.safe_load(value) if value else None
        if dot2:
            devices = sections.setdefault(section, {}).setdefault("devices", {})
            if not isinstance(devices, dict):
                raise InputError(f"--set {item!r}: {section}.devices is set whole and by key; give one")
            devices[sub] = parsed
        else:
            if field == "devices" and isinstance(sections.get(section, {}).get("devices"), dict):
                raise InputError(f"--set {item!r}: {section}.devices is set whole and by key; give one")
            sections.setdefault(section, {})[field] = parsed
    return sections


def run(args: argparse.Namespace) -> int:
    from hetflow.workloads.train.config import load_config

    config = load_config(args.config)
    overrides = parse_overrides(args.set)
    if args.address:
        overrides.setdefault("resources", {})["ray_address"] = args.address
    if overrides:
        config = config.with_overrides(**overrides)
    if args.mlflow is not None or args.mlflow_experiment is not None:
        from hetflow.runtime.tracking import with_cli

        tracking = with_cli(config.tracking, args.mlflow, args.mlflow_experiment)
        config = config.model_copy(update={"tracking": tracking})
    if args.dry_run:
        from hetflow.cli.dryrun import show, train_plan
        from hetflow.runtime.preview import preview_cluster

        lines, data = train_plan(config, preview_cluster(config.resources.ray_address), config.name)
        return show(lines, data, args.json)
    require("torch", dataset=config.dataset)
    if config.tracking.enabled:
        require("mlflow")
    check_reachable(config.resources.ray_address)

    from hetflow.workloads.train.job import run_training

    total = config.train.steps

    def show(record: dict[str, Any], job: Any) -> None:
        if not args.quiet and not args.json and (
                record["step"] % config.train.log_every == 0 or record["step"] == total):
            restart = f" (attempt {record['attempt'] + 1})" if record["attempt"] else ""
            print(f"step {record['step']:>6}/{total}  loss {record['loss']:.4f}{restart}",
                  flush=True)

    result = run_training(config, on_progress=show)
    if args.json:
        json.dump(summary(result), sys.stdout, indent=2)
        sys.stdout.write("\n")
        return 0
    print(f"placement: {result.placement.splitlines()[0] if result.placement else '-'}")
    print(f"steps: {result.steps}  final training loss: {result.final_loss:.4f}  "
          f"restarts: {result.restarts}")
    if result.samples_per_s:
        print(f"throughput: {result.samples_per_s:.0f} samples/s  start-up: {result.startup_s:.1f}s")
    for name, value in result.metrics.items():
        label = "final validation accuracy" if name == "val_accuracy" else name.replace("_", " ")
        print(f"{label}: {value:.4f}")
    print(f"checkpoint: {result.checkpoint}")
    return 0


def summary(result: Any) -> dict[str, Any]:
    """The JSON form of a TrainResult (losses keyed by step, ranks summarised)."""
    return {
        "name": result.name,
        "steps": result.steps,
        "final_loss": result.final_loss,
        "losses": {str(k): v for k, v in result.losses.items()},
        "metrics": result.metrics,
        "checkpoint": result.checkpoint,
        "restarts": result.restarts,
        "failures": result.failures,
        "samples_per_s": result.samples_per_s,
        "startup_s": result.startup_s,
        "recovery_s": result.recovery_s,
        "wall_s": result.wall_s,
        "layout": result.layout,
        "placement": result.placement,
        "ranks": [{"rank": r.rank, "host": r.host, "pid": r.pid, "device": r.device,
                   "backend": r.backend, "runtime": r.runtime,
                   "visible_devices": r.visible_devices} for r in result.ranks],
    }


def main(argv: list[str] | None = None) -> int:
    """``python -m hetflow.cli.train ...`` = ``hetflow train ...`` (same parser, same errors)."""
    from hetflow.cli.main import main as hetflow_main

    argv = list(sys.argv[1:] if argv is None else argv)
    argv.insert(0, "train")
    return hetflow_main(argv)


if __name__ == "__main__":
    sys.exit(main())
