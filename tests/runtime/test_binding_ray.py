"""Placements bound exactly to devices on a real local multi-node Ray cluster.

Nodes declare accelerators they do not have (ray.cluster_utils.Cluster): an 8x MI300X and an
8x H100 from recorded tool output, and a 4-GPU PCIe node split over two NUMA nodes from the
catalog. Each rank's actor reports the visibility variables it was started with; they must name
exactly the planned device, on AMD and NVIDIA nodes alike.
"""

from __future__ import annotations

import os

os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")

import pytest
import ray
from ray.util import placement_group_table

from hetflow.accelerators.load import load_node
from hetflow.accelerators.synthetic import synthetic_node
from hetflow.core.errors import Unschedulable
from hetflow.core.request import ParallelLayout, PlacementRequest
from hetflow.core.topology import Vendor
from hetflow.core.units import parse_bytes
from hetflow.runtime.binding import live_snapshot, reserve, wait_removed
from hetflow.scheduling.planner import plan
from tests.conftest import fixture_path
from tests.ray_cluster import hetflow_cluster

pytestmark = pytest.mark.ray


def _nodes():
    mi300x = load_node([fixture_path("amd-mi300x-oam8_amd-smi-topology.txt")], name="mi300x", model="MI300X")
    h100 = load_node(
        [fixture_path("nvidia-h100-sxm5x8-nvswitch-2numa_nvidia-smi-topo-m.txt"),
         fixture_path("nvidia-h100-sxm5x8_nvidia-smi-q.txt")],
        name="h100",
    )
    pcie = synthetic_node("4x L40S", "pcie4")
    return [mi300x, h100, pcie]


@pytest.fixture(scope="module")
def cluster():
    nodes = _nodes()
    with hetflow_cluster(nodes, head_cpus=1):
        yield nodes


@ray.remote(num_cpus=0)
class Rank:
    def visible(self) -> dict:
        keys = ("CUDA_VISIBLE_DEVICES", "HIP_VISIBLE_DEVICES")
        labels = ray.get_runtime_context().get_node_labels() if hasattr(
            ray.get_runtime_context(), "get_node_labels") else {}
        return {"env": {k: os.environ.get(k) for k in keys},
                "node": labels.get("hetflow.io/node"), "gpu_ids": ray.get_gpu_ids()}


def _run_ranks(bound) -> list[dict]:
    actors = [Rank.options(**bound.actor_options(r)).remote()
              for r in range(bound.placement.world_size)]
    try:
        return ray.get([a.visible.remote() for a in actors], timeout=120)
    finally:
        for a in actors:
            ray.kill(a)


def test_live_snapshot_shows_published_nodes_free(cluster) -> None:
    snap = live_snapshot()
    assert sorted(n.name for n in snap.nodes) == ["h100", "mi300x", "pcie4"]
    assert snap.allocations == ()
    assert snap.node("mi300x").device(0).memory_bytes == parse_bytes("192GiB")


@pytest.mark.parametrize(
    "request_, vendor",
    [
        (PlacementRequest("amd-tp4-pp2", layout=ParallelLayout(pp=2, tp=4), vendor=Vendor.AMD), Vendor.AMD),
        (PlacementRequest("nv-tp2-dp2", layout=ParallelLayout(dp=2, tp=2), vendor=Vendor.NVIDIA), Vendor.NVIDIA),
        (PlacementRequest("pcie-tp2", count=2, model="L40S"), Vendor.NVIDIA),
    ],
    ids=["mi300x-tp4-pp2", "h100-tp2-dp2", "l40s-tp2"],
)
def test_each_rank_sees_exactly_its_planned_device(cluster, request_, vendor) -> None:
    snap = live_snapshot()
    placement = plan(snap, request_)
    with reserve(placement, snap, timeout_s=60) as bound:
        seen = _run_ranks(bound)
    assert len(seen) == placement.world_size
    for rank, (ref, got) in enumerate(zip(placement.devices, seen)):
        assert got["node"] == ref.node, f"rank {rank} ran on {got['node']}, planned {ref.node}"
        assert got["env"]["CUDA_VISIBLE_DEVICES"] == str(ref.device)
        if vendor is Vendor.AMD:
            assert got["env"]["HIP_VISIBLE_DEVICES"] == str(ref.device)
        assert got["gpu_ids"] == []  # Ray itself handed out no GPU
    assert wait_removed(bound.group)


def test_pcie_pair_stays_on_one_numa_node(cluster) -> None:
    snap = live_snapshot()
    p = plan(snap, PlacementRequest("pair", count=2, model="L40S"))
    node = snap.node("pcie4")
    a, b = (r.device for r in p.devices)
    assert node.device(a).numa_node == node.device(b).numa_node


def test_held_device_is_not_handed_out_again(cluster) -> None:
    snap = live_snapshot()
    first = plan(snap, PlacementRequest("holder", count=8, vendor=Vendor.AMD))
    with reserve(first, snap, timeout_s=60) as held:
        # the live snapshot now shows the 8 devices in use, and the planner refuses
        now = live_snapshot()
        busy = {(a.node, a.device) for a in now.allocations}
        assert {a.job_id for a in now.allocations} == {"holder"}
        assert busy == {(r.node, r.device) for r in first.devices}
        with pytest.raises(Unschedulable):
            plan(now, PlacementRequest("late", count=1, vendor=Vendor.AMD))
        # a stale snapshot's plan for the same device is refused by Ray, and rolled back
        stale = plan(snap, PlacementRequest("stale", count=1, vendor=Vendor.AMD))
        with pytest.raises(Unschedulable, match="did not commit"):
            reserve(stale, snap, timeout_s=3)
        leftovers = [g for g in placement_group_table().values()
                     if g["name"] == "hetflow-stale" and g["state"] != "REMOVED"]
        assert leftovers == []
        # a plain Ray GPU task is never scheduled on a hetflow node (Ray sees no GPUs there)
        plain = ray.remote(num_gpus=1)(lambda: os.environ.get("CUDA_VISIBLE_DEVICES"))
        ref = plain.remote()
        ready, _ = ray.wait([ref], timeout=3)
        assert ready == []
        ray.cancel(ref, force=True)
    assert wait_removed(held.group)


def test_shared_replicas_by_memory(cluster) -> None:
    snap = live_snapshot()
    twenty = parse_bytes("20GB")
    req = lambda j, excl: PlacementRequest(j, count=1, model="H100", memory_bytes=twenty, exclusive=excl)
    a = plan(snap, req("rep-a", False))
    with reserve(a, snap, timeout_s=60):
        snap2 = live_snapshot()
        b = plan(snap2, req("rep-b", False))
        assert b.devices == a.devices  # packs onto the partly used device
        with reserve(b, snap2, timeout_s=60):
            pass
        c = plan(snap2, req("rep-c", True))
        assert c.devices != a.devices  # an exclusive job does not share


def test_resources_restored_after_jobs(cluster) -> None:
    import time

    deadline = time.monotonic() + 15
    while time.monotonic() < deadline and live_snapshot().allocations:
        time.sleep(0.2)
    assert live_snapshot().allocations == ()
    assert all(g["state"] == "REMOVED" for g in placement_group_table().values())
