"""``hetflow node start --ray-gpus``: one node shared by hetflow-placed work and plain Ray GPU
work, on a real local Ray cluster with a fake 8-GPU node.

The node is started the way `hetflow node start --ray-gpus 2` starts it (the same
``split_ray_gpus`` / ``ray_gpu_env`` / resources and labels): Ray's own GPU accounting holds
devices 6 and 7 (its raylet starts with ``CUDA_VISIBLE_DEVICES=6,7``), hetflow manages 0-5.
"""

from __future__ import annotations

import os

os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")

import pytest
import ray
from ray.cluster_utils import Cluster

from hetflow.accelerators.synthetic import synthetic_node
from hetflow.core.errors import InputError, Unschedulable
from hetflow.runtime.binding import publish_node, wait_removed
from hetflow.runtime.resources import node_labels, node_resources, ray_gpu_env, split_ray_gpus

pytestmark = pytest.mark.ray


@pytest.fixture(scope="module")
def shared_node():
    whole = synthetic_node("8x H100", "box")
    node, ray_devices = split_ray_gpus(whole, "2")
    cluster = Cluster(initialize_head=True, head_node_args={
        "num_cpus": 1, "node_ip_address": "127.0.0.1", "include_dashboard": False})
    saved = {k: os.environ.get(k) for k in ("CUDA_VISIBLE_DEVICES",)}
    try:
        os.environ.update(ray_gpu_env(whole, ray_devices))  # the raylet reads it when it starts
        cluster.add_node(num_cpus=2, num_gpus=len(ray_devices), resources=node_resources(node),
                         labels=node_labels(node))
        for k, v in saved.items():
            os.environ.pop(k, None) if v is None else os.environ.__setitem__(k, v)
        ray.init(address=cluster.address)
        publish_node(node)
        yield whole, node, ray_devices
    finally:
        for k, v in saved.items():
            os.environ.pop(k, None) if v is None else os.environ.__setitem__(k, v)
        if ray.is_initialized():
            ray.shutdown()
        cluster.shutdown()


@ray.remote(num_cpus=0)
class Seen:
    def visible(self) -> dict:
        return {"cuda": os.environ.get("CUDA_VISIBLE_DEVICES"), "gpu_ids": ray.get_gpu_ids()}


def test_the_split_leaves_no_device_in_both_sets(shared_node) -> None:
    whole, node, ray_devices = shared_node
    assert ray_devices == (6, 7)
    assert sorted(d.index for d in node.accelerators) == [0, 1, 2, 3, 4, 5]
    assert not {l.a for l in node.links} & set(ray_devices)
    assert set(node_resources(node)) == {f"hetflow_dev_{i}" for i in range(6)}
    with pytest.raises(InputError, match="at most 8"):
        split_ray_gpus(whole, "9")
    with pytest.raises(InputError, match="no accelerator 9"):
        split_ray_gpus(whole, "3,9")


def test_plain_ray_gpu_actors_beside_a_hetflow_placed_job(shared_node) -> None:
    import hetflow.placement as hp

    _, _, ray_devices = shared_node
    with hp.group(devices=6, cpus_per_rank=0, name="hetflow-job") as g:
        ranks = [Seen.options(**o).remote() for o in g.options]
        plain = [Seen.options(num_gpus=1).remote() for _ in ray_devices]
        got = ray.get([a.visible.remote() for a in ranks + plain], timeout=60)
        hetflow_seen = {int(s["cuda"]) for s in got[:6]}
        ray_seen = {int(s["cuda"]) for s in got[6:]}
        assert hetflow_seen == {0, 1, 2, 3, 4, 5}  # exactly the managed devices, one each
        assert ray_seen == set(ray_devices)  # Ray handed out only its own two
        assert all(s["gpu_ids"] == [] for s in got[:6])
        # a third plain GPU actor waits: Ray has no more GPUs there, hetflow's are not Ray's
        extra = Seen.options(num_gpus=1).remote()
        ready, _ = ray.wait([extra.visible.remote()], timeout=3)
        assert ready == []
        for a in ranks + plain + [extra]:
            ray.kill(a)
    assert wait_removed(g.pg)
    with pytest.raises(Unschedulable):
        hp.options(devices=7, cpus=0, name="too-many")  # hetflow manages six here
