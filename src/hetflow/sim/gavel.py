"""Gavel's simulation protocol, rule for rule, and its reference policies under their own names.

    run = simulate_gavel(load_gavel_jobs(trace, throughputs), "max_min_fairness_perf", seed=3)
    run.jct_s        # per job (None: Gavel drops a job after 5 failed micro-tasks)

What Gavel's simulator (stanford-futuredata/gavel, ``scheduler/scheduler.py`` at c4fa400) does,
and this module re-states (docs/simulator.md, "The Gavel protocol"):

- **Workers**: ``{'v100': 36, 'p100': 36, 'k80': 36}`` by default, one GPU per server, so where
  a job lands inside a type never changes its speed. A job runs on ``scale_factor`` workers of
  one type at the measured isolated (consolidated) throughput of ``(job_type, scale_factor)``.
- **Rounds**: at each round the scheduler picks jobs; each runs a micro-task of
  ``min(int(throughput x 360), remaining)`` steps and ends at ``start + steps / throughput``.
  The round ends when its last micro-task ends; arrivals up to that time are added then. If
  nothing runs, time jumps to the next arrival.
- **Allocation**: the policy's fractional allocation (job x worker type) is recomputed only
  when jobs arrived or left *and* at least 1,920 s passed since the last recomputation (or none
  happened yet), after every job's time on each type is folded into its deficit and reset to
  half a round. A job added since then has no allocation: it has priority 0 and, if the greedy
  pass picks it, holds its workers idle for the round (what Gavel does).
- **Priorities**: per worker type, allocation / (job's share of that type's time so far), or
  allocation x 1e9 before any time; the per-type lists, each sorted by (priority, deficit,
  allocation) descending, are concatenated in the order v100, p100, k80 (shuffled every round
  with ``random.Random(seed + 5)`` for heterogeneity-agnostic policies) and filled greedily: a
  job goes to the first list where its gang fits and its throughput is not 0.
- **Failed micro-tasks**: a gang's steps are split ``steps // n`` to each worker but the last;
  a worker with 0 steps fails the micro-task (no progress); five failures in a row drop the job
  without a completion time (Gavel's MAX_FAILED_ATTEMPTS).
- **JCT** = end of the job's last micro-task - its arrival.

Policies (Gavel's names): ``fifo`` (agnostic, random worker type, with Gavel's quirk that the
type actually taken is the last available one), ``fifo_perf``, ``max_min_fairness`` (LAS,
agnostic: all throughputs 1), ``max_min_fairness_perf`` (LAS with heterogeneity),
``finish_time_fairness_perf`` (FTF) - the same cvxpy programs Gavel builds, solved with ECOS
(CLARABEL when ECOS raises, as the calibration runs did) - and ``hetflow``, this project's
policy: the class the live controller runs (``HetflowPolicy``), answering the same mechanism
through an adapter (:mod:`hetflow.sim.live_gavel`), not an algorithm of its own.
"""

from __future__ import annotations

import ast
import csv
import json
import random
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Mapping, Sequence

import numpy as np

from hetflow.core.errors import InputError
from hetflow.sim.mechanism import jct_summary, run_rounds
from hetflow.sim.textio import read_text

WORKER_TYPES = ("v100", "p100", "k80")  # Gavel's fixed order for the per-type priority lists
DEFAULT_CLUSTER = {"v100": 36, "p100": 36, "k80": 36}
ROUND_S = 360.0
RESET_INTERVAL_S = 1920.0  # Gavel's minimum_time_between_allocation_resets
MAX_FAILED_ATTEMPTS = 5


@dataclass(frozen=True)
class GavelJob:
    job_id: int  # 0-based line of the trace
    job_type: str
    scale_factor: int
    total_steps: int
    arrival_s: float
    thr: Mapping[str, float]  # steps/s of the whole gang on each worker type (0: cannot run)
    priority_weight: float = 1.0


# ----------------------------------------------------------------------------------- inputs


def load_throughput_table(path: str | Path) -> dict[tuple[str, int], dict[str, float]]:
    """``{(job_type, scale_factor): {worker_type: steps/s}}`` from Gavel's
    ``simulation_throughputs.json`` (its ``"null"`` entries: the job alone, consolidated) or a
    CSV ``job_type,scale_factor,<type>_steps_per_s,...`` (the calibration folder's layout)."""
    p = Path(path)
    if not p.is_file():
        raise InputError(f"{p}: no such throughput file (Gavel's simulation_throughputs.json or a CSV)")
    text = read_text(p, errors="replace")
    table: dict[tuple[str, int], dict[str, float]] = {}
    if text.lstrip().startswith("{"):
        data = json.loads(text)
        for wt, by_key in data.items():
            if "_" in wt:  # v100_unconsolidated etc.: not used by the protocol
                continue
            for key_text, entry in by_key.items():
                job_type, sf = ast.literal_eval(key_text)
                table.setdefault((job_type, int(sf)), {})[wt] = float(entry["null"])
        return table
    rows = list(csv.DictReader(text.splitlines()))
    if not rows or not {"job_type", "scale_factor"} <= set(rows[0]):
        raise InputError(f"{p}: expected columns job_type,scale_factor,<type>_steps_per_s")
    for n, row in enumerate(rows, start=2):
        try:
            key = (row["job_type"], int(row["scale_factor"]))
            table[key] = {c[: -len("_steps_per_s")]: float(v) for c, v in row.items() if c.endswith("_steps_per_s")}
        except (TypeError, ValueError):
            raise InputError(f"{p}:{n}: scale_factor and steps/s must be numbers") from None
    return table


def load_gavel_jobs(trace: str | Path, throughputs: str | Path | Mapping) -> list[GavelJob]:
    """A Gavel ``.trace`` (10 or 7 columns) with its throughput table -> jobs in arrival order."""
    from hetflow.sim.traces import load_gavel_trace

    table = throughputs if isinstance(throughputs, Mapping) else load_throughput_table(throughputs)
    jobs = []
    for j in load_gavel_trace(trace).jobs:
        key = (j.job_type, j.num_gpus)
        if key not in table:
            raise InputError(f"{trace}: job {j.job_id} is {j.job_type} x{j.num_gpus}, which the throughput table "
                             f"lacks; give the table the trace was made with")
        jobs.append(GavelJob(int(j.job_id), j.job_type, j.num_gpus, int(j.total_work), j.arrival_s,
                             dict(table[key]), j.weight))
    jobs.sort(key=lambda g: (g.arrival_s, g.job_id))
    return jobs


# --------------------------------------------------------------------------------- policies


class RoundPolicy:
    """What the mechanism asks each round. Reference policies answer through Gavel's
    allocation + priority machinery (``allocation``); others may pick jobs directly
    (``pick`` returns ``{worker_type: [job ids]}`` or None to use the machinery)."""

    name = "base"
    agnostic = False  # Gavel shuffles the worker-type order for heterogeneity-agnostic policies
    fifo = False  # FIFO policies skip jobs of priority 0

    def allocation(self, state: "AllocationState") -> dict[int, dict[str, float]]:
        raise NotImplementedError

    def pick(self, sim: "GavelSimulator") -> dict[str, list[int]] | None:
        return None


@dataclass
class AllocationState:
    job_ids: list[int]  # sorted
    throughputs: dict[int, dict[str, float]]
    scale_factors: dict[int, int]
    priority_weights: dict[int, float]
    steps_remaining: dict[int, int]
    times_since_start: dict[int, float]
    cluster: dict[str, int]


def _solve(problem) -> None:
    """ECOS, as Gavel; CLARABEL for a solve where ECOS raises (the calibration's fallback)."""
    import cvxpy as cp

    try:
        problem.solve(solver="ECOS")
    except cp.error.SolverError:
        problem.solve(solver="CLARABEL")


def _flatten(state: AllocationState, thr: Mapping[int, Mapping[str, float]]) -> tuple[np.ndarray, list[str]]:
    types = sorted(state.cluster)  # Gavel: sorted worker types as columns, job ids as rows
    return np.array([[thr[j][w] for w in types] for j in state.job_ids]), types


def _scale_array(state: AllocationState, m: int, n: int) -> np.ndarray:
    a = np.zeros((m, n))
    for i, j in enumerate(state.job_ids):
        a[i, :] = state.scale_factors[j]
    return a


def _base_constraints(x, scale, num_workers):
    import cvxpy as cp

    return [x >= 0, cp.sum(cp.multiply(scale, x), axis=0) <= num_workers, cp.sum(x, axis=1) <= 1]


def _unflatten(x: np.ndarray, state: AllocationState, types: list[str]) -> dict[int, dict[str, float]]:
    x = x.clip(min=0.0).clip(max=1.0)
    return {j: {w: x[i][k] for k, w in enumerate(types)} for i, j in enumerate(state.job_ids)}


class MaxMinFairnessPerf(RoundPolicy):
    """Gavel's ``max_min_fairness_perf`` (its heterogeneity-aware LAS): maximise the smallest
    throughput-normalised share (throughput x scale factor / equal-split throughput / weight)."""

    name = "max_min_fairness_perf"

    def _throughputs(self, state: AllocationState) -> Mapping[int, Mapping[str, float]]:
        return state.throughputs

    def allocation(self, state: AllocationState) -> dict[int, dict[str, float]]:
        import cvxpy as cp

        if not state.job_ids:
            return {}
        thr, types = _flatten(state, self._throughputs(state))
        m, n = thr.shape
        scale = _scale_array(state, m, n)
        weights = np.array([1.0 / state.priority_weights[j] for j in state.job_ids])
        # equal split: every job 1/len(types)... of each type, as Gavel's ProportionalPolicy
        x_prop = np.array([[state.cluster[w] / m for w in types] for _ in range(m)])
        x_prop = x_prop / np.sum(x_prop, axis=1).max()
        prop = np.sum(np.multiply(thr, x_prop), axis=1).reshape((m, 1))
        weights = np.multiply(weights.reshape((m, 1)), 1.0 / prop.reshape((m, 1)))
        x = cp.Variable(thr.shape)
        objective = cp.Maximize(cp.min(cp.sum(cp.multiply(
            np.multiply(thr * weights.reshape((m, 1)), scale), x), axis=1)))
        num_workers = [state.cluster[w] for w in types]
        problem = cp.Problem(objective, _base_constraints(x, scale, num_workers))
        _solve(problem)
        return _unflatten(x.value, state, types)


class MaxMinFairness(MaxMinFairnessPerf):
    """Gavel's ``max_min_fairness`` (agnostic LAS): the same program with every throughput 1."""

    name = "max_min_fairness"
    agnostic = True

    def _throughputs(self, state: AllocationState) -> Mapping[int, Mapping[str, float]]:
        return {j: {w: 1.0 for w in state.throughputs[j]} for j in state.job_ids}


class FinishTimeFairnessPerf(RoundPolicy):
    """Gavel's ``finish_time_fairness_perf`` (Themis' rho with heterogeneity): minimise the
    largest (time so far + remaining / allocated throughput) / (isolated time), where the
    isolated time accumulates progress at the job's equal-split throughput."""

    name = "finish_time_fairness_perf"

    def __init__(self) -> None:
        self._cumulative_isolated: dict[int, float] = {}
        self._prev_remaining: dict[int, int] = {}
        self._prev_isolated: dict[int, float] = {}

    def allocation(self, state: AllocationState) -> dict[int, dict[str, float]]:
        import cvxpy as cp

        if not state.job_ids:
            self._prev_remaining, self._prev_isolated = {}, {}
            return {}
        thr, types = _flatten(state, state.throughputs)
        m, n = thr.shape
        scale = _scale_array(state, m, n)
        x = cp.Variable(thr.shape)
        x_iso = np.array([[state.cluster[w] / m for w in types] for _ in range(m)]) / scale
        row = np.maximum(np.sum(x_iso, axis=1), np.ones(m))
        x_iso = x_iso / row[:, None]
        isolated = np.sum(np.multiply(thr, x_iso), axis=1).reshape((m, 1))
        t_isolated, since, remaining = np.empty(m), np.empty(m), np.empty(m)
        for i, j in enumerate(state.job_ids):
            self._cumulative_isolated.setdefault(j, 0)
            if j in self._prev_remaining:
                self._cumulative_isolated[j] += (
                    (self._prev_remaining[j] - state.steps_remaining[j]) / self._prev_isolated[j])
            t_isolated[i] = self._cumulative_isolated[j] + state.steps_remaining[j] / isolated[i, 0]
            since[i], remaining[i] = state.times_since_start[j], state.steps_remaining[j]
        # Gavel's objective - the largest (time so far + remaining / allocated throughput) /
        # isolated time - as one vector expression: m scalar ones cost cvxpy's compilation (not
        # the solver) 80 % of a run
        alloc_thr = cp.sum(cp.multiply(thr, x), axis=1)
        fractions = cp.multiply(cp.multiply(remaining, cp.inv_pos(alloc_thr)) + since, 1.0 / t_isolated)
        objective = cp.Minimize(cp.max(fractions))
        num_workers = [state.cluster[w] for w in types]
        problem = cp.Problem(objective, _base_constraints(x, scale, num_workers))
        _solve(problem)
        self._prev_remaining = dict(state.steps_remaining)
        self._prev_isolated = {j: float(isolated[i, 0]) for i, j in enumerate(state.job_ids)}
        if x.value is None:  # Gavel falls back to the isolated (equal split) allocation
            return _unflatten(x_iso, state, types)
        return _unflatten(x.value, state, types)


class Fifo(RoundPolicy):
    """Gavel's FIFO. ``perf``: each job in arrival order takes the fastest worker type with room
    (allocation recomputed from scratch). Agnostic (``fifo``): a job keeps its type; a waiting
    job takes a freed type or a random index among types with room - where Gavel then uses the
    last available type whatever the index drew (its ``worker_type`` variable is stale), and
    removes the drawn index from the available list when that type fills. Reproduced as is."""

    fifo = True

    def __init__(self, perf: bool, seed: int | None = None) -> None:
        self.perf = perf
        self.name = "fifo_perf" if perf else "fifo"
        self.agnostic = not perf
        self._rng = random.Random()
        if seed is not None:
            self._rng.seed(seed)
        self._alloc: dict[int, str] = {}

    def allocation(self, state: AllocationState) -> dict[int, dict[str, float]]:
        available = dict(state.cluster)
        thr = state.throughputs
        sf = state.scale_factors
        if self.perf:
            self._alloc = {}
        queue = [j for j in state.job_ids if j not in self._alloc]
        for j in sorted(self._alloc):
            wt = self._alloc[j]
            if j not in thr:  # finished: the head of the queue may take its type
                if queue:
                    head = queue[0]
                    if sf[head] <= available[wt] and thr[head][wt] > 0.0:
                        queue.pop(0)
                        self._alloc[head] = wt
                        available[wt] -= sf[head]
                del self._alloc[j]
            else:
                available[wt] -= sf[j]
        avail_types = sorted(w for w in available if available[w] > 0)
        wt = avail_types[-1] if avail_types else None
        while queue and avail_types:
            j = queue.pop(0)
            fitting, mapping = [], []
            for i, w in enumerate(avail_types):
                wt = w  # Gavel's loop variable, used below in agnostic mode
                if available[w] >= sf[j]:
                    fitting.append(w)
                    mapping.append(i)
            if not fitting:
                break
            if not self.perf:
                idx = self._rng.randrange(len(fitting))
            else:
                best = -1.0
                for i, w in enumerate(fitting):
                    if thr[j][w] > best:
                        best, wt, idx = thr[j][w], w, i
            if thr[j][wt] > 0.0:
                self._alloc[j] = wt
                available[wt] -= sf[j]
                if available[wt] == 0:
                    avail_types.pop(mapping[idx])
        out = {j: {w: 0.0 for w in state.cluster} for j in state.job_ids}
        for j, w in self._alloc.items():
            out[j][w] = 1.0
        return out


# -------------------------------------------------------------------------------- mechanism


@dataclass
class GavelRun:
    policy: str
    jobs: list[GavelJob]
    completion_s: dict[int, float | None]  # job id -> end of last micro-task (None: dropped)
    rounds: int
    wall_s: float
    busy_s: float  # worker-seconds of micro-tasks
    end_s: float
    num_workers: int
    type_time: dict[int, dict[str, float]] = field(default_factory=dict)  # job -> seconds per type

    def jct_s(self, job_id: int) -> float | None:
        c = self.completion_s.get(job_id)
        return None if c is None else c - self.by_id[job_id].arrival_s

    @property
    def by_id(self) -> dict[int, GavelJob]:
        return {j.job_id: j for j in self.jobs}

    def summary(self, window: tuple[int, int] | None = None) -> dict[str, float | int | None]:
        by = self.by_id
        ids = [j for j in sorted(by) if window is None or window[0] <= j < window[1]]
        jcts = [self.completion_s[j] - by[j].arrival_s for j in ids if self.completion_s.get(j) is not None]
        done = [c for c in self.completion_s.values() if c is not None]
        return {
            **jct_summary(jcts),
            "makespan_s": max(done) if done else None,
            "jobs": len(ids),
            "dropped": sum(1 for j in ids if j in self.completion_s and self.completion_s[j] is None),
            "unfinished": sum(1 for j in ids if j not in self.completion_s),
            "utilisation": self.busy_s / (self.num_workers * self.end_s) if self.end_s > 0 else None,
            "rounds": self.rounds,
            "wall_s": self.wall_s,
        }


class GavelSimulator:
    """One run of ``policy`` on ``jobs`` under Gavel's round mechanism (module docstring)."""

    def __init__(self, jobs: Sequence[GavelJob], policy: RoundPolicy, cluster: Mapping[str, int] | None = None,
                 seed: int = 0, round_s: float = ROUND_S, reset_interval_s: float = RESET_INTERVAL_S,
                 progress: Callable[[int, int], None] | None = None) -> None:
        self.jobs = sorted(jobs, key=lambda g: (g.arrival_s, g.job_id))
        self.by_id = {j.job_id: j for j in self.jobs}
        self.policy = policy
        self.cluster = dict(cluster or DEFAULT_CLUSTER)
        for j in self.jobs:
            if not any(j.thr.get(w, 0.0) > 0 and j.scale_factor <= c for w, c in self.cluster.items()):
                raise InputError(f"job {j.job_id} ({j.job_type} x{j.scale_factor}) can run on no worker type of "
                                 f"the cluster {self.cluster}")
        self.types = [w for w in WORKER_TYPES if w in self.cluster] + sorted(
            w for w in self.cluster if w not in WORKER_TYPES)
        self.round_s = round_s
        self.reset_interval_s = reset_interval_s
        self.shuffler = random.Random()
        self.shuffler.seed(seed + 5)
        self.progress = progress
        # scheduler state, named after Gavel's
        self.active: dict[int, GavelJob] = {}  # insertion (= add) order
        self.steps_run: dict[int, int] = {}
        self.failures: dict[int, int] = {}
        self.job_time: dict[int, dict[str, float]] = {}
        self.worker_time = {w: 0.0 for w in self.cluster}
        self.priorities: dict[str, dict[int, float]] = {w: {} for w in self.cluster}
        self.deficits: dict[str, dict[int, float]] = {w: {} for w in self.cluster}
        self.allocation: dict[int, dict[str, float]] = {}
        self.last_reset = 0.0
        self.need_update = False
        self.completion: dict[int, float | None] = {}
        self.latest: dict[int, float] = {}
        self.type_time: dict[int, dict[str, float]] = {}
        self.current: dict[int, str] = {}  # job -> worker type of the round now running
        self.busy_s = 0.0
        # the round loop's state (the round rules below; ``run`` drives them)
        self._queued = list(self.jobs)  # by arrival; self._qi: the next to arrive
        self._qi = 0
        self._running: list[tuple[float, int, str, int]] = []  # (finish, job, type, steps)
        self._round_start, self._round_end = 0.0, None
        self._had_running, self._idle_spins = False, 0
        self.now = self._queued[0].arrival_s if self._queued else 0.0

    def remaining(self, j: int) -> int:
        return self.active[j].total_steps - self.steps_run[j]

    # -- Gavel's bookkeeping ----------------------------------------------------------------

    def _add(self, job: GavelJob) -> None:
        j = job.job_id
        self.active[j] = job
        self.steps_run[j] = 0
        self.failures[j] = 0
        self.job_time[j] = {w: self.round_s / 2.0 for w in self.cluster}
        self.type_time[j] = {}
        for w in self.cluster:
            self.priorities[w][j] = 0.0
            self.deficits[w][j] = 0.0
        self.need_update = True

    def _remove(self, j: int, completed: bool) -> None:
        self.completion[j] = self.latest[j] if completed else None
        del self.active[j], self.steps_run[j], self.failures[j], self.job_time[j]
        for w in self.cluster:
            del self.priorities[w][j], self.deficits[w][j]
        self.need_update = True
        if self.progress:
            self.progress(len(self.completion), len(self.jobs))

    def _reset_time_so_far(self) -> None:
        elapsed = self.now - self.last_reset
        for w in self.cluster:
            self.worker_time[w] = 0.0
            for j, times in self.job_time.items():
                received = times[w] - self.round_s / 2.0
                should = self.allocation[j][w] * elapsed if j in self.allocation else 0
                self.deficits[w][j] = self.deficits[w].get(j, 0.0) + (should - received)
                times[w] = self.round_s / 2.0
                self.worker_time[w] += times[w]
        self.last_reset = self.now

    def _update_priorities(self) -> None:
        since = self.now - self.last_reset
        if self.need_update and (since >= self.reset_interval_s or self.last_reset == 0):
            self._reset_time_so_far()
            self.allocation = self._compute_allocation()
            self.need_update = False
        for w in self.cluster:
            total = self.worker_time[w]
            pri = self.priorities[w]
            for j in pri:
                alloc = self.allocation.get(j)
                if alloc is None:
                    pri[j] = 0.0
                    continue
                a = alloc[w]
                if a == 0.0:
                    p = 0.0
                elif self.active[j].thr.get(w, 0.0) == 0:
                    p = 0
                else:
                    frac = 0.0 if total == 0.0 else self.job_time[j][w] / total
                    p = a / frac if frac > 0.0 else a * 1e9
                pri[j] = p

    def _compute_allocation(self) -> dict[int, dict[str, float]]:
        ids = sorted(self.active)
        state = AllocationState(
            ids, {j: {w: self.active[j].thr.get(w, 0.0) for w in self.cluster} for j in ids},
            {j: self.active[j].scale_factor for j in ids}, {j: self.active[j].priority_weight for j in ids},
            {j: self.remaining(j) for j in ids}, {j: self.now - self.active[j].arrival_s for j in ids},
            dict(self.cluster))
        return self.policy.allocation(state) or {}

    def _schedule(self) -> dict[str, list[int]]:
        """Gavel's ``_schedule_jobs_on_workers``: jobs per worker type for the next round."""
        direct = self.policy.pick(self)
        if direct is not None:
            return direct
        self._update_priorities()
        types = list(self.types)
        if self.policy.agnostic:
            self.shuffler.shuffle(types)
        queue = []
        for w in types:
            entries = [(j, w, p, self.deficits[w][j], self.allocation[j][w] if j in self.allocation else 0.0)
                       for j, p in self.priorities[w].items()]
            queue += sorted(entries, key=lambda e: (e[2], e[3], e[4]), reverse=True)
        left = dict(self.cluster)
        taken: set[int] = set()
        chosen: dict[str, list[int]] = {w: [] for w in types}
        for j, w, p, *_ in queue:
            if left[w] == 0 or j in taken:
                continue
            job = self.active[j]
            if job.thr.get(w, 0.0) <= 0:
                continue
            if self.policy.fifo and p <= 0.0:
                continue
            if job.scale_factor > left[w]:
                continue
            left[w] -= job.scale_factor
            taken.add(j)
            if j in self.allocation:  # Gavel reserves the workers of a job without allocation, idle
                chosen[w].append(j)
        return chosen

    # -- the round rules (Gavel's simulate; hetflow.sim.mechanism.run_rounds drives them) ------

    def finished(self) -> bool:
        return len(self.completion) >= len(self.jobs)

    def end_round(self) -> bool:
        """The round ends when its last micro-task does (or, with nothing running, at the next
        arrival); each micro-task's steps count for its job. False after a few rounds with
        nothing running and nothing left to arrive (Gavel's own loop would spin forever)."""
        if self._idle_spins > 3:
            return False
        next_arrival = self._queued[self._qi].arrival_s if self._qi < len(self._queued) else None
        if next_arrival is None and not self._running:
            self.last_reset = 0.0
        max_ts = 0.0
        if self._running:
            max_ts = max(r[0] for r in self._running)
            if self._round_end is not None:
                self._round_start = self._round_end
            self._round_end = max_ts
        if max_ts > 0:
            self.now = max_ts
        elif next_arrival is not None:
            self.now = next_arrival
        for finish, j, w, steps in self._running:
            self._finish_micro_task(j, w, steps, finish, finish - self._round_start)
        self._had_running = bool(self._running)
        self._running = []
        return True

    def admit(self) -> None:
        while self._qi < len(self._queued) and self._queued[self._qi].arrival_s <= self.now:
            self._add(self._queued[self._qi])
            self._qi += 1

    def decide(self) -> dict[str, list[int]]:
        return self._schedule()

    def start_round(self, chosen: dict[str, list[int]]) -> None:
        """One micro-task per chosen job: a round's worth of its steps on the type (fewer when
        it has fewer left)."""
        self.current = {}
        for w, ids in chosen.items():
            for j in ids:
                job = self.active[j]
                thr = job.thr[w]
                steps = min(int(thr * self.round_s), self.remaining(j))
                self._running.append((self.now + steps / thr, j, w, steps))
                self.current[j] = w
        idle = not self._running and not self._had_running and self._qi >= len(self._queued)
        self._idle_spins = self._idle_spins + 1 if idle else 0

    def run(self) -> GavelRun:
        stats = run_rounds(self)
        return GavelRun(self.policy.name, self.jobs, self.completion, stats.rounds, stats.wall_s,
                        self.busy_s, self.now, sum(self.cluster.values()), self.type_time)

    def _finish_micro_task(self, j: int, w: str, steps: int, finish: float, exec_s: float) -> None:
        job = self.active.get(j)
        if job is None:
            return
        self.latest[j] = finish
        sf = job.scale_factor
        per_worker = steps // sf
        last = steps - (sf - 1) * per_worker
        ok = exec_s > 0 and last > 0 and (sf == 1 or per_worker > 0)
        self.busy_s += sf * max(0.0, exec_s)
        if not ok:
            self.failures[j] += 1
            self.need_update = True
            if self.failures[j] >= MAX_FAILED_ATTEMPTS:
                self._remove(j, completed=False)
            return
        self.failures[j] = 0
        self.steps_run[j] += steps
        self.job_time[j][w] += exec_s
        self.worker_time[w] += exec_s
        self.type_time[j][w] = self.type_time[j].get(w, 0.0) + exec_s
        if self.remaining(j) <= 0:
            self._remove(j, completed=True)


# ------------------------------------------------------------------------------ entry points


def make_gavel_policy(name: str, seed: int = 0) -> RoundPolicy:
    """Gavel's reference policies by their names; ``hetflow`` is the live controller's policy
    class through :mod:`hetflow.sim.live_gavel` (the same code ``hetflow submit`` runs)."""
    from hetflow.sim.live_gavel import live_gavel_policy

    factories: dict[str, Callable[[], RoundPolicy]] = {
        "fifo": lambda: Fifo(perf=False, seed=seed),
        "fifo_perf": lambda: Fifo(perf=True),
        "max_min_fairness": MaxMinFairness,
        "max_min_fairness_perf": MaxMinFairnessPerf,
        "finish_time_fairness_perf": FinishTimeFairnessPerf,
    }
    factories.update({name: (lambda name=name: live_gavel_policy(name)) for name in LIVE_POLICIES})
    factories.update({alias: factories[target] for alias, target in GAVEL_ALIASES.items()})
    factory = factories.get(name)
    if factory is None:
        raise InputError(f"unknown policy {name!r} for --protocol gavel; choose from {', '.join(GAVEL_POLICIES)}")
    return factory()


LIVE_POLICIES = ("hetflow",)  # registry policies run through the adapter (the live classes)
GAVEL_POLICIES = ("fifo", "fifo_perf", "max_min_fairness", "max_min_fairness_perf", "finish_time_fairness_perf",
                  *LIVE_POLICIES)
GAVEL_REFERENCE = GAVEL_POLICIES[:-1]
GAVEL_DEFAULT_POLICIES = GAVEL_POLICIES
GAVEL_ALIASES = {"las": "max_min_fairness", "las_perf": "max_min_fairness_perf", "ftf": "finish_time_fairness_perf"}


def simulate_gavel(jobs: Sequence[GavelJob], policy: str, seed: int = 0, cluster: Mapping[str, int] | None = None,
                   progress: Callable[[int, int], None] | None = None) -> GavelRun:
    return GavelSimulator(jobs, make_gavel_policy(policy, seed), cluster, seed=seed, progress=progress).run()
