"""Ray Train's trainer API on hetflow's placement: a Ray Train script ports by its imports alone.

    import hetflow.train as train                      # was: import ray.train as train
    from hetflow.train import Checkpoint, RunConfig, ScalingConfig
    from hetflow.train.torch import TorchTrainer       # was: from ray.train.torch import ...

    trainer = TorchTrainer(train_func, train_loop_config={"lr": 1e-2},
                           scaling_config=ScalingConfig(num_workers=2, use_gpu=False),
                           run_config=RunConfig(name="linear", storage_path="runs"))
    result = trainer.fit()
    print(result.metrics, result.checkpoint.path)

``fit()`` is :func:`hetflow.train.run` (one Ray actor per rank on the planner's devices, each
rank seeing exactly its own device; torch.distributed joined; ``report`` a collective whose
checkpoints commit atomically; restarts from the newest checkpoint on failure). The fields
map as follows - and what hetflow cannot do is refused with one line, never ignored:

* ``ScalingConfig``: ``num_workers`` (an int; Ray Train 2's elastic ``(min, max)`` is refused),
  ``use_gpu`` (one GPU per worker, CUDA or ROCm), ``resources_per_worker`` (``CPU`` reserves CPUs
  per worker; ``GPU`` may only be 1: hetflow binds each rank to exactly one device),
  ``accelerator_type`` (a catalog model, e.g. ``MI300X``); ``placement_strategy`` is hetflow's
  planner's (TP groups on the fastest links), not Ray's ``PACK``/``SPREAD``. hetflow's own:
  ``layout`` (``{"dp": 2, "tp": 2}``: ``num_workers`` is its world size), ``vendor``, ``memory``
  (per worker, e.g. ``"20GiB"``), ``threads_per_worker``, ``placement_timeout_s``.
* ``RunConfig``: ``name`` and ``storage_path`` (the run directory is ``storage_path/name``,
  checkpoints ``checkpoint_<n>`` inside; default ``~/ray_results``, as Ray's), ``failure_config``,
  ``checkpoint_config``. A second ``fit()`` with the same name and storage path resumes from the
  run's newest checkpoint (``train.get_checkpoint()``), as Ray Train 2 does.
* ``FailureConfig(max_failures)`` (``-1``: no limit); ``CheckpointConfig(num_to_keep,
  checkpoint_score_attribute, checkpoint_score_order)``: the best ``num_to_keep`` by the score
  (the newest when no score is named) and always the newest.
* ``TorchConfig(timeout_s)``; its ``backend`` is hetflow's choice (nccl on GPUs - RCCL under
  ROCm - gloo on CPUs), a different one is refused.
* ``Result``: ``metrics`` (rank 0's last report), ``checkpoint`` (the newest), ``path``,
  ``error`` (None: a failed run raises :class:`TrainingFailedError` from ``fit()``, as Ray Train's
  does), ``best_checkpoints``, ``metrics_dataframe``, ``return_value``.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from hetflow.core.errors import InputError
from hetflow.workloads.train.api import Result, TrainingFailed, _layout, run
from hetflow.core.topology import AcceleratorVendor

TrainingFailedError = TrainingFailed  # Ray Train's name for it


@dataclass
class ScalingConfig:
    """How many workers, on what (Ray Train's ``ScalingConfig`` plus hetflow's device fields)."""

    num_workers: int | None = None
    use_gpu: bool = False
    resources_per_worker: Mapping[str, float] | None = None
    placement_strategy: str = "PACK"
    accelerator_type: str | None = None
    trainer_resources: Mapping[str, float] | None = None
    # hetflow's own
    layout: Any = None
    vendor: AcceleratorVendor | None = None
    memory: str | None = None
    threads_per_worker: int | None = None
    placement_timeout_s: float | None = None

    def _resolved(self) -> tuple[Any, dict[str, Any]]:
        """(the layout, the fields of ``hetflow.train.run``'s ``resources``)."""
        workers = self.num_workers
        if isinstance(workers, (tuple, list)):
            raise InputError("ScalingConfig(num_workers=(min, max)): elastic ranges are not supported "
                             "by hetflow.train; give a number of workers")
        if workers is not None and (isinstance(workers, bool) or not isinstance(workers, int) or workers < 1):
            raise InputError(f"ScalingConfig(num_workers={workers!r}): give a whole number >= 1")
        if self.layout is not None:
            layout = _layout(self.layout)
            if workers is not None and workers != layout.world_size:
                raise InputError(f"ScalingConfig: num_workers={workers} but layout {self.layout!r} has "
                                 f"{layout.world_size} ranks; give one of them, or make them agree")
        else:
            layout = _layout(workers or 1)
        devices: dict[str, Any] = {"kind": "gpu" if self.use_gpu else "cpu"}
        resources: dict[str, Any] = {"devices": devices}
        for key, amount in dict(self.resources_per_worker or {}).items():
            if key == "CPU":
                resources["cpus_per_rank"] = float(amount)
            elif key == "GPU":
                if float(amount) != 1.0:
                    raise InputError(f"ScalingConfig(resources_per_worker={{'GPU': {amount}}}): hetflow binds "
                                     "each worker to exactly one device; for several GPUs per model "
                                     "use layout={'tp': N} (tensor parallel ranks on the fastest links)")
                devices["kind"] = "gpu"
            else:
                raise InputError(f"ScalingConfig(resources_per_worker): {key!r} is not supported; give CPU "
                                 "(and GPU: 1), and the device with accelerator_type, vendor or memory")
        if self.accelerator_type:
            devices["model"] = self.accelerator_type
        for key, value in (("vendor", self.vendor), ("memory", self.memory)):
            if value is not None:
                devices[key] = value
        for key, value in (("threads_per_rank", self.threads_per_worker),
                           ("placement_timeout_s", self.placement_timeout_s)):
            if value is not None:
                resources[key] = value
        if self.placement_strategy not in ("PACK", "SPREAD", "STRICT_PACK", "STRICT_SPREAD"):
            raise InputError(f"ScalingConfig(placement_strategy={self.placement_strategy!r}): not a Ray "
                             "strategy (PACK, SPREAD, STRICT_PACK, STRICT_SPREAD); hetflow's planner "
                             "places the workers either way")
        return layout, resources

    @property
    def total_resources(self) -> dict[str, float]:
        layout, resources = self._resolved()
        n = layout.world_size
        out = {"CPU": n * float(resources.get("cpus_per_rank", 1.0))}
        if resources["devices"]["kind"] == "gpu":
            out["GPU"] = float(n)
        return out


@dataclass
class FailureConfig:
    """Restarts of the whole worker group from the newest checkpoint (``-1``: no limit)."""

    max_failures: int = 0

    def _limit(self) -> int:
        if not isinstance(self.max_failures, int) or self.max_failures < -1:
            raise InputError(f"FailureConfig(max_failures={self.max_failures!r}): give -1 (no limit) "
                             "or a number >= 0")
        return 10**9 if self.max_failures == -1 else self.max_failures


@dataclass
class CheckpointConfig:
    """Which committed checkpoints are kept."""

    num_to_keep: int | None = None
    checkpoint_score_attribute: str | None = None
    checkpoint_score_order: Literal["max", "min"] = "max"

    def _check(self) -> None:
        if self.num_to_keep is not None and (not isinstance(self.num_to_keep, int) or self.num_to_keep < 1):
            raise InputError(f"CheckpointConfig(num_to_keep={self.num_to_keep!r}): give a number >= 1 "
                             "or None (keep every checkpoint)")
        if self.checkpoint_score_order not in ("max", "min"):
            raise InputError(f"CheckpointConfig(checkpoint_score_order={self.checkpoint_score_order!r}): "
                             "give 'max' or 'min'")


@dataclass
class RunConfig:
    """Where the run keeps its checkpoints, and its failure and checkpoint rules."""

    name: str | None = None
    storage_path: str | None = None
    failure_config: FailureConfig | None = None
    checkpoint_config: CheckpointConfig | None = None
    callbacks: list[Any] | None = None
    worker_runtime_env: Mapping[str, Any] | None = None

    def _directory(self) -> tuple[str, Path]:
        name = self.name or time.strftime("ray_train_run-%Y-%m-%d_%H-%M-%S")
        if "/" in name or name in (".", ".."):
            raise InputError(f"RunConfig(name={name!r}): a name, not a path (give the folder as storage_path)")
        if "://" in str(self.storage_path or ""):
            raise InputError(f"RunConfig(storage_path={self.storage_path!r}): hetflow.train writes checkpoints "
                             "to a file system path every worker and the driver reach (a shared mount on a "
                             "multi-node cluster), not to object storage")
        storage = Path(self.storage_path or "~/ray_results").expanduser()
        return name, storage.absolute() / name


@dataclass
class TorchConfig:
    """torch.distributed's set-up (hetflow picks the backend by device: nccl/RCCL or gloo)."""

    backend: str | None = None
    init_method: str = "env"
    timeout_s: int = 1800


class DataParallelTrainer:
    """Ray Train's trainer shape: built once, ``fit()`` runs it to the end."""

    def __init__(self, train_loop_per_worker: Callable[..., Any], *,
                 train_loop_config: Mapping[str, Any] | None = None,
                 scaling_config: ScalingConfig | None = None, run_config: RunConfig | None = None,
                 torch_config: TorchConfig | None = None, datasets: Any = None,
                 dataset_config: Any = None, resume_from_checkpoint: Any = None,
                 metadata: Mapping[str, Any] | None = None, address: str | None = None) -> None:
        if not callable(train_loop_per_worker):
            raise InputError("train_loop_per_worker must be a function, got "
                             f"{type(train_loop_per_worker).__name__}")
        if datasets is not None or dataset_config is not None:
            raise InputError("datasets=: Ray Data datasets are not supported by hetflow.train; build a "
                             "torch DataLoader inside the train function and pass it through "
                             "hetflow.train.torch.prepare_data_loader")
        if resume_from_checkpoint is not None:
            raise InputError("resume_from_checkpoint= is not supported (Ray Train 2 deprecates it too): "
                             "fit() again with the same RunConfig(name, storage_path) resumes from the "
                             "run's newest checkpoint, or pass a checkpoint path in train_loop_config")
        self.train_loop_per_worker = train_loop_per_worker
        self.train_loop_config = train_loop_config
        self.scaling_config = scaling_config or ScalingConfig()
        self.run_config = run_config or RunConfig()
        self.torch_config = torch_config or TorchConfig()
        self.metadata = dict(metadata or {})
        self.address = address
        for what, value, kind in (("scaling_config", self.scaling_config, ScalingConfig),
                                  ("run_config", self.run_config, RunConfig),
                                  ("torch_config", self.torch_config, TorchConfig)):
            if not isinstance(value, kind):
                raise InputError(f"{what}: expected hetflow.train.{kind.__name__}, got {type(value).__module__}."
                                 f"{type(value).__name__} (change the script's ray.train imports to hetflow.train)")
        self._check()

    def _check(self) -> None:
        run_config = self.run_config
        if run_config.callbacks:
            raise InputError("RunConfig(callbacks=...): Ray Train callbacks are not supported by "
                             "hetflow.train; read result.metrics_history after fit()")
        if run_config.worker_runtime_env:
            raise InputError("RunConfig(worker_runtime_env=...): not supported; give the runtime_env to "
                             "ray.init before fit()")
        if self.torch_config.backend not in (None, "nccl", "gloo"):
            raise InputError(f"TorchConfig(backend={self.torch_config.backend!r}): hetflow uses nccl (RCCL "
                             "under ROCm) on GPUs and gloo on CPUs")
        if self.torch_config.init_method not in ("env", "tcp"):
            raise InputError(f"TorchConfig(init_method={self.torch_config.init_method!r}): give 'env' or 'tcp'")
        if not isinstance(self.torch_config.timeout_s, (int, float)) or self.torch_config.timeout_s <= 0:
            raise InputError(f"TorchConfig(timeout_s={self.torch_config.timeout_s!r}): give seconds > 0")
        if run_config.failure_config is not None:
            run_config.failure_config._limit()
        if run_config.checkpoint_config is not None:
            run_config.checkpoint_config._check()
        self.scaling_config._resolved()
        run_config._directory()

    def fit(self) -> Result:
        """Run to the end; the run's :class:`Result`. Raises :class:`TrainingFailedError` after
        more failures than ``FailureConfig.max_failures``."""
        layout, resources = self.scaling_config._resolved()
        backend = self.torch_config.backend
        if backend is not None and (backend == "nccl") != (resources["devices"]["kind"] == "gpu"):
            raise InputError(f"TorchConfig(backend={backend!r}) does not fit "
                             f"use_gpu={self.scaling_config.use_gpu}: nccl is for GPU workers, gloo for CPU ones")
        name, directory = self.run_config._directory()
        failure = self.run_config.failure_config or FailureConfig()
        keep = self.run_config.checkpoint_config or CheckpointConfig()
        result = run(self.train_loop_per_worker, self.train_loop_config, layout=layout,
                     resources=resources, checkpoint_dir=directory, max_failures=failure._limit(),
                     keep_last=keep.num_to_keep, name=name, address=self.address,
                     keep_score=((keep.checkpoint_score_attribute, keep.checkpoint_score_order)
                                 if keep.checkpoint_score_attribute else None),
                     timeout_s=float(self.torch_config.timeout_s))
        return result


class TorchTrainer(DataParallelTrainer):
    """Ray Train's ``TorchTrainer`` (``hetflow.train.torch.TorchTrainer``)."""


__all__ = ["CheckpointConfig", "DataParallelTrainer", "FailureConfig", "RunConfig", "ScalingConfig",
           "TorchConfig", "TorchTrainer", "TrainingFailedError"]
