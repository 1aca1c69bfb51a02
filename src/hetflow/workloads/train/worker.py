"""One rank of ``hetflow.train.run``: its context, ``report``, and the Ray actor that runs it.

Inside ``train_func``: :func:`get_context`, :func:`get_checkpoint`, :func:`report` (public as
``hetflow.train``). :func:`rank_context` makes this process a rank (process group, mesh,
context); :class:`FuncWorker` is the Ray actor of every rank (wrapped with ``ray.remote`` by
:class:`~hetflow.workloads.train.group.RankGroup`). The driver side is
:mod:`hetflow.workloads.train.api`; the contract is its docstring.
"""

from __future__ import annotations

import contextlib
import inspect
import json
import os
import shutil
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from hetflow.core.errors import InputError
from hetflow.core.request import ParallelLayout
from hetflow.runtime.resources import visible_devices
from hetflow.workloads.train.checkpoint import (
    META_FILE,
    Checkpoint,
    beyond_keep,
    committed_checkpoints,
    latest_committed,
)


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
    _keep_score: tuple[str, str] | None = None  # (metric, "max" | "min"): keep the best, not the newest
    _latest: Checkpoint | None = None
    _next_index: int = 1
    _group: Any = None  # a gloo group for report()'s agreement, apart from the user's backend
    _progress: Any = None  # rank 0's: the run's ProgressLog (api.py)
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
        meta = {"index": index, "metrics": jsonable(metrics), "time": time.time(),
                "attempt": ctx.attempt, "world_size": ctx.world_size}
        _write_synced(staging / META_FILE, json.dumps(meta).encode())
        final = root / f"checkpoint_{index:06d}"
        os.replace(staging, final)  # the commit: a reader sees all of it or none
        _fsync_path(root)
        committed = str(final)
        if ctx._keep_last:
            for old in beyond_keep(committed_checkpoints(root), ctx._keep_last, ctx._keep_score):
                shutil.rmtree(old.path, ignore_errors=True)
    if ctx.world_rank == 0 and ctx._progress is not None:  # in the cluster's store on return
        ctx._progress.record([{"metrics": jsonable(metrics), "checkpoint": committed,
                               "attempt": ctx.attempt, "time": time.time()}])


def jsonable(metrics: Mapping[str, Any]) -> dict[str, Any]:
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
                            timeout=timedelta(seconds=float(info.get("timeout_s") or 600)))
    try:
        group = dist.new_group(backend="gloo") if backend != "gloo" else None
        mesh = init_device_mesh(device.type, layout, mesh_dim_names=("dp", "pp", "tp"))
        root = Path(info["checkpoint_dir"])
        latest = latest_committed(root)
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
            _keep_last=info.get("keep_last"), _keep_score=info.get("keep_score"), _latest=latest,
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
                "visible_devices": visible_devices()}

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


__all__ = ["FuncWorker", "TrainContext", "get_checkpoint", "get_context", "jsonable", "rank_context", "report"]
