"""A tuning run's configuration: one YAML file -> one frozen, validated ``TuningConfig``.

Every section refuses unknown keys; a bad file raises :class:`~hetflow.core.errors.InputError`
naming the key path (``search.schedular``, ``space.train.lr``, ``base.train.lrr``) and what to
write instead. Example (``examples/tune_digits.yaml``)::

    name: tune-digits
    base:                         # the training job every trial starts from (or a file path)
      model: {kind: mlp, hidden: [64]}
      train: {batch_size: 64}
      resources: {devices: cpu}
    space:
      train:
        lr: {loguniform: [1.0e-5, 1.0]}
        batch_size: {choice: [16, 64, 256]}
    search: {algorithm: tpe, scheduler: asha, seed: 0}
    budget: {trials: 24, epochs: 20, time: 10m}

A trial is one single-process training run of the base config with the sampled values, for
``budget.epochs`` epochs, reporting the validation metrics after each epoch.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from hetflow.core.devices import DeviceKeys, DeviceSpec
from hetflow.core.errors import InputError
from hetflow.core.validation import describe
from hetflow.core.yamlfile import read_yaml
from hetflow.runtime.tracking import TrackingConfig
from hetflow.workloads.models.spec import BUILTIN_SPECS, builtin_spec, spec_label, spec_of
from hetflow.workloads.train.config import TrainConfig, load_config
from hetflow.workloads.tune.space import SearchSpace, parse_flat_space, parse_space

METRIC_MODES = {"val_accuracy": "max", "val_token_accuracy": "max", "val_loss": "min"}
_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(s|m|h)?\s*$")


class _Section(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, use_attribute_docstrings=True)


class SearchConfig(_Section):
    """How trials are chosen and stopped."""

    algorithm: Literal["tpe", "random"] = "tpe"
    """``tpe``: Optuna's Tree-structured Parzen Estimator (after ``startup_trials`` random
    trials it samples where good trials were). ``random``: plain random search (the baseline)."""
    scheduler: Literal["asha", "fifo"] = "asha"
    """``asha``: Asynchronous Successive Halving stops trials whose metric falls behind at each
    rung. ``fifo``: every trial runs all ``budget.epochs`` epochs."""
    metric: str = Field("val_accuracy", min_length=1)
    """What trials are judged by (after each epoch, on the validation split): one of the
    metrics the model's spec reports. ``val_accuracy`` (higher is better) for a classifier such
    as the mlp, ``val_token_accuracy`` for the gpt; ``val_loss`` (lower is better) for every
    model. With a ``trainable``: any metric it reports (give ``mode`` then)."""
    mode: Literal["max", "min"] | None = None
    """``max`` or ``min``: the direction of ``metric``. Default: known for hetflow's metrics
    (accuracies max, losses min); required for a trainable's own metric."""
    seed: int = 0
    """Seed of the searcher (and of Ray's random sampling), so a run is repeatable."""
    startup_trials: int = Field(5, ge=1)
    """TPE only: trials sampled at random before TPE starts modelling the results."""
    grace_epochs: int = Field(1, ge=1)
    """ASHA only: epochs every trial gets before it can be stopped (the first rung)."""
    reduction_factor: float = Field(4.0, gt=1.0)
    """ASHA only: rungs are at grace_epochs * factor^k, and at each rung only the best
    1/factor of the trials that reached it go on. 4 is Ray's default too; on the digits
    example (27 epochs per trial then) it needed ~8% fewer trial-epochs than 3
    (docs/tuning.md)."""
    first_rung_quorum: int = Field(3, ge=0)
    """ASHA only: the first this-many trials to reach the first rung stop there; no trial goes
    past the first rung before that many results exist to judge it against. ``0`` is Ray's
    ASHA, which lets the first arrival at a rung go on for lack of competition."""

    @model_validator(mode="before")
    @classmethod
    def _default_mode(cls, data: Any) -> Any:
        if isinstance(data, dict) and data.get("mode") is None:
            metric = data.get("metric", "val_accuracy")
            known = METRIC_MODES.get(metric) or ("min" if str(metric).endswith("loss") else None)
            if known is None:
                raise ValueError(f"give search.mode (max or min) for the metric {metric!r}")
            data = {**data, "mode": known}
        return data


class BudgetConfig(_Section):
    """How much tuning to do."""

    trials: int = Field(16, gt=0)
    """Trials in total (a resumed run counts the trials it already has)."""
    epochs: int = Field(10, gt=0)
    """Most epochs one trial trains (ASHA's ``max_t``; its rungs lie below it, and it can be
    generous: only the trials ASHA keeps use it). An epoch is one pass over the training split
    at the trial's batch size."""
    time: float | str | None = None
    """Wall-clock limit for the whole run: seconds, or text such as ``90s``, ``10m``, ``1h``.
    When it runs out, running trials are stopped and the best so far is written out."""
    concurrent: int | None = Field(None, gt=0)
    """Most trials at once. Default: as many as the trial resources allow."""
    target: float | None = None
    """Stop the whole run as soon as one trial's metric reaches this value (at least it for
    val_accuracy, at most it for val_loss). Default: run the whole budget."""

    @field_validator("time")
    @classmethod
    def _check_time(cls, value: float | str | None) -> float | str | None:
        if value is not None:
            try:
                parse_duration(value)
            except InputError as exc:  # pydantic reports ValueErrors with their key path
                raise ValueError(str(exc).removeprefix("budget.time: ")) from None
        return value

    @property
    def time_s(self) -> float | None:
        return None if self.time is None else parse_duration(self.time)


TRIAL_DEVICES = DeviceKeys("a trial (its kind and model are base.resources)", ("memory",))
"""A tuning trial's ``devices`` (hetflow.core.devices)."""


class TrialConfig(_Section):
    """What one trial gets."""

    cpus: float = Field(1.0, gt=0)
    """CPUs Ray reserves for each trial."""
    threads: int = Field(1, gt=0)
    """torch intra-op threads in each trial (``torch.set_num_threads``)."""
    devices: DeviceSpec = Field(default_factory=TRIAL_DEVICES.default)
    """Each trial's devices (:mod:`hetflow.core.devices`; its kind and model are
    ``base.resources.devices``): ``memory``, the device memory one trial needs on
    hetflow-managed GPU nodes, e.g. ``2GiB`` - the planner lets several trials share a device by
    memory. Default: ``base.resources.devices.memory``, and without either each trial takes a
    whole device. The earlier flat ``memory`` is read with a deprecation warning until the next
    release."""
    reuse_actors: bool = True
    """Run the next trial in a finished trial's process when their resources match (saves
    starting Python and importing torch for every trial)."""

    @model_validator(mode="before")
    @classmethod
    def _devices(cls, data: Any) -> Any:
        """``devices: {memory: 2GiB}`` (hetflow.core.devices); the earlier flat ``memory``
        folded into it with a warning."""
        return TRIAL_DEVICES.read(data, "trial")


class OutputConfig(_Section):
    """Where results go and what is shown."""

    dir: str | None = None
    """Directory of the run (trials, best config and checkpoint, plot); relative paths are
    taken from the current directory. Default: ``runs/<name>``."""
    live: bool = True
    """Show a live table of the trials while the run goes."""
    plot: bool = True
    """Write ``curves.png``: every trial's validation curve, the best one highlighted."""


def _metric_error(metric: str, model: Any, reported: tuple[str, ...]) -> str:
    by = next((n for n in BUILTIN_SPECS if metric in builtin_spec(n).metrics), None)
    needs = f"needs the {by} model or another model that reports it" if by else \
        "needs a model that reports it"
    return (f"search.metric {metric} {needs}; {spec_label(model)} reports "
            f"{', '.join(reported)}: use one of those")


class TuningConfig(_Section):
    """One tuning run."""

    name: str = Field("tune", min_length=1, pattern=r"^[A-Za-z0-9][A-Za-z0-9_.-]*$")
    """Run name: names the default output directory."""
    base: TrainConfig = Field(default_factory=TrainConfig)
    """The training job every trial starts from: a path to a training YAML (relative to this
    file) or its sections inline. Its ``layout`` must be one process (dp = pp = tp = 1). With a
    ``trainable`` only its ``resources`` section is read (where trials run)."""
    trainable: str | None = Field(None, pattern=r"^[A-Za-z_][\w.]*:[A-Za-z_][\w.]*$")
    """Your own trial function instead of hetflow's training: ``package.module:function``,
    called with one dict (``config``'s values, the sampled ones, and ``epochs``); it reports
    after each epoch through ``hetflow.train.report`` (or Ray Tune's ``tune.report``)."""
    config: dict[str, Any] = Field(default_factory=dict)
    """With a ``trainable``: fixed values every trial's dict starts from."""
    space: dict[str, Any]
    """What to search: ``{section: {field: distribution}}`` (see docs/tuning.md); with a
    ``trainable``, ``{name: distribution}`` (the names of its dict)."""
    search: SearchConfig = Field(default_factory=SearchConfig)
    """Search algorithm, early-stopping scheduler and metric."""
    budget: BudgetConfig = Field(default_factory=BudgetConfig)
    """Trials, epochs per trial, time, concurrency."""
    trial: TrialConfig = Field(default_factory=TrialConfig)
    """Resources of one trial."""
    output: OutputConfig = Field(default_factory=OutputConfig)
    """Output directory and progress display."""
    tracking: TrackingConfig = Field(default_factory=TrackingConfig)
    """Experiment tracking, off by default: ``tracking: {mlflow: {uri, experiment}}`` logs the
    run and each trial (nested) to MLflow (docs/tracking.md; ``hetflow tune --mlflow URI``).
    Default: the base training config's ``tracking``."""

    @model_validator(mode="before")
    @classmethod
    def _inherit_tracking(cls, data: Any) -> Any:
        """A base training file with ``tracking`` turns it on for the tuning run, unless the
        tuning file has its own."""
        own = data.get("tracking") if isinstance(data, dict) else None
        if isinstance(data, dict) and not (isinstance(own, dict) and own.get("mlflow") is not None) \
                and isinstance(data.get("base"), dict):
            inherited = (data["base"].get("tracking") or {})
            if isinstance(inherited, dict) and inherited.get("mlflow") is not None:
                data = {**data, "tracking": inherited}
        return data

    @model_validator(mode="after")
    def _check_combinations(self) -> "TuningConfig":
        if self.trainable is not None:
            return self._check_trainable()
        if self.config:
            raise ValueError("config: fixed values are for a trainable; hetflow's own trials "
                             "take them from base")
        errors = []
        if self.base.layout.world_size != 1:
            errors.append(f"base.layout: a trial trains in one process; got "
                          f"{self.base.layout.parallel.describe()} (remove the layout section)")
        reported = spec_of(self.base.model).metrics
        if self.search.metric not in reported:
            errors.append(_metric_error(self.search.metric, self.base.model, reported))
        if self.search.scheduler == "asha" and self.search.grace_epochs >= self.budget.epochs:
            errors.append(f"search.grace_epochs {self.search.grace_epochs} must be below "
                          f"budget.epochs {self.budget.epochs}, or ASHA never stops a trial early")
        if errors:
            raise ValueError("; ".join(errors))
        try:
            parse_space(self.space, self.base)
        except InputError as exc:  # its message already names each key path
            raise ValueError(str(exc)) from None
        return self

    def _check_trainable(self) -> "TuningConfig":
        from hetflow.workloads.models.spec import resolve_callable

        errors = []
        try:
            resolve_callable(self.trainable or "")
        except InputError as exc:
            errors.append(f"trainable: {exc}")
        if self.search.scheduler == "asha" and self.search.grace_epochs >= self.budget.epochs:
            errors.append(f"search.grace_epochs {self.search.grace_epochs} must be below "
                          f"budget.epochs {self.budget.epochs}, or ASHA never stops a trial early")
        try:
            parse_flat_space(self.space)
        except InputError as exc:
            errors.append(str(exc))
        if errors:
            raise ValueError("; ".join(errors))
        return self

    @property
    def search_space(self) -> SearchSpace:
        if self.trainable is not None:
            return parse_flat_space(self.space)
        return parse_space(self.space, self.base)

    @property
    def output_dir(self) -> Path:
        return Path(self.output.dir or f"runs/{self.name}").absolute()

    @property
    def trial_memory(self) -> str | None:
        return self.trial.devices.memory or self.base.resources.devices.memory


def parse_duration(value: float | int | str) -> float:
    """``90`` / ``"90s"`` / ``"10m"`` / ``"1.5h"`` -> seconds; InputError otherwise."""
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        seconds = float(value)
    else:
        match = _DURATION.match(str(value))
        if not match:
            raise InputError(f"budget.time: {value!r} is not a duration; write seconds (600) or "
                             "a number with s, m or h (90s, 10m, 1.5h)")
        seconds = float(match.group(1)) * {"s": 1, "m": 60, "h": 3600}[match.group(2) or "s"]
    if seconds <= 0:
        raise InputError(f"budget.time: must be positive, got {value!r}")
    return seconds


def tuning_config_from_dict(data: Any, source: str = "config",
                            relative_to: Path | None = None) -> TuningConfig:
    """Validate a parsed document; errors become one InputError naming each key path.

    A ``base`` given as a path is read as a training YAML (relative to ``relative_to``).
    """
    if not isinstance(data, dict):
        raise InputError(f"{source}: expected a mapping of sections (name, base or trainable, "
                         f"space, search, budget, trial, output), got {type(data).__name__}")
    data = dict(data)
    if isinstance(data.get("base"), str):
        path = Path(data["base"])
        if not path.is_absolute() and relative_to is not None:
            path = relative_to / path
        data["base"] = load_config(path).model_dump(mode="json")
    try:
        return TuningConfig.model_validate(data)
    except ValidationError as exc:
        raise InputError(describe(exc, TuningConfig, source,
                                  hints={"missing": "required (see docs/tuning.md)"})) from None


def load_tuning_config(path: str | Path) -> TuningConfig:
    """Read a tuning YAML file. Raises InputError for a missing or invalid file."""
    path = Path(path)
    data = read_yaml(path, "tuning config")
    return tuning_config_from_dict(data, source=str(path), relative_to=path.parent)


__all__ = [
    "BudgetConfig", "METRIC_MODES", "OutputConfig", "SearchConfig", "TrialConfig",
    "TuningConfig", "load_tuning_config", "parse_duration", "tuning_config_from_dict",
]
