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
    resources: {device: cpu, max_failures: 2}

Cross-field rules (checked in :meth:`TrainConfig._check_combinations`): the dataset matches the
model; the global batch splits evenly over dp replicas and pipeline microbatches; tensor
parallelism divides the widths it shards; DDP is not combined with tensor parallelism (DDP does
not take DTensor parameters; use ``data_parallel: fsdp``); fp16 loss scaling is not combined
with pipeline parallelism (the pipeline schedule runs backward itself).
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from hetflow.core.errors import InputError
from hetflow.core.request import ParallelLayout
from hetflow.core.validation import describe
from hetflow.core.yamlfile import read_yaml


class _Section(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, use_attribute_docstrings=True)


class MLPConfig(_Section):
    """A multi-layer perceptron for scikit-learn's 8x8 digits (64 inputs, 10 classes)."""

    kind: Literal["mlp"] = "mlp"
    """Model family: ``mlp`` (digits classifier) or ``gpt`` (character-level transformer)."""
    hidden: tuple[Annotated[int, Field(gt=0)], ...] = (128, 128)
    """Widths of the hidden layers, input side first. Tensor parallelism shards them in
    (column, row) pairs, so each width must divide by ``layout.tp``."""


class GPTConfig(_Section):
    """A small GPT-style decoder: token + position embeddings, pre-norm blocks, no dropout."""

    kind: Literal["gpt"] = "gpt"
    """Model family: ``mlp`` (digits classifier) or ``gpt`` (character-level transformer)."""
    layers: int = Field(2, gt=0)
    """Transformer blocks. Pipeline parallelism gives each stage a contiguous run of them
    (earlier stages take any remainder), so ``layout.pp`` may not exceed it."""
    heads: int = Field(4, gt=0)
    """Attention heads per block; ``layout.tp`` must divide it (heads are sharded)."""
    dim: int = Field(64, gt=0)
    """Width of the residual stream; must divide by ``heads``."""
    ffn_mult: int = Field(4, gt=0)
    """Hidden width of each block's MLP, as a multiple of ``dim``."""
    seq_len: int = Field(64, gt=1)
    """Tokens per training sample (the context length)."""


ModelConfig = Annotated[MLPConfig | GPTConfig, Field(discriminator="kind")]


class DataConfig(_Section):
    """Where samples come from. Both datasets ship with the installation: nothing is downloaded."""

    dataset: Literal["digits", "python-source"] | None = None
    """Default: the model's own (``digits`` for mlp, ``python-source`` for gpt). ``digits``: scikit-learn's 1797 8x8 digit images. ``python-source``: the source of a fixed
    list of modules of the running Python's standard library, as byte tokens (vocabulary 256)."""
    val_fraction: float = Field(0.2, gt=0.0, lt=1.0)
    """Share of the samples held out for validation (the split is fixed by ``seed``)."""
    seed: int = 0
    """Seed of the train/validation split and of the per-epoch shuffle."""


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
    """Optimizer steps in total (a resumed job continues up to this number)."""
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

    device: Literal["auto", "cpu", "gpu"] = "auto"
    """``cpu``: CPU ranks with gloo. ``gpu``: one GPU per rank (CUDA or ROCm), nccl; fails when
    none is visible. ``auto``: GPUs when the cluster has them, else CPU."""
    cpus_per_rank: float = Field(1.0, gt=0)
    """CPUs Ray reserves for each rank's actor."""
    threads_per_rank: int = Field(1, gt=0)
    """torch intra-op threads in each rank (``torch.set_num_threads``)."""
    vendor: Literal["nvidia", "amd"] | None = None
    """Only GPUs of this vendor (hetflow-managed nodes)."""
    accelerator: str | None = None
    """Only GPUs of this catalog model, e.g. ``MI300X`` (hetflow-managed nodes)."""
    memory: str | None = None
    """Device memory each rank needs on hetflow-managed nodes, e.g. ``20GiB`` (the planner only
    picks devices that have it)."""
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


class TrainConfig(_Section):
    """One training job."""

    name: str = Field("train", min_length=1, pattern=r"^[A-Za-z0-9][A-Za-z0-9_.-]*$")
    """Job name: names the Ray placement group and the default run directory."""
    model: ModelConfig = Field(default_factory=MLPConfig)
    """The model (``kind: mlp`` or ``kind: gpt``), written for one device."""
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

    @model_validator(mode="after")
    def _check_combinations(self) -> "TrainConfig":
        errors = combination_errors(self)
        if errors:
            raise ValueError("; ".join(errors))
        return self

    @property
    def dataset(self) -> str:
        """The dataset to train on (``data.dataset``, or the model's own)."""
        return self.data.dataset or ("digits" if self.model.kind == "mlp" else "python-source")

    @property
    def checkpoint_dir(self) -> Path:
        return Path(self.checkpoint.dir or f"runs/{self.name}/checkpoints").absolute()

    def with_overrides(self, **sections: dict[str, Any]) -> "TrainConfig":
        """A copy with some fields of some sections replaced, validated like a file."""
        data = self.model_dump(mode="json")
        for section, values in sections.items():
            if isinstance(data.get(section), dict):
                data[section] = {**data[section], **values}
            else:
                data[section] = values
        return config_from_dict(data, source="overrides")


def combination_errors(config: TrainConfig) -> list[str]:
    """Rules that tie several fields together; each message says how to fix the file."""
    errors: list[str] = []
    model, layout, train = config.model, config.layout, config.train
    wanted = "digits" if model.kind == "mlp" else "python-source"
    if config.data.dataset not in (None, wanted):
        errors.append(f"model.kind {model.kind} trains on data.dataset {wanted}, "
                      f"not {config.data.dataset}")
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
        blocks = model.layers if model.kind == "gpt" else len(model.hidden)
        if blocks < layout.pp:
            errors.append(f"layout.pp {layout.pp} is more stages than the model's {blocks} "
                          "blocks")
        if train.precision == "fp16":
            errors.append("fp16 loss scaling does not combine with pipeline parallelism "
                          "(the schedule runs backward itself); use precision bf16")
    if layout.tp > 1:
        errors.extend(_tp_errors(model, layout.tp))
        if layout.dp > 1 and layout.data_parallel == "ddp":
            errors.append("dp > 1 with tp > 1 needs layout.data_parallel: fsdp (DDP does not take "
                          "tensor-parallel DTensor parameters)")
    if model.kind == "gpt" and model.dim % model.heads:
        errors.append(f"model.dim {model.dim} must divide by model.heads {model.heads}")
    if config.resources.memory is not None:
        from hetflow.core.units import parse_bytes

        parse_bytes(config.resources.memory)  # raises InputError with the accepted forms
    return errors


def _tp_errors(model: MLPConfig | GPTConfig, tp: int) -> list[str]:
    if model.kind == "gpt":
        errs = []
        if model.heads % tp:
            errs.append(f"layout.tp {tp} must divide model.heads {model.heads}")
        if (model.dim * model.ffn_mult) % tp:
            errs.append(f"layout.tp {tp} must divide the MLP width {model.dim * model.ffn_mult}")
        return errs
    if len(model.hidden) < 2:
        return [f"tensor parallelism shards the MLP's hidden layers in pairs; model.hidden "
                f"{list(model.hidden)} has fewer than 2"]
    bad = [w for w in model.hidden if w % tp]
    return [f"layout.tp {tp} must divide every hidden width; {bad} do not"] if bad else []


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
    "load_config",
]
