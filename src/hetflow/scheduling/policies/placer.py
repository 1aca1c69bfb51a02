"""Fast placement of one job inside the cluster, behind a small interface.

``Placer.place(free, request, device_types) -> Assignment | None`` picks devices for one job
on a scratch :class:`FreeCapacity`, without changing it. Policies call it many times per
decision, so these placers work on device counts per node with numpy, not on full topology
search:

- :class:`TopologyPlacer` (hetflow, max-min fairness): tries the device types in the order given;
  on one type, the node that fits the gang most tightly (best fit keeps large free islands
  whole), and inside a node whose links differ, the subset with the best group bandwidth; a gang
  spans nodes only when no single node can hold it. With a demand mix (``with_mix``) it scores
  shared-GPU and host-bound requests by Fragmentation Gradient Descent (Weng et al., ATC'23):
  the placement that least increases the expected unusable GPU share for the request sizes seen
  so far, its ties to the node whose CPU it brings closest to what the node's free GPUs need.
- :class:`BestFitPlacer`: best fit across all given types, no topology (the packing baseline).
- :class:`FirstFitPlacer`: the first node in cluster order with room, any type (what a
  heterogeneity-agnostic scheduler, and Ray by default, does).

Relation to the placement planner (:func:`hetflow.scheduling.planner.plan`): the planner places
one request on a full :class:`ClusterSnapshot` with tensor/pipeline/data-parallel layouts and
explains its choice; the live controller calls it inside the policy's choice (same nodes and
counts) for the final device pick and rank order (``LiveCluster.plan_ranks``), and so does the
simulator when given ``ranks=RankPlanner(...)`` (one class for both,
:mod:`hetflow.scheduling.rank_planner`; ``hetflow simulate --rank-planner``). These placers
are the simulator's fast path for plain gangs: on nodes whose links are uniform (NVSwitch, xGMI
full mesh) they choose the same node and an equivalent device set as the planner's best-fit rule;
on mixed-link nodes they use a greedy subset. :class:`PlannerPlacer` calls the planner itself and
can be injected in their place (``make_policy(name, placer=PlannerPlacer(snapshot))``) when
fidelity matters more than speed; tests check the two agree on the bottleneck bandwidth.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Mapping, Protocol, Sequence

import numpy as np

from hetflow.core.topology import Allocation, ClusterSnapshot
from hetflow.scheduling.policies.capacity import WHOLE, Assignment, ClusterModel, FreeCapacity, Request

_BIG = np.int64(1) << 60


class Placer(Protocol):
    def place(self, free: FreeCapacity, request: Request, device_types: Sequence[str]) -> Assignment | None:
        """Devices for ``request`` on one of ``device_types`` (in preference order), or None.

        Never changes ``free``; the caller takes the assignment when it accepts it."""


def _host_ok(free: FreeCapacity, idx: np.ndarray, request: Request) -> np.ndarray:
    if not request.uses_host:
        return np.ones(len(idx), dtype=bool)
    return (free.cpu[idx] >= request.cpu_milli) & (free.mem[idx] >= request.memory_mib)


def _assignment(model: ClusterModel, device_type: str, slots: Sequence[tuple[int, int]],
                request: Request, host: int | None) -> Assignment:
    slots = tuple(sorted(slots))
    return Assignment(
        device_type=device_type,
        slots=slots,
        milli=request.milli,
        host=host if request.uses_host else None,
        cpu_milli=request.cpu_milli if request.uses_host else 0,
        memory_mib=request.memory_mib if request.uses_host else 0,
        group_gbps=model.group_gbps(slots),
    )


def _whole_positions(free: FreeCapacity, node: int) -> list[int]:
    return [int(p) for p in np.flatnonzero(free.milli[node] == WHOLE)]


def _span(free: FreeCapacity, request: Request, device_type: str, order: str) -> Assignment | None:
    """A gang over several nodes of one type: fewest nodes (``order="most_free"``) or cluster
    order (``"index"``). Only for gangs without host resources."""
    if request.uses_host or request.fractional or request.num_gpus < 2:
        return None
    model = free.model
    if free.free_whole(device_type) < request.num_gpus:
        return None
    idx = model.nodes_of_type[device_type]
    counts = free.whole[idx]
    keep = counts > 0
    idx, counts = idx[keep], counts[keep]
    if order == "most_free":
        sort = np.lexsort((idx, -counts))
        idx, counts = idx[sort], counts[sort]
    need = request.num_gpus
    slots: list[tuple[int, int]] = []
    for node, count in zip(idx.tolist(), counts.tolist()):
        take = min(need, count)
        positions = _whole_positions(free, node)
        chosen, _ = model.shape_of(node).best_subset(positions, take)
        slots += [(node, p) for p in chosen]
        need -= take
        if need == 0:
            return _assignment(model, device_type, slots, request, None)
    return None


MAX_CLASSES = 16  # request classes FGD weighs (the most common; the tail adds little)


class TopologyPlacer:
    """Best fit per type, best links inside a node, FGD scoring when given a demand mix."""

    def __init__(self, mix: Mapping[tuple[int, int], float] | None = None,
                 host_mix: Mapping[tuple[int, int], tuple[float, float]] | None = None) -> None:
        self.mix = dict(mix) if mix else None
        self.host_mix = dict(host_mix) if host_mix else {}

    def with_mix(self, mix: Mapping[tuple[int, int], float],
                 host_mix: Mapping[tuple[int, int], tuple[float, float]] | None = None) -> "TopologyPlacer":
        """A placer scoring by fragmentation against ``mix`` ({(num_gpus, milli): weight}) with
        each class's mean (CPU milli, memory MiB) in ``host_mix``."""
        return TopologyPlacer(mix, host_mix)

    def place(self, free: FreeCapacity, request: Request, device_types: Sequence[str]) -> Assignment | None:
        if self.mix and (request.fractional or request.uses_host):
            return _fgd_place(free, request, device_types, self.mix, self.host_mix)
        for t in device_types:
            if not free.could_fit(request, t):
                continue
            a = self._on_type(free, request, t)
            if a is not None:
                return a
        return None

    def _on_type(self, free: FreeCapacity, request: Request, t: str) -> Assignment | None:
        model = free.model
        idx = model.nodes_of_type[t]
        if request.num_gpus == 0:
            return _best_host(free, request, idx, t)
        if request.fractional:
            return _best_fractional(free, request, idx, t)
        counts = free.whole[idx]
        ok = (counts >= request.num_gpus) & _host_ok(free, idx, request)
        if not ok.any():
            return _span(free, request, t, "most_free")
        cand, cand_counts = idx[ok], counts[ok]
        order = np.lexsort((cand, cand_counts))  # fewest free first (best fit), then index
        ideal = model.ideal_gbps(t, request.num_gpus)
        best: tuple[float, int, tuple[int, ...]] | None = None
        for node in cand[order].tolist():
            shape = model.shape_of(node)
            chosen, bw = shape.best_subset(_whole_positions(free, node), request.num_gpus)
            if best is None or bw > best[0]:
                best = (bw, node, chosen)
            if bw >= ideal or shape.uniform:
                break  # nothing later can beat the ideal; a uniform node's best is its only one
        assert best is not None
        _, node, chosen = best
        return _assignment(model, t, [(node, p) for p in chosen], request, node)


def _best_fractional(free: FreeCapacity, request: Request, idx: np.ndarray, t: str) -> Assignment | None:
    sub = free.milli[idx]
    ok = (sub >= request.milli) & _host_ok(free, idx, request)[:, None]
    if not ok.any():
        return None
    score = np.where(ok, sub - request.milli, _BIG)
    flat = int(np.argmin(score))
    row, pos = divmod(flat, sub.shape[1])
    node = int(idx[row])
    return _assignment(free.model, t, [(node, pos)], request, node)


def _best_host(free: FreeCapacity, request: Request, idx: np.ndarray, t: str) -> Assignment | None:
    ok = _host_ok(free, idx, request)
    if not ok.any():
        return None
    score = np.where(ok, free.cpu[idx] - request.cpu_milli, _BIG)
    node = int(idx[int(np.argmin(score))])
    return Assignment(t, (), request.milli, node, request.cpu_milli, request.memory_mib)


def _type_nodes(model: ClusterModel, device_types: Sequence[str]) -> np.ndarray:
    parts = [model.nodes_of_type[t] for t in device_types if t in model.nodes_of_type]
    return np.sort(np.concatenate(parts)) if parts else np.array([], dtype=np.int64)


class BestFitPlacer:
    """Best fit over all given types at once, ignoring links: the packing baseline."""

    def place(self, free: FreeCapacity, request: Request, device_types: Sequence[str]) -> Assignment | None:
        model = free.model
        idx = _type_nodes(model, device_types)
        if len(idx) == 0:
            return None
        if request.num_gpus == 0:
            a = _best_host(free, request, idx, "")
            return a and Assignment(model.nodes[a.host].device_type, (), a.milli, a.host,  # type: ignore[index]
                                    a.cpu_milli, a.memory_mib)
        if request.fractional:
            a = _best_fractional(free, request, idx, "")
            return a and _assignment(model, model.nodes[a.slots[0][0]].device_type, a.slots, request, a.host)
        counts = free.whole[idx]
        ok = (counts >= request.num_gpus) & _host_ok(free, idx, request)
        if ok.any():
            cand = idx[ok]
            node = int(cand[int(np.argmin(counts[ok]))])
            chosen = _whole_positions(free, node)[: request.num_gpus]
            return _assignment(model, model.nodes[node].device_type, [(node, p) for p in chosen], request, node)
        for t in device_types:
            a = _span(free, request, t, "most_free")
            if a is not None:
                return a
        return None


class FirstFitPlacer:
    """The first node in cluster order with room, whatever its type; lowest device indices."""

    def place(self, free: FreeCapacity, request: Request, device_types: Sequence[str]) -> Assignment | None:
        model = free.model
        idx = _type_nodes(model, device_types)
        if len(idx) == 0:
            return None
        host = _host_ok(free, idx, request)
        if request.num_gpus == 0:
            ok = host
        elif request.fractional:
            ok = (free.milli[idx] >= request.milli).any(axis=1) & host
        else:
            ok = (free.whole[idx] >= request.num_gpus) & host
        hits = np.flatnonzero(ok)
        if len(hits):
            node = int(idx[hits[0]])
            t = model.nodes[node].device_type
            if request.num_gpus == 0:
                return Assignment(t, (), request.milli, node, request.cpu_milli, request.memory_mib)
            if request.fractional:
                pos = int(np.flatnonzero(free.milli[node] >= request.milli)[0])
                return _assignment(model, t, [(node, pos)], request, node)
            chosen = _whole_positions(free, node)[: request.num_gpus]
            return _assignment(model, t, [(node, p) for p in chosen], request, node)
        # No single node: span the first type (in cluster order) with enough free devices.
        for t in [t for t in model.device_types if t in device_types]:
            a = _span(free, request, t, "index")
            if a is not None:
                return a
        return None


class PlannerPlacer:
    """Places whole-device gangs with the placement planner itself
    (:func:`hetflow.scheduling.planner.plan`), one device type at a time in the order given.

    Exact on the tensor-parallel bottleneck and slower than :class:`TopologyPlacer` (it builds a
    snapshot of what is taken for every call): use it to check the fast path, or when few jobs
    are placed. Shared-GPU and host-bound requests, which the planner does not model the same
    way, go to the fallback placer.
    """

    def __init__(self, snapshot: ClusterSnapshot, fallback: Placer | None = None) -> None:
        from hetflow.accelerators.catalog import default_catalog
        from hetflow.scheduling.planner import Planner

        self.snapshot = snapshot
        self.fallback = fallback or TopologyPlacer()
        self.planner = Planner(default_catalog())  # one for every call: its memo is shared

    def place(self, free: FreeCapacity, request: Request, device_types: Sequence[str]) -> Assignment | None:
        from hetflow.core.errors import Unschedulable
        from hetflow.core.request import PlacementRequest

        if request.fractional or request.uses_host:
            return self.fallback.place(free, request, device_types)
        model = free.model
        where = {(node.machine, dev): (i, p)
                 for i, node in enumerate(model.nodes) for p, dev in enumerate(node.devices)}
        busy = tuple(Allocation("taken", model.nodes[n].machine, model.nodes[n].devices[p])
                     for n, p in zip(*np.nonzero((free.milli >= 0) & (free.milli < WHOLE))))
        snap = replace(self.snapshot, allocations=busy)
        for t in device_types:
            if not free.could_fit(request, t):
                continue
            try:
                placement = self.planner.plan(snap, PlacementRequest(job_id="sim", count=request.num_gpus, model=t))
            except Unschedulable:
                continue
            slots = [where[(d.node, d.device)] for d in placement.devices]
            if all(model.nodes[n].device_type == t for n, _ in slots):
                return _assignment(model, t, slots, request, None)
        return None


# ------------------------------------------------------------------ fragmentation gradient descent


def _fgd_place(free: FreeCapacity, request: Request, device_types: Sequence[str],
               mix: Mapping[tuple[int, int], float],
               host_mix: Mapping[tuple[int, int], tuple[float, float]]) -> Assignment | None:
    """Choose the placement that least increases expected fragmentation (FGD).

    A node's fragmentation for a request class k = (g GPUs, m milli, its mean CPU and memory) is
    the free GPU share it cannot give to such a request: everything free when k does not fit the
    node at all (too few devices, no device with m free, or not enough CPU or memory left),
    otherwise the free share on devices too small for k (partial devices for whole-GPU
    classes). Expected fragmentation weighs the classes by how often they arrived (the
    ``MAX_CLASSES`` most common); the increase is scored as FGD scores it (an integer, so
    increases within about 40 milli-GPU tie).

    CPU balance breaks those ties: a node's balance is its free CPU minus what its free GPU share
    needs at the mix's mean CPU per GPU. A host-bound GPU request goes where its placement brings
    the balance closest to zero - a CPU-light request to a CPU-poor node, a CPU-heavy one to a
    CPU-rich node already in use (an unused node gains nothing by it, so whole nodes stay whole
    for large requests) - so that fewer GPUs end up free beside a host without the CPU. A
    request without GPUs goes first where the most CPU is spare (beside busy GPUs), then by
    score. Remaining ties go to the tighter fit, then the node index.
    """
    model = free.model
    idx = _type_nodes(model, device_types)
    if len(idx) == 0:
        return None
    classes = sorted(((w, g, m) for (g, m), w in mix.items() if g > 0 and w > 0), reverse=True)[:MAX_CLASSES]
    if not classes:
        return TopologyPlacer().place(free, request, device_types)
    weights = np.array([w for w, _, _ in classes], dtype=float)
    weights /= weights.sum()
    g_arr = np.array([g for _, g, _ in classes])
    m_arr = np.array([m for _, _, m in classes])
    cpu_k = np.array([host_mix.get((g, m), (0.0, 0.0))[0] for _, g, m in classes])
    mem_k = np.array([host_mix.get((g, m), (0.0, 0.0))[1] for _, g, m in classes])
    frac_k = m_arr < WHOLE
    thr_k = np.where(frac_k, m_arr, WHOLE)  # a device serves class k when its free share >= thr

    host = _host_ok(free, idx, request)
    milli = free.milli[idx]
    if request.num_gpus == 0:
        rows = np.flatnonzero(host)
        pos = np.full(len(rows), -1)
    elif request.fractional:
        rows, pos = np.nonzero((milli >= request.milli) & host[:, None])
    else:
        rows = np.flatnonzero((free.whole[idx] >= request.num_gpus) & host)
        if len(rows) == 0:
            return TopologyPlacer().place(free, request, device_types)  # spanning, no host
        pos = np.full(len(rows), -1)
    if len(rows) == 0:
        return None

    nodes, inv = np.unique(rows, return_inverse=True)  # node-level terms once per node
    fm = np.where(milli[nodes] > 0, milli[nodes], 0)  # (u, D)
    cpu, mem = free.cpu[idx[nodes]], free.mem[idx[nodes]]
    whole = free.whole[idx[nodes]]

    def small_share(x: np.ndarray) -> np.ndarray:  # (..., ) free shares -> (..., K) unusable part
        return ((x[..., None] > 0) & (x[..., None] < thr_k)) * x[..., None]

    def frag(partial, total, whole_, maxfree, cpu_, mem_):  # all (c, ...) -> (c,)
        gpu_ok = np.where(frac_k, maxfree[:, None] >= m_arr, whole_[:, None] >= g_arr)
        fits = gpu_ok & (cpu_[:, None] >= cpu_k) & (mem_[:, None] >= mem_k)
        return (np.where(fits, partial, total[:, None]) * weights).sum(axis=1)

    partial = small_share(fm).sum(axis=1)  # (u, K)
    total = fm.sum(axis=1)
    maxfree = fm.max(axis=1)
    before = frag(partial, total, whole, maxfree, cpu, mem)[inv]

    used_cpu = request.cpu_milli if request.uses_host else 0
    used_mem = request.memory_mib if request.uses_host else 0
    a_cpu, a_mem = cpu[inv] - used_cpu, mem[inv] - used_mem
    if request.num_gpus == 0:
        a_partial, a_total, a_whole, a_max = partial[inv], total[inv], whole[inv], maxfree[inv]
    elif request.fractional:
        f = fm[inv, pos]
        f_after = f - request.milli
        a_partial = partial[inv] - small_share(f) + small_share(f_after)
        a_total = total[inv] - request.milli
        a_whole = whole[inv] - (f == WHOLE)
        others = fm[inv].copy()
        others[np.arange(len(rows)), pos] = f_after
        a_max = others.max(axis=1)
    else:
        a_partial = partial[inv]  # whole devices are never "too small"
        a_total = total[inv] - request.num_gpus * WHOLE
        a_whole = whole[inv] - request.num_gpus
        part = np.where((fm > 0) & (fm < WHOLE), fm, 0).max(axis=1)[inv]
        a_max = np.where(a_whole > 0, WHOLE, part)
    after = frag(a_partial, a_total, a_whole, a_max, a_cpu, a_mem)
    # FGD's own score: 100 x sigmoid(-increase / 1000), truncated; one point is about 40 milli-GPU
    # of fragmentation near zero, and placements within a point tie
    score = np.floor(100.0 / (1.0 + np.exp((after - before) / 1000.0)))
    # CPU balance: the CPU a node has beyond what its free GPU share will need at the mix's CPU
    # per GPU. Among equal scores a host-bound request goes where it brings that balance nearest
    # zero (no GPU left without CPU, no CPU left beside busy GPUs); a request without GPUs goes
    # where the most CPU is spare, before its score
    gpu_share = weights * g_arr * np.where(frac_k, m_arr, WHOLE) / WHOLE
    per_gpu = float((weights * cpu_k).sum() / gpu_share.sum()) if gpu_share.sum() > 0 else 0.0
    surplus = a_cpu - a_total / WHOLE * per_gpu
    if request.num_gpus == 0:
        best = int(np.lexsort((rows, -score, -surplus))[0])
    else:
        was = cpu[inv] - total[inv] / WHOLE * per_gpu
        balance = np.abs(surplus) - np.abs(was) if request.uses_host else np.zeros(len(rows))
        # a node none of whose GPUs is in use yet gains nothing by its balance: it stays whole
        # for a large request (one that needs all of a CPU-rich node) while a used node ties
        unused = total[inv] == (milli[nodes] >= 0).sum(axis=1)[inv] * WHOLE
        balance = np.where(unused, np.maximum(balance, 0.0), balance)
        best = int(np.lexsort((rows, a_total, np.round(balance, 6), -score))[0])
    node = int(idx[rows[best]])
    t = model.nodes[node].device_type
    if request.num_gpus == 0:
        return Assignment(t, (), request.milli, node, request.cpu_milli, request.memory_mib)
    if request.fractional:
        return _assignment(model, t, [(node, int(pos[best]))], request, node)
    chosen, _ = model.shape_of(node).best_subset(_whole_positions(free, node), request.num_gpus)
    return _assignment(model, t, [(node, p) for p in chosen], request, node)
