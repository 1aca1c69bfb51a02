"""A stand-in for nvidia-ml-py's ``pynvml`` module (checked against nvidia-ml-py 13.615.71).

NVML needs an NVIDIA driver, which CI does not have, so the discovery tests hand this module to
:func:`hetflow.accelerators.nvidia.discover` as ``lib``. It keeps the real module's names,
signatures, return shapes and error classes, for the subset hetflow calls:

- errors: ``NVMLError(value)`` returns the subclass for that value (``NVMLError_NotSupported``
  for 3, ``NVMLError_LibraryNotFound`` for 12, ...), generated from the ``NVML_ERROR_*``
  constants exactly as the real module does;
- handles are ``c_nvmlDevice_t`` objects, PCI info is an ``nvmlPciInfo_t`` whose ``busId`` is a
  str like ``"00000000:18:00.0"`` (NVML's 8-digit domain, upper-case hex), memory info has
  ``.total/.free/.used`` in bytes, ``nvmlDeviceGetCudaComputeCapability`` returns a tuple,
  ``nvmlDeviceGetMemoryAffinity`` returns a ctypes array of 64-bit node-set words;
- every device call before ``nvmlInit`` or after the matching ``nvmlShutdown`` raises
  ``NVMLError_Uninitialized``, as the real library does;
- for the metrics sampler: ``nvmlDeviceGetUtilizationRates`` (a ``c_nvmlUtilization_t`` with
  ``.gpu``/``.memory`` in percent), ``nvmlDeviceGetPowerUsage`` (milliwatts),
  ``nvmlDeviceGetFieldValues`` with the NVLink throughput fields (``c_nvmlFieldValue_t`` array,
  a ``nvmlReturn`` per field, cumulative KiB in ``value.ullVal``, ``scopeId`` = link number or
  ``UINT_MAX`` for the sum over links, as nvml.h documents).

What the fake machine holds is a :class:`FakeBox`; :func:`install` makes it current. The
``*_box()`` builders describe the machines the tests use. Their numbers come from the recorded
fixtures where one exists (H100: ``nvidia-h100-sxm5x8_nvidia-smi-q.txt``, ``...-topo-m.txt``,
``...-nvlink-R_EXCERPT-gpu0.txt``); the rest are stated as the fake's own configuration.
"""

from __future__ import annotations

import ctypes
import string
import sys
from dataclasses import dataclass, field
from types import ModuleType

# ---- constants (values as in pynvml 13.615.71) ----------------------------------------------

NVML_SUCCESS = 0
NVML_ERROR_UNINITIALIZED = 1
NVML_ERROR_INVALID_ARGUMENT = 2
NVML_ERROR_NOT_SUPPORTED = 3
NVML_ERROR_NO_PERMISSION = 4
NVML_ERROR_ALREADY_INITIALIZED = 5
NVML_ERROR_NOT_FOUND = 6
NVML_ERROR_INSUFFICIENT_SIZE = 7
NVML_ERROR_INSUFFICIENT_POWER = 8
NVML_ERROR_DRIVER_NOT_LOADED = 9
NVML_ERROR_TIMEOUT = 10
NVML_ERROR_IRQ_ISSUE = 11
NVML_ERROR_LIBRARY_NOT_FOUND = 12
NVML_ERROR_FUNCTION_NOT_FOUND = 13
NVML_ERROR_CORRUPTED_INFOROM = 14
NVML_ERROR_GPU_IS_LOST = 15
NVML_ERROR_RESET_REQUIRED = 16
NVML_ERROR_OPERATING_SYSTEM = 17
NVML_ERROR_LIB_RM_VERSION_MISMATCH = 18
NVML_ERROR_IN_USE = 19
NVML_ERROR_MEMORY = 20
NVML_ERROR_NO_DATA = 21
NVML_ERROR_VGPU_ECC_NOT_SUPPORTED = 22
NVML_ERROR_INSUFFICIENT_RESOURCES = 23
NVML_ERROR_FREQ_NOT_SUPPORTED = 24
NVML_ERROR_ARGUMENT_VERSION_MISMATCH = 25
NVML_ERROR_DEPRECATED = 26
NVML_ERROR_NOT_READY = 27
NVML_ERROR_GPU_NOT_FOUND = 28
NVML_ERROR_INVALID_STATE = 29
NVML_ERROR_RESET_TYPE_NOT_SUPPORTED = 30
NVML_ERROR_UNKNOWN = 999

NVML_FEATURE_DISABLED = 0
NVML_FEATURE_ENABLED = 1

NVML_NVLINK_MAX_LINKS = 36
NVML_NVLINK_DEVICE_TYPE_GPU = 0x00
NVML_NVLINK_DEVICE_TYPE_IBMNPU = 0x01
NVML_NVLINK_DEVICE_TYPE_SWITCH = 0x02
NVML_NVLINK_DEVICE_TYPE_UNKNOWN = 0xFF

NVML_TOPOLOGY_INTERNAL = 0
NVML_TOPOLOGY_SINGLE = 10
NVML_TOPOLOGY_MULTIPLE = 20
NVML_TOPOLOGY_HOSTBRIDGE = 30
NVML_TOPOLOGY_NODE = 40
NVML_TOPOLOGY_CPU = NVML_TOPOLOGY_NODE
NVML_TOPOLOGY_SYSTEM = 50

NVML_AFFINITY_SCOPE_NODE = 0
NVML_AFFINITY_SCOPE_SOCKET = 1

# Sic: the real module has a trailing comma here, so this is the tuple (0,). Kept so that code
# passing the constant straight to NVML fails here as it would there.
NVML_P2P_CAPS_INDEX_READ = (0,)

# Field ids and value types for nvmlDeviceGetFieldValues (NVLink throughput counters, in KiB).
# nvml.h: "Link ID needs to be specified in the scopeId field in nvmlFieldValue_t. A scopeId of
# UINT_MAX returns aggregate value summed up across all links for the specified counter type."
NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX = 138
NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_RX = 139
NVML_FI_DEV_PCIE_COUNT_TX_BYTES = 197
NVML_FI_DEV_PCIE_COUNT_RX_BYTES = 198
NVML_VALUE_TYPE_DOUBLE = 0
NVML_VALUE_TYPE_UNSIGNED_INT = 1
NVML_VALUE_TYPE_UNSIGNED_LONG = 2
NVML_VALUE_TYPE_UNSIGNED_LONG_LONG = 3
UINT_MAX = 0xFFFFFFFF

MIB = 1 << 20


# ---- errors (same construction as the real module) ------------------------------------------


class NVMLError(Exception):
    _valClassMapping: dict[int, type] = dict()

    def __new__(typ, value):  # noqa: N804 - the real module's signature
        if typ == NVMLError:
            typ = NVMLError._valClassMapping.get(value, typ)
        obj = Exception.__new__(typ)
        obj.value = value
        return obj

    def __str__(self) -> str:
        return f"NVML Error with code {self.value}"

    def __eq__(self, other):  # the real class compares by value (and so is unhashable)
        return self.value == other.value


def _extractNVMLErrorsAsClasses() -> None:  # noqa: N802 - mirrors the real helper
    this_module = sys.modules[__name__]
    for err_name in [x for x in dir(this_module) if x.startswith("NVML_ERROR_")]:
        class_name = "NVMLError_" + string.capwords(err_name.replace("NVML_ERROR_", ""), "_").replace("_", "")
        err_val = getattr(this_module, err_name)

        def gen_new(val):
            def new(typ, *args):
                return NVMLError.__new__(typ, val)

            return new

        new_error_class = type(class_name, (NVMLError,), {"__new__": gen_new(err_val)})
        new_error_class.__module__ = __name__
        setattr(this_module, class_name, new_error_class)
        NVMLError._valClassMapping[err_val] = new_error_class


_extractNVMLErrorsAsClasses()


# ---- return structures ----------------------------------------------------------------------


class c_nvmlDevice_t:  # noqa: N801 - the real name
    """An opaque device handle (the real one is a ctypes pointer)."""

    def __init__(self, index: int) -> None:
        self._index = index


@dataclass
class nvmlPciInfo_t:  # noqa: N801 - the real name
    busIdLegacy: str
    domain: int
    bus: int
    device: int
    pciDeviceId: int
    pciSubSystemId: int
    busId: str


@dataclass
class c_nvmlMemory_t:  # noqa: N801 - the real name
    total: int
    free: int
    used: int


class c_nvmlUtilization_t(ctypes.Structure):  # noqa: N801 - the real name and fields
    _fields_ = [("gpu", ctypes.c_uint), ("memory", ctypes.c_uint)]


class c_nvmlValue_t(ctypes.Union):  # noqa: N801 - the real name and fields
    _fields_ = [
        ("dVal", ctypes.c_double),
        ("uiVal", ctypes.c_uint),
        ("ulVal", ctypes.c_ulong),
        ("ullVal", ctypes.c_ulonglong),
        ("sllVal", ctypes.c_longlong),
        ("siVal", ctypes.c_int),
        ("usVal", ctypes.c_ushort),
    ]


class c_nvmlFieldValue_t(ctypes.Structure):  # noqa: N801 - the real name and fields
    _fields_ = [
        ("fieldId", ctypes.c_uint32),
        ("scopeId", ctypes.c_uint32),
        ("timestamp", ctypes.c_int64),
        ("latencyUsec", ctypes.c_int64),
        ("valueType", ctypes.c_uint),
        ("nvmlReturn", ctypes.c_uint),
        ("value", c_nvmlValue_t),
    ]


# ---- the fake machine -----------------------------------------------------------------------


@dataclass
class FakeNvLink:
    """One NVLink of a GPU: where it goes and whether it is up."""

    remote_bus_id: str  # NVML format, "00000000:07:00.0"
    remote_type: int = NVML_NVLINK_DEVICE_TYPE_GPU
    enabled: bool = True


@dataclass
class FakeGpu:
    name: str
    uuid: str
    bus_id: str  # NVML format, "00000000:18:00.0"
    memory_total: int
    compute_capability: tuple[int, int]
    pci_device_id: int  # device << 16 | vendor, as NVML reports it (0x233010DE)
    numa_affinity: int | None  # nearest host NUMA node; None: NVML says NotSupported
    numa_node_id: int | None = None  # the GPU's own NUMA node (coherent C2C only)
    # NVLinks by link number. A None entry raises NotSupported; a number past the list raises
    # InvalidArgument (how NVML answers for links the GPU does not have).
    nvlinks: list[FakeNvLink | None] = field(default_factory=list)
    nvlink_supported: bool = True  # False: every NVLink call raises NotSupported
    lost: bool = False  # nvmlDeviceGetHandleByIndex raises GpuIsLost
    # What the GPU is doing (the metrics sampler reads these; discovery does not):
    utilization_gpu: int = 0  # nvmlDeviceGetUtilizationRates().gpu, percent
    utilization_memory: int = 0  # .memory, percent
    memory_used: int = 0  # bytes; nvmlDeviceGetMemoryInfo().free is total - used
    power_mw: int | None = None  # nvmlDeviceGetPowerUsage, milliwatts; None: NotSupported
    # Cumulative NVLink data counters in KiB, one entry per link (the
    # NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_* field values); empty: NotSupported (no NVLink).
    nvlink_tx_kib: list[int] = field(default_factory=list)
    nvlink_rx_kib: list[int] = field(default_factory=list)
    # Traffic the fake adds to every link's TX and RX counter at each nvmlDeviceGetFieldValues
    # call, so that a sampler sees the counters move.
    nvlink_kib_per_query: int = 0
    nvlink_aggregate_scope: bool = True  # False: scopeId UINT_MAX answers NotSupported per field
    # Cumulative PCIe bytes (NVML_FI_DEV_PCIE_COUNT_{TX,RX}_BYTES); None: NotSupported (older
    # drivers). Each nvmlDeviceGetFieldValues call adds pcie_bytes_per_query to both.
    pcie_tx_bytes: int | None = None
    pcie_rx_bytes: int | None = None
    pcie_bytes_per_query: int = 0


@dataclass
class FakeBox:
    gpus: list[FakeGpu] = field(default_factory=list)
    # nvmlDeviceGetTopologyCommonAncestor per unordered pair of indices; missing pairs use
    # default_ancestor; None means the call raises NotSupported.
    ancestors: dict[tuple[int, int], int] = field(default_factory=dict)
    default_ancestor: int | None = NVML_TOPOLOGY_SYSTEM
    init_error: int | None = None  # nvmlInit raises NVMLError(init_error)


class _State:
    box: FakeBox = FakeBox()
    refcount = 0
    init_calls = 0
    shutdown_calls = 0


state = _State()


def install(box: FakeBox) -> ModuleType:
    """Make ``box`` the machine this module describes; returns the module (pass it as ``lib``)."""
    state.box = box
    state.refcount = 0
    state.init_calls = 0
    state.shutdown_calls = 0
    return sys.modules[__name__]


def _require_init() -> None:
    if state.refcount <= 0:
        raise NVMLError(NVML_ERROR_UNINITIALIZED)


def _gpu(handle: c_nvmlDevice_t) -> FakeGpu:
    _require_init()
    if not isinstance(handle, c_nvmlDevice_t):
        raise NVMLError(NVML_ERROR_INVALID_ARGUMENT)
    return state.box.gpus[handle._index]


def _link(handle: c_nvmlDevice_t, link: int) -> FakeNvLink:
    gpu = _gpu(handle)
    if not gpu.nvlink_supported:
        raise NVMLError(NVML_ERROR_NOT_SUPPORTED)
    if not isinstance(link, int) or link < 0 or link >= len(gpu.nvlinks):
        raise NVMLError(NVML_ERROR_INVALID_ARGUMENT)
    entry = gpu.nvlinks[link]
    if entry is None:
        raise NVMLError(NVML_ERROR_NOT_SUPPORTED)
    return entry


# ---- the API --------------------------------------------------------------------------------


def nvmlInit() -> None:  # noqa: N802
    state.init_calls += 1
    if state.box.init_error is not None:
        raise NVMLError(state.box.init_error)
    state.refcount += 1


def nvmlShutdown() -> None:  # noqa: N802
    _require_init()
    state.shutdown_calls += 1
    state.refcount -= 1


def nvmlDeviceGetCount() -> int:  # noqa: N802
    _require_init()
    return len(state.box.gpus)


def nvmlDeviceGetHandleByIndex(index: int) -> c_nvmlDevice_t:  # noqa: N802
    _require_init()
    if not 0 <= index < len(state.box.gpus):
        raise NVMLError(NVML_ERROR_INVALID_ARGUMENT)
    if state.box.gpus[index].lost:
        raise NVMLError(NVML_ERROR_GPU_IS_LOST)
    return c_nvmlDevice_t(index)


def nvmlDeviceGetName(handle: c_nvmlDevice_t) -> str:  # noqa: N802
    return _gpu(handle).name


def nvmlDeviceGetUUID(handle: c_nvmlDevice_t) -> str:  # noqa: N802
    return _gpu(handle).uuid


def _pci_info(bus_id: str, pci_device_id: int) -> nvmlPciInfo_t:
    domain, bus, dev_fn = bus_id.split(":")
    dev = dev_fn.split(".")[0]
    legacy = f"{int(domain, 16):04X}:{bus}:{dev_fn}"
    return nvmlPciInfo_t(
        busIdLegacy=legacy,
        domain=int(domain, 16),
        bus=int(bus, 16),
        device=int(dev, 16),
        pciDeviceId=pci_device_id,
        pciSubSystemId=0,
        busId=bus_id,
    )


def nvmlDeviceGetPciInfo(handle: c_nvmlDevice_t) -> nvmlPciInfo_t:  # noqa: N802
    gpu = _gpu(handle)
    return _pci_info(gpu.bus_id, gpu.pci_device_id)


def nvmlDeviceGetMemoryInfo(handle: c_nvmlDevice_t, version=None) -> c_nvmlMemory_t:  # noqa: N802
    gpu = _gpu(handle)
    return c_nvmlMemory_t(total=gpu.memory_total, free=gpu.memory_total - gpu.memory_used, used=gpu.memory_used)


def nvmlDeviceGetUtilizationRates(handle: c_nvmlDevice_t) -> c_nvmlUtilization_t:  # noqa: N802
    gpu = _gpu(handle)
    return c_nvmlUtilization_t(gpu=gpu.utilization_gpu, memory=gpu.utilization_memory)


def nvmlDeviceGetPowerUsage(handle: c_nvmlDevice_t) -> int:  # noqa: N802
    gpu = _gpu(handle)
    if gpu.power_mw is None:
        raise NVMLError(NVML_ERROR_NOT_SUPPORTED)
    return gpu.power_mw


def _field_value(gpu: FakeGpu, field_id: int, scope_id: int) -> tuple[int, int]:
    """(nvmlReturn, value) of one NVLink or PCIe counter field, as NVML fills it per field."""
    if field_id in (NVML_FI_DEV_PCIE_COUNT_TX_BYTES, NVML_FI_DEV_PCIE_COUNT_RX_BYTES):
        value = gpu.pcie_tx_bytes if field_id == NVML_FI_DEV_PCIE_COUNT_TX_BYTES else gpu.pcie_rx_bytes
        return (NVML_ERROR_NOT_SUPPORTED, 0) if value is None else (NVML_SUCCESS, value)
    counters = {NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX: gpu.nvlink_tx_kib,
                NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_RX: gpu.nvlink_rx_kib}.get(field_id)
    if not counters:
        return NVML_ERROR_NOT_SUPPORTED, 0
    if scope_id == UINT_MAX:
        return (NVML_SUCCESS, sum(counters)) if gpu.nvlink_aggregate_scope else (NVML_ERROR_NOT_SUPPORTED, 0)
    if scope_id >= len(counters):
        return NVML_ERROR_INVALID_ARGUMENT, 0
    return NVML_SUCCESS, counters[scope_id]


def nvmlDeviceGetFieldValues(handle: c_nvmlDevice_t, fieldIds):  # noqa: N802,N803
    """Like the real wrapper: each entry is a field id or a (field id, scope id) tuple; the call
    itself succeeds and every returned value carries its own ``nvmlReturn``."""
    gpu = _gpu(handle)
    for counters in (gpu.nvlink_tx_kib, gpu.nvlink_rx_kib):
        for link in range(len(counters)):
            counters[link] += gpu.nvlink_kib_per_query
    if gpu.pcie_tx_bytes is not None and gpu.pcie_rx_bytes is not None:
        gpu.pcie_tx_bytes += gpu.pcie_bytes_per_query
        gpu.pcie_rx_bytes += gpu.pcie_bytes_per_query
    values = (c_nvmlFieldValue_t * len(fieldIds))()
    for i, field_id in enumerate(fieldIds):
        try:
            (values[i].fieldId, values[i].scopeId) = field_id
        except TypeError:
            values[i].fieldId = field_id
        ret, value = _field_value(gpu, values[i].fieldId, values[i].scopeId)
        values[i].nvmlReturn = ret
        values[i].valueType = NVML_VALUE_TYPE_UNSIGNED_LONG_LONG
        values[i].value.ullVal = value
    return values


def nvmlDeviceGetCudaComputeCapability(handle: c_nvmlDevice_t) -> tuple[int, int]:  # noqa: N802
    return _gpu(handle).compute_capability


def nvmlDeviceGetNumaNodeId(handle: c_nvmlDevice_t) -> int:  # noqa: N802
    gpu = _gpu(handle)
    if gpu.numa_node_id is None:
        raise NVMLError(NVML_ERROR_NOT_SUPPORTED)
    return gpu.numa_node_id


def nvmlDeviceGetMemoryAffinity(handle: c_nvmlDevice_t, nodeSetSize: int, scope: int):  # noqa: N802,N803
    gpu = _gpu(handle)
    if gpu.numa_affinity is None:
        raise NVMLError(NVML_ERROR_NOT_SUPPORTED)
    words = (ctypes.c_ulonglong * nodeSetSize)()
    word, bit = divmod(gpu.numa_affinity, 64)
    if word >= nodeSetSize:
        raise NVMLError(NVML_ERROR_INSUFFICIENT_SIZE)
    words[word] = 1 << bit
    return words


def nvmlDeviceGetTopologyCommonAncestor(device1: c_nvmlDevice_t, device2: c_nvmlDevice_t) -> int:  # noqa: N802
    a, b = _gpu(device1), _gpu(device2)
    i, j = sorted((device1._index, device2._index))
    if a is b:
        return NVML_TOPOLOGY_INTERNAL
    level = state.box.ancestors.get((i, j), state.box.default_ancestor)
    if level is None:
        raise NVMLError(NVML_ERROR_NOT_SUPPORTED)
    return level


def nvmlDeviceGetNvLinkState(device: c_nvmlDevice_t, link: int) -> int:  # noqa: N802
    return NVML_FEATURE_ENABLED if _link(device, link).enabled else NVML_FEATURE_DISABLED


def nvmlDeviceGetNvLinkRemoteDeviceType(handle: c_nvmlDevice_t, link: int) -> int:  # noqa: N802
    return _link(handle, link).remote_type


def nvmlDeviceGetNvLinkRemotePciInfo(device: c_nvmlDevice_t, link: int) -> nvmlPciInfo_t:  # noqa: N802
    # A switch reports its own PCI device id; the value does not matter to the callers here.
    return _pci_info(_link(device, link).remote_bus_id, 0x22A310DE)


# ---- the machines the tests describe --------------------------------------------------------

# 8x H100 80GB HBM3 SXM, bus ids and UUIDs from nvidia-h100-sxm5x8_nvidia-smi-q.txt.
_H100_GPUS = [
    ("00000000:18:00.0", "GPU-b42dd28e-ffdd-8720-1df0-98bd8cdc05b1"),
    ("00000000:2A:00.0", "GPU-7c3cadbd-17e5-0913-f69b-c618122ea0cd"),
    ("00000000:3A:00.0", "GPU-2d50cdf6-dd67-9f2e-855e-0d4d6d395a2f"),
    ("00000000:5D:00.0", "GPU-d1838e76-90e6-4408-711d-aeeaa2e1fd14"),
    ("00000000:9A:00.0", "GPU-72be6e5d-3c1b-0d37-98ac-d3ef159f2589"),
    ("00000000:AB:00.0", "GPU-52378fbc-3124-3895-13b6-1dd179563e0f"),
    ("00000000:BA:00.0", "GPU-83a5aebb-b71c-c570-aa83-185e1233fe97"),
    ("00000000:DB:00.0", "GPU-33135771-a848-ece1-b61e-489e221d663c"),
]
# GPU0's 18 links go to four NVSwitches at these bus numbers (nvidia-smi nvlink -R excerpt).
_H100_SWITCH_BUS_OF_LINK = [7, 7, 6, 6, 7, 7, 6, 6, 5, 5, 7, 6, 8, 8, 5, 5, 8, 8]


def h100_nvswitch_box(links_down: dict[int, int] | None = None) -> FakeBox:
    """HGX H100 x8: every GPU has 18 NVLinks to NVSwitches; GPUs 0-3 near NUMA node 0, 4-7
    near node 1 (topo -m fixture). ``links_down`` turns off that many links on a GPU.

    PCIe common ancestors are this fake's choice: NODE within a socket, SYS across.
    """
    links_down = links_down or {}
    gpus = []
    for i, (bus_id, uuid) in enumerate(_H100_GPUS):
        links: list[FakeNvLink | None] = [
            FakeNvLink(f"00000000:{bus:02X}:00.0", NVML_NVLINK_DEVICE_TYPE_SWITCH)
            for bus in _H100_SWITCH_BUS_OF_LINK
        ]
        for k in range(links_down.get(i, 0)):
            links[k].enabled = False  # type: ignore[union-attr]
        gpus.append(
            FakeGpu(
                name="NVIDIA H100 80GB HBM3",
                uuid=uuid,
                bus_id=bus_id,
                memory_total=81559 * MIB,
                compute_capability=(9, 0),
                pci_device_id=0x233010DE,
                numa_affinity=0 if i < 4 else 1,
                nvlinks=links,
            )
        )
    ancestors = {
        (i, j): NVML_TOPOLOGY_NODE if (i < 4) == (j < 4) else NVML_TOPOLOGY_SYSTEM
        for i in range(8)
        for j in range(i + 1, 8)
    }
    return FakeBox(gpus=gpus, ancestors=ancestors)


# 4x V100-SXM2 hybrid cube mesh (this fake's configuration): bonded links per pair. Each V100
# has 6 NVLinks; the ones not listed here would go to a second quad and are inactive.
V100_MESH_LINKS = {(0, 1): 1, (0, 2): 1, (0, 3): 2, (1, 2): 2, (1, 3): 1, (2, 3): 2}
V100_MESH_ANCESTORS = {
    (0, 1): NVML_TOPOLOGY_MULTIPLE,
    (2, 3): NVML_TOPOLOGY_MULTIPLE,
    (0, 2): NVML_TOPOLOGY_SYSTEM,
    (0, 3): NVML_TOPOLOGY_SYSTEM,
    (1, 2): NVML_TOPOLOGY_SYSTEM,
    (1, 3): NVML_TOPOLOGY_SYSTEM,
}
_V100_BUS = ["00000000:15:00.0", "00000000:16:00.0", "00000000:3A:00.0", "00000000:3B:00.0"]


def v100_hybrid_mesh_box() -> FakeBox:
    """4x Tesla V100-SXM2-16GB with direct NVLinks (:data:`V100_MESH_LINKS`), 6 links per GPU
    of which the unused ones are inactive (as in the nvlink -s fixture)."""
    gpus = []
    for i, bus_id in enumerate(_V100_BUS):
        links: list[FakeNvLink | None] = []
        for (a, b), count in sorted(V100_MESH_LINKS.items()):
            if i in (a, b):
                peer = b if i == a else a
                links += [FakeNvLink(_V100_BUS[peer]) for _ in range(count)]
        while len(links) < 6:
            links.append(FakeNvLink("00000000:00:00.0", NVML_NVLINK_DEVICE_TYPE_GPU, enabled=False))
        gpus.append(
            FakeGpu(
                name="Tesla V100-SXM2-16GB",
                uuid=f"GPU-00000000-0000-0000-0000-00000000010{i}",
                bus_id=bus_id,
                memory_total=16160 * MIB,
                compute_capability=(7, 0),
                pci_device_id=0x1DB110DE,
                numa_affinity=0 if i < 2 else 1,
                nvlinks=links,
            )
        )
    return FakeBox(gpus=gpus, ancestors=dict(V100_MESH_ANCESTORS))


def pcie_pair_box() -> FakeBox:
    """2x GeForce RTX 5090 on one host bridge (PHB, as the rtx5090x2 topo -m fixture shows), no
    NVLink: every NVLink call raises NotSupported. NUMA affinity is not reported."""
    gpus = [
        FakeGpu(
            name="NVIDIA GeForce RTX 5090",
            uuid=f"GPU-00000000-0000-0000-0000-00000000050{i}",
            bus_id=f"00000000:0{i + 1}:00.0",
            memory_total=32607 * MIB,
            compute_capability=(12, 0),
            pci_device_id=0x2B8510DE,
            numa_affinity=None,
            nvlink_supported=False,
        )
        for i in range(2)
    ]
    return FakeBox(gpus=gpus, default_ancestor=NVML_TOPOLOGY_HOSTBRIDGE)


def no_driver_box() -> FakeBox:
    """pynvml is installed but libnvidia-ml.so.1 is not: nvmlInit raises LibraryNotFound."""
    return FakeBox(init_error=NVML_ERROR_LIBRARY_NOT_FOUND)


def empty_box() -> FakeBox:
    """The driver loads but there are no GPUs."""
    return FakeBox()
