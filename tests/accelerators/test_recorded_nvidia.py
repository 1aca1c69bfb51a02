"""Parsers of recorded nvidia-smi output, against the real outputs in tests/fixtures/topology.

Run: .venv/bin/python -m pytest -q tests/accelerators/test_recorded_nvidia.py
"""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from hetflow.accelerators.recorded import nvidia as nv
from hetflow.core.errors import ParseError
from hetflow.core.pci import normalize_pci_bus_id
from hetflow.core.topology import LinkKind, NodeTopology, PcieLevel, Vendor
from tests.conftest import FIXTURES, fixture_path

MiB = 1024**2

# Every nvidia fixture and the one format that must claim it.
FIXTURE_FORMATS = {
    "nvidia-2gpu-nvlink-bridge-nv2_nvidia-smi-topo-m.txt": "nvidia-smi-topo-m",
    "nvidia-dgx-a100-40gb_nvidia-smi-topo-m_EXCERPT-rows0-3.txt": "nvidia-smi-topo-m",
    "nvidia-dgx-a100-nvlink-not-reported_nvidia-smi-topo-m_EXCERPT-gpu-rows.txt": "nvidia-smi-topo-m",
    "nvidia-dgx2-v100x16-nvswitch_nvidia-smi-topo-m_EXCERPT-rows0-3.txt": "nvidia-smi-topo-m",
    "nvidia-h100-sxm5x8-nvswitch-2numa_nvidia-smi-topo-m.txt": "nvidia-smi-topo-m",
    "nvidia-rtx4090x8-pcie-2numa_nvidia-smi-topo-m.txt": "nvidia-smi-topo-m",
    "nvidia-rtx5090x2-pcie-phb_nvidia-smi-topo-m.txt": "nvidia-smi-topo-m",
    "nvidia-rtx5090x2-pcie-phb_nvidia-smi-topo-p2p-rw.txt": "nvidia-smi-topo-p2p",
    "nvidia-a100-sxm4-40gb-mig_nvidia-smi-q-x.xml": "nvidia-smi-q-xml",
    "nvidia-rtx4090-drv535_nvidia-smi-q-x.xml": "nvidia-smi-q-xml",
    "nvidia-tesla-p100-pcie-vm_nvidia-smi-q-x.xml": "nvidia-smi-q-xml",
    "nvidia-h100-sxm5x8_nvidia-smi-q.txt": "nvidia-smi-q",
    "nvidia-gb200_nvidia-smi-nvlink-s_EXCERPT-gpu0.txt": "nvidia-smi-nvlink-status",
    "nvidia-h100-sxm5_nvidia-smi-nvlink-status_EXCERPT.txt": "nvidia-smi-nvlink-status",
    "nvidia-v100-sxm2-inactive-links_nvidia-smi-nvlink-s_EXCERPT.txt": "nvidia-smi-nvlink-status",
    "nvidia-hgx-h100x8-nvswitch_nvidia-smi-nvlink-R_EXCERPT-gpu0.txt": "nvidia-smi-nvlink-remote",
}
FORMAT = {f.name: f for f in nv.FORMATS}


def read(name: str) -> str:
    return fixture_path(name).read_text()


def parse(name: str) -> NodeTopology:
    return FORMAT[FIXTURE_FORMATS[name]].parse(read(name), name)


def kinds(node: NodeTopology) -> set[tuple[LinkKind, int | None, PcieLevel | None]]:
    return {(l.kind, l.count, l.pcie_level) for l in node.links}


# --- every fixture: sniffed as exactly its format, parsed as a partial node ---------------


def test_every_nvidia_fixture_is_in_the_table() -> None:
    on_disk = {p.name for p in FIXTURES.glob("nvidia-*")}
    assert on_disk == set(FIXTURE_FORMATS)


def test_one_entry_per_format() -> None:
    assert [f.name for f in nv.FORMATS] == [
        "nvidia-smi-topo-m", "nvidia-smi-q-xml", "nvidia-smi-q",
        "nvidia-smi-nvlink-status", "nvidia-smi-nvlink-remote", "nvidia-smi-topo-p2p",
    ]


@pytest.mark.parametrize("name", sorted(FIXTURE_FORMATS))
def test_sniff_picks_exactly_the_right_format(name: str) -> None:
    text = read(name)
    assert [f.name for f in nv.FORMATS if f.sniff(text)] == [FIXTURE_FORMATS[name]]


@pytest.mark.parametrize("name", sorted(FIXTURE_FORMATS))
def test_fixture_parses_to_a_partial_nvidia_node(name: str) -> None:
    node = parse(name)
    assert node.name == "node0"
    assert node.sources == (name,)
    assert node.devices and all(d.vendor is Vendor.NVIDIA for d in node.devices)
    assert all(d.partition is None for d in node.devices)
    for d in node.devices:
        assert d.pci_bus_id is None or d.pci_bus_id == d.pci_bus_id.lower()


OTHER_TOOLS = sorted(
    p.name for p in FIXTURES.iterdir()
    if not p.name.startswith("nvidia-") and p.suffix in (".txt", ".csv", ".json", ".xml")
)


@pytest.mark.parametrize("name", OTHER_TOOLS)
def test_no_nvidia_format_claims_other_tools_output(name: str) -> None:
    text = read(name)
    assert [f.name for f in nv.FORMATS if f.sniff(text)] == []


# --- nvidia-smi topo -m ------------------------------------------------------------------


def test_h100x8_all_pairs_nvswitch_18_and_two_numa_nodes() -> None:
    node = parse("nvidia-h100-sxm5x8-nvswitch-2numa_nvidia-smi-topo-m.txt")
    assert [d.index for d in node.devices] == list(range(8))
    assert len(node.links) == 28
    assert kinds(node) == {(LinkKind.NVSWITCH, 18, None)}
    assert [d.numa_node for d in node.devices] == [0, 0, 0, 0, 1, 1, 1, 1]


def test_rtx4090x8_all_pairs_pcie_sys_and_nic_rows_ignored() -> None:
    node = parse("nvidia-rtx4090x8-pcie-2numa_nvidia-smi-topo-m.txt")
    assert [d.index for d in node.devices] == list(range(8))  # NIC0/NIC1 are not devices
    assert len(node.links) == 28
    assert kinds(node) == {(LinkKind.PCIE, None, PcieLevel.SYS)}
    assert [d.numa_node for d in node.devices] == [0, 0, 0, 0, 1, 1, 1, 1]


def test_dgx_a100_excerpt_rows_0_to_3() -> None:
    node = parse("nvidia-dgx-a100-40gb_nvidia-smi-topo-m_EXCERPT-rows0-3.txt")
    assert [d.index for d in node.devices] == list(range(8))  # from the header's GPU columns
    # pairs a shown row gives: among rows 0-3 (6) and rows 0-3 to GPUs 4-7 (16)
    assert {(l.a, l.b) for l in node.links} == {(a, b) for a in range(8) for b in range(a + 1, 8) if a < 4}
    assert kinds(node) == {(LinkKind.NVSWITCH, 12, None)}
    assert [d.numa_node for d in node.devices] == [3, 3, 1, 1, None, None, None, None]


def test_dgx_a100_nvlink_not_reported_pxb_sys_and_numa_range() -> None:
    node = parse("nvidia-dgx-a100-nvlink-not-reported_nvidia-smi-topo-m_EXCERPT-gpu-rows.txt")
    assert len(node.devices) == 8 and len(node.links) == 28
    pxb = {(l.a, l.b) for l in node.links if l.pcie_level is PcieLevel.PXB}
    assert pxb == {(0, 1), (2, 3), (4, 5), (6, 7)}
    assert all(l.kind is LinkKind.PCIE and l.pcie_level in (PcieLevel.PXB, PcieLevel.SYS) for l in node.links)
    assert {d.numa_node for d in node.devices} == {6}  # "6-7" -> 6


def test_dgx2_excerpt_nv6_is_nvswitch() -> None:
    node = parse("nvidia-dgx2-v100x16-nvswitch_nvidia-smi-topo-m_EXCERPT-rows0-3.txt")
    assert [d.index for d in node.devices] == list(range(16))
    assert len(node.links) == 6 + 4 * 12
    assert kinds(node) == {(LinkKind.NVSWITCH, 6, None)}  # 15 x 6 = 90 > 18 links per GPU
    assert all(d.numa_node is None for d in node.devices)  # no NUMA Affinity column


def test_two_gpu_nvlink_bridge_is_direct_nvlink() -> None:
    node = parse("nvidia-2gpu-nvlink-bridge-nv2_nvidia-smi-topo-m.txt")
    assert [(l.a, l.b, l.kind, l.count) for l in node.links] == [(0, 1, LinkKind.NVLINK, 2)]
    assert [d.numa_node for d in node.devices] == [None, None]


def test_rtx5090x2_phb_with_legend() -> None:
    node = parse("nvidia-rtx5090x2-pcie-phb_nvidia-smi-topo-m.txt")
    assert [(l.a, l.b, l.kind, l.pcie_level) for l in node.links] == [(0, 1, LinkKind.PCIE, PcieLevel.PHB)]
    assert [d.numa_node for d in node.devices] == [0, 0]


HEADER4 = "\tGPU0\tGPU1\tGPU2\tGPU3\tCPU Affinity\tNUMA Affinity"


def topo(*rows: str, header: str = HEADER4) -> NodeTopology:
    return nv.parse_topo_matrix("\n".join([header, *rows]) + "\n", "t.txt")


def test_eighteen_links_in_all_is_still_direct_nvlink() -> None:
    # 4-GPU board wired all-to-all with NV6: 3 x 6 = 18 links, the most a GPU has -> direct
    node = topo(
        "GPU0\t X \tNV6\tNV6\tNV6\t0-7\t0",
        "GPU1\tNV6\t X \tNV6\tNV6\t0-7\t0",
        "GPU2\tNV6\tNV6\t X \tNV6\t0-7\t0",
        "GPU3\tNV6\tNV6\tNV6\t X \t0-7\t0",
    )
    assert kinds(node) == {(LinkKind.NVLINK, 6, None)}


def test_mixed_nvlink_and_pcie_and_old_soc_alias() -> None:
    node = topo(
        "GPU0\t X \tNV2\tSOC\tPIX\t0-7\t0",
        "GPU1\tNV2\t X \tNODE\tPXB\t0-7\t0",
        "GPU2\tSYS\tNODE\t X \tPHB\t8-15\t1",
        "GPU3\tPIX\tPXB\tPHB\t X \t8-15\t1",
    )
    got = {(l.a, l.b): l.label for l in node.links}
    assert got == {
        (0, 1): "NV2", (0, 2): "PCIe/SYS", (0, 3): "PCIe/PIX",
        (1, 2): "PCIe/NODE", (1, 3): "PCIe/PXB", (2, 3): "PCIe/PHB",
    }


def test_blank_affinity_cells_are_placed_by_column() -> None:
    # nvidia-smi leaves unknown affinities empty; the remaining value sits under its column
    windows = (
        "        GPU0    CPU Affinity    NUMA Affinity   GPU NUMA ID\n"
        "GPU0     X                                      N/A\n"
    )
    assert nv.parse_topo_matrix(windows, "w.txt").devices[0].numa_node is None
    tabbed = (
        "\tGPU0\tGPU1\tCPU Affinity\tNUMA Affinity\tGPU NUMA ID\n"
        "GPU0\t X \tPHB\t\t\t5\t\tN/A\n"
        "GPU1\tPHB\t X \t\t\t5\t\tN/A\n"
    )
    assert [d.numa_node for d in nv.parse_topo_matrix(tabbed, "t.txt").devices] == [5, 5]


def test_command_line_and_indented_space_aligned_output() -> None:
    text = (
        "$ nvidia-smi topo -m\n"
        "    GPU0    GPU1    CPU Affinity    NUMA Affinity   GPU NUMA ID\n"
        "    GPU0     X  SYS 0-15,32-47  0       N/A\n"
        "    GPU1    SYS  X  16-31,48-63 1       N/A\n"
    )
    node = nv.parse_topo_matrix(text, "s.txt")
    assert [d.numa_node for d in node.devices] == [0, 1]
    assert kinds(node) == {(LinkKind.PCIE, None, PcieLevel.SYS)}


@pytest.mark.parametrize(
    "rows, line, words",
    [
        # GPU1/GPU0 says PIX where GPU0/GPU1 said NV2
        (("GPU0\t X \tNV2\tSYS\tSYS\t0\t0", "GPU1\tPIX\t X \tSYS\tSYS\t0\t0"), 3, "contradicts"),
        (("GPU0\t X \tNV2\tSYS\t0\t0",), 2, "expected 4 cells"),  # a cell missing
        (("GPU0\t X \tNV2\tSYS\tSYS\t0\t0\t7\tfoo",), 2, "at most 2 values"),  # too many values
        (("GPU0\t X \tNV2\tQPI\tSYS\t0\t0",), 2, "found 'QPI'"),  # unknown token
        (("GPU0\tSYS\tNV2\tSYS\tSYS\t0\t0",), 2, "expected X"),  # no X on the diagonal
        (("GPU0\t X \tX\tSYS\tSYS\t0\t0",), 2, "not X"),  # X off the diagonal
        (("GPU0\t X \tNV2\tSYS\tSYS\t0\tzero",), 2, "NUMA Affinity"),
        (("GPU0\t X \tNV2\tSYS\tSYS\t0\t0", "GPU0\t X \tNV2\tSYS\tSYS\t0\t0"), 3, "second row"),
        (("GPU9\t X \tNV2\tSYS\tSYS\t0\t0",), 2, "header name"),
        (("GPU0\t X \tNV2\tSYS\tSYS\t0\t0", "", "trailing words"), 4, "Legend"),
    ],
)
def test_topo_errors_name_the_line_and_what_was_expected(
    rows: tuple[str, ...], line: int, words: str
) -> None:
    with pytest.raises(ParseError) as err:
        topo(*rows)
    assert err.value.line == line
    assert words in err.value.message


def test_topo_without_gpu_header_or_rows() -> None:
    with pytest.raises(ParseError, match="header"):
        nv.parse_topo_matrix("hello world\n", "x.txt")
    with pytest.raises(ParseError, match="no GPU rows"):
        nv.parse_topo_matrix(HEADER4 + "\n", "x.txt")


# --- nvidia-smi -q -x ----------------------------------------------------------------------


@pytest.mark.parametrize(
    "name, product, memory_mib, bus_id, uuid, device_id, mig",
    [
        ("nvidia-a100-sxm4-40gb-mig_nvidia-smi-q-x.xml", "NVIDIA A100-SXM4-40GB", 40960, "0000:00:04.0",
         "GPU-27b94a00-ed54-5c24-b1fd-1054085de32a", "0x20b0", True),
        ("nvidia-rtx4090-drv535_nvidia-smi-q-x.xml", "NVIDIA GeForce RTX 4090", 24564, "0000:84:00.0",
         "GPU-71d1acc2-662d-2166-bf9f-65272d2fc437", "0x2684", None),
        ("nvidia-tesla-p100-pcie-vm_nvidia-smi-q-x.xml", "Tesla P100-PCIE-16GB", 16384, "0000:00:04.0",
         "GPU-d3da8716-eaab-75db-efc1-60e88e1cd55e", "0x15f8", None),
    ],
)
def test_query_xml_facts(
    name: str, product: str, memory_mib: int, bus_id: str, uuid: str, device_id: str, mig: bool | None
) -> None:
    (dev,) = parse(name).devices
    assert (dev.index, dev.name, dev.memory_bytes, dev.pci_bus_id, dev.uuid, dev.device_id) == (
        0, product, memory_mib * MiB, bus_id, uuid, device_id,
    )
    assert dev.partition is None  # MIG on the A100: still one whole GPU
    (gpu,) = nv.query_gpus_xml(read(name), name)
    assert gpu.mig_enabled is mig


def test_query_xml_compute_capability_and_second_gpu() -> None:
    text = (
        "<nvidia_smi_log><gpu id='00000000:18:00.0'><product_name>X</product_name>"
        "<cuda_compute_capability><major>9</major><minor>0</minor></cuda_compute_capability></gpu>"
        "<gpu id='00000000:2A:00.0'><fb_memory_usage><total>N/A</total></fb_memory_usage></gpu>"
        "</nvidia_smi_log>"
    )
    a, b = nv.parse_query_xml(text, "x.xml").devices
    assert (a.index, a.arch, a.pci_bus_id) == (0, "sm_90", "0000:18:00.0")
    assert (b.index, b.arch, b.pci_bus_id, b.memory_bytes) == (1, None, "0000:2a:00.0", None)


@pytest.mark.parametrize(
    "text, line",
    [
        ("<nvidia_smi_log>\n<gpu>\n</nvidia_smi_log>\n", 3),  # mismatched tag
        ("<?xml version='1.0'?>\n<nvidia_smi_log>\n  <gpu id='x'>\n", 4),  # truncated
        ("<rocm_smi/>", 1),  # not nvidia-smi's root
    ],
)
def test_query_xml_errors_have_a_line(text: str, line: int) -> None:
    with pytest.raises(ParseError) as err:
        nv.parse_query_xml(text, "bad.xml")
    assert err.value.line == line


def test_query_xml_bad_memory_is_a_parse_error() -> None:
    text = (
        "<nvidia_smi_log>\n<gpu id='00000000:01:00.0'>\n"
        "<fb_memory_usage><total>lots</total></fb_memory_usage>\n</gpu></nvidia_smi_log>"
    )
    with pytest.raises(ParseError, match="40960 MiB") as err:
        nv.parse_query_xml(text, "bad.xml")
    assert err.value.line == 3


# --- nvidia-smi -q (text) -----------------------------------------------------------------

H100_Q_GPUS = [
    ("0000:18:00.0", "GPU-b42dd28e-ffdd-8720-1df0-98bd8cdc05b1"),
    ("0000:2a:00.0", "GPU-7c3cadbd-17e5-0913-f69b-c618122ea0cd"),
    ("0000:3a:00.0", "GPU-2d50cdf6-dd67-9f2e-855e-0d4d6d395a2f"),
    ("0000:5d:00.0", "GPU-d1838e76-90e6-4408-711d-aeeaa2e1fd14"),
    ("0000:9a:00.0", "GPU-72be6e5d-3c1b-0d37-98ac-d3ef159f2589"),
    ("0000:ab:00.0", "GPU-52378fbc-3124-3895-13b6-1dd179563e0f"),
    ("0000:ba:00.0", "GPU-83a5aebb-b71c-c570-aa83-185e1233fe97"),
    ("0000:db:00.0", "GPU-33135771-a848-ece1-b61e-489e221d663c"),
]


def test_query_text_h100x8() -> None:
    node = parse("nvidia-h100-sxm5x8_nvidia-smi-q.txt")
    assert [(d.pci_bus_id, d.uuid) for d in node.devices] == H100_Q_GPUS
    assert [d.index for d in node.devices] == list(range(8))
    assert {(d.name, d.memory_bytes, d.device_id) for d in node.devices} == {
        ("NVIDIA H100 80GB HBM3", 81559 * MiB, "0x2330")  # FB total, not BAR1's 131072 MiB
    }
    gpus = nv.query_gpus_text(read("nvidia-h100-sxm5x8_nvidia-smi-q.txt"), "q")
    assert {(g.architecture, g.mig_enabled, g.fabric_state, g.fabric_clique_id) for g in gpus} == {
        ("Hopper", False, "Completed", 0)
    }
    assert [g.minor_number for g in gpus] == list(range(8))


def test_query_text_bus_id_must_match_heading() -> None:
    text = "GPU 00000000:18:00.0\n    Product Name : X\n    PCI\n        Bus Id : 00000000:19:00.0\n"
    with pytest.raises(ParseError, match="differs") as err:
        nv.parse_query_text(text, "q.txt")
    assert err.value.line == 4


def test_query_text_stray_line_is_an_error() -> None:
    with pytest.raises(ParseError) as err:
        nv.parse_query_text("GPU 00000000:18:00.0\n    Product Name : X\nsomething else\n", "q.txt")
    assert err.value.line == 3


# --- nvidia-smi nvlink --status -------------------------------------------------------------


def test_nvlink_status_counts_active_links_and_speed() -> None:
    assert nv.nvlink_status(read("nvidia-gb200_nvidia-smi-nvlink-s_EXCERPT-gpu0.txt"), "s") == {
        0: (18, 53.125), 1: (2, 53.125),  # GPU 1 is cut after two links: what is shown
    }
    h100 = read("nvidia-h100-sxm5_nvidia-smi-nvlink-status_EXCERPT.txt")
    assert nv.nvlink_status(h100, "s") == {0: (2, 26.562)}  # links 1-16 cut with "[...]"
    # links 3 and 5 are <inactive>
    assert nv.nvlink_status(read("nvidia-v100-sxm2-inactive-links_nvidia-smi-nvlink-s_EXCERPT.txt"), "s") == {
        3: (4, 25.781)
    }


def test_nvlink_status_devices_have_name_and_uuid() -> None:
    node = parse("nvidia-gb200_nvidia-smi-nvlink-s_EXCERPT-gpu0.txt")
    assert [(d.index, d.name, d.uuid) for d in node.devices] == [
        (0, "NVIDIA GB200", "GPU-d1b93026-6d5b-03bd-3a71-f85b47a61bde"),
        (1, "NVIDIA GB200", "GPU-39ac7bce-e3d6-b426-008e-fa47897c72d5"),
    ]
    assert node.links == ()
    (v100,) = parse("nvidia-v100-sxm2-inactive-links_nvidia-smi-nvlink-s_EXCERPT.txt").devices
    assert (v100.index, v100.name, v100.uuid) == (3, "Tesla V100-SXM2-32GB", None)  # "UUID: ..." elided


@pytest.mark.parametrize(
    "text, line, words",
    [
        ("GPU 0: A (UUID: GPU-1)\n\t Link 0: fast\n", 2, "GB/s"),
        ("\t Link 0: 25.0 GB/s\n", 1, "before any"),
        ("GPU 0: A (UUID: GPU-1)\n\t Link 0: 25.0 GB/s\n\t Link 0: 25.0 GB/s\n", 3, "twice"),
        ("GPU 0: A (UUID: GPU-1)\nGPU 0: A (UUID: GPU-1)\n", 2, "twice"),
        ("GPU 0: A (UUID: GPU-1)\nhello\n", 2, "expected"),
    ],
)
def test_nvlink_status_errors(text: str, line: int, words: str) -> None:
    with pytest.raises(ParseError) as err:
        nv.parse_nvlink_status(text, "s.txt")
    assert (err.value.line, words in err.value.message) == (line, True)


# --- nvidia-smi nvlink -R ------------------------------------------------------------------


def test_nvlink_remote_h100_gpu0_goes_to_four_switches() -> None:
    name = "nvidia-hgx-h100x8-nvswitch_nvidia-smi-nvlink-R_EXCERPT-gpu0.txt"
    remotes = nv.nvlink_remotes(read(name), name)
    assert list(remotes) == [0] and len(remotes[0]) == 18
    assert remotes[0][0] == nv.NvlinkRemote(link=0, remote_bus_id="0000:07:00.0", remote_link=46)
    switches = {"0000:05:00.0", "0000:06:00.0", "0000:07:00.0", "0000:08:00.0"}
    assert nv.nvswitch_bus_ids(remotes) == switches  # each has a port numbered >= 18
    node = parse(name)
    assert [(d.index, d.name, d.uuid) for d in node.devices] == [
        (0, "NVIDIA H100 80GB HBM3", "GPU-257d8671-d0e6-d1a7-dea9-952249a668fa")
    ]
    assert node.links == ()  # one GPU shown: no pairs


def test_nvlink_remote_two_gpus_sharing_switches_are_nvswitch() -> None:
    text = (
        "GPU 0: A (UUID: GPU-a)\n\t Link 0: Remote Device 00000008:00:00.0: Link 29\n"
        "\t Link 1: Remote Device 00000008:00:00.0: Link 28\n"
        "GPU 1: A (UUID: GPU-b)\n\t Link 0: Remote Device 00000008:00:00.0: Link 30\n"
        "\t Link 1: Remote Device 00000005:00:00.0: Link 34\n\t Link 2: <inactive>\n"
    )
    node = nv.parse_nvlink_remote(text, "r.txt")
    assert [(l.a, l.b, l.kind, l.count) for l in node.links] == [(0, 1, LinkKind.NVSWITCH, 2)]
    assert nv.nvswitch_bus_ids(nv.nvlink_remotes(text, "r")) == {"0008:00:00.0", "0005:00:00.0"}


def test_nvlink_remote_direct_links_need_the_gpus_bus_ids() -> None:
    # two H100 PCIe with an NVLink bridge: each GPU's remote is the other GPU (low port numbers)
    def gpu(index: int, uuid: str, peer: str) -> str:
        links = "".join(f"\t Link {k}: Remote Device {peer}: Link {k}\n" for k in range(3))
        return f"GPU {index}: H100 PCIe (UUID: {uuid})\n{links}"

    text = gpu(0, "GPU-a", "00000000:D5:00.0") + gpu(1, "GPU-b", "00000000:1A:00.0")
    remotes = nv.nvlink_remotes(text, "r")
    assert nv.nvlink_pair_links(remotes) == ()  # without bus ids nothing is proven
    bus_ids = {0: "0000:1a:00.0", 1: "0000:d5:00.0"}
    assert nv.nvswitch_bus_ids(remotes, bus_ids.values()) == frozenset()
    links = nv.nvlink_pair_links(remotes, bus_ids)
    assert [(l.a, l.b, l.kind, l.count) for l in links] == [(0, 1, LinkKind.NVLINK, 3)]


def test_nvlink_remote_bad_bus_id() -> None:
    with pytest.raises(ParseError, match="PCI bus id") as err:
        nv.parse_nvlink_remote("GPU 0: A (UUID: GPU-a)\n\t Link 0: Remote Device zz:00.0: Link 3\n", "r.txt")
    assert err.value.line == 2


# --- nvidia-smi topo -p2p -------------------------------------------------------------------


def test_topo_p2p_gives_devices_only() -> None:
    node = parse("nvidia-rtx5090x2-pcie-phb_nvidia-smi-topo-p2p-rw.txt")
    assert [d.index for d in node.devices] == [0, 1] and node.links == ()


@pytest.mark.parametrize(
    "text, line",
    [(" \tGPU0\tGPU1\n GPU0\tX\tMAYBE\n", 2), (" \tGPU0\tGPU1\n GPU0\tX\n", 2), (" \tGPU0\tGPU00\n", 1)],
)
def test_topo_p2p_errors(text: str, line: int) -> None:
    with pytest.raises(ParseError) as err:
        nv.parse_topo_p2p(text, "p.txt")
    assert err.value.line == line


# --- bus ids --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "raw, normal",
    [
        ("00000000:18:00.0", "0000:18:00.0"),
        ("00000000:2A:00.0", "0000:2a:00.0"),
        ("0000:DB:00.1", "0000:db:00.1"),
        ("18:00.0", "0000:18:00.0"),
        ("00000008:00:00.0", "0008:00:00.0"),
        ("00010000:e1:00.0", "10000:e1:00.0"),
        ("0000:18:00", None),
        ("GPU-1234", None),
    ],
)
def test_normalise_pci_bus_id(raw: str, normal: str | None) -> None:
    assert normalize_pci_bus_id(raw) == normal


# --- robustness: ParseError or a node, never another exception --------------------------

TOOL_CHARS = "GPU0123 NV18XSYPIHBOD\t\n:.-<>/()LinkRemoteDvcAfty[]"  # biased toward real tokens
FUZZ = settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
by_format: dict[str, list[str]] = {}
for _name, _fmt in FIXTURE_FORMATS.items():
    by_format.setdefault(_fmt, []).append(_name)


def parses_or_parse_error(fmt_name: str, text: str) -> None:
    try:
        node = FORMAT[fmt_name].parse(text, "fuzz")
    except ParseError:
        return
    assert isinstance(node, NodeTopology)


@st.composite
def damaged_fixture(draw: st.DrawFn, fmt_name: str) -> str:
    text = read(draw(st.sampled_from(sorted(by_format[fmt_name]))))
    how = draw(st.sampled_from(["truncate", "shuffle", "drop", "garble"]))
    if how == "truncate":
        return text[: draw(st.integers(0, len(text)))]
    lines = text.split("\n")
    if how == "shuffle":
        return "\n".join(draw(st.permutations(lines)))
    if how == "drop":
        k = draw(st.integers(0, len(lines) - 1))
        return "\n".join(lines[:k] + lines[k + 1 :])
    at = draw(st.integers(0, len(text)))
    return text[:at] + draw(st.text(max_size=8)) + text[at:]


@pytest.mark.parametrize("fmt_name", [f.name for f in nv.FORMATS])
@FUZZ
@given(data=st.data())
def test_damaged_fixtures_parse_or_raise_parse_error(fmt_name: str, data: st.DataObject) -> None:
    parses_or_parse_error(fmt_name, data.draw(damaged_fixture(fmt_name)))


@pytest.mark.parametrize("fmt_name", [f.name for f in nv.FORMATS])
@FUZZ
@given(text=st.text(alphabet=st.sampled_from(list(TOOL_CHARS)) | st.characters(), max_size=300))
def test_random_text_parses_or_raises_parse_error(fmt_name: str, text: str) -> None:
    parses_or_parse_error(fmt_name, text)
    assert FORMAT[fmt_name].sniff(text) in (True, False)
