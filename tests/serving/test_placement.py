"""Replica groups from the planner: memory sharing, exclusive devices, CPU and Ray-GPU cases.

Pure: a synthetic 2x L40S (48 GB each) node; no Ray. test_serve_ray.py deploys such groups on
a local cluster with a fake accelerator node and checks what each replica sees.
"""

from __future__ import annotations

import math

import pytest

from hetflow.accelerators.catalog import default_catalog
from hetflow.accelerators.synthetic import synthetic_node
from hetflow.core.errors import Unschedulable
from hetflow.core.topology import ClusterSnapshot
from hetflow.core.units import parse_bytes
from hetflow.workloads.serve.config import serve_config_from_dict
from hetflow.workloads.serve.placement import plan_replica_groups, ray_gpu_share

GIB20 = parse_bytes("20GiB")


def entry(**fields):
    doc = {"name": "m", "train": {"model": {"kind": "mlp", "hidden": [16]}}, **fields}
    return serve_config_from_dict({"models": [doc]}).models[0]


@pytest.fixture(scope="module")
def snapshot() -> ClusterSnapshot:
    return ClusterSnapshot(nodes=(synthetic_node("2x L40S", "gpu-node"),))


def test_small_replicas_share_a_device_by_memory(snapshot) -> None:
    groups = plan_replica_groups("app", entry(replicas=3, devices={"memory": "20GiB"}), snapshot, 0, GIB20)
    assert [(g.device.node, g.device.device, g.num_replicas) for g in groups] == [
        ("gpu-node", 0, 2), ("gpu-node", 1, 1)]  # two 20 GiB replicas fit in 48 GB, not three
    first = groups[0].serve_options()
    assert first["name"] == "app.m-gpu-node-d0"
    assert first["placement_group_bundles"] == [{"hetflow_dev_0": 20480, "CPU": 1.0}]
    assert first["placement_group_bundle_label_selector"] == [{"hetflow.io/node": "gpu-node"}]
    actor = first["ray_actor_options"]
    assert actor["resources"] == {"hetflow_dev_0": 20480} and actor["num_gpus"] == 0
    assert actor["runtime_env"]["env_vars"]["CUDA_VISIBLE_DEVICES"] == "0"
    assert groups[1].ray_actor_options["runtime_env"]["env_vars"]["CUDA_VISIBLE_DEVICES"] == "1"
    assert groups[1].serve_options()["placement_group_bundles"][0] == {
        "hetflow_dev_1": 20480, "CPU": 1.0}


def test_exclusive_replicas_take_whole_devices(snapshot) -> None:
    groups = plan_replica_groups("app", entry(replicas=2, devices={"memory": "20GiB", "share": False}),
                                 snapshot, 0, GIB20)
    capacity = snapshot.node("gpu-node").device(0).memory_bytes // (1024 * 1024)
    assert [g.num_replicas for g in groups] == [1, 1]
    assert groups[0].ray_actor_options["resources"] == {"hetflow_dev_0": capacity}
    with pytest.raises(Unschedulable, match="replica 3 of 3 does not fit"):
        plan_replica_groups("app", entry(replicas=3, devices={"memory": "20GiB", "share": False}),
                            snapshot, 0, GIB20)


def test_autoscaling_groups_keep_one_replica_per_device(snapshot) -> None:
    groups = plan_replica_groups("app", entry(autoscaling={
        "min_replicas": 1, "max_replicas": 3}, devices={"memory": "20GiB"}), snapshot, 0, GIB20)
    bounds = [(g.autoscaling["min_replicas"], g.autoscaling["max_replicas"]) for g in groups]
    assert bounds == [(1, 2), (1, 1)]
    assert all(g.num_replicas is None and "num_replicas" not in g.serve_options()
               for g in groups)


def test_cpu_int8_and_plain_ray_gpus(snapshot) -> None:
    cpu = plan_replica_groups("app", entry(replicas=2, devices={"kind": "cpu"}), snapshot, 0, GIB20)
    assert len(cpu) == 1 and cpu[0].num_replicas == 2 and cpu[0].device is None
    assert cpu[0].ray_actor_options["runtime_env"]["env_vars"]["CUDA_VISIBLE_DEVICES"] == ""
    assert "placement_group_bundles" not in cpu[0].serve_options()
    int8 = plan_replica_groups("app", entry(precision="int8"), snapshot, 0, GIB20)
    assert int8[0].compute == "cpu"  # int8 is a CPU path even where GPUs exist
    empty = ClusterSnapshot(nodes=())
    ray_gpu = plan_replica_groups("app", entry(gpu_fraction=0.5, devices={"kind": "gpu"}), empty, 2, GIB20)
    assert ray_gpu[0].ray_actor_options["num_gpus"] == 0.5 and ray_gpu[0].compute == "gpu"
    auto = plan_replica_groups("app", entry(), empty, 0, GIB20)
    assert auto[0].compute == "cpu"
    with pytest.raises(Unschedulable, match="no hetflow GPU node"):
        plan_replica_groups("app", entry(devices={"kind": "gpu"}), empty, 0, GIB20)


def test_replicas_share_plain_ray_gpus_by_memory() -> None:
    """Ray's own GPUs (no hetflow node): the share comes from memory over the GPU's catalog
    memory (found on a lent H200: two 1 GiB replicas each asked a whole GPU and one never
    started); unknown GPU types, devices.share false or gpu_fraction keep their meaning."""
    one_gib = parse_bytes("1GiB")
    h200 = {"GPU": 1.0, "accelerator_type:H200": 1.0}
    share = ray_gpu_share(entry(replicas=2, devices={"kind": "gpu"}), one_gib, h200)
    assert 0 < share <= 0.01  # 1 GiB of 141 GB
    mixed = {"GPU": 2.0, "accelerator_type:H200": 1.0, "accelerator_type:A10": 1.0}
    a10 = default_catalog().lookup("A10").memory_bytes  # the smaller GPU decides
    assert ray_gpu_share(entry(devices={"kind": "gpu"}), parse_bytes("12GiB"), mixed) == math.ceil(100 * parse_bytes("12GiB") / a10) / 100
    assert ray_gpu_share(entry(devices={"kind": "gpu"}), parse_bytes("12GiB"), mixed) == 0.5  # not H200-sized (0.09)
    assert ray_gpu_share(entry(devices={"kind": "gpu"}), one_gib, {"GPU": 1.0, "accelerator_type:XYZ-9": 1.0}) == 1.0
    assert ray_gpu_share(entry(devices={"kind": "gpu"}), one_gib, {"GPU": 1.0}) == 1.0
    assert ray_gpu_share(entry(devices={"kind": "gpu", "share": False}), one_gib, h200) == 1.0
    assert ray_gpu_share(entry(gpu_fraction=0.3, devices={"kind": "gpu"}), one_gib, h200) == 0.3
    assert ray_gpu_share(entry(devices={"kind": "gpu"}), parse_bytes("500GiB"), h200) == 1.0


def test_more_whole_plain_ray_gpus_than_the_cluster_has_cannot_fit() -> None:
    empty = ClusterSnapshot(nodes=())
    with pytest.raises(Unschedulable, match="2 replicas x 1 GPU each do not fit in the cluster's 1 Ray GPUs"):
        plan_replica_groups("app", entry(replicas=2, devices={"kind": "gpu", "share": False}), empty, 1, GIB20)
    ok = plan_replica_groups("app", entry(replicas=2, gpu_fraction=0.5, devices={"kind": "gpu"}), empty, 1, GIB20)
    assert ok[0].num_replicas == 2 and ok[0].ray_actor_options["num_gpus"] == 0.5


def test_vendor_constraint_without_matching_devices_falls_back_to_cpu(snapshot) -> None:
    groups = plan_replica_groups("app", entry(devices={"kind": "auto", "vendor": "amd"}), snapshot, 0, GIB20)
    assert groups[0].compute == "cpu"


def test_more_cpus_than_the_whole_cluster_has_cannot_fit(snapshot, capsys) -> None:
    from hetflow.workloads.serve.plan import check_cpus, group_cpus

    config = serve_config_from_dict({"gateway": {"replicas": 2, "cpus": 0.5}, "models": [
        {"name": "a", "devices": "cpu", "replicas": 3, "cpus_per_replica": 1.5,
         "train": {"model": {"kind": "mlp", "hidden": [16]}}},
        {"name": "b", "devices": {"memory": "20GiB"}, "replicas": 3, "cpus_per_replica": 0.5,
         "train": {"model": {"kind": "mlp", "hidden": [16]}}},
        {"name": "s", "devices": "cpu", "cpus_per_replica": 2, "autoscaling": {"min_replicas": 2, "max_replicas": 9},
         "train": {"model": {"kind": "mlp", "hidden": [16]}}},
        {"name": "llm", "engine": "vllm", "vllm": {"model": "m"},
         "pools": [{"devices": "cpu", "replicas": 2, "cpus_per_replica": 1}]}]})
    groups = {m.name: plan_replica_groups("app", m, snapshot, 0, GIB20) for m in config.models[:3]}
    asks = {n: sum(group_cpus(g) for g in gs) for n, gs in groups.items()}
    assert asks == {"a": 4.5, "b": 1.5, "s": 4.0}  # b: placed groups, one CPU bundle per replica
    check_cpus(config, groups, 4.5 + 1.5 + 4.0 + 2.0 + 1.0)  # exactly the cluster: fits
    with pytest.raises(Unschedulable, match=r"^the replicas ask for 13 CPUs \(a 4.50, s 4, llm 2, b 1.50; "
                                            r"the gateway 1\) and the cluster has 12.90: lower replicas"):
        check_cpus(config, groups, 12.9)
    # a cluster that may grow (joined, not started here): one warning line, no refusal
    check_cpus(config, groups, 12.9, refuse=False)
    warned = capsys.readouterr().err
    assert warned.startswith("hetflow: warning: the replicas ask for 13 CPUs") and warned.count("\n") == 1
