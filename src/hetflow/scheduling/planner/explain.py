"""Explanation: the bandwidths, hops and notes a placement carries (``hetflow plan``, status)."""

from __future__ import annotations

import dataclasses
import itertools

from hetflow.core.placement import DeviceRef, Placement
from hetflow.core.request import ParallelLayout, PlacementRequest, Strategy
from hetflow.core.topology import ClusterSnapshot, Vendor
from hetflow.scheduling.planner.cliques import UNKNOWN_MODEL
from hetflow.scheduling.planner.eligibility import Candidate, Eligibility


def with_model_note(placed: Placement, snapshot: ClusterSnapshot) -> Placement:
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


def kind_counts(kinds: dict[tuple[Vendor, str], int], by_vendor: bool = False) -> str:
    counts: dict[str, int] = {}
    for (vendor, model), n in kinds.items():
        key = vendor.value if by_vendor else f"{model}"
        counts[key] = counts.get(key, 0) + n
    return ", ".join(f"{k} {n}" for k, n in sorted(counts.items(), key=lambda kv: (-kv[1], kv[0])))


def _pair(cands: list[Candidate], x: tuple[int, int], y: tuple[int, int], inter: float) -> tuple[float, str]:
    (i, a), (j, b) = x, y
    if i != j:
        return inter, f"{cands[i].node.name}:{cands[i].model.indices[a]}-" \
                      f"{cands[j].node.name}:{cands[j].model.indices[b]} network"
    m = cands[i].model
    return m.bw[a][b], f"{m.indices[min(a, b)]}-{m.indices[max(a, b)]} {m.label[a][b]}"


def group_bandwidths(cands: list[Candidate], ranks: list[tuple[int, int]], layout: ParallelLayout,
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


def pipeline_hops(cands: list[Candidate], ranks: list[tuple[int, int]], layout: ParallelLayout,
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


def placement_notes(cands: list[Candidate], layout: ParallelLayout, request: PlacementRequest,
                     elig: Eligibility, opened: int, devices: tuple[DeviceRef, ...],
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
    excluded: dict[str, int] = {}  # reason text -> devices
    for reasons in elig.excluded.values():
        for r, n in reasons.items():
            excluded[r.value] = excluded.get(r.value, 0) + n
    if any(excluded.values()):
        parts = ", ".join(f"{n} {r}" for r, n in sorted(excluded.items()) if n)
        notes.append(f"devices not considered: {parts}")
    return notes
