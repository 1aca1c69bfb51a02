"""What each device of a node is doing now: one :class:`DeviceSampler` per node, reading NVML
(:class:`NvmlSampler`), amdsmi (:class:`AmdSmiSampler`) or the host CPU from ``/proc``
(:class:`CpuSampler`); :func:`open_sampler` picks the one the node has.

A sample holds only what the library gave (``None`` elsewhere, never a made-up zero). Link
traffic is kept both ways: the library's own cumulative data counters, in bytes (exported as
Prometheus counters, so a query takes ``rate()`` of them), and the rate between two samples
(for ``hetflow top``). No Ray here: the
metrics agents (:mod:`hetflow.runtime.metrics`) and the workflow's utilisation recorder call
these in their own processes. Tested with fake NVML/amdsmi modules that follow the real APIs
and with the real ``/proc`` (``tests/observability/test_samplers.py``).
"""

from __future__ import annotations

import dataclasses
import logging
import time
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any, Callable, Mapping, Protocol

from hetflow.core.topology import Vendor
from hetflow.core.units import parse_bytes

log = logging.getLogger(__name__)


# ============================================================================ samples (data)


@dataclass(frozen=True)
class DeviceSample:
    """What one device was doing at one sample; ``None`` where the library could not say.

    ``device`` is the index hetflow uses for the device (NVML index; HIP id on AMD; 0 for the
    host CPU), so it matches the published topology's ``Device.index``.
    """

    device: int
    vendor: Vendor
    name: str | None = None
    utilisation: float | None = None  # busy fraction 0..1
    memory_used_bytes: int | None = None
    memory_total_bytes: int | None = None
    power_watts: float | None = None
    link_fabric: str | None = None  # "nvlink" / "xgmi": what the link figures count
    link_tx_bytes_per_s: float | None = None
    link_rx_bytes_per_s: float | None = None
    # The vendor's cumulative counters, bytes (they restart when the driver reloads, and
    # NVML's PCIe counters may wrap): the fabric's above, and PCIe where the library counts it.
    link_tx_bytes: int | None = None
    link_rx_bytes: int | None = None
    pcie_tx_bytes: int | None = None
    pcie_rx_bytes: int | None = None

    def counters(self) -> dict[tuple[str, str], int]:
        """(fabric, direction) -> cumulative bytes, for every counter the library gave."""
        out = {}
        for fabric, tx, rx in ((self.link_fabric, self.link_tx_bytes, self.link_rx_bytes),
                               ("pcie", self.pcie_tx_bytes, self.pcie_rx_bytes)):
            for direction, value in (("tx", tx), ("rx", rx)):
                if fabric and value is not None:
                    out[(fabric, direction)] = value
        return out


@dataclass(frozen=True)
class NodeSample:
    """One agent's sample of its node. ``timestamp`` is wall-clock seconds (``time.time()``)."""

    node: str
    source: str  # "nvml", "amdsmi" or "cpu"
    timestamp: float
    devices: tuple[DeviceSample, ...]

    def to_dict(self) -> dict[str, Any]:
        return {
            "node": self.node, "source": self.source, "timestamp": self.timestamp,
            "devices": [{**dataclasses.asdict(d), "vendor": d.vendor.value} for d in self.devices],
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> "NodeSample":
        devices = tuple(
            DeviceSample(**{**d, "vendor": Vendor(d["vendor"])}) for d in data.get("devices", ())
        )
        return cls(str(data["node"]), str(data["source"]), float(data["timestamp"]), devices)

    def device(self, index: int) -> DeviceSample | None:
        return next((d for d in self.devices if d.device == index), None)


# ============================================================================ samplers


class DeviceSampler(Protocol):
    """Reads this node's devices. ``sample()`` may be called repeatedly; ``close()`` once."""

    source: str

    def sample(self) -> list[DeviceSample]: ...

    def close(self) -> None: ...


class _CounterRate:
    """Turns cumulative counters into per-second rates between two readings."""

    def __init__(self) -> None:
        self._last: dict[Any, tuple[float, float]] = {}

    def rate(self, key: Any, value: float | None, now: float) -> float | None:
        """Per-second increase since the previous reading of ``key``; ``None`` on the first
        reading, after a counter reset (the value went down) or when no time has passed."""
        if value is None:
            self._last.pop(key, None)
            return None
        previous = self._last.get(key)
        self._last[key] = (value, now)
        if previous is None:
            return None
        last_value, last_time = previous
        if value < last_value or now <= last_time:
            return None
        return (value - last_value) / (now - last_time)


def _percent(value: Any) -> float | None:
    """A vendor percentage (int, or "N/A") as a 0..1 fraction."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return min(max(float(value) / 100.0, 0.0), 1.0)


class NvmlSampler:
    """NVIDIA GPUs through NVML (``pynvml``): utilisation, memory, power, NVLink and PCIe traffic.

    NVLink traffic is NVML's ``NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_{TX,RX}`` field values
    (cumulative KiB). They are asked for with ``scopeId = UINT_MAX``, which nvml.h documents as
    the sum over all links; a driver that refuses that scope is asked link by link and the
    links that answer are summed. A GPU whose counters answer neither way has no NVLink figures.
    PCIe traffic is ``NVML_FI_DEV_PCIE_COUNT_{TX,RX}_BYTES`` (cumulative bytes; nvml.h: "Value
    can be wrapped"), where the driver answers them (newer drivers only).
    """

    source = "nvml"
    _TX, _RX = 138, 139  # NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX / _RX
    _PCIE_TX, _PCIE_RX = 197, 198  # NVML_FI_DEV_PCIE_COUNT_TX_BYTES / _RX_BYTES
    _ALL_LINKS = 0xFFFFFFFF

    def __init__(self, lib: Any, handles: dict[int, Any], clock: Callable[[], float]) -> None:
        self._lib = lib
        self._handles = handles
        self._clock = clock
        self._rates = _CounterRate()
        self._no_nvlink: set[int] = set()
        self._no_pcie: set[int] = set()

    @classmethod
    def open(cls, lib: Any = None, clock: Callable[[], float] = time.monotonic) -> "NvmlSampler | None":
        """A sampler over every GPU NVML lists, or ``None`` (no pynvml, no driver, no GPU)."""
        lib = lib or _import_optional("pynvml")
        if lib is None:
            return None
        try:
            lib.nvmlInit()
        except lib.NVMLError as err:
            log.info("NVML did not initialise (%s); not sampling NVIDIA GPUs", err)
            return None
        handles = {}
        try:
            for index in range(lib.nvmlDeviceGetCount()):
                try:
                    handles[index] = lib.nvmlDeviceGetHandleByIndex(index)
                except lib.NVMLError as err:
                    log.warning("NVML cannot open GPU %d (%s); not sampling it", index, err)
        except lib.NVMLError as err:
            log.warning("NVML failed to list GPUs (%s)", err)
        if not handles:
            lib.nvmlShutdown()
            return None
        return cls(lib, handles, clock)

    def _optional(self, call: Callable[..., Any], *args: Any) -> Any:
        try:
            return call(*args)
        except self._lib.NVMLError as err:
            log.debug("%s: %s", getattr(call, "__name__", call), err)
            return None

    def _nvlink_kib(self, index: int, handle: Any) -> tuple[int, int] | None:
        """Cumulative (tx, rx) NVLink data in KiB, or None where NVML has no counters."""
        if index in self._no_nvlink:
            return None
        lib = self._lib
        fields = [(self._TX, self._ALL_LINKS), (self._RX, self._ALL_LINKS)]
        values = self._optional(lib.nvmlDeviceGetFieldValues, handle, fields)
        if values is not None and all(v.nvmlReturn == 0 for v in values):
            return int(values[0].value.ullVal), int(values[1].value.ullVal)
        links = range(int(getattr(lib, "NVML_NVLINK_MAX_LINKS", 18)))
        fields = [(f, link) for link in links for f in (self._TX, self._RX)]
        values = self._optional(lib.nvmlDeviceGetFieldValues, handle, fields)
        answered = [v for v in (values or ()) if v.nvmlReturn == 0]
        if not answered:
            self._no_nvlink.add(index)  # a PCIe-only GPU: do not ask again every sample
            return None
        tx = sum(int(v.value.ullVal) for v in answered if v.fieldId == self._TX)
        rx = sum(int(v.value.ullVal) for v in answered if v.fieldId == self._RX)
        return tx, rx

    def _pcie_bytes(self, index: int, handle: Any) -> tuple[int, int] | None:
        """Cumulative (tx, rx) PCIe bytes, or None where the driver has no such counters."""
        if index in self._no_pcie:
            return None
        values = self._optional(self._lib.nvmlDeviceGetFieldValues, handle,
                                [self._PCIE_TX, self._PCIE_RX])
        if values is None or any(v.nvmlReturn != 0 for v in values):
            self._no_pcie.add(index)  # an older driver or GPU: do not ask again every sample
            return None
        return int(values[0].value.ullVal), int(values[1].value.ullVal)

    def sample(self) -> list[DeviceSample]:
        now = self._clock()
        out = []
        for index, handle in sorted(self._handles.items()):
            lib = self._lib
            util = self._optional(lib.nvmlDeviceGetUtilizationRates, handle)
            memory = self._optional(lib.nvmlDeviceGetMemoryInfo, handle)
            power_mw = self._optional(lib.nvmlDeviceGetPowerUsage, handle)
            name = self._optional(lib.nvmlDeviceGetName, handle)
            counters = self._nvlink_kib(index, handle)
            tx_bytes = counters[0] * 1024 if counters else None
            rx_bytes = counters[1] * 1024 if counters else None
            pcie = self._pcie_bytes(index, handle)
            out.append(DeviceSample(
                device=index,
                vendor=Vendor.NVIDIA,
                name=name.decode() if isinstance(name, bytes) else name,
                utilisation=_percent(util.gpu) if util is not None else None,
                memory_used_bytes=int(memory.used) if memory is not None else None,
                memory_total_bytes=int(memory.total) if memory is not None else None,
                power_watts=power_mw / 1000.0 if power_mw is not None else None,
                link_fabric="nvlink" if counters else None,
                link_tx_bytes_per_s=self._rates.rate((index, "tx"), tx_bytes, now),
                link_rx_bytes_per_s=self._rates.rate((index, "rx"), rx_bytes, now),
                link_tx_bytes=tx_bytes,
                link_rx_bytes=rx_bytes,
                pcie_tx_bytes=pcie[0] if pcie else None,
                pcie_rx_bytes=pcie[1] if pcie else None,
            ))
        return out

    def close(self) -> None:
        try:
            self._lib.nvmlShutdown()
        except self._lib.NVMLError as err:
            log.debug("nvmlShutdown: %s", err)


class AmdSmiSampler:
    """AMD GPUs (or their partitions) through amdsmi: GFX activity, VRAM, power, xGMI rates.

    Device indices are HIP ids, numbered exactly as :mod:`hetflow.accelerators.amd` numbers
    them. Power is ``socket_power`` in watts (the current or average socket power where that is
    what the GPU reports). xGMI traffic is the sum of ``amdsmi_get_link_metrics`` read / write
    counters (KB, taken as KiB) over the XGMI links.
    """

    source = "amdsmi"
    _XGMI = 2  # amdsmi_link_type_t AMDSMI_LINK_TYPE_XGMI

    def __init__(self, lib: Any, handles: dict[int, Any], clock: Callable[[], float]) -> None:
        self._lib = lib
        self._handles = handles
        self._clock = clock
        self._rates = _CounterRate()

    @classmethod
    def open(cls, lib: Any = None, clock: Callable[[], float] = time.monotonic) -> "AmdSmiSampler | None":
        """A sampler over every AMD GPU processor, or ``None`` (no amdsmi, driver or GPU)."""
        from hetflow.accelerators.amd import hip_indices, is_gpu

        lib = lib or _import_optional("amdsmi")
        if lib is None:
            return None
        try:
            lib.amdsmi_init(lib.AmdSmiInitFlags.INIT_AMD_GPUS)
        except lib.AmdSmiException as err:
            log.info("amdsmi did not initialise (%s); not sampling AMD GPUs", " ".join(str(err).split()))
            return None
        try:
            handles = [h for h in lib.amdsmi_get_processor_handles() if is_gpu(lib, h)]
        except lib.AmdSmiException as err:
            log.warning("amdsmi failed to list GPUs (%s)", " ".join(str(err).split()))
            handles = []
        if not handles:
            lib.amdsmi_shut_down()
            return None
        return cls(lib, dict(zip(hip_indices(lib, handles), handles)), clock)

    def _optional(self, call: Callable[..., Any], *args: Any) -> Any:
        try:
            return call(*args)
        except self._lib.AmdSmiException as err:
            log.debug("%s: %s", getattr(call, "__name__", call), " ".join(str(err).split()))
            return None

    def _power(self, handle: Any) -> float | None:
        info = self._optional(self._lib.amdsmi_get_power_info, handle) or {}
        for key in ("socket_power", "current_socket_power", "average_socket_power"):
            value = info.get(key)
            if isinstance(value, (int, float)) and not isinstance(value, bool) and value > 0:
                return float(value)
        return None

    def _xgmi_kb(self, handle: Any) -> tuple[int, int] | None:
        """Cumulative (write = tx, read = rx) KB over the XGMI links, or None."""
        metrics = self._optional(self._lib.amdsmi_get_link_metrics, handle)
        if not metrics:
            return None
        links = [l for l in metrics.get("links", [])[: int(metrics.get("num_links", 0))]
                 if getattr(l.get("link_type"), "value", l.get("link_type")) == self._XGMI]
        if not links:
            return None
        return sum(int(l["write"]) for l in links), sum(int(l["read"]) for l in links)

    def sample(self) -> list[DeviceSample]:
        lib = self._lib
        vram = lib.AmdSmiMemoryType.VRAM
        now = self._clock()
        out = []
        for index, handle in sorted(self._handles.items()):
            activity = self._optional(lib.amdsmi_get_gpu_activity, handle) or {}
            asic = self._optional(lib.amdsmi_get_gpu_asic_info, handle) or {}
            counters = self._xgmi_kb(handle)
            tx_bytes = counters[0] * 1024 if counters else None
            rx_bytes = counters[1] * 1024 if counters else None
            name = asic.get("market_name")
            out.append(DeviceSample(
                device=index,
                vendor=Vendor.AMD,
                name=None if name in (None, "", "N/A") else str(name),
                utilisation=_percent(activity.get("gfx_activity")),
                memory_used_bytes=self._optional(lib.amdsmi_get_gpu_memory_usage, handle, vram),
                memory_total_bytes=self._optional(lib.amdsmi_get_gpu_memory_total, handle, vram),
                power_watts=self._power(handle),
                link_fabric="xgmi" if counters else None,
                link_tx_bytes_per_s=self._rates.rate((index, "tx"), tx_bytes, now),
                link_rx_bytes_per_s=self._rates.rate((index, "rx"), rx_bytes, now),
                link_tx_bytes=tx_bytes,
                link_rx_bytes=rx_bytes,
            ))
        return out

    def close(self) -> None:
        try:
            self._lib.amdsmi_shut_down()
        except self._lib.AmdSmiException as err:
            log.debug("amdsmi_shut_down: %s", err)


class CpuSampler:
    """The host CPU as device 0: busy fraction from ``/proc/stat``, memory from ``/proc/meminfo``.

    Utilisation is the share of non-idle jiffies (idle and iowait count as idle; guest time is
    already inside user time) since the previous sample, the first time since the sampler was
    made. Memory used is MemTotal - MemAvailable. No power or link figures.
    """

    source = "cpu"

    def __init__(self, stat: Path = Path("/proc/stat"), meminfo: Path = Path("/proc/meminfo")) -> None:
        self._stat = stat
        self._meminfo = meminfo
        self._last = self._cpu_times()

    def _cpu_times(self) -> tuple[int, int] | None:
        """(busy, total) jiffies of all CPUs, or None when /proc/stat cannot be read."""
        try:
            first = self._stat.read_text().splitlines()[0].split()
        except (OSError, IndexError) as err:
            log.debug("cannot read %s: %s", self._stat, err)
            return None
        if not first or first[0] != "cpu":
            return None
        values = [int(v) for v in first[1:9]]  # user nice system idle iowait irq softirq steal
        values += [0] * (8 - len(values))
        total = sum(values)
        return total - values[3] - values[4], total

    def _memory(self) -> tuple[int | None, int | None]:
        fields: dict[str, int] = {}
        try:
            for line in self._meminfo.read_text().splitlines():
                key, _, rest = line.partition(":")
                parts = rest.split()
                if parts and parts[0].isdigit():
                    fields[key.strip()] = parse_bytes(f"{parts[0]} KiB")  # the file says kB, meaning KiB
        except OSError as err:
            log.debug("cannot read %s: %s", self._meminfo, err)
        total = fields.get("MemTotal")
        available = fields.get("MemAvailable")
        used = total - available if total is not None and available is not None else None
        return used, total

    def sample(self) -> list[DeviceSample]:
        now = self._cpu_times()
        util = None
        if now is not None and self._last is not None and now[1] > self._last[1]:
            util = (now[0] - self._last[0]) / (now[1] - self._last[1])
        if now is not None:
            self._last = now
        used, total = self._memory()
        return [DeviceSample(device=0, vendor=Vendor.CPU, name="host CPU",
                             utilisation=util, memory_used_bytes=used, memory_total_bytes=total)]

    def close(self) -> None:
        pass


def _import_optional(name: str) -> ModuleType | None:
    """The vendor library, or None; amdsmi without libamd_smi.so raises KeyError on import."""
    import importlib

    try:
        return importlib.import_module(name)
    except Exception as err:
        log.info("%s is not importable (%s: %s)", name, type(err).__name__, err)
        return None


def open_sampler(vendor: Vendor | None = None, *, nvidia_lib: Any = None, amd_lib: Any = None) -> DeviceSampler:
    """The sampler for this host: the vendor's library when ``vendor`` names one (the vendor of
    the node's published topology), else NVML then amdsmi; the CPU when neither finds a device."""
    if vendor in (None, Vendor.NVIDIA):
        sampler = NvmlSampler.open(nvidia_lib)
        if sampler is not None:
            return sampler
    if vendor in (None, Vendor.AMD):
        sampler = AmdSmiSampler.open(amd_lib)
        if sampler is not None:
            return sampler
    if vendor not in (None, Vendor.CPU):
        log.warning("the node describes %s devices but no %s library answers; sampling the CPU",
                    vendor.value, vendor.value)
    return CpuSampler()


__all__ = ["AmdSmiSampler", "CpuSampler", "DeviceSample", "DeviceSampler", "NodeSample",
           "NvmlSampler", "open_sampler"]
