"""``run_workflow(spec) -> WorkflowResult``: a workflow's stages, in order, on Ray.

    from hetflow.workflow.spec import load_workflow
    from hetflow.workflow.runner import run_workflow
    result = run_workflow(load_workflow("examples/digits.yaml"))
    print(result.served_accuracy, result.load.p99_ms, result.report_md)

**Cluster.** With no address (argument or ``ray.address``) an embedded local Ray is started
for the run (``ray.init(address="local")``, bound to 127.0.0.1) and stopped at the end; with
one, the run joins that cluster. Every stage takes the resources its section names, so the
same file runs on one CPU and on a GPU cluster.

**Stages and hand-offs.** ``prepare`` runs as a Ray task that returns the split's numpy arrays:
they land in Ray's object store once and every later consumer (the export stage's evaluation
task, the driver building the served-accuracy check and the load test's bodies) maps them
read-only without a copy (``ray.get`` of a numpy array is zero-copy). The training ranks get
the same object reference (``run_training(data=ref)``) and wrap the mapped arrays as torch
tensors with ``torch.from_numpy`` - no copy and no second load of the dataset. The prepare
stage's content hash keys the train stage, so a changed split retrains.
Checkpoints travel as directories (they must be on storage every worker reaches anyway).

**Resume.** Each stage's key hashes its settings and its inputs' content
(:mod:`hetflow.workflow.cache`); a completed stage with the same key is skipped. The train
stage's checkpoints live under its key, so an interrupted run resumes from the newest one
(``run_training`` does that). The tune stage continues an interrupted Tune experiment
(``run_tuning(resume=True)``). Serve and the load test always run: they measure the live
service.

**Result.** The served model's accuracy (the held-out split sent over HTTP), the load test's
latencies, and a report in ``<results_dir>/<run-id>/`` (:mod:`hetflow.workflow.report`).
``WorkflowResult.ok`` is False when a check named in the file failed (``export.min_accuracy``,
``load_test.max_p99_ms``) or the load test saw errors.
"""

from __future__ import annotations

import json
import os
import shutil
import threading
import time
import urllib.request
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterator

import numpy as np

from hetflow.workflow.cache import StageCache, hash_bytes, hash_tree, stage_key
from hetflow.workflow.spec import WorkflowSpec

STAGES = ("prepare", "train", "tune", "export", "serve", "load_test")


@dataclass
class StageOutcome:
    """What one stage did in this run."""

    name: str
    status: str  # ran | skipped (unchanged) | off (not enabled) | failed
    key: str = ""  # cache key ("" for stages that are never cached)
    wall_s: float = 0.0
    detail: str = ""  # one line for the summary


@dataclass
class WorkflowResult:
    """A finished run."""

    run_id: str
    results_dir: Path
    stages: list[StageOutcome]
    prepared: dict[str, Any]  # prepare's record: sizes, content hash
    trained: dict[str, Any]  # train's record: metrics, losses, checkpoint
    tuned: dict[str, Any] | None  # tune's record (None when off)
    exported: dict[str, Any]  # export's record: source, precision, accuracy, checkpoint
    served_accuracy: float  # the held-out split sent over HTTP to the served model
    load: Any  # LoadResult of the load test
    url: str  # the served model's predict URL (gone unless serve.keep_serving)
    failures: list[str] = field(default_factory=list)  # checks that failed
    wall_s: float = 0.0
    utilisation: list[dict[str, Any]] = field(default_factory=list)  # host device samples
    report_md: Path | None = None
    report_html: Path | None = None

    @property
    def ok(self) -> bool:
        return not self.failures

    def stage(self, name: str) -> StageOutcome:
        return next(s for s in self.stages if s.name == name)


# --- Ray -------------------------------------------------------------------------------------


@contextmanager
def ray_session(spec: WorkflowSpec, address: str | None) -> Iterator[bool]:
    """Join ``address`` (or ``spec.ray.address``), or start an embedded local Ray (Ray's own
    node IP, as a user's ``ray.init()``) for the duration. Yields True when it started Ray
    here (and stops it after)."""
    from hetflow.runtime.session import ray_loopback_mode

    ray_loopback_mode(address or spec.ray.address)
    import ray

    from hetflow.workloads.serve.front import FAST_ENV

    address = address or spec.ray.address
    started = False
    saved: dict[str, str | None] = {}
    if not ray.is_initialized():
        if address in (None, "local"):
            from hetflow.core.units import parse_bytes

            # Serve's direct ingress for the serve stage: read by the processes of the Ray
            # started here, so set for its start and given back after (a caller that later
            # starts another Ray in this process must not inherit it).
            saved = {key: os.environ.get(key) for key in FAST_ENV}
            for key, value in FAST_ENV.items():
                os.environ.setdefault(key, value)
            store = spec.ray.object_store_memory
            try:
                ray.init(address="local", num_cpus=spec.ray.num_cpus, include_dashboard=False,
                         log_to_driver=False,
                         object_store_memory=parse_bytes(store) if store else None)
            except BaseException:
                _restore_environ(saved)
                raise
        else:
            ray.init(address=address, log_to_driver=False)
        started = True
    try:
        yield started
    finally:
        if started:
            ray.shutdown()
            _restore_environ(saved)


def _restore_environ(saved: dict[str, str | None]) -> None:
    for key, value in saved.items():
        if value is None:
            os.environ.pop(key, None)
        else:
            os.environ[key] = value


def _prepare_arrays(train: dict[str, Any], cached: str | None,
                    out: str) -> tuple[dict[str, np.ndarray], str]:
    """The prepare stage's task: the split as numpy arrays (from the cache file when given,
    else the train stage's split - its model spec's dataset or ``data.loader`` - then saved)
    and their content hash. Runs in a Ray worker
    with two return values: the arrays go into the object store as one object that every
    later stage maps, the hash is small and keys the later stages."""
    if cached is not None:
        with np.load(cached) as f:
            arrays = {k: np.ascontiguousarray(f[k]) for k in f.files}
    else:
        from hetflow.workloads.train.config import config_from_dict
        from hetflow.workloads.train.data import load_split, split_arrays

        arrays = split_arrays(load_split(config_from_dict(train, source="train")))
        Path(out).parent.mkdir(parents=True, exist_ok=True)
        tmp = out + ".tmp.npz"
        np.savez(tmp, **arrays)
        os.replace(tmp, out)
    content = hash_bytes(*(k.encode() + np.ascontiguousarray(v).tobytes()
                           for k, v in sorted(arrays.items())))
    return arrays, content


def _evaluate(spec: Any, arrays: dict[str, np.ndarray]) -> float:
    """The export stage's task: accuracy of the model at its serving precision on the held-out
    split (``arrays``, the prepare task's first return value, arrives from the object store as
    read-only views of the store's buffers, not copies)."""
    from hetflow.workloads.serve.inference import accuracy, build_runner

    runner = build_runner(spec)
    return accuracy(runner, arrays["val_inputs"], arrays["val_targets"])


# --- progress --------------------------------------------------------------------------------


class StageBars:
    """One rich progress bar per stage with elapsed time and ETA (or nothing when quiet)."""

    def __init__(self, enabled: bool) -> None:
        self.progress: Any = None
        self.tasks: dict[str, Any] = {}
        if enabled:
            from rich.progress import (BarColumn, MofNCompleteColumn, Progress, TextColumn,
                                       TimeElapsedColumn, TimeRemainingColumn)

            self.progress = Progress(
                TextColumn("{task.description:<9}"), BarColumn(bar_width=24), MofNCompleteColumn(),
                TimeElapsedColumn(), TextColumn("eta"), TimeRemainingColumn(),
                TextColumn("{task.fields[note]}"), transient=False)

    def __enter__(self) -> "StageBars":
        if self.progress is not None:
            self.progress.start()
            for name in STAGES:
                self.tasks[name] = self.progress.add_task(name, total=None, start=False, note="")
        return self

    def __exit__(self, *exc: Any) -> None:
        if self.progress is not None:
            self.progress.stop()

    def start(self, stage: str, total: float | None, note: str = "") -> None:
        if self.progress is not None:
            self.progress.reset(self.tasks[stage], total=total, completed=0, note=note)
            self.progress.start_task(self.tasks[stage])

    def update(self, stage: str, completed: float, note: str | None = None) -> None:
        if self.progress is not None:
            extra = {} if note is None else {"note": note[:48]}
            self.progress.update(self.tasks[stage], completed=completed, **extra)

    def finish(self, stage: str, note: str) -> None:
        if self.progress is not None:
            task = self.tasks[stage]
            total = self.progress.tasks[task].total or 1
            short = note if len(note) <= 48 else note[:47] + "…"
            self.progress.update(task, total=total, completed=total, note=short)
            self.progress.stop_task(task)


# --- the stages ------------------------------------------------------------------------------


class _Run:
    """The state of one run while its stages go (one method per stage)."""

    def __init__(self, spec: WorkflowSpec, bars: StageBars, tracker: Any | None = None) -> None:
        self.spec = spec
        self.bars = bars
        self.tracker = tracker  # the run's MLflow run (spec.tracking), or None
        self.cache = StageCache(Path(spec.cache_dir).absolute() / spec.name)
        self.outcomes: list[StageOutcome] = []
        self.failures: list[str] = []

    def _done(self, name: str, status: str, key: str, t0: float, detail: str) -> None:
        self.outcomes.append(StageOutcome(name, status, key, time.time() - t0, detail))
        self.bars.finish(name, f"{status}: {detail}" if detail else status)
        if self.tracker is not None:
            self.tracker.set_tags({f"hetflow.stage.{name}": status})
            self.tracker.log_metrics({f"stage.{name}.wall_s": time.time() - t0})

    @contextmanager
    def _stage_run(self, name: str) -> Iterator[Any]:
        """A nested MLflow run for a stage (None without tracking), ended with the stage."""
        if self.tracker is None:
            yield None
            return
        from hetflow.runtime.tracking import status_of

        child = self.tracker.child(name, name)
        failure: BaseException | None = None
        try:
            yield child
        except BaseException as exc:
            failure = exc
            raise
        finally:
            child.finish(status_of(failure))

    def prepare(self) -> tuple[dict[str, Any], Any]:
        import ray

        t0 = time.time()
        settings = self.spec.prepare_settings()
        key = stage_key("prepare", settings, [])
        record = self.cache.load("prepare", key)
        out = self.cache.dir("prepare", key) / "data.npz"
        self.bars.start("prepare", 1)
        task = ray.remote(num_cpus=0.1, num_returns=2)(_prepare_arrays)
        ref, hash_ref = task.remote(self.spec.train_config().model_dump(mode="json"),
                                    str(out) if record is not None and out.exists() else None,
                                    str(out))
        # The arrays stay in the object store (the task's first return value); later stages -
        # the training ranks included - get ``ref`` and map them, as this process does here.
        arrays, content_hash = ray.get([ref, hash_ref])
        status = "skipped" if record is not None else "ran"
        if record is None or record.get("content_hash") != content_hash:
            record = {"content_hash": content_hash, "dataset": settings["dataset"],
                      "train_samples": len(arrays["train_targets"]),
                      "val_samples": len(arrays["val_targets"])}
            self.cache.save("prepare", key, record)
        self._done("prepare", status, key, t0,
                   f"{record['train_samples']} train / {record['val_samples']} val")
        return record, ref

    def train(self, prepared: dict[str, Any], arrays_ref: Any = None) -> dict[str, Any]:
        from hetflow.workloads.train.checkpoint import latest_checkpoint
        from hetflow.workloads.train.job import run_training

        t0 = time.time()
        settings = {"train": self.spec.train.model_dump(mode="json"),
                    "prepare": self.spec.prepare_settings()}
        key = stage_key("train", settings, [prepared["content_hash"]])
        record = self.cache.load("train", key)
        total = self.spec.train.train.steps
        self.bars.start("train", total)
        if record is not None:
            with self._stage_run("train") as child:
                if child is not None:  # the cached result, logged as the stage's run
                    _log_cached_training(child, record)
            self._done("train", "skipped", key, t0,
                       f"val_accuracy {record['metrics'].get('val_accuracy', 0):.3f}")
            return record
        checkpoints = self.cache.dir("train", key) / "checkpoints"
        config = self.spec.train_config(str(checkpoints))
        before = latest_checkpoint(checkpoints)

        def on_progress(rec: dict[str, Any], job: Any) -> None:
            self.bars.update("train", rec["step"], f"loss {rec['loss']:.3f}")

        # The ranks map the prepare stage's arrays from the object store (no second load).
        with self._stage_run("train") as child:
            result = run_training(config, on_progress=on_progress, data=arrays_ref, tracker=child)
        record = {
            "checkpoint": result.checkpoint,
            "checkpoint_hash": hash_tree(Path(result.checkpoint)),
            "train_config": config.model_dump(mode="json"),
            "metrics": result.metrics,
            "losses": {str(k): v for k, v in result.losses.items()},
            "resumed_from_step": before.step if before else None,
            "restarts": result.restarts,
            "samples_per_s": result.samples_per_s,
            "wall_s": result.wall_s,
            "placement": result.placement,
        }
        self.cache.save("train", key, record)
        resumed = f", resumed from step {before.step}" if before else ""
        self._done("train", "ran", key, t0,
                   f"val_accuracy {result.metrics.get('val_accuracy', 0):.3f}{resumed}")
        return record

    def tune(self, prepared: dict[str, Any], arrays_ref: Any = None) -> dict[str, Any] | None:
        t0 = time.time()
        if not self.spec.tune.enabled:
            self.bars.start("tune", 1)
            self._done("tune", "off", "", t0, "")
            return None
        from hetflow.workflow.tune_progress import TrialsDone
        from hetflow.workloads.tune.runner import EXPERIMENT_DIR, run_tuning

        settings = {"tune": self.spec.tune.model_dump(mode="json"),
                    "train": self.spec.train.model_dump(mode="json",
                                                        exclude={"layout", "checkpoint"}),
                    "prepare": self.spec.prepare_settings()}
        key = stage_key("tune", settings, [prepared["content_hash"]])
        record = self.cache.load("tune", key)
        trials = self.spec.tune.budget.trials
        self.bars.start("tune", trials)
        if record is not None:
            with self._stage_run("tune") as child:
                if child is not None:
                    child.set_tags({"hetflow.cached": "true"})
                    child.log_metrics({f"best_{record['metric']}": record["best_value"],
                                       "trials": record["trials"]})
            self._done("tune", "skipped", key, t0, f"best {_fmt(record['best_value'])}")
            return record
        out = self.cache.dir("tune", key) / "out"
        config = self.spec.tuning_config(str(out))
        resume = (out / EXPERIMENT_DIR).exists()
        done = TrialsDone(lambda n: self.bars.update("tune", n))
        with self._stage_run("tune") as child:
            result = run_tuning(config, resume=resume, quiet=True, callbacks=[done], data=arrays_ref,
                                tracker=child)
        best_train = (_read_yaml(result.best_config_path) if result.best_config_path else None)
        checkpoint = (_step_dir(result.best_checkpoint_path)
                      if result.best_checkpoint_path else None)
        record = {
            "metric": result.metric,
            "best_value": result.best.best if result.best else None,
            "best_checkpoint": str(checkpoint) if checkpoint else None,
            "checkpoint_hash": hash_tree(checkpoint) if checkpoint else None,
            "best_train_config": best_train,
            "plot": str(result.plot_path) if result.plot_path else None,
            "curves": {t.trial_id: [c.get(result.metric) for c in t.curve] for t in result.trials},
            "trials": len(result.trials),
            "stopped_early": len(result.stopped_early),
            "resumed": resume,
        }
        self.cache.save("tune", key, record)
        self._done("tune", "ran", key, t0,
                   f"best {result.metric} {_fmt(record['best_value'])}, "
                   f"{len(result.trials)} trials")
        return record

    def export(self, prepared: dict[str, Any], trained: dict[str, Any],
               tuned: dict[str, Any] | None, arrays_ref: Any) -> dict[str, Any]:
        import ray

        from hetflow.workloads.serve.inference import ReplicaSpec

        t0 = time.time()
        e = self.spec.export
        source, checkpoint, train_dict, chash = self._choose(trained, tuned)
        key = stage_key("export", e.model_dump(mode="json"), [chash, prepared["content_hash"]])
        record = self.cache.load("export", key)
        self.bars.start("export", 1)
        if record is None:
            target = self.cache.dir("export", key) / "checkpoints"
            shutil.rmtree(target, ignore_errors=True)
            shutil.copytree(checkpoint, target / Path(checkpoint).name)
            replica = ReplicaSpec(self.spec.name, train_dict, str(target), e.precision,
                                  "cpu" if e.precision == "int8" else self.spec.serve.devices.kind)
            accuracy = ray.get(ray.remote(num_cpus=e.cpus)(_evaluate).remote(replica, arrays_ref))
            record = {"source": source, "precision": e.precision, "accuracy": accuracy,
                      "checkpoint_dir": str(target), "train_config": train_dict,
                      "content_hash": hash_tree(target)}
            self.cache.save("export", key, record)
            status = "ran"
        else:
            status = "skipped"
        if e.min_accuracy is not None and record["accuracy"] < e.min_accuracy:
            self.failures.append(f"export: accuracy {record['accuracy']:.3f} at "
                                 f"{e.precision} is below export.min_accuracy {e.min_accuracy}")
        self._done("export", status, key, t0,
                   f"{record['source']} at {e.precision}: accuracy {record['accuracy']:.3f}")
        if self.tracker is not None:
            self.tracker.log_metrics({"export_accuracy": record["accuracy"]})
            self.tracker.set_tags({"hetflow.export.source": record["source"],
                                   "hetflow.export.precision": e.precision})
        return record

    def _choose(self, trained: dict[str, Any],
                tuned: dict[str, Any] | None) -> tuple[str, str, dict[str, Any], str]:
        """(source, checkpoint step dir, its training config, its content hash)."""
        from_train = ("train", trained["checkpoint"], trained["train_config"],
                      trained["checkpoint_hash"])
        usable_tune = tuned is not None and tuned.get("best_checkpoint") and tuned.get(
            "best_train_config")
        if not usable_tune:
            return from_train
        from_tune = ("tune", tuned["best_checkpoint"], tuned["best_train_config"],
                     tuned["checkpoint_hash"])
        if self.spec.export.source == "tune":
            return from_tune
        if self.spec.export.source == "train":
            return from_train
        # best: compare on the metric both report (validation accuracy of the digits MLP)
        tune_score = tuned["best_value"] if tuned["metric"] == "val_accuracy" else None
        train_score = trained["metrics"].get("val_accuracy")
        if tune_score is not None and train_score is not None and tune_score > train_score:
            return from_tune
        return from_train

    def serve_and_load(self, exported: dict[str, Any],
                       arrays_ref: Any) -> tuple[float, Any, str, Any]:
        import ray

        from hetflow.workloads.serve.app import deploy

        t0 = time.time()
        self.bars.start("serve", 1)
        config = self.spec.serve_config(exported["checkpoint_dir"], exported["train_config"])
        served = deploy(config)
        url = f"{served.url}/v1/models/{self.spec.name}/predict"
        try:
            arrays = ray.get(arrays_ref)  # read-only views of the store's buffers
            served_accuracy = served_accuracy_of(url, arrays["val_inputs"], arrays["val_targets"],
                                                 self.spec.serve.limits.max_rows)
            self._done("serve", "ran", "", t0, f"{url}  accuracy {served_accuracy:.3f}")
            load = self._load_test(url, arrays["val_inputs"])
            if self.spec.serve.keep_serving:
                _wait_forever(url)
        finally:
            if not self.spec.serve.keep_serving:
                served.shutdown()
        return served_accuracy, load, url, served

    def _load_test(self, url: str, val_inputs: np.ndarray) -> Any:
        from hetflow.workloads.serve.loadgen import run_load

        t0 = time.time()
        lt = self.spec.load_test
        bodies = request_bodies(val_inputs, lt.rows)
        self.bars.start("load_test", lt.max_duration_s)
        box: dict[str, Any] = {}

        def go() -> None:
            try:
                box["result"] = run_load(url, bodies, lt.rate, max_requests=lt.max_requests,
                                         max_duration_s=lt.max_duration_s, timeout_s=lt.timeout_s)
            except BaseException as exc:  # noqa: BLE001 - re-raised in the caller's thread
                box["error"] = exc

        worker = threading.Thread(target=go, name="load-test", daemon=True)
        worker.start()
        while worker.is_alive():
            worker.join(0.25)
            self.bars.update("load_test", min(time.time() - t0, lt.max_duration_s))
        if "error" in box:
            raise box["error"]
        load = box["result"]
        if load.error_count:
            self.failures.append(f"load_test: {load.error_count} of {load.sent} requests failed "
                                 f"({load.errors})")
        if lt.max_p99_ms is not None and (load.p99_ms is None or load.p99_ms > lt.max_p99_ms):
            self.failures.append(f"load_test: P99 {load.p99_ms} ms is above load_test.max_p99_ms "
                                 f"{lt.max_p99_ms}")
        p99 = "-" if load.p99_ms is None else f"{load.p99_ms:.1f} ms"
        self._done("load_test", "ran", "", t0,
                   f"{load.ok}/{load.sent} ok, {load.achieved_qps:.0f}/s, p99 {p99}")
        return load


def request_bodies(inputs: np.ndarray, rows: int, count: int = 64) -> list[bytes]:
    """``count`` JSON predict bodies of ``rows`` held-out images each, in a fixed order."""
    bodies = []
    for i in range(count):
        picks = [inputs[(i * rows + r) % len(inputs)].round(4).tolist() for r in range(rows)]
        bodies.append(json.dumps({"inputs": picks}).encode())
    return bodies


def served_accuracy_of(url: str, inputs: np.ndarray, targets: np.ndarray, max_rows: int) -> float:
    """Accuracy of the served model on ``inputs``: each chunk of ``max_rows`` rows is one HTTP
    request, and the answer's predictions are compared with ``targets``."""
    correct = 0
    for start in range(0, len(inputs), max_rows):
        body = json.dumps({"inputs": inputs[start:start + max_rows].round(6).tolist()}).encode()
        request = urllib.request.Request(url, data=body,
                                         headers={"content-type": "application/json"})
        with urllib.request.urlopen(request, timeout=30) as answer:  # noqa: S310 - loopback
            predictions = json.loads(answer.read())["predictions"]
        correct += int((np.asarray(predictions) == targets[start:start + max_rows]).sum())
    return correct / len(inputs)


def _fmt(value: float | None) -> str:
    return "-" if value is None else f"{value:.3f}"


def _wait_forever(url: str) -> None:
    print(f"serving at {url}; Ctrl-C stops it", flush=True)
    while True:
        time.sleep(3600)


def _read_yaml(path: Path) -> dict[str, Any]:
    import yaml

    return yaml.safe_load(Path(path).read_text())


def _step_dir(path: Path) -> Path | None:
    """The checkpoint step directory at or under ``path``."""
    from hetflow.workloads.train.checkpoint import COMPLETE, latest_checkpoint

    info = latest_checkpoint(path)
    if info is not None:
        return info.path
    return Path(path) if (Path(path) / COMPLETE).is_file() else None


def new_run_id(name: str) -> str:
    return f"{name}-{time.strftime('%Y%m%d-%H%M%S')}-{os.getpid() % 10000:04d}"


def run_workflow(spec: WorkflowSpec, address: str | None = None, *, fresh: bool = False,
                 progress: bool = True, report: bool = True) -> WorkflowResult:
    """Run every stage of ``spec`` (skipping unchanged ones) and write the report.

    ``address``: a Ray cluster to join (default ``spec.ray.address``, else an embedded local
    Ray). ``fresh``: forget this workflow's cached stages first (``<cache_dir>/<name>``), so
    every stage runs from scratch. ``progress``: rich progress bars on the terminal.
    Raises InputError / Unschedulable / TrainingFailed / ServeFailed when a stage cannot run;
    checks that fail (accuracy, P99, load errors) are in ``result.failures`` instead.
    """
    t0 = time.time()
    if fresh:
        shutil.rmtree(Path(spec.cache_dir).absolute() / spec.name, ignore_errors=True)
    run_id = new_run_id(spec.name)
    results_dir = Path(spec.results_dir).absolute() / run_id
    from hetflow.workflow.utilisation import UtilisationRecorder

    tracker = None
    if spec.tracking.mlflow is not None:  # before Ray: a bad URI is exit 2 at once
        from hetflow.runtime.tracking import Tracker

        tracker = Tracker.start(spec.tracking.mlflow, spec.name, kind="workflow", run_name=run_id)
        tracker.log_params(spec.model_dump(mode="json", exclude={"tracking"}))
        tracker.set_tags({"hetflow.run_id": run_id})
    status = "FAILED"
    try:
        with UtilisationRecorder() as util, ray_session(spec, address), StageBars(progress) as bars:
            run = _Run(spec, bars, tracker)
            util.stage = "prepare"
            prepared, arrays_ref = run.prepare()
            util.stage = "train"
            trained = run.train(prepared, arrays_ref)
            util.stage = "tune"
            tuned = run.tune(prepared, arrays_ref)
            util.stage = "export"
            exported = run.export(prepared, trained, tuned, arrays_ref)
            util.stage = "serve"
            served_accuracy, load, url, _ = run.serve_and_load(exported, arrays_ref)
        result = WorkflowResult(run_id, results_dir, run.outcomes, prepared, trained, tuned,
                                exported, served_accuracy, load, url, run.failures,
                                wall_s=time.time() - t0, utilisation=list(util.samples))
        if report:
            from hetflow.workflow.report import write_report

            result.report_md, result.report_html = write_report(result, spec)
        if tracker is not None:
            _log_workflow_result(tracker, result)
        status = "FINISHED" if result.ok else "FAILED"
        return result
    except KeyboardInterrupt:
        status = "KILLED"
        raise
    finally:
        if tracker is not None:
            tracker.finish(status)


def _log_cached_training(tracker: Any, record: dict[str, Any]) -> None:
    """A skipped (cached) train stage as its run: the config it ran with, its loss curve,
    metrics and placement from the cache record, and its checkpoint."""
    from hetflow.workloads.train.config import config_from_dict
    from hetflow.workloads.train.job import log_training_start

    log_training_start(tracker, config_from_dict(record["train_config"], source="cache"))
    losses = {int(k): v for k, v in record["losses"].items()}
    tracker.log_metric_rows([(step, {"train_loss": loss}) for step, loss in sorted(losses.items())])
    if losses:
        tracker.log_metrics({**record["metrics"], "samples_per_s": record.get("samples_per_s")},
                            step=max(losses))
    tracker.set_tags({"hetflow.cached": "true", "hetflow.placement": record.get("placement")})
    tracker.log_artifacts(record["checkpoint"], "checkpoint")


def _log_workflow_result(tracker: Any, result: WorkflowResult) -> None:
    """The served model's accuracy and latencies, the checks, and the report as artifacts."""
    load = result.load
    tracker.log_metrics({"served_accuracy": result.served_accuracy, "load_p50_ms": load.p50_ms,
                         "load_p99_ms": load.p99_ms, "load_achieved_qps": load.achieved_qps,
                         "load_errors": load.error_count, "wall_s": result.wall_s})
    tracker.set_tags({"hetflow.ok": result.ok,
                      **({"hetflow.failures": "; ".join(result.failures)} if result.failures else {})})
    if result.report_md is not None:
        tracker.log_artifacts(result.results_dir, "report")


__all__ = ["STAGES", "StageOutcome", "WorkflowResult", "new_run_id", "ray_session",
           "request_bodies", "run_workflow", "served_accuracy_of"]
