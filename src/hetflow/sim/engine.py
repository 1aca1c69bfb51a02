"""Discrete-event simulation of a cluster policy on a trace, with a clock the engine owns.

    sim = Simulator(model, trace.jobs, make_policy("hetflow"), throughputs, SimConfig())
    result = sim.run()          # -> SimResult; hetflow.sim.metrics summarises it

Events are job arrivals, job completions and - for policies that declare ``preemptive`` -
round boundaries every ``round_s`` seconds, where every lease expires (Gavel's mechanism). At
each event that can change something the engine shows the policy a
:class:`~hetflow.scheduling.policies.base.ClusterView` and applies what it returns:

- jobs under an unexpired lease, and running jobs that are not preemptible, are pinned;
- a running job the policy leaves out is preempted: its progress is kept (checkpoint) and it
  pays ``restore_s`` of no progress when it runs again; a changed assignment is a migration
  (same cost); a job's speed is the throughput model's rate for its device type and the
  collective bandwidth of its devices;
- every assignment is checked (device type, gang size, share, host resources, capacity): a
  policy that breaks the rules fails an assert, it is never silently fixed;
- an elastic job (``Job.min_gpus``/``max_gpus``, :mod:`hetflow.scheduling.elastic`) may be given
  any of its sizes; its rate at ``n`` devices is its rate at its declared size on that type times
  its scaling curve, times what the placement's links cost a gang of ``n``. A changed size is a
  **resize**: checkpoint and restart on the new devices, ``restore_s`` of no progress (the same
  cost as a migration), counted in ``JobRecord.resizes``.

The same mechanism serves every policy; nothing here depends on a policy's name. Time comes only
from the injected :class:`Clock` (``SimClock`` here; the live runtime's clock is wall time).

Given a :class:`~hetflow.scheduling.rank_planner.RankPlanner` (``ranks=``), the placement planner
then picks each started gang's devices inside the policy's choice, as the live controller does
(same nodes and counts, or other nodes of the type with faster links).
"""

from __future__ import annotations

import heapq
import math
from dataclasses import dataclass
from typing import Callable, Mapping, Protocol, Sequence

from hetflow.core.errors import InputError
from hetflow.scheduling.elastic import DEFAULT_SCALING, parse_scaling
from hetflow.scheduling.policies.base import Policy
from hetflow.scheduling.policies.capacity import WHOLE, Assignment, ClusterModel, FreeCapacity, Request
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
    size_link_factor,
)
from hetflow.scheduling.policies.rounds import size_rates as rates_by_size
from hetflow.scheduling.rank_planner import RankPlanner
from hetflow.scheduling.throughput import ThroughputModel
from hetflow.sim.traces import Job


class Clock(Protocol):
    @property
    def now(self) -> float: ...


class SimClock:
    """Simulated time in seconds; only the engine moves it, and only forward."""

    def __init__(self, start: float = 0.0) -> None:
        self._now = float(start)

    @property
    def now(self) -> float:
        return self._now

    def advance_to(self, t: float) -> None:
        assert t >= self._now, f"time went backwards: {t} < {self._now}"
        self._now = t


@dataclass(frozen=True)
class SimConfig:
    round_s: float = 360.0  # lease length for preemptive policies (Gavel: 6 minutes)
    restore_s: float = 30.0  # default checkpoint-restore cost for jobs that do not give one
    window: tuple[int, int] | None = None  # measured jobs by arrival index; stop when they finish
    until_s: float | None = None  # stop the clock here (open-ended jobs)
    # ("avg" | "p95", seconds): stop as soon as the trace's average (or P95) job completion time
    # is sure to exceed this (capacity planning: a fleet that misses its target need not be run
    # to the end). Whole-trace runs only (no window).
    stop_past: tuple[str, float] | None = None

    def __post_init__(self) -> None:
        if self.round_s <= 0 or self.restore_s < 0:
            raise InputError("round_s must be > 0 and restore_s >= 0")
        if self.stop_past is not None:
            if self.stop_past[0] not in ("avg", "p95") or not self.stop_past[1] > 0:
                raise InputError("stop_past must be ('avg' or 'p95', seconds > 0)")
            if self.window is not None:
                raise InputError("stop_past judges the whole trace: it does not go with a window")
        if self.window is not None and not 0 <= self.window[0] < self.window[1]:
            raise InputError(f"window {self.window[0]}:{self.window[1]} must be START:STOP with START < STOP")


@dataclass(frozen=True, slots=True)
class Segment:
    """One stretch of a job on fixed devices. The first ``restore_s`` of it makes no progress."""

    job: int  # index into SimResult.jobs
    start: float
    end: float
    device_type: str
    slots: tuple[tuple[int, int], ...]
    milli: int
    devices: float  # devices held, shares counted as fractions
    restore_s: float
    rate: float  # steps/s while productive
    ideal_rate: float  # the same job's rate on this type at its best placement
    best_rate: float  # its best rate on any type
    host: int | None = None  # node whose CPU and memory it holds
    cpu_milli: int = 0
    memory_mib: int = 0

    @property
    def productive_s(self) -> float:
        return max(0.0, self.end - self.start - self.restore_s)


@dataclass
class JobRecord:
    job: Job
    first_start: float | None = None
    finish: float | None = None
    preemptions: int = 0
    migrations: int = 0
    resizes: int = 0  # elastic jobs: restarts at another size
    done_work: float = 0.0
    best_rate: float = 0.0  # its rate on its best device type (0 if it can run nowhere)
    rejected: str | None = None  # why it could never run

    @property
    def jct_s(self) -> float | None:
        return None if self.finish is None else self.finish - self.job.arrival_s


@dataclass
class SimResult:
    policy: str
    model: ClusterModel
    jobs: list[JobRecord]
    segments: list[Segment]
    demand: list[tuple[float, int, int]]  # (time, outstanding GPU milli of active jobs, waiting jobs)
    measured: range  # indices of the measured jobs
    end_s: float
    decisions: int = 0
    stopped_past_s: float | None = None  # SimConfig.stop_past: when the target was sure to be missed


class SimJob:
    """The engine's record of one active job; policies see it through ``JobInfo`` (read-only)."""

    __slots__ = ("idx", "job", "request", "restore_s", "ideal_rates", "best_rate", "_clock",
                 "done_base", "assignment", "seg_start", "seg_restore", "seg_rate", "epoch",
                 "needs_restore", "attained_base", "service_base", "devices", "sizes", "size_rates")

    def __init__(self, idx: int, job: Job, restore_s: float, ideal_rates: Mapping[str, float], clock: Clock,
                 size_rates: Mapping[int, Mapping[str, float]] | None = None) -> None:
        self.idx = idx
        self.job = job
        self.request = Request(job.num_gpus, job.gpu_milli, job.cpu_milli, job.memory_mib)
        self.restore_s = restore_s
        self.ideal_rates = ideal_rates
        self.best_rate = max(ideal_rates.values(), default=0.0)
        self._clock = clock
        self.done_base = 0.0
        self.assignment: Assignment | None = None
        self.seg_start = 0.0
        self.seg_restore = 0.0
        self.seg_rate = 0.0
        self.epoch = 0
        self.needs_restore = False
        self.attained_base = 0.0
        self.service_base: dict[str, float] = {}
        self.devices = self.request.gpu_milli / WHOLE
        # elastic jobs: {size: {device type: rate at its best placement}}; rigid: the one size
        self.size_rates = dict(size_rates) if size_rates else {job.num_gpus: ideal_rates}
        self.sizes = tuple(sorted(self.size_rates))

    def rates_at(self, n: int) -> Mapping[str, float]:
        """Rate on each device type at ``n`` devices (best placement); empty for other sizes."""
        return self.size_rates.get(n, {})

    # JobInfo
    job_id = property(lambda self: self.job.job_id)
    job_type = property(lambda self: self.job.job_type)
    arrival_s = property(lambda self: self.job.arrival_s)
    num_gpus = property(lambda self: self.job.num_gpus)
    weight = property(lambda self: self.job.weight)
    preemptible = property(lambda self: self.job.preemptible)
    total_work = property(lambda self: self.job.total_work)

    @property
    def done_work(self) -> float:
        return progress_at(self._clock.now, self.done_base, self.job.total_work, self.seg_start,
                           self.seg_restore, self.seg_rate, self.assignment is not None)

    @property
    def remaining_work(self) -> float:
        return self.job.total_work - self.done_work

    @property
    def attained_s(self) -> float:
        return attained_at(self._clock.now, self.attained_base, self.devices, self.seg_start,
                           self.assignment is not None)

    @property
    def service_by_type(self) -> Mapping[str, float]:
        return service_at(self._clock.now, self.service_base, self.seg_start,
                          self.assignment.device_type if self.assignment is not None else None)


ProgressFn = Callable[[int, int], None]


class Simulator:
    """Replays ``jobs`` on ``model`` under ``policy``. One run per instance."""

    def __init__(self, model: ClusterModel, jobs: Sequence[Job], policy: Policy, throughputs: ThroughputModel,
                 config: SimConfig = SimConfig(), clock: SimClock | None = None,
                 progress: ProgressFn | None = None, ranks: RankPlanner | None = None) -> None:
        self.model = model
        self.ranks = ranks  # the planner's devices inside the policy's choice (None: the policy's)
        self._free_after: tuple[Sequence, FreeCapacity] | None = None  # (a decision's starts, free after them)
        self.jobs = sorted(jobs, key=lambda j: j.arrival_s)
        ids = [j.job_id for j in self.jobs]
        if len(set(ids)) != len(ids):
            raise InputError("job ids in the trace are not unique")
        self.policy = policy
        self.throughputs = throughputs
        self.config = config
        self.clock = clock or SimClock(self.jobs[0].arrival_s if self.jobs else 0.0)
        self.progress = progress
        self.free = FreeCapacity(model)
        self.records = [JobRecord(j) for j in self.jobs]
        self.active: dict[int, SimJob] = {}  # arrival order
        self.waiting: dict[int, SimJob] = {}  # arrival order
        self.running: dict[str, SimJob] = {}  # by job id
        self.by_id: dict[str, SimJob] = {}
        self.segments: list[Segment] = []
        self.demand: list[tuple[float, int, int]] = []
        self.outstanding_milli = 0
        self.demand_mix = DemandMix()  # request classes seen, with their host resources
        self._events: list[tuple[float, int, int, int]] = []  # (time, seq, job idx, epoch)
        self._seq = 0
        self._running_finite = 0
        self._rate_memo: dict[tuple, float] = {}
        self._ideal_memo: dict[tuple, dict[str, float]] = {}
        self.decisions = 0
        w = config.window
        n = len(self.jobs)
        self.measured = range(min(w[0], n), min(w[1], n)) if w else range(n)
        if w and w[0] >= n:
            raise InputError(f"--window {w[0]}:{w[1]} starts after the last of the trace's {n} jobs")
        self._open_measured = set(self.measured)
        self._finished_measured = 0
        # SimConfig.stop_past: sums kept as jobs arrive and finish (no pass over the jobs per event)
        self._jct_sum = 0.0  # finished jobs
        self._late_finished = 0  # finished jobs whose JCT exceeds the p95 target
        self._open_arrival_sum = 0.0  # arrived, unfinished jobs
        self._stopped_past: float | None = None
        self._rejected_any = False  # a job that can run nowhere: the trace never completes
        self._future_floor = 0.0  # jobs not arrived yet: the sum of their times alone at their best
        if config.stop_past is not None:
            for job in self.jobs:
                self._future_floor += self._floor_s(job)

    # -- speeds ----------------------------------------------------------------------------

    def ideal_rates(self, job: Job) -> dict[str, float]:
        """Rate on each device type where the job can run, at its best placement there."""
        req = Request(job.num_gpus, job.gpu_milli, job.cpu_milli, job.memory_mib)
        key = (job.job_type, job.num_gpus, job.allowed_types, job.memory_bytes, req.uses_host)
        hit = self._ideal_memo.get(key)
        if hit is None:
            hit = ideal_rates(self.model, self.throughputs, job.job_type, req, job.allowed_types,
                              job.memory_bytes)
            self._ideal_memo[key] = hit
        return hit

    def size_rates(self, job: Job, rates: Mapping[str, float]) -> dict[int, dict[str, float]] | None:
        """An elastic job's rate per device type at each of its sizes (best placement); sizes
        that run nowhere are left out. None for a rigid job."""
        sizes = job.sizes
        if len(sizes) == 1:
            return None
        curve = parse_scaling(job.scaling or DEFAULT_SCALING)
        key = ("sizes", job.job_type, job.num_gpus, sizes, curve, job.allowed_types, job.memory_bytes)
        hit = self._ideal_memo.get(key)
        if hit is None:
            hit = rates_by_size(self.model, self.throughputs, job.job_type, job.num_gpus, sizes, curve,
                             rates, job.allowed_types, job.memory_bytes)
            self._ideal_memo[key] = hit
        return hit  # type: ignore[return-value]

    def _rate(self, job: SimJob, a: Assignment) -> float:
        gbps = self.model.group_gbps(a.slots)
        spans = len({n for n, _ in a.slots}) > 1
        n = len(a.slots)
        if n != job.num_gpus and len(job.sizes) > 1:
            return self._elastic_rate(job, a, n, gbps, spans)
        key = (job.job.job_type, job.num_gpus, a.device_type, gbps, spans)
        hit = self._rate_memo.get(key)
        if hit is None:
            hit = assignment_rate(self.model, self.throughputs, job.job.job_type, job.num_gpus, a)
            self._rate_memo[key] = hit
        return hit

    def _elastic_rate(self, job: SimJob, a: Assignment, n: int, gbps: float, spans: bool) -> float:
        """Rate at ``n`` devices = the best-placement rate at ``n`` (curve) x what these links
        cost a gang of ``n`` by the throughput model (1 on the best placement)."""
        ideal = job.rates_at(n).get(a.device_type, 0.0)
        t = a.device_type
        key = ("link", job.job.job_type, n, t, gbps, spans)
        link = self._rate_memo.get(key)
        if link is None:
            link = size_link_factor(self.model, self.throughputs, job.job.job_type, a)
            self._rate_memo[key] = link
        return ideal * link

    # -- the loop ---------------------------------------------------------------------------

    def run(self) -> SimResult:
        n = len(self.jobs)
        next_arrival = 0
        next_round: float | None = None
        round_s = self.config.round_s
        until = self.config.until_s
        while True:
            candidates = []
            if next_arrival < n:
                candidates.append(self.jobs[next_arrival].arrival_s)
            if self._events:
                candidates.append(self._events[0][0])
            if next_round is not None:
                candidates.append(next_round)
            if not candidates:
                break
            t = min(candidates)
            if until is not None and t > until:
                self.clock.advance_to(max(until, self.clock.now))
                break
            self.clock.advance_to(t)
            changed = False
            while self._events and self._events[0][0] <= t:
                _, _, idx, epoch = heapq.heappop(self._events)
                job = self.active.get(idx)
                if job is not None and job.epoch == epoch:
                    self._complete(job)
                    changed = True
            while next_arrival < n and self.jobs[next_arrival].arrival_s <= t:
                self._admit(next_arrival)
                next_arrival += 1
                changed = True
            boundary = next_round is not None and next_round <= t
            if self._open_measured == set() and self.config.window is not None:
                break
            if self.config.stop_past is not None and self._past_target(t):
                self._stopped_past = t
                break
            if self.active and (boundary or (changed and self._worth_asking())):
                self._decide(boundary)
            if changed:
                self._log_demand(t)
            if self.policy.preemptive and self.active:
                if next_round is None or boundary:
                    next_round = (math.floor(t / round_s + 1e-9) + 1) * round_s
            else:
                next_round = None
            stalled_check = boundary or not self.policy.preemptive
            if next_arrival >= n and self._running_finite == 0 and (stalled_check or not self.active):
                break  # nothing left that can finish: open-ended jobs only, or jobs that never fit
        return self._result()

    def _floor_s(self, job: Job) -> float:
        """The job's time alone at its fastest rate on any type and size (a lower bound of its JCT)."""
        rates = self.ideal_rates(job)
        sizes = self.size_rates(job, rates) if rates else None
        best = max((r for by_type in (sizes or {0: rates}).values() for r in by_type.values()), default=0.0)
        return job.total_work / best if best > 0 else math.inf

    @staticmethod
    def _remaining_floor(j: SimJob) -> float:
        best = max((r for by_type in j.size_rates.values() for r in by_type.values()), default=0.0)
        return j.remaining_work / best if best > 0 else math.inf

    def _past_target(self, t: float) -> bool:
        """Whether the whole trace's JCT is already sure to exceed ``config.stop_past``: a job
        that can run nowhere; the sum of the finished jobs' JCTs and the open jobs' ages so far (a
        lower bound of the final sum) over n x target (avg); or so many jobs already past the
        target that the P95 (numpy's linear interpolation) must be too."""
        metric, target = self.config.stop_past  # type: ignore[misc]
        if self._rejected_any:
            return True
        n = len(self.jobs)
        if metric == "avg":
            bound = self._jct_sum + len(self.active) * t - self._open_arrival_sum + self._future_floor
            if bound > target * n:
                return True
            # the open jobs' remaining work at their best rate too (a pass over them: only when close)
            if bound > 0.5 * target * n:
                bound += sum(self._remaining_floor(j) for j in self.active.values())
            return bound > target * n
        need = n - math.floor(0.95 * (n - 1))  # jobs above the target that force the P95 above it
        late = self._late_finished
        if late >= need:
            return True
        for j in self.active.values():  # sure to finish past the target: its age and what it has left
            if t - j.job.arrival_s + self._remaining_floor(j) > target:
                late += 1
                if late >= need:
                    return True
        return False

    def _worth_asking(self) -> bool:
        if not self.waiting:
            return False
        return self.free.total_free_milli() > 0 or self.model.has_host_limits

    def _log_demand(self, t: float) -> None:
        entry = (t, self.outstanding_milli, len(self.waiting))
        if self.demand and self.demand[-1][0] == t:
            self.demand[-1] = entry
        else:
            self.demand.append(entry)

    def _admit(self, idx: int) -> None:
        job = self.jobs[idx]
        rates = self.ideal_rates(job)
        if not rates:
            self.records[idx].rejected = (
                f"job {job.job_id} ({job.job_type}, {job.num_gpus} GPUs) cannot run on any device type "
                f"of this cluster ({', '.join(self.model.device_types)})")
            self._rejected_any = True
            self._measured_done(idx)
            return
        restore = self.config.restore_s if job.restore_s is None else job.restore_s
        sj = SimJob(idx, job, restore, rates, self.clock, self.size_rates(job, rates))
        self.records[idx].best_rate = sj.best_rate
        self.active[idx] = sj
        self.waiting[idx] = sj
        self.by_id[job.job_id] = sj
        self.outstanding_milli += sj.request.gpu_milli
        self.demand_mix.add(sj.request)
        self._open_arrival_sum += job.arrival_s
        if self.config.stop_past is not None:
            self._future_floor -= self._floor_s(job)

    def _measured_done(self, idx: int) -> None:
        if idx in self._open_measured:
            self._open_measured.discard(idx)
            self._finished_measured += 1
            if self.progress:
                self.progress(self._finished_measured, len(self.measured))

    # -- decisions ---------------------------------------------------------------------------

    def _decide(self, boundary: bool) -> None:
        """One decision through the shared round functions (the live controller uses them too)."""
        inputs = build_round(self.clock.now, boundary and self.policy.preemptive, self.model, self.free,
                             self.running, self.waiting.values(), lambda j: j.idx, self.demand_mix,
                             self.config.round_s, self._rate)
        decision = self.policy.schedule(inputs.view)
        self.decisions += 1
        check_decision(decision, inputs)
        changes = diff_decision(decision, inputs.movable)
        moved: set[int] = set()
        resized: set[int] = set()
        for j, new in changes.stops:  # stop everything that changes first, then start: no overlap
            old = j.assignment
            self._stop(j)
            if new is None:
                self.records[j.idx].preemptions += 1
            elif old is not None and len(new.slots) != len(old.slots):
                resized.add(j.idx)
            else:
                moved.add(j.idx)
        for jid, a in changes.starts:
            j = self.by_id[jid]
            if self.ranks is not None and a.slots:
                a = self._planned(jid, a, changes.starts)
            self._start(j, a)
            if j.idx in moved:
                self.records[j.idx].migrations += 1
            elif j.idx in resized:
                self.records[j.idx].resizes += 1

    def _planned(self, jid: str, a: Assignment, starts: Sequence[tuple[str, Assignment]]) -> Assignment:
        """The rank planner's devices for one start of a decision, inside the policy's choice
        ``a``, among the devices free once all the decision's ``starts`` are applied (taken at its
        first start, then updated by the planner as it moves jobs)."""
        assert self.ranks is not None
        if self._free_after is None or self._free_after[0] is not starts:
            after = self.free.fork()
            for _, other in starts:
                after.take(other)
            self._free_after = (starts, after)
        choice = self.ranks.plan(jid, a, None, self._free_after[1])
        return a if choice is None else choice.assignment

    def _start(self, j: SimJob, a: Assignment) -> None:
        now = self.clock.now
        rate = self._rate(j, a)
        assert rate > 0, f"job {j.job_id} placed where it cannot run"
        self.free.take(a)
        j.assignment = a
        j.devices = len(a.slots) * a.milli / WHOLE if a.slots else j.request.gpu_milli / WHOLE
        self.waiting.pop(j.idx, None)
        self.running[j.job.job_id] = j
        j.seg_start = now
        j.seg_restore = j.restore_s if j.needs_restore else 0.0
        j.seg_rate = rate
        rec = self.records[j.idx]
        if rec.first_start is None:
            rec.first_start = now
        if math.isfinite(j.job.total_work):
            finish = now + j.seg_restore + (j.job.total_work - j.done_base) / rate
            self._seq += 1
            heapq.heappush(self._events, (finish, self._seq, j.idx, j.epoch))
            self._running_finite += 1

    def _close(self, j: SimJob, finished: bool) -> None:
        now = self.clock.now
        a = j.assignment
        assert a is not None
        held = now - j.seg_start
        productive = max(0.0, held - j.seg_restore)
        j.done_base = j.job.total_work if finished else min(j.job.total_work, j.done_base + j.seg_rate * productive)
        j.attained_base += j.devices * held
        j.service_base[a.device_type] = j.service_base.get(a.device_type, 0.0) + held
        self.segments.append(Segment(
            j.idx, j.seg_start, now, a.device_type, a.slots, a.milli, j.devices, j.seg_restore, j.seg_rate,
            j.rates_at(len(a.slots)).get(a.device_type, j.ideal_rates[a.device_type]) if len(j.sizes) > 1
            else j.ideal_rates[a.device_type], j.best_rate, a.host, a.cpu_milli, a.memory_mib))
        self.free.release(a)
        j.assignment = None
        del self.running[j.job.job_id]
        self.waiting[j.idx] = j
        j.epoch += 1
        if math.isfinite(j.job.total_work):
            self._running_finite -= 1

    def _stop(self, j: SimJob) -> None:
        self._close(j, finished=False)
        j.needs_restore = True

    def _complete(self, j: SimJob) -> None:
        self._close(j, finished=True)
        rec = self.records[j.idx]
        rec.finish = self.clock.now
        rec.done_work = j.done_base
        del self.active[j.idx]
        del self.waiting[j.idx]
        del self.by_id[j.job.job_id]
        self.outstanding_milli -= j.request.gpu_milli
        self._open_arrival_sum -= j.job.arrival_s
        jct = self.clock.now - j.job.arrival_s
        self._jct_sum += jct
        if self.config.stop_past is not None and jct > self.config.stop_past[1]:
            self._late_finished += 1
        self._measured_done(j.idx)

    def _result(self) -> SimResult:
        end = self.clock.now
        for j in list(self.active.values()):  # close what is still running at the end
            if j.assignment is not None:
                self._close(j, finished=False)
            self.records[j.idx].done_work = j.done_base
        self._log_demand(end)
        return SimResult(self.policy.name, self.model, self.records, self.segments, self.demand,
                         self.measured, end, self.decisions, self._stopped_past)
