"""Live discovery of AMD GPUs through amdsmi (the ``amdsmi`` Python package of ROCm).

:func:`discover` returns a partial :class:`NodeTopology` of facts amdsmi reported (sources
``("amdsmi",)``), or ``None`` when this backend finds nothing: amdsmi not importable (without
``libamd_smi.so`` its import raises KeyError, not ImportError), ``amdsmi_init`` failing (no
amdgpu driver), or zero GPUs. Those cases log why and never raise.

Devices: one per processor handle, i.e. per GCD (MI250X) or compute partition (MI300X in CPX
mode gives 8 per card). ``index`` is the HIP device id amdsmi reports
(``amdsmi_get_gpu_enumeration_info``), the number HIP_VISIBLE_DEVICES addresses; when amdsmi
cannot report one for every handle, the handle order is used. Facts per device: market name,
PCI device id, gfx target (``arch``), compute units, VRAM total, BDF, UUID, NUMA node, compute
partition (``None`` for SPX, i.e. a whole GPU).

Packages: partitions of one physical GPU are PCI functions of one PCI device (the MI300X CPX
KFD fixture shows ``05:00.0`` .. ``05:00.7``), so devices whose BDFs share domain, bus and
device are one package. ``Device.package`` is the ordinal of that physical GPU on the node, set
only for devices that share their package; a whole GPU keeps ``None``. (MI250X GCDs are separate
PCI devices and so count as separate packages here.)

Links, per pair: partitions of one package are ``SAME_PACKAGE``; otherwise amdsmi's link type
(XGMI or PCIE). ``weight`` and ``hops`` come from amdsmi as they are; ``bandwidth_gbps`` is
amdsmi's max bandwidth (MB/s / 1000) when it is above zero (it is only reported for direct xGMI
peers), noted ``"reported by amdsmi (max)"``. AMD does not report a PCIe common-ancestor level,
so ``pcie_level`` stays ``None``.

Run by hand on a ROCm host: ``python -c "from hetflow.accelerators import amd; print(amd.discover())"``.
"""

from __future__ import annotations

import logging
import socket
from dataclasses import dataclass, replace
from types import ModuleType
from typing import Any, Callable

from hetflow.accelerators.nvidia import normalize_pci_bus_id
from hetflow.core.topology import Device, Link, LinkKind, NodeTopology, Vendor

log = logging.getLogger(__name__)

SOURCE = "amdsmi"
BANDWIDTH_NOTE = "reported by amdsmi (max)"

# amdsmi_link_type_t values (AmdSmiLinkType); kept here so a fake or an older amdsmi without
# the enum still reads the same.
_LINK_INTERNAL, _LINK_PCIE, _LINK_XGMI = 0, 1, 2
_LINK_KINDS = {_LINK_INTERNAL: LinkKind.SAME_PACKAGE, _LINK_PCIE: LinkKind.PCIE, _LINK_XGMI: LinkKind.XGMI}
_WHOLE_DEVICE_PARTITIONS = {"", "SPX", "N/A"}
_GPU_TYPE = "AMDSMI_PROCESSOR_TYPE_AMD_GPU"


def discover(lib: Any = None) -> NodeTopology | None:
    """This host's AMD GPUs (or their partitions) as amdsmi reports them, or ``None``.

    ``lib`` is the ``amdsmi`` module (tests pass a fake); by default it is imported here, lazily.
    amdsmi is always shut down again once it was initialised.
    """
    if lib is None:
        lib = _import_amdsmi()
        if lib is None:
            return None
    try:
        lib.amdsmi_init(lib.AmdSmiInitFlags.INIT_AMD_GPUS)
    except lib.AmdSmiException as err:
        log.info("amdsmi did not initialise (%s: %s): no AMD GPUs found", type(err).__name__, _describe(err))
        return None
    try:
        return _read_node(lib)
    except lib.AmdSmiException as err:
        log.warning("amdsmi failed while listing GPUs (%s): ignoring AMD GPUs", _describe(err))
        return None
    finally:
        try:
            lib.amdsmi_shut_down()
        except lib.AmdSmiException as err:
            log.debug("amdsmi_shut_down failed: %s", _describe(err))


def _import_amdsmi() -> ModuleType | None:
    try:
        import amdsmi
    except Exception as err:  # KeyError('libamd_smi.so') when the library is missing
        log.info("amdsmi is not importable (%s: %s): no AMD GPUs found", type(err).__name__, err)
        return None
    return amdsmi


def _describe(err: BaseException) -> str:
    """One line: AmdSmiLibraryException's str() spans two lines."""
    return " ".join(str(err).split())


def _optional(lib: Any, call: Callable[..., Any], *args: Any) -> Any:
    """``call(*args)``, or ``None`` when amdsmi cannot answer it (not supported, old version)."""
    try:
        return call(*args)
    except lib.AmdSmiException as err:
        log.debug("%s: %s", getattr(call, "__name__", call), _describe(err))
        return None


@dataclass(frozen=True)
class _Gpu:
    handle: Any
    device: Device


def _read_node(lib: Any) -> NodeTopology | None:
    handles = [h for h in lib.amdsmi_get_processor_handles() if is_gpu(lib, h)]
    if not handles:
        log.info("amdsmi initialised but reports no GPU processors: no AMD GPUs found")
        return None
    indices = hip_indices(lib, handles)
    gpus = [_Gpu(h, _read_device(lib, i, h)) for i, h in zip(indices, handles)]
    gpus = _assign_packages(sorted(gpus, key=lambda g: g.device.index))
    links = [_read_link(lib, a, b) for n, a in enumerate(gpus) for b in gpus[n + 1 :]]
    return NodeTopology(
        name=socket.gethostname(),
        devices=tuple(g.device for g in gpus),
        links=tuple(sorted(links, key=lambda l: (l.a, l.b))),
        sources=(SOURCE,),
    )


def is_gpu(lib: Any, handle: Any) -> bool:
    """Whether an amdsmi processor handle is a GPU (amdsmi also lists CPUs and cores)."""
    kind = _optional(lib, lib.amdsmi_get_processor_type, handle)
    # Unknown type: keep it; amdsmi was initialised for GPUs only.
    return kind is None or kind.get("processor_type") == _GPU_TYPE


def hip_indices(lib: Any, handles: list[Any]) -> list[int]:
    """The HIP device id of each handle; the handle order when any id is missing or repeated."""
    enumerate_info = getattr(lib, "amdsmi_get_gpu_enumeration_info", None)  # amdsmi >= 6.4
    if enumerate_info is not None:
        infos = [_optional(lib, enumerate_info, h) for h in handles]
        ids = [info.get("hip_id") if info else None for info in infos]
        if all(isinstance(i, int) for i in ids) and len(set(ids)) == len(ids):
            return ids  # type: ignore[return-value]
        log.debug("amdsmi HIP ids %r are incomplete; numbering devices in handle order", ids)
    return list(range(len(handles)))


def _known(value: Any) -> Any:
    """amdsmi prints unknown values as "N/A" (or an empty string)."""
    return None if value in ("N/A", "", None) else value


def _read_device(lib: Any, index: int, handle: Any) -> Device:
    asic = _optional(lib, lib.amdsmi_get_gpu_asic_info, handle) or {}
    compute_units = _known(asic.get("num_compute_units"))
    numa = _optional(lib, lib.amdsmi_topo_get_numa_node_number, handle)
    partition = _optional(lib, lib.amdsmi_get_gpu_compute_partition, handle)
    partition = None if partition is None or partition.strip().upper() in _WHOLE_DEVICE_PARTITIONS else partition.strip().upper()
    return Device(
        index=index,
        vendor=Vendor.AMD,
        name=_known(asic.get("market_name")),
        memory_bytes=_optional(lib, lib.amdsmi_get_gpu_memory_total, handle, lib.AmdSmiMemoryType.VRAM),
        arch=_known(asic.get("target_graphics_version")),
        # amdsmi returns an unsigned 32-bit number; "no NUMA" comes back as 0xFFFFFFFF.
        numa_node=numa if isinstance(numa, int) and 0 <= numa < 1 << 31 else None,
        pci_bus_id=normalize_pci_bus_id(_optional(lib, lib.amdsmi_get_gpu_device_bdf, handle)),
        uuid=_known(_optional(lib, lib.amdsmi_get_gpu_device_uuid, handle)),
        partition=partition,
        compute_units=compute_units if isinstance(compute_units, int) else None,
        device_id=_known(asic.get("device_id")),
    )


def _physical_key(bus_id: str | None) -> str | None:
    """``"0000:05:00.3"`` -> ``"0000:05:00"``: the PCI device, without the function."""
    return bus_id.rsplit(".", 1)[0] if bus_id else None


def _assign_packages(gpus: list[_Gpu]) -> list[_Gpu]:
    """Number the physical GPUs in device order; mark devices that share one as its partitions."""
    members: dict[str, list[int]] = {}
    for n, g in enumerate(gpus):
        key = _physical_key(g.device.pci_bus_id) or f"unknown-{n}"
        members.setdefault(key, []).append(n)
    out = list(gpus)
    for ordinal, group in enumerate(members.values()):
        if len(group) < 2:
            continue
        for n in group:
            g = out[n]
            out[n] = _Gpu(g.handle, replace(g.device, package=ordinal))
    return out


def _read_link(lib: Any, a: _Gpu, b: _Gpu) -> Link:
    """The link between two devices, ``a`` having the lower index."""
    link_type = _optional(lib, lib.amdsmi_topo_get_link_type, a.handle, b.handle) or {}
    type_value = link_type.get("type")
    type_value = getattr(type_value, "value", type_value)  # some amdsmi calls return c_uint32
    same_package = a.device.package is not None and a.device.package == b.device.package
    kind = LinkKind.SAME_PACKAGE if same_package else _LINK_KINDS.get(type_value, LinkKind.UNKNOWN)
    weight = _optional(lib, lib.amdsmi_topo_get_link_weight, a.handle, b.handle)
    bandwidth = _optional(lib, lib.amdsmi_get_minmax_bandwidth_between_processors, a.handle, b.handle) or {}
    max_mbps = bandwidth.get("max_bandwidth") or 0
    return Link(
        a=a.device.index,
        b=b.device.index,
        kind=kind,
        weight=int(weight) if weight is not None else None,
        hops=_known(link_type.get("hops")),
        bandwidth_gbps=max_mbps / 1000 if max_mbps > 0 else None,
        bandwidth_note=BANDWIDTH_NOTE if max_mbps > 0 else None,
    )
