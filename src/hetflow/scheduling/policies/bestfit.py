"""``bestfit``: arrival order, best-fit packing, no preemption - the packing baseline.

Each job goes where it leaves the least room: the device with the smallest free share that
holds a shared-GPU request, the node with the fewest free devices that holds a gang. Device
types are not told apart. The usual baseline in GPU-sharing studies (Alibaba's openb trace).
"""

from __future__ import annotations

from hetflow.scheduling.policies.base import ClusterView, feasible_types, fill
from hetflow.scheduling.policies.capacity import Assignment
from hetflow.scheduling.policies.placer import BestFitPlacer, Placer


class BestFitPolicy:
    name = "bestfit"
    preemptive = False

    def __init__(self, placer: Placer | None = None) -> None:
        self.placer = placer or BestFitPlacer()

    def schedule(self, view: ClusterView) -> dict[str, Assignment]:
        scratch = view.scratch()
        out: dict[str, Assignment] = {}
        waiting = sorted(view.unpinned(), key=lambda j: j.arrival_s)
        fill(view, scratch, ((j, feasible_types(j, scratch)) for j in waiting), self.placer, out)
        return out
