"""The amd-smi / rocminfo / rocm-bandwidth-test parsers against real recorded outputs.

Run: .venv/bin/python -m pytest -q tests/accelerators/test_recorded_amd_smi.py
"""

from __future__ import annotations

import random

import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from hetflow.accelerators.recorded import amd_smi
from hetflow.accelerators.recorded.amd_smi import FORMATS
from hetflow.core.pci import normalize_pci_bus_id
from hetflow.core.errors import ParseError
from hetflow.core.topology import LinkKind, NodeTopology, Vendor

from tests.conftest import FIXTURES, fixture_path

MI300X_TOPOLOGY = "amd-mi300x-oam8_amd-smi-topology.txt"
MI300X_XGMI = "amd-mi300x-oam8_amd-smi-xgmi.txt"
MI250X_HOPS_ROW0 = "amd-mi250x-frontier-class-adastra_amd-smi-topology_EXCERPT-hops-row0.txt"
JSON_V1 = "amd-2gpu-pcie_amd-smi-topology-json_OLDFORMAT-rocm6.1.json"
JSON_V2 = "amd-2gpu-pcie_amd-smi-topology-a-t-json_NEWFORMAT-rocm6.2.json"
ROCMINFO = "amd-mi300x-x4-sriov-vm_rocminfo.txt"
BANDWIDTH_TEST = "amd-mi210x4-xgmi-bridge-nps4_rocm-bandwidth-test.txt"

MY_FIXTURES = {
    MI300X_TOPOLOGY: "amd-smi-topology",
    MI250X_HOPS_ROW0: "amd-smi-topology",
    JSON_V1: "amd-smi-topology-json-v1",
    JSON_V2: "amd-smi-topology-json-v2",
    MI300X_XGMI: "amd-smi-xgmi",
    ROCMINFO: "rocminfo",
    BANDWIDTH_TEST: "rocm-bandwidth-test",
}
MI300X_BUS_IDS = [
    "0000:0c:00.0", "0000:22:00.0", "0000:38:00.0", "0000:5c:00.0",
    "0000:9f:00.0", "0000:af:00.0", "0000:bf:00.0", "0000:df:00.0",
]
FORMAT = {f.name: f for f in FORMATS}


def read(name: str) -> str:
    return fixture_path(name).read_text()


def parse(name: str) -> NodeTopology:
    return FORMAT[MY_FIXTURES[name]].parse(read(name), name)


def other_text_fixtures() -> list[str]:
    """Every recorded text output that none of these parsers should claim."""
    names = []
    for path in sorted(FIXTURES.iterdir()):
        if path.name in MY_FIXTURES or path.suffix == ".md" or path.name.endswith(".tar.gz"):
            continue
        names.append(path.name)
    return names


# ---------------------------------------------------------------------------------- sniffing


@pytest.mark.parametrize("name", sorted(MY_FIXTURES))
def test_sniff_picks_exactly_its_format(name: str) -> None:
    text = read(name)
    assert [f.name for f in FORMATS if f.sniff(text)] == [MY_FIXTURES[name]]


@pytest.mark.parametrize("name", other_text_fixtures())
def test_sniff_claims_no_rocm_smi_or_nvidia_output(name: str) -> None:
    text = read(name)
    assert [f.name for f in FORMATS if f.sniff(text)] == []


def test_other_fixtures_include_rocm_smi_and_nvidia_smi() -> None:
    others = other_text_fixtures()
    assert any("rocm-smi" in n for n in others) and any("nvidia-smi" in n for n in others)


# ------------------------------------------------------------------------- amd-smi topology


def test_mi300x_topology_eight_gpus_all_pairs_xgmi() -> None:
    node = parse(MI300X_TOPOLOGY)
    assert node.name == "node0" and node.sources == (MI300X_TOPOLOGY,)
    assert [d.pci_bus_id for d in node.devices] == MI300X_BUS_IDS
    assert [d.index for d in node.devices] == list(range(8))
    assert all(d.vendor is Vendor.AMD for d in node.devices)
    assert len(node.links) == 28
    assert {(l.a, l.b) for l in node.links} == set(node.pairs())
    for link in node.links:
        assert (link.kind, link.weight, link.hops) == (LinkKind.XGMI, 15, 1)
        assert link.bandwidth_gbps == 50.0  # NUMA BW 50000-50000 MB/s, max
        assert link.bandwidth_note == "reported by amd-smi (max)"


def test_mi250x_hops_excerpt_keeps_what_it_shows() -> None:
    node = parse(MI250X_HOPS_ROW0)
    assert [d.pci_bus_id for d in node.devices] == [
        "0000:c1:00.0", "0000:c6:00.0", "0000:c9:00.0", "0000:ce:00.0",
        "0000:d1:00.0", "0000:d6:00.0", "0000:d9:00.0", "0000:de:00.0",
    ]
    # Only row 0 is shown: links from GPU 0 to the 7 others, hops 1, kind not shown.
    assert [(l.a, l.b) for l in node.links] == [(0, b) for b in range(1, 8)]
    for link in node.links:
        assert (link.kind, link.hops, link.weight, link.bandwidth_gbps) == (
            LinkKind.UNKNOWN, 1, None, None,
        )


def test_topology_pcie_type_gives_no_bandwidth_even_with_numa_bw() -> None:
    text = (
        "LINK TYPE TABLE:\n"
        "             0000:08:00.0 0000:44:00.0\n"
        "0000:08:00.0 SELF         PCIE\n"
        "0000:44:00.0 PCIE         SELF\n\n"
        "NUMA BW TABLE:\n"
        "             0000:08:00.0 0000:44:00.0\n"
        "0000:08:00.0 N/A          0-64000\n"
        "0000:44:00.0 0-64000      N/A\n"
    )
    (link,) = amd_smi.parse_amd_smi_topology(text, "t").links
    assert (link.kind, link.bandwidth_gbps) == (LinkKind.PCIE, None)


@pytest.mark.parametrize(
    ("text", "line"),
    [
        ("nothing here\n", None),
        ("WEIGHT TABLE:\nnot-a-bdf 0000:08:00.0\n", 2),
        ("WEIGHT TABLE:\n 0000:08:00.0 0000:44:00.0\n0000:08:00.0 0 40\n0000:44:00.0 40\n", 4),
        ("WEIGHT TABLE:\n 0000:08:00.0 0000:44:00.0\n0000:08:00.0 0 forty\n", 3),
        ("WEIGHT TABLE:\n 0000:08:00.0 0000:44:00.0\n0000:99:00.0 0 40\n", 3),
        ("HOPS TABLE:\n 0000:08:00.0\n0000:08:00.0 0\n\nWEIGHT TABLE:\n 0000:09:00.0\n", 6),
        ("NUMA BW TABLE:\n 0000:08:00.0 0000:44:00.0\n0000:08:00.0 N/A 50000\n", 3),
    ],
    ids=["no-table", "bad-header", "short-row", "bad-weight", "unknown-row", "headers-differ",
         "bad-numa-bw"],
)
def test_topology_malformed_raises_with_line(text: str, line: int | None) -> None:
    with pytest.raises(ParseError) as caught:
        amd_smi.parse_amd_smi_topology(text, "bad.txt")
    assert caught.value.source == "bad.txt" and caught.value.line == line


# --------------------------------------------------------------------- amd-smi topology JSON


def test_json_v1_two_gpus_over_pcie_link_kept_though_disabled() -> None:
    node = parse(JSON_V1)
    assert [d.index for d in node.devices] == [0, 1]
    assert all(d.pci_bus_id is None for d in node.devices)  # the old schema has no bdf
    (link,) = node.links
    assert (link.a, link.b, link.kind, link.weight, link.hops) == (0, 1, LinkKind.PCIE, 40, 2)
    assert link.bandwidth_gbps is None  # numa_bandwidth N/A


def test_json_v2_two_gpus_with_bus_ids_over_pcie() -> None:
    node = parse(JSON_V2)
    assert [(d.index, d.pci_bus_id) for d in node.devices] == [
        (0, "0000:08:00.0"), (1, "0000:44:00.0"),
    ]
    (link,) = node.links
    assert (link.a, link.b, link.kind) == (0, 1, LinkKind.PCIE)


def test_json_v2_optional_weight_hops_bandwidth_are_read() -> None:
    text = """[{"gpu": 0, "bdf": "0000:0C:00.0", "links": [
                 {"gpu": 1, "bdf": "0000:22:00.0", "link_status": "ENABLED", "link_type": "XGMI",
                  "weight": 15, "num_hops": 1, "bandwidth": "50000-50000"}]}]"""
    node = amd_smi.parse_amd_smi_topology_json_v2(text, "t.json")
    assert [d.pci_bus_id for d in node.devices] == ["0000:0c:00.0", "0000:22:00.0"]
    (link,) = node.links
    assert (link.kind, link.weight, link.hops, link.bandwidth_gbps) == (LinkKind.XGMI, 15, 1, 50.0)


@pytest.mark.parametrize(
    "text",
    [
        "[",
        "{}",
        "[]",
        '[{"gpu": "zero"}]',
        '[{"gpu": 0, "weight": {"gpu_one": 40}}]',
        '[{"gpu": 0, "weight": [40]}]',
        '[{"gpu": 0, "hops": {"gpu_1": "two"}}]',
        '[{"gpu": 0, "link_type": {"gpu_1": 7}}]',
    ],
)
def test_json_v1_malformed_raises(text: str) -> None:
    with pytest.raises(ParseError):
        amd_smi.parse_amd_smi_topology_json_v1(text, "bad.json")


@pytest.mark.parametrize(
    "text",
    [
        '[{"gpu": 0, "bdf": "0000:08:00.0"}]',
        '[{"gpu": 0, "bdf": "nope", "links": []}]',
        '[{"gpu": 0, "links": [{"gpu": 1, "link_status": "MAYBE", "link_type": "PCIE"}]}]',
        '[{"gpu": 0, "bdf": "0000:08:00.0", "links": []}, {"gpu": 0, "bdf": "0000:09:00.0", "links": []}]',
        '[{"gpu": 0, "bdf": "0000:08:00.0", "links": []}, {"gpu": 1, "bdf": "0000:08:00.0", "links": []}]',
    ],
    ids=["no-links", "bad-bdf", "bad-status", "index-two-bdfs", "bdf-two-indices"],
)
def test_json_v2_malformed_raises(text: str) -> None:
    with pytest.raises(ParseError):
        amd_smi.parse_amd_smi_topology_json_v2(text, "bad.json")


# ---------------------------------------------------------------------------- amd-smi xgmi


def test_xgmi_eight_gpus_all_pairs_at_64_gbytes() -> None:
    node = parse(MI300X_XGMI)
    assert [(d.index, d.pci_bus_id) for d in node.devices] == list(enumerate(MI300X_BUS_IDS))
    assert len(node.links) == 28
    for link in node.links:
        assert link.kind is LinkKind.XGMI
        assert link.bandwidth_gbps == 64.0  # 512 Gb/s per link per direction
        assert link.bandwidth_note == "reported by amd-smi xgmi"


def test_xgmi_and_topology_agree_on_bus_ids() -> None:
    assert [d.pci_bus_id for d in parse(MI300X_XGMI).devices] == [
        d.pci_bus_id for d in parse(MI300X_TOPOLOGY).devices
    ]


@pytest.mark.parametrize(
    "text",
    [
        "LINK METRIC TABLE:\n",
        "LINK METRIC TABLE:\n bdf bit_rate max_bandwidth link_type\nGPU0 0000:0c:00.0 32 Gb/s\n",
        "LINK METRIC TABLE:\n bdf bit_rate max_bandwidth link_type\nGPU0 0000:0c:00.0 32 Gb/s fast XGMI\n",
        "LINK METRIC TABLE:\n bdf\nGPU0 zz:0c:00.0 32 Gb/s 512 Gb/s XGMI\n",
    ],
    ids=["empty", "short-row", "bad-rate", "bad-bdf"],
)
def test_xgmi_malformed_raises(text: str) -> None:
    with pytest.raises(ParseError):
        amd_smi.parse_amd_smi_xgmi(text, "bad.txt")


# -------------------------------------------------------------------------------- rocminfo


def test_rocminfo_four_mi300x_and_two_cpu_agents() -> None:
    node = parse(ROCMINFO)
    assert len(node.devices) == 4 and node.links == ()
    for device in node.devices:
        assert device.name == "AMD Instinct MI300X"
        assert (device.arch, device.device_id, device.compute_units) == ("gfx942", "0x74a1", 304)
    assert [d.uuid for d in node.devices] == [
        "GPU-8d1457e2c20f59d2", "GPU-b4fa34630e85d42a", "GPU-e8986800e182538a",
        "GPU-eff71edc82169115",
    ]
    # BDFID 9728 = 0x2600: the same bus ids rocm-smi -a prints for this VM.
    assert [d.pci_bus_id for d in node.devices] == [
        "0000:26:00.0", "0000:46:00.0", "0000:65:00.0", "0000:85:00.0",
    ]
    assert node.numa_nodes == 2 and node.cpu_cores == 192  # 2 CPU agents x 96


def test_rocminfo_without_agents_raises() -> None:
    with pytest.raises(ParseError):
        amd_smi.parse_rocminfo("HSA Agents\n==========\n", "r.txt")


def test_rocminfo_cpu_only_machine_is_a_node_without_devices() -> None:
    text = "HSA Agents\n*******\nAgent 1\n*******\n  Name:  EPYC\n  Device Type:  CPU\n  Compute Unit:  16\n"
    node = amd_smi.parse_rocminfo(text, "r.txt")
    assert (node.devices, node.numa_nodes, node.cpu_cores) == ((), 1, 16)


# ---------------------------------------------------------------------- rocm-bandwidth-test


def test_bandwidth_test_four_mi210_on_xgmi() -> None:
    node = parse(BANDWIDTH_TEST)
    assert [(d.index, d.pci_bus_id, d.uuid) for d in node.devices] == [
        (0, "0000:c9:00.0", "GPU-ab43b63dec8adaf3"),
        (1, "0000:87:00.0", "GPU-0b953cf8e6d4184a"),
        (2, "0000:49:00.0", "GPU-b0266df54d0dd2e1"),
        (3, "0000:09:00.0", "GPU-790a09bfbf673859"),
    ]
    # NPS4: one GPU per NUMA node, at distance 20 from its own CPU device.
    assert [d.numa_node for d in node.devices] == [0, 1, 2, 3]
    assert node.numa_nodes == 4
    assert len(node.links) == 6
    for link in node.links:
        assert (link.kind, link.weight) == (LinkKind.XGMI, 15)
        assert 42.0 < link.bandwidth_gbps < 42.4  # type: ignore[operator]
        assert link.bandwidth_note == "measured by rocm-bandwidth-test (unidirectional)"
    # Devices 4 -> 5 measured 42.239, 5 -> 4 measured 42.243: the slower direction.
    assert node.link(0, 1).bandwidth_gbps == 42.239  # type: ignore[union-attr]


def test_bandwidth_test_topology_only_run_has_weights_but_no_bandwidth() -> None:
    text = read(BANDWIDTH_TEST).split("Unidirectional copy peak")[0]
    node = amd_smi.parse_rocm_bandwidth_test(text, "rbt.txt")
    assert len(node.links) == 6
    assert all(l.bandwidth_gbps is None and l.kind is LinkKind.XGMI for l in node.links)


@pytest.mark.parametrize(
    ("weight", "kind"),
    [(15, LinkKind.XGMI), (30, LinkKind.XGMI), (45, LinkKind.XGMI), (40, LinkKind.PCIE),
     (52, LinkKind.PCIE), (60, LinkKind.PCIE), (20, LinkKind.PCIE), (None, LinkKind.UNKNOWN)],
)
def test_bandwidth_test_kind_from_kfd_weight(weight: int | None, kind: LinkKind) -> None:
    assert amd_smi._rbt_kind(weight) is kind


def test_bandwidth_test_ragged_row_raises_with_line() -> None:
    text = "Device: 0,  CPU\nDevice: 1,  ,  GPU-01,  03:0.0\n\nInter-Device Numa Distance\n\nD/D 0 1\n\n0 0\n"
    with pytest.raises(ParseError) as caught:
        amd_smi.parse_rocm_bandwidth_test(text, "rbt.txt")
    assert caught.value.line == 8


# ---------------------------------------------------------------------------------- helpers


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("0000:0C:00.0", "0000:0c:00.0"),
        ("c9:0.0", "0000:c9:00.0"),
        ("00000001:c9:00.3", "0001:c9:00.3"),
        ("0000:c9:00.8", None),
        ("GPU0", None),
        ("0000:c9:40.0", None),
    ],
)
def test_normalise_bus_id(text: str, expected: str | None) -> None:
    assert normalize_pci_bus_id(text) == expected


# ------------------------------------------------------------------------- robustness (fuzz)

_FUZZ = settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def _parse_or_parse_error(fmt_name: str, text: str) -> None:
    """The parser contract: a NodeTopology or a ParseError, nothing else; sniff never raises."""
    fmt = FORMAT[fmt_name]
    assert isinstance(fmt.sniff(text), bool)
    try:
        node = fmt.parse(text, "fuzz")
    except ParseError as err:
        assert err.source.startswith("fuzz")
        return
    assert isinstance(node, NodeTopology)
    assert all(l.a < l.b for l in node.links)


_SAMPLE = {fmt: name for name, fmt in MY_FIXTURES.items() if name != MI250X_HOPS_ROW0}


@pytest.mark.parametrize("fmt_name", sorted(_SAMPLE))
@_FUZZ
@given(text=st.text(alphabet=st.characters(codec="utf-8"), max_size=400))
def test_fuzz_random_text(fmt_name: str, text: str) -> None:
    _parse_or_parse_error(fmt_name, text)


@pytest.mark.parametrize("fmt_name", sorted(_SAMPLE))
@_FUZZ
@given(cut=st.floats(min_value=0.0, max_value=1.0), seed=st.integers(0, 2**32 - 1),
       mode=st.sampled_from(["truncate", "shuffle", "drop", "mangle"]))
def test_fuzz_damaged_real_fixture(fmt_name: str, cut: float, seed: int, mode: str) -> None:
    text = read(_SAMPLE[fmt_name])
    rng = random.Random(seed)
    lines = text.splitlines(keepends=True)
    if mode == "truncate":
        damaged = text[: int(len(text) * cut)]
    elif mode == "shuffle":
        rng.shuffle(lines)
        damaged = "".join(lines)
    elif mode == "drop":
        damaged = "".join(l for l in lines if rng.random() > cut)
    else:  # replace one character by a random one
        pos = int((len(text) - 1) * cut)
        damaged = text[:pos] + rng.choice("0x:-. ,\n{}[]\"N/A9") + text[pos + 1 :]
    _parse_or_parse_error(fmt_name, damaged)
