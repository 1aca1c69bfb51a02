"""``hetflow.train``: a Python API that mirrors Ray Train, for a user's own ``train_func``.

    import hetflow.train as train

    def train_func(config):
        ctx = train.get_context()            # ranks, sizes, ctx.device, ctx.device_mesh
        start = 0
        if (ckpt := train.get_checkpoint()) is not None:
            with ckpt.as_directory() as d:
                start = load(d) + 1
        for epoch in range(start, config["epochs"]):
            ...
            with tempfile.TemporaryDirectory() as d:
                save(d)                      # any rank may write files into its directory
                train.report({"loss": loss, "epoch": epoch}, checkpoint=train.Checkpoint.from_directory(d))

    result = train.run(train_func, config={"epochs": 5}, layout={"dp": 2},
                       resources={"devices": "cpu"}, checkpoint_dir="runs/mine", max_failures=2)
    print(result.metrics, result.checkpoint.path)

What it does (the same placement path as ``hetflow train`` and ``hetflow launch``):

* **placement**: one Ray actor per rank on :func:`~hetflow.workloads.train.group.place_layout`'s
  placement - on hetflow nodes the planner's devices for the ``dp x pp x tp`` layout (TP groups
  on the fastest links), each rank seeing exactly its own device (``cuda:0`` in the rank; this
  is where it differs from Ray Train, which shares a node's GPUs among its workers and picks
  one by local rank - the ROCm "invalid device ordinal" reports);
* **process group**: ``torch.distributed`` with nccl on GPUs (RCCL under ROCm), gloo on CPU,
  joined before ``train_func`` starts; the torchrun variables (RANK, LOCAL_RANK, WORLD_SIZE,
  MASTER_ADDR, ...) are set too, for libraries that read them; ``ctx.device_mesh`` is a
  DeviceMesh with axes ``dp``, ``pp``, ``tp``;
* **report(metrics, checkpoint=...)**: called by every rank (it is a collective, as in Ray
  Train). The files of every rank that passed a checkpoint are merged into one directory, and
  rank 0 commits it atomically as ``checkpoint_dir/checkpoint_<n>`` (a rename; the metrics are
  inside), keeping the newest ``keep_last``. Rank 0's metrics reach the driver;
* **failures**: when a rank's process dies or ``train_func`` raises, every rank is stopped, the
  group is placed again and ``train_func`` starts again, up to ``max_failures`` times (Ray
  Train's ``FailureConfig`` rule: application errors count too); ``get_checkpoint()`` then
  returns the newest committed checkpoint. After that, :class:`TrainingFailed`.

``checkpoint_dir`` must be reachable from every rank's node and from the driver (a shared
filesystem on a multi-node cluster), as for ``hetflow train``.
"""

from __future__ import annotations

import json
import os
import time
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from hetflow.core.errors import HetflowError, InputError
from hetflow.core.request import ParallelLayout
from hetflow.workloads.train.checkpoint import (
    Checkpoint,
    committed_checkpoints,
    latest_committed,
    ranked_checkpoints,
)
from hetflow.workloads.train.worker import (  # the rank's side, public through hetflow.train
    TrainContext,
    get_checkpoint,
    get_context,
    rank_context,
    report,
)


class TrainingFailed(HetflowError):
    """The run gave up: more failures than ``max_failures`` allows."""


PROGRESS_NAMESPACE = "hetflow_progress"


class ProgressLog:
    """Rank 0's reports of every attempt, kept outside the ranks so that they survive a failed
    attempt or a lost worker host: in the Ray cluster's own key-value store (the GCS on the
    head; with GCS fault tolerance, Redis), one key per report under this run's prefix. No
    process of its own: rank 0 writes (:meth:`record`, one GCS call per report), the driver
    reads and removes what it read (:meth:`since`), and :meth:`close` removes the rest.
    Picklable (a prefix and a counter): each attempt's rank 0 gets a copy."""

    def __init__(self, run: str | None = None) -> None:
        self.prefix = f"{run or uuid.uuid4().hex}/"
        self._written = 0  # the writer's (rank 0's) reports so far, in this copy
        self._records: list[dict[str, Any]] = []  # the reader's (the driver's)

    def record(self, records: list[dict[str, Any]]) -> None:
        from ray.experimental.internal_kv import _internal_kv_put

        for item in records:  # attempt, then order: the keys sort as the reports were made
            key = f"{self.prefix}{int(item.get('attempt', 0)):06d}/{self._written:09d}"
            _internal_kv_put(key, json.dumps(item), overwrite=True, namespace=PROGRESS_NAMESPACE)
            self._written += 1

    def since(self, index: int) -> list[dict[str, Any]]:
        """The reports from ``index`` on (every one read so far is kept here)."""
        from ray.experimental.internal_kv import _internal_kv_del, _internal_kv_get, _internal_kv_list

        for key in sorted(_internal_kv_list(self.prefix, namespace=PROGRESS_NAMESPACE)):
            value = _internal_kv_get(key, namespace=PROGRESS_NAMESPACE)
            if value is not None:
                self._records.append(json.loads(value))
            _internal_kv_del(key, namespace=PROGRESS_NAMESPACE)
        return self._records[index:]

    def close(self) -> None:
        """Remove what is left of this run's reports from the store."""
        from ray.experimental.internal_kv import _internal_kv_del

        try:
            _internal_kv_del(self.prefix, del_by_prefix=True, namespace=PROGRESS_NAMESPACE)
        except Exception:  # noqa: BLE001 - the cluster is gone: so are the reports
            pass


def progress_log() -> ProgressLog:
    """A :class:`ProgressLog` for one run (this driver must be connected to Ray)."""
    return ProgressLog()


# -- the driver ---------------------------------------------------------------------------------


@dataclass
class Result:
    """How a run ended (Ray Train's ``Result``: ``metrics``, ``checkpoint``, ``path``, ``error``,
    ``best_checkpoints``, ``metrics_dataframe``)."""

    metrics: dict[str, Any]  # rank 0's last report
    checkpoint: Checkpoint | None  # the newest committed checkpoint
    path: str  # the checkpoint directory
    metrics_history: list[dict[str, Any]]  # every report of rank 0, every attempt, in order
    restarts: int
    failures: list[str]
    placement: str
    return_value: Any = None  # what rank 0's train_func returned
    attempts_started_at: list[float] = field(default_factory=list)
    error: Exception | None = None  # always None here: a failed run raises TrainingFailed
    keep_score: tuple[str, str] | None = None

    @property
    def best_checkpoints(self) -> list[tuple[Checkpoint, dict[str, Any]]]:
        """The kept checkpoints with their metrics, worst first (by the checkpoint score when
        one was named, else oldest first), as Ray Train's ``Result.best_checkpoints``."""
        return [(c, c.metrics) for c in ranked_checkpoints(committed_checkpoints(self.path),
                                                           self.keep_score)]

    @property
    def metrics_dataframe(self) -> Any:
        """Every report of rank 0 as a pandas DataFrame (one row per report)."""
        import pandas

        return pandas.DataFrame(self.metrics_history)


def _layout(layout: Any) -> ParallelLayout:
    if layout is None:
        return ParallelLayout()
    if isinstance(layout, ParallelLayout):
        return layout
    if isinstance(layout, int):
        return ParallelLayout(dp=layout)
    if isinstance(layout, Mapping):
        unknown = set(layout) - {"dp", "pp", "tp"}
        if unknown:
            raise InputError(f"layout: unknown key {sorted(unknown)[0]!r}; give dp, pp and tp")
        return ParallelLayout(**{k: int(v) for k, v in layout.items()})
    raise InputError(f"layout: expected a dict of dp/pp/tp, an int (dp) or a ParallelLayout, got {layout!r}")


def _resources(resources: Any, session: Any, world: int) -> Any:
    from pydantic import ValidationError

    from hetflow.workloads.train.config import ResourcesConfig

    if isinstance(resources, ResourcesConfig):
        return resources
    fields = dict(resources or {})
    fields["cpus_per_rank"] = session.cpus_per_rank(world, fields.get("cpus_per_rank"))
    try:
        return ResourcesConfig(**fields)
    except ValidationError as exc:
        from hetflow.core.validation import describe

        raise InputError(describe(exc, ResourcesConfig, "resources")) from None


def run(train_func: Callable[..., Any], config: Any = None, *, layout: Any = None,
        resources: Any = None, checkpoint_dir: str | os.PathLike | None = None,
        max_failures: int = 0, keep_last: int | None = None, name: str = "train-func",
        address: str | None = None, keep_score: tuple[str, str] | None = None,
        timeout_s: float = 600.0) -> Result:
    """Run ``train_func(config)`` (or ``train_func()``) on every rank of ``layout`` (a dict of
    dp/pp/tp, or an int: dp) with ``resources`` (the fields of ``hetflow train``'s
    ``resources`` section: devices, cpus_per_rank, threads_per_rank, placement_timeout_s) until it returns on every rank. ``keep_last`` with ``keep_score``
    (metric, "max" or "min"): keep the best checkpoints by that metric (and the newest).
    ``timeout_s``: torch.distributed's collective timeout. See the module docstring."""
    import ray

    from hetflow.runtime.session import connect

    if not callable(train_func):
        raise InputError(f"train_func must be a function, got {type(train_func).__name__}")
    if max_failures < 0:
        raise InputError("max_failures must be >= 0")
    lay = _layout(layout)
    world = lay.world_size
    root = Path(checkpoint_dir or f"runs/{name}/checkpoints").absolute()
    root.mkdir(parents=True, exist_ok=True)
    session = connect(address, world, what="layout world size")
    reports = None
    try:
        res = _resources(resources, session, world)
        from hetflow.workloads.train.group import RankGroup, TrainingCodeError, WorkerFailure

        reports = progress_log()  # rank 0's reports, kept apart on this node
        failures: list[str] = []
        starts: list[float] = []
        attempt = 0
        info = {"checkpoint_dir": str(root), "keep_last": keep_last, "keep_score": keep_score,
                "timeout_s": timeout_s}
        while True:
            starts.append(time.time())
            group = RankGroup(lay, res, name, attempt)
            try:
                group.start()
                value = group.run(train_func, config, info, reports, poll_s=0.5)[0]
                break
            except (WorkerFailure, TrainingCodeError) as exc:  # Ray Train's rule: both count
                failures.append(str(exc))
                if len(failures) > max_failures:
                    latest = latest_committed(root)
                    where = f"; the newest checkpoint is {latest.path}" if latest else ""
                    raise TrainingFailed(f"{name} failed {len(failures)} time(s), more than "
                                         f"max_failures={max_failures} allows (last: {exc}){where}") from None
            finally:
                group.shutdown()
            attempt += 1
        records = reports.since(0)
        latest = latest_committed(root)
        return Result(metrics=records[-1]["metrics"] if records else {}, checkpoint=latest,
                      path=str(root), metrics_history=[r["metrics"] for r in records],
                      restarts=attempt, failures=failures, placement=group.how,
                      return_value=value, attempts_started_at=starts, keep_score=keep_score)
    finally:
        if reports is not None:
            reports.close()
        session.close()


__all__ = ["Checkpoint", "ProgressLog", "Result", "TrainContext", "TrainingFailed", "committed_checkpoints",
           "get_checkpoint", "get_context", "latest_committed", "rank_context", "report", "run"]
