"""Recorded rocm-smi output (text, CSV, JSON) -> partial NodeTopology.

Facts asserted here are read off the fixture files in tests/fixtures/topology (see
SOURCES.md there); the synthetic samples follow the layouts rocm_smi.py prints.
"""

from __future__ import annotations

import json
import random

import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from hetflow.accelerators.recorded import rocm_smi
from hetflow.accelerators.recorded.rocm_smi import FORMATS, canonical_gfx
from hetflow.core.errors import ParseError
from hetflow.core.topology import LinkKind, NodeTopology, Vendor
from tests.conftest import FIXTURES, fixture_path

BY_NAME = {f.name: f for f in FORMATS}

# fixture -> the one format that must claim it
FIXTURE_FORMATS = {
    "amd-mi210x4-xgmi-bridge-nps4_rocm-smi-showtopo.txt": "rocm-smi-showtopo",
    "amd-mi355x-oam8_rocm-smi-showtopo_EXCERPT-linktype.txt": "rocm-smi-showtopo",
    "amd-8gpu-2numa_rocm-smi-showtoponuma.txt": "rocm-smi-showtoponuma",
    "amd-4gb-gpu_rocm-smi-showmeminfo-vram.txt": "rocm-smi-meminfo",
    "amd-mi300x-x4-sriov-vm_rocm-smi.txt": "rocm-smi-concise",
    "amd-mi300x-x4-sriov-vm_rocm-smi-a.txt": "rocm-smi-all",
    "amd-rx7900xt_rocm-smi-showproductname-showuse-showmeminfo-vram.csv": "rocm-smi-csv",
    "amd-rx7900xt_rocm-smi-showproductname-showuse-showmeminfo-vram.json": "rocm-smi-json",
    "amd-mixed-navi21-dgpu-plus-raphael-igpu_rocm-smi-showproductname-showmeminfo-vram-showuniqueid.csv": (
        "rocm-smi-csv"
    ),
}


def read(name: str) -> str:
    return fixture_path(name).read_text(encoding="utf-8")


def parse_fixture(name: str) -> NodeTopology:
    return BY_NAME[FIXTURE_FORMATS[name]].parse(read(name), name)


# A `rocm-smi --showtopo --json` sample built from the key formats rocm_smi.py writes
# (formatMatrixToJSON prints the upper triangle only; NUMA keys sit per card).
SHOWTOPO_JSON = {
    "card0": {"(Topology) Numa Node": "0", "(Topology) Numa Affinity": "0"},
    "card1": {"(Topology) Numa Node": "0", "(Topology) Numa Affinity": "0"},
    "card2": {"(Topology) Numa Node": "1", "(Topology) Numa Affinity": "1"},
    "system": {
        "(Topology) Weight between DRM devices 0 and 1": "15",
        "(Topology) Weight between DRM devices 0 and 2": "40",
        "(Topology) Weight between DRM devices 1 and 2": "40",
        "(Topology) Hops between DRM devices 0 and 1": "1",
        "(Topology) Hops between DRM devices 0 and 2": "2",
        "(Topology) Hops between DRM devices 1 and 2": "2",
        "(Topology) Link type between DRM devices 0 and 1": "XGMI",
        "(Topology) Link type between DRM devices 0 and 2": "PCIE",
        "(Topology) Link type between DRM devices 1 and 2": "PCIE",
        "(Topology) Link accessibility between DRM devices 0 and 1": "True",
        "(Topology) Link accessibility between DRM devices 0 and 2": "True",
        "(Topology) Link accessibility between DRM devices 1 and 2": "True",
    },
}

# Four MI50s on one PCIe switch, as `rocm-smi --showtopo` prints them (no xGMI).
PCIE_SHOWTOPO = """\
========================= ROCm System Management Interface =========================
============================= Weight between two GPUs ==============================
       GPU0         GPU1         GPU2         GPU3
GPU0   0            40           40           40
GPU1   40           0            40           40
GPU2   40           40           0            40
GPU3   40           40           40           0

============================== Hops between two GPUs ===============================
       GPU0         GPU1         GPU2         GPU3
GPU0   0            2            2            2
GPU1   2            0            2            2
GPU2   2            2            0            2
GPU3   2            2            2            0

============================ Link Type between two GPUs ============================
       GPU0         GPU1         GPU2         GPU3
GPU0   0            PCIE         PCIE         PCIE
GPU1   PCIE         0            PCIE         PCIE
GPU2   PCIE         PCIE         0            PCIE
GPU3   PCIE         PCIE         PCIE         0
============================== End of ROCm SMI Log ===============================
"""

# ROCm 6.1+ concise layout (Node, DID, GUID columns; partition id), one MI300X in CPX mode
# shown as two of its partitions.
CONCISE_CPX = """\
============================================ ROCm System Management Interface ============================================
====================================================== Concise Info ======================================================
Device  Node  IDs              Temp        Power     Partitions          SCLK    MCLK    Fan  Perf  PwrCap  VRAM%  GPU%
              (DID,     GUID)  (Junction)  (Socket)  (Mem, Compute, ID)
==========================================================================================================================
0       4     0x74a1,   28851  50.0°C      133.0W    NPS1, CPX, 0        137Mhz  900Mhz  0%   auto  750.0W  0%     0%
1       5     0x74A1,   50724  44.0°C      N/A       NPS1, CPX, 1        137Mhz  900Mhz  0%   auto  N/A     0%     0%
==========================================================================================================================
================================================== End of ROCm SMI Log ===================================================
"""


# ---------------------------------------------------------------- every fixture, its format


def test_formats_have_the_agreed_names():
    assert sorted(BY_NAME) == sorted([
        "rocm-smi-showtopo", "rocm-smi-showtoponuma", "rocm-smi-showtopo-json", "rocm-smi-meminfo",
        "rocm-smi-csv", "rocm-smi-json", "rocm-smi-concise", "rocm-smi-all",
    ])


@pytest.mark.parametrize("name", sorted(FIXTURE_FORMATS))
def test_exactly_its_format_claims_each_fixture(name):
    assert [f.name for f in FORMATS if f.sniff(read(name))] == [FIXTURE_FORMATS[name]]


@pytest.mark.parametrize("name", sorted(FIXTURE_FORMATS))
def test_each_fixture_parses_to_a_partial_amd_node(name):
    node = parse_fixture(name)
    assert node.name == "node0"
    assert node.sources == (name,)
    assert node.devices and all(d.vendor is Vendor.AMD for d in node.devices)
    assert all(l.bandwidth_gbps is None for l in node.links)  # rocm-smi prints no bandwidth


def other_tools_fixtures() -> list[str]:
    return sorted(
        p.name for p in FIXTURES.iterdir()
        if p.is_file() and "rocm-smi" not in p.name and p.suffix not in (".md", ".gz")
    )


@pytest.mark.parametrize("name", other_tools_fixtures())
def test_no_format_claims_amd_smi_nvidia_smi_or_rocminfo_output(name):
    assert [f.name for f in FORMATS if f.sniff(read(name))] == []


def test_other_tools_fixtures_include_each_kind():
    names = " ".join(other_tools_fixtures())
    assert "amd-smi" in names and "nvidia-smi" in names and "rocminfo" in names


# ---------------------------------------------------------------- facts from the fixtures


def test_mi210x4_showtopo_all_pairs_xgmi_weight_15_hops_1_one_gpu_per_numa_node():
    node = parse_fixture("amd-mi210x4-xgmi-bridge-nps4_rocm-smi-showtopo.txt")
    assert [d.index for d in node.devices] == [0, 1, 2, 3]
    assert [(l.a, l.b) for l in node.links] == list(node.pairs())
    for link in node.links:
        assert (link.kind, link.weight, link.hops, link.pcie_level) == (LinkKind.XGMI, 15, 1, None)
    assert {d.index: d.numa_node for d in node.devices} == {0: 0, 1: 1, 2: 2, 3: 3}


def test_mi355x_link_type_excerpt_has_8_gpus_and_28_xgmi_pairs_without_weights():
    node = parse_fixture("amd-mi355x-oam8_rocm-smi-showtopo_EXCERPT-linktype.txt")
    assert len(node.devices) == 8
    assert len(node.links) == 28
    assert {l.kind for l in node.links} == {LinkKind.XGMI}
    assert {(l.weight, l.hops) for l in node.links} == {(None, None)}  # not in the excerpt


def test_8gpu_showtoponuma_four_gpus_per_numa_node():
    node = parse_fixture("amd-8gpu-2numa_rocm-smi-showtoponuma.txt")
    assert {d.index: d.numa_node for d in node.devices} == {i: (0 if i < 4 else 1) for i in range(8)}
    assert node.links == ()


def test_4gb_meminfo_total_vram():
    node = parse_fixture("amd-4gb-gpu_rocm-smi-showmeminfo-vram.txt")
    assert [(d.index, d.memory_bytes) for d in node.devices] == [(0, 4278190080)]


def test_mixed_navi21_and_raphael_csv():
    node = parse_fixture(
        "amd-mixed-navi21-dgpu-plus-raphael-igpu_rocm-smi-showproductname-showmeminfo-vram-showuniqueid.csv"
    )
    dgpu, igpu = node.devices
    assert (dgpu.index, dgpu.arch, dgpu.memory_bytes) == (0, "gfx1030", 17163091968)
    assert (igpu.index, igpu.arch, igpu.memory_bytes) == (1, "gfx1036", 64 * 2**20)
    assert dgpu.name == "Navi 21 [Radeon RX 6800/6800 XT / 6900 XT]"
    assert igpu.name == "Raphael"
    assert (dgpu.device_id, igpu.device_id) == ("0x73bf", "0x164e")  # hex "Card Model"
    assert dgpu.uuid == "0x9246____________"  # kept as printed
    assert igpu.uuid is None  # "N/A"


def test_rx7900xt_csv_and_json_agree():
    base = "amd-rx7900xt_rocm-smi-showproductname-showuse-showmeminfo-vram"
    from_csv = parse_fixture(base + ".csv")
    from_json = parse_fixture(base + ".json")
    assert from_csv.devices == from_json.devices
    (gpu,) = from_csv.devices
    assert (gpu.name, gpu.arch, gpu.memory_bytes, gpu.device_id) == (
        "Radeon RX 7900 XT", "gfx1100", 21458059264, "0x744c"
    )


def test_mi300x_concise_table():
    node = parse_fixture("amd-mi300x-x4-sriov-vm_rocm-smi.txt")
    assert [d.index for d in node.devices] == [0, 1, 2, 3]
    for d in node.devices:
        assert (d.device_id, d.name, d.partition) == ("0x74a1", "AMD Instinct MI300X", None)  # SPX


def test_mi300x_all_shows_ids_bus_and_product():
    node = parse_fixture("amd-mi300x-x4-sriov-vm_rocm-smi-a.txt")
    assert [d.pci_bus_id for d in node.devices] == [
        "0000:26:00.0", "0000:46:00.0", "0000:65:00.0", "0000:85:00.0"
    ]
    assert [d.uuid for d in node.devices] == [
        "0x8d1457e2c20f59d2", "0xb4fa34630e85d42a", "0xe8986800e182538a", "0xeff71edc82169115"
    ]
    for d in node.devices:
        assert (d.device_id, d.name, d.partition) == ("0x74a1", "AMD Instinct MI300X OAM", None)
        assert (d.memory_bytes, d.arch, d.numa_node) == (None, None, None)  # not in this -a output


# ---------------------------------------------------------------- synthetic samples


def test_showtopo_json_pairs_and_numa():
    text = json.dumps(SHOWTOPO_JSON, indent=4)
    assert [f.name for f in FORMATS if f.sniff(text)] == ["rocm-smi-showtopo-json"]
    node = BY_NAME["rocm-smi-showtopo-json"].parse(text, "topo.json")
    assert {d.index: d.numa_node for d in node.devices} == {0: 0, 1: 0, 2: 1}
    assert [(l.a, l.b, l.kind, l.weight, l.hops) for l in node.links] == [
        (0, 1, LinkKind.XGMI, 15, 1),
        (0, 2, LinkKind.PCIE, 40, 2),
        (1, 2, LinkKind.PCIE, 40, 2),
    ]


def test_showtopo_json_with_both_directions_must_agree():
    data = json.loads(json.dumps(SHOWTOPO_JSON))
    data["system"]["(Topology) Weight between DRM devices 1 and 0"] = "15"
    node = rocm_smi.parse_json(json.dumps(data), "both.json")
    assert node.link(0, 1).weight == 15
    data["system"]["(Topology) Weight between DRM devices 1 and 0"] = "30"
    text = json.dumps(data, indent=4)
    with pytest.raises(ParseError) as err:
        rocm_smi.parse_json(text, "both.json")
    assert err.value.line == text.splitlines().index(
        '        "(Topology) Weight between DRM devices 1 and 0": "30"'
    ) + 1


def test_pcie_showtopo_has_no_pcie_level():
    node = BY_NAME["rocm-smi-showtopo"].parse(PCIE_SHOWTOPO, "pcie.txt")
    assert len(node.links) == 6
    assert {(l.kind, l.pcie_level, l.weight, l.hops) for l in node.links} == {(LinkKind.PCIE, None, 40, 2)}


def test_concise_rocm61_layout_with_cpx_partitions():
    assert [f.name for f in FORMATS if f.sniff(CONCISE_CPX)] == ["rocm-smi-concise"]
    node = rocm_smi.parse_text(CONCISE_CPX, "cpx.txt")
    assert [(d.index, d.device_id, d.partition, d.name) for d in node.devices] == [
        (0, "0x74a1", "CPX", None), (1, "0x74a1", "CPX", None)
    ]


def test_numa_node_minus_one_is_unknown():
    text = (
        "==================== Numa Nodes ====================\n"
        "GPU[0]\t\t: (Topology) Numa Node: -1\n"
        "GPU[1]\t\t: (Topology) Numa Node: 4294967295\n"
        "GPU[2]\t\t: (Topology) Numa Node: 1\n"
    )
    node = BY_NAME["rocm-smi-showtoponuma"].parse(text, "numa.txt")
    assert [d.numa_node for d in node.devices] == [None, None, 1]


@pytest.mark.parametrize(
    "printed, target",
    [
        ("gfx942", "gfx942"), ("gfx9010", "gfx90a"), ("gfx9012", "gfx90c"), ("gfx1100", "gfx1100"),
        ("gfx1030", "gfx1030"), ("gfx1036", "gfx1036"), ("gfx950", "gfx950"), ("gfx803", "gfx803"),
        ("gfx90a", "gfx90a"), ("GFX1201", "gfx1201"), ("gfx10110", "gfx101a"),
    ],
)
def test_gfx_version_becomes_the_llvm_target(printed, target):
    assert canonical_gfx(printed) == target


def test_gfx9010_from_json_is_gfx90a():
    text = json.dumps({"card0": {"Card Series": "AMD Instinct MI210", "GFX Version": "gfx9010"}})
    (gpu,) = rocm_smi.parse_json(text, "mi210.json").devices
    assert (gpu.name, gpu.arch) == ("AMD Instinct MI210", "gfx90a")


def test_older_card_model_is_a_name_not_an_id():
    # older rocm-smi: "Card series" is the chip family, "Card model" the product
    text = json.dumps({"card0": {"Card series": "Navi 10 [Radeon RX 5600 OEM/5600 XT / 5700/5700 XT]",
                                 "Card model": "Radeon RX 5600 XT", "VRAM Total Memory (B)": "8573157376"}})
    (gpu,) = rocm_smi.parse_json(text, "navi10.json").devices
    assert gpu.name == "Navi 10 [Radeon RX 5600 OEM/5600 XT / 5700/5700 XT]"
    assert (gpu.device_id, gpu.memory_bytes) == (None, 8573157376)


# ---------------------------------------------------------------- errors name the line


def _mi210_lines() -> list[str]:
    return read("amd-mi210x4-xgmi-bridge-nps4_rocm-smi-showtopo.txt").splitlines()


def _parse_lines(lines: list[str]) -> NodeTopology:
    return rocm_smi.parse_text("\n".join(lines) + "\n", "topo.txt")


def test_asymmetric_matrix_is_an_error_at_the_later_row():
    lines = _mi210_lines()
    assert lines[6].startswith("GPU3")
    lines[6] = "GPU3   15           15           30           0"  # GPU3->GPU2 30, GPU2->GPU3 15
    with pytest.raises(ParseError, match="not symmetric") as err:
        _parse_lines(lines)
    assert err.value.line == 7


def test_bad_cell_is_an_error_at_its_line():
    lines = _mi210_lines()
    assert lines[18].startswith("GPU1")
    lines[18] = lines[18].replace("XGMI", "NVLINK", 1)
    with pytest.raises(ParseError, match="NVLINK") as err:
        _parse_lines(lines)
    assert err.value.line == 19


def test_wrong_cell_count_is_an_error_at_its_line():
    lines = _mi210_lines()
    assert lines[10].startswith("GPU0")
    lines[10] = lines[10] + "   1"
    with pytest.raises(ParseError, match="5 cells") as err:
        _parse_lines(lines)
    assert err.value.line == 11


def test_missing_row_is_an_error():
    lines = _mi210_lines()
    assert lines[13].startswith("GPU3")
    del lines[13]  # the hops row of GPU3
    with pytest.raises(ParseError, match="no row for GPU3"):
        _parse_lines(lines)


def test_matrices_over_different_gpus_are_an_error():
    text = PCIE_SHOWTOPO + (
        "============ Weight between two GPUs ============\n"
        "       GPU0         GPU1\n"
        "GPU0   0            40\n"
        "GPU1   40           0\n"
    )
    with pytest.raises(ParseError, match="covers GPUs") as err:
        rocm_smi.parse_text(text, "mixed.txt")
    assert err.value.line == len(PCIE_SHOWTOPO.splitlines()) + 1  # the second weight banner


def test_bad_vram_value_is_an_error_at_its_line():
    lines = read("amd-4gb-gpu_rocm-smi-showmeminfo-vram.txt").splitlines()
    lines[2] = lines[2].replace("4278190080", "4 GB")
    with pytest.raises(ParseError, match="whole number") as err:
        rocm_smi.parse_text("\n".join(lines), "mem.txt")
    assert err.value.line == 3


def test_garbled_json_is_an_error_with_its_line():
    name = "amd-rx7900xt_rocm-smi-showproductname-showuse-showmeminfo-vram.json"
    lines = read(name).splitlines()
    assert lines[2].endswith('"0",')
    lines[2] = lines[2][:-1]  # drop the comma after "GPU use (%)"
    with pytest.raises(ParseError, match="not valid JSON") as err:
        BY_NAME["rocm-smi-json"].parse("\n".join(lines), name)
    assert err.value.line == 4  # where the parser found the next key instead of a comma


def test_bad_json_value_is_an_error_at_its_line():
    name = "amd-rx7900xt_rocm-smi-showproductname-showuse-showmeminfo-vram.json"
    text = read(name).replace('"gfx1100"', '"Navi 31"')
    with pytest.raises(ParseError, match="GFX target") as err:
        BY_NAME["rocm-smi-json"].parse(text, name)
    assert err.value.line == 14


def test_csv_row_with_wrong_cell_count_is_an_error_at_its_line():
    name = "amd-rx7900xt_rocm-smi-showproductname-showuse-showmeminfo-vram.csv"
    text = read(name).replace("gfx1100", "gfx1100,extra")
    with pytest.raises(ParseError, match="14 cells") as err:
        BY_NAME["rocm-smi-csv"].parse(text, name)
    assert err.value.line == 2


def test_text_without_any_gpu_is_an_error():
    with pytest.raises(ParseError, match="no GPU found"):
        rocm_smi.parse_text("===== ROCm System Management Interface =====\n", "empty.txt")


# ---------------------------------------------------------------- robustness (hypothesis)

# Fragments that reach deep into the parsers, mixed with arbitrary text.
FRAGMENTS = [
    "=========== Weight between two GPUs ===========", "==== Link Type between two GPUs ====",
    "===== Numa Nodes =====", "==== Concise Info ====", "===== ROCm System Management Interface =====",
    "       GPU0         GPU1", "GPU0   0   15", "GPU1   15   0", "GPU1   XGMI  0", "GPU0 0 PCIE",
    "GPU[0]\t\t: VRAM Total Memory (B): 123", "GPU[1]\t\t: GFX Version: gfx9010",
    "GPU 0   : (Topology) Numa Node: 0", "GPU[0]\t\t: PCI Bus: 0000:C1:00.0", "GPU[0]\t\t: Device ID: 0x74a1",
    "0       [0x74a1 : 0x00]   NPS1, CPX", "        AMD Instinct MI300X", "1   2   0x74a2,   7   NPS4, SPX, 0",
    "device,VRAM Total Memory (B),GFX Version", "card0,17163091968,gfx1030", "system,15",
    '{"card0": {"Card Series": "x"}}', '{"system": {"(Topology) Hops between DRM devices 0 and 1": "1"}}',
]
junk_lines = st.lists(st.one_of(st.sampled_from(FRAGMENTS), st.text(max_size=30)), max_size=25).map("\n".join)
FIXTURE_CASES = sorted(FIXTURE_FORMATS.items())
ROBUST = settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def parses_or_parse_error(fmt_name: str, text: str) -> None:
    """The contract: a NodeTopology or ParseError, never another exception."""
    try:
        node = BY_NAME[fmt_name].parse(text, "t")
    except ParseError as e:
        assert e.source == "t"
        return
    assert isinstance(node, NodeTopology) and node.devices


@pytest.mark.parametrize("fmt_name", sorted(BY_NAME))
@ROBUST
@given(text=st.one_of(st.text(), junk_lines))
def test_random_text_parses_or_raises_parse_error(fmt_name, text):
    assert BY_NAME[fmt_name].sniff(text) in (True, False)
    parses_or_parse_error(fmt_name, text)


@pytest.mark.parametrize("name, fmt_name", FIXTURE_CASES)
@ROBUST
@given(cut=st.floats(min_value=0, max_value=1))
def test_truncated_fixture_parses_or_raises_parse_error(name, fmt_name, cut):
    text = read(name)
    parses_or_parse_error(fmt_name, text[: int(len(text) * cut)])


@pytest.mark.parametrize("name, fmt_name", FIXTURE_CASES)
@ROBUST
@given(seed=st.integers(min_value=0, max_value=2**32))
def test_shuffled_fixture_lines_parse_or_raise_parse_error(name, fmt_name, seed):
    lines = read(name).splitlines()
    random.Random(seed).shuffle(lines)
    parses_or_parse_error(fmt_name, "\n".join(lines))


@ROBUST
@given(data=st.data())
def test_json_with_a_character_removed_parses_or_names_the_line(data):
    text = json.dumps(SHOWTOPO_JSON, indent=4)
    at = data.draw(st.integers(min_value=0, max_value=len(text) - 1))
    garbled = text[:at] + text[at + 1 :]
    try:
        rocm_smi.parse_json(garbled, "t")
    except ParseError as e:
        try:
            json.loads(garbled)
        except json.JSONDecodeError:
            assert e.line is not None and 1 <= e.line <= garbled.count("\n") + 1


# ---------------------------------------------------------------- --showtopoweight alone

def _weight_only(weights: dict[tuple[int, int], int], n: int) -> str:
    """``rocm-smi --showtopoweight`` as the tool prints it: the weight matrix, nothing else."""
    head = "=" * 23 + " ROCm System Management Interface " + "=" * 23
    rows = [head, "=" * 28 + " Weight between two GPUs " + "=" * 27,
            "       " + "".join(f"GPU{j:<10}" for j in range(n))]
    for i in range(n):
        cells = [0 if i == j else weights[(min(i, j), max(i, j))] for j in range(n)]
        rows.append(f"GPU{i}   " + "".join(f"{c:<13}" for c in cells))
    rows.append("=" * 30 + " End of ROCm SMI Log " + "=" * 29)
    return "\n".join(rows) + "\n"


def test_weight_only_output_of_the_mi210_fixture_is_xgmi():
    full = fixture_path("amd-mi210x4-xgmi-bridge-nps4_rocm-smi-showtopo.txt").read_text()
    weights = {}
    for i, line in enumerate(full.splitlines()[3:7]):  # the weight matrix's rows
        for j, cell in enumerate(line.split()[1:]):
            if i < j:
                weights[(i, j)] = int(cell)
    node = BY_NAME["rocm-smi-showtopo"].parse(_weight_only(weights, 4), "weights.txt")
    assert {(l.kind, l.weight) for l in node.links} == {(LinkKind.XGMI, 15)}


def test_weight_only_pairs_keep_the_weights_order_and_the_planner_follows_them():
    from hetflow.accelerators.enrich import enrich_node
    from hetflow.core.request import PlacementRequest
    from hetflow.core.topology import ClusterSnapshot
    from hetflow.scheduling.planner import plan

    # two xGMI pairs (0-1 direct, 2-3 over two hops), PCIe in one NUMA node, PCIe across sockets
    weights = {(0, 1): 15, (2, 3): 30, (0, 2): 40, (1, 3): 52, (0, 3): 60, (1, 2): 60}
    node = BY_NAME["rocm-smi-showtopo"].parse(_weight_only(weights, 4), "weights.txt")
    kinds = {(l.a, l.b): (l.kind, l.pcie_level) for l in node.links}
    assert kinds[(0, 1)][0] is kinds[(2, 3)][0] is LinkKind.XGMI
    assert [kinds[p][1].name for p in ((0, 2), (1, 3), (0, 3))] == ["PHB", "NODE", "SYS"]
    enriched = enrich_node(node)
    gbps = {p: enriched.bandwidth(*p) for p in weights}
    by_weight = sorted(weights, key=weights.get)
    assert [gbps[p] for p in by_weight] == sorted(gbps.values(), reverse=True)  # lower weight, faster
    assert gbps[(0, 1)] > gbps[(2, 3)] > gbps[(0, 2)] > gbps[(1, 3)] > gbps[(0, 3)]
    pair = plan(ClusterSnapshot(nodes=(enriched,)), PlacementRequest("tp2", count=2))
    assert sorted(r.device for r in pair.devices) == [0, 1]
