"""Placement planner: one job's request + a cluster snapshot -> which device each rank gets.

``plan(snapshot, request) -> Placement`` or raises :class:`Unschedulable` naming which
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
   state is the multiset of what each group still needs (see ``_SpanningSolver``). That search
   has a work budget (``SPANNING_SEARCH_BUDGET``); if it is ever exhausted the level is treated
   as infeasible and the placement's notes say optimality was not proven.
2. pipeline neighbours: the stages of one data-parallel replica go on one node when a node has
   room for all of them, choosing groups whose aligned devices are well connected (heuristic).
3. fragmentation: ``pack`` takes partly used nodes first (best fit: fewest free devices), leaves
   whole free nodes free, and inside a node keeps the largest fast islands of the remaining free
   devices whole; ``spread`` puts replicas on the emptiest nodes with the fewest of this job's
   groups (heuristic).

Tensor-parallel groups stay inside one node whenever the optimal level allows it.
"""

from __future__ import annotations

import dataclasses
import itertools
import math
from dataclasses import dataclass, field
from typing import Iterator, Sequence

from hetflow.accelerators.catalog import model_matcher
from hetflow.core.errors import Unschedulable
from hetflow.core.placement import DeviceRef, Placement
from hetflow.core.request import ParallelLayout, PlacementRequest, Strategy
from hetflow.core.topology import Allocation, ClusterSnapshot, NodeTopology, Vendor
from hetflow.core.units import format_bytes

SPANNING_SEARCH_BUDGET = 200_000  # transitions of the exact cross-node search before giving up
SELECTION_CANDIDATES = 64  # node-local choices scored for the secondary objectives
EXACT_SEARCH_MAX_DEVICES = 16  # usable devices per node the exact cross-node search handles
_MODEL_CACHE_LIMIT = 4096  # distinct topologies (and node objects) remembered
_MEMO_LIMIT = 200_000  # entries per memo table before it is dropped (big partitioned nodes)

INF = math.inf
UNKNOWN_MODEL = "unknown model"


# ============================================================================================
# Per-topology model: bit masks over a node's devices, shared by nodes of identical topology
# ============================================================================================


def _bits(mask: int) -> Iterator[int]:
    while mask:
        low = mask & -mask
        yield low.bit_length() - 1
        mask ^= low


def _popcount(mask: int) -> int:
    return mask.bit_count()


class _NodeModel:
    """A node's devices as bit positions, their pairwise bandwidth, and memoised searches.

    Everything here depends only on the topology (devices and links), not on the node's name
    or allocations, so one model serves every node built from the same template.
    """

    def __init__(self, node: NodeTopology) -> None:
        self.devices = tuple(sorted(node.devices, key=lambda d: d.index))
        self.indices = tuple(d.index for d in self.devices)
        n = len(self.indices)
        self.bw = [[INF] * n for _ in range(n)]
        self.label = [[""] * n for _ in range(n)]
        for i in range(n):
            for j in range(i + 1, n):
                a, b = self.indices[i], self.indices[j]
                value = node.bandwidth(a, b)
                link = node.link(a, b)
                self.bw[i][j] = self.bw[j][i] = value
                self.label[i][j] = self.label[j][i] = link.label if link else "no link"
        self.levels = tuple(sorted({self.bw[i][j] for i in range(n) for j in range(i + 1, n)}))
        self.uniform = len(self.levels) <= 1  # every pair alike: any choice is as good
        self.bit_of = {index: bit for bit, index in enumerate(self.indices)}
        self._adjacency: dict[float, tuple[int, ...]] = {}
        self._groups_memo: dict[tuple[float, int], dict[int, int]] = {}
        self._clique_memo: dict[float, dict[int, int]] = {}
        self._profile_memo: dict[tuple[float, int, int], dict[int, dict[tuple[int, ...], tuple[int, ...]]]] = {}
        self.static_masks: dict[tuple, tuple[int, dict[str, int], dict[str, set[str]]]] = {}
        self.kind_masks: dict[tuple[Vendor, str], int] = {}  # (vendor, model) -> its devices
        for bit, d in enumerate(self.devices):
            kind = (d.vendor, d.model or UNKNOWN_MODEL)
            self.kind_masks[kind] = self.kind_masks.get(kind, 0) | 1 << bit

    @staticmethod
    def key(node: NodeTopology) -> tuple:
        devs = tuple(
            (d.index, d.vendor, d.model, d.arch, d.memory_bytes) for d in node.devices
        )
        idx = sorted(d.index for d in node.devices)
        links = tuple(
            (node.bandwidth(a, b), (node.link(a, b).label if node.link(a, b) else None))
            for i, a in enumerate(idx) for b in idx[i + 1:]
        )
        return devs, links

    # --- adjacency and cliques ---------------------------------------------------------

    def adjacency(self, t: float) -> tuple[int, ...]:
        """``adj[i]``: mask of devices whose link to i has bandwidth >= t."""
        adj = self._adjacency.get(t)
        if adj is None:
            n = len(self.indices)
            adj = tuple(
                sum(1 << j for j in range(n) if j != i and self.bw[i][j] >= t) for i in range(n)
            )
            self._adjacency[t] = adj
        return adj

    def is_clique(self, mask: int, t: float) -> bool:
        adj = self.adjacency(t)
        return all((adj[i] | (1 << i)) & mask == mask for i in _bits(mask))

    def cliques_with(self, v: int, within: int, t: float, size: int) -> Iterator[int]:
        """Cliques of exactly ``size`` devices at level t containing v, inside ``within``."""
        adj = self.adjacency(t)

        def extend(clique: int, cand: int, need: int) -> Iterator[int]:
            if need == 0:
                yield clique
                return
            while cand and _popcount(cand) >= need:
                low = cand & -cand
                u = low.bit_length() - 1
                cand ^= low
                yield from extend(clique | low, cand & adj[u], need - 1)

        yield from extend(1 << v, adj[v] & within & ~(1 << v), size - 1)

    def max_groups(self, mask: int, t: float, size: int) -> int:
        """Most disjoint cliques of ``size`` devices at level t inside ``mask`` (exact)."""
        if size == 1:
            return _popcount(mask)
        memo = self._groups_memo.setdefault((t, size), {})
        if len(memo) > _MEMO_LIMIT:
            memo.clear()
        return self._max_groups(mask, t, size, memo)

    def _max_groups(self, mask: int, t: float, size: int, memo: dict[int, int]) -> int:
        hit = memo.get(mask)
        if hit is not None:
            return hit
        n = _popcount(mask)
        upper = n // size
        if upper == 0:
            result = 0
        elif self.is_clique(mask, t):
            result = upper
        else:
            low = mask & -mask
            v = low.bit_length() - 1
            result = self._max_groups(mask ^ low, t, size, memo)  # v stays unused
            if result < upper:
                for clique in self.cliques_with(v, mask, t, size):
                    result = max(result, 1 + self._max_groups(mask & ~clique, t, size, memo))
                    if result == upper:
                        break
        memo[mask] = result
        return result

    def max_clique(self, mask: int, t: float) -> int:
        """Size of the largest clique at level t inside ``mask``."""
        memo = self._clique_memo.setdefault(t, {})
        if len(memo) > _MEMO_LIMIT:
            memo.clear()
        hit = memo.get(mask)
        if hit is not None:
            return hit
        if mask == 0:
            result = 0
        else:
            low = mask & -mask
            v = low.bit_length() - 1
            adj = self.adjacency(t)
            with_v = 1 + self.max_clique(adj[v] & mask, t)
            result = with_v if with_v >= _popcount(mask) - 1 else max(
                with_v, self.max_clique(mask ^ low, t)
            )
        memo[mask] = result
        return result

    def islands(self, mask: int) -> tuple[int, ...]:
        """How whole the fast islands of ``mask`` are: the largest clique at each bandwidth
        level, fastest level first (compared lexicographically; larger is better)."""
        return tuple(self.max_clique(mask, t) for t in reversed(self.levels))

    # --- profiles for the cross-node search --------------------------------------------

    def profiles(self, mask: int, t: float, size_cap: int, count_cap: int) -> dict[tuple[int, ...], tuple[int, ...]]:
        """Every multiset of sizes of disjoint cliques at level t inside ``mask`` (pieces of at
        most ``size_cap`` devices, at most ``count_cap`` pieces), sizes in descending order,
        each with one witness: the pieces' masks in the same order."""
        memo = self._profile_memo.setdefault((t, size_cap, count_cap), {})
        if len(memo) > _MEMO_LIMIT // 10:
            memo.clear()
        return self._profiles(mask, t, size_cap, count_cap, memo)

    def _profiles(self, mask: int, t: float, size_cap: int, count_cap: int,
                  memo: dict[int, dict[tuple[int, ...], tuple[int, ...]]]) -> dict[tuple[int, ...], tuple[int, ...]]:
        hit = memo.get(mask)
        if hit is not None:
            return hit
        if mask == 0:
            return {(): ()}
        low = mask & -mask
        v = low.bit_length() - 1
        result = dict(self._profiles(mask ^ low, t, size_cap, count_cap, memo))
        for size in range(1, size_cap + 1):
            for clique in self.cliques_with(v, mask, t, size):
                for prof, parts in self._profiles(mask & ~clique, t, size_cap, count_cap, memo).items():
                    if len(prof) >= count_cap:
                        continue
                    pos = next((k for k, p in enumerate(prof) if p < size), len(prof))
                    new = prof[:pos] + (size,) + prof[pos:]
                    if new not in result:
                        result[new] = parts[:pos] + (clique,) + parts[pos:]
        memo[mask] = result
        return result


_MODELS: dict[tuple, _NodeModel] = {}
_MODEL_OF: dict[int, tuple[NodeTopology, _NodeModel]] = {}


def _model(node: NodeTopology) -> _NodeModel:
    """The shared model of a node's topology (cached by object identity, then by content)."""
    hit = _MODEL_OF.get(id(node))
    if hit is not None and hit[0] is node:
        return hit[1]
    if len(_MODEL_OF) > _MODEL_CACHE_LIMIT:
        _MODEL_OF.clear()
    if len(_MODELS) > _MODEL_CACHE_LIMIT:
        _MODELS.clear()
    key = _NodeModel.key(node)
    model = _MODELS.get(key)
    if model is None:
        model = _MODELS[key] = _NodeModel(node)
    _MODEL_OF[id(node)] = (node, model)  # holding the node keeps its id from being reused
    return model


# ============================================================================================
# Which devices are usable, and why the others are not
# ============================================================================================

REASON_HINTS = {
    "no accelerator": "use a cluster with accelerators",
    "vendor": "drop or change --vendor",
    "model": "drop or change --model",
    "arch": "drop or change --arch",
    "min memory": "lower --min-memory",
    "memory": "ask for less memory per device (--mem) or split the model over more devices (larger --tp/--pp)",
    "memory unknown": "record the devices' memory (nvidia-smi -q / amd-smi output) or omit --mem",
    "occupied": "wait for running jobs to end, or share devices by memory (--share)",
    "free memory": "ask for less memory per device (--mem) or wait for jobs sharing the devices to end",
}


@dataclass
class _Candidate:
    """A node with at least one usable device, during one planning call."""

    pos: int  # position in snapshot.nodes (the tie-break order after the name)
    node: NodeTopology
    model: _NodeModel
    usable: int  # mask of usable devices
    untouched: bool  # no allocation of any job on any of its devices
    free_count: int = 0  # usable devices, for best fit
    taken: int = 0  # mask taken by this job so far
    groups_here: int = 0


@dataclass
class _Eligibility:
    candidates: list[_Candidate]
    excluded: dict[str, dict[str, int]]  # node -> reason -> devices
    details: dict[str, dict[str, set[str]]] = field(default_factory=dict)  # node -> reason -> facts
    total_usable: int = 0


def _static_key(request: PlacementRequest) -> tuple:
    return (
        request.vendor, request.model or None,
        (request.arch or "").lower() or None,
        request.min_memory_bytes, request.memory_bytes, request.memory_bytes is not None,
    )


def _static_mask(model: _NodeModel, request: PlacementRequest) -> tuple[int, dict[str, int], dict[str, set[str]]]:
    """Devices passing the constraints that depend only on the device, not on allocations;
    the count of the others per reason, and the facts behind the reasons ("80.0 GiB")."""
    key = _static_key(request)
    hit = model.static_masks.get(key)
    if hit is not None:
        return hit
    vendor, model_text, arch, min_mem, need_total, wants_memory = key
    model_name = model_matcher(model_text)  # the catalog's one model-name rule
    mask = 0
    reasons: dict[str, int] = {}
    details: dict[str, set[str]] = {}
    for bit, d in enumerate(model.devices):
        reason = None
        if vendor is None and d.vendor is Vendor.CPU:
            reason = "no accelerator"
        elif vendor is not None and d.vendor is not vendor:
            reason, fact = "vendor", d.vendor.value
        elif model_name is not None and not model_name(d.model):
            reason, fact = "model", d.model or "unknown model"
        elif arch is not None and (d.arch or "").lower() != arch:
            reason, fact = "arch", d.arch or "unknown arch"
        elif (min_mem is not None or wants_memory) and d.memory_bytes is None:
            reason = "memory unknown"
        elif min_mem is not None and d.memory_bytes < min_mem:
            reason, fact = "min memory", format_bytes(d.memory_bytes)
        elif need_total is not None and d.memory_bytes < need_total:
            reason, fact = "memory", format_bytes(d.memory_bytes)
        if reason is None:
            mask |= 1 << bit
            continue
        reasons[reason] = reasons.get(reason, 0) + 1
        if reason in ("vendor", "model", "arch", "min memory", "memory"):
            details.setdefault(reason, set()).add(fact)
    model.static_masks[key] = (mask, reasons, details)
    return mask, reasons, details


def _allocation_index(snapshot: ClusterSnapshot) -> dict[str, dict[int, list[Allocation]]]:
    index: dict[str, dict[int, list[Allocation]]] = {}
    for a in snapshot.allocations:
        index.setdefault(a.node, {}).setdefault(a.device, []).append(a)
    return index


def _eligibility(snapshot: ClusterSnapshot, request: PlacementRequest) -> _Eligibility:
    allocs = _allocation_index(snapshot)
    result = _Eligibility(candidates=[], excluded={})
    for pos, node in enumerate(snapshot.nodes):
        model = _model(node)
        mask, static_reasons, static_details = _static_mask(model, request)
        reasons = dict(static_reasons)
        if static_details:
            result.details[node.name] = static_details  # shared, read-only
        if not model.devices:
            reasons["no accelerator"] = 0
        on_node = allocs.get(node.name)
        if on_node:
            for index, held in on_node.items():
                bit = model.bit_of.get(index)
                if bit is None or not mask >> bit & 1:
                    continue
                reason = _blocked(model.devices[bit].memory_bytes, held, request)
                if reason:
                    mask &= ~(1 << bit)
                    reasons[reason] = reasons.get(reason, 0) + 1
        if reasons:
            result.excluded[node.name] = reasons
        if mask:
            count = _popcount(mask)
            result.candidates.append(
                _Candidate(pos=pos, node=node, model=model, usable=mask,
                           untouched=not on_node, free_count=count)
            )
            result.total_usable += count
    return result


def _blocked(memory: int | None, held: list[Allocation], request: PlacementRequest) -> str | None:
    if request.exclusive:
        return "occupied"
    if any(a.exclusive or a.memory_bytes is None for a in held):
        return "occupied"
    assert memory is not None and request.memory_bytes is not None  # static checks ran first
    free = memory - sum(a.memory_bytes or 0 for a in held)
    return "free memory" if free < request.memory_bytes else None


def _unschedulable(request: PlacementRequest, layout: ParallelLayout, needed: int | None,
                   elig: _Eligibility) -> Unschedulable:
    """One line: what was asked, which constraint excluded which nodes, what would make it fit."""
    asked = request.describe()
    if request.count is None:  # say how many devices the layout means
        constraints = asked.split(", ", 1)[1]
        how_many = f"{needed} devices" if needed is not None else f"at least {layout.fixed_product()} devices"
        asked = f"{how_many} ({layout.describe()}), {constraints}"
    parts = [f"cannot place job {request.job_id!r}: needs {asked}; {elig.total_usable} usable"]
    lines: dict[str, list[str]] = {}
    usable_by_node = {c.node.name: _popcount(c.usable) for c in elig.candidates}
    for name, reasons in elig.excluded.items():
        desc = _node_reason_text(usable_by_node.get(name, 0), reasons, elig.details.get(name, {}))
        lines.setdefault(desc, []).append(name)
    shown = []
    for desc, names in lines.items():
        who = f"node {names[0]}" if len(names) == 1 else (
            f"nodes {', '.join(names[:3])}" + (f" (+{len(names) - 3} more)" if len(names) > 3 else "")
        )
        shown.append(f"{who} {'has' if len(names) == 1 else 'each have'} {desc}")
    if shown:
        parts.append("; ".join(shown[:8]) + (f"; and {len(shown) - 8} other kinds of node" if len(shown) > 8 else ""))
    reasons_seen = {r for reasons in elig.excluded.values() for r in reasons if reasons[r] or r == "no accelerator"}
    hints = [REASON_HINTS[r] for r in REASON_HINTS if r in reasons_seen]
    hints.append("or ask for fewer devices (smaller --dp/--pp/--tp)")
    return Unschedulable("; ".join(parts) + ". To fit: " + "; ".join(hints))


def _node_reason_text(usable: int, reasons: dict[str, int], details: dict[str, set[str]]) -> str:
    if "no accelerator" in reasons and reasons["no accelerator"] == 0 and len(reasons) == 1:
        return "no accelerators (no accelerator)"
    pieces = []
    for reason, count in reasons.items():
        if reason == "memory" or reason == "min memory":
            sizes = "/".join(sorted(details.get(reason, {"?"})))
            pieces.append(f"{count} device{'s' if count != 1 else ''} of {sizes} ({reason})")
        elif reason in ("vendor", "model", "arch"):
            what = "/".join(sorted(details.get(reason, {"?"})))
            pieces.append(f"{count} {what} device{'s' if count != 1 else ''} ({reason})")
        else:
            pieces.append(f"{count} device{'s' if count != 1 else ''} excluded ({reason})")
    lead = f"{usable} usable device{'s' if usable != 1 else ''}, " if usable else ""
    return lead + ", ".join(pieces)


# ============================================================================================
# Objective (1): the exact TP bottleneck level
# ============================================================================================


@dataclass
class _Level:
    """The chosen bottleneck level and how groups are formed at it."""

    t: float
    intra_only: bool  # every group fits inside one node
    spanning_groups: list[list[tuple[int, int]]] | None = None  # [(candidate idx, mask)] per group
    proven: bool = True  # False when the cross-node search ran out of budget somewhere


class _SpanningSolver:
    """Decides whether ``groups`` groups of ``size`` devices exist at level t when groups may
    span nodes (t <= inter-node bandwidth), and returns one such set of groups.

    A group's part on one node must be a clique of links >= t; parts on different nodes are
    joined by the network, which is fast enough at this level. So a group is at most one clique
    ("piece") per node. First a greedy construction (whole groups inside nodes, then the largest
    pieces, preferring few nodes per group); if it fails, an exact depth-first search over the
    nodes: the state is the sorted multiset of devices each group still needs, a node's move is
    one of its achievable multisets of disjoint clique sizes (``_NodeModel.profiles``) assigned
    to distinct groups, failed states are memoised.
    """

    def __init__(self, cands: list[_Candidate], order: list[int], t: float, size: int, groups: int) -> None:
        self.cands, self.order, self.t, self.size, self.groups = cands, order, t, size, groups
        self.exhausted = False

    def solve(self) -> list[list[tuple[int, int]]] | None:
        found = self._greedy()
        if found is not None:
            return found
        return self._exact()

    # --- greedy ---------------------------------------------------------------------------

    def _greedy(self) -> list[list[tuple[int, int]]] | None:
        t, size = self.t, self.size
        result: list[list[tuple[int, int]]] = []
        left = {i: self.cands[i].usable for i in self.order}
        for i in self.order:  # whole groups inside one node first
            model = self.cands[i].model
            while len(result) < self.groups and model.max_groups(left[i], t, size) > 0:
                clique = _first_clique_keeping_max(model, left[i], t, size)
                result.append([(i, clique)])
                left[i] &= ~clique
        pieces: list[tuple[int, int]] = []  # (candidate, clique mask)
        for i in self.order:
            model = self.cands[i].model
            rest = left[i]
            while rest:
                clique = _largest_clique(model, rest, self.t)
                pieces.append((i, clique))
                rest &= ~clique
        while len(result) < self.groups:
            need, used, group = size, set(), []
            while need:
                best = None
                for k, (i, mask) in enumerate(pieces):
                    if i in used or not mask:
                        continue
                    if best is None or _popcount(mask) > _popcount(pieces[best][1]):
                        best = k
                if best is None:
                    return None
                i, mask = pieces[best]
                take = 0
                for bit in _bits(mask):
                    if _popcount(take) == need:
                        break
                    take |= 1 << bit
                pieces[best] = (i, mask & ~take)
                group.append((i, take))
                used.add(i)
                need -= _popcount(take)
            result.append(group)
        return result

    # --- exact search ------------------------------------------------------------------

    def _exact(self) -> list[list[tuple[int, int]]] | None:
        if any(_popcount(self.cands[i].usable) > EXACT_SEARCH_MAX_DEVICES for i in self.order):
            self.exhausted = True  # clique-size multisets of a bigger node are too many to list
            return None
        order = sorted(self.order, key=lambda i: -_popcount(self.cands[i].usable))
        profiles = [
            sorted(
                self.cands[i].model.profiles(self.cands[i].usable, self.t, self.size, self.groups).items(),
                key=lambda kv: (-sum(kv[0]), tuple(-p for p in kv[0])),  # whole groups first
            )
            for i in order
        ]
        suffix = [0] * (len(order) + 1)
        for k in range(len(order) - 1, -1, -1):
            best_cover = max(sum(p) for p, _ in profiles[k])
            suffix[k] = suffix[k + 1] + best_cover
        failed: set[tuple[int, tuple[int, ...]]] = set()
        chosen: list[list[tuple[int, int]]] = [[] for _ in range(self.groups)]
        work = [0]

        def dfs(k: int, needs: list[int]) -> bool:
            remaining = sum(needs)
            if remaining == 0:
                return True
            if k == len(order) or remaining > suffix[k]:
                return False
            key = (k, tuple(sorted(needs)))
            if key in failed:
                return False
            seen: set[tuple[int, ...]] = set()
            for prof, parts in profiles[k]:
                for assignment in _assignments(prof, needs):
                    work[0] += 1
                    if work[0] > SPANNING_SEARCH_BUDGET:
                        self.exhausted = True
                        return False
                    new = list(needs)
                    for piece, g in zip(prof, assignment):
                        new[g] -= piece
                    state = tuple(sorted(new))
                    if state in seen:
                        continue
                    seen.add(state)
                    if dfs(k + 1, new):
                        for part, g in zip(parts, assignment):
                            chosen[g].append((order[k], part))
                        return True
                    if self.exhausted:
                        return False
            failed.add(key)
            return False

        if dfs(0, [self.size] * self.groups):
            return chosen
        return None


def _assignments(prof: tuple[int, ...], needs: list[int]) -> Iterator[tuple[int, ...]]:
    """Ways to give each piece (sizes descending) to a distinct group needing at least that
    many devices; groups with equal needs are interchangeable, so only the first is tried."""

    def rec(k: int, used: int) -> Iterator[tuple[int, ...]]:
        if k == len(prof):
            yield ()
            return
        tried: set[int] = set()
        for g, need in enumerate(needs):
            if used >> g & 1 or need < prof[k] or need in tried:
                continue
            tried.add(need)
            for rest in rec(k + 1, used | 1 << g):
                yield (g,) + rest

    yield from rec(0, 0)


def _first_clique_keeping_max(model: _NodeModel, mask: int, t: float, size: int) -> int:
    """A clique of ``size`` whose removal keeps the most disjoint cliques possible."""
    best = model.max_groups(mask, t, size)
    for v in _bits(mask):
        for clique in model.cliques_with(v, mask, t, size):
            if 1 + model.max_groups(mask & ~clique, t, size) == best:
                return clique
    raise AssertionError("max_groups said a clique exists")


def _largest_clique(model: _NodeModel, mask: int, t: float) -> int:
    target = model.max_clique(mask, t)
    for v in _bits(mask):
        for clique in model.cliques_with(v, mask, t, target):
            return clique
    return mask & -mask


def _levels(cands: list[_Candidate], inter: float, spanning_possible: bool) -> list[float]:
    values: set[float] = set()
    for c in cands:
        values.update(c.model.levels)
    if spanning_possible:
        values.add(inter)
    return sorted(values)


def _best_level(cands: list[_Candidate], order: list[int], inter: float, size: int,
                groups: int) -> tuple[_Level, list[str]]:
    """Binary search for the highest feasible bottleneck level (exact; see module docstring)."""
    spanning_possible = len(cands) > 1
    levels = _levels(cands, inter, spanning_possible)
    results: dict[float, _Level | None] = {}
    unproven = [False]

    def feasible(t: float) -> _Level | None:
        if t in results:
            return results[t]
        caps = sum(c.model.max_groups(c.usable, t, size) for c in cands)
        level: _Level | None
        if caps >= groups:
            level = _Level(t=t, intra_only=True)
        elif t > inter or not spanning_possible:
            level = None
        else:
            solver = _SpanningSolver(cands, order, t, size, groups)
            found = solver.solve()
            unproven[0] |= solver.exhausted
            level = _Level(t=t, intra_only=False, spanning_groups=found) if found else None
        results[t] = level
        return level

    lo, hi = 0, len(levels) - 1
    # the lowest level makes every pair qualify, so any devices do: it is always feasible
    assert feasible(levels[lo]) is not None, "enough usable devices must fit at the lowest level"
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if feasible(levels[mid]) is not None:
            lo = mid
        else:
            hi = mid - 1
    best = results[levels[lo]]
    assert best is not None
    best.proven = not unproven[0]
    notes = []
    if lo + 1 < len(levels):
        nxt = levels[lo + 1]
        caps = sum(c.model.max_groups(c.usable, nxt, size) for c in cands)
        notes.append(
            f"TP bottleneck {best.t:g} GB/s is the best possible: at the next bandwidth level "
            f"({nxt:g} GB/s) only {caps} of the {groups} groups of {size} fit inside nodes"
            + (" and no arrangement across nodes reaches it" if nxt <= inter and spanning_possible else "")
        )
    else:
        notes.append(f"TP bottleneck {best.t:g} GB/s is the fastest link level on offer")
    if not best.proven:
        notes.append(
            "optimality not proven: the cross-node search ran out of its work budget, "
            "so a higher bottleneck level may exist"
        )
    return best, notes


# ============================================================================================
# Objectives (2) and (3): build the groups
# ============================================================================================


def _preference(c: _Candidate, strategy: Strategy) -> tuple:
    """Sort key of a node for the next replica, most preferred first."""
    if strategy is Strategy.SPREAD:  # fewest of this job's groups, then the emptiest
        return (c.groups_here, -c.free_count, c.node.name, c.pos)
    # pack: nodes already in use (by anyone) before whole free ones; best fit among them
    return (c.untouched and not c.taken, c.free_count, c.node.name, c.pos)


def _node_order(cands: list[_Candidate], strategy: Strategy) -> list[int]:
    """Candidate indices, most preferred first."""
    return sorted(range(len(cands)), key=lambda i: _preference(cands[i], strategy))


def _build_intra(cands: list[_Candidate], t: float, size: int, layout: ParallelLayout,
                 strategy: Strategy) -> list[tuple[int, tuple[int, ...]]]:
    """Groups inside nodes, replica by replica: (candidate idx, bit positions in tp order).

    A replica goes whole onto the preferred node that has room for all its stages; packing
    fills that node with as many replicas as fit before moving on. A replica no node can hold
    is split into the biggest chunks of stages first (fewest pipeline hops between nodes).
    """
    free = [c.usable for c in cands]
    caps = [c.model.max_groups(c.usable, t, size) for c in cands]
    pp = layout.pp
    groups: list[tuple[int, tuple[int, ...]]] = []

    def place(i: int, k: int, chain: bool) -> None:
        c = cands[i]
        picked = _select(c.model, free[i], t, size, k, caps[i], chain=chain)
        for bits in picked:
            groups.append((i, bits))
            mask = sum(1 << b for b in bits)
            free[i] &= ~mask
            c.taken |= mask
            c.free_count -= size
        c.groups_here += k
        caps[i] -= k
        assert caps[i] == c.model.max_groups(free[i], t, size), "selection kept the capacity"

    replicas_left = layout.dp
    while replicas_left:
        whole = [i for i in range(len(cands)) if caps[i] >= pp]
        if whole:
            i = min(whole, key=lambda i: _preference(cands[i], strategy))
            count = min(caps[i] // pp, replicas_left) if strategy is Strategy.PACK else 1
            if pp == 1:
                place(i, count, chain=False)
            else:
                for _ in range(count):
                    place(i, pp, chain=True)
            replicas_left -= count
            continue
        stages_left = pp  # no node holds a whole replica: biggest chunks first
        for i in sorted(_node_order(cands, strategy), key=lambda i: -caps[i]):
            if not caps[i]:
                break
            take = min(caps[i], stages_left)
            place(i, take, chain=take > 1)
            stages_left -= take
            if not stages_left:
                break
        replicas_left -= 1
    return groups


def _select(model: _NodeModel, free: int, t: float, size: int, k: int, cap: int,
            chain: bool) -> list[tuple[int, ...]]:
    """k disjoint cliques of ``size`` at level t in ``free`` that keep ``cap - k`` more possible,
    ordered as consecutive pipeline stages when ``chain``; best by (pipeline hop, islands left
    whole, lowest device indices)."""
    if model.uniform:  # all links alike: the lowest free devices are as good as any
        bits = list(_bits(free))[:k * size]
        return [tuple(bits[g * size:(g + 1) * size]) for g in range(k)]
    best_key = None
    best: list[tuple[int, ...]] = []
    if chain and k > 1:
        # a whole replica inside one fast island makes every pipeline hop at least that fast
        for level in reversed(model.levels):
            if level < t:
                break
            blocks = []
            for block in _candidate_cliques(model, free, level, k * size):
                rest = free & ~block
                if model.max_groups(rest, t, size) == cap - k:
                    blocks.append((model.islands(rest), tuple(-b for b in _bits(block)), block))
            if blocks:
                _, _, block = max(blocks)
                bits = list(_bits(block))
                best = _chain(model, [sum(1 << b for b in bits[g * size:(g + 1) * size]) for g in range(k)])
                best_key = (_chain_hop(model, best), model.islands(free & ~block),
                            tuple(-b for g in sorted(best) for b in g))
                break
    cliques = _candidate_cliques(model, free, t, size)
    # most promising first: taking the clique leaves the biggest fast islands behind
    cliques.sort(key=lambda c: (tuple(-x for x in model.islands(free & ~c)), _bit_list(c)))
    valid = examined = 0
    for combo in _disjoint_combos(cliques, k):
        examined += 1
        if examined > 16 * SELECTION_CANDIDATES or (best and examined > 8 * SELECTION_CANDIDATES):
            break
        used = 0
        for c in combo:
            used |= c
        rest = free & ~used
        if model.max_groups(rest, t, size) != cap - k:
            continue
        ordered = _chain(model, combo) if chain and k > 1 else [tuple(_bits(c)) for c in combo]
        hop = _chain_hop(model, ordered) if chain and k > 1 else INF
        key = (hop, model.islands(rest), tuple(-b for g in sorted(ordered) for b in g))
        if best_key is None or key > best_key:
            best_key, best = key, ordered
        valid += 1
        if valid >= SELECTION_CANDIDATES:
            break
    if not best:  # the candidates were cut short (a big node): one clique at a time, greedily
        combo_list, rest = [], free
        for _ in range(k):
            clique = _first_clique_keeping_max(model, rest, t, size)
            combo_list.append(clique)
            rest &= ~clique
        best = _chain(model, combo_list) if chain and k > 1 else [tuple(_bits(c)) for c in combo_list]
    return best


def _candidate_cliques(model: _NodeModel, free: int, t: float, size: int) -> list[int]:
    """Cliques of ``size`` at level t in ``free``: all of them on small nodes; on big ones
    (a 64-partition MI300X in CPX mode) a bounded number per lowest device."""
    if size == 1:
        return [1 << v for v in _bits(free)]
    per_anchor = max(4, 4 * SELECTION_CANDIDATES // max(1, _popcount(free)))
    cliques: list[int] = []
    for v in _bits(free):
        cliques.extend(itertools.islice(model.cliques_with(v, free & ~((1 << v) - 1), t, size), per_anchor))
    return cliques


def _bit_list(mask: int) -> tuple[int, ...]:
    return tuple(_bits(mask))


def _disjoint_combos(cliques: list[int], k: int) -> Iterator[tuple[int, ...]]:
    def rec(start: int, used: int, need: int) -> Iterator[tuple[int, ...]]:
        if need == 0:
            yield ()
            return
        for j in range(start, len(cliques)):
            c = cliques[j]
            if c & used:
                continue
            for rest in rec(j + 1, used | c, need - 1):
                yield (c,) + rest

    yield from rec(0, 0, k)


def _chain(model: _NodeModel, combo: Sequence[int]) -> list[tuple[int, ...]]:
    """Order groups as pipeline stages (greedy: the next stage is the best-connected one) and
    align each group's device order to the previous stage's."""
    remaining = [tuple(_bits(c)) for c in combo]
    ordered = [remaining.pop(0)]
    while remaining:
        prev = ordered[-1]
        scored = [(_hop(model, prev, _align(model, prev, g)), -j) for j, g in enumerate(remaining)]
        _, neg_j = max(scored)
        ordered.append(_align(model, prev, remaining.pop(-neg_j)))
    return ordered


def _align(model: _NodeModel, prev: tuple[int, ...], group: tuple[int, ...]) -> tuple[int, ...]:
    """Order ``group`` so that device j talks to ``prev[j]`` over the best links (the lowest of
    them as high as possible; exhaustive up to 4 devices, greedy beyond)."""
    if len(group) <= 4:
        return max(itertools.permutations(group),
                   key=lambda perm: (_hop(model, prev, perm), tuple(-b for b in perm)))
    left = list(group)
    out = []
    for a in prev:
        b = max(left, key=lambda x: (model.bw[a][x], -x))
        left.remove(b)
        out.append(b)
    return tuple(out)


def _hop(model: _NodeModel, a: Sequence[int], b: Sequence[int]) -> float:
    return min(model.bw[x][y] for x, y in zip(a, b))


def _chain_hop(model: _NodeModel, ordered: list[tuple[int, ...]]) -> float:
    return min(_hop(model, a, b) for a, b in zip(ordered, ordered[1:]))


def _build_spanning(cands: list[_Candidate], groups_found: list[list[tuple[int, int]]]
                    ) -> list[list[tuple[int, int]]]:
    """Groups from the cross-node solver as [(candidate idx, bit)] in tp order; groups inside
    one node first, then by node, so that consecutive pipeline stages share nodes."""
    out = []
    for pieces in groups_found:
        ordered = sorted(pieces, key=lambda p: (-_popcount(p[1]), cands[p[0]].node.name))
        out.append([(i, b) for i, mask in ordered for b in _bits(mask)])
    out.sort(key=lambda g: (len({i for i, _ in g}), cands[g[0][0]].node.name, g[0][1]))
    for g in out:
        for i, b in g:
            cands[i].taken |= 1 << b
    return out


# ============================================================================================
# The planner
# ============================================================================================


def plan(snapshot: ClusterSnapshot, request: PlacementRequest,
         _within: _Eligibility | None = None) -> Placement:
    """Choose a device for every rank of ``request`` (see the module docstring for the rules).

    Raises :class:`Unschedulable` when fewer usable devices exist than ranks; the message names
    the constraint that excluded each kind of node and what to change. Never changes
    ``snapshot``: apply the result with ``Placement.apply_to``.
    """
    elig = _within or _eligibility(snapshot, request)
    asked = request.parallel_layout
    layout = asked.resolve(elig.total_usable)
    if layout is None or layout.world_size > elig.total_usable:
        needed = None if layout is None else layout.world_size
        raise _unschedulable(request, asked, needed, elig)
    kinds = _kinds(elig)
    vendors = sorted({v for v, _ in kinds}, key=lambda v: v.value)
    if len(vendors) > 1:  # one collective group never mixes vendors (NCCL and RCCL do not meet)
        return _best_of(snapshot, request, elig, [{k for k in kinds if k[0] is v} for v in vendors],
                        "vendor", kinds)
    placed = _plan_within(snapshot, request, elig)
    if request.mixed_models or not _mixed_tp_groups(placed, snapshot):
        return _with_model_note(placed, snapshot)
    # A tensor-parallel group mixes device models: the best placement inside one model instead.
    models = sorted((k for k in kinds if k[1] != UNKNOWN_MODEL), key=lambda k: k[1])
    try:
        return _best_of(snapshot, request, elig, [{k} for k in models], "model", kinds)
    except Unschedulable:
        raise Unschedulable(
            f"cannot place job {request.job_id!r}: {_mixed_tp_groups(placed, snapshot)} of its "
            f"tensor-parallel groups would mix device models ({_kind_counts(kinds)} usable) and no "
            "model alone holds it; a group steps at its slowest device's pace. To fit: ask for "
            "fewer or smaller groups, name one model (--model), or allow mixing models "
            "(--mixed-models)") from None


def _with_model_note(placed: Placement, snapshot: ClusterSnapshot) -> Placement:
    """Say when a job spans device models, and what that costs."""
    models: dict[str, int] = {}
    for r in placed.devices:
        model = snapshot.node(r.node).device(r.device).model or UNKNOWN_MODEL
        models[model] = models.get(model, 0) + 1
    if len(set(models) - {UNKNOWN_MODEL}) < 2:
        return placed
    spread = ", ".join(f"{n} x {m}" for m, n in sorted(models.items()))
    return dataclasses.replace(placed, notes=placed.notes + (
        f"spans device models ({spread}): synchronous ranks wait for the slowest model at "
        "every step, so the faster devices idle part of each step (name one with --model)",))


def _kinds(elig: _Eligibility) -> dict[tuple[Vendor, str], int]:
    """Usable devices per (vendor, model)."""
    out: dict[tuple[Vendor, str], int] = {}
    for c in elig.candidates:
        for kind, mask in c.model.kind_masks.items():
            n = _popcount(c.usable & mask)
            if n:
                out[kind] = out.get(kind, 0) + n
    return out


def _kind_counts(kinds: dict[tuple[Vendor, str], int], by_vendor: bool = False) -> str:
    counts: dict[str, int] = {}
    for (vendor, model), n in kinds.items():
        key = vendor.value if by_vendor else f"{model}"
        counts[key] = counts.get(key, 0) + n
    return ", ".join(f"{k} {n}" for k, n in sorted(counts.items(), key=lambda kv: (-kv[1], kv[0])))


def _restricted(elig: _Eligibility, kinds: set[tuple[Vendor, str]]) -> _Eligibility:
    """``elig`` with only the devices of ``kinds`` usable (fresh candidates)."""
    out = _Eligibility(candidates=[], excluded=elig.excluded, details=elig.details)
    for c in elig.candidates:
        mask = 0
        for kind in kinds:
            mask |= c.model.kind_masks.get(kind, 0)
        usable = c.usable & mask
        if usable:
            count = _popcount(usable)
            out.candidates.append(_Candidate(pos=c.pos, node=c.node, model=c.model, usable=usable,
                                             untouched=c.untouched, free_count=count))
            out.total_usable += count
    return out


def _best_of(snapshot: ClusterSnapshot, request: PlacementRequest, elig: _Eligibility,
             subsets: list[set[tuple[Vendor, str]]], what: str,
             kinds: dict[tuple[Vendor, str], int]) -> Placement:
    """The best placement inside one subset of device kinds (highest score; ties: the subset
    with more usable devices, then the first); Unschedulable when no subset alone fits."""
    best: tuple[tuple, Placement] | None = None
    inner: Unschedulable | None = None  # why a subset with enough devices still failed
    for i, subset in enumerate(subsets):
        sub = _restricted(elig, subset)
        layout = request.parallel_layout.resolve(sub.total_usable)
        if layout is None or layout.world_size > sub.total_usable:
            continue
        try:
            placed = plan(snapshot, request, _within=sub) if what == "vendor" else \
                _plan_within(snapshot, request, sub)
        except Unschedulable as exc:
            inner = inner or exc
            continue
        key = (placed.score, sub.total_usable, -i)
        if best is None or key > best[0]:
            best = (key, placed)
    if best is None:
        if what == "model":
            raise Unschedulable(f"job {request.job_id!r}: no single device model holds it")
        if inner is not None:
            raise inner
        needed = request.parallel_layout.resolve(elig.total_usable)
        n = needed.world_size if needed is not None else request.parallel_layout.fixed_product()
        raise Unschedulable(
            f"cannot place job {request.job_id!r}: {n} ranks form collective groups, which "
            f"cannot mix vendors (NCCL and RCCL cannot form one communicator), and no vendor "
            f"alone has enough usable devices ({_kind_counts(kinds, by_vendor=True)}). To fit: "
            f"ask for at most {max(sum(n for k, n in kinds.items() if k[0] is v) for v in {k[0] for k in kinds})} "
            "devices, or add devices of one vendor")
    placed = best[1]
    if what == "vendor" and len(subsets) > 1:
        chosen = snapshot.node(placed.devices[0].node).device(placed.devices[0].device).vendor
        placed = dataclasses.replace(placed, notes=placed.notes + (
            f"one vendor only ({chosen.value}): ranks of one job never mix vendors in a "
            f"collective group ({_kind_counts(kinds, by_vendor=True)} usable)",))
    return placed


def _mixed_tp_groups(placed: Placement, snapshot: ClusterSnapshot) -> int:
    layout = placed.layout
    models = [snapshot.node(r.node).device(r.device).model for r in placed.devices]
    return sum(1 for g in range(layout.num_tp_groups)
               if len(set(models[g * layout.tp:(g + 1) * layout.tp]) - {None}) > 1)


def _plan_within(snapshot: ClusterSnapshot, request: PlacementRequest, elig: _Eligibility) -> Placement:
    """:func:`plan` on the candidates of ``elig`` (already restricted to one vendor)."""
    asked = request.parallel_layout
    layout = asked.resolve(elig.total_usable)
    if layout is None or layout.world_size > elig.total_usable:
        needed = None if layout is None else layout.world_size
        raise _unschedulable(request, asked, needed, elig)
    cands = elig.candidates
    size, num_groups = layout.tp, layout.num_tp_groups
    inter = snapshot.inter_node_gbps
    notes: list[str] = []
    if request.memory_note:
        notes.append(f"memory per device {format_bytes(request.memory_bytes)} ({request.memory_note})")

    if size == 1:
        level = _Level(t=-INF, intra_only=True)
    else:
        level, level_notes = _best_level(cands, _node_order(cands, request.strategy), inter, size, num_groups)
        notes.extend(level_notes)

    opened_before = {i for i, c in enumerate(cands) if c.untouched}
    if level.intra_only:
        intra = _build_intra(cands, level.t, size, layout, request.strategy)
        rank_devices = [(i, b) for i, bits in intra for b in bits]
    else:
        assert level.spanning_groups is not None
        notes.append(
            f"no set of nodes holds all {num_groups} groups of {size} at >= {level.t:g} GB/s, "
            f"so some groups span nodes over the network ({inter:g} GB/s)"
        )
        spanning = _build_spanning(cands, level.spanning_groups)
        rank_devices = [dev for g in spanning for dev in g]

    devices = tuple(DeviceRef(cands[i].node.name, cands[i].model.indices[b]) for i, b in rank_devices)
    tp_gbps, weakest = _group_bandwidths(cands, rank_devices, layout, inter)
    hops = _pipeline_hops(cands, rank_devices, layout, inter)
    opened = sum(1 for i in opened_before if cands[i].taken)
    notes.extend(_placement_notes(cands, layout, request, elig, opened, devices, level.intra_only))
    tp_score = min((g for g in tp_gbps if g is not None), default=INF)
    return Placement(
        job_id=request.job_id,
        layout=layout,
        devices=devices,
        tp_group_gbps=tuple(tp_gbps),
        tp_group_weakest=tuple(weakest),
        pp_hop_gbps=tuple(hops),
        score=(tp_score, min(hops, default=INF), -float(opened) if opened else 0.0),
        memory_bytes=request.memory_bytes,
        exclusive=request.exclusive,
        notes=tuple(notes),
    )


def _pair(cands: list[_Candidate], x: tuple[int, int], y: tuple[int, int], inter: float) -> tuple[float, str]:
    (i, a), (j, b) = x, y
    if i != j:
        return inter, f"{cands[i].node.name}:{cands[i].model.indices[a]}-" \
                      f"{cands[j].node.name}:{cands[j].model.indices[b]} network"
    m = cands[i].model
    return m.bw[a][b], f"{m.indices[min(a, b)]}-{m.indices[max(a, b)]} {m.label[a][b]}"


def _group_bandwidths(cands: list[_Candidate], ranks: list[tuple[int, int]], layout: ParallelLayout,
                      inter: float) -> tuple[list[float | None], list[str]]:
    gbps: list[float | None] = []
    weakest: list[str] = []
    for g in range(layout.num_tp_groups):
        members = ranks[g * layout.tp:(g + 1) * layout.tp]
        if len(members) == 1:
            gbps.append(None)
            weakest.append("-")
            continue
        worst = min((_pair(cands, x, y, inter) for x, y in itertools.combinations(members, 2)),
                    key=lambda p: p[0])
        gbps.append(worst[0])
        weakest.append(worst[1])
    return gbps, weakest


def _pipeline_hops(cands: list[_Candidate], ranks: list[tuple[int, int]], layout: ParallelLayout,
                   inter: float) -> list[float]:
    hops = []
    for d in range(layout.dp):
        for p in range(layout.pp - 1):
            a = layout.rank(d, p, 0)
            b = layout.rank(d, p + 1, 0)
            hops.append(min(
                _pair(cands, ranks[a + k], ranks[b + k], inter)[0] for k in range(layout.tp)
            ))
    return hops


def _placement_notes(cands: list[_Candidate], layout: ParallelLayout, request: PlacementRequest,
                     elig: _Eligibility, opened: int, devices: tuple[DeviceRef, ...],
                     spanning_free: bool) -> list[str]:
    notes = []
    used = [c for c in cands if c.taken]
    if layout.pp > 1:
        split = sum(
            1 for d in range(layout.dp)
            if len({devices[r].node for r in range(layout.rank(d, 0, 0), layout.rank(d, layout.pp - 1, layout.tp - 1) + 1)}) > 1
        )
        notes.append(
            "every replica's pipeline stages share one node" if not split
            else f"{split} of {layout.dp} replicas have pipeline stages on several nodes"
            + (" (no node had room for a whole replica)" if spanning_free else "")
        )
    whole_free = sum(1 for c in cands if c.untouched)
    if request.strategy is Strategy.PACK:
        partly = [c.node.name for c in used if not c.untouched]
        text = f"pack: used {len(used)} node{'s' if len(used) != 1 else ''}"
        if partly:
            text += f", partly used ones first ({', '.join(partly[:4])}{', ...' if len(partly) > 4 else ''})"
        text += f"; {whole_free - opened} whole free node{'s' if whole_free - opened != 1 else ''} left untouched"
        notes.append(text)
    else:
        notes.append(f"spread: replicas over {len(used)} node{'s' if len(used) != 1 else ''}, emptiest first")
    excluded: dict[str, int] = {}
    for reasons in elig.excluded.values():
        for r, n in reasons.items():
            excluded[r] = excluded.get(r, 0) + n
    if any(excluded.values()):
        parts = ", ".join(f"{n} {r}" for r, n in sorted(excluded.items()) if n)
        notes.append(f"devices not considered: {parts}")
    return notes


__all__ = ["plan", "SPANNING_SEARCH_BUDGET"]
