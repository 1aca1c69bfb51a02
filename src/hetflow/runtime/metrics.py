"""Per-device, per-job and per-cluster metrics, exported through Ray's metrics system.

Three sources, one destination (Ray's Prometheus endpoint on every node, which Ray prefixes
with ``ray_``, so ``hetflow_device_utilization_ratio`` is scraped as
``ray_hetflow_device_utilization_ratio``). Names follow Prometheus' naming rules: base units
(``_bytes``, ``_seconds``, ``_watts``, FLOP/s as ``_flops``), fractions 0..1 as ``_ratio``,
``_total`` only on counters, "utilization" spelled as Ray and DCGM spell it. The old names and
what replaced them: :data:`RENAMED` (and docs/observability.md).

* **Devices.** One :class:`NodeMetricsAgent` actor per Ray node (``num_cpus=0``, pinned with a
  hard ``NodeAffinitySchedulingStrategy``, detached, named ``hetflow-metrics-<node id>`` in
  namespace ``hetflow``) samples its node's devices every ``interval_s`` through one
  :class:`DeviceSampler`: NVML (:class:`NvmlSampler`), amdsmi (:class:`AmdSmiSampler`) or the
  host CPU from ``/proc`` (:class:`CpuSampler`). Gauges, tags ``node, device, vendor, model``:
  ``hetflow_device_utilization_ratio`` (busy fraction 0..1), ``hetflow_device_memory_used_bytes``,
  ``hetflow_device_memory_capacity_bytes``, ``hetflow_device_power_watts`` (where the library
  gives it); and one counter, ``hetflow_device_link_bytes_total`` (extra tags ``fabric`` =
  nvlink|xgmi|pcie, ``direction`` = tx|rx): the vendor's own cumulative data counters (NVML's
  NVLink and PCIe counters, amdsmi's xGMI counters), so ``rate()`` gives the traffic. A value
  the library cannot give is not exported (no made-up zeros).
* **Jobs.** A workload calls :func:`report_job_metrics` (from one process per job, e.g. rank
  0) with samples/s, step time and the FLOPs per sample; gauges, tag ``job_id`` (not ``job``,
  which Prometheus reserves for the scrape job and would rename to ``exported_job``):
  ``hetflow_job_samples_per_second``, ``hetflow_job_step_duration_seconds``,
  ``hetflow_job_achieved_flops``, ``hetflow_job_peak_flops`` (FLOP/s; the peak is the catalog's
  dense peak of the devices held, at the job's precision) and
  ``hetflow_job_effective_throughput_ratio`` (achieved / peak). ``hetflow_job_devices_held``
  comes from the cluster exporter (below), which reads it from Ray's placement-group table.
* **Cluster.** One :class:`ClusterMetricsExporter` actor (named ``hetflow-cluster-metrics``)
  computes from :func:`~hetflow.runtime.binding.live_snapshot` and the latest device samples:
  ``hetflow_cluster_accelerators``, ``hetflow_cluster_devices_held``,
  ``hetflow_cluster_allocated_utilization_ratio`` (devices held / accelerators),
  ``hetflow_cluster_effective_utilization_ratio`` (mean measured busy fraction of all
  accelerators), ``hetflow_cluster_queue_length`` (hetflow placement groups still PENDING),
  ``hetflow_cluster_fragmentation_ratio`` (free devices whose fast-link island is partly held,
  over all free devices) and ``hetflow_cluster_free_devices``.

The agents also store their latest sample, and :func:`report_job_metrics` the job's latest
record, in Ray's internal KV (namespace ``hetflow``, keys ``metrics/node/<node>`` and
``metrics/job/<job>``); :func:`collect_view` reads them back for ``hetflow top``, so the live
view needs no Prometheus.

Start everything on a running cluster (``hetflow top`` does this too)::

    python -c "import ray; ray.init(); from hetflow.runtime.metrics import start_metrics; start_metrics()"

The samplers live in :mod:`hetflow.runtime.samplers` and the calculations (job and cluster
metrics, bottleneck hints) in :mod:`hetflow.runtime.measures`, both free of Ray; this module
is the Ray side: gauges, the agents and the exporter, the KV records and the view for ``top``.
Tested in ``tests/observability/`` (samplers with fake NVML/amdsmi and the real /proc; a local
Ray cluster scraped over HTTP and parsed with prometheus_client's parser; the naming rules in
``test_metric_names.py``).
"""

from __future__ import annotations

import dataclasses
import json
import logging
import math
import threading
import time
from dataclasses import dataclass
from typing import Any, Callable, Mapping, Sequence

from hetflow.core.errors import HetflowError, InputError
from hetflow.core.placement import DeviceRef, Placement
from hetflow.core.topology import ClusterSnapshot, NodeTopology, Vendor
from hetflow.runtime.resources import NODE_LABEL, label_value
from hetflow.runtime.measures import (
    ClusterMetrics,
    Hint,
    JobMetrics,
    bottleneck_hints,
    cluster_metrics,
    job_devices,
    job_metrics,
)
from hetflow.runtime.samplers import DeviceSample, DeviceSampler, NodeSample, open_sampler

log = logging.getLogger(__name__)

NAMESPACE = "hetflow"  # Ray namespace of the actors and internal-KV namespace of the records
AGENT_PREFIX = "hetflow-metrics-"
EXPORTER_NAME = "hetflow-cluster-metrics"
PROMETHEUS_PREFIX = "ray_"  # Ray prepends this to every application metric
NODE_KEY = "metrics/node/"
JOB_KEY = "metrics/job/"

DEVICE_TAGS = ("node", "device", "vendor", "model")
LINK_TAGS = DEVICE_TAGS + ("fabric", "direction")
JOB_TAGS = ("job_id",)
DEVICE_GAUGES = {
    "hetflow_device_utilization_ratio": "Busy fraction of the device (0..1) over the last sample",
    "hetflow_device_memory_used_bytes": "Device memory in use, bytes",
    "hetflow_device_memory_capacity_bytes": "Device memory, bytes",
    "hetflow_device_power_watts": "Power draw, watts (where the vendor library reports it)",
}
LINK_COUNTER = "hetflow_device_link_bytes_total"
LINK_DESCRIPTION = ("Bytes over the device's links, from the vendor's cumulative counters "
                    "(NVML NVLink/PCIe, amdsmi xGMI)")
JOB_GAUGES = {
    "hetflow_job_samples_per_second": "Samples (or tokens, as the job counts them) per second",
    "hetflow_job_step_duration_seconds": "Seconds per training or serving step (the latest report)",
    "hetflow_job_achieved_flops": "Achieved FLOP/s (samples/s x FLOPs per sample)",
    "hetflow_job_peak_flops": "Catalog dense peak FLOP/s of the devices the job holds",
    "hetflow_job_effective_throughput_ratio": "Achieved over peak FLOP/s (0..1)",
}
JOB_DEVICES_GAUGE = "hetflow_job_devices_held"
# gauge -> (the ClusterMetrics field it shows, description)
CLUSTER_GAUGES = {
    "hetflow_cluster_accelerators": ("accelerators", "Accelerators on alive hetflow nodes"),
    "hetflow_cluster_devices_held": ("devices_held", "Device-equivalents held by jobs (shared ones by memory)"),
    "hetflow_cluster_allocated_utilization_ratio": ("allocated_utilisation", "Devices held over accelerators (0..1)"),
    "hetflow_cluster_effective_utilization_ratio": ("effective_utilisation", "Mean measured busy fraction of the accelerators (0..1)"),
    "hetflow_cluster_queue_length": ("queue_length", "hetflow placement groups waiting for devices"),
    "hetflow_cluster_fragmentation_ratio": ("fragmentation", "Free devices in partly held fast-link islands, over free devices (0..1)"),
    "hetflow_cluster_free_devices": ("free_devices", "Accelerators no job holds"),
}
METRIC_TYPES = {
    **{name: "gauge" for name in (*DEVICE_GAUGES, *JOB_GAUGES, JOB_DEVICES_GAUGE, *CLUSTER_GAUGES)},
    LINK_COUNTER: "counter",
}
METRIC_NAMES = frozenset(METRIC_TYPES)
# What each name exported before the naming fix became (for users' queries and dashboards).
RENAMED = {
    "hetflow_device_utilisation": "hetflow_device_utilization_ratio",
    "hetflow_device_memory_total_bytes": "hetflow_device_memory_capacity_bytes",
    "hetflow_device_link_bytes_per_second": LINK_COUNTER,
    "hetflow_job_step_time_seconds": "hetflow_job_step_duration_seconds",
    "hetflow_job_achieved_tflops": "hetflow_job_achieved_flops",
    "hetflow_job_peak_tflops": "hetflow_job_peak_flops",
    "hetflow_cluster_allocated_utilisation": "hetflow_cluster_allocated_utilization_ratio",
    "hetflow_cluster_effective_utilisation": "hetflow_cluster_effective_utilization_ratio",
    "hetflow_cluster_fragmentation": "hetflow_cluster_fragmentation_ratio",
}


# ============================================================================ Ray: gauges


class _Gauges:
    """``ray.util.metrics.Gauge`` objects made once per process, set with tags; None skips."""

    def __init__(self, specs: Mapping[str, str], tag_keys: tuple[str, ...]) -> None:
        from ray.util.metrics import Gauge

        self._gauges = {name: Gauge(name, description=desc, tag_keys=tag_keys) for name, desc in specs.items()}

    def set(self, name: str, value: float | None, tags: Mapping[str, str]) -> None:
        if value is not None and math.isfinite(value):
            self._gauges[name].set(float(value), tags=dict(tags))


class _Counters:
    """``ray.util.metrics.Counter`` objects made once per process (Ray exports each as
    ``ray_<name>``, type counter, with ``_total`` once)."""

    def __init__(self, specs: Mapping[str, str], tag_keys: tuple[str, ...]) -> None:
        from ray.util.metrics import Counter

        self._counters = {name: Counter(name, description=desc, tag_keys=tag_keys) for name, desc in specs.items()}

    def inc(self, name: str, value: float, tags: Mapping[str, str]) -> None:
        if value > 0:  # Ray refuses zero increments; a counter that has not moved stays unset
            self._counters[name].inc(float(value), tags=dict(tags))


class CounterFeed:
    """Feeds readings of a vendor's cumulative counter into a Prometheus counter as increments.

    The first reading of a key adds the whole reading, so the exported counter equals the
    vendor's (traffic since the driver loaded). A reading below the previous one (the driver
    reloaded, or NVML's PCIe counter wrapped) restarts from zero: it adds the reading itself,
    so the exported counter never goes down (what the wrap itself skipped is lost).
    """

    def __init__(self) -> None:
        self._last: dict[Any, int] = {}

    def increment(self, key: Any, reading: int) -> int:
        last = self._last.get(key)
        self._last[key] = reading
        if last is None or reading < last:
            return reading
        return reading - last


def _device_tags(node: str, d: DeviceSample, model: str | None) -> dict[str, str]:
    return {"node": node, "device": str(d.device), "vendor": d.vendor.value,
            "model": model or d.name or "unknown"}


def export_node_sample(sample: NodeSample, models: Mapping[int, str], gauges: _Gauges,
                       links: _Counters, feed: CounterFeed) -> None:
    for d in sample.devices:
        tags = _device_tags(sample.node, d, models.get(d.device))
        gauges.set("hetflow_device_utilization_ratio", d.utilisation, tags)
        gauges.set("hetflow_device_memory_used_bytes", d.memory_used_bytes, tags)
        gauges.set("hetflow_device_memory_capacity_bytes", d.memory_total_bytes, tags)
        gauges.set("hetflow_device_power_watts", d.power_watts, tags)
        for (fabric, direction), reading in d.counters().items():
            step = feed.increment((d.device, fabric, direction), reading)
            links.inc(LINK_COUNTER, step, {**tags, "fabric": fabric, "direction": direction})


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

    by_label = {label_value(name): name for name in published_nodes()}
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
        self._links = _Counters({LINK_COUNTER: LINK_DESCRIPTION}, LINK_TAGS)
        self._feed = CounterFeed()
        self._lock = threading.Lock()
        self._latest: NodeSample | None = None
        self.sample_now()
        self._loop = _Loop(interval_s, self.sample_now, f"metrics agent {node}")

    def sample_now(self) -> dict[str, Any]:
        """Sample, export and store now; returns the sample as a dict."""
        with self._lock:
            sample = NodeSample(self._node, self._sampler.source, time.time(),
                                tuple(self._sampler.sample()))
            export_node_sample(sample, self._models, self._gauges, self._links, self._feed)
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
        self._gauges = _Gauges({name: desc for name, (_, desc) in CLUSTER_GAUGES.items()}, ())
        self._jobs = _Gauges({JOB_DEVICES_GAUGE: "Devices the job holds (from Ray's placement groups)"}, JOB_TAGS)
        self._seen_jobs: set[str] = set()
        self._latest: dict[str, Any] = {}
        self.export_now()
        self._loop = _Loop(interval_s, self.export_now, "cluster metrics exporter")

    def export_now(self) -> dict[str, Any]:
        """Compute and export now; returns the cluster metrics as a dict."""
        view = collect_view(stale_after_s=self._stale)
        for name, (attribute, _) in CLUSTER_GAUGES.items():
            self._gauges.set(name, getattr(view.cluster, attribute), {})
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
    gauges.set("hetflow_job_step_duration_seconds", record.step_time_s, tags)
    gauges.set("hetflow_job_achieved_flops", _flops(record.achieved_tflops), tags)
    gauges.set("hetflow_job_peak_flops", _flops(record.peak_tflops), tags)
    gauges.set("hetflow_job_effective_throughput_ratio", record.effective_ratio, tags)
    last = _job_state["last_put"].get(job_id, 0.0)
    if time.monotonic() - last >= _KV_MIN_INTERVAL_S:
        _kv_put(JOB_KEY + job_id, record.to_dict())
        _job_state["last_put"][job_id] = time.monotonic()
    return record


def _flops(tflops: float | None) -> float | None:
    return None if tflops is None else tflops * 1e12


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
    "ClusterMetricsExporter", "ClusterView", "CounterFeed", "METRIC_NAMES", "METRIC_TYPES",
    "NodeMetricsAgent", "PROMETHEUS_PREFIX", "RENAMED", "build_view", "collect_view", "read_job_metrics", "read_node_samples",
    "report_job_metrics", "start_metrics", "stop_metrics",
]
