"""Eligibility and reasons: which devices a request may use, and why the others are not usable.

A device is usable when it matches the vendor/model/arch constraints and the minimum memory,
has the memory the job needs, and is free: an exclusive request needs a device with no
allocation at all; a shared request needs ``memory - sum(allocated memory)`` >= its memory per
device, and any exclusive allocation (or one of unknown size) blocks the device. A device of
unknown memory is unusable when memory is asked for. Every excluded device is counted under
one :class:`Reason`; a refusal (:func:`unschedulable`) names them per kind of node, with the
hint of each reason seen.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field

from hetflow.accelerators.catalog import Catalog, model_matcher
from hetflow.core.errors import Unschedulable
from hetflow.core.request import ParallelLayout, PlacementRequest
from hetflow.core.topology import Allocation, ClusterSnapshot, NodeTopology, Vendor
from hetflow.core.units import format_bytes
from hetflow.scheduling.planner.cliques import UNKNOWN_MODEL, NodeModel, NodeModels, popcount


class Reason(enum.Enum):
    """Why a device is not usable; the value is the text users see, ``hint`` what to change.
    Hints are given in this order."""

    NO_ACCELERATOR = "no accelerator"
    VENDOR = "vendor"
    MODEL = "model"
    ARCH = "arch"
    MIN_MEMORY = "min memory"
    MEMORY = "memory"
    MEMORY_UNKNOWN = "memory unknown"
    OCCUPIED = "occupied"
    FREE_MEMORY = "free memory"

    @property
    def hint(self) -> str:
        return _HINTS[self]


_HINTS = {
    Reason.NO_ACCELERATOR: "use a cluster with accelerators",
    Reason.VENDOR: "drop or change --vendor",
    Reason.MODEL: "drop or change --model",
    Reason.ARCH: "drop or change --arch",
    Reason.MIN_MEMORY: "lower --min-memory",
    Reason.MEMORY: "ask for less memory per device (--mem) or split the model over more devices (larger --tp/--pp)",
    Reason.MEMORY_UNKNOWN: "record the devices' memory (nvidia-smi -q / amd-smi output) or omit --mem",
    Reason.OCCUPIED: "wait for running jobs to end, or share devices by memory (--share)",
    Reason.FREE_MEMORY: "ask for less memory per device (--mem) or wait for jobs sharing the devices to end",
}
_WITH_FACTS = frozenset({Reason.VENDOR, Reason.MODEL, Reason.ARCH, Reason.MIN_MEMORY, Reason.MEMORY})


@dataclass
class Candidate:
    """A node with at least one usable device, during one planning call."""

    pos: int  # position in snapshot.nodes (the tie-break order after the name)
    node: NodeTopology
    model: NodeModel
    usable: int  # mask of usable devices
    untouched: bool  # no allocation of any job on any of its devices
    free_count: int = 0  # usable devices, for best fit
    taken: int = 0  # mask taken by this job so far
    groups_here: int = 0


@dataclass
class Eligibility:
    candidates: list[Candidate]
    excluded: dict[str, dict[Reason, int]]  # node -> reason -> devices
    details: dict[str, dict[Reason, set[str]]] = field(default_factory=dict)  # node -> reason -> facts
    total_usable: int = 0


def _static_key(request: PlacementRequest) -> tuple:
    return (
        request.vendor, request.model or None,
        (request.arch or "").lower() or None,
        request.min_memory_bytes, request.memory_bytes, request.memory_bytes is not None,
    )


def static_mask(model: NodeModel, request: PlacementRequest,
                catalog: Catalog) -> tuple[int, dict[Reason, int], dict[Reason, set[str]]]:
    """Devices passing the constraints that depend only on the device, not on allocations;
    the count of the others per reason, and the facts behind the reasons ("80.0 GiB").
    Memoised on ``model`` (whose store belongs to one planner, hence one ``catalog``)."""
    key = _static_key(request)
    hit = model.static_masks.get(key)
    if hit is not None:
        return hit
    vendor, model_text, arch, min_mem, need_total, wants_memory = key
    model_name = model_matcher(model_text, catalog)  # the catalog's one model-name rule
    mask = 0
    reasons: dict[Reason, int] = {}
    details: dict[Reason, set[str]] = {}
    for bit, d in enumerate(model.devices):
        reason = None
        if vendor is None and d.vendor is Vendor.CPU:
            reason = Reason.NO_ACCELERATOR
        elif vendor is not None and d.vendor is not vendor:
            reason, fact = Reason.VENDOR, d.vendor.value
        elif model_name is not None and not model_name(d.model):
            reason, fact = Reason.MODEL, d.model or UNKNOWN_MODEL
        elif arch is not None and (d.arch or "").lower() != arch:
            reason, fact = Reason.ARCH, d.arch or "unknown arch"
        elif (min_mem is not None or wants_memory) and d.memory_bytes is None:
            reason = Reason.MEMORY_UNKNOWN
        elif min_mem is not None and d.memory_bytes < min_mem:
            reason, fact = Reason.MIN_MEMORY, format_bytes(d.memory_bytes)
        elif need_total is not None and d.memory_bytes < need_total:
            reason, fact = Reason.MEMORY, format_bytes(d.memory_bytes)
        if reason is None:
            mask |= 1 << bit
            continue
        reasons[reason] = reasons.get(reason, 0) + 1
        if reason in _WITH_FACTS:
            details.setdefault(reason, set()).add(fact)
    model.static_masks[key] = (mask, reasons, details)
    return mask, reasons, details


def _allocation_index(snapshot: ClusterSnapshot) -> dict[str, dict[int, list[Allocation]]]:
    index: dict[str, dict[int, list[Allocation]]] = {}
    for a in snapshot.allocations:
        index.setdefault(a.node, {}).setdefault(a.device, []).append(a)
    return index


def eligibility(snapshot: ClusterSnapshot, request: PlacementRequest, models: NodeModels,
                catalog: Catalog) -> Eligibility:
    """Which devices of ``snapshot`` the request may use, node by node, and why not the others."""
    allocs = _allocation_index(snapshot)
    result = Eligibility(candidates=[], excluded={})
    for pos, node in enumerate(snapshot.nodes):
        model = models.of(node)
        mask, static_reasons, static_details = static_mask(model, request, catalog)
        reasons = dict(static_reasons)
        if static_details:
            result.details[node.name] = static_details  # shared, read-only
        if not model.devices:
            reasons[Reason.NO_ACCELERATOR] = 0
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
            count = popcount(mask)
            result.candidates.append(
                Candidate(pos=pos, node=node, model=model, usable=mask,
                           untouched=not on_node, free_count=count)
            )
            result.total_usable += count
    return result


def _blocked(memory: int | None, held: list[Allocation], request: PlacementRequest) -> Reason | None:
    if request.exclusive:
        return Reason.OCCUPIED
    if any(a.exclusive or a.memory_bytes is None for a in held):
        return Reason.OCCUPIED
    assert memory is not None and request.memory_bytes is not None  # static checks ran first
    free = memory - sum(a.memory_bytes or 0 for a in held)
    return Reason.FREE_MEMORY if free < request.memory_bytes else None


def unschedulable(request: PlacementRequest, layout: ParallelLayout, needed: int | None,
                  elig: Eligibility) -> Unschedulable:
    """One line: what was asked, which constraint excluded which nodes, what would make it fit."""
    asked = request.describe()
    if request.count is None:  # say how many devices the layout means
        constraints = asked.split(", ", 1)[1]
        how_many = f"{needed} devices" if needed is not None else f"at least {layout.fixed_product()} devices"
        asked = f"{how_many} ({layout.describe()}), {constraints}"
    parts = [f"cannot place job {request.job_id!r}: needs {asked}; {elig.total_usable} usable"]
    lines: dict[str, list[str]] = {}
    usable_by_node = {c.node.name: popcount(c.usable) for c in elig.candidates}
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
    reasons_seen = {r for reasons in elig.excluded.values() for r in reasons if reasons[r] or r is Reason.NO_ACCELERATOR}
    hints = [r.hint for r in Reason if r in reasons_seen]
    hints.append("or ask for fewer devices (smaller --dp/--pp/--tp)")
    return Unschedulable("; ".join(parts) + ". To fit: " + "; ".join(hints))


def _node_reason_text(usable: int, reasons: dict[Reason, int], details: dict[Reason, set[str]]) -> str:
    if reasons.get(Reason.NO_ACCELERATOR) == 0 and len(reasons) == 1:
        return "no accelerators (no accelerator)"
    pieces = []
    for reason, count in reasons.items():
        if reason in (Reason.MEMORY, Reason.MIN_MEMORY):
            sizes = "/".join(sorted(details.get(reason, {"?"})))
            pieces.append(f"{count} device{'s' if count != 1 else ''} of {sizes} ({reason.value})")
        elif reason in (Reason.VENDOR, Reason.MODEL, Reason.ARCH):
            what = "/".join(sorted(details.get(reason, {"?"})))
            pieces.append(f"{count} {what} device{'s' if count != 1 else ''} ({reason.value})")
        else:
            pieces.append(f"{count} device{'s' if count != 1 else ''} excluded ({reason.value})")
    lead = f"{usable} usable device{'s' if usable != 1 else ''}, " if usable else ""
    return lead + ", ".join(pieces)
