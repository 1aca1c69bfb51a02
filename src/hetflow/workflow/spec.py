"""A workflow file: one YAML -> one frozen, validated ``WorkflowSpec`` (data to a served model).

    from hetflow.workflow.spec import load_workflow
    spec = load_workflow("examples/digits.yaml")

Stages, in order: ``prepare`` (the dataset and its split) -> ``train`` (a training job, the same
sections as a training YAML) -> ``tune`` (optional; Ray Tune around the same job) -> ``export``
(the serving precision, checked on the held-out split) -> ``serve`` (Ray Serve over HTTP) ->
``load_test`` (a bounded open-loop load on loopback). Each stage carries its own resources, so
the same file runs on one CPU and on a GPU cluster; only resources differ.

Strict loading: every section refuses unknown keys; a wrong type or a missing field is refused
too. A bad file raises :class:`~hetflow.core.errors.InputError` whose message names the key path
(``train.layout.dpp``), its line in the file (``digits.yaml:12``) and what was expected. Rules
that tie stages together (the tuning space, the serving precision on the serving device) are
checked by building the stage's own config (``tuning_config_from_dict``,
``serve_config_from_dict``) at load time, so a file that loads also starts.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from hetflow.core.devices import DeviceKeys, DeviceSpec
from hetflow.core.errors import InputError
from hetflow.core.validation import field_errors
from hetflow.core.yamlfile import read_user_text
from hetflow.runtime.tracking import TrackingConfig
from hetflow.workloads.serve.config import BatchingConfig, GatewayConfig, HTTPConfig, LimitsConfig
from hetflow.workloads.models.spec import spec_label, spec_of
from hetflow.workloads.train.config import TrainConfig
from hetflow.workloads.tune.config import BudgetConfig, SearchConfig, TrialConfig

NAME_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9_.-]*$"


class _Section(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, use_attribute_docstrings=True)


class PrepareStage(_Section):
    """The data: which dataset and how it is split. Its arrays go to the later stages through
    Ray's object store; its content hash keys every stage after it."""

    dataset: str | None = None
    """The dataset; default: the train stage model's own (``digits``, scikit-learn's bundled
    8x8 digits, for the mlp; nothing is downloaded). The served model is a classifier, so the
    workflow reports its accuracy."""
    loader: str | None = None
    """Import path of your function that returns the split (``"package.module:load"``, as
    ``data.loader`` of a training YAML), instead of the model's own dataset."""
    val_fraction: float = Field(0.2, gt=0.0, lt=1.0)
    """Share of samples held out: the export stage and the served model are scored on them."""
    seed: int = 0
    """Seed of the train/validation split (the same split the training job uses)."""


class TuneStage(_Section):
    """Optional hyperparameter search around the train stage's job (see docs/tuning.md). Its
    ``base`` is the train stage (one process per trial); the better of the trained model and
    the best trial goes on to export."""

    enabled: bool = False
    """Run this stage (off by default: the demo stays short)."""
    space: dict[str, Any] = Field(default_factory=dict)
    """What to search: ``{section: {field: distribution}}``, e.g.
    ``{train: {lr: {loguniform: [1.0e-4, 0.1]}}}``."""
    search: SearchConfig = Field(default_factory=SearchConfig)
    """Search algorithm, early-stopping scheduler and metric."""
    budget: BudgetConfig = Field(default_factory=BudgetConfig)
    """Trials, epochs per trial, time, concurrency."""
    trial: TrialConfig = Field(default_factory=TrialConfig)
    """Resources of one trial."""


class ExportStage(_Section):
    """The model that will be served: which checkpoint, at which precision, and the accuracy it
    must keep."""

    precision: Literal["fp32", "bf16", "fp16", "int8"] = "fp32"
    """Serving precision: ``fp32``; ``bf16``/``fp16`` on GPUs; ``int8`` (dynamic quantisation of
    the linear layers) on CPUs."""
    source: Literal["best", "train", "tune"] = "best"
    """Which checkpoint: ``train`` (the train stage's), ``tune`` (the best trial's; needs the
    tune stage), ``best`` (whichever scores higher on the validation split)."""
    min_accuracy: float | None = Field(None, ge=0.0, le=1.0)
    """Fail the run when the exported model scores below this on the validation split."""
    cpus: float = Field(1.0, gt=0)
    """CPUs Ray reserves for the evaluation task."""


STAGE_DEVICES = DeviceKeys("the serve stage", ("kind", "memory"), {"kind": "auto"})
"""The workflow serve stage's ``devices`` (hetflow.core.devices)."""


class ServeStage(_Section):
    """Ray Serve for the exported model (see docs/serving.md): one model behind the gateway."""

    http: HTTPConfig = Field(default_factory=HTTPConfig)
    """Where the HTTP proxy listens (default 127.0.0.1:8000, loopback only)."""
    limits: LimitsConfig = Field(default_factory=LimitsConfig)
    """Body size, rows per request, request timeout."""
    gateway: GatewayConfig = Field(default_factory=GatewayConfig)
    """The ingress deployment."""
    replicas: int = Field(1, gt=0)
    """Model replicas."""
    batching: BatchingConfig = Field(default_factory=BatchingConfig)
    """Dynamic batching."""
    devices: DeviceSpec = Field(default_factory=STAGE_DEVICES.default)
    """Each replica's devices (:mod:`hetflow.core.devices`): ``kind`` ``cpu``, ``gpu`` or
    ``auto`` (default: GPUs when the cluster has them, else CPU); ``memory`` per replica on a
    GPU, e.g. ``1GiB`` (default: estimated from the model). The earlier flat ``device`` and
    ``memory`` are read with a deprecation warning until the next release."""
    cpus_per_replica: float = Field(0.5, ge=0)
    """CPUs Ray reserves for each replica."""
    threads_per_replica: int = Field(1, gt=0)
    """torch intra-op threads in each replica."""
    keep_serving: bool = False
    """Leave the application running when the run ends (the process then waits for Ctrl-C);
    default: shut it down after the load test."""

    @model_validator(mode="before")
    @classmethod
    def _devices(cls, data: Any) -> Any:
        """``devices`` (hetflow.core.devices), as in a serving config; the earlier flat keys
        folded into it with a warning."""
        return STAGE_DEVICES.read(data, "serve")


class LoadTestStage(_Section):
    """A bounded open-loop load on the served model (loopback only): Poisson arrivals of
    held-out images, latency from the scheduled send time."""

    rate: float = Field(50.0, gt=0)
    """Offered requests per second."""
    max_requests: int = Field(500, gt=0)
    """Stop sending after this many requests..."""
    max_duration_s: float = Field(10.0, gt=0)
    """...or after this many seconds, whichever comes first."""
    timeout_s: float = Field(10.0, gt=0)
    """How long to wait for answers still due after the last send (unanswered: errors)."""
    rows: int = Field(1, gt=0)
    """Images per request."""
    max_p99_ms: float | None = Field(None, gt=0)
    """Fail the run when the P99 latency is above this."""


class RaySection(_Section):
    """The Ray cluster the stages run on."""

    address: str | None = None
    """Cluster to join (``auto``, ``host:port``, ``ray://...``); default (and ``local``): start
    an embedded local Ray bound to 127.0.0.1 for this run. ``hetflow run --address`` wins."""
    num_cpus: int | None = Field(None, gt=0)
    """CPUs of the embedded local Ray (default: this machine's)."""
    object_store_memory: str | None = None
    """Object store size of the embedded local Ray, e.g. ``2GiB`` (default: Ray's)."""


class WorkflowSpec(_Section):
    """One workflow: data -> train -> (tune) -> export -> serve -> load test."""

    name: str = Field(min_length=1, pattern=NAME_PATTERN)
    """Workflow name: names the cache (``<cache_dir>/<name>/``), run ids and the served model."""
    results_dir: str = "results"
    """Reports go to ``<results_dir>/<run-id>/`` (relative: from the current directory)."""
    cache_dir: str = "runs"
    """Stage artifacts go to ``<cache_dir>/<name>/<stage>/<key>/``, keyed by a hash of the
    stage's settings and its inputs' content; a re-run skips a stage whose key has a result."""
    ray: RaySection = Field(default_factory=RaySection)
    """The cluster."""
    prepare: PrepareStage = Field(default_factory=PrepareStage)
    """Stage 1: the data."""
    train: TrainConfig
    """Stage 2: the training job (the sections of a training YAML, without ``data``, which
    ``prepare`` sets, and without ``checkpoint.dir``, which the workflow sets)."""
    tune: TuneStage = Field(default_factory=TuneStage)
    """Stage 3 (optional): hyperparameter search."""
    export: ExportStage = Field(default_factory=ExportStage)
    """Stage 4: which checkpoint at which precision."""
    serve: ServeStage = Field(default_factory=ServeStage)
    """Stage 5: serving."""
    load_test: LoadTestStage = Field(default_factory=LoadTestStage)
    """Stage 6: the load test."""
    tracking: TrackingConfig = Field(default_factory=TrackingConfig)
    """Experiment tracking, off by default: ``tracking: {mlflow: {uri, experiment}}`` logs the
    run to MLflow, with the train and tune stages as nested runs (docs/tracking.md;
    ``hetflow run --mlflow URI``)."""

    @model_validator(mode="after")
    def _check_stages(self) -> "WorkflowSpec":
        errors = []
        if "data" in self.train.model_fields_set:
            errors.append("train.data: set by the workflow; put dataset, val_fraction and seed "
                          "under prepare instead")
        if "tracking" in self.train.model_fields_set:
            errors.append("train.tracking: set by the workflow; put tracking at the top level "
                          "of the file (the stages become nested runs of the workflow's run)")
        if "dir" in self.train.checkpoint.model_fields_set:
            errors.append("train.checkpoint.dir: set by the workflow (under cache_dir); remove it")
        spec = spec_of(self.train.model)
        output = spec.serving.output if spec.serving is not None else None
        if spec.accuracy != "val_accuracy" or output != "logits":
            errors.append(f"train.model: the workflow serves a classifier and reports its "
                          f"accuracy; {spec_label(self.train.model)} is not one (it reports "
                          f"{', '.join(spec.metrics)} and serves {output or 'nothing'}; a "
                          "classifier's spec reports val_accuracy and serves logits)")
        if self.export.source == "tune" and not self.tune.enabled:
            errors.append("export.source: tune needs tune.enabled: true (or use best or train)")
        if self.tune.enabled and not self.tune.space:
            errors.append("tune.space: empty; give at least one field to search, e.g. "
                          "{train: {lr: {loguniform: [1.0e-4, 0.1]}}}")
        if errors:
            raise ValueError("; ".join(errors))
        return self

    def train_config(self, checkpoint_dir: str | None = None) -> TrainConfig:
        """The train stage's job with the workflow's data (and checkpoint directory)."""
        data = self.train.model_dump(mode="json")
        data["name"] = self.name
        data["data"] = {"dataset": self.prepare.dataset, "loader": self.prepare.loader,
                        "val_fraction": self.prepare.val_fraction, "seed": self.prepare.seed}
        if checkpoint_dir is not None:
            data["checkpoint"] = {**data["checkpoint"], "dir": checkpoint_dir}
        if self.ray.address is not None:
            data["resources"] = {**data["resources"], "ray_address": self.ray.address}
        from hetflow.workloads.train.config import config_from_dict

        return config_from_dict(data, source="train")

    def prepare_settings(self) -> dict[str, Any]:
        """What the prepared split depends on (the stage keys hash it): the dataset's name, the
        split, and - for your own model or loader - the model section and the loader."""
        config = self.train_config()
        settings: dict[str, Any] = {"dataset": config.dataset,
                                    "val_fraction": self.prepare.val_fraction,
                                    "seed": self.prepare.seed}
        if self.prepare.loader is not None:
            settings["loader"] = self.prepare.loader
        if config.model._spec_path is not None:
            settings["model"] = config.model.model_dump(mode="json")
        return settings

    def tuning_config(self, output_dir: str) -> Any:
        """The tune stage as a ``TuningConfig`` (its base: the train stage, one process)."""
        from hetflow.workloads.tune.config import tuning_config_from_dict

        base = self.train_config().model_dump(mode="json")
        base.pop("layout", None)
        base.pop("checkpoint", None)
        data = {
            "name": f"{self.name}-tune",
            "base": base,
            "space": self.tune.space,
            "search": self.tune.search.model_dump(mode="json"),
            "budget": self.tune.budget.model_dump(mode="json", exclude_none=True),
            "trial": self.tune.trial.model_dump(mode="json", exclude_none=True),
            "output": {"dir": output_dir, "live": False, "plot": True},
        }
        return tuning_config_from_dict(data, source="tune")

    def serve_config(self, checkpoint_dir: str | None = None,
                     train: dict[str, Any] | None = None) -> Any:
        """The serve stage as a ``ServeConfig`` serving the exported checkpoint (``train``: the
        training config that built it, as JSON; default: the train stage's)."""
        from hetflow.workloads.serve.config import serve_config_from_dict

        s = self.serve
        model = {
            "name": self.name,
            "train": train or self.train_config().model_dump(mode="json"),
            "checkpoint_dir": checkpoint_dir,
            "precision": self.export.precision,
            "devices": s.devices.model_dump(mode="json"),
            "replicas": s.replicas,
            "batching": s.batching.model_dump(mode="json"),
            "cpus_per_replica": s.cpus_per_replica,
            "threads_per_replica": s.threads_per_replica,
        }
        data = {
            "name": self.name,
            "http": s.http.model_dump(mode="json"),
            "limits": s.limits.model_dump(mode="json"),
            "gateway": s.gateway.model_dump(mode="json"),
            "models": [{k: v for k, v in model.items() if v is not None}],
            "ray_address": self.ray.address,
        }
        return serve_config_from_dict(data, source="serve")


# --- loading --------------------------------------------------------------------------------


def workflow_from_dict(data: Any, source: str = "workflow",
                       lines: dict[tuple[str, ...], int] | None = None) -> WorkflowSpec:
    """Validate a parsed document. Every error becomes one InputError line naming the key path,
    its line (when ``lines`` maps key paths to 1-based lines) and what was expected."""
    if not isinstance(data, dict):
        raise InputError(f"{source}: expected a mapping with name, prepare, train, tune, export, "
                         f"serve, load_test; got {type(data).__name__}")
    try:
        spec = WorkflowSpec.model_validate(data)
    except ValidationError as exc:
        raise InputError("; ".join(f"{_where(source, lines or {}, e.path)}: {e.text()}"
                                   for e in field_errors(exc, WorkflowSpec, show_input=True))) \
            from None
    _check_stage_configs(spec, source, lines or {})
    return spec


def _check_stage_configs(spec: WorkflowSpec, source: str,
                         lines: dict[tuple[str, ...], int]) -> None:
    """Build the tune and serve stages' own configs now, so their cross-field rules fail at
    load time (with the stage's path) rather than minutes into the run."""
    checks = [("serve", lambda: spec.serve_config())]
    if spec.tune.enabled:
        checks.append(("tune", lambda: spec.tuning_config("unused")))
    for stage, build in checks:
        try:
            build()
        except InputError as exc:
            where = _where(source, lines, (stage,))
            # The stage's own config has one model entry; its path means nothing in this file.
            detail = str(exc).removeprefix(f"{stage}: ").replace("models.0: ", "")
            raise InputError(f"{where}: {stage}: {detail}") from None


def load_workflow(path: str | Path) -> WorkflowSpec:
    """Read a workflow YAML file. Raises InputError for a missing, malformed or invalid file."""
    path = Path(path)
    text = read_user_text(path, "workflow")
    try:
        data = yaml.safe_load(text)
        lines = key_lines(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f"{path}:{mark.line + 1}" if mark is not None else str(path)
        raise InputError(f"{where}: not valid YAML ({getattr(exc, 'problem', exc)})") from None
    return workflow_from_dict(data, source=str(path), lines=lines)


def key_lines(text: str) -> dict[tuple[str, ...], int]:
    """Key path -> 1-based line of the key (list items: their index), from ``yaml.compose``."""
    lines: dict[tuple[str, ...], int] = {}

    def walk(node: Any, path: tuple[str, ...]) -> None:
        if isinstance(node, yaml.MappingNode):
            for key, value in node.value:
                sub = path + (str(key.value),)
                lines[sub] = key.start_mark.line + 1
                walk(value, sub)
        elif isinstance(node, yaml.SequenceNode):
            for i, item in enumerate(node.value):
                sub = path + (str(i),)
                lines[sub] = item.start_mark.line + 1
                walk(item, sub)

    root = yaml.compose(text)
    if root is not None:
        walk(root, ())
    return lines


def _where(source: str, lines: dict[tuple[str, ...], int], path: tuple[str, ...]) -> str:
    """``file:line`` of the deepest key of ``path`` that the file has (a missing key: its
    section's line)."""
    for n in range(len(path), 0, -1):
        if path[:n] in lines:
            return f"{source}:{lines[path[:n]]}"
    return source



__all__ = ["ExportStage", "LoadTestStage", "PrepareStage", "RaySection", "ServeStage",
           "TuneStage", "WorkflowSpec", "key_lines", "load_workflow",
           "workflow_from_dict"]
