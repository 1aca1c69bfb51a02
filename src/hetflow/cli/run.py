"""``hetflow run WORKFLOW.yaml``: one workflow from data to a served model.

    hetflow run examples/digits.yaml                 # embedded local Ray on 127.0.0.1
    hetflow run examples/digits.yaml --address auto  # an existing cluster
    hetflow run examples/digits.yaml --fresh         # forget cached stages, run everything
    hetflow run examples/digits.yaml --dry-run       # what would run and where; starts nothing

Stages: prepare -> train -> tune (optional) -> export -> serve -> load test, each with a
progress bar and ETA. A re-run skips stages whose settings and inputs are unchanged and resumes
an interrupted training job from its checkpoint. At the end it prints the served model's
accuracy and P99 latency and where the report is (results/<run-id>/report.html).
Exit codes: 0 success, 1 a check failed (export.min_accuracy, load_test.max_p99_ms, load-test
errors) or a stage failed, 2 bad workflow file, 3 a stage cannot be placed.

Also runs as ``python -m hetflow.cli.run WORKFLOW.yaml``.
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

from hetflow.cli.main import add_tracking_flags, require
from hetflow.core.errors import InputError
from hetflow.runtime.session import check_reachable


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "run",
        help="run a workflow: data -> train -> tune -> export -> serve -> load test",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("workflow", metavar="WORKFLOW.yaml", help="workflow file (docs/workflow.md)")
    p.add_argument("--address", help="Ray cluster to join (default: the file's ray.address, "
                                     "else an embedded local Ray on 127.0.0.1)")
    p.add_argument("--fresh", action="store_true",
                   help="forget this workflow's cached stages and run every stage again")
    p.add_argument("--no-progress", action="store_true", help="no progress bars")
    p.add_argument("--dry-run", action="store_true",
                   help="print the Ray it would join or start, each stage's settings, where the training "
                        "ranks would go and which stages are cached; start nothing")
    p.add_argument("--json", action="store_true", help="with --dry-run: the same as JSON")
    add_tracking_flags(p)
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from hetflow.workflow.runner import run_workflow
    from hetflow.workflow.spec import load_workflow

    if args.address:  # before the file, whose reading imports the serving code (seconds)
        check_reachable(args.address)
    spec = load_workflow(args.workflow)
    if args.mlflow is not None or args.mlflow_experiment is not None:
        from hetflow.runtime.tracking import with_cli

        spec = spec.model_copy(update={"tracking": with_cli(spec.tracking, args.mlflow,
                                                            args.mlflow_experiment)})
    if args.dry_run:
        return dry_run(spec, args.address, args.json)
    if args.json:
        raise InputError("--json goes with --dry-run (a run prints its stages and writes a report)")
    require("torch", dataset=spec.train_config().dataset)
    if spec.tracking.enabled:
        require("mlflow")
    # no address: an embedded local Ray (RAY_ADDRESS is not read, docs/workflow.md)
    check_reachable(args.address or spec.ray.address or "local")
    result = run_workflow(spec, address=args.address, fresh=args.fresh,
                          progress=not args.no_progress and sys.stdout.isatty())
    for stage in result.stages:
        print(f"{stage.name:<10} {stage.status:<8} {stage.wall_s:6.1f} s  {stage.detail}")
    p99 = "-" if result.load.p99_ms is None else f"{result.load.p99_ms:.1f} ms"
    print(f"served model {spec.name} ({result.exported['precision']}): accuracy "
          f"{result.served_accuracy:.4f} on {result.prepared['val_samples']} "
          f"held-out samples, P99 latency {p99} at {result.load.rate:g} req/s "
          f"({result.load.ok}/{result.load.sent} ok)")
    if result.report_html is not None:
        print(f"report: {result.report_html}")
    print(f"wall time {result.wall_s:.1f} s; {'success' if result.ok else 'FAILED'}")
    for failure in result.failures:
        print(f"hetflow: check failed: {failure}", file=sys.stderr)
    return 0 if result.ok else 1


def dry_run(spec: Any, address: str | None, as_json: bool = False) -> int:
    """The run's Ray, its stages' settings and the training ranks' placement, starting nothing.
    Only the prepare stage's cache key can be known beforehand; later keys hash earlier outputs."""
    from pathlib import Path

    from hetflow.cli.dryrun import show, train_plan
    from hetflow.runtime.preview import preview_cluster
    from hetflow.workflow.cache import StageCache, stage_key

    config = spec.train_config()
    cluster = preview_cluster(address or spec.ray.address or "local", local_cpus=spec.ray.num_cpus)
    lines, data = train_plan(config, cluster, spec.name)
    cache = StageCache(Path(spec.cache_dir).absolute() / spec.name)
    prepared = cache.load("prepare", stage_key("prepare", spec.prepare_settings(), [])) is not None
    tune = spec.tune
    stages = {
        "prepare": f"{config.dataset}, {spec.prepare.val_fraction:g} held out, seed {spec.prepare.seed}"
                   + (" (cached: skipped)" if prepared else " (runs)"),
        "train": "the job below (skipped when its cached result matches)",
        "tune": (f"{tune.budget.trials} trials, {tune.budget.concurrent} at a time, {tune.search.algorithm} + "
                 f"{tune.search.scheduler}" if tune.enabled else "off"),
        "export": f"{spec.export.precision} from {spec.export.source}"
                  + (f", needs accuracy >= {spec.export.min_accuracy:g}" if spec.export.min_accuracy else ""),
        "serve": f"Ray Serve at http://{spec.serve.http.host}:{spec.serve.http.port}, {spec.serve.replicas} "
                 f"replica(s) on {spec.serve.devices.kind}"
                 + (", kept serving after the run" if spec.serve.keep_serving else ""),
        "load test": f"{spec.load_test.rate:g} req/s, at most {spec.load_test.max_requests} requests or "
                     f"{spec.load_test.max_duration_s:g} s"
                     + (f", P99 <= {spec.load_test.max_p99_ms:g} ms" if spec.load_test.max_p99_ms else ""),
    }
    job = [(k, v) for k, v in lines[1:] if k != "checkpoints"]
    lines = [lines[0], *[(f"stage {k}", v) for k, v in stages.items()], *job,
             ("checkpoints", f"{cache.root}/train/<key>/ (the workflow's cache)")]
    data["checkpoint_dir"] = f"{cache.root}/train/<key>"
    data.update(workflow=spec.name, stages=stages, prepare_cached=prepared,
                report=str(Path(spec.results_dir).absolute() / "<run-id>"))
    return show(lines, data, as_json)



def main(argv: list[str] | None = None) -> int:
    """``python -m hetflow.cli.run ...`` = ``hetflow run ...`` (same parser, same errors)."""
    from hetflow.cli.main import main as hetflow_main

    argv = list(sys.argv[1:] if argv is None else argv)
    argv.insert(0, "run")
    return hetflow_main(argv)


if __name__ == "__main__":
    sys.exit(main())
