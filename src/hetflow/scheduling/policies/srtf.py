"""``srtf``: shortest remaining time first, preemptive at round boundaries - size-based,
heterogeneity-agnostic (Tiresias with known durations).

A job's remaining time is its remaining work at its best speed (the trace's duration); device
types are otherwise not told apart: jobs take the first free devices in cluster order. At each
round the shortest jobs run, preempting longer ones.
"""

from __future__ import annotations

from typing import Mapping

from hetflow.scheduling.policies.base import (
    ClusterView, JobInfo, feasible_types, keep_or_place, prefer_current, select_by_count,
)
from hetflow.scheduling.policies.capacity import Assignment
from hetflow.scheduling.policies.placer import FirstFitPlacer, Placer


def remaining_seconds(job: JobInfo) -> float:
    """Remaining work at the job's best speed (inf for open-ended jobs)."""
    return job.remaining_work / job.best_rate if job.best_rate > 0 else float("inf")


class SrtfPolicy:
    name = "srtf"
    preemptive = True

    def __init__(self, placer: Placer | None = None) -> None:
        self.placer = placer or FirstFitPlacer()

    def schedule(self, view: ClusterView) -> dict[str, Assignment]:
        jobs = sorted(view.unpinned(), key=lambda j: (remaining_seconds(j), j.arrival_s))
        free = view.free

        def in_cluster_order(job: JobInfo, budget: Mapping[str, int]) -> list[str]:
            return prefer_current(job, feasible_types(job, free))

        chosen = select_by_count(jobs, free, in_cluster_order)
        rest = ((j, prefer_current(j, feasible_types(j, free))) for j in jobs)
        return keep_or_place(view, chosen, self.placer, rest)
