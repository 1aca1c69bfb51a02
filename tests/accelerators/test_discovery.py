"""Live discovery backends: NVML and amdsmi through fake library modules, the CPU for real.

NVML and amdsmi need a driver CI does not have; ``fakes/`` holds stand-ins that follow the real
modules' names, return shapes and exceptions, each describing one machine (``*_box()``). The
CPU backend runs on this machine for real.

    .venv/bin/python -m pytest -q tests/accelerators/test_discovery.py
"""

from __future__ import annotations

import importlib.abc
import logging
import os
import socket
import sys
from pathlib import Path

import pytest

from hetflow.accelerators import amd, cpu, nvidia
from hetflow.accelerators.discover import discover_local
from hetflow.core.topology import LinkKind, NodeTopology, PcieLevel, Vendor

from .fakes import fake_amdsmi, fake_pynvml

MIB = 1 << 20


def _pairs(n: int) -> list[tuple[int, int]]:
    return [(a, b) for a in range(n) for b in range(a + 1, n)]


# ---- NVIDIA ---------------------------------------------------------------------------------


def test_h100_nvswitch_box_is_all_to_all_nvswitch_with_18_links() -> None:
    lib = fake_pynvml.install(fake_pynvml.h100_nvswitch_box())
    node = nvidia.discover(lib)

    assert node is not None
    assert node.name == socket.gethostname()
    assert node.sources == ("nvml",)
    assert [d.pci_bus_id for d in node.devices] == [
        "0000:18:00.0", "0000:2a:00.0", "0000:3a:00.0", "0000:5d:00.0",
        "0000:9a:00.0", "0000:ab:00.0", "0000:ba:00.0", "0000:db:00.0",
    ]  # fmt: skip
    assert node.device(0).uuid == "GPU-b42dd28e-ffdd-8720-1df0-98bd8cdc05b1"
    for d in node.devices:
        assert d.vendor is Vendor.NVIDIA
        assert d.name == "NVIDIA H100 80GB HBM3"
        assert d.memory_bytes == 81559 * MIB
        assert d.arch == "sm_90"
        assert d.device_id == "0x2330"
        assert d.partition is None
    assert [d.numa_node for d in node.devices] == [0, 0, 0, 0, 1, 1, 1, 1]
    assert len(node.links) == 28
    for a, b in _pairs(8):
        link = node.link(a, b)
        assert link is not None and link.kind is LinkKind.NVSWITCH and link.count == 18
        same_socket = (a < 4) == (b < 4)
        assert link.pcie_level is (PcieLevel.NODE if same_socket else PcieLevel.SYS)
    assert fake_pynvml.state.shutdown_calls == 1 and fake_pynvml.state.refcount == 0


def test_nvswitch_count_is_the_smaller_active_link_count_of_the_pair() -> None:
    lib = fake_pynvml.install(fake_pynvml.h100_nvswitch_box(links_down={7: 2}))
    node = nvidia.discover(lib)

    assert node is not None
    assert {node.link(a, 7).count for a in range(7)} == {16}  # type: ignore[union-attr]
    assert {node.link(a, b).count for a, b in _pairs(7)} == {18}  # type: ignore[union-attr]


def test_v100_hybrid_mesh_has_direct_nvlinks_with_their_counts_and_pcie_levels(caplog) -> None:
    lib = fake_pynvml.install(fake_pynvml.v100_hybrid_mesh_box())
    with caplog.at_level(logging.WARNING):
        node = nvidia.discover(lib)

    assert node is not None and len(node.devices) == 4
    assert {d.arch for d in node.devices} == {"sm_70"}
    assert [d.numa_node for d in node.devices] == [0, 0, 1, 1]
    for (a, b), count in fake_pynvml.V100_MESH_LINKS.items():
        link = node.link(a, b)
        assert link is not None and link.kind is LinkKind.NVLINK and link.count == count
        assert link.pcie_level is PcieLevel(fake_pynvml.V100_MESH_ANCESTORS[(a, b)])
    assert node.link(0, 1).pcie_level is PcieLevel.PXB  # type: ignore[union-attr]
    # Links 6..35 answer InvalidArgument and the two unused links per GPU are inactive: that is
    # an ordinary machine, not something to warn about.
    assert caplog.records == []


def test_pcie_box_without_nvlink_is_one_pcie_phb_pair(caplog) -> None:
    lib = fake_pynvml.install(fake_pynvml.pcie_pair_box())
    with caplog.at_level(logging.WARNING):
        node = nvidia.discover(lib)

    assert node is not None and len(node.devices) == 2
    assert node.links == (node.link(0, 1),)
    link = node.link(0, 1)
    assert link is not None and link.kind is LinkKind.PCIE and link.pcie_level is PcieLevel.PHB
    assert link.count is None and link.bandwidth_gbps is None
    assert [d.numa_node for d in node.devices] == [None, None]  # NVML did not report one
    assert node.device(1).arch == "sm_120" and node.device(1).memory_bytes == 32607 * MIB
    assert caplog.records == []  # every NVLink call said NotSupported: nothing to warn about


def test_numa_node_from_affinity_words_else_from_the_gpu_numa_id() -> None:
    box = fake_pynvml.pcie_pair_box()
    box.gpus[0].numa_affinity = 65  # bit 1 of the second 64-bit node-set word
    box.gpus[1].numa_node_id = 3  # no affinity; a GPU that is itself NUMA node 3
    node = nvidia.discover(fake_pynvml.install(box))

    assert node is not None
    assert [d.numa_node for d in node.devices] == [65, 3]


def test_no_driver_is_none_and_says_why(caplog) -> None:
    lib = fake_pynvml.install(fake_pynvml.no_driver_box())
    with caplog.at_level(logging.INFO, logger="hetflow.accelerators.nvidia"):
        assert nvidia.discover(lib) is None
    assert fake_pynvml.state.init_calls == 1
    assert fake_pynvml.state.shutdown_calls == 0  # never initialised, nothing to shut down
    assert "NVMLError_LibraryNotFound" in caplog.text


def test_zero_gpus_is_none_and_nvml_is_shut_down() -> None:
    lib = fake_pynvml.install(fake_pynvml.empty_box())
    assert nvidia.discover(lib) is None
    assert fake_pynvml.state.shutdown_calls == 1 and fake_pynvml.state.refcount == 0


def test_a_lost_gpu_is_left_out_and_the_others_keep_their_nvml_indices() -> None:
    box = fake_pynvml.v100_hybrid_mesh_box()
    box.gpus[1].lost = True
    node = nvidia.discover(fake_pynvml.install(box))

    assert node is not None
    assert [d.index for d in node.devices] == [0, 2, 3]
    assert [l.kind for l in node.links] == [LinkKind.NVLINK] * 3
    assert node.link(0, 3).count == 2  # type: ignore[union-attr]


def test_nvml_error_midway_is_none_and_nvml_is_still_shut_down(monkeypatch) -> None:
    lib = fake_pynvml.install(fake_pynvml.h100_nvswitch_box())

    def count_fails() -> int:
        raise fake_pynvml.NVMLError(fake_pynvml.NVML_ERROR_UNKNOWN)

    monkeypatch.setattr(fake_pynvml, "nvmlDeviceGetCount", count_fails)
    assert nvidia.discover(lib) is None
    assert fake_pynvml.state.shutdown_calls == 1


def test_a_bug_propagates_but_nvml_is_still_shut_down(monkeypatch) -> None:
    lib = fake_pynvml.install(fake_pynvml.pcie_pair_box())

    def name_bug(handle: object) -> str:
        raise RuntimeError("bug")

    monkeypatch.setattr(fake_pynvml, "nvmlDeviceGetName", name_bug)
    with pytest.raises(RuntimeError):
        nvidia.discover(lib)
    assert fake_pynvml.state.shutdown_calls == 1


def test_default_import_uses_the_installed_pynvml(monkeypatch) -> None:
    monkeypatch.setitem(sys.modules, "pynvml", fake_pynvml.install(fake_pynvml.pcie_pair_box()))
    node = nvidia.discover()
    assert node is not None and len(node.devices) == 2


def test_pynvml_not_installed_is_none(monkeypatch) -> None:
    monkeypatch.setitem(sys.modules, "pynvml", None)  # makes `import pynvml` raise ImportError
    assert nvidia.discover() is None


@pytest.mark.parametrize(
    "raw, expected",
    [
        ("00000000:1A:00.0", "0000:1a:00.0"),  # NVML: 8-digit domain, upper case
        (b"00000000:DB:00.0", "0000:db:00.0"),
        ("0000:c1:00.0", "0000:c1:00.0"),  # amdsmi
        ("00000001:07:1F.7", "0001:07:1f.7"),
        ("1A:00.0", "0000:1a:00.0"),
        ("not a bus id", None),
        ("", None),
        (None, None),
    ],
)
def test_normalize_pci_bus_id(raw, expected) -> None:
    assert nvidia.normalize_pci_bus_id(raw) == expected


# ---- AMD ------------------------------------------------------------------------------------


def test_mi300x_xgmi_box_is_all_to_all_xgmi_with_reported_bandwidth() -> None:
    lib = fake_amdsmi.install(fake_amdsmi.mi300x_xgmi_box())
    node = amd.discover(lib)

    assert node is not None
    assert node.name == socket.gethostname() and node.sources == ("amdsmi",)
    assert [d.pci_bus_id for d in node.devices] == fake_amdsmi.MI300X_BDFS
    for d in node.devices:
        assert d.vendor is Vendor.AMD
        assert d.name == "AMD Instinct MI300X OAM"
        assert d.device_id == "0x74a1" and d.arch == "gfx942" and d.compute_units == 304
        assert d.memory_bytes == fake_amdsmi.MI300X_VRAM
        assert d.partition is None and d.package is None  # SPX: whole GPUs
    assert [d.numa_node for d in node.devices] == [0, 0, 0, 0, 1, 1, 1, 1]
    assert len(node.links) == 28
    for a, b in _pairs(8):
        link = node.link(a, b)
        assert link is not None and link.kind is LinkKind.XGMI
        assert (link.weight, link.hops) == (15, 1)
        assert link.bandwidth_gbps == 50.0 and link.bandwidth_note == "reported by amdsmi (max)"
    assert fake_amdsmi.state.shutdown_calls == 1 and not fake_amdsmi.state.initialized


def test_mi300x_cpx_partitions_are_grouped_into_their_two_packages() -> None:
    lib = fake_amdsmi.install(fake_amdsmi.mi300x_cpx_box())
    node = amd.discover(lib)

    assert node is not None and len(node.devices) == 16
    assert {d.partition for d in node.devices} == {"CPX"}
    assert [d.package for d in node.devices] == [0] * 8 + [1] * 8
    assert node.device(9).pci_bus_id == "0000:27:00.1"
    assert {d.compute_units for d in node.devices} == {38}
    kinds = [l.kind for l in node.links]
    assert kinds.count(LinkKind.SAME_PACKAGE) == 2 * 28 and kinds.count(LinkKind.XGMI) == 64
    same = node.link(0, 7)
    assert same is not None and same.kind is LinkKind.SAME_PACKAGE
    assert same.weight == 13 and same.bandwidth_gbps == 819.2
    across = node.link(7, 8)
    assert across is not None and across.kind is LinkKind.XGMI
    assert across.weight == 41 and across.bandwidth_gbps is None  # amdsmi reports 0 MB/s


def test_amd_device_index_is_the_hip_id() -> None:
    # HIP enumerates the second GPU's partitions first, in reverse.
    hip_ids = list(range(15, -1, -1))
    node = amd.discover(fake_amdsmi.install(fake_amdsmi.mi300x_cpx_box(hip_ids=hip_ids)))

    assert node is not None
    assert node.device(0).pci_bus_id == "0000:27:00.7"
    assert node.device(15).pci_bus_id == "0000:05:00.0"
    assert node.link(0, 1).kind is LinkKind.SAME_PACKAGE  # type: ignore[union-attr]
    assert node.link(0, 8).kind is LinkKind.XGMI  # type: ignore[union-attr]
    assert node.device(0).package == node.device(7).package != node.device(8).package


def test_amd_pcie_pair_has_weight_and_hops_but_no_bandwidth() -> None:
    node = amd.discover(fake_amdsmi.install(fake_amdsmi.pcie_pair_box()))

    assert node is not None and len(node.devices) == 2
    link = node.link(0, 1)
    assert link is not None and link.kind is LinkKind.PCIE
    assert (link.weight, link.hops, link.bandwidth_gbps, link.pcie_level) == (40, 2, None, None)
    assert node.device(0).name is None  # amdsmi said "N/A"
    assert node.device(0).partition is None  # partition query not supported
    assert [d.index for d in node.devices] == [0, 1]  # no HIP ids: handle order


def test_amdsmi_init_failing_is_none_and_says_why(caplog) -> None:
    lib = fake_amdsmi.install(fake_amdsmi.init_failing_box())
    with caplog.at_level(logging.INFO, logger="hetflow.accelerators.amd"):
        assert amd.discover(lib) is None
    assert fake_amdsmi.state.init_calls == 1 and fake_amdsmi.state.shutdown_calls == 0
    assert "did not initialise" in caplog.text and str(fake_amdsmi.AMDSMI_STATUS_DRIVER_NOT_LOADED) in caplog.text


def test_amdsmi_zero_gpus_is_none_and_amdsmi_is_shut_down() -> None:
    lib = fake_amdsmi.install(fake_amdsmi.empty_box())
    assert amd.discover(lib) is None
    assert fake_amdsmi.state.shutdown_calls == 1 and not fake_amdsmi.state.initialized


class _MissingLibAmdSmi(importlib.abc.MetaPathFinder):
    """Makes ``import amdsmi`` fail the way the real package does without libamd_smi.so."""

    def find_spec(self, name, path, target=None):
        if name == "amdsmi":
            raise KeyError("libamd_smi.so")
        return None


def test_amdsmi_import_raising_keyerror_is_none(monkeypatch, caplog) -> None:
    monkeypatch.delitem(sys.modules, "amdsmi", raising=False)
    monkeypatch.setattr(sys, "meta_path", [_MissingLibAmdSmi(), *sys.meta_path])
    with caplog.at_level(logging.INFO, logger="hetflow.accelerators.amd"):
        assert amd.discover() is None
    assert "KeyError" in caplog.text


# ---- CPU ------------------------------------------------------------------------------------


def _meminfo_total_bytes() -> int:
    for line in Path("/proc/meminfo").read_text().splitlines():
        if line.startswith("MemTotal:"):
            return int(line.split()[1]) * 1024
    raise AssertionError("no MemTotal in /proc/meminfo")


def test_cpu_backend_on_this_machine() -> None:
    node = cpu.discover()

    assert node.name == socket.gethostname() and node.sources == ("cpu",)
    assert node.cpu_cores == os.cpu_count()
    assert node.host_memory_bytes is not None and node.host_memory_bytes > 0
    # sysconf's physical pages are the kernel's total RAM, which /proc/meminfo calls MemTotal.
    assert node.host_memory_bytes == _meminfo_total_bytes()
    assert node.numa_nodes is not None and node.numa_nodes >= 1
    (device,) = node.devices
    assert (device.index, device.vendor, device.numa_node) == (0, Vendor.CPU, 0)
    assert device.memory_bytes == node.host_memory_bytes and device.compute_units == os.cpu_count()
    assert device.name  # this machine's /proc/cpuinfo names its model
    assert node.accelerators == ()


def test_cpu_model_and_numa_count_from_given_files(tmp_path: Path) -> None:
    cpuinfo = tmp_path / "cpuinfo"
    cpuinfo.write_text("processor\t: 0\nvendor_id\t: GenuineIntel\nmodel name\t: Intel(R) Xeon(R) Platinum 8480+\n\nprocessor\t: 1\nmodel name\t: Intel(R) Xeon(R) Platinum 8480+\n")
    nodes = tmp_path / "node"
    for name in ("node0", "node1", "power"):
        (nodes / name).mkdir(parents=True)
    (nodes / "possible").write_text("0-1\n")

    node = cpu.discover(cpuinfo=cpuinfo, numa_dir=nodes)
    assert node.devices[0].name == "Intel(R) Xeon(R) Platinum 8480+"
    assert node.numa_nodes == 2


def test_cpu_fallbacks_without_model_name_or_numa_dir(tmp_path: Path, monkeypatch) -> None:
    cpuinfo = tmp_path / "cpuinfo"
    cpuinfo.write_text("processor\t: 0\nBogoMIPS\t: 50.00\nCPU implementer\t: 0x41\n")  # ARM style
    monkeypatch.setattr(cpu.platform, "processor", lambda: "aarch64")

    node = cpu.discover(cpuinfo=cpuinfo, numa_dir=tmp_path / "absent")
    assert node.devices[0].name == "aarch64"
    assert node.numa_nodes == 1


# ---- discover_local -------------------------------------------------------------------------


def _host_facts_match_cpu(node: NodeTopology) -> None:
    assert node.cpu_cores == os.cpu_count()
    assert node.host_memory_bytes == _meminfo_total_bytes()
    assert node.numa_nodes is not None and node.numa_nodes >= 1
    assert node.sources[-1] == "cpu"


def test_discover_local_prefers_gpus_and_adds_host_facts() -> None:
    node = discover_local(
        nvidia_lib=fake_pynvml.install(fake_pynvml.h100_nvswitch_box()),
        amd_lib=fake_amdsmi.install(fake_amdsmi.init_failing_box()),
    )
    assert node.sources == ("nvml", "cpu")
    assert len(node.devices) == 8 and {d.vendor for d in node.devices} == {Vendor.NVIDIA}
    assert len(node.links) == 28
    _host_facts_match_cpu(node)


def test_discover_local_amd_only() -> None:
    node = discover_local(
        nvidia_lib=fake_pynvml.install(fake_pynvml.no_driver_box()),
        amd_lib=fake_amdsmi.install(fake_amdsmi.mi300x_cpx_box()),
    )
    assert node.sources == ("amdsmi", "cpu") and len(node.devices) == 16
    _host_facts_match_cpu(node)


def test_discover_local_without_accelerators_is_the_cpu_node_and_logs_why(caplog) -> None:
    with caplog.at_level(logging.INFO, logger="hetflow.accelerators"):
        node = discover_local(
            nvidia_lib=fake_pynvml.install(fake_pynvml.no_driver_box()),
            amd_lib=fake_amdsmi.install(fake_amdsmi.empty_box()),
        )
    assert node.sources == ("cpu",)
    assert [d.vendor for d in node.devices] == [Vendor.CPU]
    _host_facts_match_cpu(node)
    assert "no NVIDIA GPUs found" in caplog.text and "no AMD GPUs found" in caplog.text


@pytest.mark.parametrize(
    "nvidia_box, amd_box, kept",
    [
        # 2 x 32 GiB RTX 5090 against 8 x 192 GiB MI300X: the MI300X box is the compute node
        (fake_pynvml.pcie_pair_box, fake_amdsmi.mi300x_xgmi_box, "amdsmi"),
        # 8 x 80 GiB H100 against 2 x 24 GiB Radeon
        (fake_pynvml.h100_nvswitch_box, fake_amdsmi.pcie_pair_box, "nvml"),
    ],
)
def test_discover_local_with_both_vendors_keeps_the_larger_and_warns(nvidia_box, amd_box, kept, caplog) -> None:
    with caplog.at_level(logging.WARNING, logger="hetflow.accelerators.discover"):
        node = discover_local(
            nvidia_lib=fake_pynvml.install(nvidia_box()),
            amd_lib=fake_amdsmi.install(amd_box()),
        )
    assert node.sources == (kept, "cpu")
    expected_vendor = Vendor.NVIDIA if kept == "nvml" else Vendor.AMD
    assert {d.vendor for d in node.devices} == {expected_vendor}
    assert "left out" in caplog.text


def test_discover_local_on_this_machine_always_has_host_facts() -> None:
    node = discover_local()  # the real libraries, if any are installed
    _host_facts_match_cpu(node)
    assert node.devices
