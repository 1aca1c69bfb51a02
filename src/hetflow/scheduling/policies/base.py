"""The one interface every cluster policy implements, and what a policy is shown.

A policy is called with a :class:`ClusterView` and returns the jobs that should run now and
where::

    policy.schedule(view) -> {job_id: Assignment}

Contract:

- The result names only jobs in ``view.jobs`` (waiting jobs, and at a round boundary the
  running preemptible ones). Pinned jobs (``view.pinned``: running under an unexpired lease, or
  not preemptible) keep running where they are; their devices are already taken in
  ``view.scratch()``.
- A running, unpinned job missing from the result is preempted (it pays its checkpoint-restore
  cost when it runs again); one given another assignment migrates (same cost). A job given its
  current assignment just continues.
- Policies never change the view, the jobs or the engine's capacity: they plan on
  ``view.scratch()``, a private copy. The mechanism (events, rounds and leases, preemption,
  restore cost, progress) belongs to the engine (:mod:`hetflow.sim.engine`), identical for every
  policy; a policy only declares whether it wants rounds (``preemptive``).

Speeds come from the job: ``job.ideal_rates`` (steps/s per device type at the best placement of
its gang in this cluster; types where it cannot run are absent) and ``job.best_rate``.

Elastic jobs (the simulator's) also have ``sizes`` (the device counts they may be given; a
decision may give any of them, checked) and ``rates_at(n)`` (``ideal_rates`` at ``n`` devices);
a job without ``sizes`` runs at ``request.num_gpus`` only (:func:`hetflow.scheduling.elastic.sizes_of`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Iterable, Mapping, Protocol, Sequence

from hetflow.scheduling.policies.capacity import Assignment, ClusterModel, FreeCapacity, Request
from hetflow.scheduling.policies.placer import Placer


class JobInfo(Protocol):
    """A job as policies see it (read-only). Work is in the throughput table's steps."""

    @property
    def job_id(self) -> str: ...
    @property
    def job_type(self) -> str: ...
    @property
    def arrival_s(self) -> float: ...
    @property
    def request(self) -> Request: ...
    @property
    def num_gpus(self) -> int: ...
    @property
    def weight(self) -> float: ...
    @property
    def preemptible(self) -> bool: ...
    @property
    def restore_s(self) -> float: ...
    @property
    def total_work(self) -> float: ...
    @property
    def done_work(self) -> float: ...
    @property
    def remaining_work(self) -> float: ...
    @property
    def assignment(self) -> Assignment | None: ...
    @property
    def needs_restore(self) -> bool:
        """Starting it now costs ``restore_s`` (it ran before and is not running now)."""
    @property
    def attained_s(self) -> float:
        """Device-seconds received so far (devices x seconds, shares counted as fractions)."""
    @property
    def service_by_type(self) -> Mapping[str, float]:
        """Seconds run on each device type so far."""
    @property
    def ideal_rates(self) -> Mapping[str, float]: ...
    @property
    def best_rate(self) -> float: ...


@dataclass(frozen=True)
class ClusterView:
    """What a policy sees at one decision. ``scratch()`` gives a fresh private capacity copy."""

    now: float
    round_boundary: bool  # leases just expired: every preemptible running job is unpinned
    model: ClusterModel
    jobs: Sequence[JobInfo]  # the jobs to decide on: waiting, and running but not pinned
    pinned: Mapping[str, JobInfo]  # running jobs that stay where they are, by job id
    free: FreeCapacity  # after pinned jobs; read-only, use scratch()
    demand_mix: Mapping[tuple[int, int], float]  # {(num_gpus, milli): arrivals so far}
    demand_host: Mapping[tuple[int, int], tuple[float, float]]  # class -> mean (CPU milli, memory MiB)
    lease_s: float = 360.0  # how long a decision holds for preemptive policies (the round)
    rate_of: Callable[[JobInfo, Assignment], float] | None = None  # steps/s of a job on an assignment

    def scratch(self) -> FreeCapacity:
        return self.free.fork()

    def unpinned(self) -> list[JobInfo]:
        return list(self.jobs)


class Policy(Protocol):
    name: str
    preemptive: bool  # wants rounds: leases expire every round and it may preempt then

    def schedule(self, view: ClusterView) -> dict[str, Assignment]:
        """The jobs (not pinned) to run now and where; see the module docstring."""


def feasible_types(job: JobInfo, free: FreeCapacity) -> list[str]:
    """Device types, in cluster order, where the job can run at all."""
    order = free.model.type_index
    return sorted(job.ideal_rates, key=order.__getitem__)


def prefer_current(job: JobInfo, types: Sequence[str]) -> list[str]:
    """``types`` with the job's current device type moved to the front (no needless moves)."""
    cur = job.assignment
    if cur is None or cur.device_type not in types:
        return list(types)
    return [cur.device_type] + [t for t in types if t != cur.device_type]


def fill(
    view: ClusterView,
    scratch: FreeCapacity,
    ordered: Iterable[tuple[JobInfo, Sequence[str]]],
    placer: Placer,
    out: dict[str, Assignment],
    accept: Callable[[JobInfo, Assignment], bool] | None = None,
) -> None:
    """Place jobs in the given order, each on the first of its ``types`` with room.

    A running job whose devices are still free in ``scratch`` keeps them unless a type listed
    before its current one has room (a deliberate move); it never moves within its type.
    ``accept(job, assignment)`` may refuse a placement (say, a gang split over slow links); the
    job then tries its next type. Stops early once no device share is free.
    """
    no_room: dict[tuple, list[tuple[int, int, int]]] = {}
    for job, types in ordered:
        if job.job_id in out or not types:
            continue
        request = job.request
        if request.num_gpus > 0 and scratch.total_free_milli() <= 0:
            break
        cur = job.assignment
        if cur is not None and cur.device_type in types and scratch.can_take(cur):
            better = types[: types.index(cur.device_type)]
            a = _place(scratch, job, better, placer, accept) if better else None
            a = a or cur
            scratch.take(a)
            out[job.job_id] = a
            continue
        # Within one fill the scratch only shrinks: a request no smaller than one that found
        # no room will not find any either (saves re-trying thousands of waiting jobs).
        key = (request.num_gpus, tuple(types), job.job_type if accept else None)
        sizes = (request.milli, request.cpu_milli, request.memory_mib)
        failed = no_room.setdefault(key, [])
        if any(all(x >= y for x, y in zip(sizes, f)) for f in failed):
            continue
        a = _place(scratch, job, types, placer, accept)
        if a is not None:
            scratch.take(a)
            out[job.job_id] = a
        elif len(failed) < 64:
            failed.append(sizes)


def _place(scratch: FreeCapacity, job: JobInfo, types: Sequence[str], placer: Placer,
           accept: Callable[[JobInfo, Assignment], bool] | None) -> Assignment | None:
    """The placer's choice over all ``types``; if ``accept`` refuses it, each other type alone."""
    types = [t for t in types if scratch.could_fit(job.request, t)]
    if not types:
        return None
    a = placer.place(scratch, job.request, types)
    if a is None or accept is None or accept(job, a):
        return a
    for t in types:
        if t == a.device_type:
            continue
        b = placer.place(scratch, job.request, [t])
        if b is not None and accept(job, b):
            return b
    return None


def select_by_count(
    ordered: Iterable[JobInfo],
    free: FreeCapacity,
    choose: Callable[[JobInfo, Mapping[str, int]], Sequence[str]],
) -> list[tuple[JobInfo, list[str]]]:
    """Walk jobs in priority order and keep those the free device counts can hold.

    ``choose(job, budget)`` returns the job's device types by preference among those with
    budget left; the job is charged to the first. Returns (job, types) for the chosen jobs,
    still in priority order. Counting ignores fragmentation; ``fill`` sorts that out.
    """
    budget = {t: free.free_milli(t) for t in free.model.device_types}
    chosen: list[tuple[JobInfo, list[str]]] = []
    for job in ordered:
        if all(v <= 0 for v in budget.values()):
            break
        need = job.request.gpu_milli
        options = [t for t in choose(job, budget) if budget.get(t, 0) >= need]
        if not options:
            continue
        budget[options[0]] -= need
        chosen.append((job, options))
    return chosen


def keep_or_place(view: ClusterView, chosen: list[tuple[JobInfo, list[str]]], placer: Placer,
                  backfill: Iterable[tuple[JobInfo, Sequence[str]]] = (),
                  accept: Callable[[JobInfo, Assignment], bool] | None = None) -> dict[str, Assignment]:
    """The usual second half of a round: chosen running jobs that stay on their device type
    keep their devices first (so a preemption happens only when someone else needs them), then
    the other chosen jobs are placed in priority order, then ``backfill`` fills what is left."""
    scratch = view.scratch()
    out: dict[str, Assignment] = {}
    for job, types in chosen:
        cur = job.assignment
        if cur is not None and types and cur.device_type == types[0] and scratch.can_take(cur):
            scratch.take(cur)
            out[job.job_id] = cur
    fill(view, scratch, chosen, placer, out, accept)
    fill(view, scratch, backfill, placer, out, accept)
    return out
