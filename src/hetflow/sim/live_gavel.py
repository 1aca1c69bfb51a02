"""The live controller's policies on Gavel's protocol: an adapter, not a second algorithm.

Gavel's mechanism (:mod:`hetflow.sim.gavel`) asks each round which jobs run on which worker
type. :class:`LivePolicyRounds` answers with a policy of the registry
(:mod:`hetflow.scheduling.policies.registry`, the classes the controller runs) through the
same decision functions the controller and hetflow's own engine use
(:func:`~hetflow.scheduling.policies.rounds.build_round`, ``policy.schedule``,
:func:`~hetflow.scheduling.policies.rounds.check_decision`):

- **the cluster**: one pool per Gavel worker type holding all its workers, with links that never
  slow a gang (Gavel's servers have one GPU each and a gang of ``scale_factor`` workers runs at
  the measured consolidated throughput wherever it lands);
- **the jobs**: each active job as a :class:`~hetflow.scheduling.policies.base.JobInfo` - its
  measured throughput per worker type (``ideal_rates``), its remaining steps, Gavel's priority
  weight, the type it ran on last round as its assignment, and no restore cost (Gavel charges
  none for preemption);
- **the round**: every round is a boundary (Gavel re-decides every job every round), the lease
  is Gavel's round (360 s);
- **the answer**: each assignment's device type is the worker type the job runs on this round.

A policy the protocol cannot express is refused by name (:data:`UNEXPRESSED`).
"""

from __future__ import annotations

from typing import Any, Mapping

import numpy as np

from hetflow.scheduling.policies.base import Policy
from hetflow.scheduling.policies.capacity import Assignment, ClusterModel, FreeCapacity, PoolNode, Request, _Shape
from hetflow.scheduling.policies.rounds import DemandMix, build_round
from hetflow.sim.live_base import ProtocolAdapter

# Gavel's simulator (hetflow.sim.gavel.GavelSimulator, which imports this module): Any here, so
# that the two modules do not import each other
GavelSimulator = Any

FAST_GBPS = 1e9  # links inside a worker type's pool: never the bottleneck (Gavel's rule)
UNEXPRESSED: dict[str, str] = {}  # registry policy -> why Gavel's protocol cannot run it


def gavel_cluster_model(cluster: Mapping[str, int], types: list[str]) -> ClusterModel:
    """One pool per worker type with all its workers, uniformly and fully linked."""
    nodes, shapes = [], []
    for w in types:
        count = int(cluster[w])
        shapes.append(_Shape(np.full((count, count), FAST_GBPS), np.ones((count, count), dtype=bool), True))
        nodes.append(PoolNode(name=f"gavel-{w}", device_type=w, devices=tuple(range(count)),
                              shape=len(shapes) - 1))
    return ClusterModel(nodes, shapes, FAST_GBPS)


class GavelJobInfo:
    """One active Gavel job as a policy sees it (read-only, rebuilt every round)."""

    __slots__ = ("job_id", "job_type", "arrival_s", "request", "num_gpus", "weight", "preemptible",
                 "restore_s", "total_work", "done_work", "remaining_work", "assignment", "needs_restore",
                 "attained_s", "service_by_type", "ideal_rates", "best_rate", "gavel_id")

    def __init__(self, sim: GavelSimulator, j: int, assignment: Assignment | None) -> None:
        job = sim.active[j]
        self.gavel_id = j
        self.job_id = str(j)
        self.job_type = job.job_type
        self.arrival_s = job.arrival_s
        self.num_gpus = job.scale_factor
        self.request = Request(job.scale_factor)
        self.weight = job.priority_weight
        self.preemptible = True
        self.restore_s = 0.0
        self.total_work = float(job.total_steps)
        self.done_work = float(sim.steps_run[j])
        self.remaining_work = float(sim.remaining(j))
        self.assignment = assignment
        self.needs_restore = False
        spent = sim.type_time.get(j, {})
        self.service_by_type = dict(spent)
        self.attained_s = job.scale_factor * sum(spent.values())
        self.ideal_rates = {w: job.thr[w] for w in sim.types
                            if job.thr.get(w, 0.0) > 0 and job.scale_factor <= sim.cluster[w]}
        self.best_rate = max(self.ideal_rates.values(), default=0.0)


class LivePolicyRounds(ProtocolAdapter):
    """A registry policy answering Gavel's mechanism each round (module docstring)."""

    protocol = "gavel"
    unexpressed = UNEXPRESSED
    agnostic = False
    fifo = False

    def __init__(self, policy: Policy) -> None:
        super().__init__(policy)
        self._model: ClusterModel | None = None
        self._free: FreeCapacity | None = None
        self._last: dict[int, Assignment] = {}  # job -> where it ran last round

    def allocation(self, state) -> dict:  # Gavel's allocation machinery is not used
        raise NotImplementedError

    def _cluster(self, sim: GavelSimulator) -> tuple[ClusterModel, FreeCapacity]:
        if self._model is None:
            self._model = gavel_cluster_model(sim.cluster, list(sim.types))
            self._free = FreeCapacity(self._model)
        assert self._free is not None
        return self._model, self._free

    def pick(self, sim: GavelSimulator) -> dict[str, list[int]]:
        model, empty = self._cluster(sim)
        free = empty.fork()
        demand = DemandMix()
        running: dict[str, GavelJobInfo] = {}
        waiting: list[GavelJobInfo] = []
        for j in sim.active:
            last = self._last.get(j)
            info = GavelJobInfo(sim, j, last)
            demand.add(info.request)
            if last is not None:
                free.take(last)  # it holds these workers until the round boundary gives them back
                running[info.job_id] = info
            else:
                waiting.append(info)
        inputs = build_round(sim.now, True, model, free, running, waiting,
                             lambda job: (job.arrival_s, job.gavel_id), demand, sim.round_s, None)
        decision = self.decide_on(inputs)
        chosen: dict[str, list[int]] = {w: [] for w in sim.types}
        self._last = {}
        for jid, a in decision.items():
            j = int(jid)
            chosen[a.device_type].append(j)
            self._last[j] = a
        for ids in chosen.values():
            ids.sort()
        return chosen


def live_gavel_policy(name: str) -> LivePolicyRounds:
    """The registry policy ``name`` on Gavel's protocol."""
    from hetflow.scheduling.policies.registry import make_policy

    return LivePolicyRounds(make_policy(name))

