"""Trial placement: a planner request -> Ray Tune trial resources, without a cluster.

CPU trials get a plain CPU bundle. On (fake) GPU nodes the planner picks the device; a trial
with a memory size takes that share of the device's ``hetflow_dev_<i>`` resource (MiB), so
several trials share one device, and the bundle is pinned to the node by a label selector.
"""

from __future__ import annotations

import pytest
from ray.tune import PlacementGroupFactory

from hetflow.accelerators.synthetic import synthetic_node
from hetflow.core.errors import Unschedulable
from hetflow.core.topology import Allocation, ClusterSnapshot, Vendor
from hetflow.workloads.tune.placement import (
    _LEDGERS,
    SlotAssigner,
    cpu_slot,
    distinct_slots,
    plan_trial_slots,
    trial_request,
    trial_resources,
)

GiB = 2**30
L40S_MIB = 48 * 1024  # the catalog's L40S: 48 GiB


def snapshot(*nodes: tuple[str, str], allocations: tuple[Allocation, ...] = ()) -> ClusterSnapshot:
    return ClusterSnapshot(nodes=tuple(synthetic_node(spec, name) for spec, name in nodes),
                           allocations=allocations)


def test_cpu_trial_gets_only_cpus() -> None:
    factory = trial_resources(ClusterSnapshot(), None, cpus_per_trial=2)
    assert factory == PlacementGroupFactory([{"CPU": 2}])
    assert factory.bundles == [{"CPU": 2.0}]
    assert cpu_slot(1).label_selector is None


def test_shared_gpu_trial_takes_its_memory_share_pinned_to_the_node() -> None:
    snap = snapshot(("2x L40S", "gpu-a"))
    factory = trial_resources(snap, trial_request("t", 6 * GiB), cpus_per_trial=1)
    assert factory.bundles == [{"hetflow_dev_0": 6 * 1024.0, "CPU": 1.0}]
    assert factory.strategy == "PACK"
    # equal to a factory with that label selector (and only to it): Ray receives the selector
    assert factory != PlacementGroupFactory([{"CPU": 1, "hetflow_dev_0": 6144}])
    assert factory == PlacementGroupFactory(
        [{"CPU": 1, "hetflow_dev_0": 6144}], bundle_label_selector=[{"hetflow.io/node": "gpu-a"}])


def test_trial_without_memory_takes_the_whole_device() -> None:
    factory = trial_resources(snapshot(("2x L40S", "gpu-a")), trial_request("t", None), 1)
    assert factory.bundles == [{"hetflow_dev_0": float(L40S_MIB), "CPU": 1.0}]


def test_small_trials_share_devices_by_memory() -> None:
    snap = snapshot(("2x L40S", "gpu-a"))
    slots = plan_trial_slots(snap, trial_request("t", 20 * GiB), cpus_per_trial=1, limit=100)
    # 48 GiB per device / 20 GiB per trial = 2 trials on each of the 2 devices
    assert sorted((s.node, s.device) for s in slots) == [("gpu-a", 0), ("gpu-a", 0),
                                                         ("gpu-a", 1), ("gpu-a", 1)]
    assert all(s.bundle[f"hetflow_dev_{s.device}"] == 20 * 1024 for s in slots)
    factories, capacity = distinct_slots(tuple(slots))
    assert len(factories) == 2 and capacity == [2, 2]
    exclusive = plan_trial_slots(snap, trial_request("t", None), cpus_per_trial=1, limit=100)
    assert sorted(s.device for s in exclusive) == [0, 1]
    assert plan_trial_slots(snap, trial_request("t", 20 * GiB), 1, limit=3).__len__() == 3


def test_slots_leave_out_devices_other_jobs_hold() -> None:
    taken = (Allocation("training", "gpu-a", 0, None, exclusive=True),
             Allocation("serving", "gpu-a", 1, 40 * GiB, exclusive=False))
    snap = snapshot(("2x L40S", "gpu-a"), ("2x L40S", "gpu-b"), allocations=taken)
    slots = plan_trial_slots(snap, trial_request("t", 6 * GiB), cpus_per_trial=1, limit=100)
    per_device: dict[tuple[str, int], int] = {}
    for s in slots:
        per_device[(s.node, s.device)] = per_device.get((s.node, s.device), 0) + 1
    # gpu-a:0 is held whole; gpu-a:1 has 8 GiB left: one 6 GiB trial; gpu-b: 8 per device
    assert per_device == {("gpu-a", 1): 1, ("gpu-b", 0): 8, ("gpu-b", 1): 8}
    assert {s.label_selector["hetflow.io/node"] for s in slots} == {"gpu-a", "gpu-b"}


def test_vendor_constraint_and_too_big_trials() -> None:
    snap = snapshot(("2x L40S", "nv"), ("2x MI300X", "amd"))
    slots = plan_trial_slots(snap, trial_request("t", 100 * GiB, vendor=Vendor.AMD), 1, 10)
    assert {s.node for s in slots} == {"amd"} and len(slots) == 2  # 192 GiB each: one trial
    with pytest.raises(Unschedulable):
        plan_trial_slots(snap, trial_request("t", 500 * GiB), 1, 10)


def test_assigner_fills_the_emptiest_device_first() -> None:
    snap = snapshot(("2x L40S", "gpu-a"))
    slots = tuple(plan_trial_slots(snap, trial_request("t", 20 * GiB), 1, 100))
    assigner = SlotAssigner("test-run", slots)
    _LEDGERS.pop("test-run", None)
    try:
        chosen = [assigner({}).bundles[0] for _ in range(4)]
        devices = [next(k for k in bundle if k.startswith("hetflow_dev_")) for bundle in chosen]
        assert sorted(devices[:2]) == ["hetflow_dev_0", "hetflow_dev_1"]  # spread first
        assert sorted(devices) == ["hetflow_dev_0"] * 2 + ["hetflow_dev_1"] * 2
        factories, _ = distinct_slots(slots)
        # one trial on device 1 ended (the sync recounted from Tune's trials)
        _LEDGERS["test-run"] = {factories[0]: 2, factories[1]: 1}
        assert "hetflow_dev_1" in assigner({}).bundles[0]
    finally:
        _LEDGERS.pop("test-run", None)
