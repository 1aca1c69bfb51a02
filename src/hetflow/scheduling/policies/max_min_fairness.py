"""``max_min_fairness``: Gavel's heterogeneity-aware max-min fairness (Narayanan et al., OSDI'20).

Each round it solves, with scipy's HiGHS LP solver, for time fractions x[j, w] (the share of
time job j should spend on device type w) that maximise the smallest normalised effective
throughput::

    maximise t
    subject to  sum_w rate[j, w] / best_rate[j] * x[j, w] >= weight[j] * t    for every job j
                sum_w x[j, w] <= 1                                             for every job j
                sum_j devices[j] * x[j, w] <= free devices of type w           for every type w
                x >= 0, x[j, w] = 0 where j cannot run on w

then a second LP keeps every job at that level and maximises the total (water filling, so spare
capacity is not left idle). Jobs with identical rows (same type, gang, share, weight) get the same
fractions at an optimum, so the LP is solved per class of identical jobs - a few dozen variables
instead of thousands - and each job's fractions are its class's.

Fractions become a round's allocation by Gavel's mechanism: job j's priority on type w is
x[j, w] divided by the fraction of its time it has actually had on w; pairs are granted in
priority order while devices last. Normalising by the best type's rate (Gavel uses an equal-share
allocation's rate) keeps every job's scale the same; documented in docs/simulator.md.
"""

from __future__ import annotations

import numpy as np
from scipy.optimize import linprog
from scipy.sparse import coo_matrix

from hetflow.scheduling.policies.base import ClusterView, JobInfo, keep_or_place, prefer_current
from hetflow.scheduling.policies.capacity import WHOLE, Assignment
from hetflow.scheduling.policies.placer import Placer, TopologyPlacer

_Class = tuple[str, int, int, float, tuple[str, ...]]


def _class_of(job: JobInfo) -> _Class:
    return (job.job_type, job.request.num_gpus, job.request.milli, job.weight, tuple(sorted(job.ideal_rates)))


def solve_max_min(
    rates: np.ndarray, need: np.ndarray, counts: np.ndarray, weights: np.ndarray, capacity: np.ndarray
) -> np.ndarray:
    """Max-min fair time fractions per class.

    ``rates`` (C, W) normalised rates (rate / best rate; 0 where a class cannot run),
    ``need`` (C,) devices per job, ``counts`` (C,) jobs per class, ``weights`` (C,),
    ``capacity`` (W,) devices. Returns x (C, W). Raises RuntimeError if HiGHS fails.
    """
    c, w = rates.shape
    nx = c * w
    rows, cols, vals = [], [], []
    b: list[float] = []
    r = 0
    # fairness: -sum_w rates[k, w] x[k, w] + weight[k] t <= 0
    for k in range(c):
        for v in range(w):
            if rates[k, v] > 0:
                rows.append(r); cols.append(k * w + v); vals.append(-rates[k, v])
        rows.append(r); cols.append(nx); vals.append(weights[k])
        b.append(0.0)
        r += 1
    # one job's fractions add up to at most 1
    for k in range(c):
        for v in range(w):
            rows.append(r); cols.append(k * w + v); vals.append(1.0)
        b.append(1.0)
        r += 1
    # capacity per type
    for v in range(w):
        for k in range(c):
            rows.append(r); cols.append(k * w + v); vals.append(need[k] * counts[k])
        b.append(float(capacity[v]))
        r += 1
    a = coo_matrix((vals, (rows, cols)), shape=(r, nx + 1)).tocsr()
    bounds = [(0.0, 1.0 if rates[k, v] > 0 else 0.0) for k in range(c) for v in range(w)] + [(0.0, None)]
    cost = np.zeros(nx + 1)
    cost[nx] = -1.0
    first = linprog(cost, A_ub=a, b_ub=np.array(b), bounds=bounds, method="highs")
    if first.status != 0:
        raise RuntimeError(f"max-min LP failed: {first.message}")
    level = max(float(first.x[nx]) * (1 - 1e-7), 0.0)
    # Water filling: keep everyone at the level, then use what is left (total normalised rate).
    bounds[-1] = (level, level)
    cost2 = np.zeros(nx + 1)
    for k in range(c):
        for v in range(w):
            cost2[k * w + v] = -rates[k, v] * counts[k]
    second = linprog(cost2, A_ub=a, b_ub=np.array(b), bounds=bounds, method="highs")
    x = second.x if second.status == 0 else first.x
    return np.clip(x[:nx].reshape(c, w), 0.0, 1.0)


class MaxMinFairnessPolicy:
    name = "max_min_fairness"
    preemptive = True

    def __init__(self, placer: Placer | None = None) -> None:
        self.placer = placer or TopologyPlacer()
        # Memo of the last LP: its inputs -> fractions. A pure function's cache, not state.
        self._memo: tuple[tuple, dict[_Class, np.ndarray]] | None = None

    def fractions(self, view: ClusterView, jobs: list[JobInfo]) -> dict[_Class, np.ndarray]:
        """Time fractions per job class (cached while the classes and capacity are unchanged)."""
        types = view.model.device_types
        classes: dict[_Class, int] = {}
        example: dict[_Class, JobInfo] = {}
        for j in jobs:
            k = _class_of(j)
            classes[k] = classes.get(k, 0) + 1
            example.setdefault(k, j)
        capacity = np.array([view.free.free_milli(t) / WHOLE for t in types])
        key = (tuple(sorted(classes.items())), tuple(capacity))
        if self._memo is not None and self._memo[0] == key:
            return self._memo[1]
        order = list(classes)
        rates = np.array([[example[k].ideal_rates.get(t, 0.0) / example[k].best_rate for t in types] for k in order])
        need = np.array([k[1] * k[2] / WHOLE for k in order])
        counts = np.array([classes[k] for k in order], dtype=float)
        weights = np.array([k[3] for k in order])
        x = solve_max_min(rates, need, counts, weights, capacity) if order else np.zeros((0, len(types)))
        result = {k: x[i] for i, k in enumerate(order)}
        self._memo = (key, result)
        return result

    def schedule(self, view: ClusterView) -> dict[str, Assignment]:
        jobs = [j for j in view.unpinned() if j.best_rate > 0]
        if not jobs:
            return {}
        types = view.model.device_types
        x = self.fractions(view, jobs) if view.round_boundary or self._memo is None else self._memo[1]
        pairs: list[tuple[float, float, int, JobInfo, int]] = []
        for i, j in enumerate(jobs):
            frac = x.get(_class_of(j))
            age = max(view.now - j.arrival_s, 1e-9)
            for v, t in enumerate(types):
                if t not in j.ideal_rates:
                    continue
                share = float(frac[v]) if frac is not None else 1.0  # new class: not solved yet
                if share <= 1e-6:
                    continue
                received = j.service_by_type.get(t, 0.0) / age
                priority = share / received if received > 0 else float("inf")
                pairs.append((-priority, -share, i, j, v))
        pairs.sort(key=lambda p: (p[0], p[1], p[2]))
        budget = {t: view.free.free_milli(t) for t in types}
        chosen: list[tuple[JobInfo, list[str]]] = []
        taken: set[str] = set()
        for _, _, _, j, v in pairs:
            t = types[v]
            need = j.request.gpu_milli
            if j.job_id in taken or budget[t] < need:
                continue
            budget[t] -= need
            taken.add(j.job_id)
            others = sorted((u for u in j.ideal_rates if u != t), key=lambda u: -j.ideal_rates[u])
            chosen.append((j, [t] + others))
        rest = [(j, prefer_current(j, sorted(j.ideal_rates, key=lambda u: -j.ideal_rates[u])))
                for j in jobs if j.job_id not in taken]
        return keep_or_place(view, chosen, self.placer, rest)
