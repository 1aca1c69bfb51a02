"""The GPT's tensor-parallel plan (Megatron-style, on the ``tp`` mesh axis).

In each block wq/wk/wv and the MLP's w1 are column-sharded, wo and w2 row-sharded: one
all-reduce after attention, one after the MLP. Embeddings, norms and the head stay replicated.
Attention reads its head count from the projection's width at run time, so each rank computes
its share of the heads with the same code.
"""

from __future__ import annotations

from typing import Any

from torch import nn
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module


def apply_tp(model: nn.Module, tp_mesh: DeviceMesh) -> None:
    """Shard every block of this stage over ``tp_mesh``, in place."""
    plan = {
        "attention.wq": ColwiseParallel(),
        "attention.wk": ColwiseParallel(),
        "attention.wv": ColwiseParallel(),
        "attention.wo": RowwiseParallel(),
        "feed_forward.w1": ColwiseParallel(),
        "feed_forward.w2": RowwiseParallel(),
    }
    for block in model.layers.values():
        parallelize_module(block, tp_mesh, plan)


from hetflow.workloads.models.gpt.config import tp_errors  # noqa: E402 - kept importable here

__all__ = ["apply_tp", "tp_errors"]
