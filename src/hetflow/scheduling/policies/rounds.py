"""One scheduling decision, shared by the simulator and the live controller.

Both :class:`hetflow.sim.engine.Simulator` and the cluster controller
(:mod:`hetflow.control.scheduler`) run a decision the same way, through these functions:

    inputs = build_round(now, unpin, model, free, running, waiting, order, demand, lease_s, rate_of)
    decision = policy.schedule(inputs.view)
    check_decision(decision, inputs)          # a policy that breaks the rules fails an assert
    changes = diff_decision(decision, inputs.movable)
    # stop changes.stops (preempted when new is None, else migrated), then start changes.starts

Rules (the engine's since the first simulator; moved here unchanged so the live path cannot
drift from them):

- ``unpin`` (a round boundary for a preemptive policy): every preemptible running job is
  unpinned - its devices are given back in the view's free capacity and it is decided on again
  with the waiting jobs, all in ``order``. Non-preemptible running jobs stay pinned.
- otherwise every running job is pinned and only the waiting jobs are decided on.
- the demand mix is every request class seen so far with its mean host resources (what the
  fragmentation-aware placer scores against).

Everything here is pure (no ray, no clock of its own): time is the ``now`` passed in.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from types import MappingProxyType
from typing import TYPE_CHECKING, Callable, Iterable, Mapping, Sequence

from hetflow.scheduling.policies.base import ClusterView, JobInfo
from hetflow.scheduling.policies.capacity import Assignment, ClusterModel, FreeCapacity, Request
from hetflow.scheduling.throughput import ThroughputModel

if TYPE_CHECKING:
    from hetflow.scheduling.elastic import Scaling

RateOf = Callable[[JobInfo, Assignment], float]


@dataclass
class DemandMix:
    """Request classes seen so far: ``(num_gpus, milli) -> count`` and their host sums."""

    counts: dict[tuple[int, int], float] = field(default_factory=dict)
    host_sums: dict[tuple[int, int], tuple[float, float]] = field(default_factory=dict)

    def add(self, request: Request) -> None:
        key = (request.num_gpus, request.milli)
        self.counts[key] = self.counts.get(key, 0.0) + 1.0
        c, m = self.host_sums.get(key, (0.0, 0.0))
        self.host_sums[key] = (c + request.cpu_milli, m + request.memory_mib)

    def host_means(self) -> dict[tuple[int, int], tuple[float, float]]:
        return {k: (c / self.counts[k], m / self.counts[k]) for k, (c, m) in self.host_sums.items()}


@dataclass(frozen=True)
class RoundInputs:
    """What one decision was made from: the policy's view and the running jobs it may move."""

    view: ClusterView
    movable: tuple[JobInfo, ...]  # running jobs unpinned this round (empty between rounds)


def build_round(
    now: float,
    unpin: bool,
    model: ClusterModel,
    free: FreeCapacity,
    running: Mapping[str, JobInfo],
    waiting: Iterable[JobInfo],
    order: Callable[[JobInfo], object],
    demand: DemandMix,
    lease_s: float,
    rate_of: RateOf | None,
) -> RoundInputs:
    """The view for one decision (see the module docstring). ``free`` is not changed.

    ``running`` maps job id -> running job (each with its ``assignment``), ``waiting`` are the
    jobs not running, ``order`` sorts the jobs decided on at a boundary (arrival order).
    """
    free = free.fork()
    if unpin:
        pinned: Mapping[str, JobInfo] = {jid: j for jid, j in running.items() if not j.preemptible}
        movable = [j for j in running.values() if j.preemptible]
        for j in movable:
            assert j.assignment is not None, f"running job {j.job_id} has no assignment"
            free.release(j.assignment)
        decide = sorted([*movable, *waiting], key=order)
    else:
        pinned = MappingProxyType(dict(running))
        movable = []
        decide = list(waiting)
    view = ClusterView(now, unpin, model, decide, pinned, free, dict(demand.counts),
                       demand.host_means(), lease_s, rate_of)
    return RoundInputs(view, tuple(movable))


def check_decision(decision: Mapping[str, Assignment], inputs: RoundInputs) -> None:
    """Every assignment names a job of the view and obeys its request and the capacity left
    after pinned jobs (asserts: a violation is a bug in a policy, never a user error)."""
    view = inputs.view
    candidates = {j.job_id: j for j in view.jobs}
    scratch = view.free.fork()
    m = view.model
    for jid, a in decision.items():
        assert jid not in view.pinned, f"policy scheduled pinned job {jid}"
        j = candidates.get(jid)
        assert j is not None, f"policy scheduled unknown or finished job {jid}"
        req = j.request
        sizes = getattr(j, "sizes", None) or (req.num_gpus,)  # elastic jobs: any of their sizes
        assert len(a.slots) in sizes and a.milli == req.milli, f"job {jid}: wrong gang or share"
        if len(sizes) > 1:  # an elastic job may run on a type only at some of its sizes
            assert a.device_type in j.rates_at(len(a.slots)), f"job {jid} cannot run on {len(a.slots)} x {a.device_type}"
        else:
            assert a.device_type in j.ideal_rates, f"job {jid} cannot run on {a.device_type}"
        assert all(m.nodes[n].device_type == a.device_type for n, _ in a.slots), f"job {jid}: mixed types"
        if req.uses_host:
            assert a.host is not None and a.cpu_milli == req.cpu_milli and a.memory_mib == req.memory_mib
            assert all(n == a.host for n, _ in a.slots), f"job {jid}: host resources on another node"
            if not a.slots:
                assert a.device_type == m.nodes[a.host].device_type
        else:
            assert a.host is None, f"job {jid}: host resources it did not ask for"
        scratch.take(a)  # asserts: no device or host over-committed


@dataclass(frozen=True)
class RoundChanges:
    """What applying a decision changes. Stop every job in ``stops`` first (``new`` None: it
    is preempted; else it migrates to ``new``), then start ``starts`` - no transient overlap."""

    stops: tuple[tuple[JobInfo, Assignment | None], ...]
    starts: tuple[tuple[str, Assignment], ...]


def diff_decision(decision: Mapping[str, Assignment], movable: Sequence[JobInfo]) -> RoundChanges:
    """The stops and starts that turn the current assignments into ``decision``.

    A movable job given its current assignment just continues; every other job named in the
    decision starts (a waiting one, or a movable one that migrates), in the decision's order.
    """
    current = {j.job_id: j.assignment for j in movable}
    stops = tuple((j, decision.get(j.job_id)) for j in movable if decision.get(j.job_id) != j.assignment)
    starts = tuple((jid, a) for jid, a in decision.items() if current.get(jid) != a)
    return RoundChanges(stops, starts)


def ideal_rates(
    model: ClusterModel,
    throughputs: ThroughputModel,
    job_type: str,
    request: Request,
    allowed_types: frozenset[str] | None,
    memory_bytes: int | None,
) -> dict[str, float]:
    """Rate on each device type where a job can run, at its best placement there.

    A type is left out when it is not allowed, has too few devices in all (or, for a job bound
    to one host, on its largest node), every node's devices are smaller than ``memory_bytes``,
    or the throughput model says the job does not run there (rate 0). Empty: it can never run.
    """
    out: dict[str, float] = {}
    n = request.num_gpus
    for t in model.device_types:
        if allowed_types is not None and t not in allowed_types:
            continue
        if n > model.capacity_by_type[t] or (request.uses_host and n > model.largest_node_by_type[t]):
            continue
        if memory_bytes is not None:
            mems = [model.nodes[i].device_memory_bytes for i in model.nodes_of_type[t]]
            if all(x is not None and x < memory_bytes for x in mems):
                continue
        ideal = model.ideal_gbps(t, n)
        spans = n > model.largest_node_by_type[t]
        rate = throughputs.rate(job_type, n, t, ideal, spans)
        if rate > 0:
            out[t] = rate
    return out


def assignment_rate(model: ClusterModel, throughputs: ThroughputModel, job_type: str,
                    num_gpus: int, a: Assignment) -> float:
    """Steps/s of a job on an assignment: its type, its group's bandwidth, whether it spans."""
    gbps = model.group_gbps(a.slots)
    spans = len({n for n, _ in a.slots}) > 1
    return throughputs.rate(job_type, num_gpus, a.device_type, gbps, spans)


def size_rates(model: ClusterModel, throughputs: ThroughputModel, job_type: str, declared: int,
               sizes: Sequence[int], curve: "Scaling", rates: Mapping[str, float],
               allowed_types: frozenset[str] | None, memory_bytes: int | None) -> dict[int, dict[str, float]]:
    """An elastic job's rate per device type at each of its ``sizes`` (best placement), from its
    ``rates`` at its ``declared`` size and its scaling ``curve`` (``table``: the throughput
    model's own rate at each size); sizes that run nowhere are left out. The simulator
    (``Simulator.size_rates``, memoised) and the live controller both use it."""
    out: dict[int, dict[str, float]] = {}
    for n in sizes:
        if n == declared:
            at = dict(rates)
        elif curve.kind == "table":
            at = ideal_rates(model, throughputs, job_type, Request(n), allowed_types, memory_bytes)
        else:
            f = curve.relative(n, declared)
            at = {t: r * f for t, r in rates.items() if n <= model.capacity_by_type[t]}
        if at:
            out[n] = at
    return out


def sized_rate(model: ClusterModel, throughputs: ThroughputModel, job_type: str, ideal: float,
               a: Assignment) -> float:
    """Rate of an elastic job on ``a`` at a size other than its declared one: ``ideal`` (its
    rate at that size on the best placement) x :func:`size_link_factor`."""
    return ideal * size_link_factor(model, throughputs, job_type, a)


def size_link_factor(model: ClusterModel, throughputs: ThroughputModel, job_type: str,
                     a: Assignment) -> float:
    """What ``a``'s links cost a gang of its size by the throughput model, as a share of the
    best placement's rate (1 there); the simulator memoises it by (size, type, links)."""
    n, t = len(a.slots), a.device_type
    best = throughputs.rate(job_type, n, t, model.ideal_gbps(t, n), n > model.largest_node_by_type[t])
    here = assignment_rate(model, throughputs, job_type, n, a)
    return min(1.0, here / best) if best > 0 else 1.0


def progress_at(now: float, done_base: float, total: float, seg_start: float, seg_restore: float,
                seg_rate: float, running: bool) -> float:
    """Work done by ``now``: what earlier segments did plus the current segment's productive
    time (after its restore) at its rate, never more than ``total``."""
    if not running:
        return done_base
    productive = max(0.0, now - seg_start - seg_restore)
    return min(total, done_base + seg_rate * productive)


def attained_at(now: float, attained_base: float, devices: float, seg_start: float,
                running: bool) -> float:
    """Device-seconds received by ``now``: earlier segments' plus the current one's (devices
    held x seconds, shares counted as fractions)."""
    return attained_base + (devices * (now - seg_start) if running else 0.0)


def service_at(now: float, service_base: Mapping[str, float], seg_start: float,
               device_type: str | None) -> Mapping[str, float]:
    """Seconds run on each device type by ``now``: earlier segments' plus the current one's on
    ``device_type`` (None: not running)."""
    if device_type is None:
        return service_base
    out = dict(service_base)
    out[device_type] = out.get(device_type, 0.0) + now - seg_start
    return out


__all__ = ["DemandMix", "RateOf", "RoundChanges", "RoundInputs", "assignment_rate", "attained_at",
           "build_round", "check_decision", "diff_decision", "ideal_rates", "progress_at",
           "service_at", "size_link_factor", "size_rates", "sized_rate"]
