"""The bandwidth-level search: objective (1), the exact TP bottleneck.

The answer is one of the bandwidth levels that occur; a level t is feasible iff dp*pp disjoint
groups of tp devices exist whose pairs all reach t (cliques counted exactly per node; groups
spanning nodes through :mod:`~hetflow.scheduling.planner.spanning`). Binary search over the
levels, with the notes that explain the result.
"""

from __future__ import annotations

from dataclasses import dataclass

from hetflow.scheduling.planner.eligibility import Candidate
from hetflow.scheduling.planner.spanning import SpanningSolver


@dataclass
class Level:
    """The chosen bottleneck level and how groups are formed at it."""

    t: float
    intra_only: bool  # every group fits inside one node
    spanning_groups: list[list[tuple[int, int]]] | None = None  # [(candidate idx, mask)] per group
    proven: bool = True  # False when the cross-node search ran out of budget somewhere


def _levels(cands: list[Candidate], inter: float, spanning_possible: bool) -> list[float]:
    values: set[float] = set()
    for c in cands:
        values.update(c.model.levels)
    if spanning_possible:
        values.add(inter)
    return sorted(values)


def best_level(cands: list[Candidate], order: list[int], inter: float, size: int,
                groups: int) -> tuple[Level, list[str]]:
    """Binary search for the highest feasible bottleneck level (exact; see module docstring)."""
    spanning_possible = len(cands) > 1
    levels = _levels(cands, inter, spanning_possible)
    results: dict[float, Level | None] = {}
    unproven = [False]

    def feasible(t: float) -> Level | None:
        if t in results:
            return results[t]
        caps = sum(c.model.max_groups(c.usable, t, size) for c in cands)
        level: Level | None
        if caps >= groups:
            level = Level(t=t, intra_only=True)
        elif t > inter or not spanning_possible:
            level = None
        else:
            solver = SpanningSolver(cands, order, t, size, groups)
            found = solver.solve()
            unproven[0] |= solver.exhausted
            level = Level(t=t, intra_only=False, spanning_groups=found) if found else None
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
