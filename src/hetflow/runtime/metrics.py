"""Per-device, per-job and per-cluster metrics, exported through Ray's metrics system.

Three sources, one destination (Ray's Prometheus endpoint on every node, which Ray prefixes
with ``ray_``, so ``hetflow_device_utilisation`` is scraped as ``ray_hetflow_device_utilisation``):

* **Devices.** One :class:`NodeMetricsAgent` actor per Ray node (``num_cpus=0``, pinned with a
  hard ``NodeAffinitySchedulingStrategy``, detached, named ``hetflow-metrics-<node id>`` in
  namespace ``hetflow``) samples its node's devices every ``interval_s`` through one
  :class:`DeviceSampler`: NVML (:class:`NvmlSampler`), amdsmi (:class:`AmdSmiSampler`) or the
  host CPU from ``/proc`` (:class:`CpuSampler`). Gauges, tags ``node, device, vendor, model``:
  ``hetflow_device_utilisation`` (busy fraction 0..1), ``hetflow_device_memory_used_bytes``,
  ``hetflow_device_memory_total_bytes``, ``hetflow_device_power_watts`` (where the library
  gives it) and ``hetflow_device_link_bytes_per_second`` (extra tags ``fabric`` = nvlink|xgmi,
  ``direction`` = tx|rx; the rate of NVML's NVLink / amdsmi's xGMI data counters between two
  samples). A value the library cannot give is not exported (no made-up zeros).
* **Jobs.** A workload calls :func:`report_job_metrics` (from one process per job, e.g. rank
  0) with samples/s, step time and the FLOPs per sample; gauges, tag ``job_id`` (not ``job``,
  which Prometheus reserves for the scrape job and would rename to ``exported_job``):
  ``hetflow_job_samples_per_second``, ``hetflow_job_step_time_seconds``,
  ``hetflow_job_achieved_tflops``, ``hetflow_job_peak_tflops`` (the catalog's dense peak of the
  devices held, at the job's precision) and ``hetflow_job_effective_throughput_ratio``
  (achieved / peak). ``hetflow_job_devices_held`` comes from the cluster exporter (below), which
  reads it from Ray's placement-group table.
* **Cluster.** One :class:`ClusterMetricsExporter` actor (named ``hetflow-cluster-metrics``)
  computes from :func:`~hetflow.runtime.binding.live_snapshot` and the latest device samples:
  ``hetflow_cluster_accelerators``, ``hetflow_cluster_devices_held``,
  ``hetflow_cluster_allocated_utilisation`` (devices held / accelerators),
  ``hetflow_cluster_effective_utilisation`` (mean measured busy fraction of all accelerators),
  ``hetflow_cluster_queue_length`` (hetflow placement groups still PENDING),
  ``hetflow_cluster_fragmentation`` (free devices whose fast-link island is partly held, over
  all free devices) and ``hetflow_cluster_free_devices``.

The agents also store their latest sample, and :func:`report_job_metrics` the job's latest
record, in Ray's internal KV (namespace ``hetflow``, keys ``metrics/node/<node>`` and
``metrics/job/<job>``); :func:`collect_view` reads them back for ``hetflow top``, so the live
view needs no Prometheus.

Start everything on a running cluster (``hetflow top`` does this too)::

    python -c "import ray; ray.init(); from hetflow.runtime.metrics import start_metrics; start_metrics()"

Tested in ``tests/observability/`` (samplers with fake NVML/amdsmi and the real /proc; a local
Ray cluster scraped over HTTP).
"""

from __future__ import annotations

import dataclasses
import json
import logging
import math
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any, Callable, Iterable, Mapping, Protocol, Sequence

from hetflow.core.errors import HetflowError, InputError
from hetflow.core.placement import DeviceRef, Placement
from hetflow.core.topology import ClusterSnapshot, NodeTopology, Vendor
from hetflow.runtime.resources import FAST_KINDS, NODE_LABEL, _label_value, fast_islands

log = logging.getLogger(__name__)

NAMESPACE = "hetflow"  # Ray namespace of the actors and internal-KV namespace of the records
AGENT_PREFIX = "hetflow-metrics-"
EXPORTER_NAME = "hetflow-cluster-metrics"
PROMETHEUS_PREFIX = "ray_"  # Ray prepends this to every application metric
NODE_KEY = "metrics/node/"
JOB_KEY = "metrics/job/"
IDLE_BELOW = 0.10  # a held device busier than this is not "idle"
PRECISIONS = ("bf16", "fp16", "fp32")  # catalog columns <precision>_tflops

DEVICE_TAGS = ("node", "device", "vendor", "model")
LINK_TAGS = DEVICE_TAGS + ("fabric", "direction")
JOB_TAGS = ("job_id",)
DEVICE_GAUGES = {
    "hetflow_device_utilisation": "Busy fraction of the device (0..1) over the last sample",
    "hetflow_device_memory_used_bytes": "Device memory in use, bytes",
    "hetflow_device_memory_total_bytes": "Device memory, bytes",
    "hetflow_device_power_watts": "Power draw, watts (where the vendor library reports it)",
}
LINK_GAUGE = "hetflow_device_link_bytes_per_second"
JOB_GAUGES = {
    "hetflow_job_samples_per_second": "Samples (or tokens, as the job counts them) per second",
    "hetflow_job_step_time_seconds": "Seconds per training or serving step",
    "hetflow_job_achieved_tflops": "Achieved TFLOP/s (samples/s x FLOPs per sample)",
    "hetflow_job_peak_tflops": "Catalog dense peak TFLOP/s of the devices the job holds",
    "hetflow_job_effective_throughput_ratio": "Achieved over peak TFLOP/s",
}
JOB_DEVICES_GAUGE = "hetflow_job_devices_held"
CLUSTER_GAUGES = {
    "hetflow_cluster_accelerators": "Accelerators on alive hetflow nodes",
    "hetflow_cluster_devices_held": "Device-equivalents held by jobs (shared ones by memory)",
    "hetflow_cluster_allocated_utilisation": "Devices held over accelerators (0..1)",
    "hetflow_cluster_effective_utilisation": "Mean measured busy fraction of the accelerators",
    "hetflow_cluster_queue_length": "hetflow placement groups waiting for devices",
    "hetflow_cluster_fragmentation": "Free devices in partly held fast-link islands, over free devices",
    "hetflow_cluster_free_devices": "Accelerators no job holds",
}
METRIC_NAMES = frozenset(
    [*DEVICE_GAUGES, LINK_GAUGE, *JOB_GAUGES, JOB_DEVICES_GAUGE, *CLUSTER_GAUGES]
)


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
    link_fabric: str | None = None  # "nvlink" / "xgmi": what the link rates count
    link_tx_bytes_per_s: float | None = None
    link_rx_bytes_per_s: float | None = None


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
    """NVIDIA GPUs through NVML (``pynvml``): utilisation, memory, power, NVLink data rates.

    NVLink traffic is NVML's ``NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_{TX,RX}`` field values
    (cumulative KiB). They are asked for with ``scopeId = UINT_MAX``, which nvml.h documents as
    the sum over all links; a driver that refuses that scope is asked link by link and the
    links that answer are summed. A GPU whose counters answer neither way has no link rate.
    """

    source = "nvml"
    _TX, _RX = 138, 139  # NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX / _RX
    _ALL_LINKS = 0xFFFFFFFF

    def __init__(self, lib: Any, handles: dict[int, Any], clock: Callable[[], float]) -> None:
        self._lib = lib
        self._handles = handles
        self._clock = clock
        self._rates = _CounterRate()
        self._no_nvlink: set[int] = set()

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
            tx = self._rates.rate((index, "tx"), counters[0] * 1024 if counters else None, now)
            rx = self._rates.rate((index, "rx"), counters[1] * 1024 if counters else None, now)
            out.append(DeviceSample(
                device=index,
                vendor=Vendor.NVIDIA,
                name=name.decode() if isinstance(name, bytes) else name,
                utilisation=_percent(util.gpu) if util is not None else None,
                memory_used_bytes=int(memory.used) if memory is not None else None,
                memory_total_bytes=int(memory.total) if memory is not None else None,
                power_watts=power_mw / 1000.0 if power_mw is not None else None,
                link_fabric="nvlink" if counters else None,
                link_tx_bytes_per_s=tx,
                link_rx_bytes_per_s=rx,
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
        from hetflow.accelerators.amd import _hip_indices, _is_gpu

        lib = lib or _import_optional("amdsmi")
        if lib is None:
            return None
        try:
            lib.amdsmi_init(lib.AmdSmiInitFlags.INIT_AMD_GPUS)
        except lib.AmdSmiException as err:
            log.info("amdsmi did not initialise (%s); not sampling AMD GPUs", " ".join(str(err).split()))
            return None
        try:
            handles = [h for h in lib.amdsmi_get_processor_handles() if _is_gpu(lib, h)]
        except lib.AmdSmiException as err:
            log.warning("amdsmi failed to list GPUs (%s)", " ".join(str(err).split()))
            handles = []
        if not handles:
            lib.amdsmi_shut_down()
            return None
        return cls(lib, dict(zip(_hip_indices(lib, handles), handles)), clock)

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
            tx = self._rates.rate((index, "tx"), counters[0] * 1024 if counters else None, now)
            rx = self._rates.rate((index, "rx"), counters[1] * 1024 if counters else None, now)
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
                link_tx_bytes_per_s=tx,
                link_rx_bytes_per_s=rx,
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
                    fields[key.strip()] = int(parts[0]) * 1024  # the file says kB, meaning KiB
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


# ============================================================================ jobs


@dataclass(frozen=True)
class JobMetrics:
    """A job's latest report. ``devices`` are in rank order; ``tp`` is its tensor-parallel
    degree when known (consecutive ranks form a group)."""

    job_id: str
    timestamp: float
    samples_per_s: float | None = None
    step_time_s: float | None = None
    devices: tuple[DeviceRef, ...] = ()
    tp: int | None = None
    precision: str = "bf16"
    achieved_tflops: float | None = None
    peak_tflops: float | None = None

    @property
    def effective_ratio(self) -> float | None:
        """Achieved over peak TFLOP/s; None unless both are known and the peak is positive."""
        if self.achieved_tflops is None or not self.peak_tflops:
            return None
        return self.achieved_tflops / self.peak_tflops

    def to_dict(self) -> dict[str, Any]:
        data = dataclasses.asdict(self)
        data["devices"] = [[d.node, d.device] for d in self.devices]
        return data

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> "JobMetrics":
        fields = {f.name for f in dataclasses.fields(cls)}
        values = {k: v for k, v in data.items() if k in fields}
        values["devices"] = tuple(DeviceRef(str(n), int(i)) for n, i in data.get("devices", ()))
        return cls(**values)


def peak_tflops(
    devices: Iterable[DeviceRef], nodes: Mapping[str, NodeTopology], precision: str = "bf16"
) -> float | None:
    """Sum of the catalog's dense peak at ``precision`` over ``devices``; None when any device,
    its model or the catalog figure is unknown (a partial sum would overstate efficiency)."""
    from hetflow.accelerators.catalog import default_catalog

    if precision not in PRECISIONS:
        raise InputError(f"precision {precision!r} is not one of {', '.join(PRECISIONS)}")
    catalog = default_catalog()
    total = 0.0
    devices = list(devices)
    for ref in devices:
        node = nodes.get(ref.node)
        device = next((d for d in node.devices if d.index == ref.device), None) if node else None
        spec = catalog.find(device.model or device.name or "") if device else None
        value = getattr(spec, f"{precision}_tflops", None) if spec else None
        if value is None:
            return None
        total += value
    return total if devices else None


def job_metrics(
    job_id: str,
    *,
    samples_per_s: float | None = None,
    step_time_s: float | None = None,
    flops_per_sample: float | None = None,
    devices: Sequence[DeviceRef | tuple[str, int]] = (),
    tp: int | None = None,
    precision: str = "bf16",
    nodes: Mapping[str, NodeTopology] | None = None,
    timestamp: float | None = None,
) -> JobMetrics:
    """The record :func:`report_job_metrics` exports (pure; ``nodes`` are the topologies the
    devices are looked up in). Bad input raises InputError saying which argument."""
    if not job_id:
        raise InputError("job_id must not be empty")
    for name, value in (("samples_per_s", samples_per_s), ("step_time_s", step_time_s),
                        ("flops_per_sample", flops_per_sample)):
        if value is not None and (not math.isfinite(value) or value < 0):
            raise InputError(f"{name} must be a finite number >= 0, got {value!r}")
    if tp is not None and tp < 1:
        raise InputError(f"tp must be >= 1, got {tp}")
    refs = tuple(DeviceRef(str(n), int(i)) for n, i in devices)
    achieved = (samples_per_s * flops_per_sample / 1e12
                if samples_per_s is not None and flops_per_sample is not None else None)
    peak = peak_tflops(refs, nodes or {}, precision) if refs else None
    return JobMetrics(job_id, time.time() if timestamp is None else timestamp, samples_per_s,
                      step_time_s, refs, tp, precision, achieved, peak)


# ============================================================================ cluster


@dataclass(frozen=True)
class ClusterMetrics:
    """The cluster at one moment; utilisations and fragmentation are None with no devices."""

    accelerators: int
    devices_held: float
    free_devices: int
    allocated_utilisation: float | None
    effective_utilisation: float | None
    measured_devices: int  # accelerators with a fresh sample that gave a utilisation
    fragmentation: float | None
    queue_length: int
    jobs: int


def device_held_fraction(snapshot: ClusterSnapshot, node: NodeTopology, index: int) -> float:
    """1 for an exclusively held device, the memory share for shared ones, 0 when free."""
    allocations = snapshot.allocations_on(node.name, index)
    if not allocations:
        return 0.0
    if any(a.exclusive for a in allocations):
        return 1.0
    capacity = node.device(index).memory_bytes
    if not capacity:
        return 1.0
    return min(1.0, sum(a.memory_bytes or 0 for a in allocations) / capacity)


def fresh_sample(samples: Mapping[str, NodeSample], node: str, device: int, vendor: Vendor,
                 now: float, stale_after_s: float) -> DeviceSample | None:
    """The device's sample when it is recent and comes from the device's own vendor library."""
    sample = samples.get(node)
    if sample is None or now - sample.timestamp > stale_after_s:
        return None
    found = sample.device(device)
    return found if found is not None and found.vendor is vendor else None


def cluster_metrics(
    snapshot: ClusterSnapshot,
    samples: Mapping[str, NodeSample],
    *,
    queue_length: int = 0,
    now: float | None = None,
    stale_after_s: float = 30.0,
) -> ClusterMetrics:
    """Allocated vs measured utilisation and fragmentation of ``snapshot``'s accelerators.

    Fragmentation: a free device is stranded when another device of its fast-link island
    (NVLink/NVSwitch/xGMI, :func:`~hetflow.runtime.resources.fast_islands`) is held, because a
    job that needs the whole island can no longer get it; fragmentation is stranded free
    devices over all free devices.
    """
    now = time.time() if now is None else now
    accelerators = free = stranded = measured = 0
    held_sum = busy_sum = 0.0
    for node in snapshot.nodes:
        for island in fast_islands(node):
            fractions = {i: device_held_fraction(snapshot, node, i) for i in island}
            island_used = any(fractions.values())
            for index, fraction in fractions.items():
                accelerators += 1
                held_sum += fraction
                if fraction == 0.0:
                    free += 1
                    stranded += island_used
                device = node.device(index)
                sample = fresh_sample(samples, node.name, index, device.vendor, now, stale_after_s)
                if sample is not None and sample.utilisation is not None:
                    measured += 1
                    busy_sum += sample.utilisation
    jobs = len({a.job_id for a in snapshot.allocations})
    return ClusterMetrics(
        accelerators=accelerators,
        devices_held=held_sum,
        free_devices=free,
        allocated_utilisation=held_sum / accelerators if accelerators else None,
        effective_utilisation=busy_sum / measured if measured else None,
        measured_devices=measured,
        fragmentation=stranded / free if free else (0.0 if accelerators else None),
        queue_length=queue_length,
        jobs=jobs,
    )


@dataclass(frozen=True)
class Hint:
    """Something that probably slows a job down, said so a user can act on it."""

    job_id: str
    kind: str  # "slow-tp-link" or "idle-devices"
    message: str


def job_devices(snapshot: ClusterSnapshot, jobs: Mapping[str, JobMetrics]) -> dict[str, tuple[DeviceRef, ...]]:
    """Devices each job holds now: in the job's rank order when it reported them, else sorted."""
    held: dict[str, list[DeviceRef]] = {}
    for a in snapshot.allocations:
        held.setdefault(a.job_id, []).append(DeviceRef(a.node, a.device))
    out = {}
    for job, refs in sorted(held.items()):
        reported = jobs.get(job)
        if reported and reported.devices and set(reported.devices) == set(refs):
            out[job] = reported.devices
        else:
            out[job] = tuple(sorted(set(refs)))
    return out


def _weakest_pair(snapshot: ClusterSnapshot, group: Sequence[DeviceRef]) -> tuple[float, str, DeviceRef, DeviceRef] | None:
    """The slowest non-fast connection inside ``group``: (GB/s, what, a, b), or None when every
    pair is NVLink/NVSwitch/xGMI/same-package on one node."""
    worst = None
    for i, a in enumerate(group):
        for b in group[i + 1:]:
            if a.node != b.node:
                bw, what = snapshot.inter_node_gbps, "the network between nodes"
            else:
                node = snapshot.node(a.node)
                link = node.link(a.device, b.device)
                if link is not None and link.kind in FAST_KINDS:
                    continue
                bw = node.bandwidth(a.device, b.device)
                what = link.label if link is not None else "an unknown link"
            if worst is None or bw < worst[0]:
                worst = (bw, what, a, b)
    return worst


def _largest_island(snapshot: ClusterSnapshot, models: set[str | None] | None = None) -> tuple[int, str | None]:
    """The largest fast-link island (size, node) among devices of ``models`` (None: any)."""
    best, where = 0, None
    for node in snapshot.nodes:
        for island in fast_islands(node):
            if models is not None and node.device(island[0]).model not in models:
                continue
            if len(island) > best:
                best, where = len(island), node.name
    return best, where


def _island_advice(snapshot: ClusterSnapshot, devices: Sequence[DeviceRef], tp: int) -> str:
    models = {snapshot.node(d.node).device(d.device).model for d in devices}
    size, node = _largest_island(snapshot, models)
    if size >= tp:
        return f"{node} has a fast-link island of {size}: keep each group of {tp} inside one island"
    any_size, any_node = _largest_island(snapshot)
    other = (f"; {any_node} has a fast-link island of {any_size} devices of another model"
             if any_size >= tp else "")
    return (f"no {'/'.join(sorted(m or '?' for m in models))} node has a fast-link island of {tp} "
            f"devices (largest: {size}): use a smaller tp and pipeline parallelism across the slow "
            f"link{other}")


def bottleneck_hints(
    snapshot: ClusterSnapshot,
    jobs: Mapping[str, JobMetrics],
    samples: Mapping[str, NodeSample],
    *,
    now: float | None = None,
    stale_after_s: float = 30.0,
    idle_below: float = IDLE_BELOW,
) -> list[Hint]:
    """Hints for the jobs holding devices in ``snapshot``:

    * ``slow-tp-link``: a tensor-parallel group (``tp`` consecutive ranks of a job that
      reported its layout) includes a pair joined only by PCIe, an unknown link or the
      network, so its all-reduces run at that link's speed;
    * ``idle-devices``: fresh samples show some of the job's devices below ``idle_below``.
    """
    now = time.time() if now is None else now
    names = {n.name for n in snapshot.nodes}
    hints = []
    for job, devices in job_devices(snapshot, jobs).items():
        report = jobs.get(job)
        # Groups are consecutive ranks, so they are only known when the job's report gave the
        # rank order of exactly the devices it holds now.
        tp = report.tp if report is not None and report.devices == devices else None
        devices = tuple(d for d in devices if d.node in names)
        if tp and tp > 1 and len(devices) % tp == 0:
            for g in range(len(devices) // tp):
                weakest = _weakest_pair(snapshot, devices[g * tp:(g + 1) * tp])
                if weakest is None:
                    continue
                bw, what, a, b = weakest
                advice = _island_advice(snapshot, devices, tp)
                hints.append(Hint(job, "slow-tp-link", (
                    f"job {job}: tensor-parallel group {g} (ranks {g * tp}-{(g + 1) * tp - 1}) "
                    f"spans {what} between {a} and {b} (~{bw:g} GB/s per direction); every TP "
                    f"all-reduce runs at that speed - {advice}")))
                break  # one hint per job is enough to act on
        idle = []
        for ref in devices:
            node = snapshot.node(ref.node)
            sample = fresh_sample(samples, ref.node, ref.device, node.device(ref.device).vendor,
                                  now, stale_after_s)
            if sample is not None and sample.utilisation is not None and sample.utilisation < idle_below:
                idle.append(ref)
        if idle:
            where = ", ".join(str(r) for r in idle)
            hints.append(Hint(job, "idle-devices", (
                f"job {job}: {len(idle)} of {len(devices)} devices idle (< {idle_below:.0%} busy): "
                f"{where} - the job may be waiting on input, the host or the network, or holds "
                "devices it does not use")))
    return hints


# ============================================================================ Ray: gauges


class _Gauges:
    """``ray.util.metrics.Gauge`` objects made once per process, set with tags; None skips."""

    def __init__(self, specs: Mapping[str, str], tag_keys: tuple[str, ...]) -> None:
        from ray.util.metrics import Gauge

        self._gauges = {name: Gauge(name, description=desc, tag_keys=tag_keys) for name, desc in specs.items()}

    def set(self, name: str, value: float | None, tags: Mapping[str, str]) -> None:
        if value is not None and math.isfinite(value):
            self._gauges[name].set(float(value), tags=dict(tags))


def _device_tags(node: str, d: DeviceSample, model: str | None) -> dict[str, str]:
    return {"node": node, "device": str(d.device), "vendor": d.vendor.value,
            "model": model or d.name or "unknown"}


def export_node_sample(sample: NodeSample, models: Mapping[int, str], gauges: _Gauges, links: _Gauges) -> None:
    for d in sample.devices:
        tags = _device_tags(sample.node, d, models.get(d.device))
        gauges.set("hetflow_device_utilisation", d.utilisation, tags)
        gauges.set("hetflow_device_memory_used_bytes", d.memory_used_bytes, tags)
        gauges.set("hetflow_device_memory_total_bytes", d.memory_total_bytes, tags)
        gauges.set("hetflow_device_power_watts", d.power_watts, tags)
        if d.link_fabric:
            for direction, value in (("tx", d.link_tx_bytes_per_s), ("rx", d.link_rx_bytes_per_s)):
                links.set(LINK_GAUGE, value, {**tags, "fabric": d.link_fabric, "direction": direction})


# ============================================================================ Ray: KV records


def _kv_put(key: str, value: Mapping[str, Any]) -> None:
    from ray.experimental import internal_kv

    internal_kv._internal_kv_put(key, json.dumps(value), overwrite=True, namespace=NAMESPACE)


def _kv_read_all(prefix: str) -> list[dict[str, Any]]:
    from ray.experimental import internal_kv

    out = []
    for key in internal_kv._internal_kv_list(prefix, namespace=NAMESPACE) or []:
        raw = internal_kv._internal_kv_get(key, namespace=NAMESPACE)
        if raw:
            try:
                out.append(json.loads(raw))
            except ValueError:
                log.warning("ignoring a malformed metrics record at %r", key)
    return out


def read_node_samples() -> dict[str, NodeSample]:
    """The latest sample each agent stored, by node name."""
    samples = {}
    for data in _kv_read_all(NODE_KEY):
        sample = NodeSample.from_dict(data)
        samples[sample.node] = sample
    return samples


def read_job_metrics() -> dict[str, JobMetrics]:
    """The latest report of every job that called :func:`report_job_metrics`."""
    jobs = {}
    for data in _kv_read_all(JOB_KEY):
        record = JobMetrics.from_dict(data)
        jobs[record.job_id] = record
    return jobs


def pending_hetflow_groups() -> int:
    """hetflow placement groups Ray has not committed yet (jobs waiting for devices)."""
    from ray.util import placement_group_table

    return sum(1 for g in placement_group_table().values()
               if g.get("state") in ("PENDING", "RESCHEDULING") and str(g.get("name", "")).startswith("hetflow-"))


# ============================================================================ Ray: actors


def _ray_node_names() -> dict[str, str]:
    """Ray node id -> the name metrics use: the published hetflow node name where the node is a
    hetflow node, else ``ray-<first 8 hex of the node id>``."""
    import ray

    from hetflow.runtime.binding import published_nodes

    by_label = {_label_value(name): name for name in published_nodes()}
    out = {}
    for info in ray.nodes():
        if not info.get("Alive"):
            continue
        label = (info.get("Labels") or {}).get(NODE_LABEL)
        out[info["NodeID"]] = by_label.get(label, label) if label else f"ray-{info['NodeID'][:8]}"
    return out


def default_sampler_factory(node: str) -> DeviceSampler:
    """The sampler an agent uses unless told otherwise: the vendor of the node's published
    topology decides which library to open."""
    from hetflow.runtime.binding import published_nodes

    topology = published_nodes().get(node)
    vendors = {d.vendor for d in topology.accelerators} if topology else set()
    vendor = vendors.pop() if len(vendors) == 1 else (Vendor.CPU if topology else None)
    return open_sampler(vendor)


class _Loop:
    """Calls ``tick`` every ``interval_s`` on a daemon thread until stopped; errors are logged,
    never fatal (a metrics agent must not die because one read failed)."""

    def __init__(self, interval_s: float, tick: Callable[[], Any], what: str) -> None:
        self._stop = threading.Event()
        self._tick = tick
        self._what = what
        self._interval = interval_s
        self._thread = threading.Thread(target=self._run, name=what, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(self._interval):
            try:
                self._tick()
            except Exception:  # noqa: BLE001 - keep sampling; say what failed
                log.exception("%s: one round failed", self._what)

    def stop(self) -> None:
        self._stop.set()


class NodeMetricsAgent:
    """One per node: samples the node's devices, exports gauges, stores the latest sample.

    Made a Ray actor class by :func:`start_metrics` (``ray.remote(num_cpus=0)``).
    ``sampler_factory(node)`` returns the :class:`DeviceSampler` to use (tests pass fakes).
    """

    def __init__(self, node: str, interval_s: float = 5.0,
                 sampler_factory: Callable[[str], DeviceSampler] | None = None) -> None:
        from hetflow.runtime.binding import published_nodes

        self._node = node
        self._sampler = (sampler_factory or default_sampler_factory)(node)
        topology = published_nodes().get(node)
        self._models = {d.index: d.model for d in topology.devices if d.model} if topology else {}
        self._gauges = _Gauges(DEVICE_GAUGES, DEVICE_TAGS)
        self._links = _Gauges({LINK_GAUGE: "Link data rate, bytes/s (NVLink or xGMI counters)"}, LINK_TAGS)
        self._lock = threading.Lock()
        self._latest: NodeSample | None = None
        self.sample_now()
        self._loop = _Loop(interval_s, self.sample_now, f"metrics agent {node}")

    def sample_now(self) -> dict[str, Any]:
        """Sample, export and store now; returns the sample as a dict."""
        with self._lock:
            sample = NodeSample(self._node, self._sampler.source, time.time(),
                                tuple(self._sampler.sample()))
            export_node_sample(sample, self._models, self._gauges, self._links)
            _kv_put(NODE_KEY + self._node, sample.to_dict())
            self._latest = sample
            return sample.to_dict()

    def latest(self) -> dict[str, Any] | None:
        return self._latest.to_dict() if self._latest else None

    def source(self) -> str:
        return self._sampler.source

    def stop(self) -> None:
        self._loop.stop()
        with self._lock:
            self._sampler.close()


class ClusterMetricsExporter:
    """One per cluster: exports cluster and per-job device counts every ``interval_s``."""

    def __init__(self, interval_s: float = 5.0, stale_after_s: float | None = None) -> None:
        self._stale = stale_after_s if stale_after_s is not None else max(30.0, 3 * interval_s)
        self._gauges = _Gauges(CLUSTER_GAUGES, ())
        self._jobs = _Gauges({JOB_DEVICES_GAUGE: "Devices the job holds (from Ray's placement groups)"}, JOB_TAGS)
        self._seen_jobs: set[str] = set()
        self._latest: dict[str, Any] = {}
        self.export_now()
        self._loop = _Loop(interval_s, self.export_now, "cluster metrics exporter")

    def export_now(self) -> dict[str, Any]:
        """Compute and export now; returns the cluster metrics as a dict."""
        view = collect_view(stale_after_s=self._stale)
        for name in CLUSTER_GAUGES:
            self._gauges.set(name, getattr(view.cluster, name.removeprefix("hetflow_cluster_")), {})
        for job, devices in view.job_devices.items():
            self._jobs.set(JOB_DEVICES_GAUGE, len(devices), {"job_id": job})
        for gone in self._seen_jobs - set(view.job_devices):
            self._jobs.set(JOB_DEVICES_GAUGE, 0, {"job_id": gone})
        self._seen_jobs = set(view.job_devices)
        _prune_job_records(view, JOB_RECORD_TTL_S)
        self._latest = dataclasses.asdict(view.cluster)
        return self._latest

    def latest(self) -> dict[str, Any]:
        return self._latest

    def stop(self) -> None:
        self._loop.stop()


JOB_RECORD_TTL_S = 600.0  # a finished job's last report stays this long, then is deleted


def _prune_job_records(view: "ClusterView", ttl_s: float) -> None:
    """Delete reports of jobs that hold no device and have not reported for ``ttl_s``."""
    from ray.experimental import internal_kv

    for job, record in view.jobs.items():
        if job not in view.job_devices and view.timestamp - record.timestamp > ttl_s:
            internal_kv._internal_kv_del(JOB_KEY + job, namespace=NAMESPACE)


def _actor_classes() -> tuple[Any, Any]:
    import ray

    return ray.remote(num_cpus=0)(NodeMetricsAgent), ray.remote(num_cpus=0)(ClusterMetricsExporter)


def start_metrics(
    interval_s: float = 5.0,
    sampler_factory: Callable[[str], DeviceSampler] | None = None,
    *,
    timeout_s: float = 60.0,
) -> dict[str, Any]:
    """Start one metrics agent on every alive node without one, and the cluster exporter.

    Idempotent: agents and exporter are named detached actors, found again when they exist
    (``interval_s`` and ``sampler_factory`` then do not change them). Waits until every agent
    has taken its first sample. Returns ``{node name: agent handle}``. Needs a connected Ray.
    """
    import ray
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    if not ray.is_initialized():
        raise HetflowError("start_metrics needs a connected Ray: call ray.init(address=...) first")
    if interval_s <= 0:
        raise InputError(f"interval_s must be > 0, got {interval_s}")
    agent_cls, exporter_cls = _actor_classes()
    agents = {}
    for node_id, name in _ray_node_names().items():
        agents[name] = agent_cls.options(
            name=AGENT_PREFIX + node_id, namespace=NAMESPACE, lifetime="detached",
            get_if_exists=True,
            scheduling_strategy=NodeAffinitySchedulingStrategy(node_id=node_id, soft=False),
        ).remote(name, interval_s, sampler_factory)
    exporter = exporter_cls.options(
        name=EXPORTER_NAME, namespace=NAMESPACE, lifetime="detached", get_if_exists=True,
    ).remote(interval_s)
    ray.get([a.latest.remote() for a in agents.values()] + [exporter.latest.remote()], timeout=timeout_s)
    return agents


def stop_metrics() -> int:
    """Kill every hetflow metrics actor (agents and exporter); returns how many."""
    import ray
    from ray.util import list_named_actors

    killed = 0
    for entry in list_named_actors(all_namespaces=True):
        name, namespace = entry["name"], entry["namespace"]
        if namespace == NAMESPACE and (name.startswith(AGENT_PREFIX) or name == EXPORTER_NAME):
            try:
                ray.kill(ray.get_actor(name, namespace=namespace))
                killed += 1
            except ValueError:
                pass  # gone meanwhile
    return killed


# ============================================================================ jobs: reporting

_job_state: dict[str, Any] = {"gauges": None, "last_put": {}, "nodes": (0.0, {})}
_KV_MIN_INTERVAL_S = 1.0  # a job may report every step; the KV record is refreshed at most 1/s
_NODES_TTL_S = 60.0


def _topologies() -> dict[str, NodeTopology]:
    """Published topologies, cached for a minute per process (a report per step must not read
    the KV every time)."""
    from hetflow.runtime.binding import published_nodes

    stamp, nodes = _job_state["nodes"]
    if time.monotonic() - stamp > _NODES_TTL_S:
        nodes = published_nodes()
        _job_state["nodes"] = (time.monotonic(), nodes)
    return nodes


def report_job_metrics(
    job_id: str,
    *,
    samples_per_s: float | None = None,
    step_time_s: float | None = None,
    flops_per_sample: float | None = None,
    placement: Placement | None = None,
    devices: Sequence[DeviceRef | tuple[str, int]] | None = None,
    tp: int | None = None,
    precision: str = "bf16",
) -> JobMetrics:
    """Record how a job is doing; call it from one process per job (rank 0) every few steps.

    ``samples_per_s`` counts whatever the job counts (samples, tokens); ``flops_per_sample`` is
    the model FLOPs per counted unit (e.g. 6 x parameters per token for training), giving the
    achieved TFLOP/s and, against the catalog's ``<precision>_tflops`` peak of the devices held
    (``placement`` or ``devices``, rank order), the effective throughput ratio. ``tp`` (taken
    from ``placement`` when given) lets ``hetflow top`` check the tensor-parallel groups' links.

    Exports the job gauges and stores the record (at most once a second per job) when Ray is
    connected; without Ray it only returns the record. Bad values raise InputError.
    """
    import ray

    refs = tuple(placement.devices) if placement is not None else tuple(devices or ())
    if placement is not None and tp is None:
        tp = placement.layout.tp
    connected = ray.is_initialized()
    record = job_metrics(job_id, samples_per_s=samples_per_s, step_time_s=step_time_s,
                         flops_per_sample=flops_per_sample, devices=refs, tp=tp,
                         precision=precision, nodes=_topologies() if connected and refs else {})
    if not connected:
        return record
    if _job_state["gauges"] is None:
        _job_state["gauges"] = _Gauges(JOB_GAUGES, JOB_TAGS)
    gauges: _Gauges = _job_state["gauges"]
    tags = {"job_id": job_id}
    gauges.set("hetflow_job_samples_per_second", record.samples_per_s, tags)
    gauges.set("hetflow_job_step_time_seconds", record.step_time_s, tags)
    gauges.set("hetflow_job_achieved_tflops", record.achieved_tflops, tags)
    gauges.set("hetflow_job_peak_tflops", record.peak_tflops, tags)
    gauges.set("hetflow_job_effective_throughput_ratio", record.effective_ratio, tags)
    last = _job_state["last_put"].get(job_id, 0.0)
    if time.monotonic() - last >= _KV_MIN_INTERVAL_S:
        _kv_put(JOB_KEY + job_id, record.to_dict())
        _job_state["last_put"][job_id] = time.monotonic()
    return record


# ============================================================================ the live view


@dataclass(frozen=True)
class ClusterView:
    """Everything ``hetflow top`` shows, read at ``timestamp``."""

    timestamp: float
    snapshot: ClusterSnapshot
    samples: dict[str, NodeSample]
    jobs: dict[str, JobMetrics]
    job_devices: dict[str, tuple[DeviceRef, ...]]
    cluster: ClusterMetrics
    hints: tuple[Hint, ...]
    stale_after_s: float


def build_view(
    snapshot: ClusterSnapshot,
    samples: Mapping[str, NodeSample],
    jobs: Mapping[str, JobMetrics],
    *,
    queue_length: int = 0,
    now: float | None = None,
    stale_after_s: float = 30.0,
) -> ClusterView:
    """The view from its inputs (pure; :func:`collect_view` reads them from Ray)."""
    now = time.time() if now is None else now
    return ClusterView(
        timestamp=now,
        snapshot=snapshot,
        samples=dict(samples),
        jobs=dict(jobs),
        job_devices=job_devices(snapshot, jobs),
        cluster=cluster_metrics(snapshot, samples, queue_length=queue_length, now=now,
                                stale_after_s=stale_after_s),
        hints=tuple(bottleneck_hints(snapshot, jobs, samples, now=now, stale_after_s=stale_after_s)),
        stale_after_s=stale_after_s,
    )


def collect_view(stale_after_s: float = 30.0) -> ClusterView:
    """Read the live snapshot, the agents' samples and the job reports from the connected Ray."""
    from hetflow.runtime.binding import live_snapshot

    return build_view(live_snapshot(), read_node_samples(), read_job_metrics(),
                      queue_length=pending_hetflow_groups(), stale_after_s=stale_after_s)


__all__ = [
    "AmdSmiSampler", "ClusterMetrics", "ClusterMetricsExporter", "ClusterView", "CpuSampler",
    "DeviceSample", "DeviceSampler", "Hint", "JobMetrics", "METRIC_NAMES", "NodeMetricsAgent",
    "NodeSample", "NvmlSampler", "PROMETHEUS_PREFIX", "bottleneck_hints", "build_view",
    "cluster_metrics", "collect_view", "job_metrics", "open_sampler", "peak_tflops",
    "read_job_metrics", "read_node_samples", "report_job_metrics", "start_metrics",
    "stop_metrics",
]
