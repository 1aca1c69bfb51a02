"""Merge partial descriptions of one machine into one NodeTopology.

Several recorded files may describe one node: ``nvidia-smi topo -m`` gives links and NUMA but no
memory, ``nvidia-smi -q -x`` gives names and memory but no links. Devices are matched by PCI bus
id, then UUID, then index; a fact known in one part fills the gap in another, and two parts that
disagree on a fact raise InputError naming both sources.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Sequence

from hetflow.core.errors import InputError
from hetflow.core.topology import Device, Link, LinkKind, NodeTopology

# When two sources name different kinds for one pair, the more specific one wins: a PCIe-only
# view (topo -m on a VM, KFD without xGMI) does not overrule a reported NVLink/xGMI link.
_KIND_RANK = {
    LinkKind.UNKNOWN: 0,
    LinkKind.PCIE: 1,
    LinkKind.XGMI: 2,
    LinkKind.NVLINK: 2,
    LinkKind.NVSWITCH: 3,
    LinkKind.SAME_PACKAGE: 4,
}


# Fields whose spelling differs between tools for the same device: the first source wins.
_SPELLINGS = ("name", "uuid")


def _sources(node: NodeTopology) -> str:
    return ", ".join(node.sources) or node.name


def _merge_fields(a: Any, b: Any, what: str, where: tuple[str, str], skip: tuple[str, ...] = ()) -> Any:
    """Fill a's unknown (None) fields from b; conflicting known values are an error."""
    updates = {}
    for f in dataclasses.fields(a):
        if f.name in skip:
            continue
        va, vb = getattr(a, f.name), getattr(b, f.name)
        if va is None and vb is not None:
            updates[f.name] = vb
        elif va is not None and vb is not None and va != vb and f.name not in _SPELLINGS:
            raise InputError(
                f"{what}: {f.name} is {va!r} in {where[0]} but {vb!r} in {where[1]}; "
                "are these files from the same machine?"
            )
    return dataclasses.replace(a, **updates) if updates else a


def _match(dev: Device, devices: dict[int, Device]) -> int | None:
    """The index in ``devices`` of the same physical device as ``dev``, or None.

    The PCI bus id is decisive. UUIDs only confirm a match: tools spell them differently
    (NVML "GPU-...", rocm-smi "0x8d14...", amdsmi's own form), so a UUID mismatch falls back
    to the index rather than declaring a different device.
    """
    if dev.pci_bus_id is not None:
        for idx, other in devices.items():
            if other.pci_bus_id == dev.pci_bus_id:
                return idx
    if dev.uuid is not None:
        for idx, other in devices.items():
            if other.uuid == dev.uuid:
                return idx
    same_index = devices.get(dev.index)
    if same_index is None:
        return None
    if None not in (same_index.pci_bus_id, dev.pci_bus_id) and same_index.pci_bus_id != dev.pci_bus_id:
        return None  # both know their bus id and they differ: a different device
    return dev.index


def _merge_two(base: NodeTopology, part: NodeTopology) -> NodeTopology:
    where = (_sources(base), _sources(part))
    devices = {d.index: d for d in base.devices}
    remap: dict[int, int] = {}
    for dev in part.devices:
        idx = _match(dev, devices)
        if idx is None:
            if dev.index in devices:
                raise InputError(
                    f"device {dev.index} of {where[1]} matches no device of {where[0]} "
                    "(different PCI bus id or UUID); are these files from the same machine?"
                )
            devices[dev.index] = dev
            remap[dev.index] = dev.index
            continue
        if devices[idx].vendor is not dev.vendor:
            raise InputError(
                f"device {idx}: vendor {devices[idx].vendor.value} in {where[0]} but "
                f"{dev.vendor.value} in {where[1]}"
            )
        devices[idx] = _merge_fields(devices[idx], dev, f"device {idx}", where, skip=("index",))
        remap[dev.index] = idx
    links = {(l.a, l.b): l for l in base.links}
    for link in part.links:
        a, b = sorted((remap.get(link.a, link.a), remap.get(link.b, link.b)))
        link = dataclasses.replace(link, a=a, b=b) if (a, b) != (link.a, link.b) else link
        old = links.get((a, b))
        if old is None:
            links[(a, b)] = link
            continue
        hi, lo = (old, link) if _KIND_RANK[old.kind] >= _KIND_RANK[link.kind] else (link, old)
        merged = hi
        for f in ("pcie_level", "count", "weight", "hops", "bandwidth_gbps", "bandwidth_note"):
            if getattr(merged, f) is None and getattr(lo, f) is not None:
                # the PCIe path level is a fact about either kind; counts etc. only within a kind
                if f == "pcie_level" or lo.kind is merged.kind:
                    merged = dataclasses.replace(merged, **{f: getattr(lo, f)})
        links[(a, b)] = merged
    host = {}
    for f in ("cpu_cores", "host_memory_bytes", "numa_nodes"):
        va, vb = getattr(base, f), getattr(part, f)
        host[f] = va if va is not None else vb
    return NodeTopology(
        name=base.name,
        devices=tuple(sorted(devices.values(), key=lambda d: d.index)),
        links=tuple(sorted(links.values(), key=lambda l: (l.a, l.b))),
        sources=base.sources + tuple(s for s in part.sources if s not in base.sources),
        **host,
    )


def merge_nodes(parts: Sequence[NodeTopology], name: str | None = None) -> NodeTopology:
    """One node from partial descriptions of the same machine (see the module docstring)."""
    if not parts:
        raise InputError("no files given for the node")
    node = parts[0]
    for part in parts[1:]:
        node = _merge_two(node, part)
    if name is not None:
        node = dataclasses.replace(node, name=name)
    return node


__all__ = ["merge_nodes", "Link"]
