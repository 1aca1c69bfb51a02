"""``hetflow``: the default policy - heterogeneity-, topology- and fragmentation-aware.

One decision (every round, and whenever devices free up or jobs arrive), in four steps:

1. **Order** (shortest remaining area first): a job's *area* is the device-seconds it still
   needs at its best speed (devices x remaining work / best rate), divided by its weight -
   Smith's rule for gangs, which minimises average completion time far better than fair
   sharing when durations are heavy-tailed. A checkpointed job adds the restore it would pay; a
   running job subtracts ``hysteresis`` x its restore cost, so a newcomer preempts it only when
   the gain pays for the checkpoint-restore ("preemption where it pays").
2. **Match jobs to device types** with an assignment program: the jobs of the head of the queue
   are admitted in priority order until their gangs fill the free devices; each (job, device
   type) pair is worth devices x the job's *relative speed* on that type (rate / best rate; for
   a running job on another type, less ``1 + hysteresis`` restores spread over the time it
   would run there, at least one lease) / area ** ``urgency_power`` (0.25), and
   HiGHS maximises the total under each type's free devices. Short jobs come first, but a short
   job that runs nearly as fast on a K80 as on a V100 takes the K80 and leaves the V100 to a job
   that gains 10x from it: heterogeneity is used for throughput without giving up
   shortest-first order. Jobs the program leaves out (a fractional answer, no admission) are
   matched greedily by the c-mu rule (value = relative speed / area; Mandelbaum & Stolyar, 2004)
   in what is left. The program runs at round boundaries (every running job decided again);
   between rounds (an arrival, a few freed devices) the greedy rule alone decides. (The greedy
   rule alone, the policy until round 3, stayed at 0.99 of Gavel's best policy on Gavel's
   protocol; the program reaches 0.95: docs/simulator.md.)
3. **Place** with the topology-aware placer: best-fit nodes, best-linked device subsets, a gang
   inside one node whenever possible. A placement whose links cost more than
   ``1 - min_efficiency`` of the job's speed on that type (a gang split over a slow network) is
   refused: the job tries its next type, or waits. For shared-GPU or host-bound requests the
   placer scores by Fragmentation Gradient Descent against the request sizes seen so far.
4. **Backfill** what is left in priority order, running jobs preferring their current devices
   (they move only for a faster type, or when a higher-priority job needs their devices).

With no knowledge of remaining work (open-ended jobs) every area is infinite and the order is
arrival order, so on Alibaba-style requests the policy is a fragmentation-aware packer.

**Elastic jobs** (a device range and a scaling curve, :mod:`hetflow.scheduling.elastic`): the
order stays step 1's (area at the declared size), and in step 2 an elastic job asks for its
base size (the size it runs at, else its declared one). One that finds no type with room takes
the largest smaller size that fits, down to ``min_gpus``: an arrival with a smaller area takes
devices from elastic jobs behind it, which shrink ("shrink to make room", never below
``min_gpus``) instead of being preempted, and a gang that would wait starts smaller. Devices
still idle go, shortest area first, to running elastic jobs that had more (no resize), then to
growing elastic jobs where the time saved pays for the restart ("grow into idle devices",
never above ``max_gpus``) and, while any job waits, each added device keeps
``growth_efficiency`` of the speed per device. A gang that finds no placement falls back to smaller sizes. Every
resize is a checkpoint-restart the engine charges (``restore_s``). ``eager_growth=True`` also
lets a job ask for more than its base while others wait, when its time saved exceeds the delay
its extra device-seconds (sub-linear scaling) impose on the jobs behind it: better with an
efficient curve, worse with a poor one (docs/simulator.md), so it is off by default. With
``elastic=False``, or no elastic job in view, the decision is exactly the rigid one above.
"""

from __future__ import annotations

import math
from typing import Callable, Mapping, Sequence

import numpy as np

from hetflow.scheduling.elastic import sizes_of
from hetflow.scheduling.policies.base import ClusterView, JobInfo, _place, keep_or_place, prefer_current
from hetflow.scheduling.policies.capacity import WHOLE, Assignment, FreeCapacity, Request
from hetflow.scheduling.policies.placer import Placer, TopologyPlacer


CANDIDATE_FACTOR = 2


def _devices(job: JobInfo) -> float:
    return job.request.gpu_milli / WHOLE


def _base(job: JobInfo) -> JobInfo:
    return job._job if isinstance(job, _AtSize) else job


def _by_speed(job: JobInfo) -> list[str]:
    return sorted(job.ideal_rates, key=lambda t: -job.ideal_rates[t])


class _AtSize:
    """An elastic job as the rigid steps see it at one size: that gang's request and rates; its
    assignment only if it runs at that size now. Everything else is the job's."""

    __slots__ = ("_job", "size", "request", "ideal_rates", "best_rate", "assignment")

    def __init__(self, job: JobInfo, n: int) -> None:
        self._job = job
        self.size = n
        r = job.request
        self.request = Request(n, r.milli, r.cpu_milli, r.memory_mib)
        self.ideal_rates = dict(job.rates_at(n))  # type: ignore[attr-defined]
        self.best_rate = max(self.ideal_rates.values(), default=0.0)
        cur = job.assignment
        self.assignment = cur if cur is not None and len(cur.slots) == n else None

    def __getattr__(self, name: str):
        return getattr(self._job, name)


class HetflowPolicy:
    name = "hetflow"
    preemptive = True

    def __init__(self, placer: Placer | None = None, *, hysteresis: float = 2.0,
                 min_efficiency: float = 0.6, elastic: bool = True, eager_growth: bool = False,
                 growth_efficiency: float = 0.8, urgency_power: float = 0.25) -> None:
        self.placer = placer or TopologyPlacer()
        self.hysteresis = hysteresis  # restores a running job's priority is credited with
        self.min_efficiency = min_efficiency  # least share of ideal speed a placement must keep
        self.elastic = elastic  # resize elastic jobs (False: every job at its declared size)
        self.eager_growth = eager_growth  # elastic jobs ask for more than their size under load
        # While jobs wait, an elastic job grows only where each device it adds is worth at least
        # this share of one at its current size (a poor curve turns idle devices that a waiting
        # gang could gather into little progress, and a shrink later).
        self.growth_efficiency = growth_efficiency
        # how strongly the type matching favours short jobs (value ~ speed / area ** power);
        # 0.25 from a sweep on Gavel's calibration traces (docs/benchmarks.md, "The urgency power")
        self.urgency_power = urgency_power

    # -- 1. order ---------------------------------------------------------------------------

    def priority(self, job: JobInfo) -> float:
        """Remaining device-seconds at best speed, adjusted for restore costs; lower runs first
        (an elastic job counts at its declared size)."""
        best = job.best_rate
        remaining = job.remaining_work
        if best <= 0 or remaining == math.inf:
            return math.inf
        devices = max(job.request.gpu_milli / WHOLE, 1e-3)
        area = devices * remaining / best
        if job.assignment is not None:
            area -= self.hysteresis * devices * job.restore_s
        elif job.needs_restore:
            area += devices * job.restore_s
        return area / job.weight

    # -- 2. device types ---------------------------------------------------------------------

    def speed(self, job: JobInfo, t: str, lease_s: float) -> float:
        """Relative speed on ``t``: rate / best rate. A running job moving to another type pays
        ``1 + hysteresis`` restores (the restart, and a margin against moving back, as growing
        does), spread over the time it would run there (its remaining work at that rate, at
        least one lease): a long job moves to a faster type that frees up, a job about to end
        stays. (Spread over one lease only, a 60 s round made every move of a job with a
        restart of 50 s or more worthless, and a 360 s round made moves nearly free.)"""
        rate = job.ideal_rates.get(t, 0.0)
        if rate <= 0:
            return 0.0
        speed = rate / job.best_rate
        if job.assignment is not None and job.assignment.device_type != t and job.restore_s > 0:
            horizon = max(lease_s, job.remaining_work / rate)
            speed *= max(0.0, 1.0 - (1 + self.hysteresis) * job.restore_s / horizon)
        return speed

    def match_types(self, jobs: Sequence[JobInfo], keys: Mapping[str, float], free: FreeCapacity,
                    lease_s: float, program: bool = True) -> list[tuple[JobInfo, list[str]]]:
        """Device types for ``jobs`` (in priority order) within the free devices. Returns (job,
        [granted type, then the others fastest first]) in priority order.

        With ``program`` (at round boundaries, where every running job is decided again):
        admission by priority until the admitted gangs fill the free devices, then an
        assignment program (HiGHS): maximise the sum over admitted jobs of devices x relative
        speed on the type / area ** ``urgency_power`` under each type's free devices - jobs that
        gain most from a fast type get it, shorter ones first. Fractional answers and jobs the
        program leaves out go to the greedy c-mu rule (:meth:`match_greedy`) in what is left.
        Without it (between rounds: arrivals and freed devices, a few devices at a time) only
        the greedy rule: the program costs tens of milliseconds a decision at 1,000 GPUs."""
        budget = {t: free.free_milli(t) for t in free.model.device_types}
        if not program:
            return self.match_greedy(jobs, keys, budget, lease_s)
        capacity = sum(budget.values())
        admitted, asked = [], 0
        for job in jobs:
            if math.isfinite(keys[job.job_id]) and asked + job.request.gpu_milli <= capacity:
                admitted.append(job)
                asked += job.request.gpu_milli
        granted: dict[str, str] = self._solve_assignment(admitted, keys, budget, lease_s) if admitted else {}
        for jid, t in granted.items():
            budget[t] -= next(j for j in admitted if j.job_id == jid).request.gpu_milli
        rest = [j for j in jobs if j.job_id not in granted]
        for job, types in self.match_greedy(rest, keys, budget, lease_s):
            granted[job.job_id] = types[0]
        return [(j, [granted[j.job_id]] + [t for t in _by_speed(j) if t != granted[j.job_id]])
                for j in jobs if j.job_id in granted]

    def _solve_assignment(self, jobs: Sequence[JobInfo], keys: Mapping[str, float],
                          budget: Mapping[str, int], lease_s: float) -> dict[str, str]:
        """The assignment program of :meth:`match_types`; job id -> type for the integral
        answers that fit (an empty answer if HiGHS finds none)."""
        types = list(budget)
        n, t = len(jobs), len(types)
        need = np.array([j.request.gpu_milli for j in jobs], dtype=float)
        speed = np.array([[self.speed(j, k, lease_s) for k in types] for j in jobs])
        urgency = 1.0 / np.maximum(np.array([keys[j.job_id] for j in jobs]), 1e-9) ** self.urgency_power
        cost = -(speed * (need / WHOLE * urgency)[:, None]).ravel()
        x = _solve_lp(cost, need, np.array([float(budget[k]) for k in types]), (speed.ravel() > 0).astype(float))
        if x is None:
            return {}
        x = x.reshape(n, t)
        left = dict(budget)
        out: dict[str, str] = {}
        for i, job in enumerate(jobs):
            k = int(np.argmax(x[i]))
            if x[i, k] > 0.5 and left[types[k]] >= need[i]:
                left[types[k]] -= int(need[i])
                out[job.job_id] = types[k]
        return out

    def match_greedy(self, jobs: Sequence[JobInfo], keys: Mapping[str, float], budget: Mapping[str, int],
                     lease_s: float) -> list[tuple[JobInfo, list[str]]]:
        """c-mu matching: every (job, type) pair is worth relative speed / area; pairs are
        granted best first while devices of the type last (ties: the larger comparative
        advantage first). Returns (job, [granted type, ...]) in ``jobs``' order."""
        budget = dict(budget)
        pairs: list[tuple[float, float, int, str]] = []
        for i, job in enumerate(jobs):
            area = keys[job.job_id]
            speeds = [(self.speed(job, t, lease_s), t) for t in job.ideal_rates]
            if not speeds:
                continue
            ranked = sorted(speeds, reverse=True)
            first = ranked[0][0]
            second = ranked[1][0] if len(ranked) > 1 else 0.0
            for speed, t in speeds:
                value = speed / max(area, 1e-9) if math.isfinite(area) else 0.0
                # On equal value, the pair with the larger comparative advantage goes first.
                advantage = speed - (second if speed == first and t == ranked[0][1] else first)
                pairs.append((-value, -advantage, i, t))
        pairs.sort()
        granted: dict[int, str] = {}
        for _, _, i, t in pairs:
            need = jobs[i].request.gpu_milli
            if i in granted or budget.get(t, 0) < need:
                continue
            budget[t] -= need
            granted[i] = t
        return [(jobs[i], [granted[i]] + [t for t in _by_speed(jobs[i]) if t != granted[i]])
                for i in sorted(granted)]

    # -- the decision -------------------------------------------------------------------------

    def _head(self, jobs: list[JobInfo], free: FreeCapacity) -> tuple[dict[str, float], list[JobInfo]]:
        """Priorities, ``jobs`` sorted by them (in place), and the head of the queue.

        Only the head can win devices; looking at CANDIDATE_FACTOR x the free capacity of it
        keeps a decision cheap when thousands wait. Open-ended jobs (infinite area) are worth
        nothing per unit of progress here: they are left to the backfill, in arrival order."""
        keys = {j.job_id: self.priority(j) for j in jobs}
        jobs.sort(key=lambda j: (keys[j.job_id], j.arrival_s))
        limit = CANDIDATE_FACTOR * free.total_free_milli()
        head, asked = [], 0
        for j in jobs:
            if (asked > limit and head) or math.isinf(keys[j.job_id]):
                break
            head.append(j)
            asked += j.request.gpu_milli
        return keys, head

    def schedule(self, view: ClusterView) -> dict[str, Assignment]:
        jobs = [j for j in view.unpinned() if j.best_rate > 0]
        if not jobs:
            return {}
        if self.elastic and any(len(sizes_of(j)) > 1 for j in jobs):
            return self._elastic(view, jobs)
        keys, head = self._head(jobs, view.free)
        free = view.free
        matched = self.match_types(head, keys, free, view.lease_s, view.round_boundary)
        taken = {j.job_id for j, _ in matched}
        rest = [(j, prefer_current(j, _by_speed(j))) for j in jobs if j.job_id not in taken]
        # Place bigger gangs first (they fit in fewer places), then by priority: the chosen set
        # is already fixed, so the order only decides how tightly it packs.
        matched.sort(key=lambda jt: -jt[0].request.gpu_milli)
        return keep_or_place(view, matched, self._placer_for(view), rest, self._acceptor(view))

    # -- elastic jobs ------------------------------------------------------------------------

    def _elastic(self, view: ClusterView, jobs: list[JobInfo]) -> dict[str, Assignment]:
        """The decision with elastic jobs in view (see the module docstring)."""
        keys, head = self._head(jobs, view.free)
        free = view.free
        # Elastic jobs ask for their base size (more only with eager_growth); one that does not
        # fit then takes a smaller size below.
        capacity = max(view.model.total_devices, 1)
        head = [self._ask(j, len(jobs) - 1 - i, capacity) if len(sizes_of(j)) > 1 else j for i, j in enumerate(head)]
        chosen = self.match_types(head, keys, free, view.lease_s, view.round_boundary)
        budget = {t: free.free_milli(t) for t in free.model.device_types}
        for j, types in chosen:
            budget[types[0]] -= j.request.gpu_milli
        target = {j.job_id: j.request.num_gpus for j, _ in chosen}
        taken = set(target)
        # 1. Elastic jobs that did not fit at the size they asked for start smaller, in priority order.
        for j in head:
            if j.job_id in taken or len(sizes_of(j)) == 1:
                continue
            for n in sorted((n for n in sizes_of(j) if n < j.request.num_gpus), reverse=True):
                rates = j.rates_at(n)  # type: ignore[attr-defined]
                need = n * j.request.milli
                types = sorted((t for t in rates if budget[t] >= need), key=lambda t: -rates[t])
                if types:
                    budget[types[0]] -= need
                    target[j.job_id] = n
                    taken.add(j.job_id)
                    chosen.append((j, types + [t for t in sorted(rates, key=lambda t: -rates[t]) if t not in types]))
                    break
        chosen.sort(key=lambda jt: (keys[jt[0].job_id], jt[0].arrival_s))
        elastic = [(_base(j), types[0]) for j, types in chosen if len(sizes_of(j)) > 1]
        # 2. Running jobs keep a larger size they have, where the idle devices allow (no resize).
        for j, t in elastic:
            cur = j.assignment
            if cur is None or cur.device_type != t or len(cur.slots) <= target[j.job_id]:
                continue
            for n in sorted((n for n in sizes_of(j) if target[j.job_id] < n <= len(cur.slots)), reverse=True):
                extra = (n - target[j.job_id]) * j.request.milli
                if budget[t] >= extra:
                    budget[t] -= extra
                    target[j.job_id] = n
                    break
        # 3. Grow into what is still idle, shortest area first.
        waiting = any(j.job_id not in taken and j.assignment is None for j in jobs)
        for j, t in elastic:
            now_n = target[j.job_id]
            for n in sorted((n for n in sizes_of(j) if n > now_n), reverse=True):
                extra = (n - now_n) * j.request.milli
                if budget[t] >= extra and self._worth_growing(j, now_n, n, t, waiting):
                    budget[t] -= extra
                    target[j.job_id] = n
                    break
        sized = []
        for j, types in chosen:
            if len(sizes_of(j)) > 1:
                j = _AtSize(_base(j), target[j.job_id])
                types = [t for t in types if t in j.ideal_rates]
            sized.append((j, types))
        rest = [(_AtSize(j, j.request.num_gpus) if j.assignment is not None and len(sizes_of(j)) > 1 else j,
                 prefer_current(j, _by_speed(j))) for j in jobs if j.job_id not in taken]
        sized.sort(key=lambda jt: -jt[0].request.gpu_milli)
        placer, accept = self._placer_for(view), self._acceptor(view)
        out = keep_or_place(view, sized, placer, rest, accept)
        # A gang that found no placement (counting ignores fragmentation): smaller sizes.
        missing = [(j, types) for j, types in sized if j.job_id not in out and isinstance(j, _AtSize)]
        if missing:
            scratch = view.scratch()
            for a in out.values():
                scratch.take(a)
            for j, types in missing:
                for n in sorted((n for n in sizes_of(j) if n < j.size), reverse=True):
                    smaller = _AtSize(j._job, n)
                    a = _place(scratch, smaller, [t for t in types if t in smaller.ideal_rates], placer, accept)
                    if a is not None:
                        scratch.take(a)
                        out[j.job_id] = a
                        break
        return out

    def _ask(self, job: JobInfo, behind: int, capacity: int) -> "_AtSize":
        """The size an elastic job asks for first: its base (the size it runs at, else its
        declared one). With ``eager_growth``: the largest of its sizes above the base whose time
        saved for this job exceeds what it
        costs the ``behind`` jobs after it in the order - each waits about (extra device-seconds
        the larger gang spends) / ``capacity`` longer when the scaling is sub-linear - plus,
        for a running job, ``1 + hysteresis`` restores. Else its base size."""
        cur = job.assignment
        base = len(cur.slots) if cur is not None else job.request.num_gpus
        if not self.eager_growth:
            return _AtSize(job, base)
        rates = job.rates_at  # type: ignore[attr-defined]
        r0 = max(rates(base).values(), default=0.0)
        remaining = job.remaining_work
        restart = (1 + self.hysteresis) * job.restore_s if cur is not None else 0.0
        if r0 > 0 and math.isfinite(remaining):
            for n in sorted((n for n in sizes_of(job) if n > base), reverse=True):
                r1 = max(rates(n).values(), default=0.0)
                if r1 <= r0:
                    continue
                saved = remaining / r0 - remaining / r1
                extra_area = n * remaining / r1 - base * remaining / r0
                if saved > restart + behind * max(0.0, extra_area) / capacity:
                    return _AtSize(job, n)
        return _AtSize(job, base)

    def _worth_growing(self, job: JobInfo, n_from: int, n_to: int, t: str,
                       waiting: bool = False) -> bool:
        """Growing pays when it saves more time than it costs: a running job that would keep
        its size otherwise must save ``1 + hysteresis`` restores (the restart, and a margin
        for being shrunk again); a job that starts or restarts anyway pays nothing extra. While
        jobs ``waiting``, the devices added must also keep ``growth_efficiency`` of the speed
        per device (rate ratio over size ratio)."""
        rates = job.rates_at  # type: ignore[attr-defined]
        r_from, r_to = rates(n_from).get(t, 0.0), rates(n_to).get(t, 0.0)
        if r_to <= r_from or r_from <= 0:
            return False
        if waiting and (r_to / r_from) / (n_to / n_from) < self.growth_efficiency:
            return False
        remaining = job.remaining_work
        saved = remaining / r_from - remaining / r_to
        cur = job.assignment
        keeps = cur is not None and cur.device_type == t and len(cur.slots) == n_from
        return saved > ((1 + self.hysteresis) * job.restore_s if keeps else 0.0)

    def _acceptor(self, view: ClusterView) -> Callable[[JobInfo, Assignment], bool] | None:
        """Refuse placements whose links cost more than ``1 - min_efficiency`` of the job's
        speed on that type (a gang split over a slow network): another type, or wait."""
        rate_of = view.rate_of
        floor = self.min_efficiency
        if rate_of is None or floor <= 0:
            return None

        def accept(job: JobInfo, a: Assignment) -> bool:
            if len(a.slots) <= 1:
                return True
            return rate_of(job, a) >= floor * job.ideal_rates[a.device_type]

        return accept

    def _placer_for(self, view: ClusterView) -> Placer:
        """Fragmentation-aware placement once shared-GPU or host-bound requests are in the mix."""
        shared = any(milli < WHOLE or n == 0 for n, milli in view.demand_mix)
        with_mix = getattr(self.placer, "with_mix", None)
        if not shared or with_mix is None:
            return self.placer
        return with_mix(view.demand_mix, view.demand_host)


def _solve_lp(cost: np.ndarray, need: np.ndarray, budget: np.ndarray, upper: np.ndarray) -> np.ndarray | None:
    """The assignment program's LP: minimise ``cost . x`` over x[j, k] in [0, upper[j, k]] with
    sum_k x[j, k] <= 1 per job and sum_j need[j] x[j, k] <= budget[k] per type; None when HiGHS
    finds no optimum. HiGHS called directly (highspy; the program runs at every round boundary
    and SciPy's ``linprog`` front end took 4x the solve itself); ``linprog`` when highspy is absent.
    Both run HiGHS on the same LP."""
    n, t = len(need), len(budget)
    # column j*t + k has two entries: row j (1) and row n + k (need[j])
    index = np.empty(2 * n * t, dtype=np.int32)
    index[0::2] = np.repeat(np.arange(n), t)
    index[1::2] = n + np.tile(np.arange(t), n)
    value = np.empty(2 * n * t)
    value[0::2] = 1.0
    value[1::2] = np.repeat(need, t)
    row_upper = np.concatenate([np.ones(n), budget])
    try:
        from highspy import _core as highs  # the plain solver object: no banner, no callbacks
    except ImportError:  # pragma: no cover - highspy comes with cvxpy, a dependency
        from scipy.optimize import linprog
        from scipy.sparse import csc_matrix

        a = csc_matrix((value, index, np.arange(0, 2 * n * t + 1, 2)), shape=(n + t, n * t))
        res = linprog(cost, A_ub=a, b_ub=row_upper, bounds=np.column_stack([np.zeros(n * t), upper]),
                      method="highs")
        return res.x if res.status == 0 else None
    solver = highs._Highs()
    solver.setOptionValue("output_flag", False)
    lp = highs.HighsLp()
    lp.num_col_, lp.num_row_ = n * t, n + t
    lp.col_cost_, lp.col_lower_, lp.col_upper_ = cost, np.zeros(n * t), upper
    lp.row_lower_, lp.row_upper_ = np.full(n + t, -highs.kHighsInf), row_upper
    lp.a_matrix_.format_ = highs.MatrixFormat.kColwise
    lp.a_matrix_.start_ = np.arange(0, 2 * n * t + 1, 2, dtype=np.int32)
    lp.a_matrix_.index_ = index
    lp.a_matrix_.value_ = value
    solver.passModel(lp)
    solver.run()
    if solver.getModelStatus() != highs.HighsModelStatus.kOptimal:
        return None
    return np.array(solver.getSolution().col_value)
