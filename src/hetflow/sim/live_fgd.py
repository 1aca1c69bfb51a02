"""The live controller's policies on FGD's packing protocol: an adapter, not a second algorithm.

FGD's protocol (:mod:`hetflow.sim.fgd`) places pods one at a time, online, and a pod never
leaves. :class:`LivePacking` answers each pod with a policy of the registry
(:mod:`hetflow.scheduling.policies.registry`, the classes the controller runs) through the same
decision functions the controller and hetflow's own engine use
(:func:`~hetflow.scheduling.policies.rounds.build_round`, ``policy.schedule``,
:func:`~hetflow.scheduling.policies.rounds.check_decision`). For ``hetflow`` that is
``HetflowPolicy``'s placer: ``TopologyPlacer.with_mix`` scoring by Fragmentation Gradient
Descent, the code that places shared-GPU and host-bound jobs in the controller.

- **the cluster**: one pool per FGD node (its GPU model as the device type, its GPUs as the
  devices, its CPU milli and memory MiB as the host), with uniform links (the trace has none);
  the pools are ordered by the protocol's node rank, lowest first;
- **the pod**: a :class:`~hetflow.scheduling.policies.capacity.Request` (GPU count, per-GPU milli
  - a shared GPU when below 1000 -, CPU milli, memory MiB) of a job that may run on the GPU
  models of its ``gpu_spec`` (any model when empty, and any node for a pod without GPUs),
  at the same speed on each; its work is open-ended (no duration), it never leaves and is never
  preempted;
- **the decision**: every pod is an arrival between rounds (no round boundary: the pods already
  placed are pinned), the demand mix is FGD's typical pods (each class's weight, and its
  weighted mean CPU; the typical pods carry no memory, FGD's measure uses none);
- **the answer**: the assignment's node and GPU positions, or none - the pod fails for good.

**Ties.** The protocol sends ties to the lowest node rank. The live placer breaks its ties by
node index in the cluster model (after its own rules: for FGD scoring the least fragmentation
increase as FGD's integer score, then the CPU balance, then the tightest fit, then the index; a
pod without GPUs takes the most spare CPU first; a shared pod takes the lowest GPU position of
equal choices); because the pools are built in node-rank order, its lowest index is the lowest
rank. Nothing here re-scores or re-orders a placement.

A registry policy the protocol cannot express is refused by name (:data:`UNEXPRESSED`).
"""

from __future__ import annotations

import math
from typing import Mapping, Sequence

import numpy as np

from hetflow.scheduling.policies.capacity import WHOLE, Assignment, ClusterModel, FreeCapacity, PoolNode, Request, _Shape
from hetflow.scheduling.policies.rounds import DemandMix, build_round
from hetflow.sim.live_base import ProtocolAdapter

LEASE_S = 360.0  # the view's lease: no round ever ends here (no pod is decided twice)
UNIFORM_GBPS = 16.0  # links between a node's GPUs: not in the trace, never used by the protocol
# registry policy -> why FGD's protocol cannot run it
UNEXPRESSED: dict[str, str] = {
    "srtf": "it orders jobs by remaining work, and FGD's pods have none (they never leave): it would be "
            "fifo's first fit under another name",
    "las": "it orders jobs by attained service, and FGD's pods are decided once, on arrival, before they "
           "attain any: it would be fifo's first fit under another name",
    "max_min_fairness": "it divides device time between jobs over rounds, and FGD's pods never leave and no "
                        "round ends: its shares would never be recomputed and only its best-fit placer would run",
}


def fgd_cluster_model(nodes: Sequence, ranks: Sequence[int]) -> tuple[ClusterModel, list[int]]:
    """FGD's nodes (:class:`~hetflow.sim.fgd.FgdNode`) as pools in ``ranks`` order (lowest
    first). Returns the model and, per pool, the index of its node in ``nodes``."""
    order = sorted(range(len(nodes)), key=lambda i: (ranks[i], i))
    shapes: list[_Shape] = []
    shape_of: dict[int, int] = {}
    pools = []
    for i in order:
        n = nodes[i]
        if n.gpus not in shape_of:
            shape_of[n.gpus] = len(shapes)
            shapes.append(_Shape(np.full((n.gpus, n.gpus), UNIFORM_GBPS), np.zeros((n.gpus, n.gpus), dtype=bool), True))
        pools.append(PoolNode(name=n.name, device_type=n.model, devices=tuple(range(n.gpus)), cpu_milli=n.cpu_milli,
                              memory_mib=n.memory_mib, shape=shape_of[n.gpus]))
    return ClusterModel(pools, shapes, UNIFORM_GBPS), order


def pod_request(pod) -> Request:
    """An FGD pod (:class:`~hetflow.sim.fgd.FgdPod`) as the policy's request."""
    if pod.num_gpu == 0:
        return Request(0, WHOLE, pod.cpu_milli, pod.memory_mib)
    return Request(pod.num_gpu, pod.gpu_milli, pod.cpu_milli, pod.memory_mib)


def typical_demand(typical: Sequence) -> DemandMix:
    """FGD's typical pods (:class:`~hetflow.sim.fgd.TypicalPod`) as the policy's demand mix:
    per request class (GPU count, milli), the summed weight and the weighted CPU."""
    demand = DemandMix()
    for t in typical:
        key = (t.num_gpu, t.gpu_milli if t.num_gpu else WHOLE)
        demand.counts[key] = demand.counts.get(key, 0.0) + t.weight
        c, m = demand.host_sums.get(key, (0.0, 0.0))
        demand.host_sums[key] = (c + t.weight * t.cpu_milli, m)
    return demand


class FgdJobInfo:
    """One pod as a policy sees it (read-only)."""

    __slots__ = ("job_id", "job_type", "arrival_s", "request", "num_gpus", "weight", "preemptible",
                 "restore_s", "total_work", "done_work", "remaining_work", "assignment", "needs_restore",
                 "attained_s", "service_by_type", "ideal_rates", "best_rate")

    def __init__(self, step: int, request: Request, types: Mapping[str, float]) -> None:
        self.job_id = str(step)
        self.job_type = "pod"
        self.arrival_s = float(step)
        self.request = request
        self.num_gpus = request.num_gpus
        self.weight = 1.0
        self.preemptible = False  # a pod never leaves
        self.restore_s = 0.0
        self.total_work = math.inf  # no duration: open-ended
        self.done_work = 0.0
        self.remaining_work = math.inf
        self.assignment: Assignment | None = None
        self.needs_restore = False
        self.attained_s = 0.0
        self.service_by_type: dict[str, float] = {}
        self.ideal_rates = dict(types)
        self.best_rate = max(self.ideal_rates.values(), default=0.0)


class LivePacking(ProtocolAdapter):
    """A registry policy answering FGD's protocol one pod at a time (module docstring).

    ``start(nodes, ranks, typical)`` for a run, then ``place(step, pod)`` per pod in arrival
    order: ``(node index in nodes, GPU indices)`` or None, already bound here."""

    protocol = "fgd"
    unexpressed = UNEXPRESSED


    def start(self, nodes: Sequence, ranks: Sequence[int], typical: Sequence) -> None:
        self.model, self._node_of = fgd_cluster_model(nodes, ranks)
        self.free = FreeCapacity(self.model)
        self.demand = typical_demand(typical)
        self.running: dict[str, FgdJobInfo] = {}
        m = self.model
        self._types: dict[tuple, dict[str, float]] = {}
        self._all = {t: 1.0 for t in m.device_types}
        self._largest = m.largest_node_by_type

    def _rates(self, pod, request: Request) -> dict[str, float]:
        """The GPU models the pod may run on (equal speed), where a node could hold it."""
        key = (pod.gpu_spec, request.num_gpus)
        hit = self._types.get(key)
        if hit is None:
            if request.num_gpus == 0:
                hit = dict(self._all)  # no GPU: any node (the protocol ignores gpu_spec then)
            else:
                spec = set(pod.gpu_spec.split("|")) if pod.gpu_spec else None
                hit = {t: 1.0 for t in self.model.device_types
                       if (spec is None or t in spec) and self._largest[t] >= request.num_gpus}
            self._types[key] = hit
        return hit

    def place(self, step: int, pod) -> tuple[int, tuple[int, ...]] | None:
        request = pod_request(pod)
        job = FgdJobInfo(step, request, self._rates(pod, request))
        inputs = build_round(float(step), False, self.model, self.free, self.running, [job],
                             lambda j: j.arrival_s, self.demand, LEASE_S, None)
        a = self.decide_on(inputs).get(job.job_id)
        if a is None:
            return None
        nodes = {n for n, _ in a.slots} | ({a.host} if a.host is not None else set())
        assert len(nodes) == 1, f"pod {step}: the protocol places a pod on one node, got {a}"
        self.free.take(a)
        job.assignment = a
        self.running[job.job_id] = job
        node = nodes.pop()
        return self._node_of[node], tuple(sorted(p for _, p in a.slots))


def live_fgd_policy(name: str) -> LivePacking:
    """The registry policy ``name`` on FGD's protocol."""
    from hetflow.scheduling.policies.registry import make_policy

    LivePacking.refuse(name)  # before anything is built
    return LivePacking(make_policy(name))
