"""One tuning trial: train the base config with the sampled values, one epoch at a time.

The trial is a single process (no process group) built from the training package's own
pieces: :func:`~hetflow.workloads.train.models.build_model` (the model spec's ``build``),
:func:`~hetflow.workloads.train.data.load_split` and its stateless
:class:`~hetflow.workloads.train.data.StepOrder`, the optimizer of
:func:`~hetflow.workloads.train.loop.build_optimizer`, and the atomic checkpoints of
:mod:`~hetflow.workloads.train.checkpoint`. An epoch is ``StepOrder.steps_per_epoch`` steps
at the trial's batch size.

After every epoch the trial evaluates the whole validation split and reports to Tune
``epoch``, the model spec's validation metrics (``val_loss``, and ``val_accuracy`` for the mlp,
``val_token_accuracy`` for the gpt, a user spec's ``accuracy``),
``train_loss`` (the epoch's mean), ``started_at`` / ``reported_at`` (wall times),
``resumed_from`` (the epoch its weights were restored from, 0 for a fresh start), ``device``
(``node:index``, or ``cpu``), ``device_units`` (its share of the hetflow device resource, MiB)
and ``visible_devices`` - with a checkpoint of the model and optimizer. Tune's scheduler may
stop it after any report.

A trial restored by Tune (resumed run) continues from its checkpoint: the step order depends
only on (samples, batch size, seed, step), so it sees the batches an uninterrupted trial would.
"""

from __future__ import annotations

import contextlib
import logging
import os
import socket
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping

import torch

from hetflow.workloads.train.checkpoint import (
    ModelState,
    OptimizerState,
    latest_checkpoint,
    load_checkpoint,
    save_checkpoint,
)
from hetflow.workloads.train.config import TrainConfig, config_from_dict
from hetflow.workloads.models.spec import ModelSpec
from hetflow.workloads.train.data import Dataset, StepOrder, dataset_from_arrays, load_split
from hetflow.workloads.train.loop import build_optimizer, select_device
from hetflow.workloads.train.models import build_model, model_spec
from hetflow.workloads.tune.space import SearchSpace

EVAL_BATCH = 512


@dataclass(frozen=True)
class TrialSetup:
    """What every trial of a run shares (handed to Tune with ``tune.with_parameters``)."""

    base: dict[str, Any]  # the base TrainConfig, as JSON-ready data
    space: SearchSpace
    epochs: int  # most epochs a trial trains
    threads: int  # torch intra-op threads

    def trial_config(self, sampled: dict[str, Any]) -> TrainConfig:
        """The base config with a trial's sampled values, validated like a file."""
        base = config_from_dict(self.base, source="base")
        return base.with_overrides(**self.space.overrides(sampled))


def run_trial(sampled: dict[str, Any], setup: TrialSetup,
              data: Mapping[str, Any] | None = None) -> None:
    """Tune's trainable: train ``setup.epochs`` epochs (or resume), reporting after each.

    ``data``: the split's arrays prepared elsewhere (a workflow's prepare stage). Given to
    ``tune.with_parameters`` as an ObjectRef, Tune keeps the reference (no second copy) and
    resolves it here to read-only views of the object store; the trial trains on them instead
    of loading the config's split.
    """
    from ray import tune

    from hetflow.workloads.tune.placement import bind_planned_device

    for name in ("ray.train", "ray.tune"):  # one "checkpoint created" line per epoch is noise
        logging.getLogger(name).setLevel(logging.WARNING)
    started_at = time.time()
    bound = bind_planned_device()  # before torch initialises any GPU
    torch.set_num_threads(setup.threads)
    config = setup.trial_config(sampled)
    device = select_device(config.resources.devices.kind)
    spec = model_spec(config)
    model = build_model(config).to(device)
    optimizer = build_optimizer(config, model)
    state = {"model": ModelState(model), "optim": OptimizerState(model, optimizer)}
    if data is not None:
        dataset = dataset_from_arrays(config.dataset, data)
    else:
        dataset = load_split(config)
    order = StepOrder(len(dataset.train), config.train.batch_size, config.data.seed)
    start_epoch = _restore(tune.get_checkpoint(), state)
    scaler = torch.amp.GradScaler(device.type) if config.train.precision == "fp16" else None
    for epoch in range(start_epoch, setup.epochs):
        train_loss = train_epoch(model, optimizer, scaler, dataset, order, epoch, device,
                                  config.train.precision, spec)
        metrics = {"epoch": epoch + 1, "train_loss": train_loss,
                   **evaluate(model, dataset, device, spec),
                   "resumed_from": start_epoch, "device": bound.where,
                   "device_units": bound.units, "host": socket.gethostname(),
                   "visible_devices": os.environ.get("CUDA_VISIBLE_DEVICES", ""),
                   "torch_device": str(device),
                   "started_at": started_at, "reported_at": time.time()}
        with tempfile.TemporaryDirectory(prefix="hetflow-trial-") as tmp:
            steps = (epoch + 1) * order.steps_per_epoch
            save_checkpoint(tmp, steps, state, {"epoch": epoch + 1, "metrics": metrics})
            tune.report(metrics, checkpoint=tune.Checkpoint.from_directory(tmp))


def _restore(checkpoint: Any, state: dict[str, Any]) -> int:
    """Load a Tune checkpoint written by this module; return the epochs it holds (0: none)."""
    if checkpoint is None:
        return 0
    with checkpoint.as_directory() as directory:
        info = latest_checkpoint(directory)
        if info is None:
            return 0
        load_checkpoint(info, state)
        return int(info.meta["epoch"])


def _autocast(device: torch.device, precision: str) -> Any:
    if precision == "fp32":
        return contextlib.nullcontext()
    dtype = torch.bfloat16 if precision == "bf16" else torch.float16
    return torch.autocast(device.type, dtype=dtype)


def train_epoch(model: torch.nn.Module, optimizer: torch.optim.Optimizer,
                 scaler: torch.amp.GradScaler | None, dataset: Dataset, order: StepOrder,
                 epoch: int, device: torch.device, precision: str, spec: ModelSpec) -> float:
    """One pass over the training split; returns the mean training loss."""
    model.train()
    first = epoch * order.steps_per_epoch
    losses = []
    for step in range(first, first + order.steps_per_epoch):
        inputs, targets = dataset.train.take(order.global_batch(step))
        with _autocast(device, precision):
            loss = spec.loss(model(inputs.to(device)), targets.to(device))
        (scaler.scale(loss) if scaler else loss).backward()
        if scaler is not None:
            scaler.step(optimizer)
            scaler.update()
        else:
            optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        losses.append(loss.detach())
    return float(torch.stack(losses).float().mean())  # one sync per epoch


def evaluate(model: torch.nn.Module, dataset: Dataset, device: torch.device,
             spec: ModelSpec) -> dict[str, float]:
    """The spec's validation metrics over the whole validation split."""
    model.eval()
    return spec.evaluate(model, dataset.val.inputs, dataset.val.targets, batch=EVAL_BATCH,
                         device=device)


def checkpoint_root(path: str | Path) -> Path:
    """The hetflow checkpoint directory inside a trial's Tune checkpoint directory."""
    info = latest_checkpoint(path)
    assert info is not None, f"no complete hetflow checkpoint under {path}"
    return info.path


__all__ = ["TrialSetup", "checkpoint_root", "evaluate", "run_trial"]
