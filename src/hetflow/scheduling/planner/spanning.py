"""Spanning: tensor-parallel groups that must cross nodes, at one bandwidth level.

Used when no node-local packing reaches the needed count of groups and the level is at most the
network's bandwidth: :class:`SpanningSolver` decides feasibility (greedy, then an exact search
with a work budget) and :func:`build_spanning` turns its groups into ranks.
"""

from __future__ import annotations

from typing import Iterator

from hetflow.scheduling.planner.cliques import first_clique_keeping_max, iter_bits, largest_clique, popcount
from hetflow.scheduling.planner.eligibility import Candidate

SPANNING_SEARCH_BUDGET = 200_000  # transitions of the exact cross-node search before giving up
EXACT_SEARCH_MAX_DEVICES = 16  # usable devices per node the exact cross-node search handles


class SpanningSolver:
    """Decides whether ``groups`` groups of ``size`` devices exist at level t when groups may
    span nodes (t <= inter-node bandwidth), and returns one such set of groups.

    A group's part on one node must be a clique of links >= t; parts on different nodes are
    joined by the network, which is fast enough at this level. So a group is at most one clique
    ("piece") per node. First a greedy construction (whole groups inside nodes, then the largest
    pieces, preferring few nodes per group); if it fails, an exact depth-first search over the
    nodes: the state is the sorted multiset of devices each group still needs, a node's move is
    one of its achievable multisets of disjoint clique sizes (``NodeModel.profiles``) assigned
    to distinct groups, failed states are memoised.
    """

    def __init__(self, cands: list[Candidate], order: list[int], t: float, size: int, groups: int) -> None:
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
                clique = first_clique_keeping_max(model, left[i], t, size)
                result.append([(i, clique)])
                left[i] &= ~clique
        pieces: list[tuple[int, int]] = []  # (candidate, clique mask)
        for i in self.order:
            model = self.cands[i].model
            rest = left[i]
            while rest:
                clique = largest_clique(model, rest, self.t)
                pieces.append((i, clique))
                rest &= ~clique
        while len(result) < self.groups:
            need, used, group = size, set(), []
            while need:
                best = None
                for k, (i, mask) in enumerate(pieces):
                    if i in used or not mask:
                        continue
                    if best is None or popcount(mask) > popcount(pieces[best][1]):
                        best = k
                if best is None:
                    return None
                i, mask = pieces[best]
                take = 0
                for bit in iter_bits(mask):
                    if popcount(take) == need:
                        break
                    take |= 1 << bit
                pieces[best] = (i, mask & ~take)
                group.append((i, take))
                used.add(i)
                need -= popcount(take)
            result.append(group)
        return result

    # --- exact search ------------------------------------------------------------------

    def _exact(self) -> list[list[tuple[int, int]]] | None:
        if any(popcount(self.cands[i].usable) > EXACT_SEARCH_MAX_DEVICES for i in self.order):
            self.exhausted = True  # clique-size multisets of a bigger node are too many to list
            return None
        order = sorted(self.order, key=lambda i: -popcount(self.cands[i].usable))
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


def build_spanning(cands: list[Candidate], groups_found: list[list[tuple[int, int]]]
                    ) -> list[list[tuple[int, int]]]:
    """Groups from the cross-node solver as [(candidate idx, bit)] in tp order; groups inside
    one node first, then by node, so that consecutive pipeline stages share nodes."""
    out = []
    for pieces in groups_found:
        ordered = sorted(pieces, key=lambda p: (-popcount(p[1]), cands[p[0]].node.name))
        out.append([(i, b) for i, mask in ordered for b in iter_bits(mask)])
    out.sort(key=lambda g: (len({i for i, _ in g}), cands[g[0][0]].node.name, g[0][1]))
    for g in out:
        for i, b in g:
            cands[i].taken |= 1 << b
    return out
