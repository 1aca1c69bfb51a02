"""Metrics computed from a cluster snapshot and the latest samples: per job
(:func:`job_metrics`: achieved against the catalog's peak), per cluster
(:func:`cluster_metrics`: allocated and effective utilisation, fragmentation, free devices)
and the bottleneck hints ``hetflow top`` prints (:func:`bottleneck_hints`).

Functions of their inputs (no Ray; the clock only when no time is given): :mod:`hetflow.runtime.metrics` feeds them
from the agents' records and exports the results as gauges.
"""

from __future__ import annotations

import dataclasses
import logging
import math
import time
from dataclasses import dataclass
from typing import Any, Iterable, Mapping, Sequence

from hetflow.core.errors import InputError
from hetflow.core.placement import DeviceRef
from hetflow.core.topology import ClusterSnapshot, NodeTopology, Vendor
from hetflow.runtime.resources import FAST_KINDS, fast_islands
from hetflow.runtime.samplers import DeviceSample, NodeSample

log = logging.getLogger(__name__)


IDLE_BELOW = 0.10  # a held device busier than this is not "idle"
PRECISIONS = ("bf16", "fp16", "fp32")  # catalog columns <precision>_tflops


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


__all__ = ["ClusterMetrics", "Hint", "JobMetrics", "bottleneck_hints", "cluster_metrics",
           "device_held_fraction", "fresh_sample", "job_devices", "job_metrics", "peak_tflops"]
