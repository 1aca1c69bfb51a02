"""A training job's configuration: one YAML file -> one frozen, validated ``TrainConfig``.

Every section is a frozen pydantic model that refuses unknown keys; a bad file raises
:class:`~hetflow.core.errors.InputError` naming the key path (``layout.tpp``) and what to write
instead. Each field's docstring is its documentation (``docs/training.md`` lists them).

Example (``examples/train_digits.yaml``)::

    name: digits-dp2
    model: {kind: mlp, hidden: [128, 128]}
    data: {dataset: digits}
    layout: {dp: 2}
    train: {steps: 300, batch_size: 64, lr: 0.003}
    checkpoint: {interval: 100}
    resources: {devices: cpu, max_failures: 2}

The ``model:`` section is read by the model spec it names (``kind`` a built-in, ``spec`` an
import path: :mod:`hetflow.workloads.models.spec`); so is what the rules below ask of the model.

Cross-field rules (checked in :meth:`TrainConfig._check_combinations`): the dataset matches the
model; the global batch splits evenly over dp replicas and pipeline microbatches; pp > 1 and
tp > 1 need a spec with a pipeline split and a tensor-parallel plan, and the spec's own checks
(tensor parallelism divides the widths it shards); DDP is not combined with tensor parallelism
(DDP does not take DTensor parameters; use ``data_parallel: fsdp``); fp16 loss scaling is not
combined with pipeline parallelism (the pipeline schedule runs backward itself).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator
from pydantic_core import PydanticCustomError

from hetflow.core.devices import DeviceKeys, DeviceSpec, override
from hetflow.core.errors import InputError
from hetflow.core.request import ParallelLayout, PlacementRequest
from hetflow.core.validation import describe
from hetflow.core.yamlfile import read_yaml
from hetflow.runtime.tracking import TrackingConfig
from hetflow.workloads.models.gpt.config import GPTConfig
from hetflow.workloads.models.mlp.config import MLPConfig
from hetflow.workloads.models.spec import (
    ModelSection,
    read_model_section,
    resolve_callable,
    spec_label,
    spec_of,
)


RANK_DEVICES = DeviceKeys("resources (each rank's devices)", ("kind", "model", "vendor", "memory"),
                         {"kind": "auto"})
"""A training config's ``resources.devices``: each rank's (hetflow.core.devices)."""


class _Section(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, use_attribute_docstrings=True)


# The built-in model sections live with their models (hetflow.workloads.models.<name>.model);
# a user's spec brings its own. ``model:`` is read by the spec it names (read_model_section).
ModelConfig = ModelSection


class DataConfig(_Section):
    """Where samples come from. Both datasets ship with the installation: nothing is downloaded."""

    dataset: str | None = None
    """Default: the model's own (``digits`` for mlp, ``python-source`` for gpt, a user spec's
    ``dataset_name``); naming it only confirms it. ``digits``: scikit-learn's 1797 8x8 digit
    images. ``python-source``: the source of a fixed list of modules of the running Python's
    standard library, as byte tokens (vocabulary 256)."""
    loader: str | None = None
    """Import path of a function that returns the split instead of the model's own dataset,
    ``"package.module:load"``: called as ``load(model_section, data_section)``, it returns a
    ``Dataset`` or a mapping of the arrays ``train_inputs``, ``train_targets``, ``val_inputs``,
    ``val_targets`` (deterministic: every rank calls it)."""
    val_fraction: float = Field(0.2, gt=0.0, lt=1.0)
    """Share of the samples held out for validation (the split is fixed by ``seed``)."""
    seed: int = 0
    """Seed of the train/validation split and of the per-epoch shuffle."""

    @field_validator("loader")
    @classmethod
    def _resolve_loader(cls, value: str | None) -> str | None:
        if value is not None:
            try:
                resolve_callable(value)
            except InputError as exc:
                raise PydanticCustomError("import_path", "{message}", {"message": str(exc)})
        return value


class LayoutConfig(_Section):
    """The parallel layout. World size = dp * pp * tp, one process (rank) per device."""

    dp: int = Field(1, gt=0)
    """Data-parallel replicas (mesh axis ``dp``, outermost)."""
    pp: int = Field(1, gt=0)
    """Pipeline stages per replica (mesh axis ``pp``)."""
    tp: int = Field(1, gt=0)
    """Tensor-parallel degree (mesh axis ``tp``, innermost: placed on the fastest links)."""
    data_parallel: Literal["ddp", "fsdp"] = "ddp"
    """How replicas share gradients: ``ddp`` (DistributedDataParallel, full copies) or
    ``fsdp`` (FSDP2 ``fully_shard``: parameters, gradients and optimizer state sharded over dp)."""
    pipeline_schedule: Literal["gpipe", "1f1b"] = "1f1b"
    """Pipeline schedule when ``pp > 1``: ``gpipe`` (all forwards, then all backwards) or
    ``1f1b`` (interleaved, fewer activations alive)."""
    microbatches: int = Field(2, gt=0)
    """Microbatches per step when ``pp > 1`` (1F1B needs at least ``pp``)."""

    @property
    def parallel(self) -> ParallelLayout:
        return ParallelLayout(dp=self.dp, pp=self.pp, tp=self.tp)

    @property
    def world_size(self) -> int:
        return self.dp * self.pp * self.tp


class OptimConfig(_Section):
    """The optimisation loop."""

    steps: int = Field(100, gt=0)
    """Optimizer steps in total (a resumed job continues up to this number); with
    ``step_gain``, steps of the reference batch."""
    batch_size: int = Field(64, gt=0)
    """Global batch: samples per step over all replicas (each dp replica takes batch_size/dp)."""
    optimizer: Literal["adamw", "sgd"] = "adamw"
    """``adamw``, or ``sgd`` with momentum 0.9 (whose steps scale with the gradient, so the
    layout tests use it: a wrongly scaled gradient shows in the loss)."""
    lr: float = Field(3e-3, gt=0)
    """Learning rate (constant)."""
    weight_decay: float = Field(0.0, ge=0)
    """Weight decay (decoupled for AdamW)."""
    precision: Literal["fp32", "bf16", "fp16"] = "fp32"
    """``fp32``; ``bf16`` (autocast, or FSDP2's mixed-precision policy); ``fp16`` (autocast with
    dynamic loss scaling)."""
    seed: int = 0
    """Seed of the model's initial weights (the same on every rank, for every layout)."""
    log_every: int = Field(10, gt=0)
    """Report the loss to the driver every N steps (and at the first step of each attempt)."""
    warmup_steps: int = Field(2, ge=0)
    """Steps left out of the samples/s figure (start-up, allocator and shape warm-up)."""
    step_gain: float = Field(1.0, ge=1.0, allow_inf_nan=False)
    """Progress one step makes, in steps of a reference batch: a goodput-adaptive job's
    statistical-efficiency gain at this ``batch_size`` (Pollux's; the controller sets it with
    the batch, docs/controller.md). ``steps`` then counts reference steps, and the run ends
    once its progress, kept in its checkpoints, reaches them. 1: every step is one."""


class CheckpointConfig(_Section):
    """Sharded checkpoints (torch.distributed.checkpoint), written atomically."""

    dir: str | None = None
    """Directory of the checkpoints; relative paths are taken from the current directory.
    Default: ``runs/<name>/checkpoints``. A job resumes from the newest complete checkpoint here."""
    interval: int = Field(0, ge=0)
    """Save every N steps (0: only at the end). The last step is always saved."""
    keep_last: int | None = Field(None, gt=0)
    """Keep only the newest N complete checkpoints (default: keep all)."""
    resume: bool = True
    """Start from the newest complete checkpoint in ``dir`` when there is one."""


class ResourcesConfig(_Section):
    """What each rank runs on, and how failures are handled."""

    devices: DeviceSpec = Field(default_factory=RANK_DEVICES.default)
    """Each rank's devices (:mod:`hetflow.core.devices`): ``kind`` ``cpu`` (CPU ranks with
    gloo), ``gpu`` (one GPU per rank, CUDA or ROCm, nccl; fails when none is visible) or
    ``auto`` (default: GPUs when the cluster has them, else CPU); ``model`` (only GPUs of this
    catalog model, e.g. ``MI300X``) and ``vendor`` (only GPUs of this vendor; hetflow-managed
    nodes; either makes it ``gpu``); ``memory``, the device memory each rank needs on
    hetflow-managed nodes, e.g. ``20GiB`` (the planner only picks devices that have it). The
    earlier flat keys (``device``, ``accelerator``, ``vendor``, ``memory``) are read with a
    deprecation warning until the next release."""
    cpus_per_rank: float = Field(1.0, gt=0)
    """CPUs Ray reserves for each rank's actor."""
    threads_per_rank: int = Field(1, gt=0)
    """torch intra-op threads in each rank (``torch.set_num_threads``)."""
    max_failures: int = Field(2, ge=0)
    """Restarts from the last checkpoint after a worker dies, before the job fails."""
    elastic: bool = False
    """After a failure, restart with fewer data-parallel replicas when the full layout no longer
    fits (the global batch is kept, so the loss curve is the same)."""
    placement_timeout_s: float = Field(120.0, gt=0)
    """How long to wait for Ray to commit the workers' placement before giving up."""
    ray_address: str | None = None
    """Ray cluster to join (``auto``, ``ray://...`` or ``host:port``); default: start a local one
    when none is running."""

    @model_validator(mode="before")
    @classmethod
    def _devices(cls, data: Any) -> Any:
        """``devices`` (hetflow.core.devices) with its defaults; the earlier flat keys folded
        into it with a warning."""
        return RANK_DEVICES.read(data, "resources")

    def placement_request(self, job_id: str, layout: ParallelLayout) -> PlacementRequest:
        """These resources for ``layout``'s ranks as the planner's request (hetflow-managed
        nodes): the one core request type, parsed the one way."""
        d = self.devices
        return PlacementRequest.parse(job_id, layout=layout, memory=d.memory, vendor=d.vendor, model=d.model)


class TrainConfig(_Section):
    """One training job."""

    name: str = Field("train", min_length=1, pattern=r"^[A-Za-z0-9][A-Za-z0-9_.-]*$")
    """Job name: names the Ray placement group and the default run directory."""
    model: Any = Field(default_factory=MLPConfig)
    """The model, written for one device: a built-in (``kind: mlp`` or ``kind: gpt`` and its
    keys) or your own (``spec: "package.module:SPEC"`` and its keys); see
    :mod:`hetflow.workloads.models.spec`."""
    data: DataConfig = Field(default_factory=DataConfig)
    """The dataset."""
    layout: LayoutConfig = Field(default_factory=LayoutConfig)
    """Parallel layout: dp x pp x tp and how each axis is applied."""
    train: OptimConfig = Field(default_factory=OptimConfig)
    """Steps, batch, optimizer and precision."""
    checkpoint: CheckpointConfig = Field(default_factory=CheckpointConfig)
    """Checkpoint directory and interval."""
    resources: ResourcesConfig = Field(default_factory=ResourcesConfig)
    """Devices, CPUs, failures."""
    tracking: TrackingConfig = Field(default_factory=TrackingConfig)
    """Experiment tracking, off by default: ``tracking: {mlflow: {uri, experiment}}`` logs the
    job to MLflow (docs/tracking.md; ``hetflow train --mlflow URI`` does the same)."""

    @field_validator("model", mode="before")
    @classmethod
    def _read_model(cls, value: Any) -> ModelSection:
        return read_model_section(value)

    @model_validator(mode="after")
    def _check_combinations(self) -> "TrainConfig":
        errors = combination_errors(self)
        if errors:
            raise ValueError("; ".join(errors))
        return self

    @property
    def dataset(self) -> str:
        """The name of the split it trains on (``data.dataset``, ``data.loader``, or the
        model's own)."""
        return self.data.dataset or self.data.loader or spec_of(self.model).dataset_name

    @property
    def checkpoint_dir(self) -> Path:
        return Path(self.checkpoint.dir or f"runs/{self.name}/checkpoints").absolute()

    def with_overrides(self, **sections: dict[str, Any]) -> "TrainConfig":
        """A copy with some fields of some sections replaced, validated like a file."""
        data = self.model_dump(mode="json")
        for section, values in sections.items():
            if section == "resources" and isinstance(values, dict):
                data[section] = override(data[section], values)  # devices key by key
            elif isinstance(data.get(section), dict):
                data[section] = {**data[section], **values}
            else:
                data[section] = values
        return config_from_dict(data, source="overrides")


def with_dp(config: TrainConfig, dp: int, batch_size: int | None = None,
            step_gain: float | None = None) -> TrainConfig | None:
    """The same job with ``dp`` data-parallel replicas (pp and tp kept) and the same global
    batch - so the same batches in the same order and the same loss curve, at another speed -
    or None where that layout is not valid (the batch does not split evenly over the replicas,
    or over microbatches with a pipeline; DDP with tensor parallelism). One replica uses DDP.
    Elastic restarts use it: ``resources.elastic`` after a failure (``job.smaller_layouts``)
    and the controller's resizes (``JobSpec.at_size``). ``batch_size``: run this global batch
    instead (a goodput-adaptive job's batch at that size; its loss curve is then another), each
    step counted as ``step_gain`` reference steps."""
    layout = config.layout
    batch = config.train.batch_size if batch_size is None else batch_size
    per_replica, rem = divmod(batch, dp)
    if rem or (layout.pp > 1 and per_replica % layout.microbatches):
        return None
    mode = layout.data_parallel if dp > 1 else "ddp"
    sections: dict[str, dict[str, Any]] = {"layout": {"dp": dp, "data_parallel": mode}}
    if batch != config.train.batch_size:
        sections["train"] = {"batch_size": batch}
    if step_gain is not None and step_gain != config.train.step_gain:
        sections.setdefault("train", {})["step_gain"] = step_gain
    try:
        return config.with_overrides(**sections)
    except InputError:
        return None


def combination_errors(config: TrainConfig) -> list[str]:
    """Rules that tie several fields together; each message says how to fix the file."""
    errors: list[str] = []
    model, layout, train = config.model, config.layout, config.train
    spec, label = spec_of(model), spec_label(model)
    if config.data.dataset is not None and config.data.loader is not None:
        errors.append("data: give dataset (the model's own split) or loader (your function), "
                      "not both")
    elif config.data.dataset not in (None, spec.dataset_name):
        errors.append(f"{label} trains on data.dataset {spec.dataset_name}, "
                      f"not {config.data.dataset} (or give data.loader)")
    if train.batch_size % layout.dp:
        errors.append(f"train.batch_size {train.batch_size} must split evenly over layout.dp "
                      f"{layout.dp} replicas")
    per_replica = train.batch_size // layout.dp
    if layout.pp > 1:
        if per_replica % layout.microbatches:
            errors.append(f"each replica's batch ({per_replica}) must split into "
                          f"layout.microbatches {layout.microbatches}")
        if layout.pipeline_schedule == "1f1b" and layout.microbatches < layout.pp:
            errors.append(f"1f1b needs layout.microbatches >= pp ({layout.pp}); "
                          f"got {layout.microbatches}")
        if spec.pipeline_blocks is None:
            errors.append(f"layout.pp {layout.pp}: {label} has no pipeline split (its spec "
                          "gives no pipeline_blocks); use layout.pp 1")
        elif (blocks := spec.pipeline_blocks(model)) < layout.pp:
            errors.append(f"layout.pp {layout.pp} is more stages than the model's {blocks} "
                          "blocks")
        if train.precision == "fp16":
            errors.append("fp16 loss scaling does not combine with pipeline parallelism "
                          "(the schedule runs backward itself); use precision bf16")
    if layout.tp > 1:
        if spec.parallelize is None:
            errors.append(f"layout.tp {layout.tp}: {label} has no tensor-parallel plan (its "
                          "spec gives no parallelize); use layout.tp 1")
        if layout.dp > 1 and layout.data_parallel == "ddp":
            errors.append("dp > 1 with tp > 1 needs layout.data_parallel: fsdp (DDP does not take "
                          "tensor-parallel DTensor parameters)")
    if spec.check is not None:
        errors.extend(spec.check(model, layout))
    return errors


def config_from_dict(data: Any, source: str = "config") -> TrainConfig:
    """Validate a parsed document; errors become one InputError naming each key path."""
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise InputError(f"{source}: expected a mapping of sections (name, model, data, layout, "
                         f"train, checkpoint, resources), got {type(data).__name__}")
    try:
        return TrainConfig.model_validate(data)
    except ValidationError as exc:
        raise InputError(describe(exc, TrainConfig, source)) from None


def load_config(path: str | Path) -> TrainConfig:
    """Read a training YAML file. Raises InputError for a missing or invalid file."""
    path = Path(path)
    data = read_yaml(path, "training config")
    return config_from_dict(data, source=str(path))


__all__ = [
    "CheckpointConfig", "DataConfig", "GPTConfig", "LayoutConfig", "MLPConfig", "ModelConfig",
    "OptimConfig", "ResourcesConfig", "TrainConfig", "combination_errors", "config_from_dict",
    "load_config", "with_dp",
]
