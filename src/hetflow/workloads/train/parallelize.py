"""Apply a parallel layout to a single-device model, from outside (the torchtitan way).

Order, per rank (each step needs the one before it):

1. **Pipeline split** (``pp > 1``): keep this stage's contiguous run of ``layers`` and drop
   the modules of the other stages (``FIRST_STAGE`` / ``LAST_STAGE`` become ``None``). Names are
   unchanged, so checkpoints from any layout hold the same keys.
2. **Tensor parallel** (``tp > 1``) on the ``tp`` mesh axis: the model spec's own plan
   (``ModelSpec.parallelize``, beside the model: ``models/gpt/parallelize.py`` shards attention
   and the MLP Megatron-style, ``models/mlp/parallelize.py`` hidden layers in (column, row)
   pairs). A spec without a plan cannot take tp > 1 (the config refuses it).
3. **Data parallel** (``dp > 1``) on the ``dp`` axis: FSDP2 ``fully_shard`` per block then the
   root (mixed precision by its policy), or DDP on the ``dp`` process group. DDP does not take
   DTensor parameters, so ``dp x tp`` needs FSDP (the config refuses the other combination).
4. **Pipeline schedule**: a ``PipelineStage`` on the ``pp`` axis's group, driven by GPipe or
   1F1B; gradients are averaged over microbatches (``scale_grads``) so every layout optimises
   the same mean loss.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from torch import nn
from torch.distributed.device_mesh import DeviceMesh, init_device_mesh
from torch.nn.parallel import DistributedDataParallel

from hetflow.core.request import MeshAxis
from hetflow.workloads.train.config import TrainConfig
from hetflow.workloads.models.spec import spec_of

DTYPES = {"fp32": None, "bf16": torch.bfloat16, "fp16": torch.float16}
# torch.distributed.pipelining is imported only by a pipelined layout (pp > 1), and FSDP only by
# an FSDP layout: each costs every rank process (and every Tune trial, which imports the loop)
# ~0.6-0.8 s of CPU at start otherwise (DTensor's operator tables).
SCHEDULES = {"gpipe": "ScheduleGPipe", "1f1b": "Schedule1F1B"}


@dataclass
class ParallelModel:
    """This rank's share of the model, ready to train.

    ``module`` is what the optimizer and the checkpoint see (DDP-wrapped or FSDP-sharded).
    With a pipeline, ``schedule`` runs forward and backward; otherwise the caller does.
    ``autocast_dtype`` is the dtype to autocast forward passes to (``None``: no autocast,
    because the precision is fp32 or FSDP's mixed-precision policy handles it).
    """

    module: nn.Module
    schedule: Any | None
    is_first_stage: bool
    is_last_stage: bool
    autocast_dtype: torch.dtype | None


def build_mesh(config: TrainConfig, device_type: str) -> DeviceMesh:
    """The world as a (dp, pp, tp) mesh; rank order as :class:`~hetflow.core.request.ParallelLayout`."""
    layout = config.layout
    return init_device_mesh(
        device_type, (layout.dp, layout.pp, layout.tp),
        mesh_dim_names=tuple(axis.value for axis in MeshAxis),
    )


def stage_blocks(num_blocks: int, num_stages: int, stage: int) -> range:
    """Blocks of pipeline stage ``stage``: an even split, earlier stages taking the remainder."""
    assert 0 <= stage < num_stages <= num_blocks
    base, extra = divmod(num_blocks, num_stages)
    start = stage * base + min(stage, extra)
    return range(start, start + base + (1 if stage < extra else 0))


def pipeline_split(model: nn.Module, stage: int, num_stages: int) -> nn.Module:
    """Keep only stage ``stage``'s blocks (and the embeddings / head if it is first / last)."""
    keep = {str(i) for i in stage_blocks(len(model.layers), num_stages, stage)}
    for key in list(model.layers.keys()):
        if key not in keep:
            del model.layers[key]
    if stage != 0:
        for name in model.FIRST_STAGE:
            setattr(model, name, None)
    if stage != num_stages - 1:
        for name in model.LAST_STAGE:
            setattr(model, name, None)
    return model


def apply_fsdp(model: nn.Module, dp_mesh: DeviceMesh, dtype: torch.dtype | None) -> nn.Module:
    """FSDP2: each block is one all-gather unit, the root holds the rest (a model without a
    ``layers`` ModuleDict of blocks is one unit)."""
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    policy = MixedPrecisionPolicy(param_dtype=dtype, reduce_dtype=torch.float32) if dtype \
        else MixedPrecisionPolicy()
    blocks = getattr(model, "layers", None)
    for block in blocks.values() if isinstance(blocks, nn.ModuleDict) else ():
        fully_shard(block, mesh=dp_mesh, mp_policy=policy)
    fully_shard(model, mesh=dp_mesh, mp_policy=policy)
    return model


def apply_ddp(model: nn.Module, dp_mesh: DeviceMesh, device: torch.device,
              pipelined: bool = False) -> nn.Module:
    # Under a pipeline schedule DDP sees several backward passes per step (one per microbatch,
    # under no_sync), and its one-time bucket rebuild then counts every parameter once per
    # microbatch and fails an internal assert (torch 2.13). find_unused_parameters turns the
    # rebuild off, at the price of one graph walk per forward.
    return DistributedDataParallel(
        model,
        process_group=dp_mesh.get_group(),
        device_ids=[device.index] if device.type == "cuda" else None,
        find_unused_parameters=pipelined,
    )


def parallelize(model: nn.Module, config: TrainConfig, mesh: DeviceMesh,
                device: torch.device) -> ParallelModel:
    """Split, shard and wrap ``model`` (built identically on every rank) for this rank."""
    layout = config.layout
    spec = spec_of(config.model)
    dtype = DTYPES[config.train.precision]
    pp_index = mesh[MeshAxis.PP.value].get_local_rank()
    first, last = pp_index == 0, pp_index == layout.pp - 1
    if layout.pp > 1:
        model = pipeline_split(model, pp_index, layout.pp)
    model.to(device)
    if layout.tp > 1:
        assert spec.parallelize is not None, "the config refuses tp > 1 without a plan"
        spec.parallelize(model, mesh[MeshAxis.TP.value])
    autocast_dtype = dtype
    if layout.dp > 1 and layout.data_parallel == "fsdp":
        model = apply_fsdp(model, mesh[MeshAxis.DP.value], dtype)
        autocast_dtype = None  # the FSDP policy casts parameters itself
    elif layout.dp > 1:
        model = apply_ddp(model, mesh[MeshAxis.DP.value], device, pipelined=layout.pp > 1)
    schedule = None
    if layout.pp > 1:
        from torch.distributed import pipelining

        stage = pipelining.PipelineStage(model, pp_index, layout.pp, device,
                              group=mesh[MeshAxis.PP.value].get_group())
        schedule = getattr(pipelining, SCHEDULES[layout.pipeline_schedule])(
            stage, n_microbatches=layout.microbatches, loss_fn=spec.loss, scale_grads=True)
    return ParallelModel(model, schedule, first, last, autocast_dtype)


__all__ = ["ParallelModel", "apply_ddp", "apply_fsdp", "build_mesh", "parallelize",
           "pipeline_split", "stage_blocks", "DTYPES"]
