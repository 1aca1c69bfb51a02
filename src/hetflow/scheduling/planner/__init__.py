"""Placement planner: one job's request + a cluster snapshot -> which device each rank gets.

``plan(snapshot, request) -> Placement`` (or ``Planner(catalog).plan(...)`` to plan many) or raises :class:`Unschedulable` naming which
constraint excluded which nodes and what would make the request fit. Pure and deterministic:
the same inputs give the same placement (ties go to the lower node name, then device index).

**Usable devices.** A device is usable when it matches the vendor/model/arch constraints and
the minimum memory, has the memory the job needs, and is free: an exclusive request needs a
device with no allocation at all; a shared request needs ``memory - sum(allocated memory)``
>= its memory per device, and any exclusive allocation (or one of unknown size) blocks the
device. A device of unknown memory is unusable when memory is asked for. Within one job every
rank gets its own device.

**Objective**, lexicographic (higher is better):

1. the TP bottleneck: over all tensor-parallel groups, the lowest bandwidth between two devices
   of one group (``NodeTopology.bandwidth`` inside a node, the snapshot's ``inter_node_gbps``
   between nodes). This is solved **exactly**: the answer is one of the bandwidth levels that
   occur, and a level t is feasible iff dp*pp disjoint groups of tp devices exist whose pairs
   all have bandwidth >= t (each group's part on one node is a clique of links >= t). Binary
   search over the levels; inside a node the disjoint cliques are counted by an exact bitmask
   search memoised per (topology, free set, level), which nodes of identical topology share.
   When no node-local packing reaches the needed count and t <= inter_node_gbps, groups may span
   nodes; that case is decided by a greedy construction, else an exact search over nodes whose
   state is the multiset of what each group still needs (see ``spanning.SpanningSolver``). That search
   has a work budget (``SPANNING_SEARCH_BUDGET``); if it is ever exhausted the level is treated
   as infeasible and the placement's notes say optimality was not proven.
2. pipeline neighbours: the stages of one data-parallel replica go on one node when a node has
   room for all of them, choosing groups whose aligned devices are well connected (heuristic).
3. fragmentation: ``pack`` takes partly used nodes first (best fit: fewest free devices), leaves
   whole free nodes free, and inside a node keeps the largest fast islands of the remaining free
   devices whole; ``spread`` puts replicas on the emptiest nodes with the fewest of this job's
   groups (heuristic).

Tensor-parallel groups stay inside one node whenever the optimal level allows it.

One concern per module: ``cliques`` (a node's devices as bit masks, islands and cliques, the
store of node models), ``eligibility`` (usable devices and the :class:`Reason` for each one
that is not), ``levels`` (the bandwidth-level search), ``spanning`` (groups across nodes),
``groups`` (objectives 2 and 3), ``explain`` (bandwidths and notes), ``planning`` (the
planner). The catalog is passed in (``Planner(catalog)``; :func:`plan` uses the shipped one).
"""

from __future__ import annotations

from hetflow.scheduling.planner.eligibility import Reason
from hetflow.scheduling.planner.planning import Planner, plan
from hetflow.scheduling.planner.spanning import SPANNING_SEARCH_BUDGET

__all__ = ["plan", "Planner", "Reason", "SPANNING_SEARCH_BUDGET"]
