"""The controller's CPU view from Ray's node and placement-group tables (dictionaries as Ray
2.60 returns them from ``ray.nodes()`` and ``placement_group_table()``), without Ray."""

from __future__ import annotations

from hetflow.accelerators.synthetic import synthetic_node
from hetflow.control.hosts import host_view
from hetflow.control.scheduler import CpuHold
from hetflow.core.topology import ClusterSnapshot

A_ID, HEAD_ID, GONE_ID = "a" * 56, "0123456789abcdef" + "0" * 40, "f" * 56
NODES = [
    {"NodeID": A_ID, "Alive": True, "Labels": {"hetflow.io/node": "a", "ray.io/node-id": A_ID},
     "Resources": {"CPU": 8.0, "memory": 32 * 2**30, "hetflow_dev_0": 65536.0}},
    {"NodeID": HEAD_ID, "Alive": True, "Labels": {"ray.io/node-id": HEAD_ID},
     "Resources": {"CPU": 2.0, "memory": 4 * 2**30}},
    {"NodeID": GONE_ID, "Alive": False, "Labels": {}, "Resources": {"CPU": 64.0}},
]
GROUPS = {
    "g1": {"name": "hetflow-train-3", "state": "CREATED", "bundles": {0: {"CPU": 1.0, "hetflow_dev_0": 65536.0}},
           "bundles_to_node_id": {0: A_ID}},
    "g2": {"name": "", "placement_group_id": "g2", "state": "CREATED", "bundles": {0: {"CPU": 2.0}, 1: {"memory": 5.0}},
           "bundles_to_node_id": {0: HEAD_ID, 1: HEAD_ID}},
    "g3": {"name": "hetflow-old-1", "state": "REMOVED", "bundles": {0: {"CPU": 4.0}}, "bundles_to_node_id": {0: A_ID}},
}


def test_every_alive_ray_node_brings_its_cpus_and_plain_ones_are_named_by_id() -> None:
    published = ClusterSnapshot(nodes=(synthetic_node("1x MI210", "a"),))
    view = host_view(published, NODES, GROUPS)
    assert [(n.name, n.cpu_cores, n.host_memory_bytes, len(n.accelerators)) for n in view.snapshot.nodes] == [
        ("a", 8, 32 * 2**30, 1), ("ray-0123456789ab", 2, 4 * 2**30, 0)]
    assert view.ray_ids == {"a": A_ID, "ray-0123456789ab": HEAD_ID}
    assert view.selector("ray-0123456789ab") == {"ray.io/node-id": HEAD_ID}
    # CPUs in groups that are not removed, by node; a bundle without CPUs holds none
    assert view.cpu_holds == (CpuHold("train-3", "a", 1.0), CpuHold("g2", "ray-0123456789ab", 2.0))


def test_a_cpu_only_cluster_is_a_cluster() -> None:
    view = host_view(ClusterSnapshot(nodes=()), NODES[1:], {})
    assert [n.name for n in view.snapshot.nodes] == ["ray-0123456789ab"] and view.cpu_holds == ()
