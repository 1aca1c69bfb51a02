"""What a hetflow node tells Ray (resources, labels, `ray start` line) and what a worker sees."""

from __future__ import annotations

import json
import shlex

import pytest
from ray._private.label_utils import parse_node_labels_string, validate_node_labels

from hetflow.accelerators.load import load_node
from hetflow.accelerators.synthetic import synthetic_node
from hetflow.cli.main import main
from hetflow.core.topology import Device, Vendor
from hetflow.runtime.resources import (
    fast_islands, node_labels, node_resources, ray_start_command, units_for, visibility_env,
)
from tests.conftest import fixture_path


def test_cpx_node_islands_and_labels_are_valid_for_ray() -> None:
    node = load_node([fixture_path("amd-mi300x-oam8-cpx_kfd-sysfs-topology.tar.gz")], name="cpx box")
    islands = fast_islands(node)
    assert sum(len(i) for i in islands) == 63
    assert len(islands) == 1  # partitions of all packages reach each other over xGMI
    labels = node_labels(node)
    validate_node_labels(labels)  # raises on a key or value Ray would refuse
    assert labels["hetflow.io/node"] == "cpx-box"
    assert labels["hetflow.io/devices"] == "63"


def test_pcie_node_has_no_fast_island() -> None:
    node = load_node([fixture_path("nvidia-rtx4090x8-pcie-2numa_nvidia-smi-topo-m.txt")])
    assert fast_islands(node) == [[i] for i in range(8)]
    assert node_labels(node)["hetflow.io/island-size"] == "1"


def test_units_exclusive_takes_all_shared_takes_memory() -> None:
    dev = Device(0, Vendor.NVIDIA, memory_bytes=80 * 2**30)
    assert units_for(dev, None, exclusive=True) == 80 * 1024
    assert units_for(dev, 20 * 2**30, exclusive=False) == 20 * 1024
    assert units_for(dev, 20 * 2**30 + 1, exclusive=False) == 20 * 1024 + 1  # rounds up
    assert units_for(Device(1, Vendor.NVIDIA), 5, exclusive=False) == 1024  # unknown memory


@pytest.mark.parametrize("vendor, expected", [
    (Vendor.NVIDIA, {"CUDA_VISIBLE_DEVICES": "3,5"}),
    (Vendor.AMD, {"HIP_VISIBLE_DEVICES": "3,5", "CUDA_VISIBLE_DEVICES": "3,5"}),
])
def test_visibility_env(vendor, expected) -> None:
    env = visibility_env(vendor, [3, 5])
    for k, v in expected.items():
        assert env[k] == v
    assert "ROCR_VISIBLE_DEVICES" not in env
    assert env["RAY_EXPERIMENTAL_NOSET_CUDA_VISIBLE_DEVICES"] == "1"
    assert env["RAY_EXPERIMENTAL_NOSET_HIP_VISIBLE_DEVICES"] == "1"


def test_node_start_print_is_a_valid_ray_start_line(capsys) -> None:
    code = main(["node", "start", "--print", "--name", "mi300x-a", "--model", "MI300X",
                 "--address", "10.1.2.3:6379", "--node-ip-address", "10.1.2.4",
                 "--from", str(fixture_path("amd-mi300x-oam8_amd-smi-topology.txt"))])
    out = capsys.readouterr().out
    assert code == 0
    line = [l for l in out.splitlines() if l.startswith("ray start")][0]
    argv = shlex.split(line)
    opts = dict(a.split("=", 1) for a in argv[2:])
    assert opts["--address"] == "10.1.2.3:6379"
    assert opts["--node-ip-address"] == "10.1.2.4"
    assert opts["--num-gpus"] == "0"
    resources = json.loads(opts["--resources"])
    assert resources == {f"hetflow_dev_{i}": 192 * 1024 for i in range(8)}
    labels = parse_node_labels_string(opts["--labels"])
    validate_node_labels(labels)
    assert labels["hetflow.io/vendor"] == "amd" and labels["hetflow.io/island-size"] == "8"


def test_ray_start_for_cpu_node_has_no_device_resources() -> None:
    cmd = ray_start_command(synthetic_node("cpu", "c"), None)
    assert "--head" in cmd and not any(c.startswith("--resources") for c in cmd)
    assert node_resources(synthetic_node("cpu", "c")) == {}
