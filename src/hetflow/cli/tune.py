"""``hetflow tune CONFIG.yaml``: tune a training job's hyperparameters on Ray Tune.

    hetflow tune examples/tune_digits.yaml
    hetflow tune examples/tune_digits.yaml --resume      # continue after Ctrl-C
    hetflow tune tune.yaml --address auto --json

Optuna TPE (or random) search over the config's space, ASHA stopping weak trials early, trials
placed by hetflow's planner. A live table shows the trials; at the end the best trial's config
(``best/config.yaml``), checkpoint (``best/checkpoint``) and a plot of every trial's validation
curve (``curves.png``) are written to the output directory. Ctrl-C stops the run and keeps it;
``--resume`` continues it without losing finished trials. Exit codes: 0 done, 2 bad config
(or nothing to resume), 3 the trials cannot be placed, 1 the run failed, 130 interrupted.
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from hetflow.cli.main import add_tracking_flags, require
from hetflow.runtime.session import check_reachable


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "tune",
        help="tune hyperparameters on Ray Tune (ASHA, Optuna TPE), resumable",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("config", metavar="CONFIG.yaml", help="tuning config (see docs/tuning.md)")
    p.add_argument("--resume", action="store_true",
                   help="continue the interrupted run in the config's output directory")
    p.add_argument("--address", help="Ray cluster to join (default: base.resources.ray_address, "
                                     "else a new local one)")
    p.add_argument("--output", metavar="DIR", help="output directory (overrides output.dir)")
    p.add_argument("--json", action="store_true", help="print the result as JSON")
    p.add_argument("--quiet", action="store_true", help="no live table")
    add_tracking_flags(p)
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from hetflow.workloads.tune.config import load_tuning_config, tuning_config_from_dict

    config = load_tuning_config(args.config)
    if args.address or args.output:
        data = config.model_dump(mode="json")
        if args.address:
            data["base"]["resources"]["ray_address"] = args.address
        if args.output:
            data["output"]["dir"] = args.output
        config = tuning_config_from_dict(data, source=args.config)
    if args.mlflow is not None or args.mlflow_experiment is not None:
        from hetflow.runtime.tracking import with_cli

        config = config.model_copy(update={"tracking": with_cli(config.tracking, args.mlflow,
                                                                args.mlflow_experiment)})
    require("torch", dataset=config.base.dataset)
    if config.tracking.enabled:
        require("mlflow")
    check_reachable(config.base.resources.ray_address)

    from hetflow.workloads.tune.runner import run_tuning

    result = run_tuning(config, resume=args.resume, quiet=args.quiet or args.json)
    if args.json:
        json.dump(summary(result), sys.stdout, indent=2)
        sys.stdout.write("\n")
        return 130 if result.interrupted else 0
    stopped = len(result.stopped_early)
    print(f"trials: {len(result.trials)}  stopped early: {stopped}  "
          f"trial-epochs: {result.trial_epochs}  wall: {result.wall_s:.1f}s"
          + ("  (resumed)" if result.resumed else ""))
    if result.interrupted:
        print(f"interrupted: `hetflow tune {args.config} --resume` continues the run")
    if result.best is None:
        print("no trial reported a result")
        return 1
    best = result.best
    print(f"best: trial {best.trial_id}  {result.metric} {best.best:.4f} at epoch "
          f"{best.best_epoch}  " + " ".join(f"{k}={v}" for k, v in best.params.items()))
    print(f"best config: {result.best_config_path}")
    print(f"best checkpoint: {result.best_checkpoint_path}")
    if result.plot_path:
        print(f"curves: {result.plot_path}")
    return 130 if result.interrupted else 0


def summary(result: Any) -> dict[str, Any]:
    """The JSON form of a TuningResult."""
    best = result.best
    return {
        "name": result.name,
        "metric": result.metric,
        "mode": result.mode,
        "best": None if best is None else {
            "trial_id": best.trial_id, "value": best.best, "epoch": best.best_epoch,
            "params": best.params},
        "best_config": str(result.best_config_path) if result.best_config_path else None,
        "best_checkpoint": (str(result.best_checkpoint_path)
                            if result.best_checkpoint_path else None),
        "plot": str(result.plot_path) if result.plot_path else None,
        "trials": [{"trial_id": t.trial_id, "status": t.status, "epochs": t.epochs,
                    "best": t.best, "params": t.params, "device": t.device,
                    "device_units": t.device_units, "visible_devices": t.visible_devices,
                    "torch_device": t.torch_device}
                   for t in result.trials],
        "trial_epochs": result.trial_epochs,
        "wall_s": result.wall_s,
        "placement": result.placement,
        "resumed": result.resumed,
        "interrupted": result.interrupted,
        "output_dir": str(result.output_dir),
    }


def main(argv: list[str] | None = None) -> int:
    """``python -m hetflow.cli.tune ...`` = ``hetflow tune ...`` (same parser, same errors)."""
    from hetflow.cli.main import main as hetflow_main

    argv = list(sys.argv[1:] if argv is None else argv)
    argv.insert(0, "tune")
    return hetflow_main(argv)


if __name__ == "__main__":
    sys.exit(main())
