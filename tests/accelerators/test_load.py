"""Several recorded files -> one node; cluster files; the driver-maximum bandwidth rule."""

from __future__ import annotations

import pytest

from hetflow.accelerators.load import load_cluster, load_node
from hetflow.accelerators.merge import merge_nodes
from hetflow.core.errors import InputError
from hetflow.core.topology import Device, Link, LinkKind, NodeTopology, PcieLevel, Vendor
from hetflow.core.units import parse_bytes
from tests.conftest import fixture_path


def test_topology_and_memory_files_merge_into_one_node() -> None:
    # Both files are of 8x H100 SXM HGX boards (from two published machines): the topology
    # names no bus ids, so devices join by index, as they would for one machine's files.
    node = load_node([
        fixture_path("nvidia-h100-sxm5x8-nvswitch-2numa_nvidia-smi-topo-m.txt"),
        fixture_path("nvidia-h100-sxm5x8_nvidia-smi-q.txt"),
    ])
    assert len(node.devices) == 8
    # links and NUMA from topo -m, names, memory and bus ids from -q
    assert all(l.kind is LinkKind.NVSWITCH for l in node.links) and len(node.links) == 28
    assert [d.numa_node for d in node.devices] == [0] * 4 + [1] * 4
    assert {d.model for d in node.devices} == {"H100-SXM"}
    assert all(d.memory_bytes == 81559 * 2**20 for d in node.devices)
    assert node.devices[0].pci_bus_id == "0000:18:00.0"
    assert len(node.sources) == 2


def test_rocm_smi_topology_and_numa_and_memory() -> None:
    node = load_node([fixture_path("amd-mi210x4-xgmi-bridge-nps4_rocm-smi-showtopo.txt")], model="MI210")
    assert [d.numa_node for d in node.devices] == [0, 1, 2, 3]
    assert all(l.kind is LinkKind.XGMI and l.weight == 15 for l in node.links)
    assert all(d.memory_bytes == parse_bytes("64GiB") for d in node.devices)


def test_model_hint_fills_only_unnamed_devices_and_checks_the_name() -> None:
    node = load_node([fixture_path("amd-mi300x-oam8_amd-smi-topology.txt")], model="mi300x")
    assert {d.model for d in node.devices} == {"MI300X"}
    with pytest.raises(InputError, match="did you mean"):
        load_node([fixture_path("amd-mi300x-oam8_amd-smi-topology.txt")], model="MI300Y")


def test_driver_maximum_is_replaced_by_the_catalog_line_rate() -> None:
    # amd-smi's NUMA BW (50000 MB/s) is a driver value; MI300X xGMI runs at 64 GB/s per peer
    node = load_node([fixture_path("amd-mi300x-oam8_amd-smi-topology.txt")], model="MI300X")
    assert {l.bandwidth_gbps for l in node.links} == {64.0}
    assert all("driver reports 50 GB/s" in (l.bandwidth_note or "") for l in node.links)
    # without a model the reported figure is all we have, and it is kept
    bare = load_node([fixture_path("amd-mi300x-oam8_amd-smi-topology.txt")])
    assert {l.bandwidth_gbps for l in bare.links} == {50.0}


def test_measured_bandwidth_is_kept() -> None:
    node = load_node([fixture_path("amd-mi210x4-xgmi-bridge-nps4_rocm-bandwidth-test.txt")], model="MI210")
    assert all(l.bandwidth_gbps and 40 < l.bandwidth_gbps < 45 for l in node.links)
    assert all("measured" in l.bandwidth_note for l in node.links)


def _part(source: str, *devices: Device, links: tuple[Link, ...] = ()) -> NodeTopology:
    return NodeTopology("n", devices=devices, links=links, sources=(source,))


def test_merge_joins_by_bus_id_not_by_index() -> None:
    a = _part("topo", Device(0, Vendor.NVIDIA, pci_bus_id="0000:18:00.0"),
              Device(1, Vendor.NVIDIA, pci_bus_id="0000:2a:00.0"),
              links=(Link(0, 1, LinkKind.PCIE, pcie_level=PcieLevel.PIX),))
    b = _part("query", Device(0, Vendor.NVIDIA, pci_bus_id="0000:2a:00.0", memory_bytes=5),
              Device(1, Vendor.NVIDIA, pci_bus_id="0000:18:00.0", memory_bytes=7))
    node = merge_nodes([a, b])
    assert [(d.pci_bus_id, d.memory_bytes) for d in node.devices] == [
        ("0000:18:00.0", 7), ("0000:2a:00.0", 5)]


def test_merge_keeps_the_more_specific_link_and_the_pcie_level() -> None:
    a = _part("topo", Device(0, Vendor.NVIDIA), Device(1, Vendor.NVIDIA),
              links=(Link(0, 1, LinkKind.PCIE, pcie_level=PcieLevel.NODE),))
    b = _part("nvml", Device(0, Vendor.NVIDIA), Device(1, Vendor.NVIDIA),
              links=(Link(0, 1, LinkKind.NVLINK, count=4),))
    (link,) = merge_nodes([a, b]).links
    assert (link.kind, link.count, link.pcie_level) == (LinkKind.NVLINK, 4, PcieLevel.NODE)


@pytest.mark.parametrize("field, va, vb", [("memory_bytes", 1, 2), ("numa_node", 0, 1)])
def test_merge_refuses_files_of_different_machines(field, va, vb) -> None:
    a = _part("one", Device(0, Vendor.AMD, **{field: va}))
    b = _part("two", Device(0, Vendor.AMD, **{field: vb}))
    with pytest.raises(InputError, match=f"{field} is {va!r} in one but {vb!r} in two"):
        merge_nodes([a, b])


def test_merge_refuses_a_vendor_mismatch() -> None:
    with pytest.raises(InputError, match="vendor"):
        merge_nodes([_part("a", Device(0, Vendor.AMD)), _part("b", Device(0, Vendor.NVIDIA))])


def test_cluster_file_relative_paths_counts_and_names(tmp_path) -> None:
    src = fixture_path("nvidia-rtx5090x2-pcie-phb_nvidia-smi-topo-m.txt")
    (tmp_path / "rec").mkdir()
    (tmp_path / "rec" / "box.txt").write_text(src.read_text())
    path = tmp_path / "c.yaml"
    path.write_text(
        "inter_node_gbps: 50\n"
        "nodes:\n"
        "  - {count: 3, node: 4x A100-40GB}\n"
        "  - {from: rec/box.txt, model: RTX 5090, name: ws}\n"
    )
    snap = load_cluster(path)
    assert snap.inter_node_gbps == 50.0
    assert [n.name for n in snap.nodes] == ["4x-a100-40gb-0", "4x-a100-40gb-1", "4x-a100-40gb-2", "ws"]
    assert snap.node("ws").link(0, 1).pcie_level is PcieLevel.PHB
    assert snap.node("4x-a100-40gb-0").devices[0].memory_bytes == parse_bytes("40GiB")
