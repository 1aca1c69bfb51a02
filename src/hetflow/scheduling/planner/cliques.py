"""Islands and cliques: a node's devices as bit masks, and the exact clique searches on them.

:class:`NodeModel` depends only on a node's topology (devices and links), so nodes built from
one template share it, memo tables included; :class:`NodeModels` is the planner's store of them
(kept by a :class:`~hetflow.scheduling.planner.Planner`, never module-global).
"""

from __future__ import annotations

import math
from typing import Iterator

from hetflow.core.topology import NodeTopology, Vendor

INF = math.inf
UNKNOWN_MODEL = "unknown model"
MEMO_LIMIT = 200_000  # entries per memo table before it is dropped (big partitioned nodes)
MODEL_CACHE_LIMIT = 4096  # distinct topologies (and nodes) a NodeModels remembers


def iter_bits(mask: int) -> Iterator[int]:
    while mask:
        low = mask & -mask
        yield low.bit_length() - 1
        mask ^= low


def popcount(mask: int) -> int:
    return mask.bit_count()


class NodeModel:
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
        self.static_masks: dict[tuple, tuple] = {}  # eligibility.static_mask's memo, by request constraints
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
        return all((adj[i] | (1 << i)) & mask == mask for i in iter_bits(mask))

    def cliques_with(self, v: int, within: int, t: float, size: int) -> Iterator[int]:
        """Cliques of exactly ``size`` devices at level t containing v, inside ``within``."""
        adj = self.adjacency(t)

        def extend(clique: int, cand: int, need: int) -> Iterator[int]:
            if need == 0:
                yield clique
                return
            while cand and popcount(cand) >= need:
                low = cand & -cand
                u = low.bit_length() - 1
                cand ^= low
                yield from extend(clique | low, cand & adj[u], need - 1)

        yield from extend(1 << v, adj[v] & within & ~(1 << v), size - 1)

    def max_groups(self, mask: int, t: float, size: int) -> int:
        """Most disjoint cliques of ``size`` devices at level t inside ``mask`` (exact)."""
        if size == 1:
            return popcount(mask)
        memo = self._groups_memo.setdefault((t, size), {})
        if len(memo) > MEMO_LIMIT:
            memo.clear()
        return self._max_groups(mask, t, size, memo)

    def _max_groups(self, mask: int, t: float, size: int, memo: dict[int, int]) -> int:
        hit = memo.get(mask)
        if hit is not None:
            return hit
        n = popcount(mask)
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
        if len(memo) > MEMO_LIMIT:
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
            result = with_v if with_v >= popcount(mask) - 1 else max(
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
        if len(memo) > MEMO_LIMIT // 10:
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



class NodeModels:
    """Node models shared by nodes of identical topology (by content), with a fast path for a
    node object seen before under its name (the same object, checked by identity: a node
    replaced by a new one of the same name is looked up by content again). Bounded."""

    def __init__(self) -> None:
        self._by_content: dict[tuple, NodeModel] = {}
        self._by_name: dict[str, tuple[NodeTopology, NodeModel]] = {}

    def of(self, node: NodeTopology) -> NodeModel:
        hit = self._by_name.get(node.name)
        if hit is not None and hit[0] is node:
            return hit[1]
        if len(self._by_name) > MODEL_CACHE_LIMIT:
            self._by_name.clear()
        if len(self._by_content) > MODEL_CACHE_LIMIT:
            self._by_content.clear()
        key = NodeModel.key(node)
        model = self._by_content.get(key)
        if model is None:
            model = self._by_content[key] = NodeModel(node)
        self._by_name[node.name] = (node, model)
        return model


def first_clique_keeping_max(model: NodeModel, mask: int, t: float, size: int) -> int:
    """A clique of ``size`` whose removal keeps the most disjoint cliques possible."""
    best = model.max_groups(mask, t, size)
    for v in iter_bits(mask):
        for clique in model.cliques_with(v, mask, t, size):
            if 1 + model.max_groups(mask & ~clique, t, size) == best:
                return clique
    raise AssertionError("max_groups said a clique exists")


def largest_clique(model: NodeModel, mask: int, t: float) -> int:
    target = model.max_clique(mask, t)
    for v in iter_bits(mask):
        for clique in model.cliques_with(v, mask, t, target):
            return clique
    return mask & -mask
