"""The digits MLP's tensor-parallel plan: hidden layers sharded in (column, row) pairs."""

from __future__ import annotations

from typing import Any

from torch import nn
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module


def apply_tp(model: nn.Module, tp_mesh: DeviceMesh) -> None:
    """Shard this stage's hidden layers over ``tp_mesh``, in place.

    Pairs inside the stage: the first layer's output stays sharded through the ReLU and is the
    second's sharded input, so each pair costs one all-reduce. An odd last layer stays whole.
    """
    keys = list(model.layers.keys())
    for first, second in zip(keys[0::2], keys[1::2]):
        parallelize_module(model.layers[first], tp_mesh, {"linear": ColwiseParallel()})
        parallelize_module(model.layers[second], tp_mesh, {"linear": RowwiseParallel()})


from hetflow.workloads.models.mlp.config import tp_errors  # noqa: E402 - kept importable here

__all__ = ["apply_tp", "tp_errors"]
