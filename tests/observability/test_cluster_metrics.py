"""Cluster metrics, bottleneck hints and job throughput, computed from snapshots and samples.

No Ray: these are the pure functions the cluster exporter and ``hetflow top`` call. Nodes come
from the catalog (``synthetic_node``): an 8x H100 node is one NVSwitch island, a 4x L40S node
has only PCIe (two GPUs per NUMA node, PHB inside one and SYS across).

    .venv/bin/python -m pytest -q tests/observability/test_cluster_metrics.py
"""

from __future__ import annotations

import dataclasses

import pytest

from hetflow.accelerators.catalog import default_catalog
from hetflow.accelerators.synthetic import synthetic_node
from hetflow.core.errors import InputError
from hetflow.core.placement import DeviceRef
from hetflow.core.topology import Allocation, ClusterSnapshot, Vendor
from hetflow.runtime.measures import JobMetrics, bottleneck_hints, cluster_metrics, job_metrics
from hetflow.runtime.metrics import build_view, report_job_metrics
from hetflow.runtime.samplers import DeviceSample, NodeSample

GIB = 1 << 30
NOW = 1_000_000.0


def _snapshot(*allocations: Allocation, inter_node_gbps: float = 25.0) -> ClusterSnapshot:
    nodes = (synthetic_node("8x H100", "h100-a"), synthetic_node("8x H100", "h100-b"),
             synthetic_node("4x L40S", "l40s"))
    return ClusterSnapshot(nodes=nodes, allocations=allocations, inter_node_gbps=inter_node_gbps)


def _exclusive(job: str, node: str, *devices: int) -> tuple[Allocation, ...]:
    return tuple(Allocation(job, node, d) for d in devices)


def _samples(util: dict[tuple[str, int], float], age_s: float = 1.0, vendor=Vendor.NVIDIA) -> dict[str, NodeSample]:
    per_node: dict[str, list[DeviceSample]] = {}
    for (node, device), u in util.items():
        per_node.setdefault(node, []).append(DeviceSample(device, vendor, utilisation=u))
    return {n: NodeSample(n, "nvml", NOW - age_s, tuple(d)) for n, d in per_node.items()}


# ---- cluster metrics ----------------------------------------------------------------------


def test_allocated_utilisation_counts_shared_devices_by_memory() -> None:
    l40s_memory = default_catalog().lookup("L40S").memory_bytes
    snap = _snapshot(*_exclusive("train", "h100-a", 0, 1, 2, 3),
                     Allocation("serve", "l40s", 0, memory_bytes=l40s_memory // 2, exclusive=False))
    m = cluster_metrics(snap, {}, now=NOW)

    assert m.accelerators == 20
    assert m.devices_held == pytest.approx(4.5)
    assert m.allocated_utilisation == pytest.approx(4.5 / 20)
    assert m.free_devices == 15  # the half-shared L40S is not free
    assert m.jobs == 2
    assert m.effective_utilisation is None and m.measured_devices == 0


def test_fragmentation_counts_free_devices_stranded_in_partly_held_islands() -> None:
    # h100-a: 4 of 8 held -> its 4 free GPUs are stranded; h100-b untouched; the L40S GPUs
    # are PCIe singletons, so holding one strands nothing.
    snap = _snapshot(*_exclusive("a", "h100-a", 0, 1, 2, 3), *_exclusive("b", "l40s", 0, 2))
    m = cluster_metrics(snap, {}, now=NOW)
    assert m.free_devices == 4 + 8 + 2
    assert m.fragmentation == pytest.approx(4 / 14)
    assert cluster_metrics(_snapshot(), {}, now=NOW).fragmentation == 0.0
    whole = _snapshot(*_exclusive("a", "h100-a", *range(8)))
    assert cluster_metrics(whole, {}, now=NOW).fragmentation == 0.0


def test_effective_utilisation_averages_fresh_samples_of_the_right_vendor() -> None:
    samples = _samples({("h100-a", 0): 0.9, ("h100-a", 1): 0.5, ("l40s", 3): 0.1})
    samples["h100-b"] = NodeSample("h100-b", "nvml", NOW - 120.0, (DeviceSample(0, Vendor.NVIDIA, utilisation=1.0),))
    # a CPU sampler on a GPU node (its library missing) does not count as the GPU's reading
    samples["l40s"] = NodeSample("l40s", "cpu", NOW - 1, (DeviceSample(0, Vendor.CPU, utilisation=1.0),
                                                           DeviceSample(3, Vendor.NVIDIA, utilisation=0.1)))
    m = cluster_metrics(_snapshot(), samples, now=NOW, stale_after_s=30.0)
    assert m.measured_devices == 3
    assert m.effective_utilisation == pytest.approx((0.9 + 0.5 + 0.1) / 3)


def test_queue_length_is_passed_through_and_empty_cluster_has_no_ratios() -> None:
    m = cluster_metrics(ClusterSnapshot(), {}, queue_length=3, now=NOW)
    assert m.queue_length == 3 and m.accelerators == 0
    assert m.allocated_utilisation is None and m.fragmentation is None


# ---- hints --------------------------------------------------------------------------------


def _job(job: str, devices: list[tuple[str, int]], tp: int | None) -> JobMetrics:
    return JobMetrics(job, NOW, devices=tuple(DeviceRef(n, d) for n, d in devices), tp=tp)


def test_tp_group_over_pcie_gets_a_hint_naming_the_link_and_the_remedy() -> None:
    snap = _snapshot(*_exclusive("pair", "l40s", 1, 2))  # GPUs 1 and 2 sit on different NUMA nodes
    hints = bottleneck_hints(snap, {"pair": _job("pair", [("l40s", 1), ("l40s", 2)], tp=2)}, {}, now=NOW)

    (hint,) = hints
    assert hint.kind == "slow-tp-link" and hint.job_id == "pair"
    link = snap.node("l40s").link(1, 2)
    assert link.label == "PCIe/SYS" and link.label in hint.message
    assert f"{link.bandwidth_gbps:g} GB/s" in hint.message
    assert "no L40S node has a fast-link island of 2" in hint.message
    assert "fast-link island of 8 devices of another model" in hint.message


def test_tp_group_across_nodes_is_limited_by_the_network() -> None:
    snap = _snapshot(*_exclusive("x", "h100-a", 0), *_exclusive("x", "h100-b", 0), inter_node_gbps=50.0)
    job = _job("x", [("h100-a", 0), ("h100-b", 0)], tp=2)
    (hint,) = bottleneck_hints(snap, {"x": job}, {}, now=NOW)
    assert "network between nodes" in hint.message and "~50 GB/s" in hint.message
    assert "fast-link island of 8: keep each group of 2" in hint.message


def test_tp_group_inside_an_nvswitch_island_and_dp_only_jobs_get_no_link_hint() -> None:
    snap = _snapshot(*_exclusive("fast", "h100-a", 0, 1, 2, 3), *_exclusive("dp", "l40s", 1, 2))
    jobs = {"fast": _job("fast", [("h100-a", i) for i in range(4)], tp=4),
            "dp": _job("dp", [("l40s", 1), ("l40s", 2)], tp=1)}
    assert bottleneck_hints(snap, jobs, {}, now=NOW) == []


def test_idle_devices_hint_uses_fresh_samples_only() -> None:
    snap = _snapshot(*_exclusive("j", "h100-a", 0, 1, 2, 3))
    busy = {("h100-a", 0): 0.8, ("h100-a", 1): 0.02, ("h100-a", 2): 0.0, ("h100-a", 3): 0.5}
    (hint,) = bottleneck_hints(snap, {}, _samples(busy), now=NOW)
    assert hint.kind == "idle-devices"
    assert "2 of 4 devices idle" in hint.message and "h100-a:1, h100-a:2" in hint.message
    assert bottleneck_hints(snap, {}, _samples(busy, age_s=300.0), now=NOW, stale_after_s=30.0) == []


def test_a_report_that_does_not_match_the_held_devices_is_not_trusted_for_tp_groups() -> None:
    # The job reported devices it no longer holds: its groups are unknown, so no link hint.
    snap = _snapshot(*_exclusive("j", "l40s", 0, 1))
    stale_report = _job("j", [("l40s", 1), ("l40s", 2)], tp=2)
    view = build_view(snap, {}, {"j": stale_report}, now=NOW)
    assert view.job_devices["j"] == (DeviceRef("l40s", 0), DeviceRef("l40s", 1))
    assert [h.kind for h in view.hints] == []  # though 0-1 over PCIe would get one (below)


def test_pcie_phb_pair_is_still_a_slow_tp_link() -> None:
    snap = _snapshot(*_exclusive("j", "l40s", 0, 1))
    (hint,) = bottleneck_hints(snap, {"j": _job("j", [("l40s", 0), ("l40s", 1)], tp=2)}, {}, now=NOW)
    assert "PCIe/PHB" in hint.message


# ---- job throughput -----------------------------------------------------------------------


def test_effective_throughput_is_achieved_over_the_catalog_peak_of_the_devices_held() -> None:
    nodes = {n.name: n for n in _snapshot().nodes}
    devices = [("h100-a", 0), ("h100-a", 1), ("l40s", 0)]
    record = job_metrics("mixed", samples_per_s=2000.0, flops_per_sample=3e11, devices=devices,
                         tp=1, nodes=nodes, timestamp=NOW)
    catalog = default_catalog()
    peak = 2 * catalog.lookup("H100").bf16_tflops + catalog.lookup("L40S").bf16_tflops
    assert record.achieved_tflops == pytest.approx(2000 * 3e11 / 1e12)
    assert record.peak_tflops == pytest.approx(peak)
    assert record.effective_ratio == pytest.approx(600 / peak)
    fp32 = job_metrics("mixed", devices=devices, nodes=nodes, precision="fp32")
    assert fp32.peak_tflops == pytest.approx(2 * catalog.lookup("H100").fp32_tflops + catalog.lookup("L40S").fp32_tflops)


def test_unknown_device_makes_the_peak_unknown_not_partial() -> None:
    nodes = {n.name: n for n in _snapshot().nodes}
    unknown = dataclasses.replace(nodes["l40s"], devices=tuple(
        dataclasses.replace(d, model=None, name="mystery accelerator") for d in nodes["l40s"].devices))
    nodes["l40s"] = unknown
    record = job_metrics("j", samples_per_s=1.0, flops_per_sample=1e12,
                         devices=[("h100-a", 0), ("l40s", 0)], nodes=nodes)
    assert record.achieved_tflops == pytest.approx(1.0)
    assert record.peak_tflops is None and record.effective_ratio is None


@pytest.mark.parametrize("kwargs", [
    {"samples_per_s": -1.0}, {"step_time_s": float("nan")}, {"flops_per_sample": float("inf")},
    {"tp": 0}, {"precision": "fp8"},
])
def test_bad_job_reports_are_input_errors(kwargs) -> None:
    with pytest.raises(InputError):
        job_metrics("j", devices=[("h100-a", 0)], nodes={n.name: n for n in _snapshot().nodes}, **kwargs)


def test_report_without_ray_returns_the_record() -> None:
    import ray

    assert not ray.is_initialized()
    record = report_job_metrics("offline", samples_per_s=5.0, step_time_s=0.2, flops_per_sample=2e12)
    assert record.achieved_tflops == pytest.approx(10.0) and record.step_time_s == 0.2
    assert JobMetrics.from_dict(record.to_dict()) == record
