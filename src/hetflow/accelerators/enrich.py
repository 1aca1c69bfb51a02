"""Fill a node's unknowns from the catalog: model names, architectures, memory, link GB/s.

Discovery and the recorded-output parsers report facts only; this is the one named step
that adds catalog knowledge. It never changes a reported fact and never invents a link: a
pair of devices the tools said nothing about stays absent (unknown, 0 GB/s to the planner).
"""

from __future__ import annotations

import dataclasses

from hetflow.accelerators.bandwidth import estimate_link
from hetflow.accelerators.catalog import Catalog, default_catalog
from hetflow.accelerators.spec import AcceleratorSpec
from hetflow.core.topology import Device, NodeTopology, Vendor

# AMD compute-partition modes and how many partitions of a package each makes. CPX means one
# partition per XCD, which is the row's ``partitions`` (8 on MI300X, 4 on MI308X).
_FIXED_PARTITION_MODES = {"SPX": 1, "DPX": 2, "TPX": 3, "QPX": 4}
_PER_XCD_MODE = "CPX"


def enrich_node(node: NodeTopology, catalog: Catalog | None = None) -> NodeTopology:
    """``node`` with catalog facts filled in where the tools left them unknown.

    For each device whose catalog row is found (from its model, product name or PCI device
    id, with memory and compute units to tell apart rows that share a name):

    * ``model`` becomes the canonical catalog name;
    * ``arch`` is set when None;
    * ``memory_bytes`` is set when None: the row's memory, divided by the number of
      partitions of the package for a partitioned device (known only for AMD modes
      SPX/DPX/TPX/QPX/CPX; otherwise it stays None);
    * ``compute_units`` is set when None, for whole devices only.

    A CPU device with no row of its own gets the catalog's CPU row. Then every link without a
    reported bandwidth gets a catalog estimate (:func:`estimate_link`); links are neither
    added nor removed.
    """
    catalog = catalog or default_catalog()
    specs: dict[int, AcceleratorSpec | None] = {}
    devices = []
    for device in node.devices:
        spec = find_spec(device, catalog)
        specs[device.index] = spec
        devices.append(_fill_device(device, spec) if spec is not None else device)
    links = [estimate_link(l, specs.get(l.a), specs.get(l.b)) for l in node.links]
    return dataclasses.replace(node, devices=tuple(devices), links=tuple(links))


def find_spec(device: Device, catalog: Catalog | None = None) -> AcceleratorSpec | None:
    """The catalog row of ``device``, or None; a row of another vendor is never returned.

    Tried in order: the model (if a tool or an earlier pass set one), the product name, the
    PCI device id. Memory is used to choose among rows only for whole devices, because a
    partition's memory is a fraction of the package's.
    """
    catalog = catalog or default_catalog()
    memory = device.memory_bytes if device.partition is None else None
    units = device.compute_units if device.partition is None else None
    for text in (device.model, device.name, device.device_id):
        if not text:
            continue
        spec = catalog.find(text, memory_bytes=memory, compute_units=units)
        if spec is not None and spec.vendor is device.vendor:
            return spec
    if device.vendor is Vendor.CPU:
        cpu_rows = [s for s in catalog.specs if s.vendor is Vendor.CPU]
        if len(cpu_rows) == 1:
            return cpu_rows[0]
    return None


def _fill_device(device: Device, spec: AcceleratorSpec) -> Device:
    changes: dict[str, object] = {"model": spec.name}
    if device.arch is None and spec.arch is not None:
        changes["arch"] = spec.arch
    if device.memory_bytes is None and spec.memory_bytes is not None:
        share = _partitions_of_package(device, spec)
        if share is not None:
            changes["memory_bytes"] = spec.memory_bytes // share
    if device.compute_units is None and device.partition is None and spec.compute_units:
        changes["compute_units"] = spec.compute_units
    return dataclasses.replace(device, **changes)  # type: ignore[arg-type]


def _partitions_of_package(device: Device, spec: AcceleratorSpec) -> int | None:
    """How many partitions share the package's memory: 1 for a whole device, None if unknown."""
    if device.partition is None:
        return 1
    mode = device.partition.split()[0].upper() if device.partition.split() else ""
    if mode in _FIXED_PARTITION_MODES:
        return _FIXED_PARTITION_MODES[mode]
    if mode == _PER_XCD_MODE:
        return spec.partitions
    # MIG profiles and unknown modes: sizes differ per instance; the tools report them.
    return None
