"""The planner's ranks inside a cluster policy's choice: one interface for the live controller
and the simulator.

    ranks = RankPlanner(snapshot, model)           # model = ClusterModel.from_snapshot(snapshot)
    choice = ranks.plan(job_id, assignment, layout, after)   # None: the planner refused every try
    choice.assignment, choice.placement, choice.moved

The cluster policy chooses the device type, the share and how many devices on which nodes (its
job, fast, on device counts); :func:`hetflow.scheduling.planner.plan` then picks the devices and
maps the job's layout onto them (TP groups on the fastest links, pipeline neighbours next):

1. on the policy's nodes, keeping its count per node, among the devices free once the decision
   is applied (``after``, the assignment's own devices included);
2. on any node of the same type, taken only when that gives the TP groups faster links;
3. on exactly the policy's devices (ranks still ordered by the planner).

A shared device or a host-bound job (``Assignment.host``) keeps its node(s): only tries 1 (whole
devices) and 3 apply. A later try is skipped when the best so far already reaches the highest
pair bandwidth of the type's nodes (no later try can beat it, so the result is the same).

Used by ``LiveCluster.plan_ranks`` (control/scheduler.py) and by the simulator when it is given
one (``Simulator(..., ranks=RankPlanner(snapshot, model))``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import AbstractSet, Mapping

from hetflow.accelerators.catalog import default_catalog
from hetflow.core.errors import Unschedulable
from hetflow.core.placement import Placement
from hetflow.core.request import ParallelLayout, PlacementRequest
from hetflow.core.topology import Allocation, ClusterSnapshot
from hetflow.scheduling.planner import Planner
from hetflow.scheduling.policies.capacity import WHOLE, Assignment, ClusterModel, FreeCapacity

Slot = tuple[int, int]  # (pool, position) in the ClusterModel


@dataclass(frozen=True)
class RankChoice:
    assignment: Assignment  # the devices the ranks run on (the policy's, or ones the planner chose)
    placement: Placement  # the planner's placement on them: ranks in layout order, explained
    moved: bool  # the planner took other nodes than the policy's (same type, faster links)


class RankPlanner:
    """The planner on a cluster model's devices (see the module docstring)."""

    def __init__(self, snapshot: ClusterSnapshot, model: ClusterModel,
                 slot_of: Mapping[tuple[str, int], Slot] | None = None, planner: Planner | None = None) -> None:
        self.snapshot = snapshot
        self.model = model
        self.planner = planner if planner is not None else Planner(default_catalog())  # kept: memo shared by calls
        self.slot_of = slot_of if slot_of is not None else {
            (pool.machine, dev): (i, pos)
            for i, pool in enumerate(model.nodes) for pos, dev in enumerate(pool.devices)}
        self._nodes = {node.name: node for node in snapshot.nodes}
        self._best_pair: dict[str, float] = {}
        self.calls = 0  # assignments planned
        self.moved = 0  # ... that the planner moved to other nodes
        self.changed = 0  # ... whose devices it changed (moved included)
        self.refused = 0  # ... where it refused every try (the policy's devices kept, unranked)

    def plan(self, job_id: str, a: Assignment, layout: ParallelLayout | None, after: FreeCapacity,
             blocked: AbstractSet[Slot] = frozenset()) -> RankChoice | None:
        """The planner's devices and ranks for ``a`` (the policy's assignment, already taken in
        ``after``); ``after`` is updated when the devices change. ``blocked``: devices that are
        free in ``after`` but may not be used yet (a stopping job still holds them). ``layout``
        is used when its world size is the assignment's device count, else (or when None) one
        gang (tp = n)."""
        assert a.slots, "rank planning is for device jobs"
        if layout is None or not layout.is_resolved or layout.world_size != len(a.slots):
            layout = ParallelLayout(tp=len(a.slots))
        model = self.model
        counts: dict[int, int] = {}
        for n, _ in a.slots:
            counts[n] = counts.get(n, 0) + 1
        own = set(a.slots)

        def free_on(pools) -> set[Slot]:
            return own | {(n, pos) for n in pools for pos in range(len(model.nodes[n].devices))
                          if after.milli[n, pos] == WHOLE and (n, pos) not in blocked}

        tries: list[tuple[object, bool]] = []  # (devices allowed, or a callable giving them; same counts per node)
        if a.milli == WHOLE:
            tries.append((lambda: free_on(list(counts)), True))
            if a.host is None:
                tries.append((lambda: free_on(model.nodes_of_type[a.device_type].tolist()), False))
        tries.append((lambda: own, True))
        ceiling = self._ceiling(a.device_type, len(a.slots))
        best: tuple[float, Assignment, Placement] | None = None
        planned: dict[frozenset[Slot], Placement | None] = {}  # tries on the same devices plan once
        for make, same_nodes in tries:
            if best is not None and best[0] >= ceiling:
                break  # nothing later can be strictly faster
            allowed = frozenset(make())  # type: ignore[operator]
            if allowed not in planned:
                planned[allowed] = self._plan_on(job_id, layout, allowed)
            placed = planned[allowed]
            if placed is None:
                continue
            slots = tuple(self.slot_of[(r.node, r.device)] for r in placed.devices)
            got: dict[int, int] = {}
            for n, _ in slots:
                got[n] = got.get(n, 0) + 1
            if same_nodes and got != counts:
                continue
            score = placed.tp_bottleneck_gbps if placed.tp_bottleneck_gbps is not None else math.inf
            if best is None or score > best[0]:  # another node only when its links are faster
                new = Assignment(a.device_type, slots, a.milli, a.host, a.cpu_milli, a.memory_mib,
                                 group_gbps=model.group_gbps(tuple(sorted(slots))))
                best = (score, new, placed)
        self.calls += 1
        if best is None:
            self.refused += 1
            return None
        _, new, placed = best
        if set(new.slots) != own:
            after.release(a)
            after.take(new)
            self.changed += 1
        moved = {n for n, _ in new.slots} != set(counts)
        self.moved += moved
        return RankChoice(new, placed, moved)

    def _ceiling(self, device_type: str, n: int) -> float:
        """An upper bound of any TP bottleneck of ``n`` devices of this type: inf for one device,
        else the highest pair bandwidth on the type's nodes (or between nodes)."""
        if n <= 1:
            return math.inf
        hit = self._best_pair.get(device_type)
        if hit is None:
            hit = self.snapshot.inter_node_gbps
            for i in self.model.nodes_of_type.get(device_type, ()):
                pool = self.model.nodes[i]
                node = self._nodes[pool.machine]
                devs = pool.devices
                for x in range(len(devs)):
                    for y in range(x + 1, len(devs)):
                        hit = max(hit, node.bandwidth(devs[x], devs[y]))
            self._best_pair[device_type] = hit
        return hit

    def _plan_on(self, job_id: str, layout: ParallelLayout, allowed: AbstractSet[Slot]) -> Placement | None:
        """The planner on exactly the devices ``allowed``; None if it refuses."""
        usable = {(self.model.nodes[n].machine, self.model.nodes[n].devices[pos]) for n, pos in allowed}
        machines = {m for m, _ in usable}
        nodes = tuple(node for node in self.snapshot.nodes if node.name in machines)
        sub = ClusterSnapshot(
            nodes=nodes, inter_node_gbps=self.snapshot.inter_node_gbps,
            allocations=tuple(Allocation("other", node.name, d.index) for node in nodes
                              for d in node.devices if (node.name, d.index) not in usable))
        try:
            return self.planner.plan(sub, PlacementRequest(job_id, layout=layout, mixed_models=True))
        except Unschedulable:
            return None
