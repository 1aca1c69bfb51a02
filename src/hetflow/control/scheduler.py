"""The controller's decision, without Ray: job records + a live snapshot -> what to stop and start.

    scheduler = LiveScheduler(ControllerSettings(policy="hetflow"))
    scheduler.admit(spec, snapshot)                   # Unschedulable if it can never run here
    plan = scheduler.decide(records, snapshot, now, boundary=False)
    # plan.stops: checkpoint and stop these; plan.launches: reserve and start these;
    # plan.reasons: job id -> why it waits (or what happens to it)

It is the simulator's mechanism with wall time: the same policy objects (``make_policy``) see a
view built by the same function (:func:`hetflow.scheduling.policies.rounds.build_round`), checked
by the same asserts, and their answer is diffed the same way. What differs is only what the
world does in between: here a stop takes a checkpoint's time, so a start whose devices are still
held by a stopping job waits for the next decision instead of overlapping it.

CPU jobs (no device) are the policies' host-bound requests (``Request(0, cpu_milli, memory_mib)``)
on the model's CPU pools (``ClusterModel.from_snapshot(..., cpu_pools=True)``: one per node whose
CPU count the snapshot knows, device type ``CPU``). The policy does not see the CPUs that device
jobs reserve per rank; the controller charges them to their node's CPU pool before asking it,
with the CPUs other placement groups hold (``cpu_holds``), and holds back a device job whose
node has too few CPUs left for it (it waits for the next decision, with the reason).

Work units: a job's ``work`` estimate (steps or seconds) over the throughput model's rate. Job
types the model does not know run at 1.0 unit/s on every allowed type (:class:`UnitRate`), so
``work.seconds`` is literally seconds.
"""

from __future__ import annotations

import dataclasses
import enum
import math
import os
from dataclasses import dataclass, field
from typing import Any, Mapping, Sequence

from hetflow.accelerators.catalog import default_catalog
from hetflow.control.jobspec import JobSpec
from hetflow.control.state import HeldDevices, JobRecord, Slot, Status
from hetflow.core.errors import Unschedulable
from hetflow.core.placement import DeviceRef, Placement
from hetflow.core.request import ParallelLayout
from hetflow.core.topology import ClusterSnapshot
from hetflow.core.units import format_bytes, format_cpus

MIB = 1 << 20
from hetflow.scheduling.policies.base import Policy
from hetflow.core.errors import InputError
from hetflow.scheduling.policies.capacity import (
    CPU_POOL_TYPE,
    WHOLE,
    Assignment,
    ClusterModel,
    FreeCapacity,
    Request,
)
from hetflow.scheduling.policies.registry import make_policy
from hetflow.scheduling.planner import Planner
from hetflow.scheduling.rank_planner import RankPlanner
from hetflow.scheduling.policies.rounds import (
    DemandMix,
    assignment_rate,
    attained_at,
    build_round,
    check_decision,
    diff_decision,
    ideal_rates,
    progress_at,
    service_at,
    size_rates,
    sized_rate,
)
from hetflow.scheduling.elastic import sizes_of
from hetflow.scheduling.throughput import (
    CompositeThroughputs,
    ThroughputModel,
    canonical_device_type,
    default_model,
)


JOBS_DIR_ENV = "HETFLOW_JOBS_DIR"
DEFAULT_JOBS_DIR = "/tmp/hetflow/jobs"


@dataclass(frozen=True)
class ControllerSettings:
    """How the controller schedules. Stored with the state; a restarted controller keeps it."""

    policy: str = "hetflow"
    """Policy name from the registry (``hetflow simulate --policies`` lists the same ones)."""
    round_s: float = 360.0
    """Lease length for preemptive policies: every round they may preempt and move jobs."""
    restore_s: float = 30.0
    """Estimated checkpoint-restore cost of a job that ran before (what the policy weighs)."""
    tick_s: float = 0.5
    """How often the controller looks at its runners (finishes are noticed within a tick)."""
    inter_node_gbps: float = 25.0
    """Network bandwidth between nodes, for gangs that span nodes."""
    placement_timeout_s: float = 60.0
    """How long a runner waits for Ray to commit its devices before giving them back."""
    stop_grace_s: float = 60.0
    """How long a stopping job gets to checkpoint before it is killed."""
    log_dir: str = field(default_factory=lambda: os.environ.get(JOBS_DIR_ENV) or DEFAULT_JOBS_DIR)
    """Where runners write each job's log, on the job's first node (tails are kept in the GCS).
    Default: ``$HETFLOW_JOBS_DIR`` where the controller starts, else ``/tmp/hetflow/jobs``."""
    ray_jobs: bool = True
    """Show each attempt as a Ray job (``ray job list``, the dashboard; :mod:`hetflow.control.attempt_job`)
    when the cluster runs Ray's dashboard (its job API)."""


@dataclass(frozen=True)
class UnitRate:
    """Any job type at 1.0 unit of work per second on every device type (the live fallback)."""

    def knows(self, job_type: str) -> bool:
        return True

    def job_types(self) -> tuple[str, ...]:
        return ()

    def rate(self, job_type: str, num_gpus: int, device_type: str,
             group_gbps: float = math.inf, spans_nodes: bool = False) -> float:
        return 1.0


def live_throughputs() -> ThroughputModel:
    """The simulator's default model, then 1.0 for job types nobody measured."""
    return CompositeThroughputs((*default_model().models, UnitRate()))


# -- the cluster as the policy sees it -------------------------------------------------------------


@dataclass(frozen=True)
class LiveCluster:
    """The policy's model of a snapshot, and the name <-> index maps for its devices."""

    snapshot: ClusterSnapshot
    model: ClusterModel
    slot_of: Mapping[tuple[str, int], tuple[int, int]]  # (node, device) -> (pool, position)
    vendors: Mapping[str, frozenset[str]]  # device type -> vendors of its devices
    cpu_pool_of: Mapping[str, int]  # node -> its CPU pool (nodes whose CPU count is known)

    @classmethod
    def of(cls, snapshot: ClusterSnapshot) -> "LiveCluster":
        """The model of ``snapshot`` (InputError when it has nothing to schedule on: no
        accelerators and no node whose CPUs are known)."""
        from dataclasses import replace

        model = ClusterModel.from_snapshot(replace(snapshot, allocations=()), cpu_pools=True)
        slot_of = {(pool.machine, dev): (i, pos)
                   for i, pool in enumerate(model.nodes) for pos, dev in enumerate(pool.devices)}
        vendors: dict[str, set[str]] = {}
        for i, pool in enumerate(model.nodes):
            node = snapshot.node(pool.machine)
            vendors.setdefault(pool.device_type, set()).update(
                node.device(d).vendor.value for d in pool.devices)
        cpu_pool_of = {pool.machine: i for i, pool in enumerate(model.nodes) if pool.device_type == CPU_POOL_TYPE}
        return cls(snapshot, model, slot_of, {t: frozenset(v) for t, v in vendors.items()}, cpu_pool_of)

    def host_fits(self, request: Request) -> bool:
        """Some CPU pool holds ``request``'s CPUs and memory when it is empty."""
        return any((pool.cpu_milli or 0) >= request.cpu_milli and
                   (pool.memory_mib is None or pool.memory_mib >= request.memory_mib)
                   for pool in self.model.nodes if pool.device_type == CPU_POOL_TYPE)

    @property
    def accelerator_types(self) -> tuple[str, ...]:
        return tuple(t for t in self.model.device_types if t != CPU_POOL_TYPE)

    def assignment(self, held: HeldDevices) -> Assignment | None:
        """The policy's assignment for devices held by name (None if a node has gone)."""
        if not held.slots:  # a CPU job: its node's CPU pool
            pool = self.cpu_pool_of.get(held.host or "")
            if pool is None:
                return None
            return Assignment(CPU_POOL_TYPE, (), held.milli, pool, held.cpu_milli, held.memory_mib)
        try:
            slots = tuple(sorted(self.slot_of[(s.node, s.device)] for s in held.slots))
        except KeyError:
            return None
        return Assignment(held.device_type, slots, held.milli, group_gbps=self.model.group_gbps(slots))

    def held(self, a: Assignment) -> HeldDevices:
        if not a.slots:
            assert a.host is not None, "an assignment with neither devices nor host"
            return HeldDevices(a.device_type, [], a.milli, self.model.nodes[a.host].machine,
                               a.cpu_milli, a.memory_mib)
        return HeldDevices(a.device_type, [Slot(self.model.nodes[n].machine, self.model.nodes[n].devices[p])
                                           for n, p in a.slots], a.milli)

    def plan_ranks(self, job_id: str, a: Assignment, spec: JobSpec, after: FreeCapacity,
                   blocked: set[tuple[int, int]], ranks: RankPlanner | None = None) -> tuple[Assignment, Placement]:
        """The planner's ranks inside the policy's choice (:class:`RankPlanner`, the simulator's
        interface too): the planner picks the devices - on the policy's nodes, or on any node of
        that type when that gives its tensor-parallel groups faster links - among the ones free
        once the decision is applied (``a``'s own included) and maps the job's layout onto them:
        TP groups on the fastest links, pipeline neighbours next. ``after`` is updated when the
        devices change. A shared device, or a host-bound job, keeps the policy's devices (their
        ranks still ordered by the planner). ``ranks``: one :class:`RankPlanner` for every job
        of a decision (default: a new one on this cluster)."""
        ranks = ranks or RankPlanner(self.snapshot, self.model, self.slot_of)
        choice = ranks.plan(job_id, a, spec.layout, after, blocked)
        if choice is None:
            return a, self.placement(job_id, self.held(a), spec.devices.memory_bytes)
        moved = "; the planner moved it to nodes of the same type with faster links" if choice.moved else ""
        return choice.assignment, dataclasses.replace(
            choice.placement, memory_bytes=spec.devices.memory_bytes, exclusive=a.milli == WHOLE,
            notes=choice.placement.notes + (f"devices chosen by the cluster policy: {self.held(a).text()}{moved}",))

    def placement(self, job_id: str, held: HeldDevices, memory_bytes: int | None) -> Placement:
        """A core Placement of one rank per device, in slot order (what ``reserve`` binds)."""
        n = len(held.slots)
        return Placement(
            job_id=job_id,
            layout=ParallelLayout(dp=n),
            devices=tuple(DeviceRef(s.node, s.device) for s in held.slots),
            tp_group_gbps=(None,) * n,
            tp_group_weakest=("",) * n,
            pp_hop_gbps=(),
            score=(0.0, 0.0, 0.0),
            memory_bytes=memory_bytes,
            exclusive=held.milli == WHOLE,
            notes=(f"chosen by the cluster policy: {held.text()}",),
        )

    def free_text(self, free: FreeCapacity, types: Sequence[str]) -> str:
        """``2 free on a, 1 on b`` per type: whole free devices by node (CPUs for ``CPU``)."""
        parts = []
        for t in types:
            if t == CPU_POOL_TYPE:
                shown = [f"{free.cpu[i] / 1000:g} on {self.model.nodes[i].machine}"
                         for i in self.model.nodes_of_type[t]]
                parts.append("CPUs free: " + ", ".join(shown))
                continue
            per_node = [(self.model.nodes[i].machine, int(free.whole[i])) for i in self.model.nodes_of_type[t]]
            shown = [f"{k} on {name}" for name, k in per_node if k > 0]
            parts.append(f"{t}: " + (", ".join(shown) + " free" if shown else "none free"))
        return "; ".join(parts)


# -- jobs as the policy sees them -------------------------------------------------------------------


class LiveJob:
    """One record through the policy's ``JobInfo`` protocol (read-only), at time ``now``."""

    def __init__(self, record: JobRecord, spec: JobSpec, request: Request, rates: Mapping[str, float],
                 assignment: Assignment | None, seg_rate: float, now: float, restore_s: float,
                 size_rates: Mapping[int, Mapping[str, float]] | None = None) -> None:
        self.record = record
        self.spec = spec
        self.request = request
        self.ideal_rates = rates
        self.best_rate = max(rates.values(), default=0.0)
        self.assignment = assignment
        self.seg_rate = seg_rate
        self.now = now
        self.restore_s = restore_s
        # elastic jobs: {size: {device type: rate}} and their sizes, as the simulator's SimJob
        self.size_rates = dict(size_rates) if size_rates else {request.num_gpus: rates}
        self.sizes = tuple(sorted(self.size_rates))

    def rates_at(self, n: int) -> Mapping[str, float]:
        """Rate on each device type at ``n`` devices (best placement); empty for other sizes."""
        return self.size_rates.get(n, {})

    job_id = property(lambda self: self.record.job_id)
    job_type = property(lambda self: self.spec.effective_job_type)
    arrival_s = property(lambda self: self.record.submitted_at)
    num_gpus = property(lambda self: self.request.num_gpus)
    weight = property(lambda self: self.spec.weight)
    preemptible = property(lambda self: self.spec.is_preemptible)
    total_work = property(lambda self: self.spec.total_work)
    needs_restore = property(lambda self: self.record.needs_restore)

    @property
    def seg_restore(self) -> float:
        return self.restore_s if self.record.needs_restore else 0.0

    @property
    def done_work(self) -> float:
        return progress_at(self.now, self.record.done_base, self.total_work, self.record.seg_start,
                           self.seg_restore, self.seg_rate, self.assignment is not None)

    @property
    def remaining_work(self) -> float:
        return self.total_work - self.done_work

    @property
    def attained_s(self) -> float:
        devices = self.request.gpu_milli / WHOLE
        if len(self.sizes) > 1 and self.assignment is not None:  # an elastic job: the size it runs at
            devices = len(self.assignment.slots) * self.assignment.milli / WHOLE
        return attained_at(self.now, self.record.attained_s, devices, self.record.seg_start,
                           self.assignment is not None)

    @property
    def service_by_type(self) -> Mapping[str, float]:
        return service_at(self.now, self.record.service_s, self.record.seg_start,
                          self.assignment.device_type if self.assignment is not None else None)


def job_request(spec: JobSpec) -> Request:
    """The policy's request: a gang of whole devices, whose per-rank CPUs the runner reserves
    and the controller charges (as in the simulator's GPU traces, the policy does not see them);
    or, for a CPU job, its CPUs and host memory on one node (a host-bound request)."""
    if spec.cpu_only:
        return Request(0, cpu_milli=math.ceil(spec.job_cpus * 1000 - 1e-6),
                       memory_mib=-(-spec.memory_bytes // MIB))
    return Request(spec.num_devices)


@dataclass(frozen=True)
class CpuHold:
    """CPUs a placement group holds on a node (``job``: its name without ``hetflow-``)."""

    job: str
    node: str
    cpus: float


# -- decisions ---------------------------------------------------------------------------------------


class Why(enum.Enum):
    """What a reason says happens to a job (:class:`Reason`)."""

    NO_NODES = "no-nodes"  # the cluster has nothing to schedule on
    DEVICES_GONE = "devices-gone"  # a running job's devices left the cluster
    NEVER_FITS = "never-fits"  # no allowed device type could ever hold it
    STARTED = "started"  # the policy started it (a Launch)
    PREEMPTED = "preempted"  # stopped at a round boundary (a Stop, nowhere to go)
    RESIZED = "resized"  # an elastic job stopped to restart at another size
    MOVED = "moved"  # stopped to restart on other devices
    SHORT_OF_CPUS = "short-of-cpus"  # the policy's choice lacks CPUs or host memory right now
    HELD = "held"  # the policy's choice is still held by a job that is checkpointing
    WAITING = "waiting"  # no room now (the free devices, and who took them, are named)


class Reason(str):
    """The line ``hetflow status`` shows for a job, with what it says as a :class:`Why`
    (``reason.why``). It is the line as a string: records store it, tests and users read it."""

    why: Why

    def __new__(cls, why: Why, text: str) -> "Reason":
        out = super().__new__(cls, text)
        out.why = why
        return out

    def __reduce__(self):  # pickles (Ray) as itself
        return (Reason, (self.why, str(self)))


@dataclass(frozen=True)
class Launch:
    job_id: str
    held: HeldDevices
    placement: Placement | None  # None for a CPU job (``held`` names its node and CPUs)
    reason: Reason


@dataclass(frozen=True)
class Stop:
    job_id: str
    moving_to: HeldDevices | None  # None: preempted; else it will be started there next
    reason: Reason


@dataclass
class Plan:
    """What one decision asks of the world, and a reason for every job it looked at."""

    decided: bool = False  # the policy was asked (else only reasons were refreshed)
    stops: list[Stop] = field(default_factory=list)
    launches: list[Launch] = field(default_factory=list)
    reasons: dict[str, Reason] = field(default_factory=dict)


@dataclass
class Observed:
    """Step 1 of a decision (:meth:`LiveScheduler.observe`): the unfinished jobs by state and
    what is free for them."""

    free: FreeCapacity  # devices, CPUs and memory not held by running or stopping jobs or others
    demand: DemandMix  # every admitted job, finished ones too (as the simulator counts arrivals)
    running: dict[str, LiveJob] = field(default_factory=dict)
    waiting: list[LiveJob] = field(default_factory=list)
    stopping: list[tuple[JobRecord, Assignment]] = field(default_factory=list)  # checkpointing now
    ours: set[str] = field(default_factory=set)  # the controller's unfinished jobs


@dataclass
class Asked:
    """Step 2 (:meth:`LiveScheduler.ask`): the policy's answer, checked and diffed."""

    inputs: Any  # the round's inputs (``build_round``): the view the policy saw
    changes: Any  # ``diff_decision``: the starts and stops it implies
    after: FreeCapacity  # what is free once the decision is applied


class LiveScheduler:
    """Admission and decisions for the live controller (pure: no Ray, time passed in)."""

    def __init__(self, settings: ControllerSettings, policy: Policy | None = None,
                 throughputs: ThroughputModel | None = None) -> None:
        self.settings = settings
        self.policy = policy or make_policy(settings.policy)
        self.throughputs = throughputs or live_throughputs()
        # A job's spec never changes after submit; validating every record's spec at every
        # decision was an eighth of a decision's time at 1,024 GPUs (benchmarks/controller.py).
        self._specs: dict[str, JobSpec] = {}
        self._sizes: dict[str, tuple[int, ...]] = {}  # elastic jobs' sizes (their layouts checked once)
        self.planner = Planner(default_catalog())  # picks the devices inside the policy's choice

    def spec_of(self, record: JobRecord) -> JobSpec:
        """The record's validated spec (parsed once per job id)."""
        spec = self._specs.get(record.job_id)
        if spec is None:
            spec = self._specs[record.job_id] = JobSpec.model_validate(record.spec)
        return spec

    def sizes_of(self, record: JobRecord) -> tuple[int, ...]:
        """The record's allowed device counts (:attr:`JobSpec.sizes`; one for a rigid job)."""
        sizes = self._sizes.get(record.job_id)
        if sizes is None:
            sizes = self._sizes[record.job_id] = self.spec_of(record).sizes
        return sizes

    # -- elastic jobs ----------------------------------------------------------------------------

    def size_rates(self, spec: JobSpec, sizes: Sequence[int], rates: Mapping[str, float],
                   cluster: LiveCluster) -> dict[int, dict[str, float]] | None:
        """An elastic job's rate per device type at each of its sizes (the simulator's rule,
        :func:`~hetflow.scheduling.policies.rounds.size_rates`); None for a rigid job."""
        if len(sizes) == 1 or not rates:
            return None
        return size_rates(cluster.model, self.throughputs, spec.effective_job_type, spec.num_devices, sizes,
                          spec.scaling_curve, rates, self.allowed_types(spec, cluster), spec.devices.memory_bytes)

    def _rate(self, cluster: LiveCluster, job: LiveJob, a: Assignment) -> float:
        """Work/s of ``job`` on ``a``: the throughput model's rate for its gang, or, for an
        elastic job at another size, its curve's rate there x what the links cost (as the
        simulator's ``Simulator._rate``)."""
        n = len(a.slots)
        if n != job.num_gpus and len(sizes_of(job)) > 1:
            return sized_rate(cluster.model, self.throughputs, job.job_type,
                              job.rates_at(n).get(a.device_type, 0.0), a)
        return assignment_rate(cluster.model, self.throughputs, job.job_type, job.num_gpus, a)

    def relative_speed(self, spec: JobSpec, n: int, device_type: str) -> float:
        """Work/s at ``n`` devices over work/s at its declared size (1.0 for a rigid job): how a
        ``work.seconds`` estimate advances while an elastic job runs at another size."""
        declared = spec.num_devices
        if n == declared or not spec.devices.elastic or declared == 0:
            return 1.0
        f = spec.scaling_curve.relative(n, declared)
        if f is None:  # table: the throughput model's own rates
            r0 = self.throughputs.rate(spec.effective_job_type, declared, device_type)
            f = self.throughputs.rate(spec.effective_job_type, n, device_type) / r0 if r0 > 0 else 1.0
        return f

    # -- admission -------------------------------------------------------------------------------

    def allowed_types(self, spec: JobSpec, cluster: LiveCluster) -> frozenset[str] | None:
        if spec.cpu_only:
            return frozenset({CPU_POOL_TYPE})
        asked = spec.devices.placement_request(spec.name)  # the planner's request and its rules
        if asked.model is None and asked.vendor is None:
            return None  # any accelerator (CPU pools hold no devices, so a gang never fits there)
        types = set(cluster.accelerator_types)
        if asked.model is not None:  # the planner's rule: "H100" is H100-SXM and H100-PCIe
            from hetflow.accelerators.catalog import model_matcher

            matches = model_matcher(asked.model)
            types = {t for t in types if t == canonical_device_type(asked.model) or (matches and matches(t))}
        if asked.vendor is not None:
            types = {t for t in types if asked.vendor.value in cluster.vendors.get(t, ())}
        return frozenset(types)

    def rates(self, spec: JobSpec, cluster: LiveCluster) -> dict[str, float]:
        request = job_request(spec)
        if spec.cpu_only and not cluster.host_fits(request):
            return {}  # (the simulator's ideal_rates does not look at host sizes)
        return ideal_rates(cluster.model, self.throughputs, spec.effective_job_type, request,
                           self.allowed_types(spec, cluster), spec.devices.memory_bytes)

    def admit(self, spec: JobSpec, snapshot: ClusterSnapshot) -> dict[str, float]:
        """The job's rate per device type; Unschedulable (with why, per type) when it could not
        run anywhere in this cluster even if it were empty."""
        cluster = _cluster_or_none(snapshot)
        if cluster is None:
            raise Unschedulable("the cluster has no nodes to run jobs on (no hetflow node with "
                                "accelerators, no node with CPUs): start nodes with `hetflow node start` "
                                "(they publish their devices), then submit again")
        rates = self.rates(spec, cluster)
        if rates:
            return rates
        raise Unschedulable(self._never_fits(spec, cluster))

    def _never_fits(self, spec: JobSpec, cluster: LiveCluster) -> str:
        if spec.cpu_only:
            return self._cpus_never_fit(spec, cluster)
        if not cluster.accelerator_types:
            return (f"job {spec.name} asks for {spec.num_devices} device(s) and this cluster has no "
                    "accelerators (only CPUs): run it as a CPU job (devices: {count: 0}) or add "
                    "nodes with accelerators (`hetflow node start` on them)")
        m, n = cluster.model, spec.num_devices
        allowed = self.allowed_types(spec, cluster)
        mem = spec.devices.memory_bytes
        why = []
        if allowed is not None and not allowed:
            wanted = " ".join(x for x in (spec.devices.vendor, spec.devices.model) if x)
            why.append(f"no {wanted} devices in this cluster (it has {', '.join(cluster.accelerator_types)})")
        for t in cluster.accelerator_types:
            if allowed is not None and t not in allowed:
                continue
            if n > m.capacity_by_type[t]:
                why.append(f"{t}: {m.capacity_by_type[t]} in the whole cluster, it needs {n}")
                continue
            mems = [m.nodes[i].device_memory_bytes for i in m.nodes_of_type[t]]
            if mem is not None and all(x is not None and x < mem for x in mems):
                why.append(f"{t}: {format_bytes(max(x for x in mems if x))} per device, it needs {format_bytes(mem)}")
                continue
            why.append(f"{t}: the throughput model says job type {spec.effective_job_type} does not run there")
        return (f"job {spec.name} ({n}x {spec.devices.model or spec.devices.vendor or 'any device'}"
                f"{f', {format_bytes(mem)} each' if mem else ''}) can never run on this cluster, "
                f"even empty: {'; '.join(why)}. Ask for fewer devices or another type, or add nodes "
                "that have them")

    def _cpus_never_fit(self, spec: JobSpec, cluster: LiveCluster) -> str:
        m = cluster.model
        pools = [m.nodes[i] for i in m.nodes_of_type.get(CPU_POOL_TYPE, ())]
        memory = f", {format_bytes(spec.memory_bytes)}" if spec.memory_bytes else ""
        head = f"job {spec.name} ({format_cpus(spec.job_cpus)}{memory} on one node) can never run on this cluster, even empty"
        if not pools:
            return (f"{head}: no node's CPU count is known (CPU jobs run on Ray nodes that give Ray "
                    "CPUs); start one with `hetflow node start` or `ray start`")
        sizes = ", ".join(f"{p.machine}: {format_cpus((p.cpu_milli or 0) / 1000)}"
                          + (f" {format_bytes((p.memory_mib or 0) * MIB)}" if spec.memory_bytes else "")
                          for p in pools)
        return (f"{head}: the largest node has too few ({sizes}). Ask for fewer CPUs"
                f"{' or less memory' if spec.memory_bytes else ''}, or add a bigger node")

    # -- one decision ----------------------------------------------------------------------------

    def decide(self, records: Sequence[JobRecord], snapshot: ClusterSnapshot, now: float,
               boundary: bool, force: bool = False, cpu_holds: Sequence[CpuHold] = ()) -> Plan:
        """One decision over every unfinished record (see the module docstring), in steps:
        :meth:`observe` the jobs and what is free, :meth:`ask` the policy (only when worth it),
        turn its answer into :meth:`stops` and :meth:`launches`, and give every job left waiting
        its reason (:meth:`waiting_reasons`).

        ``boundary``: a round boundary (preemptive policies may move running jobs). The policy
        is asked at a boundary, or when ``force`` and someone waits and devices (or, for a
        waiting CPU job, CPUs) are free (as the simulator asks after arrivals and completions);
        otherwise only reasons are refreshed. ``cpu_holds``: CPUs held by placement groups;
        those of jobs the controller did not start are not free for its jobs.
        """
        plan = Plan()
        cluster = _cluster_or_none(snapshot)
        if cluster is None:
            for record in records:
                if not record.status.finished and not record.status.holds_devices:
                    plan.reasons[record.job_id] = Reason(Why.NO_NODES, "waiting: the cluster has no nodes to run on")
            return plan
        seen = self.observe(records, snapshot, cluster, now, cpu_holds, plan)
        unpin = boundary and self.policy.preemptive
        if not self.worth_asking(seen, cluster, unpin, force):
            self.waiting_reasons(plan, seen.waiting, cluster, seen.free, seen.free, set(), seen.stopping)
            return plan
        asked = self.ask(seen, cluster, now, unpin)
        plan.decided = True
        blocked = self.stops(plan, asked, cluster, seen)
        launched = self.launches(plan, asked, cluster, seen, blocked)
        still_waiting = [j for j in seen.waiting if j.job_id not in launched and j.job_id not in plan.reasons]
        self.waiting_reasons(plan, still_waiting, cluster, asked.inputs.view.free, asked.after,
                             {jid for jid, _ in asked.changes.starts}, seen.stopping)
        return plan

    def observe(self, records: Sequence[JobRecord], snapshot: ClusterSnapshot, cluster: LiveCluster,
                now: float, cpu_holds: Sequence[CpuHold], plan: Plan) -> Observed:
        """Step 1: each unfinished job as running, stopping or waiting (or, with its reason,
        neither: its devices are gone, or it can never fit), and what is free - less the
        devices other placements hold and the CPUs device ranks and other groups reserve."""
        seen = Observed(FreeCapacity(cluster.model), DemandMix())
        for record in sorted(records, key=lambda r: r.seq):
            spec = self.spec_of(record)  # finished ones too: demand counts every admitted job
            request = job_request(spec)
            rates = self.rates(spec, cluster)
            if rates:
                seen.demand.add(request)
            if record.status.finished:
                continue
            seen.ours.add(record.job_id)
            sized = self.size_rates(spec, self.sizes_of(record), rates, cluster)
            held = cluster.assignment(record.held) if record.held is not None else None
            if record.status.holds_devices:
                if held is None:
                    plan.reasons[record.job_id] = Reason(
                        Why.DEVICES_GONE, "its devices are no longer in the cluster; waiting for its runner to end")
                    continue
                seen.free.take(held)
                self._charge_cpus(seen.free, cluster, self._device_cpus(spec, held, cluster))
                if record.status is Status.PREEMPTING:
                    seen.stopping.append((record, held))
                    continue
                job = LiveJob(record, spec, request, rates, held, 0.0, now, self.settings.restore_s, sized)
                job.seg_rate = self._rate(cluster, job, held)
                seen.running[record.job_id] = job
            elif rates:
                seen.waiting.append(LiveJob(record, spec, request, rates, None, 0.0, now, self.settings.restore_s,
                                            sized))
            else:
                plan.reasons[record.job_id] = Reason(Why.NEVER_FITS, "waiting: " + self._never_fits(spec, cluster))
        self._take_foreign(snapshot, cluster, seen.free, seen.ours)
        for hold in cpu_holds:
            if hold.job not in seen.ours and hold.node in cluster.cpu_pool_of:
                self._charge_cpus(seen.free, cluster, {cluster.cpu_pool_of[hold.node]: round(hold.cpus * 1000)})
        return seen

    @staticmethod
    def worth_asking(seen: Observed, cluster: LiveCluster, unpin: bool, force: bool) -> bool:
        """Whether the policy is asked: at a boundary of a preemptive policy with any job, or
        when forced and a waiting job could use what is free (devices, or CPUs for a CPU job)."""
        if unpin and (seen.running or seen.waiting):
            return True
        cpus_free = any(seen.free.cpu[i] > 0 for i in cluster.cpu_pool_of.values())
        worth = (any(j.num_gpus > 0 for j in seen.waiting) and seen.free.total_free_milli() > 0) or (
            cpus_free and any(j.num_gpus == 0 for j in seen.waiting))
        return force and worth

    def ask(self, seen: Observed, cluster: LiveCluster, now: float, unpin: bool) -> Asked:
        """Step 2: the policy's decision on the round's view, checked as the simulator checks
        it, and the starts and stops it implies."""
        inputs = build_round(now, unpin, cluster.model, seen.free, seen.running, seen.waiting,
                             lambda j: (j.arrival_s, j.record.seq), seen.demand, self.settings.round_s,
                             lambda j, a: self._rate(cluster, j, a))
        decision = self.policy.schedule(inputs.view)
        check_decision(decision, inputs)
        after = inputs.view.free.fork()
        for a in decision.values():
            after.take(a)
        return Asked(inputs, diff_decision(decision, inputs.movable), after)

    def stops(self, plan: Plan, asked: Asked, cluster: LiveCluster, seen: Observed) -> set[tuple[int, int]]:
        """Step 3: a Stop for every running job the decision moves, resizes or preempts (named
        with the jobs that take its devices); returns the device slots that stay held until
        their jobs have checkpointed (these and the ones already stopping)."""
        blocked = {slot for _, a in seen.stopping for slot in a.slots}
        name = self.policy.name
        for job, new in asked.changes.stops:
            old = job.assignment
            blocked.update(old.slots)
            takers = sorted(jid for jid, a in asked.changes.starts if jid != job.job_id and set(a.slots) & set(old.slots))
            for_whom = f" for {', '.join(takers)}" if takers else ""
            if new is None:
                why = Reason(Why.PREEMPTED, f"preempted by policy {name} at a round boundary{for_whom}")
            elif len(new.slots) != len(old.slots):
                why = Reason(Why.RESIZED, f"resized by policy {name} from {len(old.slots)} to {len(new.slots)} "
                                          f"devices ({cluster.held(new).text()}) through its checkpoint{for_whom}")
            else:
                why = Reason(Why.MOVED, f"moved by policy {name} to {cluster.held(new).text()}{for_whom}")
            plan.stops.append(Stop(job.job_id, None if new is None else cluster.held(new), why))
        return blocked

    def launches(self, plan: Plan, asked: Asked, cluster: LiveCluster, seen: Observed,
                 blocked: set[tuple[int, int]]) -> set[str]:
        """Step 4: a Launch for every start whose devices are free now and whose node has the
        CPUs (else the job waits with that reason); a job that moves or resizes starts at the
        next decision, after its checkpoint. Returns the launched job ids."""
        launched: set[str] = set()
        stopped_now = {j.job_id for j, _ in asked.changes.stops}
        ranks: RankPlanner | None = None  # made at the first device job that starts
        physical = seen.free.fork()  # free now: stopping jobs still hold theirs until they have stopped
        name = self.policy.name
        jobs = {j.job_id: j for j in asked.inputs.view.jobs}
        for jid, a in asked.changes.starts:
            job = jobs[jid]
            short = self._cpus_short(physical, cluster, a, job.spec)
            if short is not None:
                holders = [r.job_id for r, held in seen.stopping if held.host == a.host and not held.slots]
                holders += [j.job_id for j, _ in asked.changes.stops if j.job_id != jid and not j.assignment.slots
                            and j.assignment.host == a.host]
                by = f"; {', '.join(dict.fromkeys(holders))} is checkpointing to free them" if holders else ""
                plan.reasons[jid] = Reason(Why.SHORT_OF_CPUS, f"waiting: policy {name} chose "
                                                              f"{cluster.held(a).text()}, but {short}{by}")
                continue
            if jid in stopped_now:
                continue  # it moves or resizes: it checkpoints first (its stop's reason says so), then starts
            if set(a.slots) & blocked:
                holders = sorted(r.job_id for r, held in seen.stopping if set(held.slots) & set(a.slots))
                holders += sorted(j.job_id for j, _ in asked.changes.stops
                                  if set(j.assignment.slots) & set(a.slots) and j.job_id != jid)
                plan.reasons[jid] = Reason(Why.HELD, f"waiting: policy {name} chose {cluster.held(a).text()}, "
                                                     f"still held by {', '.join(dict.fromkeys(holders))} until it "
                                                     "checkpoints")
                continue
            spec = job.spec
            placement = None
            size = ""
            if len(job.sizes) > 1:  # elastic: the ranks of the size it got
                lo, hi = spec.devices.bounds(spec.num_devices)
                size = f" ({len(a.slots)} of its {lo}..{hi} devices)"
                spec = spec.at_size(len(a.slots))
            if a.slots:  # the planner decides which devices inside the policy's choice get which rank
                ranks = ranks or RankPlanner(cluster.snapshot, cluster.model, cluster.slot_of, self.planner)
                a, placement = cluster.plan_ranks(jid, a, spec, asked.after, blocked, ranks)
            held = cluster.held(a)
            if a.slots:  # its devices are free (``blocked`` above); its ranks' CPUs are taken now
                self._charge_cpus(physical, cluster, self._device_cpus(spec, a, cluster))
            else:
                physical.take(a)
            plan.launches.append(Launch(jid, held, placement,
                                        Reason(Why.STARTED, f"started by policy {name} on {held.text()}{size}")))
            launched.add(jid)
        return launched

    @staticmethod
    def _device_cpus(spec: JobSpec, a: Assignment, cluster: LiveCluster) -> dict[int, int]:
        """CPU milli a device job's ranks reserve, per CPU pool of their nodes (none for a CPU
        job: the policy charges those itself)."""
        out: dict[int, int] = {}
        if not a.slots or spec.cpus_per_device <= 0:
            return out
        per_rank = round(spec.cpus_per_device * 1000)
        for n, _ in a.slots:
            pool = cluster.cpu_pool_of.get(cluster.model.nodes[n].machine)
            if pool is not None:
                out[pool] = out.get(pool, 0) + per_rank
        return out

    @staticmethod
    def _charge_cpus(free: FreeCapacity, cluster: LiveCluster, milli: Mapping[int, int]) -> None:
        """Take CPUs the policy does not account (device jobs' ranks, other placement groups);
        never below zero: Ray, not this view, is the authority on what is really free."""
        for pool, amount in milli.items():
            free.cpu[pool] = max(0, int(free.cpu[pool]) - amount)

    def _cpus_short(self, physical: FreeCapacity, cluster: LiveCluster, a: Assignment,
                    spec: JobSpec) -> str | None:
        """Why ``a`` cannot be reserved right now for lack of CPUs or host memory, else None."""
        if not a.slots:
            assert a.host is not None
            node = cluster.model.nodes[a.host].machine
            if physical.cpu[a.host] < a.cpu_milli:
                return f"{node} has {format_cpus(physical.cpu[a.host] / 1000)} free now"
            if physical.mem[a.host] < a.memory_mib:
                return f"{node} has {format_bytes(int(physical.mem[a.host]) * MIB)} of memory free now"
            return None
        for pool, milli in self._device_cpus(spec, a, cluster).items():
            if physical.cpu[pool] < milli:
                node = cluster.model.nodes[pool].machine
                return (f"its ranks need {format_cpus(milli / 1000)} on {node} and {physical.cpu[pool] / 1000:g} "
                        "are free there now")
        return None

    def _take_foreign(self, snapshot: ClusterSnapshot, cluster: LiveCluster, free: FreeCapacity,
                      ours: set[str]) -> None:
        """Devices held by placements the controller did not make (``hetflow train`` run by
        hand, say) are not free for its jobs."""
        for alloc in snapshot.allocations:
            if alloc.job_id in ours:
                continue
            slot = cluster.slot_of.get((alloc.node, alloc.device))
            if slot is not None and free.milli[slot] == WHOLE:
                free.take(Assignment(cluster.model.nodes[slot[0]].device_type, (slot,)))

    def waiting_reasons(self, plan: Plan, waiting: Sequence[LiveJob], cluster: LiveCluster,
                        before: FreeCapacity, after: FreeCapacity, started: set[str],
                        stopping: Sequence[tuple[JobRecord, Assignment]]) -> None:
        """Step 5: why each job still waits - what it needs, what is free once the decision is
        applied, and who took the devices it could have had (or is checkpointing to free them)."""
        for job in waiting:
            if job.job_id in plan.reasons:
                continue
            types = sorted(job.ideal_rates, key=cluster.model.type_index.__getitem__)
            if job.spec.cpu_only:
                mem = job.spec.memory_bytes
                need = f"needs {format_cpus(job.spec.job_cpus)}" + (f" and {format_bytes(mem)}" if mem else "") + " on one node"
                pools = cluster.model.nodes_of_type[CPU_POOL_TYPE]
                fits_before = bool(((before.cpu[pools] >= job.request.cpu_milli)
                                    & (before.mem[pools] >= job.request.memory_mib)).any())
            else:
                mem = job.spec.devices.memory_bytes
                need = f"needs {job.num_gpus}x {' or '.join(types)}" + (f" with {format_bytes(mem)} each" if mem else "")
                fits_before = any(before.could_fit(job.request, t) for t in types)
            if fits_before and started:
                tail = f"; policy {self.policy.name} gave the free devices to {', '.join(sorted(started))} first"
            elif stopping:
                tail = f"; {', '.join(r.job_id for r, _ in stopping)} is checkpointing to free devices"
            else:
                tail = ""
            plan.reasons[job.job_id] = Reason(Why.WAITING, f"waiting: {need}; {cluster.free_text(after, types)}{tail}")


def _cluster_or_none(snapshot: ClusterSnapshot) -> LiveCluster | None:
    """The cluster's model, or None when there is nothing to schedule on."""
    try:
        return LiveCluster.of(snapshot)
    except InputError:
        return None


__all__ = ["ControllerSettings", "CpuHold", "Launch", "LiveCluster", "LiveJob", "LiveScheduler", "Plan", "Stop",
           "UnitRate", "job_request", "live_throughputs"]
