"""A stand-in for the ``amdsmi`` Python package (checked against amdsmi 7.0.2).

amdsmi needs ``libamd_smi.so`` and the amdgpu driver, which CI does not have, so the discovery
tests hand this module to :func:`hetflow.accelerators.amd.discover` as ``lib``. It keeps the
real package's names, signatures, return shapes and exceptions for the subset hetflow calls:

- errors: ``AmdSmiLibraryException(err_code)`` (``get_error_code()``), the base
  ``AmdSmiException`` and ``AmdSmiParameterException``, raised where the real wrappers raise
  them (a handle that is not an ``amdsmi_processor_handle``, a memory type that is not an
  ``AmdSmiMemoryType``, an init flag that is not an ``AmdSmiInitFlags``);
- handles are ``ctypes.c_void_p`` (the real ``amdsmi_processor_handle`` is
  ``ctypes.POINTER(None)``, i.e. ``c_void_p``);
- ``amdsmi_get_gpu_asic_info`` returns the real dict keys with hex-string ids and ``"N/A"`` for
  unknown values; ``amdsmi_topo_get_link_type`` returns ``{"hops", "type"}``;
  ``amdsmi_get_minmax_bandwidth_between_processors`` returns MB/s and raises NOT_SUPPORTED for
  pairs that are not xGMI (as the library does);
- every device call before ``amdsmi_init`` (or after ``amdsmi_shut_down``) raises
  ``AmdSmiLibraryException(AMDSMI_STATUS_NOT_INIT)``;
- for the metrics sampler: ``amdsmi_get_gpu_activity`` (``gfx_activity`` %, "N/A" when
  unknown), ``amdsmi_get_gpu_memory_usage(h, VRAM)`` (bytes), ``amdsmi_get_power_info``
  (``socket_power`` in W) and ``amdsmi_get_link_metrics`` (cumulative ``read``/``write`` KB per
  xGMI link), with the real wrapper's return shapes.

What the fake machine holds is a :class:`FakeBox`; :func:`install` makes it current; the
``*_box()`` builders describe the machines the tests use.
"""

from __future__ import annotations

import ctypes
import sys
from dataclasses import dataclass, field
from enum import IntEnum
from types import ModuleType
from typing import Any

# ---- constants (values as in amdsmi_wrapper 7.0.2) ------------------------------------------

AMDSMI_STATUS_SUCCESS = 0
AMDSMI_STATUS_INVAL = 1
AMDSMI_STATUS_NOT_SUPPORTED = 2
AMDSMI_STATUS_INIT_ERROR = 18
AMDSMI_STATUS_NOT_FOUND = 31
AMDSMI_STATUS_NOT_INIT = 32
AMDSMI_STATUS_DRIVER_NOT_LOADED = 34

GIB = 1 << 30

amdsmi_processor_handle = ctypes.c_void_p


class AmdSmiInitFlags(IntEnum):
    INIT_ALL_PROCESSORS = 0xFFFFFFFF
    INIT_AMD_CPUS = 1 << 0
    INIT_AMD_GPUS = 1 << 1
    INIT_NON_AMD_CPUS = 1 << 2
    INIT_NON_AMD_GPUS = 1 << 3
    INIT_AMD_APUS = (1 << 0) | (1 << 1)


class AmdSmiMemoryType(IntEnum):
    VRAM = 0
    VIS_VRAM = 1
    GTT = 2


class AmdSmiLinkType(IntEnum):
    AMDSMI_LINK_TYPE_INTERNAL = 0
    AMDSMI_LINK_TYPE_XGMI = 2
    AMDSMI_LINK_TYPE_PCIE = 1
    AMDSMI_LINK_TYPE_NOT_APPLICABLE = 3
    AMDSMI_LINK_TYPE_UNKNOWN = 4


class AmdSmiComputePartitionType(IntEnum):
    SPX = 1
    DPX = 2
    TPX = 3
    QPX = 4
    CPX = 5
    INVALID = 0


# ---- exceptions (same shape as amdsmi_exception.py) -----------------------------------------


class AmdSmiException(Exception):
    """Base smi exception class"""


class AmdSmiLibraryException(AmdSmiException):
    def __init__(self, err_code: int) -> None:
        err_code = abs(err_code)
        super().__init__(err_code)
        self.err_code = err_code
        self.err_info = f"status {err_code}"

    def __str__(self) -> str:
        return f"Error code:\n\t{self.err_code} | {self.err_info}"

    def get_error_code(self) -> int:
        return self.err_code


class AmdSmiParameterException(AmdSmiException):
    def __init__(self, receivedValue: Any, expectedType: Any, msg: str | None = None) -> None:  # noqa: N803
        super().__init__(msg)
        self.err_code = None
        self.actualType = type(receivedValue)
        self.expectedType = expectedType


# ---- the fake machine -----------------------------------------------------------------------


@dataclass(frozen=True)
class FakePairLink:
    """What amdsmi reports for one pair of processors (the same in both directions)."""

    type: int  # AmdSmiLinkType value
    hops: int
    weight: int
    max_bandwidth_mbps: int  # KFD io_link max_bandwidth; 0 when not a direct xGMI peer
    min_bandwidth_mbps: int = 0


@dataclass
class FakeProcessor:
    bdf: str  # "0000:0c:00.0"
    uuid: str
    market_name: str
    device_id: int  # 0x74a1
    gfx: str  # "gfx942"
    num_compute_units: int
    vram_bytes: int
    numa_node: int
    compute_partition: str | None  # "SPX", "CPX"; None: the call raises NOT_SUPPORTED
    hip_id: int | None = None  # amdsmi_get_gpu_enumeration_info; None: the call raises
    # What the GPU is doing (the metrics sampler reads these; discovery does not):
    gfx_activity: int | None = 0  # amdsmi_get_gpu_activity()["gfx_activity"], %; None: "N/A"
    vram_used: int = 0  # amdsmi_get_gpu_memory_usage(h, VRAM), bytes
    socket_power_w: int | None = None  # amdsmi_get_power_info()["socket_power"], W; None: "N/A"
    # Cumulative xGMI data per link in KB (amdsmi_get_link_metrics "read"/"write"); empty:
    # the call raises NOT_SUPPORTED.
    xgmi_read_kb: list[int] = field(default_factory=list)
    xgmi_write_kb: list[int] = field(default_factory=list)


@dataclass
class FakeBox:
    processors: list[FakeProcessor] = field(default_factory=list)
    links: dict[tuple[int, int], FakePairLink] = field(default_factory=dict)  # by handle order
    init_error: int | None = None  # amdsmi_init raises AmdSmiLibraryException(init_error)


class _State:
    box: FakeBox = FakeBox()
    initialized = False
    init_calls = 0
    shutdown_calls = 0


state = _State()


def install(box: FakeBox) -> ModuleType:
    """Make ``box`` the machine this module describes; returns the module (pass it as ``lib``)."""
    state.box = box
    state.initialized = False
    state.init_calls = 0
    state.shutdown_calls = 0
    return sys.modules[__name__]


def _index(handle: Any) -> int:
    if not isinstance(handle, amdsmi_processor_handle):
        raise AmdSmiParameterException(handle, amdsmi_processor_handle)
    if not state.initialized:
        raise AmdSmiLibraryException(AMDSMI_STATUS_NOT_INIT)
    index = (handle.value or 0) - 1  # handles are 1-based pointers; 0 would be NULL
    if not 0 <= index < len(state.box.processors):
        raise AmdSmiLibraryException(AMDSMI_STATUS_INVAL)
    return index


def _proc(handle: Any) -> FakeProcessor:
    return state.box.processors[_index(handle)]


def _pair(src: Any, dst: Any) -> FakePairLink:
    a, b = _index(src), _index(dst)
    if a == b:
        return FakePairLink(type=AmdSmiLinkType.AMDSMI_LINK_TYPE_INTERNAL, hops=0, weight=0, max_bandwidth_mbps=0)
    return state.box.links[(min(a, b), max(a, b))]


# ---- the API --------------------------------------------------------------------------------


def amdsmi_init(flag: AmdSmiInitFlags = AmdSmiInitFlags.INIT_AMD_GPUS) -> None:
    if not isinstance(flag, AmdSmiInitFlags):
        raise AmdSmiParameterException(flag, AmdSmiInitFlags)
    state.init_calls += 1
    if state.box.init_error is not None:
        raise AmdSmiLibraryException(state.box.init_error)
    state.initialized = True


def amdsmi_shut_down() -> None:
    if not state.initialized:
        raise AmdSmiLibraryException(AMDSMI_STATUS_NOT_INIT)
    state.shutdown_calls += 1
    state.initialized = False


def amdsmi_get_processor_handles() -> list[ctypes.c_void_p]:
    if not state.initialized:
        raise AmdSmiLibraryException(AMDSMI_STATUS_NOT_INIT)
    return [amdsmi_processor_handle(i + 1) for i in range(len(state.box.processors))]


def amdsmi_get_processor_type(processor_handle: Any) -> dict[str, str]:
    _index(processor_handle)
    return {"processor_type": "AMDSMI_PROCESSOR_TYPE_AMD_GPU"}


def amdsmi_get_gpu_device_bdf(processor_handle: Any) -> str:
    return _proc(processor_handle).bdf


def amdsmi_get_gpu_device_uuid(processor_handle: Any) -> str:
    return _proc(processor_handle).uuid


def amdsmi_get_gpu_enumeration_info(processor_handle: Any) -> dict[str, Any]:
    p = _proc(processor_handle)
    if p.hip_id is None:
        raise AmdSmiLibraryException(AMDSMI_STATUS_NOT_SUPPORTED)
    return {"drm_render": 128 + p.hip_id, "drm_card": p.hip_id, "hsa_id": p.hip_id + 1, "hip_id": p.hip_id, "hip_uuid": p.uuid}


def amdsmi_get_gpu_asic_info(processor_handle: Any) -> dict[str, Any]:
    p = _proc(processor_handle)
    return {
        "market_name": p.market_name or "N/A",
        "vendor_id": "0x1002",
        "vendor_name": "Advanced Micro Devices Inc. [AMD/ATI]",
        "subvendor_id": "0x1002",
        "device_id": hex(p.device_id) if p.device_id else "N/A",
        "rev_id": "0x00",
        "asic_serial": "0x0000000000000000",
        "oam_id": 0,
        "num_compute_units": p.num_compute_units,
        "target_graphics_version": p.gfx,
        "subsystem_id": "0x74a1",
    }


def amdsmi_get_gpu_memory_total(processor_handle: Any, mem_type: AmdSmiMemoryType) -> int:
    p = _proc(processor_handle)
    if not isinstance(mem_type, AmdSmiMemoryType):
        raise AmdSmiParameterException(mem_type, AmdSmiMemoryType)
    if mem_type is not AmdSmiMemoryType.VRAM:
        raise AmdSmiLibraryException(AMDSMI_STATUS_NOT_SUPPORTED)
    return p.vram_bytes


def amdsmi_get_gpu_memory_usage(processor_handle: Any, mem_type: AmdSmiMemoryType) -> int:
    p = _proc(processor_handle)
    if not isinstance(mem_type, AmdSmiMemoryType):
        raise AmdSmiParameterException(mem_type, AmdSmiMemoryType)
    if mem_type is not AmdSmiMemoryType.VRAM:
        raise AmdSmiLibraryException(AMDSMI_STATUS_NOT_SUPPORTED)
    return p.vram_used


def amdsmi_get_gpu_activity(processor_handle: Any) -> dict[str, Any]:
    """Percentages; the real wrapper puts "N/A" where the library returned 0xFFFF."""
    p = _proc(processor_handle)
    return {"gfx_activity": "N/A" if p.gfx_activity is None else p.gfx_activity,
            "umc_activity": "N/A", "mm_activity": "N/A"}


def amdsmi_get_power_info(processor_handle: Any) -> dict[str, Any]:
    """Watts (volts in mV); "N/A" where the library returned 0xFFFF, as the real wrapper."""
    p = _proc(processor_handle)
    power: Any = "N/A" if p.socket_power_w is None else p.socket_power_w
    return {"socket_power": power, "current_socket_power": power, "average_socket_power": "N/A",
            "gfx_voltage": "N/A", "soc_voltage": "N/A", "mem_voltage": "N/A", "power_limit": 750}


AMDSMI_MAX_NUM_XGMI_LINKS = 8  # entries amdsmi_get_link_metrics lists (amdsmi_interface 7.0.2)


def amdsmi_get_link_metrics(processor_handle: Any) -> dict[str, Any]:
    """``{"num_links", "links": [{bdf, bit_rate, max_bandwidth, link_type, read, write}]}``;
    read/write are cumulative KB; entries past ``num_links`` are zero, as in the struct."""
    p = _proc(processor_handle)
    if not p.xgmi_read_kb:
        raise AmdSmiLibraryException(AMDSMI_STATUS_NOT_SUPPORTED)
    links = []
    for i in range(AMDSMI_MAX_NUM_XGMI_LINKS):
        used = i < len(p.xgmi_read_kb)
        links.append({
            "bdf": MI300X_BDFS[i % len(MI300X_BDFS)] if used else "0000:00:00.0",
            "bit_rate": 32 if used else 0,
            "max_bandwidth": 64 if used else 0,
            "link_type": int(AmdSmiLinkType.AMDSMI_LINK_TYPE_XGMI) if used else 0,
            "read": p.xgmi_read_kb[i] if used else 0,
            "write": p.xgmi_write_kb[i] if used else 0,
        })
    return {"num_links": len(p.xgmi_read_kb), "links": links}


def amdsmi_topo_get_numa_node_number(processor_handle: Any) -> int:
    return _proc(processor_handle).numa_node


def amdsmi_get_gpu_compute_partition(processor_handle: Any) -> str:
    p = _proc(processor_handle)
    if p.compute_partition is None:
        raise AmdSmiLibraryException(AMDSMI_STATUS_NOT_SUPPORTED)
    return p.compute_partition


def amdsmi_topo_get_link_type(processor_handle_src: Any, processor_handle_dst: Any) -> dict[str, int]:
    link = _pair(processor_handle_src, processor_handle_dst)
    return {"hops": link.hops, "type": int(link.type)}


def amdsmi_topo_get_link_weight(processor_handle_src: Any, processor_handle_dst: Any) -> int:
    return _pair(processor_handle_src, processor_handle_dst).weight


def amdsmi_get_minmax_bandwidth_between_processors(processor_handle_src: Any, processor_handle_dst: Any) -> dict[str, int]:
    link = _pair(processor_handle_src, processor_handle_dst)
    if link.type != AmdSmiLinkType.AMDSMI_LINK_TYPE_XGMI:
        raise AmdSmiLibraryException(AMDSMI_STATUS_NOT_SUPPORTED)
    return {"min_bandwidth": link.min_bandwidth_mbps, "max_bandwidth": link.max_bandwidth_mbps}


# ---- the machines the tests describe --------------------------------------------------------

MI300X_BDFS = [f"0000:{bus}:00.0" for bus in ("0c", "22", "38", "5c", "9f", "af", "bf", "df")]
MI300X_VRAM = 192 * GIB  # nominal HBM3 size; the fake's figure, not a recorded one


def mi300x_xgmi_box() -> FakeBox:
    """8x MI300X OAM, all-to-all xGMI: weight 15, hops 1, 50000 MB/s per pair, BDFs as in
    amd-mi300x-oam8_amd-smi-topology.txt. NUMA 0 for the first four, 1 for the rest (fake)."""
    procs = [
        FakeProcessor(
            bdf=bdf,
            uuid=f"a1ff74a1-0000-1000-80{i:02d}-000000000000",
            market_name="AMD Instinct MI300X OAM",
            device_id=0x74A1,
            gfx="gfx942",
            num_compute_units=304,
            vram_bytes=MI300X_VRAM,
            numa_node=0 if i < 4 else 1,
            compute_partition="SPX",
            hip_id=i,
        )
        for i, bdf in enumerate(MI300X_BDFS)
    ]
    xgmi = FakePairLink(type=AmdSmiLinkType.AMDSMI_LINK_TYPE_XGMI, hops=1, weight=15, max_bandwidth_mbps=50000, min_bandwidth_mbps=50000)
    links = {(i, j): xgmi for i in range(8) for j in range(i + 1, 8)}
    return FakeBox(processors=procs, links=links)


CPX_PARTITIONS = 8
CPX_PARTITION_VRAM = 48 * GIB  # CPX with NPS4: a quarter of 192 GiB per memory node (fake's figure)


def mi300x_cpx_box(hip_ids: list[int] | None = None) -> FakeBox:
    """2x MI300X in CPX mode: 8 partitions per GPU, each its own handle. As the KFD fixture
    amd-mi300x-oam8-cpx shows, partitions of one GPU share bus/device and differ in the PCI
    function (05:00.0-05:00.7, 27:00.0-27:00.7), have 38 CUs each, and are joined by xGMI of
    weight 13 and 819200 MB/s; partitions of different GPUs by weight 41 and 0 MB/s.
    ``hip_ids`` overrides the HIP enumeration order (default: handle order)."""
    procs = []
    for gpu, bus in enumerate(("05", "27")):
        for part in range(CPX_PARTITIONS):
            n = gpu * CPX_PARTITIONS + part
            procs.append(
                FakeProcessor(
                    bdf=f"0000:{bus}:00.{part}",
                    uuid=f"5dff74a1-0000-1000-80{gpu}{part}-000000000000",
                    market_name="AMD Instinct MI300X OAM",
                    device_id=0x74A1,
                    gfx="gfx942",
                    num_compute_units=38,
                    vram_bytes=CPX_PARTITION_VRAM,
                    numa_node=0,
                    compute_partition="CPX",
                    hip_id=hip_ids[n] if hip_ids else n,
                )
            )
    same = FakePairLink(type=AmdSmiLinkType.AMDSMI_LINK_TYPE_XGMI, hops=1, weight=13, max_bandwidth_mbps=819200, min_bandwidth_mbps=819200)
    other = FakePairLink(type=AmdSmiLinkType.AMDSMI_LINK_TYPE_XGMI, hops=1, weight=41, max_bandwidth_mbps=0)
    count = len(procs)
    links = {
        (i, j): same if i // CPX_PARTITIONS == j // CPX_PARTITIONS else other
        for i in range(count)
        for j in range(i + 1, count)
    }
    return FakeBox(processors=procs, links=links)


def pcie_pair_box() -> FakeBox:
    """2 AMD GPUs over PCIe (BDFs 0000:08:00.0 and 0000:44:00.0, weight 40, hops 2, as the
    amd-2gpu-pcie amd-smi fixtures show); compute partitions not supported; no HIP ids."""
    procs = [
        FakeProcessor(
            bdf=bdf,
            uuid=f"00ff744c-0000-1000-8000-00000000000{i}",
            market_name="",  # the library prints "N/A" when the name is empty
            device_id=0x744C,
            gfx="gfx1100",
            num_compute_units=96,
            vram_bytes=24 * GIB,
            numa_node=0,
            compute_partition=None,
        )
        for i, bdf in enumerate(("0000:08:00.0", "0000:44:00.0"))
    ]
    links = {(0, 1): FakePairLink(type=AmdSmiLinkType.AMDSMI_LINK_TYPE_PCIE, hops=2, weight=40, max_bandwidth_mbps=0)}
    return FakeBox(processors=procs, links=links)


def init_failing_box() -> FakeBox:
    """amdsmi loads but the amdgpu driver is not loaded: amdsmi_init fails."""
    return FakeBox(init_error=AMDSMI_STATUS_DRIVER_NOT_LOADED)


def empty_box() -> FakeBox:
    """amdsmi initialises but finds no GPU."""
    return FakeBox()
