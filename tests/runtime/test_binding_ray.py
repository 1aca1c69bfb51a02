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
from tests.net import free_port
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


# --- hetflow.placement: the planner's devices for the user's own Ray code ------------------


@ray.remote(num_cpus=0)
def _bound_visibility() -> dict:
    """A task as a Tune trial or any process holding planned devices would run: bind first."""
    import hetflow.placement as hp

    where = hp.bind()
    return {"where": where, "env": os.environ.get("CUDA_VISIBLE_DEVICES")}


def _no_live_group(name: str) -> bool:
    return not [g for g in placement_group_table().values()
                if g["name"] == f"hetflow-{name}" and g["state"] != "REMOVED"]


def test_placement_options_put_a_users_actor_on_the_planned_device(cluster) -> None:
    import hetflow.placement as hp

    opts = hp.options(devices=1, model="L40S", cpus=0, name="user-actor")
    actor = Rank.options(**opts).remote()
    try:
        seen = ray.get(actor.visible.remote(), timeout=60)
    finally:
        ray.kill(actor)
    assert seen["node"] == "pcie4"
    assert seen["env"]["CUDA_VISIBLE_DEVICES"] in {"0", "1", "2", "3"}
    assert seen["gpu_ids"] == []
    hp.release(opts)
    hp.release(opts)  # twice is fine
    assert wait_removed(opts["scheduling_strategy"].placement_group)


def test_placement_group_gives_each_rank_its_planned_device_and_releases_on_exit(cluster) -> None:
    import hetflow.placement as hp

    with hp.group(devices=2, model="L40S", cpus_per_rank=0, name="user-gang") as g:
        pg, options = g
        assert pg is g.pg and len(options) == 2
        planned = [r.device for r in g.placement.devices]
        actors = [Rank.options(**o).remote() for o in options]
        try:
            seen = ray.get([a.visible.remote() for a in actors], timeout=60)
        finally:
            for a in actors:
                ray.kill(a)
        node = live_snapshot().node("pcie4")
        assert node.device(planned[0]).numa_node == node.device(planned[1]).numa_node
        assert [s["env"]["CUDA_VISIBLE_DEVICES"] for s in seen] == [str(d) for d in planned]
        assert "bottleneck" in g.explain()
    assert wait_removed(pg)


def test_placement_options_give_one_process_several_devices_on_one_node(cluster) -> None:
    import hetflow.placement as hp

    opts = hp.options(devices=4, vendor="amd", cpus=0, name="engine")
    try:
        seen = ray.get(Rank.options(**opts).remote().visible.remote(), timeout=60)
        held = live_snapshot().allocations
    finally:
        hp.release(opts)
    devices = seen["env"]["HIP_VISIBLE_DEVICES"].split(",")
    assert seen["node"] == "mi300x" and len(devices) == 4
    assert seen["env"]["CUDA_VISIBLE_DEVICES"] == seen["env"]["HIP_VISIBLE_DEVICES"]
    assert sorted(int(d) for d in devices) == sorted(a.device for a in held if a.job_id == "engine")
    assert wait_removed(opts["scheduling_strategy"].placement_group)


def test_placement_that_cannot_fit_is_refused_at_once(cluster) -> None:
    import hetflow.placement as hp

    with pytest.raises(Unschedulable, match="cannot place"):
        hp.options(devices=9, vendor="amd", cpus=0, name="too-big")
    with pytest.raises(Unschedulable, match="cannot mix vendors"):
        hp.group(devices=16, cpus_per_rank=0, name="both-vendors")  # 8 AMD + 8+4 NVIDIA
    assert _no_live_group("too-big") and _no_live_group("both-vendors")


def _trial(config: dict) -> None:
    import hetflow.placement as hp
    from ray import tune

    where = hp.bind()  # first thing, before anything touches a GPU
    tune.report({"where": where, "env": os.environ.get("CUDA_VISIBLE_DEVICES")})


def test_tune_resources_and_bind_give_a_trial_its_planned_device(cluster, tmp_path) -> None:
    from ray import tune

    import hetflow.placement as hp

    factory = hp.tune_resources(devices=1, model="H100", cpus=0, name="trial")
    (resource,) = [k for k in factory.bundles[0] if k.startswith("hetflow_dev_")]
    tuner = tune.Tuner(tune.with_resources(_trial, factory),
                       run_config=tune.RunConfig(storage_path=str(tmp_path), name="placed", verbose=0))
    (result,) = list(tuner.fit())
    device = resource.removeprefix("hetflow_dev_")
    assert result.error is None
    assert (result.metrics["where"], result.metrics["env"]) == (f"h100:{device}", device)


def test_serve_options_put_a_deployment_replica_on_the_planned_device(cluster) -> None:
    from ray import serve

    import hetflow.placement as hp

    opts = hp.serve_options(devices=1, vendor="amd", cpus=0, name="replica")
    device = opts["ray_actor_options"]["runtime_env"]["env_vars"]["HIP_VISIBLE_DEVICES"]

    @serve.deployment
    class Where:
        def __call__(self) -> dict:
            return {"hip": os.environ.get("HIP_VISIBLE_DEVICES"),
                    "node": ray.get_runtime_context().get_node_labels().get("hetflow.io/node")}

    port = free_port()
    serve.start(http_options={"host": "127.0.0.1", "port": port})
    try:
        handle = serve.run(Where.options(**opts).bind(), name="where", route_prefix=None)
        got = handle.remote().result(timeout_s=60)
    finally:
        serve.shutdown()
    assert got == {"hip": device, "node": "mi300x"}
