"""Goodput-adaptive jobs: the batch a data-parallel job runs at each size, and its speed curve.

A training job that declares its goodput model (Pollux's: a step-time model and its gradient
statistics, :mod:`hetflow.scheduling.goodput`) is an elastic job whose global batch changes
with its size: at ``n`` devices (``dp = n / (tp x pp)`` replicas on :func:`packed_nodes` nodes)
it runs the batch of :meth:`GoodputModel.optimize`'s grid (:func:`~hetflow.scheduling.goodput.batch_grid`)
whose goodput - examples per second times statistical efficiency - is highest, and its speed
at ``n`` relative to its declared size is the ratio of those best goodputs
(:func:`goodput_scaling`, a points curve of :mod:`hetflow.scheduling.elastic`). This is how the
simulator's hetflow policy sees Sia's adaptive jobs (``SiaApp.best_cost``), for a job file.

Two restrictions on the grid, both because hetflow's training loop runs a step as one batch per
replica (``train.batch_size / dp`` samples each): candidates with gradient-accumulation steps
are left out (the loop has none; so a single replica, which Pollux lets grow past the initial
batch only by accumulating, keeps the initial batch), and with a pipeline the per-replica batch
must split into its microbatches. Within those, and capped at ``max_batch_size``, the choice is
Pollux's. Pure: numpy, no clock.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Mapping

import numpy as np

from hetflow.scheduling.elastic import Scaling
from hetflow.scheduling.goodput import GoodputModel, batch_grid


@dataclass(frozen=True)
class BatchChoice:
    """The batch a goodput-adaptive job runs with on ``replicas`` data-parallel replicas."""

    replicas: int
    nodes: int
    local_batch: int  # samples per replica per step
    goodput: float  # examples/s x statistical efficiency, by the job's model
    gain: float  # progress of one step, in steps of the initial batch (efficiency x B / B0)

    @property
    def batch_size(self) -> int:
        """The global batch: ``local_batch`` x ``replicas`` (no accumulation steps)."""
        return self.local_batch * self.replicas


def packed_nodes(devices: int, devices_per_node: int) -> int:
    """Nodes a gang of ``devices`` spans when packed onto nodes of ``devices_per_node``."""
    return max(1, math.ceil(devices / devices_per_node))


def best_batch(model: GoodputModel, replicas: int, nodes: int, max_batch_size: int,
               max_local_batch: int | None = None, multiple: int = 1) -> BatchChoice | None:
    """The goodput-maximising batch on ``replicas`` replicas over ``nodes`` nodes among
    :func:`~hetflow.scheduling.goodput.batch_grid`'s candidates that run without accumulation
    steps, hold at most ``max_local_batch`` samples per replica (default: no cap but
    ``max_batch_size``), split into ``multiple`` microbatches, and make a global batch between
    the model's initial batch and ``max_batch_size``; None when none does. Ties go to the
    smaller batch."""
    cap = max_local_batch or max_batch_size
    atomic, accum, ok = batch_grid(replicas, model.init_batch_size, max_batch_size, (1, cap))
    atomic = np.minimum(atomic, max_batch_size // replicas)  # ceil() may overshoot the cap
    keep = (ok & (accum == 0) & (atomic >= 1) & (atomic <= cap) & (atomic % multiple == 0)
            & (atomic * replicas >= model.init_batch_size))
    if not keep.any():
        return None
    good = np.where(keep, model.goodput(nodes, replicas, atomic, 0), -np.inf)
    i = int(np.argmax(good))
    if not good[i] > 0:
        return None
    batch = float(atomic[i] * replicas)
    gain = float(model.efficiency(batch)) * batch / model.init_batch_size
    return BatchChoice(replicas, nodes, int(atomic[i]), float(good[i]), max(1.0, gain))


def goodput_scaling(best: Mapping[int, float]) -> Scaling:
    """The speed curve of sizes -> best goodput: a points curve, so ``relative(n, declared)``
    is ``best[n] / best[declared]`` at every size given (linear in between)."""
    if len(best) == 1:  # one size: a curve still needs two points; both ends are that size's
        (n, g), = best.items()
        return Scaling("points", points=((n, g), (n + 1, g)))
    return Scaling("points", points=tuple(sorted(best.items())))


__all__ = ["BatchChoice", "best_batch", "goodput_scaling", "packed_nodes"]
