"""Live discovery of NVIDIA GPUs through NVML (the ``pynvml`` module of nvidia-ml-py).

:func:`discover` returns a partial :class:`NodeTopology` of facts NVML reported (sources
``("nvml",)``), or ``None`` when this backend finds nothing: nvidia-ml-py not installed, no
driver (``nvmlInit`` fails), or zero GPUs. Those cases log why and never raise.

What is read, per whole GPU (MIG instances are not listed: NVML's device index enumerates
physical GPUs, which is what CUDA_VISIBLE_DEVICES indices address when nothing filters them):
name, memory total, UUID, PCI bus id (normalised to ``dddd:bb:dd.f``), PCI device id, compute
capability (``sm_90``), and the nearest host NUMA node.

Links, per pair of GPUs:

- both GPUs have an active NVLink whose remote end is an NVSwitch: ``NVSWITCH`` (all-to-all),
  ``count`` = the smaller of the two GPUs' active NVLink counts (what the pair can use);
- otherwise direct NVLinks between them: ``NVLINK``, ``count`` = links to that peer;
- otherwise ``PCIE``. ``pcie_level`` is NVML's PCIe common ancestor (PIX..SYS) on every pair,
  NVLink pairs included; ``None`` where NVML does not say.

Bandwidths are left unknown: NVML reports links, not GB/s; the catalog estimates them later.

Run by hand on a GPU host: ``python -c "from hetflow.accelerators import nvidia; print(nvidia.discover())"``.
"""

from __future__ import annotations

import logging
import socket
from collections import Counter
from dataclasses import dataclass, field
from types import ModuleType
from typing import Any, Callable

from hetflow.core.pci import normalize_pci_bus_id as _normalize_pci_bus_id
from hetflow.core.topology import Device, Link, LinkKind, NodeTopology, PcieLevel, Vendor

log = logging.getLogger(__name__)

SOURCE = "nvml"

# nvmlDeviceGetMemoryAffinity fills this many 64-bit words of NUMA node set (256 nodes).
_NODE_SET_WORDS = 4
# How NVML answers for an NVLink number the GPU does not have (or when it has no NVLink).
_NVLINK_ABSENT_ERRORS = ("NVMLError_NotSupported", "NVMLError_InvalidArgument")


def discover(lib: Any = None) -> NodeTopology | None:
    """This host's NVIDIA GPUs as NVML reports them, or ``None`` when there are none.

    ``lib`` is the ``pynvml`` module (tests pass a fake); by default it is imported here, lazily.
    NVML is always shut down again once it was initialised.
    """
    if lib is None:
        lib = _import_pynvml()
        if lib is None:
            return None
    try:
        lib.nvmlInit()
    except lib.NVMLError as err:
        log.info("NVML did not initialise (%s: %s): no NVIDIA GPUs found", type(err).__name__, err)
        return None
    try:
        return _read_node(lib)
    except lib.NVMLError as err:
        log.warning("NVML failed while listing GPUs (%s: %s): ignoring NVIDIA GPUs", type(err).__name__, err)
        return None
    finally:
        try:
            lib.nvmlShutdown()
        except lib.NVMLError as err:
            log.debug("nvmlShutdown failed: %s", err)


normalize_pci_bus_id = _normalize_pci_bus_id  # kept for callers of this module


def _import_pynvml() -> ModuleType | None:
    try:
        import pynvml  # nvidia-ml-py
    except Exception as err:  # ImportError, or anything a broken install raises on import
        log.info("pynvml (nvidia-ml-py) is not importable (%s: %s): no NVIDIA GPUs found", type(err).__name__, err)
        return None
    return pynvml


def _read_node(lib: Any) -> NodeTopology | None:
    count = lib.nvmlDeviceGetCount()
    handles: dict[int, Any] = {}
    for index in range(count):
        try:
            handles[index] = lib.nvmlDeviceGetHandleByIndex(index)
        except lib.NVMLError as err:
            # Keep NVML's numbering for the others: it is what CUDA_VISIBLE_DEVICES addresses.
            log.warning("NVML could not open GPU %d (%s); leaving it out", index, err)
    if not handles:
        log.info("NVML initialised but reports %d usable GPUs: no NVIDIA GPUs found", count)
        return None
    devices = [_read_device(lib, index, handle) for index, handle in handles.items()]
    links = _read_links(lib, handles, devices)
    return NodeTopology(
        name=socket.gethostname(),
        devices=tuple(devices),
        links=tuple(sorted(links, key=lambda l: (l.a, l.b))),
        sources=(SOURCE,),
    )


def _optional(lib: Any, call: Callable[..., Any], *args: Any) -> Any:
    """``call(*args)``, or ``None`` when NVML cannot answer it (not supported, old driver)."""
    try:
        return call(*args)
    except lib.NVMLError as err:
        log.debug("%s: %s", getattr(call, "__name__", call), err)
        return None


def _read_device(lib: Any, index: int, handle: Any) -> Device:
    pci = _optional(lib, lib.nvmlDeviceGetPciInfo, handle)
    memory = _optional(lib, lib.nvmlDeviceGetMemoryInfo, handle)
    capability = _optional(lib, lib.nvmlDeviceGetCudaComputeCapability, handle)
    return Device(
        index=index,
        vendor=Vendor.NVIDIA,
        name=_text(_optional(lib, lib.nvmlDeviceGetName, handle)),
        memory_bytes=int(memory.total) if memory is not None else None,
        arch=f"sm_{capability[0]}{capability[1]}" if capability else None,
        numa_node=_numa_node(lib, handle),
        pci_bus_id=normalize_pci_bus_id(pci.busId) if pci is not None else None,
        uuid=_text(_optional(lib, lib.nvmlDeviceGetUUID, handle)),
        device_id=f"0x{(int(pci.pciDeviceId) >> 16) & 0xFFFF:04x}" if pci is not None else None,
    )


def _text(value: str | bytes | None) -> str | None:
    if value is None:
        return None
    return value.decode() if isinstance(value, bytes) else value


def _numa_node(lib: Any, handle: Any) -> int | None:
    """The host NUMA node nearest the GPU (``NUMA Affinity`` in ``nvidia-smi topo -m``).

    ``nvmlDeviceGetNumaNodeId`` is only a fallback: NVML documents it for platforms where the GPU
    is itself a NUMA node (coherent C2C), so on PCIe hosts it is NotSupported. When the affinity
    names several nodes the lowest is taken.
    """
    affinity = getattr(lib, "nvmlDeviceGetMemoryAffinity", None)
    if affinity is not None:
        words = _optional(lib, affinity, handle, _NODE_SET_WORDS, getattr(lib, "NVML_AFFINITY_SCOPE_NODE", 0))
        if words is not None:
            for w, word in enumerate(words):
                if word:
                    return w * 64 + (int(word) & -int(word)).bit_length() - 1
    node_id = getattr(lib, "nvmlDeviceGetNumaNodeId", None)
    if node_id is not None:
        node = _optional(lib, node_id, handle)
        if node is not None and node >= 0:
            return int(node)
    return None


@dataclass
class _NvLinkScan:
    """What one GPU's NVLinks reach."""

    active: int = 0
    on_switch: bool = False
    peers: Counter[int] = field(default_factory=Counter)  # peer device index -> links to it


def _scan_nvlinks(lib: Any, handle: Any, own: int, by_bus_id: dict[str, int]) -> _NvLinkScan:
    absent = tuple(getattr(lib, name) for name in _NVLINK_ABSENT_ERRORS)
    scan = _NvLinkScan()
    for link in range(lib.NVML_NVLINK_MAX_LINKS):
        try:
            if lib.nvmlDeviceGetNvLinkState(handle, link) != lib.NVML_FEATURE_ENABLED:
                continue
        except lib.NVMLError as err:
            if not isinstance(err, absent):
                log.warning("GPU %d NVLink %d: %s; treating the link as absent", own, link, err)
            continue
        scan.active += 1
        remote_type = _optional(lib, lib.nvmlDeviceGetNvLinkRemoteDeviceType, handle, link)
        if remote_type == lib.NVML_NVLINK_DEVICE_TYPE_SWITCH:
            scan.on_switch = True
        elif remote_type in (lib.NVML_NVLINK_DEVICE_TYPE_GPU, None):
            # None: an older driver cannot name the type; a bus id matching one of our GPUs
            # still identifies a direct GPU link.
            remote = _optional(lib, lib.nvmlDeviceGetNvLinkRemotePciInfo, handle, link)
            peer = by_bus_id.get(normalize_pci_bus_id(remote.busId) or "") if remote is not None else None
            if peer is not None and peer != own:
                scan.peers[peer] += 1
    return scan


def _pcie_level(lib: Any, h1: Any, h2: Any) -> PcieLevel | None:
    level = _optional(lib, lib.nvmlDeviceGetTopologyCommonAncestor, h1, h2)
    if level is None:
        return None
    if level == lib.NVML_TOPOLOGY_INTERNAL:
        return PcieLevel.PIX  # both on one board (e.g. a dual-GPU card)
    try:
        return PcieLevel(level)
    except ValueError:
        log.debug("unknown NVML topology level %r", level)
        return None


def _read_links(lib: Any, handles: dict[int, Any], devices: list[Device]) -> list[Link]:
    by_bus_id = {d.pci_bus_id: d.index for d in devices if d.pci_bus_id}
    scans = {i: _scan_nvlinks(lib, h, i, by_bus_id) for i, h in handles.items()}
    links = []
    indices = sorted(handles)
    for n, a in enumerate(indices):
        for b in indices[n + 1 :]:
            level = _pcie_level(lib, handles[a], handles[b])
            sa, sb = scans[a], scans[b]
            # Each side counts its own links; take the larger in case one side's query failed.
            direct = max(sa.peers[b], sb.peers[a])
            if sa.on_switch and sb.on_switch:
                kind, count = LinkKind.NVSWITCH, min(sa.active, sb.active)
            elif direct:
                kind, count = LinkKind.NVLINK, direct
            else:
                kind, count = LinkKind.PCIE, None
            links.append(Link(a=a, b=b, kind=kind, pcie_level=level, count=count))
    return links
