"""The built-in models' training function: model, steps, checkpoints of one rank.

:func:`train_func` is a ``hetflow.train`` train function like a user's: ``hetflow train`` runs it
with the same actor group, process group and context as ``hetflow.train.run`` runs a user's
(``group.RankGroup``, ``api.rank_context``). :func:`train_rank` runs it without Ray (any launcher
that gives each process its rank and a rendezvous address; ``torch.multiprocessing`` in the tests).

Device and collective backend come from the context (``api.rank_context``): a rank whose
placement made a GPU visible uses ``cuda:0`` and ``nccl`` (RCCL on ROCm builds), else the CPU
and ``gloo``.

Losses are reduced in batches (one all-reduce per ``log_every`` steps, per checkpoint and at
the end, and at the first step of each attempt) instead of one ``.item()`` per step, which would
synchronise every step.
"""

from __future__ import annotations

import contextlib
import math
import os
import socket
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping

import torch
import torch.distributed as dist

from hetflow.core.errors import HetflowError
from hetflow.core.request import MeshAxis
from hetflow.runtime.resources import visible_devices
from hetflow.workloads.train.checkpoint import (
    ModelState,
    OptimizerState,
    latest_checkpoint,
    list_checkpoints,
    load_checkpoint,
    remove_partials,
    save_checkpoint,
)
from hetflow.workloads.train.config import TrainConfig
from hetflow.workloads.train.data import StepOrder, dataset_from_arrays, load_split
from hetflow.workloads.train.models import build_model, model_spec
from hetflow.workloads.train.parallelize import ParallelModel, parallelize


@dataclass
class RankResult:
    """What one rank did in one attempt."""

    rank: int
    start_step: int  # steps already done when this attempt began (from a checkpoint)
    end_step: int  # steps done when it returned
    losses: dict[int, float] = field(default_factory=dict)  # step -> global mean loss (rank 0: all)
    samples_per_s: float | None = None  # after warm-up, checkpoints at the end excluded
    first_step_at: float | None = None  # wall time (time.time) when this attempt's first step ended
    device: str = "cpu"
    backend: str = "gloo"
    runtime: str = "cpu"  # cpu, cuda or rocm
    host: str = ""
    node_id: str = ""  # the Ray node, when run by the actor group
    pid: int = 0
    visible_devices: dict[str, str | None] = field(default_factory=dict)
    checkpoint: str | None = None  # the final checkpoint's directory
    stopped: bool = False  # stopped early on request (HETFLOW_STOP_FILE) after a checkpoint
    progress: float = 0.0  # reference steps done when it returned (= end_step at step_gain 1)


# Preemption hook: when this environment variable names a file and that file appears, every
# rank checkpoints after the current step and returns with ``stopped`` set (the cluster
# controller sets it in the ranks' environment; a plain ``hetflow train`` never does).
STOP_FILE_ENV = "HETFLOW_STOP_FILE"


def check_device(preference: str, device: torch.device) -> None:
    """``resources.devices: gpu`` and this rank sees no GPU: an error that says what to install."""
    if preference == "gpu" and device.type != "cuda":
        seen = visible_devices()
        raise HetflowError(
            f"resources.devices.kind is gpu but this worker sees no GPU (torch {torch.__version__}, "
            f"visibility {seen}); install a CUDA or ROCm build of torch on the workers, or set "
            "resources.devices: cpu"
        )


def select_device(preference: str) -> torch.device:
    """``cuda:0`` when a GPU is visible and wanted, else the CPU; ``gpu`` with none is an error
    (one-process trials of ``hetflow tune``)."""
    if preference != "cpu" and torch.cuda.is_available():
        return torch.device("cuda", 0)  # the placement made exactly this rank's GPU visible
    device = torch.device("cpu")
    check_device(preference, device)
    return device


def runtime_name(device: torch.device) -> str:
    if device.type != "cuda":
        return "cpu"
    return "rocm" if torch.version.hip else "cuda"


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


class _LossBook:
    """Local losses kept as tensors and reduced to global means in one all-reduce per flush."""

    def __init__(self, replicas_per_loss: int, device: torch.device) -> None:
        self.replicas = replicas_per_loss  # ranks that hold a copy of each replica's loss x dp
        self.device = device
        self.pending: list[tuple[int, torch.Tensor]] = []
        self.history: dict[int, float] = {}

    def add(self, step: int, loss: torch.Tensor) -> None:
        self.pending.append((step, loss.detach().float().reshape(())))

    def flush(self) -> list[tuple[int, float]]:
        if not self.pending:
            return []
        values = torch.stack([t for _, t in self.pending]).to(self.device)
        dist.all_reduce(values)
        values = (values / self.replicas).tolist()
        out = [(step, v) for (step, _), v in zip(self.pending, values)]
        self.history.update(out)
        self.pending.clear()
        return out


def train_func(job: Mapping[str, Any]) -> RankResult:
    """The built-in models' ``train_func`` for ``hetflow.train``: train this rank to
    ``config.train.steps``, resuming from the latest complete checkpoint.

    ``job``: ``{"config": TrainConfig, "data": ...}`` - ``data`` the split's arrays (or an
    ObjectRef of them in Ray's object store, mapped here without a copy), None to load the
    config's split here. Device, backend, mesh and rank come from ``hetflow.train.get_context()``;
    losses are reported with ``hetflow.train.report`` at each flush (metrics ``step``, ``loss``
    and ``losses``: every flushed ``[step, loss]``). The checkpoints are the built-in's own
    sharded DCP checkpoints (``checkpoint.py``; each rank writes its shards in place, where
    ``report(checkpoint=)`` would copy them).
    """
    from hetflow.workloads.train.worker import get_context

    config: TrainConfig = job["config"]
    data = job.get("data")
    if data is not None and not isinstance(data, Mapping):  # an ObjectRef
        import ray

        data = ray.get(data)
    ctx = get_context()
    assert ctx.world_size == config.layout.world_size, "world size must be dp * pp * tp"
    check_device(config.resources.devices.kind, ctx.device)
    return _train(config, ctx, data)


def train_rank(config: TrainConfig, rank: int, world_size: int, init_method: str,
               data: Mapping[str, Any] | None = None) -> RankResult:
    """:func:`train_func` as rank ``rank`` of ``world_size`` processes started by any launcher
    (no Ray: ``torch.multiprocessing`` in the tests), rendezvous at ``init_method``."""
    from hetflow.workloads.train.worker import rank_context

    os.environ.update({"RANK": str(rank), "WORLD_SIZE": str(world_size),
                       "LOCAL_RANK": str(rank), "LOCAL_WORLD_SIZE": str(world_size)})
    with rank_context(config.layout.parallel.shape, config.resources.devices.kind,
                      config.resources.threads_per_rank,
                      {"checkpoint_dir": str(config.checkpoint_dir), "name": config.name},
                      init_method=init_method):
        return train_func({"config": config, "data": data})


def _train(config: TrainConfig, ctx: Any, data: Mapping[str, Any] | None) -> RankResult:
    from hetflow.workloads.train.worker import report

    layout, train = config.layout, config.train
    rank, device, mesh, attempt = ctx.world_rank, ctx.device, ctx.device_mesh, ctx.attempt
    dp_index = mesh[MeshAxis.DP.value].get_local_rank()
    loss_fn = model_spec(config).loss
    model = parallelize(build_model(config), config, mesh, device)
    optimizer = build_optimizer(config, model.module)
    state = {"model": ModelState(model.module), "optim": OptimizerState(model.module, optimizer)}
    book = _LossBook(layout.dp * layout.tp, device)
    start, progress = _resume(config, rank, state, book)
    # the run ends once its progress (step_gain per step; a goodput-adaptive job's steps count
    # more than one step of its reference batch) reaches train.steps: at `end`
    end = min(train.steps, start + max(0, math.ceil((train.steps - progress) / train.step_gain - 1e-9)))

    dataset = (dataset_from_arrays(config.dataset, data) if data is not None else
               load_split(config))
    order = StepOrder(len(dataset.train), train.batch_size, config.data.seed)
    scaler = torch.amp.GradScaler(device.type) if train.precision == "fp16" else None
    result = RankResult(rank=rank, start_step=start, end_step=start, progress=progress, device=str(device),
                        backend=dist.get_backend(), runtime=runtime_name(device),
                        host=socket.gethostname(), pid=os.getpid(),
                        visible_devices=visible_devices())
    interval = config.checkpoint.interval
    stop_file = os.environ.get(STOP_FILE_ENV) or None
    timed_from = min(start + train.warmup_steps, end - 1)
    t_start = None
    for step in range(start, end):
        if step == timed_from:
            _sync(device)
            t_start = time.perf_counter()
        inputs, targets = dataset.train.take(order.replica_batch(step, dp_index, layout.dp))
        loss = _step(model, optimizer, scaler, inputs.to(device), targets.to(device), device,
                     loss_fn)
        done = step + 1
        progress += train.step_gain
        book.add(done, loss)
        stop_now = stop_file is not None and done < end and _stop_agreed(stop_file, device)
        checkpoint_now = done == end or (interval and done % interval == 0) or stop_now
        if done == start + 1 or done % train.log_every == 0 or checkpoint_now:
            flushed = book.flush()
            if result.first_step_at is None:
                result.first_step_at = time.time()
            if flushed:  # every rank flushed the same steps; report is a collective
                report({"step": flushed[-1][0], "loss": flushed[-1][1],
                        "losses": [list(item) for item in flushed]})
        if done == end:
            _sync(device)
            if t_start is not None and done > timed_from:
                elapsed = time.perf_counter() - t_start
                result.samples_per_s = (done - timed_from) * train.batch_size / elapsed
        if checkpoint_now:
            meta = {"losses": {str(k): v for k, v in sorted(book.history.items())},
                    "layout": {"dp": layout.dp, "pp": layout.pp, "tp": layout.tp},
                    "attempt": attempt, "config_name": config.name, "progress": progress}
            path = save_checkpoint(config.checkpoint_dir, done, state, meta,
                                   keep_last=config.checkpoint.keep_last)
            result.checkpoint = str(path)
        result.end_step, result.progress = done, progress
        if stop_now:
            result.stopped = True
            break
    result.losses = dict(book.history)
    return result


def _stop_agreed(stop_file: str, device: torch.device) -> bool:
    """Whether any rank sees the stop file. One MAX all-reduce per step, so that every rank
    stops after the same step (a rank that stopped alone would leave its peers blocked in a
    collective); a rank on another node need not see the file at all."""
    flag = torch.tensor([1.0 if os.path.exists(stop_file) else 0.0], device=device)
    dist.all_reduce(flag, op=dist.ReduceOp.MAX)
    return bool(flag.item() > 0)


def build_optimizer(config: TrainConfig, module: torch.nn.Module) -> torch.optim.Optimizer:
    train = config.train
    if train.optimizer == "sgd":
        return torch.optim.SGD(module.parameters(), lr=train.lr, momentum=0.9,
                               weight_decay=train.weight_decay)
    return torch.optim.AdamW(module.parameters(), lr=train.lr, weight_decay=train.weight_decay)


def _resume(config: TrainConfig, rank: int, state: dict[str, Any], book: _LossBook) -> tuple[int, float]:
    """Load the newest complete checkpoint (rank 0 picks it for everyone); return its step and
    its progress in reference steps (its step where it has none: one per step)."""
    chosen: list[Any] = [None]
    if rank == 0 and config.checkpoint.resume:
        remove_partials(config.checkpoint_dir)  # no rank writes before the first step
        info = latest_checkpoint(config.checkpoint_dir)
        chosen = [str(info.path) if info else None]
    dist.broadcast_object_list(chosen, src=0)
    if chosen[0] is None:
        return 0, 0.0
    info = next(c for c in list_checkpoints(config.checkpoint_dir) if str(c.path) == chosen[0])
    load_checkpoint(info, state)
    book.history.update({int(k): float(v) for k, v in info.meta.get("losses", {}).items()})
    return info.step, float(info.meta.get("progress", info.step))


LossFn = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]


def _step(model: ParallelModel, optimizer: torch.optim.Optimizer,
          scaler: torch.amp.GradScaler | None, inputs: torch.Tensor, targets: torch.Tensor,
          device: torch.device, loss_fn: LossFn) -> torch.Tensor:
    """One optimizer step; returns this rank's loss (zero on pipeline stages that have none)."""
    autocast = (torch.autocast(device.type, dtype=model.autocast_dtype)
                if model.autocast_dtype is not None else contextlib.nullcontext())
    if model.schedule is not None:
        losses: list[torch.Tensor] = []
        with autocast:
            args = (inputs,) if model.is_first_stage else ()
            model.schedule.step(*args, target=targets if model.is_last_stage else None,
                                losses=losses if model.is_last_stage else None)
        loss = torch.stack(losses).mean() if losses else torch.zeros((), device=device)
    else:
        with autocast:
            loss = loss_fn(model.module(inputs), targets)
        (scaler.scale(loss) if scaler else loss).backward()
    if scaler is not None:
        scaler.step(optimizer)
        scaler.update()
    else:
        optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    return loss


def loss_records(reports: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """:func:`train_func`'s reports (as rank 0 sent them) as one ``{"step", "loss", "time",
    "attempt"}`` record per step."""
    return [{"step": int(step), "loss": float(loss), "time": r["time"], "attempt": r["attempt"]}
            for r in reports for step, loss in r["metrics"].get("losses", ())]


__all__ = ["STOP_FILE_ENV", "RankResult", "check_device", "loss_records", "runtime_name",
           "select_device",
           "train_func", "train_rank"]

