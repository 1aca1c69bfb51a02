"""The cheapest fleet for a training trace (``hetflow capacity train``).

A fleet is a number of nodes of each candidate device model (``node_size`` devices a node). Each
fleet is judged by simulating the trace on it with the policy the live controller runs (the
discrete-event simulator of ``hetflow simulate``, :mod:`hetflow.sim.engine`): it meets the
target when every job finishes and the average (or P95) job completion time is within it. The
search walks the fleets up to ``max_nodes`` nodes of each model in order of price and stops at
the first that meets the target - so the answer is the cheapest such fleet of those walked -
skipping, without simulating, every fleet with no more nodes of any model than one that already
missed the target (fewer devices are assumed never to finish the trace sooner). The best
single-model fleets and the price/JCT Pareto front of every fleet simulated come with it.

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
from typing import Any, Callable, Sequence

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

    def to_dict(self) -> dict[str, Any]:
        return {"nodes": {k: v for k, v in self.counts.items() if v},
                "cost_per_hour": round(self.cost_per_hour, 4),
                "avg_jct_h": None if self.avg_jct_s is None else round(self.avg_jct_s / 3600, 4),
                "p95_jct_h": None if self.p95_jct_s is None else round(self.p95_jct_s / 3600, 4),
                "unfinished": self.unfinished, "meets_target": self.meets}


@dataclass
class TrainFleetPlan:
    best: Evaluation | None
    homogeneous: dict[str, Evaluation | None]
    evaluated: list[Evaluation] = field(default_factory=list)
    skipped: int = 0  # fleets not simulated: no bigger than one that missed the target
    wall_s: float = 0.0

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
            "pareto": [e.to_dict() for e in self.pareto(metric)],
            "simulated": len(self.evaluated), "skipped": self.skipped,
            "wall_s": round(self.wall_s, 2),
        }


def fleet_cost(counts: Counts, models: Sequence[str], node_size: int, prices: dict[str, float]) -> float:
    return sum(n * node_size * prices[m] for n, m in zip(counts, models))


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


def plan_train(models: Sequence[str], prices: dict[str, float], simulate: Callable[[dict[str, int]], dict[str, Any]],
               target_s: float, metric: str = "avg", node_size: int = 8, max_nodes: int = 4,
               max_simulations: int = 400, allow_empty: bool = False) -> TrainFleetPlan:
    """The cheapest fleet of ``models`` meeting ``target_s`` (see the module docstring).

    ``simulate(nodes per model) -> summary`` runs the trace on a fleet (``avg_jct_s``,
    ``p95_jct_s``, ``unfinished``, ``rejected``: :func:`hetflow.sim.metrics.summarise`'s keys).
    ``allow_empty``: the fleet of no node is a candidate too (``simulate`` then runs on what
    it adds itself, e.g. the devices a serving reservation left over).
    Raises InputError for bad arguments and Unschedulable when no fleet walked meets the target.
    """
    if metric not in ("avg", "p95"):
        raise InputError(f"metric must be avg or p95, not {metric!r}")
    if not (target_s > 0 and math.isfinite(target_s)):
        raise InputError("the JCT target must be a positive time, e.g. 12h")
    if node_size <= 0 or max_nodes <= 0:
        raise InputError("--node-size and --max-nodes must be > 0")
    missing = [m for m in models if m not in prices]
    if missing:
        raise InputError(f"no price for {', '.join(missing)}: give --price MODEL=DOLLARS_PER_DEVICE_HOUR "
                         "for each candidate (or a --prices file)")
    started = time.perf_counter()
    cache: dict[Counts, Evaluation] = {}
    failed: list[Counts] = []
    plan = TrainFleetPlan(None, {})

    def evaluate(counts: Counts) -> Evaluation:
        if counts not in cache:
            if len(cache) >= max_simulations:
                raise Unschedulable(f"no fleet met the target within {max_simulations} simulations; "
                                    "raise --max-simulations, relax the target or add a faster model")
            summary = simulate(dict(zip(models, counts)))
            value = summary.get("avg_jct_s" if metric == "avg" else "p95_jct_s")
            unfinished = int(summary.get("unfinished") or 0) + int(summary.get("rejected") or 0)
            meets = unfinished == 0 and value is not None and value <= target_s
            cache[counts] = Evaluation(dict(zip(models, counts)), fleet_cost(counts, models, node_size, prices),
                                       summary.get("avg_jct_s"), summary.get("p95_jct_s"), unfinished, meets)
            plan.evaluated.append(cache[counts])
            if not meets:
                failed.append(counts)
        return cache[counts]

    def dominated(counts: Counts) -> bool:  # no more of any model than a fleet that missed
        return any(all(c <= f for c, f in zip(counts, fail)) for fail in failed)

    # single-model fleets: the fewest nodes of each model that meet the target
    for i, m in enumerate(models):
        plan.homogeneous[m] = None
        for n in range(1, max_nodes + 1):
            counts = tuple(n if j == i else 0 for j in range(len(models)))
            if dominated(counts):
                continue
            if evaluate(counts).meets:
                plan.homogeneous[m] = cache[counts]
                break
    # every fleet in order of price; the first that meets the target is the cheapest
    grid = [c for c in itertools.product(range(max_nodes + 1), repeat=len(models)) if any(c) or allow_empty]
    grid.sort(key=lambda c: (fleet_cost(c, models, node_size, prices), sum(c), c))
    for counts in grid:
        if counts in cache:
            if cache[counts].meets:
                plan.best = cache[counts]
                break
            continue
        if dominated(counts):
            plan.skipped += 1
            continue
        if evaluate(counts).meets:
            plan.best = cache[counts]
            break
    plan.wall_s = time.perf_counter() - started
    if plan.best is None:
        key = "avg_jct_s" if metric == "avg" else "p95_jct_s"
        done = [e for e in plan.evaluated if e.unfinished == 0 and getattr(e, key) is not None]
        closest = min(done, key=lambda e: getattr(e, key)) if done else None
        reached = ("" if closest is None else
                   f" (the best simulated: {metric} JCT {getattr(closest, key) / 3600:.2f} h on "
                   + ", ".join(f"{n} x {m}" for m, n in closest.counts.items() if n)
                   + f" nodes, ${closest.cost_per_hour:,.2f}/h)")
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


__all__ = ["Evaluation", "ServingReservation", "TrainFleetPlan", "fleet_cost", "parse_prices", "parse_time",
           "plan_train", "reserve_serving"]
