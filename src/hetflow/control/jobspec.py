"""A job file for the cluster controller: one YAML -> one frozen, validated ``JobSpec``.

    from hetflow.control.jobspec import load_job
    spec = load_job("examples/jobs/digits-train.yaml")

Four kinds of job, each with a device request the policy schedules (or none: a CPU job)::

    name: digits                 # job name (the controller adds a number: digits-3)
    kind: train                  # train | tune | python | launch
    train: ../train_digits.yaml  # train: a training config file, or the config inline
    devices: {count: 2, model: L40S, memory: 20GiB}
    preemptible: true            # may the policy checkpoint it and move it
    weight: 1.0                  # share in weighted policies
    work: {steps: 300}           # the policy's estimate of its size (steps or seconds)

A **CPU job** asks for no device: ``devices: {count: 0}`` with ``cpus`` (the CPUs of the whole
job, default 1) and optionally ``memory`` (host memory, e.g. ``8GiB``); all of it is reserved on
one node. A ``train`` job whose config says ``resources: {devices: cpu}`` and whose job file
gives no ``devices`` section is a CPU job by default, with ``cpus`` = world size x
``cpus_per_rank``. (A ``devices`` section - any count, model, vendor or memory - keeps it a
device job, as before.)

**Elastic jobs** (``train`` and ``launch``): ``devices: {count: 2, min: 1, max: 4, scaling:
eff:0.85}`` - a device range around the declared size ``count`` and the simulator's scaling
curve (:mod:`hetflow.scheduling.elastic`). The job may run on any of :attr:`JobSpec.sizes`;
:meth:`JobSpec.at_size` is the job at ``n`` devices (a training config's dp = n / (tp x pp),
same global batch; a launch's nproc n). Policy ``hetflow`` resizes it through its checkpoint.

**Goodput-adaptive jobs** (``train``): ``devices: {count: 2, min: 1, max: 8, scaling: goodput}``
and a ``goodput`` section (:class:`GoodputSection`: reference and largest global batch, the
gradient noise scale, Pollux's step-time model or measured steps). At each size the job runs the
global batch its model rates best (:meth:`JobSpec.goodput_batch`), and the policy's speed curve
is that best goodput over the one at ``count`` (:mod:`hetflow.scheduling.adaptive`).

``launch`` runs an unchanged torchrun script as ``nproc`` ranks, one device each (``launch:
{script: train.py, args: [...], nproc: 4, max_restarts: 1}``; ``devices.count`` defaults to
``nproc``, 0 makes it a CPU job of ``nproc`` CPUs), exactly as ``hetflow launch`` does on the
devices the policy chose; a preemption sends SIGTERM to every rank (the script checkpoints as
under torchrun) and the group starts again later. ``python`` runs ``entrypoint: "pkg.module:function"`` (called with no arguments, ``args`` in
``sys.argv``) or ``script: path.py`` with ``args``; ``tune`` runs ``hetflow tune`` on a tuning
config. Paths are taken relative to the job file and resolved at submit time: a training config
is read then and sent to the cluster inline, so the cluster never reads the submitter's files
(scripts and tune configs must be reachable from the cluster's nodes, e.g. a shared directory).

Strict: unknown keys are refused with the key path and "did you mean"; wrong types and missing
fields name their key path; the errors are one :class:`~hetflow.core.errors.InputError`.
"""

from __future__ import annotations

from functools import lru_cache
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from hetflow.core.devices import DeviceSpec
from hetflow.core.errors import InputError
from hetflow.core.request import ParallelLayout, PlacementRequest
from hetflow.core.topology import AcceleratorVendor
from hetflow.core.units import parse_bytes
from hetflow.core.validation import describe
from hetflow.core.yamlfile import read_yaml

NAME_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9_.-]*$"
GOODPUT = "goodput"  # devices.scaling of a goodput-adaptive job: its curve comes from its goodput section


class _Section(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, use_attribute_docstrings=True)


class DeviceRequest(DeviceSpec):
    """The accelerators a job needs: a gang of ``count`` devices of one type, all at once (the
    one :class:`~hetflow.core.devices.DeviceSpec`, with ``scaling``; ``kind``, ``share`` and
    ``strategy`` are not a job's)."""

    count: int | None = Field(None, ge=0)
    """Devices (one rank each); 0: a CPU job (see ``cpus`` and ``memory``). Default: a training
    job's world size (dp x pp x tp) - or 0 when its config says ``resources.devices: cpu`` and
    this section is left out - else 1."""
    model: str | None = None
    """Only devices of this model, by the planner's rule (``hetflow plan --model``): a catalog
    name or alias (``MI300X``, ``H100-SXM``), or its first words - ``H100`` is H100-SXM and
    H100-PCIe, ``A10`` is not A100. (``type``, its earlier name, is read with a warning.)"""
    vendor: AcceleratorVendor | None = None
    """Only devices of this vendor."""
    memory: str | None = None
    """Device memory each rank needs, e.g. ``40GiB``: types whose devices are all smaller are out."""
    min: int | None = Field(None, ge=1)
    """An elastic job (``train`` or ``launch``): the fewest devices it may run on (default:
    ``count``). The policy may start it, or shrink it through its checkpoint, down to this."""
    max: int | None = Field(None, ge=1)
    """An elastic job: the most devices it may run on (default: ``count``); the policy may grow
    it through its checkpoint up to this."""
    scaling: str | None = None
    """An elastic job's speed at other sizes, relative to ``count`` (the simulator's curves,
    :mod:`hetflow.scheduling.elastic`): ``eff:E`` (per-doubling efficiency, default
    ``eff:0.85``), ``table`` (the throughput table's rate at each size) or points
    ``N:X,N:X,...`` covering min..max; or ``goodput`` (a train job: its best goodput at each
    size, from its ``goodput`` section, which also sets its batch there)."""

    @model_validator(mode="before")
    @classmethod
    def _earlier_type(cls, data: Any) -> Any:
        """``type`` (the earlier name of ``model``, hetflow.core.devices) read with a warning."""
        if isinstance(data, dict) and "type" in data:
            if "model" in data:
                raise ValueError("devices.type and devices.model both given: keep devices.model")
            import warnings

            warnings.warn(f"devices.type: write devices.model: {data['type']} (type is read until the next "
                          "release)", FutureWarning, stacklevel=1)
            data = {("model" if k == "type" else k): v for k, v in data.items()}
        return data

    @model_validator(mode="after")
    def _memory_parses(self) -> "DeviceRequest":
        other = [k for k in ("kind", "share", "strategy") if getattr(self, k) is not None]
        if other:
            raise ValueError(f"devices: {', '.join(other)} does not apply to a job; it takes "
                             "count, model, vendor, memory, min, max, scaling")
        if self.scaling is not None and self.min is None and self.max is None:
            raise ValueError("scaling is the speed curve of an elastic job: give min and/or max "
                             "(the range of devices it may run on) too, or leave scaling out")
        if self.scaling is not None and self.scaling != GOODPUT:
            from hetflow.scheduling.elastic import parse_scaling

            try:
                parse_scaling(self.scaling)
            except InputError as exc:
                raise ValueError(str(exc)) from None
        if self.count is not None and self.count > 0:
            error = self.range_error(self.count)
            if error:
                raise ValueError(error)
        if self.count == 0:
            given = [k for k in ("model", "vendor", "memory", "min", "max", "scaling") if getattr(self, k) is not None]
            if given:
                raise ValueError(f"count 0 asks for no device, so {', '.join(given)} cannot apply; "
                                 "give a count > 0 or leave them out (host memory is the top-level "
                                 "`memory` key)")
        return self

    @property
    def elastic(self) -> bool:
        """A device range was given (``min`` or ``max``)."""
        return self.min is not None or self.max is not None

    def bounds(self, count: int) -> tuple[int, int]:
        """(min, max) for a job of ``count`` devices (each defaults to ``count``)."""
        return (count if self.min is None else self.min, count if self.max is None else self.max)

    def range_error(self, count: int) -> str | None:
        """Why the range does not hold ``count`` (None: it does), or its curve does not cover it."""
        if not self.elastic:
            return None
        lo, hi = self.bounds(count)
        if not lo <= count <= hi:
            return (f"min {lo}, count {count}, max {hi}: an elastic job needs min <= count <= max "
                    "(count: the size its work estimate and speed are given at)")
        from hetflow.scheduling.elastic import DEFAULT_SCALING, parse_scaling

        if self.scaling == GOODPUT:
            return None  # its curve is made for its sizes (JobSpec.scaling_curve)
        if not parse_scaling(self.scaling or DEFAULT_SCALING).covers(lo, hi):
            return f"scaling {self.scaling!r} does not cover min..max = {lo}..{hi} devices; add points for them"
        return None

    def placement_request(self, job_id: str, layout: ParallelLayout | None = None) -> PlacementRequest:
        """This section as the planner's request (the one core type) for the job's ranks
        ``layout`` (:attr:`JobSpec.layout`), or for ``count`` devices (at least one) in one gang."""
        return PlacementRequest.parse(job_id, count=None if layout is not None else max(1, self.count or 1),
                                      layout=layout, memory=self.memory, vendor=self.vendor, model=self.model)

    @property
    def is_default(self) -> bool:
        """Nothing was asked: the job file has no ``devices`` section (or an empty one)."""
        return all(getattr(self, k) is None for k in ("count", "model", "vendor", "memory", "min", "max", "scaling"))


class WorkEstimate(_Section):
    """How big the job is, for size-aware policies (srtf, hetflow). Give one of the two."""

    steps: float | None = Field(None, gt=0)
    """Steps (a training job: default ``train.steps``); the throughput table gives steps/s."""
    seconds: float | None = Field(None, gt=0)
    """Run time in seconds on any allowed device (the job runs at one unit per second)."""

    @model_validator(mode="after")
    def _one(self) -> "WorkEstimate":
        if self.steps is not None and self.seconds is not None:
            raise ValueError("give work.steps or work.seconds, not both")
        return self


class _Numbers(_Section):
    model_config = ConfigDict(extra="forbid", frozen=True, use_attribute_docstrings=True, allow_inf_nan=False)


class StepTimeModel(_Numbers):
    """Pollux's step-time model of one data-parallel replica, in seconds
    (:mod:`hetflow.scheduling.goodput`): a step of per-replica batch ``m`` computes for
    ``alpha_c + beta_c m``; the gradient exchange of ``r`` replicas takes ``alpha + beta
    max(r - 2, 0)`` (across nodes: ``alpha_n``/``beta_n``; inside one: ``alpha_r``/``beta_r``);
    ``gamma`` is how much the two overlap."""

    alpha_c: float = Field(..., gt=0)
    """Constant term of a step's compute time (s)."""
    beta_c: float = Field(..., ge=0)
    """Compute time per sample of the per-replica batch (s)."""
    alpha_n: float = Field(..., ge=0)
    """Constant term of the gradient exchange across nodes (s)."""
    beta_n: float = Field(..., ge=0)
    """Its growth per replica beyond two (s)."""
    alpha_r: float = Field(..., ge=0)
    """Constant term of the gradient exchange inside one node (s)."""
    beta_r: float = Field(..., ge=0)
    """Its growth per replica beyond two (s)."""
    gamma: float = Field(..., ge=1, le=10)
    """Overlap of compute and exchange: 1 none (their times add), larger more."""


class StepPoint(_Numbers):
    """One measured step, for :func:`~hetflow.scheduling.goodput.fit_perf_params`."""

    nodes: int = Field(1, ge=1)
    """Nodes the replicas were on."""
    replicas: int = Field(..., ge=1)
    """Data-parallel replicas (devices, for a layout with tp = pp = 1)."""
    local_batch: int = Field(..., ge=1)
    """Samples per replica in the step."""
    compute_s: float = Field(..., gt=0)
    """Forward and backward time of the step (s), without the gradient exchange."""
    step_s: float = Field(..., gt=0)
    """The whole step (s): compute, gradient exchange and optimizer."""

    @model_validator(mode="after")
    def _consistent(self) -> "StepPoint":
        if self.nodes > self.replicas:
            raise ValueError(f"{self.nodes} nodes for {self.replicas} replicas: every node holds a replica; "
                             "give replicas >= nodes")
        if self.step_s < self.compute_s:
            raise ValueError(f"step_s {self.step_s:g} < compute_s {self.compute_s:g}: step_s is the whole "
                             "step (compute, gradient exchange, optimizer), so at least compute_s")
        return self


class GoodputSection(_Numbers):
    """A goodput-adaptive training job's model (Pollux's, :mod:`hetflow.scheduling.goodput`): at
    each size the policy may give it, the job runs the global batch whose goodput - samples/s
    times statistical efficiency - is highest, and that goodput is its speed there
    (``devices.scaling: goodput``; :mod:`hetflow.scheduling.adaptive`)."""

    batch_size: int = Field(..., gt=0)
    """The reference global batch: where the gradient statistics were measured, and the least
    batch the job runs (Pollux's initial batch)."""
    max_batch_size: int = Field(..., gt=0)
    """The largest global batch the job may run (at most the training samples)."""
    max_local_batch: int | None = Field(None, gt=0)
    """The most samples one replica's step holds (its memory); default: no cap but
    ``max_batch_size``. hetflow's training has no gradient accumulation: a batch that would
    need more per replica is not run at that size."""
    gradient_noise_scale: float | None = Field(None, ge=0)
    """The gradient noise scale ``var / sqr`` at ``batch_size``: the larger, the more progress a
    larger batch buys per step (0: none, so the reference batch is best). Or give ``sqr`` and
    ``var``."""
    sqr: float | None = Field(None, gt=0)
    """Squared norm of the true gradient, at ``batch_size`` (with ``var``)."""
    var: float | None = Field(None, ge=0)
    """Trace of the per-sample gradient covariance, at ``batch_size`` (with ``sqr``)."""
    step_time: StepTimeModel | None = None
    """Pollux's seven step-time parameters. Or give ``profile``."""
    profile: tuple[StepPoint, ...] | None = None
    """Measured steps, to which the seven parameters are fitted: ``[{nodes, replicas,
    local_batch, compute_s, step_s}, ...]``. Or give ``step_time``."""
    devices_per_node: int = Field(8, ge=1)
    """Devices of one node the job's gangs fill: ``n`` devices span ceil(n / this) nodes in
    the model (the policy's placement is the packed one)."""

    @model_validator(mode="after")
    def _one_of_each(self) -> "GoodputSection":
        if self.max_batch_size < self.batch_size:
            raise ValueError(f"max_batch_size {self.max_batch_size} < batch_size {self.batch_size}: the "
                             "reference batch is the least the job runs; raise max_batch_size")
        pair = (self.sqr is not None, self.var is not None)
        if self.gradient_noise_scale is not None and any(pair):
            raise ValueError("give gradient_noise_scale (var / sqr) or sqr and var, not both")
        if self.gradient_noise_scale is None and pair != (True, True):
            given = "sqr" if pair[0] else "var" if pair[1] else None
            raise ValueError((f"{given} without {'var' if given == 'sqr' else 'sqr'}: " if given else "")
                             + "give the gradient statistics at batch_size: gradient_noise_scale "
                             "(var / sqr), or sqr and var")
        if (self.step_time is None) == (self.profile is None):
            raise ValueError("give the step-time model as exactly one of step_time (Pollux's seven "
                             "parameters) or profile (measured steps to fit them to)")
        if self.profile is not None and not self.profile:
            raise ValueError("profile: give at least one measured step")
        return self

    def model(self) -> Any:
        """The job's :class:`~hetflow.scheduling.goodput.GoodputModel` (a profile fitted once)."""
        return _goodput_model(self)


@lru_cache(maxsize=256)
def _goodput_model(section: GoodputSection) -> Any:
    from hetflow.scheduling.goodput import GoodputModel, GradParams, PerfParams, fit_perf_params

    if section.profile is not None:
        pts = section.profile
        columns = zip(*((p.nodes, p.replicas, p.local_batch, p.compute_s, p.step_s) for p in pts))
        perf = fit_perf_params(*(list(c) for c in columns))
    else:
        assert section.step_time is not None
        perf = PerfParams(**section.step_time.model_dump())
    if section.gradient_noise_scale is not None:
        grad = GradParams(sqr=1.0, var=section.gradient_noise_scale)  # the efficiency needs the ratio only
    else:
        grad = GradParams(sqr=float(section.sqr or 0.0), var=float(section.var or 0.0))
    return GoodputModel(perf, grad, float(section.batch_size))


@lru_cache(maxsize=1024)
def _goodput_choice(section: GoodputSection, replicas: int, nodes: int, multiple: int) -> Any:
    from hetflow.scheduling.adaptive import best_batch

    return best_batch(section.model(), replicas, nodes, section.max_batch_size, section.max_local_batch,
                      multiple)


class PythonJob(_Section):
    """Any Python program: a function in an importable module, or a script, with arguments."""

    entrypoint: str | None = Field(None, pattern=r"^[A-Za-z_][\w.]*:[A-Za-z_]\w*$")
    """``package.module:function``, importable on the cluster's Python; called with no arguments."""
    script: str | None = None
    """A Python file to run (relative to the job file); must be readable on the job's node."""
    args: tuple[str, ...] = ()
    """Command-line arguments (``sys.argv[1:]``)."""
    env: dict[str, str] = Field(default_factory=dict)
    """Extra environment variables for the job's process."""
    workdir: str | None = None
    """Working directory of the job's process (default: the job file's directory)."""

    @model_validator(mode="after")
    def _one(self) -> "PythonJob":
        if (self.entrypoint is None) == (self.script is None):
            raise ValueError("give exactly one of python.entrypoint (module:function) or python.script")
        return self


class LaunchJob(_Section):
    """An unchanged torchrun script (or module) as ``nproc`` ranks, as ``hetflow launch`` runs it."""

    script: str | None = None
    """The script (relative to the job file); must be readable on the job's nodes."""
    module: str | None = None
    """A module to run instead (``python -m``), importable from ``workdir`` on the job's nodes."""
    args: tuple[str, ...] = ()
    """The script's own arguments."""
    nproc: int = Field(1, gt=0)
    """Ranks, one device each (or one CPU bundle each for a CPU job)."""
    tp: int = Field(1, gt=0)
    """Layout hint: ranks per tensor-parallel group."""
    pp: int = Field(1, gt=0)
    """Layout hint: pipeline stages."""
    max_restarts: int = Field(0, ge=0)
    """Inside one attempt, restart the whole group after a rank fails up to this many times (as
    torchrun's ``--max-restarts``); the controller's ``max_attempts`` counts whole attempts."""
    env: dict[str, str] = Field(default_factory=dict)
    """Extra environment variables for every rank."""
    workdir: str | None = None
    """The ranks' working directory (default: the job file's directory)."""

    @model_validator(mode="after")
    def _one(self) -> "LaunchJob":
        if (self.script is None) == (self.module is None):
            raise ValueError("give exactly one of launch.script or launch.module")
        if self.nproc % (self.tp * self.pp):
            raise ValueError(f"launch.tp x launch.pp = {self.tp * self.pp} must divide launch.nproc {self.nproc}")
        return self


class JobSpec(_Section):
    """One job for the cluster controller (``hetflow submit JOB.yaml``)."""

    name: str = Field(..., min_length=1, max_length=40, pattern=NAME_PATTERN)
    """Job name; the job id is the name and a number (``digits-3``)."""
    kind: Literal["train", "tune", "python", "launch"]
    """``train`` (a hetflow training job), ``tune`` (``hetflow tune``), ``python`` (one process)
    or ``launch`` (a torchrun script as ``nproc`` ranks, as ``hetflow launch``)."""
    train: dict[str, Any] | str | None = None
    """kind train: a training config file (relative to the job file) or the config inline."""
    tune: str | None = None
    """kind tune: a tuning config file (must be readable on the job's node)."""
    python: PythonJob | None = None
    """kind python: what to run."""
    launch: LaunchJob | None = None
    """kind launch: the script and its ranks."""
    devices: DeviceRequest = Field(default_factory=DeviceRequest)
    """The devices it needs."""
    cpus: float | None = Field(None, ge=0)
    """CPUs reserved per device (rank). Default: a training job's resources.cpus_per_rank, else 0.
    A CPU job (no device): the CPUs of the whole job, on one node; default world size x
    cpus_per_rank for training, else 1."""
    memory: str | None = None
    """A CPU job only: host memory reserved for the whole job, e.g. ``8GiB`` (Ray's ``memory``
    resource; default none). Device memory is ``devices.memory``."""
    preemptible: bool = True
    """The policy may stop it (it checkpoints first) and resume it later, elsewhere. Tune jobs
    are never preempted."""
    weight: float = Field(1.0, gt=0)
    """Share in weighted policies (max_min_fairness, hetflow)."""
    job_type: str | None = None
    """Row of the throughput table (``hetflow simulate``'s job types); unknown types run at
    rate 1.0 on every allowed device type. Default: ``fixed-duration`` with work.seconds."""
    work: WorkEstimate = Field(default_factory=WorkEstimate)
    """Size estimate for the policy. Without one, the job is open-ended (infinite)."""
    max_attempts: int = Field(3, gt=0)
    """Attempts after which a job that keeps failing (not preemptions) is marked FAILED."""
    goodput: GoodputSection | None = None
    """kind train, with ``devices.scaling: goodput``: the job's goodput model, which chooses its
    global batch at each size and gives the policy its speed there (docs/controller.md,
    "Goodput-adaptive jobs")."""

    @model_validator(mode="after")
    def _host_fields(self) -> "JobSpec":
        if self.memory is not None:
            try:
                parse_bytes(self.memory)
            except InputError as exc:
                raise ValueError(f"memory: {exc}") from None
        if self.devices.count == 0 and self.cpus == 0:
            raise ValueError("a CPU job (devices.count 0) needs cpus > 0: the CPUs it runs on")
        if self.memory is not None and (self.devices.count or 0) > 0:
            raise ValueError("memory (host memory) is for CPU jobs (devices.count 0); for the "
                             "memory of each device use devices.memory")
        return self

    @model_validator(mode="after")
    def _kind_fields(self) -> "JobSpec":
        given = {k for k in ("train", "tune", "python", "launch") if getattr(self, k) is not None}
        if self.kind not in given:
            raise ValueError(f"kind {self.kind} needs the {self.kind} key")
        extra = given - {self.kind}
        if extra:
            raise ValueError(f"kind {self.kind} takes no {', '.join(sorted(extra))} key")
        error = self.goodput_error()
        if error:
            raise ValueError(error)
        if self.kind == "train" and not isinstance(self.train, dict):
            return self  # a config file: resolve() reads it and checks the range then
        error = self.elastic_error()
        if error:
            raise ValueError(error)
        return self

    # -- goodput-adaptive jobs --------------------------------------------------------------------

    def goodput_error(self) -> str | None:
        """Why the ``goodput`` section or ``devices.scaling: goodput`` cannot apply (None: they
        can, or neither is given). Only a train job: hetflow sets its batch at each size; a
        launch script chooses its own batch, which hetflow cannot change."""
        curve = self.devices.scaling == GOODPUT
        if self.goodput is None and not curve:
            return None
        if self.kind != "train":
            what = "goodput" if self.goodput is not None else "devices.scaling goodput"
            return (f"{what}: a goodput-adaptive job is kind train (hetflow sets its global batch at each "
                    f"size); a {self.kind} job chooses its own batch, so remove it")
        if self.goodput is None:
            return ("devices.scaling goodput: give the job's goodput section (batch_size, max_batch_size, "
                    "gradient_noise_scale, step_time or profile), or another curve")
        if not curve:
            return ("goodput: the model applies through devices.scaling: goodput (with devices.min/max, the "
                    "sizes it may run at); set it, or remove the goodput section")
        return None

    def goodput_batch(self, n: int) -> Any:
        """A goodput-adaptive job at ``n`` devices: the batch its model chooses
        (:class:`~hetflow.scheduling.adaptive.BatchChoice`: global batch, per-replica batch,
        goodput), or None where no batch runs at that size (or it is not such a job)."""
        if self.goodput is None or self.kind != "train" or not isinstance(self.train, dict) or n < 1:
            return None
        from hetflow.scheduling.adaptive import packed_nodes

        layout = self.train_config().layout
        group = layout.tp * layout.pp
        if n % group:
            return None
        multiple = layout.microbatches if layout.pp > 1 else 1
        nodes = packed_nodes(n, self.goodput.devices_per_node)
        return _goodput_choice(self.goodput, n // group, nodes, multiple)

    # -- elastic jobs ---------------------------------------------------------------------------

    @property
    def is_elastic(self) -> bool:
        """It declares a device range (``devices.min``/``max``) with more than one size."""
        return self.devices.elastic and len(self.sizes) > 1

    def elastic_error(self) -> str | None:
        """Why the device range cannot apply to this job (None: it can, or none is given).
        A resize is a checkpoint-restart at another size: only kinds that restart soundly at
        another world size take a range (``train``: dp changes, the global batch is kept;
        ``launch``: nproc changes, the script's checkpoint must not depend on it)."""
        if not self.devices.elastic:
            return None
        if self.kind not in ("train", "launch"):
            return (f"devices.min/max (an elastic job) are for kind train or launch, which restart "
                    f"from a checkpoint at another size; a {self.kind} job runs at its one size: "
                    "remove min and max")
        if not self.preemptible:
            return ("devices.min/max: an elastic job is resized by checkpointing and restarting it, "
                    "so it must be preemptible; set preemptible: true or remove min and max")
        count = self.num_devices
        if count == 0:
            return "devices.min/max: a CPU job (no device) runs at its one size; remove min and max"
        error = self.devices.range_error(count)
        if error:
            return f"devices: {error}"
        lo, hi = self.devices.bounds(count)
        ends = (("min", lo), ("max", hi)) + ((("count", count),) if self.goodput is not None else ())
        for key, n in ends:
            why = self._size_error(n)
            if why:
                return f"devices.{key} {n}: {why}"
        return None

    def _size_error(self, n: int) -> str | None:
        """Why this job cannot run as ``n`` ranks (None: it can)."""
        layout = self.layout
        group = layout.tp * layout.pp
        what = "the training layout's" if self.kind == "train" else "launch's"
        if n % group:
            return (f"not a multiple of {what} tp x pp = {group} (a size is dp x tp x pp ranks); "
                    f"give a multiple of {group}")
        if self.kind == "train":
            from hetflow.workloads.train.config import with_dp

            config = self.train_config()
            dp = n // group
            batch = config.train.batch_size
            if self.goodput is not None:
                choice = self.goodput_batch(n)
                if choice is None:
                    g = self.goodput
                    cap = f" of at most {g.max_local_batch} samples each" if g.max_local_batch else ""
                    micro = f" in {layout.microbatches} microbatches" if layout.pp > 1 else ""
                    return (f"goodput: no global batch from batch_size {g.batch_size} to max_batch_size "
                            f"{g.max_batch_size} runs as dp {dp} replicas{cap}{micro} in one step (hetflow's "
                            "training has no gradient accumulation); change the range or the goodput section")
                batch = choice.batch_size
            if with_dp(config, dp, batch) is None:
                if batch % dp or (layout.pp > 1 and (batch // dp) % config.layout.microbatches):
                    why = (f"train.batch_size {batch} (the global batch, kept at every size) does not split "
                           f"evenly over dp {dp} replicas{' and their microbatches' if layout.pp > 1 else ''}")
                else:
                    why = f"dp {dp} with tp {layout.tp} needs layout.data_parallel: fsdp"
                return f"{why}; change the range or the training config"
        return None

    @property
    def sizes(self) -> tuple[int, ...]:
        """Device counts it may run at: the simulator's :func:`~hetflow.scheduling.elastic.elastic_sizes`
        of its range (powers of two, the ends, ``count``) that its layout allows; one size for
        a rigid job."""
        count = self.num_devices
        if not self.devices.elastic or count == 0:
            return (count,)
        from hetflow.scheduling.elastic import elastic_sizes

        lo, hi = self.devices.bounds(count)
        return tuple(n for n in elastic_sizes(lo, hi, count) if n == count or self._size_error(n) is None)

    @property
    def scaling_curve(self) -> Any:
        """The parsed scaling curve (:class:`~hetflow.scheduling.elastic.Scaling`; default
        ``eff:0.85``); a goodput-adaptive job's: its best goodput at each of its :attr:`sizes`
        (:func:`~hetflow.scheduling.adaptive.goodput_scaling`, so ``relative(n, count)`` is
        the best goodput at ``n`` over the best at ``count``)."""
        from hetflow.scheduling.elastic import DEFAULT_SCALING, parse_scaling

        if self.devices.scaling == GOODPUT:
            return _goodput_curve(self.model_dump_json())  # each decision asks: made once per spec
        return parse_scaling(self.devices.scaling or DEFAULT_SCALING)

    def at_size(self, n: int) -> "JobSpec":
        """The job as it runs on ``n`` devices, one of :attr:`sizes`: ``devices.count`` n and a
        training config with dp = n / (tp x pp) and the same global batch
        (:func:`~hetflow.workloads.train.config.with_dp`) - a goodput-adaptive job's the batch
        its model chooses at ``n`` (:meth:`goodput_batch`) -, or a launch of ``nproc`` n. The
        range is kept; ``at_size(num_devices)`` is the job itself (:func:`resolve` set a
        goodput-adaptive job's batch at ``count``)."""
        if n == self.num_devices:
            return self
        assert n in self.sizes, f"job {self.name}: {n} devices is not one of its sizes {self.sizes}"
        changes: dict[str, Any] = {"devices": self.devices.model_copy(update={"count": n})}
        if self.kind == "train":
            from hetflow.workloads.train.config import with_dp

            choice = self.goodput_batch(n)
            batch, gain = (choice.batch_size, choice.gain) if choice is not None else (None, None)
            config = with_dp(self.train_config(), n // (self.layout.tp * self.layout.pp), batch, gain)
            assert config is not None
            changes["train"] = config.model_dump(mode="json")
        else:
            assert self.launch is not None
            changes["launch"] = self.launch.model_copy(update={"nproc": n})
        return self.model_copy(update=changes)

    # -- what the policy and the runner read ------------------------------------------------

    def train_config(self) -> Any:
        """The validated :class:`~hetflow.workloads.train.config.TrainConfig` (kind train,
        after :func:`resolve`: the config is inline)."""
        from hetflow.workloads.train.config import config_from_dict

        assert isinstance(self.train, dict), "resolve() the spec first"
        return config_from_dict(self.train, source=f"job {self.name}: train")

    @property
    def num_devices(self) -> int:
        """Devices of the gang; 0 for a CPU job."""
        if self.devices.count is not None:
            return self.devices.count
        if self.kind == "train" and isinstance(self.train, dict):
            config = self.train_config()
            if config.resources.devices.kind == "cpu" and self.devices.is_default:
                return 0
            return config.layout.world_size
        if self.kind == "launch" and self.launch is not None:
            return self.launch.nproc
        return 1

    @property
    def layout(self) -> Any:
        """The ranks' layout (a :class:`~hetflow.core.request.ParallelLayout`): a training
        config's dp x pp x tp, a launch's nproc / (tp x pp) x pp x tp, else one gang of
        ``num_devices`` (planned as one tensor-parallel group, like ``hetflow plan --count``)."""
        from hetflow.core.request import ParallelLayout

        if self.kind == "train" and isinstance(self.train, dict):
            return self.train_config().layout.parallel
        if self.kind == "launch" and self.launch is not None:
            job = self.launch
            return ParallelLayout(dp=job.nproc // (job.tp * job.pp), pp=job.pp, tp=job.tp)
        return ParallelLayout(tp=max(1, self.num_devices))

    @property
    def placement_request(self) -> PlacementRequest:
        """The job's devices as the planner's request: ``devices`` for the ranks of ``layout``."""
        return self.devices.placement_request(self.name, self.layout)

    @property
    def cpu_only(self) -> bool:
        return self.num_devices == 0

    @property
    def num_ranks(self) -> int:
        """Worker processes: a training job's world size, else one process."""
        if self.kind == "train" and isinstance(self.train, dict):
            return self.train_config().layout.world_size
        if self.kind == "launch" and self.launch is not None:
            return self.launch.nproc
        return 1

    @property
    def job_cpus(self) -> float:
        """A CPU job's CPUs (the whole job; see ``cpus``)."""
        if self.cpus is not None:
            return self.cpus
        if self.kind == "train" and isinstance(self.train, dict):
            config = self.train_config()
            return config.layout.world_size * config.resources.cpus_per_rank
        if self.kind == "launch" and self.launch is not None:
            return float(self.launch.nproc)  # one CPU per rank
        return 1.0

    @property
    def memory_bytes(self) -> int:
        """A CPU job's host memory (0: none asked)."""
        return parse_bytes(self.memory) if self.memory else 0

    @property
    def cpus_per_device(self) -> float:
        if self.cpus is not None:
            return self.cpus
        if self.kind == "train" and isinstance(self.train, dict):
            return self.train_config().resources.cpus_per_rank
        return 0.0

    @property
    def total_work(self) -> float:
        if self.work.seconds is not None:
            return self.work.seconds
        # steps of the batch it is declared with: a goodput-adaptive job's count reference
        # steps, each step of that batch train.step_gain of them (1 for every other job)
        gain = self._step_gain()
        if self.work.steps is not None:
            return self.work.steps / gain
        if self.kind == "train" and isinstance(self.train, dict):
            return self.train_config().train.steps / gain
        return float("inf")

    def _step_gain(self) -> float:
        """A goodput-adaptive job's ``train.step_gain`` at its declared size (1: any other job,
        whose config is not parsed for it - the policy reads :attr:`total_work` often)."""
        if self.goodput is None or self.kind != "train" or not isinstance(self.train, dict):
            return 1.0
        return self.train_config().train.step_gain

    def done_steps(self, end_step: int, progress: float | None) -> float:
        """Work done by a training attempt that ended at ``end_step`` with ``progress``
        reference steps, in :attr:`total_work`'s units: a goodput-adaptive job counts steps
        of its batch at ``count`` (the throughput table's rate is per step of it), whatever
        batch the attempt ran."""
        if progress is None or self.kind != "train" or not isinstance(self.train, dict):
            return float(end_step)
        return progress / self._step_gain()

    @property
    def effective_job_type(self) -> str:
        from hetflow.scheduling.throughput import FIXED_DURATION

        if self.job_type:
            return self.job_type
        return FIXED_DURATION if self.work.seconds is not None else f"{self.kind}:{self.name}"

    @property
    def is_preemptible(self) -> bool:
        return self.preemptible and self.kind != "tune"


@lru_cache(maxsize=256)
def _goodput_curve(spec_json: str) -> Any:
    """:attr:`JobSpec.scaling_curve` of a goodput-adaptive job, by its whole content."""
    from hetflow.scheduling.adaptive import goodput_scaling

    spec = JobSpec.model_validate_json(spec_json)
    best = {n: spec.goodput_batch(n) for n in spec.sizes}
    assert all(best.values()), f"job {spec.name}: resolve() the spec first (every size has a batch)"
    return goodput_scaling({n: c.goodput for n, c in best.items()})


def resolve(spec: JobSpec, base: Path) -> JobSpec:
    """The spec with every path made absolute from ``base`` (the job file's directory) and a
    training config read and checked now, inline - what the controller stores."""
    changes: dict[str, Any] = {}
    if spec.kind == "train":
        if isinstance(spec.train, str):
            path = _absolute(spec.train, base)
            data = read_yaml(path, "training config")
            if not isinstance(data, dict):
                raise InputError(f"{path}: a training config is a mapping of sections")
        else:
            data = dict(spec.train or {})
        from hetflow.workloads.train.config import config_from_dict

        config = config_from_dict(data, source=f"job {spec.name}: train")
        if config.tracking.enabled:
            raise InputError(f"job {spec.name}: train.tracking: MLflow tracking runs with `hetflow "
                             "train`, not yet for the controller's train jobs; remove it (or run "
                             "the job with `hetflow train --mlflow URI`)")
        ckpt = config.checkpoint.dir
        if ckpt is None or not Path(ckpt).is_absolute():
            # the runner's working directory is not the submitter's: pin the directory now
            default = ckpt or f"runs/{config.name}/checkpoints"
            data = {**data, "checkpoint": {**data.get("checkpoint", {}), "dir": str(_absolute(default, base))}}
        world = config.layout.world_size
        if spec.devices.count == 0 and config.resources.devices.kind != "cpu":
            raise InputError(f"job {spec.name}: devices.count 0 runs the training on CPUs; set "
                             f"resources.devices: cpu in its training config (it says "
                             f"{config.resources.devices.kind!r}) or ask for devices")
        if spec.devices.count and spec.devices.count != world:
            raise InputError(f"job {spec.name}: devices.count {spec.devices.count} must equal the "
                             f"training layout's world size dp*pp*tp = {world} (or leave it out)")
        changes["train"] = data
        if spec.devices.elastic:  # the range is checked against the config, now that it is read
            error = spec.model_copy(update={"train": data}).elastic_error()
            if error:
                raise InputError(f"job {spec.name}: {error}")
        if spec.goodput is not None:  # it runs the batch its model chooses at its declared size too
            choice = spec.model_copy(update={"train": data}).goodput_batch(spec.devices.count or world)
            assert choice is not None, "elastic_error checks count"
            changes["train"] = {**data, "train": {**data.get("train", {}), "batch_size": choice.batch_size,
                                                  "step_gain": choice.gain}}
    if spec.kind == "tune":
        changes["tune"] = str(_absolute(spec.tune or "", base))
    if spec.kind == "launch" and spec.launch is not None:
        job = spec.launch
        if spec.devices.count not in (None, 0, job.nproc):
            raise InputError(f"job {spec.name}: devices.count {spec.devices.count} must equal "
                             f"launch.nproc {job.nproc} (one device per rank), 0 for CPU ranks, "
                             "or be left out")
        changes["launch"] = job.model_copy(update={
            "script": str(_absolute(job.script, base)) if job.script else None,
            "workdir": str(_absolute(job.workdir, base)) if job.workdir else str(base.absolute()),
        })
    if spec.kind == "python" and spec.python is not None:
        py = spec.python
        changes["python"] = py.model_copy(update={
            "script": str(_absolute(py.script, base)) if py.script else None,
            "workdir": str(_absolute(py.workdir, base)) if py.workdir else str(base.absolute()),
        })
    return spec.model_copy(update=changes)


def _absolute(path: str, base: Path) -> Path:
    p = Path(path).expanduser()
    return p if p.is_absolute() else (base / p).absolute()


def job_from_dict(data: Any, source: str = "job") -> JobSpec:
    """Validate a parsed job document; every error names its key path."""
    if not isinstance(data, dict):
        raise InputError(f"{source}: expected a mapping with name, kind and the kind's key "
                         f"(train, tune, python or launch); got {type(data).__name__}")
    try:
        return JobSpec.model_validate(data)
    except ValidationError as exc:
        raise InputError(describe(exc, JobSpec, source, hints={
            "string_pattern_mismatch:entrypoint": "write package.module:function, e.g. mypkg.train:main"})) from None


def load_job(path: str | Path) -> JobSpec:
    """Read, validate and resolve a job file (InputError for a missing or invalid one)."""
    path = Path(path)
    spec = job_from_dict(read_yaml(path, "job file"), source=str(path))
    return resolve(spec, path.parent.absolute())


__all__ = ["DeviceRequest", "GoodputSection", "JobSpec", "LaunchJob", "PythonJob", "StepPoint",
           "StepTimeModel", "WorkEstimate", "job_from_dict", "load_job", "resolve"]
