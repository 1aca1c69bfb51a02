"""Experiment tracking: a hetflow run as an MLflow run (optional; off by default).

    hetflow train examples/train_digits.yaml --mlflow sqlite:///mlflow.db
    hetflow tune examples/tune_digits.yaml --mlflow "$MLFLOW_TRACKING_URI" --mlflow-experiment digits

or in a config file (training, tuning or workflow YAML; ``hetflow launch`` takes the flags)::

    tracking:
      mlflow: {uri: sqlite:///mlflow.db, experiment: digits}

One :class:`Tracker` per run, in the driver only (the process that runs ``hetflow ...``): the
ranks and trials never talk to MLflow, so a slow or broken tracking store cannot stall a
collective. Everything after the run is created goes through one background thread; a failure
to log is warned once (``hetflow: warning: MLflow ...``) and never fails the run. At the end
:meth:`Tracker.finish` waits a bounded time (``FLUSH_TIMEOUT_S``) for what is queued.

Why a thread of our own rather than MLflow's asynchronous logging (``log_batch(...,
synchronous=False)``): MLflow's queue reports every failed batch at ERROR level and its flush has
no time limit; a training job should see one warning and end on time when the store is gone.

What each verb logs is in docs/tracking.md. Resolution, as MLflow users expect: the URI from
``--mlflow``, else ``tracking.mlflow.uri``, else ``MLFLOW_TRACKING_URI``, else MLflow's default
(``sqlite:///mlflow.db`` in the current directory); the experiment from ``--mlflow-experiment``,
else ``tracking.mlflow.experiment``, else ``MLFLOW_EXPERIMENT_NAME``, else the job's name.
Relative file and SQLite paths are made absolute, so ranks and trials in other directories (and
a user's script under ``hetflow launch``) reach the same store.
"""

from __future__ import annotations

import json
import os
import queue
import sys
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from hetflow.core.errors import InputError

FLUSH_TIMEOUT_S = 120.0  # at the end, how long queued logging (checkpoint uploads) may still take
PARENT_TAG = "mlflow.parentRunId"  # MLflow's nested-run convention (the UI nests by it)
MAX_PARAM_CHARS = 6000  # MLflow's limit on a parameter value
MAX_TAG_CHARS = 8000  # ... and on a tag value
# Environment that a launched script's MLflow client reads (the names `mlflow run` sets for a
# project's entry point): ``mlflow.start_run()`` then continues hetflow's run instead of
# starting one of its own.
RUN_ENV = ("MLFLOW_TRACKING_URI", "MLFLOW_RUN_ID", "MLFLOW_EXPERIMENT_ID", "MLFLOW_EXPERIMENT_NAME")
# A tracking server that does not answer must not hold the start of a run for minutes (MLflow's
# defaults: 7 retries with back-off, 120 s per request); a user's own settings win.
HTTP_DEFAULTS = {"MLFLOW_HTTP_REQUEST_MAX_RETRIES": "2", "MLFLOW_HTTP_REQUEST_TIMEOUT": "10"}


class MLflowSettings(BaseModel):
    """Where a run is logged in MLflow."""

    model_config = ConfigDict(extra="forbid", frozen=True, use_attribute_docstrings=True)

    uri: str | None = None
    """Tracking URI: ``sqlite:///mlflow.db``, ``http://host:5000``, ``databricks``, or a
    file store (``file:///path``; MLflow 3 wants ``MLFLOW_ALLOW_FILE_STORE=true`` for it).
    Default: ``MLFLOW_TRACKING_URI``, else MLflow's default, ``sqlite:///mlflow.db`` in the
    current directory. Relative paths are taken from the current directory."""
    experiment: str | None = Field(None, min_length=1)
    """Experiment name (created when missing). Default: ``MLFLOW_EXPERIMENT_NAME``, else the
    job's name."""
    run_name: str | None = Field(None, min_length=1)
    """Name of the run. Default: the job's name (a workflow: its run id)."""
    tags: dict[str, str] = Field(default_factory=dict)
    """Extra tags on the run."""
    artifacts: bool = True
    """Log files as artifacts: the final checkpoint, the config, reports, a launch's rank logs.
    ``false``: parameters, metrics, tags and the placement only."""


class TrackingConfig(BaseModel):
    """Experiment tracking (off unless a backend is given)."""

    model_config = ConfigDict(extra="forbid", frozen=True, use_attribute_docstrings=True)

    mlflow: MLflowSettings | None = None
    """Log this run to MLflow (``{}``: every setting from MLflow's environment variables)."""

    @property
    def enabled(self) -> bool:
        return self.mlflow is not None


def with_cli(tracking: TrackingConfig | None, uri: str | None,
             experiment: str | None) -> TrackingConfig:
    """``tracking`` with ``--mlflow URI`` / ``--mlflow-experiment NAME`` applied (either turns
    tracking on)."""
    tracking = tracking or TrackingConfig()
    if uri is None and experiment is None:
        return tracking
    if uri is not None and not uri.strip():
        raise InputError("--mlflow: empty URI; give one, e.g. --mlflow sqlite:///mlflow.db "
                         "(or --mlflow \"$MLFLOW_TRACKING_URI\")")
    base = tracking.mlflow or MLflowSettings()
    update = {k: v for k, v in (("uri", uri), ("experiment", experiment)) if v is not None}
    return TrackingConfig(mlflow=base.model_copy(update=update))


def absolute_uri(uri: str) -> str:
    """Relative SQLite and file-store paths made absolute (other URIs unchanged)."""
    if uri.startswith("sqlite:///") and not uri.startswith("sqlite:////"):
        rest = uri[len("sqlite:///"):]
        if rest and not rest.startswith(":memory:"):
            return "sqlite:///" + str(Path(rest).absolute())
        return uri
    if uri.startswith("file:"):
        rest = uri[len("file:"):]
        if rest.startswith("//"):
            return uri  # file:///abs or file://host/path
        return Path(rest).absolute().as_uri()
    if "://" not in uri and ":" not in uri.split("/")[0] and uri not in ("databricks",):
        return Path(uri).absolute().as_uri()  # a bare path: MLflow's file store
    return uri


@dataclass(frozen=True)
class Target:
    """Where the runs go, resolved (URI absolute, experiment named)."""

    uri: str
    experiment: str
    run_name: str
    tags: dict[str, str]
    artifacts: bool


def resolve(settings: MLflowSettings, job_name: str, run_name: str | None = None) -> Target:
    """The URI and experiment of ``settings`` with MLflow's environment variables and
    defaults (see the module docstring); the run is named ``settings.run_name``, else
    ``run_name``, else ``job_name``."""
    uri = settings.uri or os.environ.get("MLFLOW_TRACKING_URI")
    if not uri:
        uri = "sqlite:///mlflow.db"  # MLflow 3's own default, made absolute below
    experiment = settings.experiment or os.environ.get("MLFLOW_EXPERIMENT_NAME") or job_name
    return Target(absolute_uri(uri.strip()), experiment, settings.run_name or run_name or job_name,
                  dict(settings.tags), settings.artifacts)


MISSING_MLFLOW = ("MLflow is not installed and tracking is on (--mlflow or tracking.mlflow); "
                  "pip install 'mlflow-skinny>=3.1' (hetflow's `tracking` extra: "
                  "pip install -e '.[tracking]' in a hetflow checkout), or turn tracking off")


def require_mlflow() -> None:
    """MLflow importable, else the InputError with the install line (exit 2)."""
    import importlib.util

    try:
        found = importlib.util.find_spec("mlflow") is not None
    except (ImportError, ValueError):
        found = False
    if not found:
        raise InputError(MISSING_MLFLOW)


def flatten(data: Mapping[str, Any], prefix: str = "") -> dict[str, str]:
    """``{"train": {"lr": 0.1}}`` -> ``{"train.lr": "0.1"}`` (lists as JSON, None left out)."""
    out: dict[str, str] = {}
    for key, value in data.items():
        name = f"{prefix}{key}"
        if isinstance(value, Mapping) and value:
            out.update(flatten(value, name + "."))
        elif value is None or value == {}:
            continue
        else:
            text = value if isinstance(value, str) else json.dumps(value, default=str)
            out[name] = text[:MAX_PARAM_CHARS]
    return out


def _warn(message: str) -> None:
    print(f"hetflow: warning: {message}", file=sys.stderr, flush=True)


class _Worker:
    """One background thread that runs logging calls in order; the first failure is warned,
    later ones are counted."""

    def __init__(self) -> None:
        self.queue: queue.Queue[Callable[[], None] | None] = queue.Queue()
        self.failed = 0
        self.warned = False
        self.thread = threading.Thread(target=self._loop, name="hetflow-mlflow", daemon=True)
        self.thread.start()

    def _loop(self) -> None:
        while True:
            call = self.queue.get()
            try:
                if call is None:
                    return
                call()
            except Exception as exc:  # noqa: BLE001 - logging must never fail the run
                self.failure(exc)
            finally:
                self.queue.task_done()

    def failure(self, exc: BaseException) -> None:
        self.failed += 1
        if not self.warned:
            self.warned = True
            text = " ".join(str(exc).split())[:300] or type(exc).__name__
            _warn(f"MLflow logging failed ({type(exc).__name__}: {text}); the run goes on, "
                  "further MLflow errors are not shown")

    def submit(self, call: Callable[[], None]) -> None:
        self.queue.put(call)

    def drain(self, timeout_s: float) -> bool:
        """Wait until every queued call ran, at most ``timeout_s``; True when all did."""
        deadline = time.monotonic() + timeout_s
        while self.queue.unfinished_tasks:
            if time.monotonic() > deadline:
                return False
            time.sleep(0.02)
        return True

    def stop(self) -> None:
        self.queue.put(None)


class Tracker:
    """One MLflow run, logged from this process. Every method returns at once (the work is
    queued) and never raises; see the module docstring. ``run_id`` is None when the run could
    not be created (then nothing is logged; one warning said why)."""

    def __init__(self, target: Target, client: Any, run_id: str | None, experiment_id: str | None,
                 worker: _Worker, owner: bool = True) -> None:
        self.target = target
        self.client = client
        self.run_id = run_id
        self.experiment_id = experiment_id
        self._worker = worker
        self._owner = owner  # stops the worker at finish (children share their parent's)
        self._finished = False

    # -- creating ------------------------------------------------------------------------------

    @classmethod
    def start(cls, settings: MLflowSettings, job_name: str, *, kind: str,
              parent: "Tracker | None" = None, run_id: str | None = None,
              run_name: str | None = None) -> "Tracker":
        """Create the run (in ``parent``'s experiment, nested under it, when given; continue
        ``run_id`` when given). Synchronous, before the work starts: a URI MLflow cannot use or
        a store it cannot reach is an InputError (exit 2). A child that cannot be created, and
        anything that fails later, only warns."""
        for key, value in HTTP_DEFAULTS.items():
            os.environ.setdefault(key, value)
        target = resolve(settings, job_name, run_name)
        if parent is not None:
            target = Target(parent.target.uri, parent.target.experiment, job_name,
                            dict(parent.target.tags), parent.target.artifacts)
            client, worker = parent.client, parent._worker
        else:
            require_mlflow()
            client = _client(target.uri)
            worker = _Worker()
        tracker = cls(target, client, None, None, worker, owner=parent is None)
        try:
            tracker._create(kind, parent, run_id)
        except Exception as exc:  # noqa: BLE001 - MLflow raises MlflowException and others
            if parent is not None:  # the parent's run exists: only this child is lost
                worker.failure(exc)
                return tracker
            worker.stop()
            text = " ".join(str(exc).split())[:400]
            raise InputError(f"MLflow tracking URI {target.uri}: cannot create the run "
                             f"({type(exc).__name__}: {text}); check the URI and that the "
                             "store is reachable, or turn tracking off") from None
        return tracker

    def _create(self, kind: str, parent: "Tracker | None", run_id: str | None) -> None:
        from hetflow import __version__

        if parent is not None:
            if parent.run_id is None:
                return
            self.experiment_id = parent.experiment_id
        else:
            found = self.client.get_experiment_by_name(self.target.experiment)
            self.experiment_id = (found.experiment_id if found is not None else
                                  self.client.create_experiment(self.target.experiment))
        tags = {"hetflow.kind": kind, "hetflow.version": __version__, **self.target.tags}
        if parent is not None:
            tags[PARENT_TAG] = parent.run_id
        if run_id is not None:
            self.client.update_run(run_id, status="RUNNING")
            self.run_id = run_id
            self._tags(tags)
            return
        run = self.client.create_run(self.experiment_id, run_name=self.target.run_name, tags=tags)
        self.run_id = run.info.run_id

    def child(self, name: str, kind: str) -> "Tracker":
        """A run nested under this one (same experiment, ``mlflow.parentRunId`` set)."""
        return Tracker.start(MLflowSettings(), name, kind=kind, parent=self)

    # -- logging (queued) ----------------------------------------------------------------------

    def _submit(self, call: Callable[[], None]) -> None:
        if self.run_id is not None and not self._finished:
            self._worker.submit(call)

    def log_params(self, params: Mapping[str, Any]) -> None:
        """Parameters (nested mappings flattened to ``a.b`` keys)."""
        from mlflow.entities import Param

        items = [Param(k, v) for k, v in flatten(params).items()]
        for chunk in _chunks(items, 100):
            self._submit(lambda c=chunk: self.client.log_batch(self.run_id, params=c))

    def set_tags(self, tags: Mapping[str, Any]) -> None:
        self._submit(lambda: self._tags(tags))

    def _tags(self, tags: Mapping[str, Any]) -> None:
        from mlflow.entities import RunTag

        items = [RunTag(k, str(v)[:MAX_TAG_CHARS]) for k, v in tags.items() if v is not None]
        for chunk in _chunks(items, 100):
            self.client.log_batch(self.run_id, tags=chunk)

    def log_metrics(self, metrics: Mapping[str, Any], step: int | None = None) -> None:
        """Numeric metrics at ``step`` (others are left out)."""
        self.log_metric_rows([(step or 0, metrics)])

    def log_metric_rows(self, rows: Iterable[tuple[int, Mapping[str, Any]]]) -> None:
        """Many ``(step, metrics)`` at once (one batch per 1,000 values)."""
        from mlflow.entities import Metric

        now = int(time.time() * 1000)
        items = [Metric(str(k), float(v), now, int(step)) for step, metrics in rows
                 for k, v in metrics.items() if _number(v)]
        for chunk in _chunks(items, 1000):
            self._submit(lambda c=chunk: self.client.log_batch(self.run_id, metrics=c))

    def log_dict(self, data: Any, artifact_file: str) -> None:
        """A JSON (``.json``) or YAML (``.yaml``) artifact; logged even with artifacts off
        (the placement, small)."""
        self._submit(lambda: self.client.log_dict(self.run_id, data, artifact_file))

    def log_artifacts(self, path: str | os.PathLike, artifact_path: str | None = None) -> None:
        """A file or a directory's files (when ``artifacts`` is on)."""
        if not self.target.artifacts:
            return
        source = Path(path)

        def call() -> None:
            if source.is_dir():
                self.client.log_artifacts(self.run_id, str(source), artifact_path)
            elif source.is_file():
                self.client.log_artifact(self.run_id, str(source), artifact_path)

        self._submit(call)

    def env(self) -> dict[str, str]:
        """The variables a script's MLflow client reads to continue this run (``RUN_ENV``)."""
        if self.run_id is None:
            return {}
        return {"MLFLOW_TRACKING_URI": self.target.uri, "MLFLOW_RUN_ID": self.run_id,
                "MLFLOW_EXPERIMENT_ID": str(self.experiment_id),
                "MLFLOW_EXPERIMENT_NAME": self.target.experiment}

    # -- the end -------------------------------------------------------------------------------

    def finish(self, status: str = "FINISHED") -> None:
        """End the run with ``status`` (FINISHED, FAILED or KILLED) after what is queued; the
        run's owner waits at most ``FLUSH_TIMEOUT_S`` and then stops the thread."""
        if self._finished:
            return
        if self.run_id is not None:
            run_id = self.run_id
            self._worker.submit(lambda: self.client.set_terminated(run_id, status))
        self._finished = True
        if self._owner:
            if not self._worker.drain(FLUSH_TIMEOUT_S):
                _warn(f"MLflow logging did not finish within {FLUSH_TIMEOUT_S:g} s; the rest of "
                      f"run {self.run_id} is not logged")
            self._worker.stop()


def _client(uri: str) -> Any:
    """An MlflowClient for ``uri``; an InputError naming the URI when MLflow cannot use it."""
    import logging

    from mlflow.tracking import MlflowClient

    for name in ("mlflow.store.db.utils", "alembic"):  # "Creating initial MLflow database tables"
        logging.getLogger(name).setLevel(logging.WARNING)
    try:
        client = MlflowClient(tracking_uri=uri)
    except Exception as exc:  # noqa: BLE001 - MLflow raises MlflowException and others
        text = " ".join(str(exc).split())
        raise InputError(f"MLflow tracking URI {uri}: {text[:400]}") from None
    return client


def _number(value: Any) -> bool:
    if isinstance(value, bool):
        return False
    try:
        return value is not None and float(value) == float(value) and abs(float(value)) != float("inf")
    except (TypeError, ValueError):
        return False


def _chunks(items: list[Any], size: int) -> list[list[Any]]:
    return [items[i:i + size] for i in range(0, len(items), size)]


def status_of(exc: BaseException | None) -> str:
    """The MLflow run status for how a run ended."""
    if exc is None:
        return "FINISHED"
    return "KILLED" if isinstance(exc, KeyboardInterrupt) else "FAILED"


__all__ = ["FLUSH_TIMEOUT_S", "MLflowSettings", "PARENT_TAG", "RUN_ENV", "Target", "Tracker",
           "TrackingConfig", "absolute_uri", "flatten", "require_mlflow", "resolve", "status_of",
           "with_cli"]
