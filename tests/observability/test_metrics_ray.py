"""hetflow's metrics on a real local multi-node Ray cluster, read the way Prometheus reads them.

Four nodes on this machine (ray.cluster_utils.Cluster): the head is a CPU node sampled for real
from /proc; an 8x H100 and a 2x RTX 5090 (PCIe, from recorded nvidia-smi output) are sampled
through the fake NVML, an 8x MI300X through the fake amdsmi, each fake describing what its GPUs
are doing (utilization, memory, power, link counters). Two jobs hold devices: a tp=2 job on the
RTX 5090 pair (a PCIe link) and a tp=4 job on four H100s (NVSwitch) whose GPUs sit at 3%.

The tests scrape every node's Prometheus endpoint over HTTP and parse it with
prometheus_client's parser, then run ``hetflow top --once``; expected values are computed here
from the fakes' settings and the catalog, not taken from hetflow's output.

    .venv/bin/python -m pytest -q tests/observability/test_metrics_ray.py
"""

from __future__ import annotations

import json
import os
import time
import urllib.request

os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")

import pytest
import ray
from prometheus_client.parser import text_string_to_metric_families
from ray.cluster_utils import Cluster

from hetflow.accelerators.catalog import default_catalog
from hetflow.accelerators.load import load_node
from hetflow.accelerators.synthetic import synthetic_node
from hetflow.cli import main as cli_main
from hetflow.core.request import ParallelLayout, PlacementRequest
from hetflow.runtime.binding import live_snapshot, publish_node, reserve
from hetflow.runtime.metrics import (
    METRIC_NAMES,
    METRIC_TYPES,
    PROMETHEUS_PREFIX,
    start_metrics,
    stop_metrics,
)
from hetflow.runtime.samplers import CpuSampler
from hetflow.runtime.resources import node_labels, node_resources
from hetflow.scheduling.planner import plan
from tests.conftest import fixture_path

pytestmark = pytest.mark.ray

GIB = 1 << 30
MIB = 1 << 20
# What the fake GPUs are doing.
H100_UTIL = 3  # percent, every GPU: a job holding them is "idle"
H100_USED = [i * GIB for i in range(8)]
H100_POWER_MW = [300_000 + 1000 * i for i in range(8)]
MI300X_ACTIVITY = [40 + 5 * i for i in range(8)]
MI300X_USED = [(10 + i) * GIB for i in range(8)]
MI300X_POWER_W = 650
RTX_UTIL = 95
RTX_USED = [20 * GIB, 21 * GIB]
RTX_TOTAL_MIB = 32607  # fake_pynvml.pcie_pair_box (nvidia-smi's figure for the RTX 5090)
RTX_PCIE_TX = [3 * 10**12 + 17, 5 * 10**9]  # cumulative PCIe bytes the driver reports
RTX_PCIE_RX = [7 * 10**11 + 3, 11 * 10**9]
TP2_SAMPLES_PER_S = 120.0
TP2_FLOPS_PER_SAMPLE = 1.0e12
INTERVAL_S = 1.0


def fake_sampler(node: str):
    """Runs inside each node's agent process: the fake library describing that node's GPUs."""
    from hetflow.runtime.samplers import AmdSmiSampler, NvmlSampler
    from tests.accelerators.fakes import fake_amdsmi, fake_pynvml

    if node == "h100":
        box = fake_pynvml.h100_nvswitch_box()
        for i, gpu in enumerate(box.gpus):
            gpu.utilization_gpu, gpu.memory_used, gpu.power_mw = H100_UTIL, H100_USED[i], H100_POWER_MW[i]
            gpu.nvlink_tx_kib, gpu.nvlink_rx_kib = [0] * 18, [0] * 18
            gpu.nvlink_kib_per_query = 4096
        return NvmlSampler.open(fake_pynvml.install(box))
    if node == "rtx5090":
        box = fake_pynvml.pcie_pair_box()
        for i, gpu in enumerate(box.gpus):
            gpu.utilization_gpu, gpu.memory_used = RTX_UTIL, RTX_USED[i]
            gpu.pcie_tx_bytes, gpu.pcie_rx_bytes = RTX_PCIE_TX[i], RTX_PCIE_RX[i]
        return NvmlSampler.open(fake_pynvml.install(box))
    if node == "mi300x":
        box = fake_amdsmi.mi300x_xgmi_box()
        for i, proc in enumerate(box.processors):
            proc.gfx_activity, proc.vram_used, proc.socket_power_w = MI300X_ACTIVITY[i], MI300X_USED[i], MI300X_POWER_W
        return AmdSmiSampler.open(fake_amdsmi.install(box))
    return CpuSampler()


@ray.remote(num_cpus=0)
class RankZero:
    """A job's rank 0, which reports the job's metrics as a workload would."""

    def report(self, job: str, placement, samples_per_s: float, flops_per_sample: float) -> dict:
        from hetflow.runtime.metrics import report_job_metrics

        return report_job_metrics(job, samples_per_s=samples_per_s, step_time_s=0.25,
                                  flops_per_sample=flops_per_sample, placement=placement).to_dict()


def _nodes():
    return [
        synthetic_node("cpu", "cpu0"),
        synthetic_node("8x H100", "h100"),
        synthetic_node("8x MI300X", "mi300x"),
        load_node([fixture_path("nvidia-rtx5090x2-pcie-phb_nvidia-smi-topo-m.txt")],
                  name="rtx5090", model="RTX 5090"),
    ]


@pytest.fixture(scope="module")
def cluster():
    head, *workers = _nodes()
    c = Cluster(initialize_head=True, head_node_args={
        "num_cpus": 1, "node_ip_address": "127.0.0.1", "include_dashboard": False,
        "resources": node_resources(head), "labels": node_labels(head),
        "_system_config": {"metrics_report_interval_ms": 500},
    })
    for node in workers:
        c.add_node(num_cpus=1, num_gpus=0, resources=node_resources(node), labels=node_labels(node))
    ray.init(address=c.address)
    bound, ranks = [], []
    try:
        for node in (head, *workers):
            publish_node(node)
        start_metrics(interval_s=INTERVAL_S, sampler_factory=fake_sampler)
        requests = [
            (PlacementRequest("tp2-pcie", layout=ParallelLayout(tp=2), model="RTX 5090"), TP2_SAMPLES_PER_S),
            (PlacementRequest("h100-idle", layout=ParallelLayout(tp=4), model="H100"), 10.0),
        ]
        placements = {}
        for request, rate in requests:
            snap = live_snapshot()
            placement = plan(snap, request)
            bound.append(reserve(placement, snap, timeout_s=60))
            rank = RankZero.options(**bound[-1].actor_options(0)).remote()
            ranks.append(rank)
            ray.get(rank.report.remote(request.job_id, placement, rate, TP2_FLOPS_PER_SAMPLE), timeout=60)
            placements[request.job_id] = placement
        yield {"nodes": {n.name: n for n in (head, *workers)}, "placements": placements}
    finally:
        for rank in ranks:
            ray.kill(rank)
        for b in bound:
            b.release()
        stop_metrics()
        ray.shutdown()
        c.shutdown()


FAMILY_TYPES: dict[str, str] = {}  # every ray_hetflow_* family seen: exposed name -> type


def _scrape_all() -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """Every ``ray_hetflow_*`` sample on every node's endpoint: (name, hetflow tags) -> value.
    Records each family's type (as the parser read the ``# TYPE`` lines) in FAMILY_TYPES."""
    out = {}
    keep = {"node", "device", "vendor", "model", "fabric", "direction", "job_id"}
    for info in ray.nodes():
        if not info["Alive"]:
            continue
        url = f"http://127.0.0.1:{info['MetricsExportPort']}/metrics"
        text = urllib.request.urlopen(url, timeout=10).read().decode()
        for family in text_string_to_metric_families(text):
            if family.name.startswith("ray_hetflow_"):
                exposed = family.name + ("_total" if family.type == "counter" else "")
                FAMILY_TYPES[exposed] = family.type
            for s in family.samples:
                if s.name.startswith("ray_hetflow_"):
                    tags = tuple(sorted((k, v) for k, v in s.labels.items() if k in keep))
                    out[(s.name, tags)] = s.value
    return out


def _scrape_until(wanted: list[tuple[str, dict[str, str]]], timeout_s: float = 45.0):
    """Scrape until every wanted (name, tags) series is there (Ray exports every 0.5 s here)."""
    deadline = time.monotonic() + timeout_s
    while True:
        series = _scrape_all()
        missing = [w for w in wanted if _get(series, *w) is None]
        if not missing or time.monotonic() > deadline:
            return series, missing
        time.sleep(1.0)


def _get(series, name: str, tags: dict[str, str]) -> float | None:
    """The value of the series whose tags include ``tags``."""
    for (n, t), v in series.items():
        if n == name and set(tags.items()) <= set(t):
            return v
    return None


def _meminfo_total() -> int:
    for line in open("/proc/meminfo"):
        if line.startswith("MemTotal:"):
            return int(line.split()[1]) * 1024
    raise AssertionError("no MemTotal in /proc/meminfo")


def test_prometheus_endpoint_carries_device_series(cluster) -> None:
    wanted = [
        ("ray_hetflow_device_utilization_ratio", {"node": "h100", "device": "7"}),
        ("ray_hetflow_device_utilization_ratio", {"node": "mi300x", "device": "7"}),
        ("ray_hetflow_device_utilization_ratio", {"node": "rtx5090", "device": "1"}),
        ("ray_hetflow_device_utilization_ratio", {"node": "cpu0", "device": "0"}),
        ("ray_hetflow_device_link_bytes_total", {"node": "h100", "device": "0", "direction": "tx"}),
        ("ray_hetflow_device_link_bytes_total", {"node": "rtx5090", "device": "0", "direction": "rx"}),
    ]
    series, missing = _scrape_until(wanted)
    assert not missing, f"series never appeared: {missing}"

    for i in range(8):
        h100 = {"node": "h100", "device": str(i)}
        assert _get(series, "ray_hetflow_device_utilization_ratio", h100) == pytest.approx(H100_UTIL / 100)
        assert _get(series, "ray_hetflow_device_memory_used_bytes", h100) == H100_USED[i]
        assert _get(series, "ray_hetflow_device_power_watts", h100) == pytest.approx(H100_POWER_MW[i] / 1000)
        mi = {"node": "mi300x", "device": str(i), "vendor": "amd", "model": "MI300X"}
        assert _get(series, "ray_hetflow_device_utilization_ratio", mi) == pytest.approx(MI300X_ACTIVITY[i] / 100)
        assert _get(series, "ray_hetflow_device_memory_used_bytes", mi) == MI300X_USED[i]
        assert _get(series, "ray_hetflow_device_memory_capacity_bytes", mi) == 192 * GIB
        assert _get(series, "ray_hetflow_device_power_watts", mi) == MI300X_POWER_W
    # Link traffic is a counter fed from the vendor's cumulative counters. The RTX 5090s'
    # PCIe counters stand still, so the exported counter is exactly the driver's; the
    # MI300Xs, without link counters here, export no link series at all.
    for i in range(2):
        for direction, value in (("tx", RTX_PCIE_TX[i]), ("rx", RTX_PCIE_RX[i])):
            rtx_link = {"node": "rtx5090", "device": str(i), "fabric": "pcie", "direction": direction}
            assert _get(series, "ray_hetflow_device_link_bytes_total", rtx_link) == value
    assert _get(series, "ray_hetflow_device_link_bytes_total", {"node": "rtx5090", "fabric": "nvlink"}) is None
    assert _get(series, "ray_hetflow_device_link_bytes_total", {"node": "mi300x"}) is None
    assert _get(series, "ray_hetflow_device_power_watts", {"node": "rtx5090"}) is None  # NotSupported
    # The H100s' NVLink counters grow by 4096 KiB per link and query: the counter grows
    # between scrapes, in whole KiB, from at least one query's traffic over 18 links.
    h100_rx = {"node": "h100", "device": "0", "fabric": "nvlink", "direction": "rx"}
    first = _get(series, "ray_hetflow_device_link_bytes_total", h100_rx)
    assert first >= 18 * 4096 * 1024 and first % 1024 == 0
    deadline = time.monotonic() + 20
    while (later := _get(_scrape_all(), "ray_hetflow_device_link_bytes_total", h100_rx)) <= first:
        assert time.monotonic() < deadline, f"the NVLink counter stayed at {first}"
        time.sleep(1.0)
    assert later % 1024 == 0
    rtx = {"node": "rtx5090", "device": "0", "vendor": "nvidia", "model": "RTX-5090"}
    assert _get(series, "ray_hetflow_device_memory_capacity_bytes", rtx) == RTX_TOTAL_MIB * MIB
    # The CPU head node is sampled for real.
    cpu = {"node": "cpu0", "device": "0", "vendor": "cpu"}
    assert 0.0 <= _get(series, "ray_hetflow_device_utilization_ratio", cpu) <= 1.0
    assert _get(series, "ray_hetflow_device_memory_capacity_bytes", cpu) == _meminfo_total()


def test_prometheus_endpoint_carries_job_and_cluster_series(cluster) -> None:
    wanted = [
        ("ray_hetflow_job_samples_per_second", {"job_id": "tp2-pcie"}),
        ("ray_hetflow_job_devices_held", {"job_id": "h100-idle"}),
        ("ray_hetflow_cluster_allocated_utilization_ratio", {}),
    ]
    series, missing = _scrape_until(wanted)
    assert not missing, f"series never appeared: {missing}"

    rtx_peak = default_catalog().lookup("RTX 5090").bf16_tflops
    achieved = TP2_SAMPLES_PER_S * TP2_FLOPS_PER_SAMPLE / 1e12
    job = {"job_id": "tp2-pcie"}
    assert _get(series, "ray_hetflow_job_samples_per_second", job) == TP2_SAMPLES_PER_S
    assert _get(series, "ray_hetflow_job_achieved_flops", job) == pytest.approx(achieved * 1e12)
    assert _get(series, "ray_hetflow_job_peak_flops", job) == pytest.approx(2 * rtx_peak * 1e12)
    assert _get(series, "ray_hetflow_job_step_duration_seconds", job) == 0.25
    assert _get(series, "ray_hetflow_job_effective_throughput_ratio", job) == pytest.approx(achieved / (2 * rtx_peak))
    assert _get(series, "ray_hetflow_job_devices_held", job) == 2
    assert _get(series, "ray_hetflow_job_devices_held", {"job_id": "h100-idle"}) == 4
    # 8 H100 + 8 MI300X + 2 RTX 5090 accelerators; 2 + 4 held. The free H100s share an NVSwitch
    # island with held ones (4 stranded); the MI300X island is untouched; no RTX is free.
    assert _get(series, "ray_hetflow_cluster_accelerators", {}) == 18
    assert _get(series, "ray_hetflow_cluster_devices_held", {}) == 6
    assert _get(series, "ray_hetflow_cluster_allocated_utilization_ratio", {}) == pytest.approx(6 / 18)
    assert _get(series, "ray_hetflow_cluster_free_devices", {}) == 12
    assert _get(series, "ray_hetflow_cluster_fragmentation_ratio", {}) == pytest.approx(4 / 12)
    assert _get(series, "ray_hetflow_cluster_queue_length", {}) == 0
    busy = (8 * H100_UTIL + sum(MI300X_ACTIVITY) + 2 * RTX_UTIL) / 100 / 18
    assert _get(series, "ray_hetflow_cluster_effective_utilization_ratio", {}) == pytest.approx(busy)


def test_every_exported_family_has_its_name_and_type(cluster) -> None:
    """After the two tests above, every hetflow metric was on an endpoint: each family's
    exposed name and ``# TYPE`` as prometheus_client's parser reads them."""
    wanted = [(name, {}) for name in (PROMETHEUS_PREFIX + n for n in METRIC_NAMES)]
    _, missing = _scrape_until(wanted)
    assert not missing, f"never exported: {missing}"
    assert FAMILY_TYPES == {PROMETHEUS_PREFIX + n: t for n, t in METRIC_TYPES.items()}


def _top_once(capsys, monkeypatch, *extra: str) -> str:
    if "top" not in cli_main.COMMAND_MODULES:  # until the lead registers the verb
        monkeypatch.setattr(cli_main, "COMMAND_MODULES", [*cli_main.COMMAND_MODULES, "top"])
    monkeypatch.setenv("COLUMNS", "250")
    code = cli_main.main(["top", "--once", "--interval", str(INTERVAL_S), *extra])
    out, err = capsys.readouterr()
    assert code == 0, err
    return out


def _line(out: str, *words: str) -> str:
    lines = [l for l in out.splitlines() if all(w in l.split() for w in words)]
    assert len(lines) == 1, f"expected one line with {words}, got {lines}\n{out}"
    return lines[0]


def test_top_once_shows_devices_jobs_and_hints(cluster, capsys, monkeypatch) -> None:
    out = _top_once(capsys, monkeypatch)
    placements = cluster["placements"]

    # Device rows: measured values as the fakes set them (utilisation %, used/total GiB).
    rtx = placements["tp2-pcie"].devices
    for ref in rtx:
        row = _line(out, "rtx5090", str(ref.device), "RTX-5090")
        assert f"{RTX_UTIL}%" in row.split()
        assert f"{RTX_USED[ref.device] / GIB:.1f}/{RTX_TOTAL_MIB * MIB / GIB:.1f}" in row.split()
        assert "tp2-pcie" in row.split()
    for i in range(8):
        row = _line(out, "mi300x", str(i), "MI300X")
        assert f"{MI300X_ACTIVITY[i]}%" in row.split() and str(MI300X_POWER_W) in row.split()
    held = {r.device for r in placements["h100-idle"].devices}
    for i in range(8):
        row = _line(out, "h100", str(i), "H100-SXM")
        assert ("h100-idle" in row.split()) == (i in held)

    # Job rows: devices held and the effective throughput against the catalog peak.
    rtx_peak = default_catalog().lookup("RTX 5090").bf16_tflops
    ratio = TP2_SAMPLES_PER_S * TP2_FLOPS_PER_SAMPLE / 1e12 / (2 * rtx_peak)
    job = _line(out, "tp2-pcie", "2")
    assert f"{ratio:.1%}" in job.split()
    assert f"{TP2_SAMPLES_PER_S:,.1f}" in job.split()

    # Hints: the tp=2 group crosses the PCIe link; the H100 job's GPUs are idle; the H100 job's
    # tp=4 group is inside the NVSwitch island, so it gets no link hint.
    hints = [l for l in out.splitlines() if l.startswith("hint:")]
    assert any("tp2-pcie" in h and "PCIe" in h and "tensor-parallel" in h for h in hints), hints
    assert any("h100-idle" in h and "4 of 4 devices idle" in h for h in hints), hints
    assert not any("h100-idle" in h and "tensor-parallel" in h for h in hints), hints
    assert not any("tp2-pcie" in h and "idle" in h for h in hints), hints
    assert "18 accelerators" in out and "(33% allocated)" in out


def test_top_once_json_matches_the_cluster(cluster, capsys, monkeypatch) -> None:
    data = json.loads(_top_once(capsys, monkeypatch, "--json"))
    assert data["cluster"]["accelerators"] == 18
    assert data["cluster"]["devices_held"] == 6
    jobs = {j["job"]: j for j in data["jobs"]}
    assert set(jobs) == {"tp2-pcie", "h100-idle"}
    assert jobs["h100-idle"]["devices"] == 4
    assert jobs["tp2-pcie"]["peak_tflops"] == pytest.approx(2 * default_catalog().lookup("RTX 5090").bf16_tflops)
    rows = {(d["node"], d["device"]): d for d in data["devices"]}
    assert len([k for k in rows if k[0] in ("h100", "mi300x", "rtx5090")]) == 18
    assert rows[("mi300x", 3)]["memory_used_bytes"] == MI300X_USED[3]
    assert rows[("cpu0", 0)]["memory_total_bytes"] == _meminfo_total()
    assert {h["kind"] for h in data["hints"]} == {"slow-tp-link", "idle-devices"}


def test_top_reads_without_starting_agents_and_stop_agents_removes_them(cluster, capsys, monkeypatch) -> None:
    from ray.util import list_named_actors

    def hetflow_actors() -> set[str]:
        return {a["name"] for a in list_named_actors(all_namespaces=True) if a["namespace"] == "hetflow"}

    before = hetflow_actors()
    assert len([n for n in before if n.startswith("hetflow-metrics-")]) == len(cluster["nodes"])
    assert "hetflow-cluster-metrics" in before
    data = json.loads(_top_once(capsys, monkeypatch, "--json", "--no-start"))
    assert len(data["devices"]) == 1 + 8 + 8 + 2
    assert hetflow_actors() == before
    _top_once(capsys, monkeypatch, "--stop-agents")
    deadline = time.monotonic() + 30
    while hetflow_actors() and time.monotonic() < deadline:
        time.sleep(0.5)
    assert hetflow_actors() == set()
    start_metrics(interval_s=INTERVAL_S, sampler_factory=fake_sampler)  # back for the next test


def test_k8s_publish_waits_for_its_node_then_publishes_the_description(cluster, tmp_path, capsys) -> None:
    """What a KubeRay worker pod runs in the background (``hetflow k8s publish``)."""
    import dataclasses

    from hetflow.cli import k8s
    from hetflow.core.serialize import node_to_dict
    from hetflow.runtime.binding import published_nodes

    original = cluster["nodes"]["cpu0"]
    changed = dataclasses.replace(original, name="template", cpu_cores=123)
    node_file = tmp_path / "cpu.json"
    node_file.write_text(json.dumps(node_to_dict(changed)))
    try:
        assert k8s._main(["publish", "--from", str(node_file), "--name", "cpu0", "--timeout", "30"]) == 0
        assert published_nodes()["cpu0"].cpu_cores == 123
        assert ray.is_initialized()  # it used this process's connection and left it open
        # a pod whose raylet never carries its label gives up with a message, not a hang
        assert k8s._main(["publish", "--from", str(node_file), "--name", "no-such-pod", "--timeout", "0"]) == 1
        assert "no Ray node labelled hetflow.io/node=no-such-pod" in capsys.readouterr().err
        assert "no-such-pod" not in published_nodes()
    finally:
        publish_node(original)
