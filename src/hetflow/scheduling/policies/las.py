"""``las``: least attained service first, preemptive at round boundaries - size-based without
knowing sizes, heterogeneity-agnostic (Tiresias's 2D-LAS, continuous form).

Priority is the device-seconds a job has received so far (devices x time), so new and small jobs
overtake long-running ones; device types are not told apart (first free devices in cluster
order). This is also Gavel's heterogeneity-agnostic "LAS" baseline.
"""

from __future__ import annotations

from typing import Mapping

from hetflow.scheduling.policies.base import (
    ClusterView, JobInfo, feasible_types, keep_or_place, prefer_current, select_by_count,
)
from hetflow.scheduling.policies.capacity import Assignment
from hetflow.scheduling.policies.placer import FirstFitPlacer, Placer


class LasPolicy:
    name = "las"
    preemptive = True

    def __init__(self, placer: Placer | None = None) -> None:
        self.placer = placer or FirstFitPlacer()

    def schedule(self, view: ClusterView) -> dict[str, Assignment]:
        jobs = sorted(view.unpinned(), key=lambda j: (j.attained_s / j.weight, j.arrival_s))
        free = view.free

        def in_cluster_order(job: JobInfo, budget: Mapping[str, int]) -> list[str]:
            return prefer_current(job, feasible_types(job, free))

        chosen = select_by_count(jobs, free, in_cluster_order)
        rest = ((j, prefer_current(j, feasible_types(j, free))) for j in jobs)
        return keep_or_place(view, chosen, self.placer, rest)
