"""The cheapest fleet for a training trace (``hetflow capacity train``).

A fleet is a number of nodes of each candidate device model (``node_size`` devices a node). Each
fleet is judged by simulating the trace on it with the policy the live controller runs (the
discrete-event simulator of ``hetflow simulate``, :mod:`hetflow.sim.engine`): it meets the
target when every job finishes and the average (or P95) job completion time is within it.

The search is exact under one assumption: a fleet with no more nodes of any model than one that
missed the target misses it too (fewer devices never finish a trace sooner). Then

* a **bound** from the trace alone rules fleets out without a simulation
  (:func:`fleet_lower_bound`: each job's time alone on the fastest model where it fits, and for
  the average the whole fleet as one machine running shortest-remaining-work first);
* a simulation **stops early** once the fleet is sure to miss (``SimConfig.stop_past``);
* the **single-model fleets** are found by bisection on the node count;
* among **mixed fleets** each simulation either lowers the price to beat (a fleet that meets) or
  rules out every fleet below it (a miss), so the fleets below the most others still open are
  simulated first, until no fleet cheaper than the best found is left open;
* simulations run side by side in ``workers`` forked processes.

The best single-model fleets and the price/JCT Pareto front of the fleets simulated to the end
come with it.

**Training beside a serving load** (:func:`reserve_serving`, ``hetflow capacity train --serve``):
the serving plan's replicas (:func:`hetflow.capacity.serve.plan_serve`) are bought first, as whole
nodes of their model, and reserved for serving; the devices those nodes have left over go to
training, so the training search starts from them (the fleet with no training node at all is a
candidate). The answer is the whole fleet's price - serving nodes, serving replicas outside the
node fleet (CPU replicas), training nodes - beside the two bought apart.
"""

from __future__ import annotations

import itertools
import math
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable, Mapping, Sequence

import numpy as np

from hetflow.core.errors import InputError, Unschedulable

Counts = tuple[int, ...]  # nodes per model, in the order of ``models``


@dataclass
class Evaluation:
    counts: dict[str, int]
    cost_per_hour: float
    avg_jct_s: float | None
    p95_jct_s: float | None
    unfinished: int
    meets: bool
    stopped_early: bool = False  # the simulation stopped once the target was sure to be missed

    def to_dict(self) -> dict[str, Any]:
        return {"nodes": {k: v for k, v in self.counts.items() if v},
                "cost_per_hour": round(self.cost_per_hour, 4),
                "avg_jct_h": None if self.avg_jct_s is None else round(self.avg_jct_s / 3600, 4),
                "p95_jct_h": None if self.p95_jct_s is None else round(self.p95_jct_s / 3600, 4),
                "unfinished": self.unfinished, "meets_target": self.meets,
                **({"stopped_early": True} if self.stopped_early else {})}


@dataclass
class TrainFleetPlan:
    best: Evaluation | None
    homogeneous: dict[str, Evaluation | None]
    evaluated: list[Evaluation] = field(default_factory=list)
    skipped: int = 0  # fleets not simulated: no bigger than one that missed the target
    bounded: int = 0  # fleets not simulated: the trace's lower bound already misses the target
    wall_s: float = 0.0
    best_mix: Evaluation | None = None  # find_mix: the cheapest mix meeting the target (dearer than best)

    @property
    def best_homogeneous(self) -> Evaluation | None:
        found = [e for e in self.homogeneous.values() if e is not None]
        return min(found, key=lambda e: e.cost_per_hour) if found else None

    def pareto(self, metric: str = "avg") -> list[Evaluation]:
        """Fleets no other simulated fleet beats on both price and JCT (every job finished)."""
        key = "avg_jct_s" if metric == "avg" else "p95_jct_s"
        done = sorted((e for e in self.evaluated if e.unfinished == 0 and getattr(e, key) is not None),
                      key=lambda e: (e.cost_per_hour, getattr(e, key)))
        front: list[Evaluation] = []
        for e in done:
            if not front or getattr(e, key) < getattr(front[-1], key) - 1e-9:
                front.append(e)
        return front

    def to_dict(self, metric: str = "avg") -> dict[str, Any]:
        homog = self.best_homogeneous
        return {
            "best": None if self.best is None else self.best.to_dict(),
            "best_homogeneous": None if homog is None else homog.to_dict(),
            "homogeneous": {k: None if v is None else v.to_dict() for k, v in self.homogeneous.items()},
            "mixed_over_homogeneous": (round(self.best.cost_per_hour / homog.cost_per_hour, 4)
                                       if self.best and homog and homog.cost_per_hour else None),
            **({"best_mix": self.best_mix.to_dict()} if self.best_mix is not None else {}),
            "pareto": [e.to_dict() for e in self.pareto(metric)],
            "simulated": len(self.evaluated), "skipped": self.skipped, "bounded": self.bounded,
            "stopped_early": sum(e.stopped_early for e in self.evaluated),
            "wall_s": round(self.wall_s, 2),
        }


def is_mix(counts: Iterable[int]) -> bool:
    """Whether a fleet (nodes per model) holds more than one model."""
    return sum(1 for n in counts if n) > 1


def mix_price_ranges(plan: TrainFleetPlan, models: Sequence[str], node_size: int | Mapping[str, int],
                     prices: dict[str, float]) -> dict[str, list[tuple[float, float]]]:
    """Per model, the ranges of its price (USD per device-hour, the others' as given) at which
    the cheapest of the simulated fleets that meet the target is a mix of models - where
    mixing pays. A fleet's JCT does not depend on prices, so no simulation is needed: each
    fleet's cost is a line in the price, and the ranges lie between the points where a mix's
    line crosses a single model's. Only the fleets simulated count (at other prices the search
    would have walked others; the single-model fleets it always finds), so a range is where a
    mix is sure to pay, not all of it. ``inf`` ends a range that goes on."""
    sizes = dict(zip(models, node_sizes(models, node_size)))
    met = [e for e in plan.evaluated if e.meets]
    out: dict[str, list[tuple[float, float]]] = {}
    for m in models:
        lines = []  # (mixed, constant part, slope) of each fleet's cost in m's price
        for e in met:
            slope = e.counts.get(m, 0) * sizes[m]
            lines.append((is_mix(e.counts.values()), e.cost_per_hour - slope * prices[m], slope))
        mixed = [(a, b) for is_mix, a, b in lines if is_mix]
        single = [(a, b) for is_mix, a, b in lines if not is_mix]
        if not mixed:
            out[m] = []
            continue
        if not single:
            out[m] = [(0.0, math.inf)]
            continue
        points = {0.0}
        for a1, b1 in mixed:
            for a2, b2 in single:
                if b1 != b2 and (x := (a2 - a1) / (b1 - b2)) > 0:
                    points.add(x)
        edges = sorted(points)
        ranges: list[tuple[float, float]] = []
        for lo, hi in zip(edges, [*edges[1:], math.inf]):
            x = (lo + hi) / 2 if math.isfinite(hi) else lo * 2 + 1
            if min(a + b * x for a, b in mixed) < min(a + b * x for a, b in single) - 1e-9:
                if ranges and ranges[-1][1] == lo:
                    ranges[-1] = (ranges[-1][0], hi)
                else:
                    ranges.append((lo, hi))
        out[m] = ranges
    return out


def node_sizes(models: Sequence[str], node_size: int | Mapping[str, int]) -> list[int]:
    """Devices a node of each model (``node_size``: one number for all, or per model)."""
    sizes = [node_size if isinstance(node_size, int) else node_size.get(m, 0) for m in models]
    if any(not isinstance(n, int) or n <= 0 for n in sizes):
        raise InputError("--node-size must be > 0 (for every model)")
    return sizes


def fleet_cost(counts: Counts, models: Sequence[str], node_size: int | Mapping[str, int],
               prices: dict[str, float]) -> float:
    return sum(n * k * prices[m] for n, k, m in zip(counts, node_sizes(models, node_size), models))


@dataclass
class ServingReservation:
    """The serving part of a shared fleet: whole nodes per model, the replicas on them."""

    nodes: dict[str, int]  # node model -> nodes bought for serving
    replicas: dict[str, int]  # model -> devices serving (node models and the rest)
    spare: dict[str, int]  # node model -> devices of those nodes left for training
    cost_per_hour: float  # the serving nodes, and the replicas outside the node fleet

    def to_dict(self) -> dict[str, Any]:
        return {"nodes": {k: v for k, v in self.nodes.items() if v}, "replicas": dict(self.replicas),
                "spare_for_training": {k: v for k, v in self.spare.items() if v},
                "cost_per_hour": round(self.cost_per_hour, 4)}


def reserve_serving(replicas: dict[str, int], prices: dict[str, float], node_size: int,
                    is_node_model: Callable[[str], bool]) -> ServingReservation:
    """Whole nodes for each node model's serving replicas (``ceil(replicas / node_size)``), the
    devices left on them spare; a model that is not bought in nodes (a CPU replica) costs its
    replicas. ``prices``: dollars per device-hour of every model named."""
    if node_size <= 0:
        raise InputError("--node-size must be > 0")
    nodes: dict[str, int] = {}
    spare: dict[str, int] = {}
    cost = 0.0
    for model, n in replicas.items():
        if n <= 0:
            continue
        if is_node_model(model):
            nodes[model] = -(-n // node_size)
            spare[model] = nodes[model] * node_size - n
            cost += nodes[model] * node_size * prices[model]
        else:
            cost += n * prices[model]
    return ServingReservation(nodes, {k: v for k, v in replicas.items() if v > 0}, spare, cost)


@dataclass(frozen=True)
class JobTimes:
    """What a job of the trace needs on each candidate model, for the bounds: the devices it
    takes there (its gang, or an elastic job's smallest size), its time alone there at its best
    placement, and the device-seconds it takes there at its most frugal size."""

    arrival_s: float
    need: dict[str, int]
    alone_s: dict[str, float]
    area: dict[str, float]


def fleet_lower_bound(jobs: Sequence[JobTimes], devices: dict[str, int], metric: str = "avg") -> float:
    """A lower bound of the trace's average (or P95) JCT on a fleet of ``devices`` per model,
    valid for any policy; ``inf`` when some job fits on none of them.

    Per job: its time alone on the fastest model where it fits. For the average also the
    aggregate relaxation: the whole fleet as one machine that works on one job at a time at the
    fleet's total speed (each device counted at its best relative speed for any job), where
    shortest-remaining-work-first (optimal there, with preemption and release dates) gives the
    least sum of completion times. The larger of the two."""
    alone: list[float] = []
    for j in jobs:
        fits = [t for m, t in j.alone_s.items() if j.need[m] <= devices.get(m, 0)]
        if not fits:
            return math.inf
        alone.append(min(fits))
    if not alone:
        return 0.0
    if metric == "p95":
        return float(np.quantile(np.array(alone), 0.95))
    per_job = sum(alone) / len(alone)
    # aggregate relaxation: each job's work in device-seconds of its most frugal fitting model
    usable = [[m for m in j.area if j.need[m] <= devices.get(m, 0)] for j in jobs]
    work = [min(j.area[m] for m in ms) for j, ms in zip(jobs, usable)]
    sigma: dict[str, float] = {}
    for j, ms, w in zip(jobs, usable, work):
        for m in ms:
            sigma[m] = max(sigma.get(m, 0.0), w / j.area[m])
    speed = sum(devices[m] * sg for m, sg in sigma.items())
    if speed <= 0:
        return per_job
    return max(per_job, _srpt_mean_flow([j.arrival_s for j in jobs], work, speed))


def _srpt_mean_flow(arrivals: Sequence[float], work: Sequence[float], speed: float) -> float:
    """Mean (completion - arrival) of preemptive shortest-remaining-work-first on one machine of
    ``speed`` work units per second."""
    import heapq

    order = sorted(range(len(arrivals)), key=lambda i: arrivals[i])
    heap: list[tuple[float, int]] = []  # (remaining work, job)
    t, k, total = 0.0, 0, 0.0
    while k < len(order) or heap:
        if not heap:
            t = max(t, arrivals[order[k]])
        while k < len(order) and arrivals[order[k]] <= t:
            heapq.heappush(heap, (work[order[k]], order[k]))
            k += 1
        rem, i = heapq.heappop(heap)
        finish = t + rem / speed
        nxt = arrivals[order[k]] if k < len(order) else math.inf
        if finish <= nxt:
            t = finish
            total += t - arrivals[i]
        else:  # the next arrival comes first: run until then, then choose again
            heapq.heappush(heap, (rem - (nxt - t) * speed, i))
            t = nxt
    return total / len(arrivals)


MAX_NODES_PER_MODEL = 10_000
"""The most nodes of one model a search walks (the bounds simulate that fleet once: 80,000
devices at 8 a node take about 10 s)."""
MAX_FLEETS = 2_000_000
"""The most fleets (``(max_nodes + 1) ** models``) a search walks: it holds the whole grid."""


def check_search_size(models: Sequence[str], max_nodes: int) -> None:
    """One line (InputError) for a search too large to walk: ``max_nodes`` past
    :data:`MAX_NODES_PER_MODEL`, or more fleets than :data:`MAX_FLEETS`."""
    if max_nodes <= 0:
        raise InputError("--node-size and --max-nodes must be > 0")
    if max_nodes > MAX_NODES_PER_MODEL:
        raise InputError(f"--max-nodes {max_nodes:,} is past the {MAX_NODES_PER_MODEL:,} nodes of one model a "
                         "search walks; lower --max-nodes")
    fleets = (max_nodes + 1) ** len(models)
    if fleets > MAX_FLEETS:
        most = int(MAX_FLEETS ** (1 / len(models)) + 1e-9) - 1
        raise InputError(f"--max-nodes {max_nodes:,} over {len(models)} models is {fleets:,} fleets to walk, "
                         f"past the {MAX_FLEETS:,} a search holds; lower --max-nodes to {most:,} or fewer, or "
                         "give fewer --devices")


def job_times(jobs: Sequence[Any], models: Sequence[str], node_size: int | Mapping[str, int], max_nodes: int,
              throughputs: Any,
              policy: str = "hetflow") -> list[JobTimes]:
    """Each job's needs and best times on each model (:class:`JobTimes`), from the simulator's
    own rates on the largest fleet walked (``max_nodes`` nodes of each model), so the bounds use
    the speeds the simulations use. An elastic job counts its fastest and its most frugal size."""
    from hetflow.scheduling.policies.capacity import ClusterModel
    from hetflow.scheduling.policies.registry import make_policy
    from hetflow.sim.cluster import synthetic_cluster
    from hetflow.sim.engine import Simulator

    check_search_size(models, max_nodes)
    cluster = ClusterModel.from_snapshot(synthetic_cluster(
        [(max_nodes, f"{k}x {m}") for m, k in zip(models, node_sizes(models, node_size))]))
    sim = Simulator(cluster, [], make_policy(policy), throughputs)
    out: list[JobTimes] = []
    for job in jobs:
        rates = sim.ideal_rates(job)
        by_size = sim.size_rates(job, rates) or {job.num_gpus: rates}
        share = job.gpu_milli / 1000.0
        need: dict[str, int] = {}
        alone: dict[str, float] = {}
        area: dict[str, float] = {}
        for m in models:
            sized = [(n, r[m]) for n, r in by_size.items() if r.get(m, 0.0) > 0]
            if not sized or not math.isfinite(job.total_work):
                continue
            need[m] = min(n for n, _ in sized)
            alone[m] = min(job.total_work / r for _, r in sized)
            area[m] = min(max(n, 1) * share * job.total_work / r for n, r in sized)
        out.append(JobTimes(job.arrival_s, need, alone, area))
    return out


_SIMULATE: Callable[[dict[str, int]], dict[str, Any]] | None = None  # for forked workers


def _simulate_in_worker(nodes: dict[str, int]) -> dict[str, Any]:
    assert _SIMULATE is not None
    return _SIMULATE(nodes)


def plan_train(models: Sequence[str], prices: dict[str, float], simulate: Callable[[dict[str, int]], dict[str, Any]],
               target_s: float, metric: str = "avg", node_size: int | Mapping[str, int] = 8, max_nodes: int = 4,
               max_simulations: int = 400, allow_empty: bool = False,
               bound: Callable[[dict[str, int]], float] | None = None, workers: int = 1,
               price_cap: float = math.inf, find_mix: bool = False) -> TrainFleetPlan:
    """The cheapest fleet of ``models`` meeting ``target_s`` (see the module docstring).

    ``simulate(nodes per model) -> summary`` runs the trace on a fleet (``avg_jct_s``,
    ``p95_jct_s``, ``unfinished``, ``rejected``: :func:`hetflow.sim.metrics.summarise`'s keys;
    ``stopped_past_s`` when the simulation stopped as soon as the target was sure to be missed).
    ``bound(nodes per model)``: a lower bound of the metric on that fleet (seconds, ``inf``
    when the trace cannot run there); a fleet whose bound exceeds the target is not simulated.
    ``workers``: simulations run side by side in that many forked processes (the walk stays in
    price order: a batch's results are read cheapest first).
    ``price_cap``: mixed fleets at this price or more are not walked (the caller has a fleet at
    that price that meets the target, e.g. a single-model fleet beyond ``max_nodes``).
    ``find_mix``: when the best fleet is one model's, walk on to the cheapest mix of models that
    meets the target too (``best_mix``; more simulations), so :func:`mix_price_ranges` can say
    at which prices mixing would pay.
    ``allow_empty``: the fleet of no node is a candidate too (``simulate`` then runs on what
    it adds itself, e.g. the devices a serving reservation left over).
    Raises InputError for bad arguments and Unschedulable when no fleet walked meets the target.
    """
    if metric not in ("avg", "p95"):
        raise InputError(f"metric must be avg or p95, not {metric!r}")
    if not (target_s > 0 and math.isfinite(target_s)):
        raise InputError("the JCT target must be a positive time, e.g. 12h")
    sizes = node_sizes(models, node_size)
    check_search_size(models, max_nodes)
    if workers <= 0:
        raise InputError("--workers must be > 0")
    missing = [m for m in models if m not in prices]
    if missing:
        raise InputError(f"no price for {', '.join(missing)}: give --price MODEL=DOLLARS_PER_DEVICE_HOUR "
                         "for each candidate (or a --prices file)")
    started = time.perf_counter()
    cache: dict[Counts, Evaluation] = {}
    failed: list[Counts] = []
    plan = TrainFleetPlan(None, {})
    key = "avg_jct_s" if metric == "avg" else "p95_jct_s"
    pool = None
    if workers > 1:
        import multiprocessing
        from concurrent.futures import ProcessPoolExecutor

        global _SIMULATE
        _SIMULATE = simulate
        pool = ProcessPoolExecutor(workers, mp_context=multiprocessing.get_context("fork"))

    def record(counts: Counts, summary: dict[str, Any]) -> Evaluation:
        value = summary.get(key)
        unfinished = int(summary.get("unfinished") or 0) + int(summary.get("rejected") or 0)
        stopped = summary.get("stopped_past_s") is not None
        meets = not stopped and unfinished == 0 and value is not None and value <= target_s
        e = Evaluation(dict(zip(models, counts)), fleet_cost(counts, models, node_size, prices),
                       summary.get("avg_jct_s"), summary.get("p95_jct_s"), unfinished, meets, stopped_early=stopped)
        cache[counts] = e
        plan.evaluated.append(e)
        if not meets:
            failed.append(counts)
        return e

    def dominated(counts: Counts) -> bool:  # no more of any model than a fleet that missed
        return any(all(c <= f for c, f in zip(counts, fail)) for fail in failed)

    bounds: dict[Counts, bool] = {}

    def bounded_out(counts: Counts) -> bool:
        """The trace's lower bound on this fleet already misses the target (not simulated)."""
        if bound is None or not any(counts):
            return False
        if counts not in bounds:
            low = bound({m: n * k for m, n, k in zip(models, counts, sizes) if n})
            bounds[counts] = low > target_s
            if bounds[counts]:
                plan.bounded += 1
        return bounds[counts]

    def run(batch: Sequence[Counts]) -> None:
        if len(cache) + len(batch) > max_simulations:
            raise Unschedulable(f"no answer within {max_simulations} simulations; raise --max-simulations, "
                                "relax the target or add a faster model")
        nodes = [dict(zip(models, c)) for c in batch]
        summaries = list(pool.map(_simulate_in_worker, nodes)) if pool and len(batch) > 1 else \
            [simulate(n) for n in nodes]
        for c, summary in zip(batch, summaries):
            record(c, summary)

    def order(c: Counts) -> tuple:
        return (fleet_cost(c, models, node_size, prices), sum(c), c)

    def walk(live: list[Counts], best: Counts | None) -> Counts | None:
        """Simulate the open fleets of ``live`` (below the most others first) until none
        cheaper than ``best`` (the cheapest that met the target so far) is left; the new best."""
        while live:
            at = tuple(np.array(live).T)
            below = np.zeros((max_nodes + 1,) * len(models), dtype=np.int64)  # open fleets at or below each
            below[at] = 1
            for axis in range(len(models)):
                below = below.cumsum(axis=axis)
            below = below[at]
            before = len(failed)
            batch: list[Counts] = []
            for k in sorted(range(len(live)), key=lambda k: (-below[k], order(live[k]))):
                c = live[k]
                if any(all(x <= y for x, y in zip(c, f)) for f in failed[before:]):
                    continue  # below a fleet just ruled out
                if bounded_out(c):  # the trace's bound: a miss without a simulation
                    failed.append(c)
                    continue
                batch.append(c)
                if len(batch) == workers:
                    break
            if batch:
                run(batch)
            for c in batch:
                if cache[c].meets and (best is None or order(c) < order(best)):
                    best = c
            misses = failed[before:]
            live = [c for c in live if c not in cache and not bounds.get(c) and (best is None or order(c) < order(best))
                    and not any(all(x <= y for x, y in zip(c, f)) for f in misses)]
        return best

    try:
        # single-model fleets: the fewest nodes of each model that meet the target, by bisection
        # (more nodes of one model never finish the trace later), the models' searches side by side
        def bisect(fleet: Callable[[int, int], Counts], lines: Iterable[int]) -> dict[int, int]:
            """Per line ``i``: the fewest ``n`` (1..max_nodes) for which ``fleet(i, n)`` meets the
            target, by bisection (more nodes never finish the trace later), the lines side by side;
            ``max_nodes + 1`` where none does."""
            span = {i: [0, max_nodes + 1] for i in lines}  # misses at lo, meets at hi
            while True:
                for i, (lo, hi) in span.items():  # what the bounds settle
                    while hi - lo > 1 and bounded_out(fleet(i, lo + 1)):
                        failed.append(fleet(i, lo + 1))
                        lo += 1
                    span[i] = [lo, hi]
                open_ = [i for i, (lo, hi) in span.items() if hi - lo > 1][:workers]
                if not open_:
                    return {i: hi for i, (_lo, hi) in span.items()}
                batch = [(i, (span[i][0] + span[i][1]) // 2) for i in open_]
                run([fleet(i, n) for i, n in batch if fleet(i, n) not in cache])
                for i, n in batch:
                    span[i][1 if cache[fleet(i, n)].meets else 0] = n

        def single(i: int, n: int) -> Counts:
            return tuple(n if j == i else 0 for j in range(len(models)))

        fewest = bisect(single, range(len(models)))
        for i, m in enumerate(models):
            hi = fewest[i]
            plan.homogeneous[m] = cache[single(i, hi)] if hi <= max_nodes else None
        # mixed fleets: the cheapest that meets the target. Under the same assumption (a fleet with
        # no more of any model than one that missed misses too), each simulation either lowers the
        # price to beat (a fleet that meets) or rules out every fleet below it (a miss): simulate
        # first the fleets below the most others still open, until none cheaper than the best is left
        grid = [c for c in itertools.product(range(max_nodes + 1), repeat=len(models)) if any(c) or allow_empty]
        met = [e for e in plan.evaluated if e.meets]
        best: Counts | None = min((tuple(e.counts[m] for m in models) for e in met), key=order, default=None)
        live = [c for c in grid if c not in cache and (best is None or order(c) < order(best)) and not dominated(c)
                and fleet_cost(c, models, node_size, prices) < price_cap]
        best = walk(live, best)
        plan.best = None if best is None else cache[best]
        if find_mix and best is not None and not is_mix(best) and any(best):
            # the cheapest mix too (dearer than the best): the fleets where mixing would pay
            # Only mixes with fewer nodes of the best's model count: one holding the whole best
            # fleet costs at least as much at any prices, so it is never where mixing pays
            (lone,) = [i for i, n in enumerate(best) if n]

            def holds_best(c: Counts) -> bool:
                return all(x >= y for x, y in zip(c, best))

            mix = min((c for c in cache if cache[c].meets and is_mix(c) and not holds_best(c)), key=order,
                      default=None)
            # A price to beat before the walk: one node of the best's model fewer and the fewest
            # nodes of one other model that make up for it (by bisection, each other model side by
            # side, as for the single-model fleets). Without it the walk went through the whole
            # grid's mixes: on Gavel's 1,000-job trace with 17 nodes a model, unfinished after 25
            # minutes; with it, 89 simulations in 7 minutes (docs/capacity.md).
            if best[lone] > 1:
                def swap(j: int, k: int) -> Counts:
                    return tuple(best[lone] - 1 if x == lone else k if x == j else 0 for x in range(len(models)))

                for j, hi in bisect(swap, (j for j in range(len(models)) if j != lone)).items():
                    if hi <= max_nodes and (mix is None or order(swap(j, hi)) < order(mix)):
                        mix = swap(j, hi)
            live = [c for c in grid if is_mix(c) and not holds_best(c) and c not in cache and not bounds.get(c)
                    and not dominated(c) and (mix is None or order(c) < order(mix))]
            mix = walk(live, mix)
            plan.best_mix = None if mix is None else cache[mix]
        plan.skipped = sum(1 for c in grid if c not in cache and not bounds.get(c))
    finally:
        if pool is not None:
            pool.shutdown(cancel_futures=True)
    plan.wall_s = time.perf_counter() - started
    if plan.best is None:
        done = [e for e in plan.evaluated if e.unfinished == 0 and getattr(e, key) is not None]
        closest = min(done, key=lambda e: getattr(e, key)) if done else None
        reached = ("" if closest is None else
                   f" (the best simulated: {metric} JCT {getattr(closest, key) / 3600:.2f} h on "
                   + ", ".join(f"{n} x {m}" for m, n in closest.counts.items() if n)
                   + f" nodes, ${closest.cost_per_hour:,.2f}/h)")
        if closest is None and bound is not None:  # nothing ran to the end: say what the trace allows
            low = bound({m: max_nodes * k for m, k in zip(models, sizes)})
            reached = (" (no fleet can: the trace's jobs cannot all run on these models)" if math.isinf(low) else
                       f" (the trace's lower bound on the largest fleet: {metric} JCT {low / 3600:.2f} h)")
        raise Unschedulable(f"no fleet of up to {max_nodes} nodes of each model meets {metric} JCT <= "
                            f"{target_s / 3600:g} h{reached}; raise --max-nodes or relax the target")
    return plan


def parse_time(text: str, flag: str) -> float:
    """``"12h"`` / ``"90m"`` / ``"2d"`` / ``"3600"`` (seconds) -> seconds."""
    import re

    m = re.fullmatch(r"\s*([0-9]*\.?[0-9]+)\s*([smhd]?)\s*", str(text))
    if not m or not float(m.group(1)) > 0:
        raise InputError(f"{flag} {text!r}: give a positive time, e.g. 12h, 90m, 2d or seconds")
    return float(m.group(1)) * {"": 1, "s": 1, "m": 60, "h": 3600, "d": 86400}[m.group(2)]


def parse_prices(pairs: Sequence[str], doc: Any = None, source: str = "--prices") -> dict[str, float]:
    """``MODEL=DOLLARS`` pairs (per device-hour) and/or a ``{MODEL: dollars}`` mapping."""
    prices: dict[str, float] = {}
    if doc is not None:
        if not isinstance(doc, dict):
            raise InputError(f"{source}: expected a mapping MODEL: dollars per device-hour")
        for k, v in doc.items():
            if not isinstance(v, (int, float)) or isinstance(v, bool) or not v > 0:
                raise InputError(f"{source}: price of {k} must be a positive number, not {v!r}")
            prices[str(k)] = float(v)
    for pair in pairs:
        name, eq, value = pair.partition("=")
        try:
            price = float(value)
        except ValueError:
            price = float("nan")
        if not eq or not name or not price > 0:
            raise InputError(f"--price {pair!r}: write MODEL=DOLLARS_PER_DEVICE_HOUR, e.g. H100-SXM=4.5")
        prices[name] = price
    return prices


__all__ = ["Evaluation", "JobTimes", "job_times", "ServingReservation", "TrainFleetPlan", "fleet_cost", "fleet_lower_bound",
           "is_mix", "mix_price_ranges",
           "parse_prices", "parse_time", "plan_train", "reserve_serving"]
