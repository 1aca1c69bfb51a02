"""Objectives (2) and (3): build the groups inside nodes at the chosen level.

Pipeline neighbours on one node when one has room (stages aligned device by device over the
best links), then fragmentation: ``pack`` fills partly used nodes first and keeps the largest
fast islands of the remaining free devices whole; ``spread`` does the opposite for replicas.
Heuristic; the TP bottleneck level is never lowered.
"""

from __future__ import annotations

import itertools
from typing import Iterator, Sequence

from hetflow.core.request import ParallelLayout, Strategy
from hetflow.scheduling.planner.cliques import INF, NodeModel, first_clique_keeping_max, iter_bits, popcount
from hetflow.scheduling.planner.eligibility import Candidate

SELECTION_CANDIDATES = 64  # node-local choices scored for the secondary objectives


def preference(c: Candidate, strategy: Strategy) -> tuple:
    """Sort key of a node for the next replica, most preferred first."""
    if strategy is Strategy.SPREAD:  # fewest of this job's groups, then the emptiest
        return (c.groups_here, -c.free_count, c.node.name, c.pos)
    # pack: nodes already in use (by anyone) before whole free ones; best fit among them
    return (c.untouched and not c.taken, c.free_count, c.node.name, c.pos)


def node_order(cands: list[Candidate], strategy: Strategy) -> list[int]:
    """Candidate indices, most preferred first."""
    return sorted(range(len(cands)), key=lambda i: preference(cands[i], strategy))


def build_intra(cands: list[Candidate], t: float, size: int, layout: ParallelLayout,
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
            i = min(whole, key=lambda i: preference(cands[i], strategy))
            count = min(caps[i] // pp, replicas_left) if strategy is Strategy.PACK else 1
            if pp == 1:
                place(i, count, chain=False)
            else:
                for _ in range(count):
                    place(i, pp, chain=True)
            replicas_left -= count
            continue
        stages_left = pp  # no node holds a whole replica: biggest chunks first
        for i in sorted(node_order(cands, strategy), key=lambda i: -caps[i]):
            if not caps[i]:
                break
            take = min(caps[i], stages_left)
            place(i, take, chain=take > 1)
            stages_left -= take
            if not stages_left:
                break
        replicas_left -= 1
    return groups


def _select(model: NodeModel, free: int, t: float, size: int, k: int, cap: int,
            chain: bool) -> list[tuple[int, ...]]:
    """k disjoint cliques of ``size`` at level t in ``free`` that keep ``cap - k`` more possible,
    ordered as consecutive pipeline stages when ``chain``; best by (pipeline hop, islands left
    whole, lowest device indices)."""
    if model.uniform:  # all links alike: the lowest free devices are as good as any
        bits = list(iter_bits(free))[:k * size]
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
                    blocks.append((model.islands(rest), tuple(-b for b in iter_bits(block)), block))
            if blocks:
                _, _, block = max(blocks)
                bits = list(iter_bits(block))
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
        ordered = _chain(model, combo) if chain and k > 1 else [tuple(iter_bits(c)) for c in combo]
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
            clique = first_clique_keeping_max(model, rest, t, size)
            combo_list.append(clique)
            rest &= ~clique
        best = _chain(model, combo_list) if chain and k > 1 else [tuple(iter_bits(c)) for c in combo_list]
    return best


def _candidate_cliques(model: NodeModel, free: int, t: float, size: int) -> list[int]:
    """Cliques of ``size`` at level t in ``free``: all of them on small nodes; on big ones
    (a 64-partition MI300X in CPX mode) a bounded number per lowest device."""
    if size == 1:
        return [1 << v for v in iter_bits(free)]
    per_anchor = max(4, 4 * SELECTION_CANDIDATES // max(1, popcount(free)))
    cliques: list[int] = []
    for v in iter_bits(free):
        cliques.extend(itertools.islice(model.cliques_with(v, free & ~((1 << v) - 1), t, size), per_anchor))
    return cliques


def _bit_list(mask: int) -> tuple[int, ...]:
    return tuple(iter_bits(mask))


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


def _chain(model: NodeModel, combo: Sequence[int]) -> list[tuple[int, ...]]:
    """Order groups as pipeline stages (greedy: the next stage is the best-connected one) and
    align each group's device order to the previous stage's."""
    remaining = [tuple(iter_bits(c)) for c in combo]
    ordered = [remaining.pop(0)]
    while remaining:
        prev = ordered[-1]
        scored = [(_hop(model, prev, _align(model, prev, g)), -j) for j, g in enumerate(remaining)]
        _, neg_j = max(scored)
        ordered.append(_align(model, prev, remaining.pop(-neg_j)))
    return ordered


def _align(model: NodeModel, prev: tuple[int, ...], group: tuple[int, ...]) -> tuple[int, ...]:
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


def _hop(model: NodeModel, a: Sequence[int], b: Sequence[int]) -> float:
    return min(model.bw[x][y] for x, y in zip(a, b))


def _chain_hop(model: NodeModel, ordered: list[tuple[int, ...]]) -> float:
    return min(_hop(model, a, b) for a, b in zip(ordered, ordered[1:]))
