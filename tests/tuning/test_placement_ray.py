"""Trials placed by the planner on a hetflow-managed node with two fake L40S GPUs.

One cluster for the module (``ray.cluster_utils.Cluster``): a head with 1 CPU and a node that
declares two L40S (48 GiB each) as hetflow device resources, with its topology published. A
run whose trials need 20 GiB each gets four slots - two trials share each device by memory -
and every trial must run where it was planned, see exactly its device, and hold its share.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")

import pytest
import ray
from ray.tune import Callback

from hetflow.accelerators.synthetic import synthetic_node
from hetflow.runtime.binding import live_snapshot
from hetflow.workloads.tune.config import tuning_config_from_dict
from hetflow.workloads.tune.placement import TrialSlot
from hetflow.workloads.tune.runner import run_tuning
from tests.ray_cluster import hetflow_cluster

pytestmark = pytest.mark.ray

SHARE_MIB = 20 * 1024


@pytest.fixture(scope="module")
def gpu_node():
    node = synthetic_node("2x L40S", "gpu-node")
    with hetflow_cluster([node], head_cpus=1, node_cpus=4, log_to_driver=False):
        yield node


class WatchDevices(Callback):
    """Where each trial was planned (its bundle's device and node selector), and the most
    hetflow allocations seen on one device at once (Ray's placement-group table)."""

    def __init__(self) -> None:
        self.planned: dict[str, str] = {}
        self.most_on_one_device = 0
        self.most_memory_on_one_device = 0

    # what a trial planned on each device must ask Ray for: its share, pinned to the node
    SLOTS = {f"gpu-node:{d}": TrialSlot({"CPU": 1.0, f"hetflow_dev_{d}": float(SHARE_MIB)},
                                        node="gpu-node", device=d).factory() for d in (0, 1)}

    def on_trial_start(self, iteration: int, trials: list, trial: Any, **info: Any) -> None:
        (where,) = [w for w, f in self.SLOTS.items() if f == trial.placement_group_factory]
        self.planned[trial.trial_id] = where

    def on_trial_result(self, iteration: int, trials: list, trial: Any, result: dict,
                        **info: Any) -> None:
        per_device: dict[tuple[str, int], list[int]] = {}
        for alloc in live_snapshot().allocations:
            per_device.setdefault((alloc.node, alloc.device), []).append(alloc.memory_bytes)
        for held in per_device.values():
            self.most_on_one_device = max(self.most_on_one_device, len(held))
            self.most_memory_on_one_device = max(self.most_memory_on_one_device, sum(held))


def test_small_trials_share_devices_by_memory_where_the_planner_put_them(
        gpu_node, tmp_path: Path) -> None:
    config = tuning_config_from_dict({
        "name": "shared",
        "base": {"model": {"kind": "mlp", "hidden": [32]}, "train": {"batch_size": 64},
                 "resources": {"devices": "auto"}},
        "space": {"train": {"lr": {"loguniform": [1e-3, 1e-2]}}},
        "search": {"algorithm": "random", "scheduler": "fifo"},
        "budget": {"trials": 4, "epochs": 2},
        "trial": {"devices": {"memory": "20GiB"}},
        "output": {"dir": str(tmp_path / "run"), "live": False},
    })
    watch = WatchDevices()
    result = run_tuning(config, callbacks=[watch], quiet=True)
    assert result.placement.startswith("4 trial(s) at once on hetflow devices")
    assert len(result.trials) == 4 and all(t.status == "done" for t in result.trials)
    for trial in result.trials:
        # ran on the planned node and device, saw only that device, held its 20 GiB share
        assert trial.device == watch.planned[trial.trial_id]
        assert trial.visible_devices == trial.device.split(":")[1]
        assert trial.device_units == SHARE_MIB
    devices = sorted(t.device for t in result.trials)
    assert devices == ["gpu-node:0", "gpu-node:0", "gpu-node:1", "gpu-node:1"]
    capacity = gpu_node.device(0).memory_bytes
    assert watch.most_on_one_device == 2  # two trials held one device at the same time
    assert watch.most_memory_on_one_device <= capacity
