"""A tuning trial that runs the user's own function (``trainable: "pkg.mod:fn"``).

The trial's device is bound first, as for hetflow's own trials (the planner chose it:
:func:`~hetflow.workloads.tune.placement.bind_planned_device`); then ``fn`` is called with one
dict - the run's fixed ``config``, the sampled values and ``epochs`` (``budget.epochs``) - inside
a one-rank ``hetflow.train`` context, so the function reports the way it would under
``hetflow.train.run``: ``hetflow.train.report(metrics, checkpoint=...)`` becomes Tune's report
(ASHA judges each report as one epoch) and ``hetflow.train.get_checkpoint()`` Tune's checkpoint
of the trial (a resumed or restored trial). Ray Tune's own ``tune.report`` works too.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

from hetflow.workloads.tune.space import TRAINABLE_SECTION, SearchSpace


@dataclass(frozen=True)
class UserTrialSetup:
    trainable: str  # package.module:function
    fixed: dict[str, Any]
    space: SearchSpace
    epochs: int
    threads: int
    device: str  # resources.devices.kind: auto, cpu or gpu


def trial_values(setup: UserTrialSetup, sampled: dict[str, Any]) -> dict[str, Any]:
    values = {"epochs": setup.epochs, **setup.fixed}
    values.update(setup.space.overrides(sampled).get(TRAINABLE_SECTION, {}))
    return values


def run_user_trial(sampled: dict[str, Any], setup: UserTrialSetup) -> Any:
    import torch

    from hetflow.core.request import ParallelLayout
    from hetflow.workloads.models.spec import resolve_callable
    from hetflow.workloads.train import worker
    from hetflow.workloads.train.loop import select_device
    from hetflow.workloads.tune.placement import bind_planned_device

    bind_planned_device()  # before anything initialises a GPU
    torch.set_num_threads(setup.threads)
    fn = resolve_callable(setup.trainable)
    device = select_device(setup.device)
    worker._CONTEXT = worker.TrainContext(
        world_rank=0, world_size=1, local_rank=0, local_world_size=1, node_rank=0,
        layout=ParallelLayout(), device=device, backend="", device_mesh=None, attempt=0,
        name=setup.trainable, checkpoint_dir=os.getcwd(), _tune=True)
    try:
        return fn(trial_values(setup, sampled))
    finally:
        worker._CONTEXT = None
