"""``hetflow.train.torch``: Ray Train's ``ray.train.torch`` helpers, on hetflow's exact devices.

``get_device()`` is the rank's own device (``cuda:0`` - the one device the rank sees - or
``cpu``); ``prepare_model`` moves a model there and wraps it in DistributedDataParallel when
there are several ranks; ``prepare_data_loader`` gives each rank its share of a DataLoader's
samples (a DistributedSampler) and moves each batch to the device.
"""

from __future__ import annotations

from typing import Any

from hetflow.workloads.train.worker import get_context
from hetflow.workloads.train.trainer import TorchConfig, TorchTrainer


def get_device() -> Any:
    return get_context().device


def get_devices() -> list[Any]:
    """The rank's devices: exactly one (hetflow binds each rank to one device)."""
    return [get_context().device]


def enable_reproducibility(seed: int = 0) -> None:
    """Seed Python, numpy and torch and ask torch for deterministic kernels, as Ray Train's
    helper of the same name does (slower; for debugging and comparisons)."""
    import os
    import random

    import torch

    random.seed(seed)
    torch.manual_seed(seed)
    try:
        import numpy

        numpy.random.seed(seed)
    except ImportError:  # numpy is optional for a train_func
        pass
    os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")  # cuBLAS's deterministic mode
    torch.use_deterministic_algorithms(True)
    torch.backends.cudnn.benchmark = False


def prepare_model(model: Any, parallel_strategy: str | None = "ddp", **ddp_kwargs: Any) -> Any:
    """``model`` on the rank's device, in DDP when the world has several ranks (``None``: not
    wrapped)."""
    from torch.nn.parallel import DistributedDataParallel

    ctx = get_context()
    model = model.to(ctx.device)
    if parallel_strategy is None or ctx.world_size == 1:
        return model
    if parallel_strategy != "ddp":
        raise ValueError(f"parallel_strategy {parallel_strategy!r}: only 'ddp' or None "
                         "(for FSDP2 or tensor parallelism use ctx.device_mesh with torch's APIs)")
    ids = [ctx.device.index] if ctx.device.type == "cuda" else None
    return DistributedDataParallel(model, device_ids=ids, **ddp_kwargs)


class _DeviceLoader:
    """A DataLoader whose batches arrive on the rank's device; ``set_epoch`` reaches the sampler."""

    def __init__(self, loader: Any, device: Any) -> None:
        self.loader, self.device = loader, device

    def __len__(self) -> int:
        return len(self.loader)

    def __iter__(self) -> Any:
        for batch in self.loader:
            yield _to(batch, self.device)

    def set_epoch(self, epoch: int) -> None:
        sampler = getattr(self.loader, "sampler", None)
        if hasattr(sampler, "set_epoch"):
            sampler.set_epoch(epoch)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.loader, name)


def _to(batch: Any, device: Any) -> Any:
    if hasattr(batch, "to"):
        return batch.to(device)
    if isinstance(batch, (list, tuple)):
        return type(batch)(_to(b, device) for b in batch)
    if isinstance(batch, dict):
        return {k: _to(v, device) for k, v in batch.items()}
    return batch


def prepare_data_loader(loader: Any, add_dist_sampler: bool = True, move_to_device: bool = True) -> Any:
    """Each rank gets its share of ``loader``'s dataset (same batch size, the loader's shuffle)."""
    from torch.utils.data import DataLoader, DistributedSampler, RandomSampler

    ctx = get_context()
    if add_dist_sampler and ctx.world_size > 1 and not isinstance(loader.sampler, DistributedSampler):
        shuffle = isinstance(loader.sampler, RandomSampler)
        sampler = DistributedSampler(loader.dataset, num_replicas=ctx.world_size,
                                     rank=ctx.world_rank, shuffle=shuffle)
        loader = DataLoader(loader.dataset, batch_size=loader.batch_size, sampler=sampler,
                            num_workers=loader.num_workers, collate_fn=loader.collate_fn,
                            pin_memory=loader.pin_memory, drop_last=loader.drop_last)
    return _DeviceLoader(loader, ctx.device) if move_to_device else loader


__all__ = ["TorchConfig", "TorchTrainer", "enable_reproducibility", "get_device", "get_devices",
           "prepare_data_loader", "prepare_model"]
