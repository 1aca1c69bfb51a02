"""``fifo``: first come, first served, first fit - heterogeneity-agnostic.

Jobs start in arrival order on the first node (in cluster order) with room, whatever its device
type; a job that does not fit yet does not hold back later ones (like Ray's default scheduler,
and unlike strict FIFO). Never preempts.
"""

from __future__ import annotations

from hetflow.scheduling.policies.base import ClusterView, feasible_types, fill
from hetflow.scheduling.policies.capacity import Assignment
from hetflow.scheduling.policies.placer import FirstFitPlacer, Placer


class FifoPolicy:
    name = "fifo"
    preemptive = False

    def __init__(self, placer: Placer | None = None) -> None:
        self.placer = placer or FirstFitPlacer()

    def schedule(self, view: ClusterView) -> dict[str, Assignment]:
        scratch = view.scratch()
        out: dict[str, Assignment] = {}
        waiting = sorted(view.unpinned(), key=lambda j: j.arrival_s)  # stable: trace order on ties
        fill(view, scratch, ((j, feasible_types(j, scratch)) for j in waiting), self.placer, out)
        return out
