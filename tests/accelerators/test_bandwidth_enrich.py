"""Link bandwidth estimates, node enrichment and synthetic nodes from the catalog."""

from __future__ import annotations

import itertools

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hetflow.accelerators.bandwidth import PCIE_LEVEL_FACTOR, estimate_link, xgmi_hops
from hetflow.accelerators.catalog import Catalog, default_catalog
from hetflow.accelerators.enrich import enrich_node, find_spec
from hetflow.accelerators.spec import AcceleratorSpec
from hetflow.accelerators.synthetic import DGX1_CUBE_MESH, synthetic_node
from hetflow.core.errors import InputError
from hetflow.core.topology import Device, Link, LinkKind, NodeTopology, PcieLevel, Vendor

GiB = 1024**3
MiB = 1024**2
CATALOG = default_catalog()
FABRICS = (LinkKind.NVLINK, LinkKind.NVSWITCH, LinkKind.XGMI)
LEVELS_BEST_FIRST = [PcieLevel.PIX, PcieLevel.PXB, PcieLevel.PHB, PcieLevel.NODE, PcieLevel.SYS]


def spec(name: str) -> AcceleratorSpec:
    return CATALOG.lookup(name)


def gbps(link: Link, a: str | None, b: str | None = "same") -> float:
    spec_a = spec(a) if a else None
    spec_b = spec_a if b == "same" else (spec(b) if b else None)
    value = estimate_link(link, spec_a, spec_b).bandwidth_gbps
    assert value is not None
    return value


def pcie(level: PcieLevel | None, model: str | None) -> float:
    return gbps(Link(0, 1, LinkKind.PCIE, pcie_level=level), model)


# ---------------------------------------------------------------- estimates


def test_estimates_rank_fabrics_over_pcie_levels_strictly() -> None:
    chain = [
        gbps(Link(0, 1, LinkKind.NVSWITCH, count=18), "H100-SXM"),
        gbps(Link(0, 1, LinkKind.XGMI, weight=15), "MI300X"),
        *[pcie(level, "MI300X") for level in LEVELS_BEST_FIRST],  # PCIe gen5
    ]
    assert chain == [450.0, 64.0, 63.0, 56.7, 50.4, 44.1, 31.5]
    assert all(x > y for x, y in itertools.pairwise(chain))


def test_nominal_fabric_figures() -> None:
    assert gbps(Link(0, 1, LinkKind.NVSWITCH, count=12), "A100-40GB") == 300.0
    assert gbps(Link(0, 1, LinkKind.NVSWITCH, count=18), "B200") == 900.0  # NVLink5: 50/link
    assert gbps(Link(0, 1, LinkKind.NVSWITCH, count=6), "V100-32GB") == 150.0  # DGX-2, NV6
    assert gbps(Link(0, 1, LinkKind.NVSWITCH), "H100-SXM") == 450.0  # count from the row
    assert gbps(Link(0, 1, LinkKind.NVSWITCH, count=24), "H100-SXM") == 450.0  # capped
    assert gbps(Link(0, 1, LinkKind.NVLINK, count=2), "V100-16GB") == 50.0
    assert gbps(Link(0, 1, LinkKind.XGMI, weight=15), "MI355X") == 76.5
    assert gbps(Link(0, 1, LinkKind.XGMI, weight=15), "MI210") == 50.0


def test_every_fabric_estimate_beats_the_same_hardwares_best_pcie() -> None:
    for row in CATALOG:
        if row.link_kind not in FABRICS:
            continue
        best_pcie = pcie(PcieLevel.PIX, row.name)
        for weight in (None, 13, 15, 30, 41, 45, 60):
            for count in (1, 2, row.links_per_device):
                link = Link(0, 1, row.link_kind, count=count, weight=weight)
                assert gbps(link, row.name) > best_pcie, (row.name, weight, count)


def test_pcie_levels_rank_strictly_for_every_row() -> None:
    for row in CATALOG:
        if row.pcie_gbps is None:
            continue
        values = [pcie(level, row.name) for level in LEVELS_BEST_FIRST]
        assert all(x > y for x, y in itertools.pairwise(values)), row.name
        assert values[0] == row.pcie_gbps
        assert pcie(None, row.name) == values[-1]  # an unreported level counts as SYS


def test_xgmi_hops_from_weight() -> None:
    assert [xgmi_hops(w) for w in (None, 13, 15, 30, 41, 45)] == [1, 1, 1, 2, 3, 3]
    mi250x = [gbps(Link(0, 1, LinkKind.XGMI, weight=w), "MI250X") for w in (15, 30, 45)]
    assert mi250x[0] == 50.0
    assert mi250x[0] > mi250x[1] > mi250x[2] > pcie(PcieLevel.PIX, "MI250X") == 31.5


def test_pcie_uses_the_slower_end() -> None:
    assert pcie(PcieLevel.PIX, "RTX-5090") == 63.0
    mixed = gbps(Link(0, 1, LinkKind.PCIE, pcie_level=PcieLevel.PIX), "RTX-5090", "RTX-4090")
    assert mixed == 31.5


def test_same_package_and_unknown_kinds() -> None:
    assert gbps(Link(0, 1, LinkKind.SAME_PACKAGE), "MI300X") == 819.2
    assert gbps(Link(0, 1, LinkKind.SAME_PACKAGE), "MI250X") == 200.0
    mig = estimate_link(Link(0, 1, LinkKind.SAME_PACKAGE), spec("A100-40GB"), spec("A100-40GB"))
    assert mig.bandwidth_gbps == pcie(PcieLevel.PHB, "A100-40GB")
    assert mig.bandwidth_note.startswith("assumed:")
    assert gbps(Link(0, 1, LinkKind.UNKNOWN), "MI300X") == pcie(PcieLevel.SYS, "MI300X")


def test_unknown_models_use_stated_defaults() -> None:
    nv = estimate_link(Link(0, 1, LinkKind.NVLINK, count=2), None, None)
    assert nv.bandwidth_gbps == 50.0 and nv.bandwidth_note.startswith("assumed:")
    assert "model unknown: 25 GB/s per link" in nv.bandwidth_note
    assert gbps(Link(0, 1, LinkKind.PCIE, pcie_level=PcieLevel.PIX), None, None) == 31.5
    xgmi = estimate_link(Link(0, 1, LinkKind.XGMI), None, None)
    assert xgmi.bandwidth_gbps == 50.0 and "weight not reported: 1 hop" in xgmi.bandwidth_note


def test_notes_say_how_the_estimate_was_made() -> None:
    h100, l40s = spec("H100-SXM"), spec("L40S")
    link = estimate_link(Link(0, 1, LinkKind.NVSWITCH, count=18), h100, h100)
    assert link.bandwidth_note == "catalog: NVLink4 18 x 25 GB/s"
    link = estimate_link(Link(0, 1, LinkKind.PCIE, pcie_level=PcieLevel.PHB), l40s, l40s)
    assert link.bandwidth_note == "catalog: PCIe x16 31.5 GB/s x 0.8 (PHB)"


def test_reported_bandwidths_are_kept() -> None:
    reported = Link(0, 1, LinkKind.XGMI, weight=15, bandwidth_gbps=50.0, bandwidth_note="amd-smi")
    assert estimate_link(reported, spec("MI300X"), spec("MI300X")) == reported
    zero = Link(0, 1, LinkKind.PCIE, pcie_level=PcieLevel.PIX, bandwidth_gbps=0.0, bandwidth_note="")
    assert estimate_link(zero, spec("T4"), spec("T4")) == zero


KINDS_AND_LEVELS = st.sampled_from(
    [(LinkKind.PCIE, level) for level in LEVELS_BEST_FIRST] + [(LinkKind.PCIE, None)]
)


@settings(max_examples=60, deadline=None)
@given(
    a=st.sampled_from(CATALOG.specs),
    b=st.sampled_from(CATALOG.specs),
    count=st.integers(1, 24),
    weight=st.sampled_from([None, 13, 15, 20, 30, 41, 45]),
)
def test_fabric_estimates_are_positive_and_above_pcie_for_any_pair(
    a: AcceleratorSpec, b: AcceleratorSpec, count: int, weight: int | None
) -> None:
    pix = Link(0, 1, LinkKind.PCIE, pcie_level=PcieLevel.PIX)
    best_pcie = estimate_link(pix, a, b).bandwidth_gbps
    for kind in FABRICS:
        fabric = estimate_link(Link(0, 1, kind, count=count, weight=weight), a, b)
        assert fabric.bandwidth_gbps > best_pcie > 0
        assert fabric.bandwidth_note.startswith(("catalog: ", "assumed: "))
    levels = [
        estimate_link(Link(0, 1, LinkKind.PCIE, pcie_level=lv), a, b).bandwidth_gbps
        for lv in LEVELS_BEST_FIRST
    ]
    assert all(x > y for x, y in itertools.pairwise(levels))
    more_hops = estimate_link(Link(0, 1, LinkKind.XGMI, count=count, weight=45), a, b)
    one_hop = estimate_link(Link(0, 1, LinkKind.XGMI, count=count, weight=15), a, b)
    assert one_hop.bandwidth_gbps > more_hops.bandwidth_gbps


def test_level_factor_table_is_strictly_ordered() -> None:
    factors = [PCIE_LEVEL_FACTOR[level] for level in LEVELS_BEST_FIRST]
    assert factors == sorted(factors, reverse=True) and len(set(factors)) == len(factors)


# ---------------------------------------------------------------- enrichment


def _mixed_node() -> NodeTopology:
    """Hand-built: two CPX partitions of one MI300X, a whole MI300X known only by PCI id, an
    A100 with reported memory, an unknown Radeon, and the host CPU. Pair (2, 3) is not linked."""
    devices = (
        Device(0, Vendor.AMD, name="AMD Instinct MI300X", partition="CPX", package=0),
        Device(1, Vendor.AMD, name="AMD Instinct MI300X", partition="CPX", package=0),
        Device(2, Vendor.AMD, device_id="0x74a1", memory_bytes=191 * GiB),
        Device(3, Vendor.NVIDIA, name="NVIDIA A100-SXM4-40GB", memory_bytes=40960 * MiB,
               arch="sm_80"),
        Device(4, Vendor.AMD, name="Radeon RX 7900 XT", device_id="0x744c"),
        Device(5, Vendor.CPU, name="AMD EPYC 9474F 48-Core Processor"),
    )
    links = (
        Link(0, 1, LinkKind.SAME_PACKAGE),
        Link(0, 2, LinkKind.XGMI, weight=41),
        Link(1, 2, LinkKind.XGMI, weight=41, bandwidth_gbps=12.5, bandwidth_note="measured"),
        Link(2, 4, LinkKind.PCIE, pcie_level=PcieLevel.SYS),
        Link(3, 4, LinkKind.UNKNOWN),
    )
    return NodeTopology(name="mixed", devices=devices, links=links)


def test_enrich_fills_models_arch_and_memory() -> None:
    node = enrich_node(_mixed_node())
    d = {dev.index: dev for dev in node.devices}
    models = [d[i].model for i in range(6)]
    assert models == ["MI300X", "MI300X", "MI300X", "A100-40GB", None, "CPU"]
    assert d[0].memory_bytes == d[1].memory_bytes == 24 * GiB  # 192 GiB / 8 CPX partitions
    assert d[0].compute_units is None  # a partition's CUs are not the package's
    assert d[2].memory_bytes == 191 * GiB  # reported, kept
    assert d[2].arch == "gfx942" and d[2].compute_units == 304
    assert d[3].memory_bytes == 40960 * MiB and d[3].arch == "sm_80"
    assert d[4] == _mixed_node().devices[4]  # unknown model: untouched
    assert d[5].memory_bytes is None  # the CPU row has no device memory


def test_enrich_estimates_links_but_never_invents_them() -> None:
    before = _mixed_node()
    node = enrich_node(before)
    assert [(l.a, l.b, l.kind) for l in node.links] == [(l.a, l.b, l.kind) for l in before.links]
    assert node.link(2, 3) is None and node.bandwidth(2, 3) == 0.0
    assert node.link(0, 1).bandwidth_gbps == 819.2
    assert node.link(1, 2) == before.link(1, 2)  # reported, kept
    assert node.link(0, 2).bandwidth_gbps > 63.0  # xGMI over 3 hops still beats PCIe5
    assert node.link(2, 4).bandwidth_note.startswith("assumed:")  # one end unknown
    for link in node.links:
        assert link.bandwidth_gbps is not None and link.bandwidth_gbps > 0


def test_enrich_is_idempotent() -> None:
    once = enrich_node(_mixed_node())
    assert enrich_node(once) == once


@pytest.mark.parametrize(
    ("device", "expected"),
    [
        (Device(0, Vendor.NVIDIA, name="NVIDIA A100-PCIE-40GB"), "A100-40GB"),
        (Device(0, Vendor.NVIDIA, name="A100", memory_bytes=81559 * MiB), "A100-80GB"),
        (Device(0, Vendor.NVIDIA, device_id="0x20b2"), "A100-80GB"),
        (Device(0, Vendor.AMD, name="AMD Instinct MI250X/MI250", compute_units=104), "MI250"),
        (Device(0, Vendor.AMD, model="mi325x"), "MI325X"),
        (Device(0, Vendor.AMD, name="A10"), None),  # an NVIDIA row never matches an AMD device
        (Device(0, Vendor.AMD, name="Raphael", device_id="0x164e"), None),
    ],
)
def test_find_spec_for_devices(device: Device, expected: str | None) -> None:
    found = find_spec(device, CATALOG)
    assert (found.name if found else None) == expected


def test_enrich_partition_modes_divide_package_memory() -> None:
    devices = tuple(Device(i, Vendor.AMD, device_id="0x74a2", partition="CPX", package=i // 4)
                    for i in range(8))
    node = enrich_node(NodeTopology(name="mi308x", devices=devices))
    assert {d.memory_bytes for d in node.devices} == {48 * GiB}  # MI308X: 192 GiB / 4 (KFD)
    dpx = Device(0, Vendor.AMD, model="MI300X", partition="DPX")
    assert enrich_node(NodeTopology(name="d", devices=(dpx,))).devices[0].memory_bytes == 96 * GiB
    mig = Device(0, Vendor.NVIDIA, model="H100", partition="MIG 1g.10gb")
    # MIG instance sizes differ; the tool must report them
    assert enrich_node(NodeTopology(name="m", devices=(mig,))).devices[0].memory_bytes is None


# ---------------------------------------------------------------- synthetic nodes


def _shorthand(row: AcceleratorSpec) -> tuple[str, int]:
    if row.link_kind is None:
        return row.name.lower(), 1
    return f"8x {row.name}", 8


@pytest.mark.parametrize("row", CATALOG.specs, ids=lambda r: r.name)
def test_synthetic_node_for_every_row(row: AcceleratorSpec) -> None:
    text, count = _shorthand(row)
    node = synthetic_node(text, "n0")
    assert node.name == "n0" and len(node.devices) == count
    assert all(d.model == row.name and d.vendor is row.vendor for d in node.devices)
    assert all(d.memory_bytes == row.memory_bytes and d.arch == row.arch for d in node.devices)
    pairs = list(node.pairs())
    assert len(node.links) == len(pairs) == count * (count - 1) // 2  # complete
    assert all(node.link(a, b) is not None for a, b in pairs)
    assert all(l.bandwidth_gbps and l.bandwidth_gbps > 0 for l in node.links)
    assert all(l.bandwidth_note.startswith("catalog: ") for l in node.links)
    if count == 8:
        assert [d.numa_node for d in node.devices] == [0] * 4 + [1] * 4 and node.numa_nodes == 2


def test_synthetic_mi300x_box_is_xgmi_all_to_all() -> None:
    node = synthetic_node("8x MI300X", "mi")
    assert {(l.kind, l.weight, l.bandwidth_gbps) for l in node.links} == {(LinkKind.XGMI, 15, 64.0)}
    assert len(node.links) == 28 and node.devices[0].memory_bytes == 192 * GiB


def test_synthetic_h100_box_is_nvswitch_18() -> None:
    node = synthetic_node("8x H100", "h")
    kinds = {(l.kind, l.count, l.bandwidth_gbps) for l in node.links}
    assert kinds == {(LinkKind.NVSWITCH, 18, 450.0)}


def test_synthetic_v100_boxes() -> None:
    four = synthetic_node("4x V100", "v4")
    assert {(l.kind, l.count, l.bandwidth_gbps) for l in four.links} == {(LinkKind.NVLINK, 2, 50.0)}
    assert {d.model for d in four.devices} == {"V100-16GB"}
    eight = synthetic_node("8x V100-32GB", "v8")
    per_gpu = {i: 0 for i in range(8)}
    for link in eight.links:
        if link.kind is LinkKind.NVLINK:
            per_gpu[link.a] += link.count
            per_gpu[link.b] += link.count
        else:  # the cube-mesh leaves only cross-quad pairs to PCIe
            assert link.kind is LinkKind.PCIE and link.pcie_level is PcieLevel.SYS
            assert eight.device(link.a).numa_node != eight.device(link.b).numa_node
    assert per_gpu == {i: 6 for i in range(8)}
    assert len(DGX1_CUBE_MESH) == 16


def test_synthetic_pcie_and_packaged_boxes() -> None:
    two = synthetic_node("2 x L40S", "l")
    assert len(two.devices) == 2 and two.numa_nodes == 1
    assert [(l.kind, l.pcie_level) for l in two.links] == [(LinkKind.PCIE, PcieLevel.PHB)]
    rtx = synthetic_node("8x RTX 4090", "r")
    numa = {d.index: d.numa_node for d in rtx.devices}
    levels = {(numa[l.a] == numa[l.b], l.pcie_level) for l in rtx.links}
    assert levels == {(True, PcieLevel.PHB), (False, PcieLevel.SYS)}
    gcds = synthetic_node("8x MI250X", "f")
    same = [l for l in gcds.links if l.kind is LinkKind.SAME_PACKAGE]
    assert [(l.a, l.b) for l in same] == [(0, 1), (2, 3), (4, 5), (6, 7)]
    assert {l.bandwidth_gbps for l in same} == {200.0}
    assert [d.package for d in gcds.devices] == [0, 0, 1, 1, 2, 2, 3, 3]


def test_synthetic_cpu_node() -> None:
    node = synthetic_node("cpu", "laptop")
    assert [(d.index, d.vendor, d.model) for d in node.devices] == [(0, Vendor.CPU, "CPU")]
    assert node.links == () and node.accelerators == ()


@pytest.mark.parametrize(
    "text", ["8x MI300X", "8X mi300x", "8 x MI300X", "8*MI300X", " 8xAMD-Instinct-MI300X-OAM "]
)
def test_synthetic_shorthand_spellings(text: str) -> None:
    node = synthetic_node(text, "n")
    assert len(node.devices) == 8 and {d.model for d in node.devices} == {"MI300X"}


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("8x MI300", r"COUNT x MODEL, e.g. '8x MI300X'.*did you mean 'MI300X'"),
        ("eight MI300X", r"COUNT x MODEL"),
        ("", r"COUNT x MODEL"),
        ("0x MI300X", r"COUNT must be between 1 and 64"),
        ("65x H100", r"COUNT must be between 1 and 64"),
        ("3x MI250X", r"come 2 per package.*multiple of 2"),
        ("2x cpu", r"has one device"),
        ("16x V100", r"8 GPUs \(DGX-1 cube-mesh\) or up to 7"),
    ],
)
def test_bad_shorthand_explains_the_form(text: str, message: str) -> None:
    with pytest.raises(InputError, match=message):
        synthetic_node(text, "n")


def test_synthetic_with_a_given_catalog() -> None:
    small = Catalog([spec("T4")], source="test")
    node = synthetic_node("4x T4", "t", catalog=small)
    assert len(node.links) == 6
    with pytest.raises(InputError, match="unknown accelerator 'MI300X'"):
        synthetic_node("8x MI300X", "n", catalog=small)
