"""Made-up nodes from catalog shorthand: ``"8x MI300X"``, ``"4x V100"``, ``"2 x L40S"``, ``"cpu"``.

Simulations and tests describe clusters far larger than any recorded machine; a synthetic node
is the usual board of a catalog model, built from the row's data alone:

* devices: COUNT devices with the row's model, memory, architecture, compute units and PCI id.
  A device is what the runtime enumerates, so ``"8x MI250X"`` is 8 GCDs on 4 packages
  (``devices_per_package`` 2): COUNT must be a multiple of that.
* NUMA: boxes of 4 or more devices are split over two NUMA nodes, the first half on 0 and the
  second half on 1 (a package is never split); smaller boxes sit on NUMA node 0.
* links, by the row's ``link_kind``, for every pair of devices:

  - devices of one package: ``SAME_PACKAGE``;
  - ``NVSWITCH``: all-to-all, count = ``links_per_device`` (HGX/DGX boards);
  - ``XGMI``: all-to-all, one link of weight 15 (one hop) per pair: the OAM boards of
    MI300X-class parts. For MI250X this idealises Frontier-class nodes, where some GCD pairs
    are two or three hops apart;
  - ``NVLINK`` (V100): 8 devices with 6 links each form the DGX-1 hybrid cube-mesh below
    (pairs it does not link go over PCIe SYS, since they sit on different NUMA nodes); other
    counts up to ``links_per_device + 1`` are all-to-all with ``links_per_device // (n - 1)``
    links per pair;
  - ``PCIE``: PHB within a NUMA node, SYS across.

* a row without a fabric (the CPU row) makes a one-device node.

Then the node is enriched (:func:`enrich_node`), so every link has a catalog estimate.
"""

from __future__ import annotations

import math
import re

from hetflow.accelerators.catalog import Catalog, default_catalog
from hetflow.accelerators.enrich import enrich_node
from hetflow.accelerators.spec import AcceleratorSpec
from hetflow.core.errors import InputError
from hetflow.core.topology import Device, Link, LinkKind, NodeTopology, PcieLevel

MAX_DEVICES = 64
_FORM_HELP = "write COUNT x MODEL, e.g. '8x MI300X', '4x V100', '2 x L40S', or 'cpu'"
_SHORTHAND = re.compile(r"^\s*(?:(\d+)\s*[x×*]\s*)?(\S.*?)\s*$", re.IGNORECASE)
_NUMA_SPLIT_MIN_DEVICES = 4
_XGMI_ONE_HOP_WEIGHT = 15

# DGX-1 with V100 (hybrid cube-mesh): NVLinks per GPU pair, as `nvidia-smi topo -m` shows
# NV1/NV2 on that machine. Two fully linked quads (0-3, 4-7) plus i <-> i+4; 6 links per GPU.
DGX1_CUBE_MESH: dict[tuple[int, int], int] = {
    (0, 1): 1, (0, 2): 1, (0, 3): 2, (1, 2): 2, (1, 3): 1, (2, 3): 2,
    (4, 5): 1, (4, 6): 1, (4, 7): 2, (5, 6): 2, (5, 7): 1, (6, 7): 2,
    (0, 4): 2, (1, 5): 2, (2, 6): 1, (3, 7): 1,
}
_CUBE_MESH_DEVICES = 8
_CUBE_MESH_LINKS_PER_DEVICE = 6


def synthetic_node(spec_text: str, name: str, catalog: Catalog | None = None) -> NodeTopology:
    """A node of COUNT catalog devices from shorthand such as ``"8x MI300X"``, enriched.

    Raises InputError for text that is not ``COUNT x MODEL`` (or a bare model), an unknown
    model (with "did you mean"), or a count the model's board cannot have.
    """
    catalog = catalog or default_catalog()
    count, model_text = _parse_shorthand(spec_text)
    try:
        spec = catalog.lookup(model_text)
    except InputError as exc:
        raise InputError(f"synthetic node {spec_text!r} ({_FORM_HELP}): {exc}") from None
    _check_count(spec, count, spec_text)
    numa = _numa_nodes(spec, count)
    devices = tuple(_device(spec, i, numa[i]) for i in range(count))
    links = [_link(spec, a, b, devices, count) for a in range(count) for b in range(a + 1, count)]
    node = NodeTopology(
        name=name,
        devices=devices,
        numa_nodes=len(set(numa)),
        sources=(f"synthetic: {count}x {spec.name}",),
    ).with_links(links)
    return enrich_node(node, catalog)


def _parse_shorthand(text: str) -> tuple[int, str]:
    match = _SHORTHAND.match(text) if isinstance(text, str) else None
    if match is None:
        raise InputError(f"cannot read synthetic node {text!r}: {_FORM_HELP}")
    count = int(match.group(1)) if match.group(1) is not None else 1
    if not 1 <= count <= MAX_DEVICES:
        raise InputError(
            f"synthetic node {text!r}: COUNT must be between 1 and {MAX_DEVICES}, got {count}"
            f" ({_FORM_HELP})"
        )
    return count, match.group(2)


def _check_count(spec: AcceleratorSpec, count: int, text: str) -> None:
    per_package = spec.devices_per_package
    if count % per_package:
        raise InputError(
            f"synthetic node {text!r}: {spec.name} devices come {per_package} per package "
            f"(a device is what the runtime enumerates), so COUNT must be a multiple of "
            f"{per_package}, e.g. '{2 * per_package}x {spec.name}'"
        )
    if spec.link_kind is None and count > 1:
        raise InputError(
            f"synthetic node {text!r}: {spec.name} has no device-to-device fabric in the"
            f" catalog; a {spec.name} node has one device, write '{spec.name.lower()}'"
        )
    if spec.link_kind is LinkKind.NVLINK and not _nvlink_layout_exists(spec, count):
        raise InputError(
            f"synthetic node {text!r}: {spec.name} NVLink boards have 8 GPUs (DGX-1 cube-mesh)"
            f" or up to {(spec.links_per_device or 0) + 1} GPUs linked all-to-all; "
            f"choose one of those counts"
        )


def _nvlink_layout_exists(spec: AcceleratorSpec, count: int) -> bool:
    links = spec.links_per_device or 0
    if count == _CUBE_MESH_DEVICES:
        return links == _CUBE_MESH_LINKS_PER_DEVICE
    return count <= links + 1


def _numa_nodes(spec: AcceleratorSpec, count: int) -> list[int]:
    if count < _NUMA_SPLIT_MIN_DEVICES:
        return [0] * count
    per_package = spec.devices_per_package
    first_half = math.ceil(count / 2 / per_package) * per_package  # never split a package
    return [0 if i < first_half else 1 for i in range(count)]


def _device(spec: AcceleratorSpec, index: int, numa_node: int) -> Device:
    per_package = spec.devices_per_package
    return Device(
        index=index,
        vendor=spec.vendor,
        model=spec.name,
        memory_bytes=spec.memory_bytes,
        arch=spec.arch,
        numa_node=numa_node,
        package=index // per_package if per_package > 1 else None,
        compute_units=spec.compute_units,
        device_id=spec.pci_device_ids[0] if spec.pci_device_ids else None,
    )


def _link(spec: AcceleratorSpec, a: int, b: int, devices: tuple[Device, ...], count: int) -> Link:
    da, db = devices[a], devices[b]
    if da.package is not None and da.package == db.package:
        return Link(a, b, LinkKind.SAME_PACKAGE)
    kind = spec.link_kind
    if kind is LinkKind.NVSWITCH:
        return Link(a, b, LinkKind.NVSWITCH, count=spec.links_per_device)
    if kind is LinkKind.XGMI:
        return Link(a, b, LinkKind.XGMI, count=1, weight=_XGMI_ONE_HOP_WEIGHT, hops=1)
    if kind is LinkKind.NVLINK:
        nvlinks = _nvlink_count(spec, a, b, count)
        if nvlinks:
            return Link(a, b, LinkKind.NVLINK, count=nvlinks)
    same_numa = da.numa_node == db.numa_node
    return Link(a, b, LinkKind.PCIE, pcie_level=PcieLevel.PHB if same_numa else PcieLevel.SYS)


def _nvlink_count(spec: AcceleratorSpec, a: int, b: int, count: int) -> int:
    if count == _CUBE_MESH_DEVICES:
        return DGX1_CUBE_MESH.get((a, b), 0)
    return (spec.links_per_device or 0) // (count - 1)
