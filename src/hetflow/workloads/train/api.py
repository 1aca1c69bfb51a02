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
                       resources={"device": "cpu"}, checkpoint_dir="runs/mine", max_failures=2)
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

import contextlib
import inspect
import json
import os
import re
import shutil
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from hetflow.core.errors import HetflowError, InputError
from hetflow.core.request import ParallelLayout

META_FILE = ".hetflow_checkpoint.json"
CHECKPOINT_RE = re.compile(r"^checkpoint_(\d{6})$")


class TrainingFailed(HetflowError):
    """The run gave up: more failures than ``max_failures`` allows."""


# -- checkpoints --------------------------------------------------------------------------------


@dataclass(frozen=True)
class Checkpoint:
    """A directory of files (Ray Train's ``Checkpoint``: ``from_directory``, ``as_directory``,
    ``to_directory``, ``path``)."""

    path: str

    @classmethod
    def from_directory(cls, path: str | os.PathLike) -> "Checkpoint":
        return cls(str(Path(path).absolute()))

    @contextlib.contextmanager
    def as_directory(self) -> Iterator[str]:
        yield self.path

    def to_directory(self, path: str | os.PathLike | None = None) -> str:
        import tempfile

        target = Path(path) if path is not None else Path(tempfile.mkdtemp(prefix="checkpoint-"))
        shutil.copytree(self.path, target, dirs_exist_ok=True)
        return str(target)

    @property
    def metrics(self) -> dict[str, Any]:
        """The metrics reported with this checkpoint (committed checkpoints only)."""
        meta = Path(self.path) / META_FILE
        return json.loads(meta.read_text())["metrics"] if meta.is_file() else {}

    @property
    def index(self) -> int | None:
        match = CHECKPOINT_RE.match(Path(self.path).name)
        return int(match.group(1)) if match else None


def committed_checkpoints(root: str | os.PathLike) -> list[Checkpoint]:
    """Every committed checkpoint under ``root``, oldest first (partial ones are skipped)."""
    root = Path(root)
    if not root.is_dir():
        return []
    found = sorted((int(m.group(1)), p) for p in root.iterdir()
                   if (m := CHECKPOINT_RE.match(p.name)) and (p / META_FILE).is_file())
    return [Checkpoint(str(p)) for _, p in found]


def latest_checkpoint(root: str | os.PathLike) -> Checkpoint | None:
    found = committed_checkpoints(root)
    return found[-1] if found else None


# -- inside a rank ------------------------------------------------------------------------------


@dataclass
class TrainContext:
    """What a rank knows about its run (Ray Train's ``get_context()``, and hetflow's devices)."""

    world_rank: int
    world_size: int
    local_rank: int
    local_world_size: int
    node_rank: int
    layout: ParallelLayout
    device: Any  # torch.device: cuda:0 (the rank's own device, exactly) or cpu
    backend: str  # the process group's backend: nccl (RCCL on ROCm) or gloo
    device_mesh: Any  # torch DeviceMesh, axes ("dp", "pp", "tp")
    attempt: int  # 0, then 1, 2 ... after failures
    name: str
    checkpoint_dir: str
    _keep_last: int | None = None
    _latest: Checkpoint | None = None
    _next_index: int = 1
    _group: Any = None  # a gloo group for report()'s agreement, apart from the user's backend
    _progress: Any = None
    _tune: bool = False  # a one-rank trial of `hetflow tune` (trainable): report to Tune

    # Ray Train's accessors, so that ported code reads the same
    def get_world_rank(self) -> int:
        return self.world_rank

    def get_world_size(self) -> int:
        return self.world_size

    def get_local_rank(self) -> int:
        return self.local_rank

    def get_local_world_size(self) -> int:
        return self.local_world_size

    def get_node_rank(self) -> int:
        return self.node_rank

    def get_experiment_name(self) -> str:
        return self.name


_CONTEXT: TrainContext | None = None


def get_context() -> TrainContext:
    """The calling rank's context (only inside ``train_func``)."""
    if _CONTEXT is None:
        raise RuntimeError("hetflow.train.get_context() is only available inside a train_func "
                           "run by hetflow.train.run")
    return _CONTEXT


def get_checkpoint() -> Checkpoint | None:
    """The newest committed checkpoint when this attempt started (None on a fresh run); in a
    ``hetflow tune`` trial, Tune's checkpoint of the trial (a resumed or restored trial)."""
    ctx = get_context()
    if ctx._tune:
        from ray import tune

        return tune.get_checkpoint()  # as_directory() / path, as a Checkpoint here
    return ctx._latest


def report(metrics: Mapping[str, Any], checkpoint: Checkpoint | str | os.PathLike | None = None) -> None:
    """Report metrics (rank 0's reach the driver) and optionally a checkpoint; every rank must
    call it, as in Ray Train. See the module docstring for how the checkpoint is committed."""
    import torch
    import torch.distributed as dist

    from hetflow.workloads.train.checkpoint import _fsync_path, _write_synced

    ctx = get_context()
    if ctx._tune:
        from ray import tune

        path = checkpoint.path if isinstance(checkpoint, Checkpoint) else checkpoint
        tune.report(dict(metrics), checkpoint=(tune.Checkpoint.from_directory(str(path))
                                               if path is not None else None))
        return
    index = ctx._next_index
    ctx._next_index += 1
    root = Path(ctx.checkpoint_dir)
    staging = root / f".tmp-checkpoint_{index:06d}-{ctx.attempt}"
    if checkpoint is not None:
        source = Path(checkpoint.path if isinstance(checkpoint, Checkpoint) else checkpoint)
        if not source.is_dir():
            raise InputError(f"report(checkpoint=...): {source} is not a directory")
        staging.mkdir(parents=True, exist_ok=True)
        shutil.copytree(source, staging, dirs_exist_ok=True)
    flag = torch.tensor([1 if checkpoint is not None else 0])
    dist.all_reduce(flag, group=ctx._group)  # every rank's files are in place past this point
    committed = None
    if int(flag) and ctx.world_rank == 0:
        staging.mkdir(parents=True, exist_ok=True)
        meta = {"index": index, "metrics": _jsonable(metrics), "time": time.time(),
                "attempt": ctx.attempt, "world_size": ctx.world_size}
        _write_synced(staging / META_FILE, json.dumps(meta).encode())
        final = root / f"checkpoint_{index:06d}"
        os.replace(staging, final)  # the commit: a reader sees all of it or none
        _fsync_path(root)
        committed = str(final)
        if ctx._keep_last:
            for old in committed_checkpoints(root)[:-ctx._keep_last]:
                shutil.rmtree(old.path, ignore_errors=True)
    if ctx.world_rank == 0 and ctx._progress is not None:
        ctx._progress.record.remote([{"metrics": _jsonable(metrics), "checkpoint": committed,
                                      "attempt": ctx.attempt, "time": time.time()}])


def _jsonable(metrics: Mapping[str, Any]) -> dict[str, Any]:
    """Metrics as JSON values: tensors and numpy scalars as numbers, lists and dicts of JSON
    values kept, anything else as its text."""
    out = {}
    for key, value in metrics.items():
        if hasattr(value, "item") and callable(value.item):
            value = value.item()
        try:
            json.dumps(value)
        except (TypeError, ValueError):
            value = str(value)
        out[str(key)] = value
    return out


class ProgressLog:
    """Rank 0's reports of every attempt, kept outside the ranks so that they survive a failed
    attempt (an actor of its own; no CPU reserved)."""

    def __init__(self) -> None:
        self.records: list[dict[str, Any]] = []

    def record(self, records: list[dict[str, Any]]) -> None:
        self.records.extend(records)

    def since(self, index: int) -> list[dict[str, Any]]:
        return self.records[index:]


def progress_log() -> Any:
    """A :class:`ProgressLog` actor on this driver's node: it must outlive the loss of any
    worker host (a log Ray put on a lost host would take every record with it)."""
    import ray
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    here = ray.get_runtime_context().get_node_id()
    return ray.remote(num_cpus=0)(ProgressLog).options(
        scheduling_strategy=NodeAffinitySchedulingStrategy(here, soft=False)).remote()


@contextlib.contextmanager
def rank_context(layout: tuple[int, int, int], device_kind: str, threads: int,
                 info: Mapping[str, Any], progress: Any = None,
                 init_method: str = "env://") -> Iterator[TrainContext]:
    """This process as one rank of a run: process group joined (the torchrun variables in
    ``os.environ``: RANK, WORLD_SIZE, LOCAL_RANK, ... and, with ``env://``, MASTER_ADDR/PORT),
    the (dp, pp, tp) mesh built, the ``hetflow.train`` context set; all undone on exit.

    ``device_kind``: "cpu" (no device), else the rank's one visible device when torch sees one
    (``cuda:0``, nccl - RCCL on ROCm builds), the CPU and gloo otherwise. Used by the Ray actor
    of every rank (:class:`FuncWorker`) and by launchers without Ray (``loop.train_rank``).
    """
    global _CONTEXT
    import torch
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh

    env = os.environ
    rank, world = int(env["RANK"]), int(env["WORLD_SIZE"])
    torch.set_num_threads(max(1, threads))
    if device_kind != "cpu" and torch.cuda.is_available():
        torch.cuda.set_device(0)  # the one device this rank sees: its planned device
        device, backend = torch.device("cuda", 0), "nccl"
    else:
        device, backend = torch.device("cpu"), "gloo"
    from datetime import timedelta

    dist.init_process_group(backend, init_method=init_method, rank=rank, world_size=world,
                            timeout=timedelta(minutes=10))
    try:
        group = dist.new_group(backend="gloo") if backend != "gloo" else None
        mesh = init_device_mesh(device.type, layout, mesh_dim_names=("dp", "pp", "tp"))
        root = Path(info["checkpoint_dir"])
        latest = latest_checkpoint(root)
        if rank == 0 and root.is_dir():
            for stale in root.glob(".tmp-checkpoint_*"):  # a failed attempt's half-copied files
                shutil.rmtree(stale, ignore_errors=True)
        dist.barrier()
        _CONTEXT = TrainContext(
            world_rank=rank, world_size=world, local_rank=int(env.get("LOCAL_RANK", rank)),
            local_world_size=int(env.get("LOCAL_WORLD_SIZE", world)),
            node_rank=int(env.get("GROUP_RANK", 0)), layout=ParallelLayout(*layout), device=device,
            backend=backend, device_mesh=mesh, attempt=int(info.get("attempt", 0)),
            name=str(info.get("name", "train-func")), checkpoint_dir=str(root),
            _keep_last=info.get("keep_last"), _latest=latest,
            _next_index=(latest.index or 0) + 1 if latest else 1, _group=group,
            _progress=progress)
        yield _CONTEXT
    finally:
        _CONTEXT = None
        if dist.is_initialized():
            dist.destroy_process_group()


class FuncWorker:
    """One rank of ``hetflow.train.run`` (wrapped with ``ray.remote`` by the driver)."""

    def where(self) -> dict[str, Any]:
        import ray

        from hetflow.workloads.launch.rank import free_port

        return {"ip": ray.util.get_node_ip_address(), "port": free_port(), "pid": os.getpid(),
                "node_id": ray.get_runtime_context().get_node_id(),
                "visible_devices": {k: os.environ.get(k) for k in
                                    ("CUDA_VISIBLE_DEVICES", "HIP_VISIBLE_DEVICES", "ROCR_VISIBLE_DEVICES")}}

    def run(self, fn: Callable[..., Any], config: Any, env: dict[str, str], layout: tuple[int, int, int],
            device_kind: str, threads: int, info: dict[str, Any], progress: Any) -> Any:
        os.environ.update(env)
        _start_fence()
        with rank_context(layout, device_kind, threads, info, progress):
            takes_config = bool(inspect.signature(fn).parameters)
            return fn(config) if takes_config else fn()


def _start_fence() -> None:
    """Stop this rank's process when it has lost the cluster: no answer from Ray's GCS for
    ``HETFLOW_RANK_LEASE_S`` seconds (default 5). A rank on a host whose network is gone would
    otherwise keep training - and writing checkpoints into the shared directory - beside the
    group the driver started again elsewhere once Ray declared the host dead."""
    import threading

    from hetflow.workloads.launch.rank import DEFAULT_LEASE_S, LEASE_ENV

    lease = float(os.environ.get(LEASE_ENV) or DEFAULT_LEASE_S)
    if lease <= 0 or getattr(_start_fence, "started", False):
        return
    from ray.experimental import internal_kv

    client = internal_kv.internal_kv_get_gcs_client()
    if client is None:
        return
    _start_fence.started = True  # type: ignore[attr-defined]

    def watch() -> None:
        last = time.monotonic()
        while True:
            try:
                client.internal_kv_exists(b"hetflow-fence", b"hetflow", timeout=1)
                last = time.monotonic()
            except Exception:  # noqa: BLE001 - any failure to reach the GCS counts as silence
                if time.monotonic() - last > lease:
                    print(f"hetflow: no answer from the Ray cluster for {lease:g} s: this rank "
                          "stops (its host lost the cluster)", flush=True)
                    os._exit(137)
            time.sleep(1.0)

    threading.Thread(target=watch, name="hetflow-fence", daemon=True).start()


# -- the driver ---------------------------------------------------------------------------------


@dataclass
class Result:
    """How a run ended (Ray Train's ``Result``: ``metrics``, ``checkpoint``, ``path``)."""

    metrics: dict[str, Any]  # rank 0's last report
    checkpoint: Checkpoint | None  # the newest committed checkpoint
    path: str  # the checkpoint directory
    metrics_history: list[dict[str, Any]]  # every report of rank 0, every attempt, in order
    restarts: int
    failures: list[str]
    placement: str
    return_value: Any = None  # what rank 0's train_func returned
    attempts_started_at: list[float] = field(default_factory=list)


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
        address: str | None = None) -> Result:
    """Run ``train_func(config)`` (or ``train_func()``) on every rank of ``layout`` (a dict of
    dp/pp/tp, or an int: dp) with ``resources`` (the fields of ``hetflow train``'s
    ``resources`` section: device, cpus_per_rank, threads_per_rank, vendor, accelerator, memory,
    placement_timeout_s) until it returns on every rank. See the module docstring."""
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
        info = {"checkpoint_dir": str(root), "keep_last": keep_last}
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
                    latest = latest_checkpoint(root)
                    where = f"; the newest checkpoint is {latest.path}" if latest else ""
                    raise TrainingFailed(f"{name} failed {len(failures)} time(s), more than "
                                         f"max_failures={max_failures} allows (last: {exc}){where}") from None
            finally:
                group.shutdown()
            attempt += 1
        records = ray.get(reports.since.remote(0))
        latest = latest_checkpoint(root)
        return Result(metrics=records[-1]["metrics"] if records else {}, checkpoint=latest,
                      path=str(root), metrics_history=[r["metrics"] for r in records],
                      restarts=attempt, failures=failures, placement=group.how,
                      return_value=value, attempts_started_at=starts)
    finally:
        if reports is not None:
            ray.kill(reports)
        session.close()


__all__ = ["Checkpoint", "ProgressLog", "Result", "TrainContext", "TrainingFailed", "committed_checkpoints",
           "get_checkpoint", "get_context", "latest_checkpoint", "rank_context", "report", "run"]
