"""The planner: eligibility -> one vendor -> one device model (when TP groups would mix) ->
the TP bottleneck level -> the groups -> a :class:`~hetflow.core.placement.Placement`."""

from __future__ import annotations

import dataclasses

from hetflow.accelerators.catalog import Catalog, default_catalog
from hetflow.core.errors import Unschedulable
from hetflow.core.placement import DeviceRef, Placement
from hetflow.core.request import ParallelLayout, PlacementRequest
from hetflow.core.topology import ClusterSnapshot, Vendor
from hetflow.core.units import format_bytes
from hetflow.scheduling.planner.cliques import INF, UNKNOWN_MODEL, NodeModels, popcount
from hetflow.scheduling.planner.eligibility import Candidate, Eligibility, eligibility, unschedulable
from hetflow.scheduling.planner.explain import (
    group_bandwidths, kind_counts, pipeline_hops, placement_notes, with_model_note,
)
from hetflow.scheduling.planner.groups import build_intra, node_order
from hetflow.scheduling.planner.levels import Level, best_level
from hetflow.scheduling.planner.spanning import build_spanning


class Planner:
    """The placement planner with its catalog (model names) and its store of node models.

    Keep one to plan many requests on the same nodes (a controller, a simulation): the clique
    searches memoised per topology are then shared between calls. Not thread-safe.
    """

    def __init__(self, catalog: Catalog) -> None:
        self.catalog = catalog
        self.models = NodeModels()

    def plan(self, snapshot: ClusterSnapshot, request: PlacementRequest) -> Placement:
        """Choose a device for every rank of ``request`` (see the package docstring).

        Raises :class:`Unschedulable` when fewer usable devices exist than ranks; the message
        names the constraint that excluded each kind of node and what to change. Never changes
        ``snapshot``: apply the result with ``Placement.apply_to``.
        """
        return _plan(snapshot, request, eligibility(snapshot, request, self.models, self.catalog))


def plan(snapshot: ClusterSnapshot, request: PlacementRequest, catalog: Catalog | None = None) -> Placement:
    """One request planned by a fresh :class:`Planner` on ``catalog`` (default: the catalog
    shipped with hetflow). To plan many, keep a :class:`Planner`."""
    return Planner(catalog if catalog is not None else default_catalog()).plan(snapshot, request)


def _layout_that_fits(request: PlacementRequest, elig: Eligibility) -> ParallelLayout:
    """The request's layout resolved on the usable devices; Unschedulable when too few."""
    asked = request.parallel_layout
    layout = asked.resolve(elig.total_usable)
    if layout is None or layout.world_size > elig.total_usable:
        needed = None if layout is None else layout.world_size
        raise unschedulable(request, asked, needed, elig)
    return layout


def _plan(snapshot: ClusterSnapshot, request: PlacementRequest, elig: Eligibility) -> Placement:
    """:meth:`Planner.plan` on the usable devices ``elig``: one vendor, then one model."""
    _layout_that_fits(request, elig)  # refuses at once when too few devices are usable
    kinds = _kinds(elig)
    vendors = sorted({v for v, _ in kinds}, key=lambda v: v.value)
    if len(vendors) > 1:  # one collective group never mixes vendors (NCCL and RCCL do not meet)
        return _best_of(snapshot, request, elig, [{k for k in kinds if k[0] is v} for v in vendors],
                        "vendor", kinds)
    placed = _plan_within(snapshot, request, elig)
    if request.mixed_models or not _mixed_tp_groups(placed, snapshot):
        return with_model_note(placed, snapshot)
    # A tensor-parallel group mixes device models: the best placement inside one model instead.
    models = sorted((k for k in kinds if k[1] != UNKNOWN_MODEL), key=lambda k: k[1])
    try:
        return _best_of(snapshot, request, elig, [{k} for k in models], "model", kinds)
    except Unschedulable:
        raise Unschedulable(
            f"cannot place job {request.job_id!r}: {_mixed_tp_groups(placed, snapshot)} of its "
            f"tensor-parallel groups would mix device models ({kind_counts(kinds)} usable) and no "
            "model alone holds it; a group steps at its slowest device's pace. To fit: ask for "
            "fewer or smaller groups, name one model (--model), or allow mixing models "
            "(--mixed-models)") from None


def _kinds(elig: Eligibility) -> dict[tuple[Vendor, str], int]:
    """Usable devices per (vendor, model)."""
    out: dict[tuple[Vendor, str], int] = {}
    for c in elig.candidates:
        for kind, mask in c.model.kind_masks.items():
            n = popcount(c.usable & mask)
            if n:
                out[kind] = out.get(kind, 0) + n
    return out


def _restricted(elig: Eligibility, kinds: set[tuple[Vendor, str]]) -> Eligibility:
    """``elig`` with only the devices of ``kinds`` usable (fresh candidates)."""
    out = Eligibility(candidates=[], excluded=elig.excluded, details=elig.details)
    for c in elig.candidates:
        mask = 0
        for kind in kinds:
            mask |= c.model.kind_masks.get(kind, 0)
        usable = c.usable & mask
        if usable:
            count = popcount(usable)
            out.candidates.append(Candidate(pos=c.pos, node=c.node, model=c.model, usable=usable,
                                             untouched=c.untouched, free_count=count))
            out.total_usable += count
    return out


def _best_of(snapshot: ClusterSnapshot, request: PlacementRequest, elig: Eligibility,
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
            placed = _plan(snapshot, request, sub) if what == "vendor" else \
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
            f"alone has enough usable devices ({kind_counts(kinds, by_vendor=True)}). To fit: "
            f"ask for at most {max(sum(n for k, n in kinds.items() if k[0] is v) for v in {k[0] for k in kinds})} "
            "devices, or add devices of one vendor")
    placed = best[1]
    if what == "vendor" and len(subsets) > 1:
        chosen = snapshot.node(placed.devices[0].node).device(placed.devices[0].device).vendor
        placed = dataclasses.replace(placed, notes=placed.notes + (
            f"one vendor only ({chosen.value}): ranks of one job never mix vendors in a "
            f"collective group ({kind_counts(kinds, by_vendor=True)} usable)",))
    return placed


def _mixed_tp_groups(placed: Placement, snapshot: ClusterSnapshot) -> int:
    layout = placed.layout
    models = [snapshot.node(r.node).device(r.device).model for r in placed.devices]
    return sum(1 for g in range(layout.num_tp_groups)
               if len(set(models[g * layout.tp:(g + 1) * layout.tp]) - {None}) > 1)


def _plan_within(snapshot: ClusterSnapshot, request: PlacementRequest, elig: Eligibility) -> Placement:
    """:func:`plan` on the candidates of ``elig`` (already restricted to one vendor)."""
    layout = _layout_that_fits(request, elig)
    cands = elig.candidates
    size, num_groups = layout.tp, layout.num_tp_groups
    inter = snapshot.inter_node_gbps
    notes: list[str] = []
    if request.memory_note:
        notes.append(f"memory per device {format_bytes(request.memory_bytes)} ({request.memory_note})")

    if size == 1:
        level = Level(t=-INF, intra_only=True)
    else:
        level, level_notes = best_level(cands, node_order(cands, request.strategy), inter, size, num_groups)
        notes.extend(level_notes)

    opened_before = {i for i, c in enumerate(cands) if c.untouched}
    if level.intra_only:
        intra = build_intra(cands, level.t, size, layout, request.strategy)
        rank_devices = [(i, b) for i, bits in intra for b in bits]
    else:
        assert level.spanning_groups is not None
        notes.append(
            f"no set of nodes holds all {num_groups} groups of {size} at >= {level.t:g} GB/s, "
            f"so some groups span nodes over the network ({inter:g} GB/s)"
        )
        spanning = build_spanning(cands, level.spanning_groups)
        rank_devices = [dev for g in spanning for dev in g]

    devices = tuple(DeviceRef(cands[i].node.name, cands[i].model.indices[b]) for i, b in rank_devices)
    tp_gbps, weakest = group_bandwidths(cands, rank_devices, layout, inter)
    hops = pipeline_hops(cands, rank_devices, layout, inter)
    opened = sum(1 for i in opened_before if cands[i].taken)
    notes.extend(placement_notes(cands, layout, request, elig, opened, devices, level.intra_only))
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
