"""The live controller's policies on Sia's protocol: an adapter, not a second algorithm.

Sia's mechanism (:mod:`hetflow.sim.sia`) asks at the end of every round which GPUs each active
job gets next round. :class:`LiveSiaRounds` answers with a policy of the registry
(:mod:`hetflow.scheduling.policies.registry`, the classes the controller runs) through the
decision functions the controller and hetflow's own engine use
(:func:`~hetflow.scheduling.policies.rounds.build_round`, ``policy.schedule``,
:func:`~hetflow.scheduling.policies.rounds.check_decision`):

- **the cluster**: one pool per Sia node (6 x 4 T4, 2 x 8 A100, 3 x 8 RTX 2080Ti), links inside
  a node faster than between nodes, so that the placer keeps a gang on one node when it can;
- **the jobs**: each active job as a :class:`~hetflow.scheduling.policies.base.JobInfo` whose
  work is counted in seconds on its fastest GPU type: ``remaining_work`` is the time it still
  needs there (Sia's job model: every remaining epoch at its batch size's statistical
  efficiency, rounding aside), ``ideal_rates[t]`` = remaining work / time left on type ``t``
  at the packed placement (so ``best_rate`` is 1), ``restore_s`` the model's restart time
  (Sia charges it on every start, the first one too, so a job not running ``needs_restore``),
  the allocation it holds as its assignment;
- **the speed of a placement** (``rate_of``): the same quotient at the placement's GPUs per
  node, from Sia's profiles (0 where the profiles have no such placement), which the policy's
  placer uses to refuse gangs split over slow links;
- **the round**: for preemptive policies every round is a boundary (each job is decided
  again), the lease is the round (60 s); the others keep running jobs where they are and
  place the waiting ones;
- **the answer**: each assignment's type and nodes become Sia's allocation (a node index per
  GPU); an unchanged assignment is an unchanged allocation (no restart).

A policy the protocol cannot express is refused by name (:data:`UNEXPRESSED`).
"""

from __future__ import annotations

import math
from typing import Mapping, Sequence

import numpy as np

from hetflow.scheduling.policies.base import Policy
from hetflow.scheduling.policies.capacity import Assignment, ClusterModel, FreeCapacity, PoolNode, Request, _Shape
from hetflow.scheduling.policies.rounds import DemandMix, build_round
from hetflow.sim.live_base import ProtocolAdapter
from hetflow.scheduling.elastic import elastic_sizes
from hetflow.sim.sia import (DEFAULT_ROUND_S, Allocation, RoundPolicy, SiaJob, SiaJobSpec, SiaProfiles, SiaRun,
                              SiaSimulator, packed_placement, placement_of)

NODE_GBPS = 100.0  # links inside a node (the profiles price every placement; this only orders choices)
NETWORK_GBPS = 12.5  # between nodes
UNEXPRESSED: dict[str, str] = {}  # registry policy -> why Sia's protocol cannot run it


def declared_size(sim: SiaSimulator, job: SiaJob, active: int) -> int:
    """The size a job's work is counted at and that it asks for first: a rigid or scale-gpus
    job's ``num_replicas``. An adaptive job has none (Sia's simulator ignores the column for
    it): its fair share of the cluster with ``active`` jobs - the GPUs over the jobs, rounded
    down to a power of two, at most the largest GPU type's count (24 here, with one or two jobs
    active) - and the next power of two below while no GPU type runs the job at that size (a
    job with no size in view would wait every round)."""
    if job.kind != "adaptive":
        return job.spec.num_replicas
    share = max(1, sum(sim.capacity.values()) // max(active, 1))
    n = min(1 << (share.bit_length() - 1), max(sim.capacity.values()))
    while n > 1 and not any(n <= sim.capacity[t] and math.isfinite(
            job.remaining_s(t, packed_placement(n, sim.per_node[t]))) for t in sim.types):
        n = 1 << ((n - 1).bit_length() - 1)  # the next power of two below
    return n


def sia_cluster_model(sim: SiaSimulator) -> tuple[ClusterModel, list[tuple[str, int]]]:
    """One pool per node, in Sia's cluster order; returns the model and each pool's (type, node)."""
    nodes, shapes, where = [], [], []
    shape_of: dict[int, int] = {}
    for t in sim.types:
        per = sim.per_node[t]
        if per not in shape_of:
            shape_of[per] = len(shapes)
            shapes.append(_Shape(np.full((per, per), NODE_GBPS), np.ones((per, per), dtype=bool), True))
        for i in range(sim.nodes[t]):
            nodes.append(PoolNode(name=f"{t}-{i}", device_type=t, devices=tuple(range(per)), shape=shape_of[per]))
            where.append((t, i))
    return ClusterModel(nodes, shapes, NETWORK_GBPS), where


class SiaJobInfo:
    """One active Sia job as a policy sees it (read-only, rebuilt every round)."""

    __slots__ = ("job_id", "job_type", "arrival_s", "request", "num_gpus", "weight", "preemptible",
                 "restore_s", "total_work", "done_work", "remaining_work", "assignment", "needs_restore",
                 "attained_s", "service_by_type", "ideal_rates", "best_rate", "index", "_job", "_left",
                 "sizes", "size_rates")

    def __init__(self, sim: SiaSimulator, index: int, job: SiaJob, total: float,
                 assignment: Assignment | None, declared: int) -> None:
        self._job = job
        self.index = index
        self.job_id = job.name
        self.job_type = job.spec.app
        self.arrival_s = job.submission_time
        self.num_gpus = declared
        self.request = Request(self.num_gpus)
        self.weight = 1.0
        self.preemptible = True
        first = next(iter(sim.types))
        self.restore_s = float(job.app(job.gpu_type or first).rescale_time)
        self.assignment = assignment
        self.needs_restore = assignment is None
        self.attained_s = job.attained_service
        self.service_by_type = dict(job.service_by_type)
        if job.resizable:  # at its declared size, packed
            left = {t: job.remaining_s(t, packed_placement(self.num_gpus, sim.per_node[t])) for t in sim.types
                    if self.num_gpus <= sim.capacity[t]}
        else:
            left = {t: job.remaining_s(t, p) for t, p in sim.runnable_types(job).items()}
        left = {t: s for t, s in left.items() if math.isfinite(s)}
        self._left = left
        self.remaining_work = min(left.values(), default=0.0)
        self.total_work = max(total, self.remaining_work)
        self.done_work = self.total_work - self.remaining_work
        self.ideal_rates = {t: (self.remaining_work / s if s > 0 else 1.0) for t, s in left.items()}
        self.best_rate = max(self.ideal_rates.values(), default=0.0)
        self.size_rates: dict[int, dict[str, float]] = {self.num_gpus: self.ideal_rates}
        if job.resizable and self.remaining_work > 0:
            for n in elastic_sizes(1, max(sim.capacity.values()), self.num_gpus):
                at = {}
                for t in sim.types:
                    if n <= sim.capacity[t]:
                        s = job.remaining_s(t, packed_placement(n, sim.per_node[t]))
                        if math.isfinite(s) and s > 0:
                            at[t] = self.remaining_work / s
                if at:
                    self.size_rates[n] = at
        self.sizes = tuple(sorted(self.size_rates))

    def rates_at(self, n: int) -> Mapping[str, float]:
        """Rate on each GPU type at ``n`` GPUs (packed placement); empty for other sizes."""
        return self.size_rates.get(n, {})

    def rate_on(self, gpu_type: str, placement: tuple[int, ...]) -> float:
        s = self._job.remaining_s(gpu_type, placement)
        if not math.isfinite(s):
            return 0.0
        return self.remaining_work / s if s > 0 else 1.0


class LiveSiaRounds(ProtocolAdapter):
    """A registry policy answering Sia's mechanism each round (module docstring)."""

    protocol = "sia"
    unexpressed = UNEXPRESSED

    def __init__(self, policy: Policy) -> None:
        super().__init__(policy)
        self._model: ClusterModel | None = None
        self._where: list[tuple[str, int]] = []
        self._index: dict[tuple[str, int], int] = {}
        self._last: dict[str, Assignment] = {}
        self._total: dict[str, float] = {}
        self._order: dict[str, int] = {}

    def _cluster(self, sim: SiaSimulator) -> ClusterModel:
        if self._model is None:
            self._model, self._where = sia_cluster_model(sim)
            self._index = {w: i for i, w in enumerate(self._where)}
            self._order = {j.name: i for i, j in enumerate(sim.jobs)}
        return self._model

    def decide(self, sim: SiaSimulator) -> dict[str, Allocation]:
        model = self._cluster(sim)
        free = FreeCapacity(model)
        demand = DemandMix()
        running: dict[str, SiaJobInfo] = {}
        waiting: list[SiaJobInfo] = []
        infos: dict[str, SiaJobInfo] = {}
        active = sim.active()
        for job in active:
            last = self._last.get(job.name)
            info = SiaJobInfo(sim, self._order[job.name], job, self._total.get(job.name, 0.0), last,
                              declared_size(sim, job, len(active)))
            self._total.setdefault(job.name, info.total_work)  # its work when first seen
            if not info.ideal_rates:
                continue  # no GPU type of the cluster can run it (its gang is larger than every type)
            infos[info.job_id] = info
            demand.add(info.request)
            if last is not None:
                free.take(last)
                running[info.job_id] = info
            else:
                waiting.append(info)

        def rate_of(job, a: Assignment) -> float:
            return job.rate_on(a.device_type, self._placement(a)[1])

        # every round is a boundary for preemptive policies; the others only place waiting jobs
        inputs = build_round(sim.now, bool(getattr(self.policy, "preemptive", True)), model, free, running, waiting,
                             lambda j: (j.arrival_s, j.index), demand, sim.round_s, rate_of)
        decision = self.decide_on(inputs)
        self._last = {jid: info.assignment for jid, info in running.items() if jid in inputs.view.pinned}
        self._last.update(decision)
        return {jid: (a.device_type, self._placement(a)[0]) for jid, a in self._last.items()}

    def _placement(self, a: Assignment) -> tuple[tuple[int, ...], tuple[int, ...]]:
        """(node index per GPU, sorted; GPUs per node) of an assignment."""
        nodes = tuple(sorted(self._where[n][1] for n, _ in a.slots))
        return nodes, placement_of(nodes)


def live_sia_policy(name: str) -> LiveSiaRounds:
    """The registry policy ``name`` on Sia's protocol."""
    from hetflow.scheduling.policies.registry import make_policy

    return LiveSiaRounds(make_policy(name))


def simulate_sia(specs: Sequence[SiaJobSpec], profiles: SiaProfiles, policy: str | RoundPolicy,
                 round_s: float = DEFAULT_ROUND_S, default_kind: str = "rigid") -> SiaRun:
    """Sia's protocol on ``specs`` with a registry policy by name (through the adapter) or a
    protocol policy object (e.g. :class:`~hetflow.sim.sia.ReplayPolicy`); jobs without a
    category run as ``default_kind``."""
    pol = live_sia_policy(policy) if isinstance(policy, str) else policy
    return SiaSimulator(specs, profiles, pol, round_s=round_s, default_kind=default_kind).run()
