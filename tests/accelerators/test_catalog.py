"""The accelerator catalog: the data file, name canonicalisation, strict loading."""

from __future__ import annotations

import csv
import fnmatch
import re
import tomllib
from importlib import resources
from pathlib import Path

import pytest
import yaml

from hetflow.accelerators.catalog import (
    SCHEMA,
    Catalog,
    canonical_key,
    default_catalog,
    load_catalog,
)
from hetflow.core.errors import InputError, ParseError
from hetflow.core.topology import LinkKind, Vendor
from tests.conftest import REPO, TRACES, fixture_path

GiB = 1024**3
MiB = 1024**2

# The models the catalog must carry (canonical names).
EXPECTED_MODELS = {
    "MI210", "MI250", "MI250X", "MI300X", "MI308X", "MI325X", "MI355X",
    "K80", "P100", "T4", "V100-16GB", "V100-32GB", "A100-40GB", "A100-80GB",
    "H100-SXM", "H100-PCIE", "H200", "B200", "L4", "L40S", "A10", "RTX-4090", "RTX-5090", "CPU",
}


@pytest.fixture(scope="module")
def catalog() -> Catalog:
    return default_catalog()


def _packaged_rows() -> dict:
    text = resources.files("hetflow.accelerators").joinpath("data/catalog.yaml").read_text()
    return yaml.safe_load(text)


def _write(tmp_path: Path, data: dict) -> Path:
    path = tmp_path / "catalog.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


# ---------------------------------------------------------------- the shipped data


def test_catalog_has_every_expected_model(catalog: Catalog) -> None:
    assert set(catalog.names) == EXPECTED_MODELS
    assert len(catalog.specs) == len(EXPECTED_MODELS)


def test_load_catalog_without_path_is_the_cached_default() -> None:
    assert load_catalog() is default_catalog()


def test_package_data_glob_in_pyproject_covers_the_catalog_file() -> None:
    pyproject = tomllib.loads((REPO / "pyproject.toml").read_text())
    globs = pyproject["tool"]["setuptools"]["package-data"]["hetflow"]
    assert any(fnmatch.fnmatch("accelerators/data/catalog.yaml", g) for g in globs)
    assert resources.files("hetflow.accelerators").joinpath("data/catalog.yaml").is_file()


def test_catalog_file_is_versioned() -> None:
    assert _packaged_rows()["schema"] == SCHEMA == "hetflow.catalog/v1"


def test_every_row_cites_a_source(catalog: Catalog) -> None:
    for spec in catalog:
        assert len(spec.source) > 20, spec.name
        # a vendor page, a document or a named fixture/reference, not an empty gesture
        assert re.search(r"https?://|fixture|BANDWIDTH\.md|assumption", spec.source), spec.name


def test_every_accelerator_row_is_complete(catalog: Catalog) -> None:
    for spec in catalog:
        if spec.vendor is Vendor.CPU:
            continue
        for field in ("memory_bytes", "arch", "fp32_tflops", "memory_bandwidth_gbps",
                      "link_kind", "pcie_gbps", "compute_units"):
            assert getattr(spec, field) is not None, (spec.name, field)
        assert spec.aliases, spec.name
        if spec.link_kind in (LinkKind.NVLINK, LinkKind.NVSWITCH, LinkKind.XGMI):
            assert spec.link_generation and spec.link_gbps_per_link and spec.links_per_device
        if spec.devices_per_package > 1:
            assert spec.same_package_gbps, spec.name


def test_architectures_match_vendor(catalog: Catalog) -> None:
    for spec in catalog:
        if spec.vendor is Vendor.AMD:
            assert re.fullmatch(r"gfx9[0-9a-f]{2}", spec.arch or ""), spec.name
        elif spec.vendor is Vendor.NVIDIA:
            assert re.fullmatch(r"sm_\d{2,3}", spec.arch or ""), spec.name


# Per-link figures and PCIe x16 rates from tests/fixtures/topology/BANDWIDTH.md.
LINK_GBPS_BY_GENERATION = {"NVLink2": 25.0, "NVLink3": 25.0, "NVLink4": 25.0, "NVLink5": 50.0}
XGMI_GBPS_BY_MODEL = {"MI210": 50.0, "MI250": 50.0, "MI250X": 50.0, "MI300X": 64.0,
                      "MI308X": 64.0, "MI325X": 64.0, "MI355X": 76.5}
PCIE_X16_GBPS = {15.75, 31.5, 63.0}


def test_link_figures_follow_the_bandwidth_reference(catalog: Catalog) -> None:
    for spec in catalog:
        if spec.link_generation in LINK_GBPS_BY_GENERATION:
            assert spec.link_gbps_per_link == LINK_GBPS_BY_GENERATION[spec.link_generation]
        if spec.link_kind is LinkKind.XGMI:
            assert spec.link_gbps_per_link == XGMI_GBPS_BY_MODEL[spec.name]
        if spec.pcie_gbps is not None:
            assert spec.pcie_gbps in PCIE_X16_GBPS, spec.name
    assert catalog.lookup("H100-SXM").links_per_device == 18
    assert catalog.lookup("A100-40GB").links_per_device == 12
    assert catalog.lookup("V100-32GB").links_per_device == 6
    assert catalog.lookup("MI300X").links_per_device == 7


def test_devices_are_what_the_runtime_enumerates(catalog: Catalog) -> None:
    mi250x = catalog.lookup("MI250X")
    assert mi250x.memory_bytes == 64 * GiB and mi250x.devices_per_package == 2
    assert catalog.lookup("MI250").memory_bytes == 64 * GiB
    k80 = catalog.lookup("K80")
    assert k80.memory_bytes == 12 * GiB and k80.devices_per_package == 2
    assert catalog.lookup("MI300X").memory_bytes == 192 * GiB
    assert catalog.lookup("MI300X").partitions == 8
    assert catalog.lookup("MI308X").partitions == 4


# ---------------------------------------------------------------- canonicalisation

CANONICAL = [
    ("mi300x", "MI300X"),
    ("MI300X", "MI300X"),
    ("AMD Instinct MI300X", "MI300X"),
    ("AMD-Instinct-MI300X-OAM", "MI300X"),
    ("amd instinct mi300x oam", "MI300X"),
    ("0x74a1", "MI300X"),
    ("0x74A1", "MI300X"),
    ("0x74a2", "MI308X"),
    ("AMD-Instinct-MI308X-OAM", "MI308X"),
    ("0x740f", "MI210"),
    ("AMD Instinct MI210", "MI210"),
    ("0x7408", "MI250X"),
    ("0x740c", "MI250X"),  # shared by MI250X and MI250: the listed default
    ("AMD Instinct MI250X/MI250", "MI250X"),
    ("AMD-Instinct-MI250X-MI250", "MI250X"),
    ("AMD Instinct MI250", "MI250"),
    ("0x74a5", "MI325X"),
    ("AMD-Instinct-MI325X-OAM", "MI325X"),
    ("0x75a3", "MI355X"),
    ("mi355x", "MI355X"),
    ("H100 80GB HBM3", "H100-SXM"),
    ("NVIDIA H100 80GB HBM3", "H100-SXM"),
    ("nvidia h100", "H100-SXM"),
    ("H100", "H100-SXM"),
    ("0x2330", "H100-SXM"),
    ("0x233010DE", "H100-SXM"),  # NVML pciDeviceId: device << 16 | vendor
    ("NVIDIA H100 PCIe", "H100-PCIE"),
    ("a100-sxm4-40gb", "A100-40GB"),
    ("NVIDIA A100-SXM4-40GB", "A100-40GB"),
    ("A100-40G", "A100-40GB"),
    ("NVIDIA A100 80GB PCIe", "A100-80GB"),
    ("A100-80G", "A100-80GB"),
    ("A100", "A100-80GB"),
    ("Tesla V100-SXM2-32GB", "V100-32GB"),
    ("Tesla V100-SXM3-32GB", "V100-32GB"),
    ("V100M32", "V100-32GB"),
    ("v100m16", "V100-16GB"),
    ("V100", "V100-16GB"),
    ("Tesla P100-PCIE-16GB", "P100"),
    ("p100", "P100"),
    ("Tesla K80", "K80"),
    ("k80", "K80"),
    ("Tesla T4", "T4"),
    ("NVIDIA GeForce RTX 4090", "RTX-4090"),
    ("rtx4090", "RTX-4090"),
    ("RTX 5090", "RTX-5090"),
    ("NVIDIA L40S", "L40S"),
    ("NVIDIA A10", "A10"),
    ("NVIDIA H200", "H200"),
    ("NVIDIA B200", "B200"),
    ("cpu", "CPU"),
]


@pytest.mark.parametrize(("spelling", "canonical"), CANONICAL)
def test_lookup_canonicalises(catalog: Catalog, spelling: str, canonical: str) -> None:
    assert catalog.lookup(spelling).name == canonical


def test_canonical_key_drops_case_separators_and_vendor_words() -> None:
    assert canonical_key("AMD-Instinct-MI300X-OAM") == canonical_key("mi300x oam") == "mi300xoam"
    assert canonical_key("NVIDIA  GeForce RTX_4090") == "rtx4090"
    assert canonical_key("0x233010de") == "0x2330"


def test_every_name_alias_and_pci_id_finds_its_own_row(catalog: Catalog) -> None:
    for spec in catalog:
        for spelling in (spec.name, *spec.aliases, *spec.pci_device_ids):
            assert catalog.lookup(spelling) is spec, spelling


@pytest.mark.parametrize(
    ("typo", "suggestion"),
    [("mi300", "MI300X"), ("H100-SMX", "H100-SXM"), ("A100-40", "A100-40GB"), ("L40", "L40S")],
)
def test_unknown_name_says_did_you_mean(catalog: Catalog, typo: str, suggestion: str) -> None:
    with pytest.raises(InputError, match="did you mean") as info:
        catalog.lookup(typo)
    assert repr(suggestion) in str(info.value)


def test_unknown_name_without_close_match_lists_known_models(catalog: Catalog) -> None:
    with pytest.raises(InputError) as info:
        catalog.lookup("Gaudi3")
    message = str(info.value)
    assert "did you mean" not in message
    assert "MI300X" in message and "H100-SXM" in message and "catalog.yaml" in message


# ---------------------------------------------------------------- find (raw product names)


def _fixture_product_names() -> dict[str, str]:
    """Product name as printed in each NVIDIA/AMD fixture that shows one -> expected row."""
    names = {}
    for xml, expected in [
        ("nvidia-tesla-p100-pcie-vm_nvidia-smi-q-x.xml", "P100"),
        ("nvidia-a100-sxm4-40gb-mig_nvidia-smi-q-x.xml", "A100-40GB"),
        ("nvidia-rtx4090-drv535_nvidia-smi-q-x.xml", "RTX-4090"),
    ]:
        text = fixture_path(xml).read_text()
        names[re.search(r"<product_name>(.*?)</product_name>", text).group(1)] = expected
    text = fixture_path("nvidia-h100-sxm5x8_nvidia-smi-q.txt").read_text()
    names[re.search(r"Product Name\s*:\s*(.+)", text).group(1).strip()] = "H100-SXM"
    text = fixture_path("amd-mi300x-x4-sriov-vm_rocm-smi-a.txt").read_text()
    names[re.search(r"Card series:\s*(.+)", text).group(1).strip()] = "MI300X"
    text = fixture_path("amd-mi300x-x4-sriov-vm_rocminfo.txt").read_text()
    names[re.search(r"Marketing Name:\s*(AMD Instinct.+)", text).group(1).strip()] = "MI300X"
    return names


def test_find_reads_product_names_from_real_tool_output(catalog: Catalog) -> None:
    names = _fixture_product_names()
    assert len(names) == 6
    for product_name, expected in names.items():
        spec = catalog.find(product_name)
        assert spec is not None and spec.name == expected, product_name


def test_find_reads_pci_ids_from_real_tool_output(catalog: Catalog) -> None:
    h100 = fixture_path("nvidia-h100-sxm5x8_nvidia-smi-q.txt").read_text()
    assert catalog.find(re.search(r"Device Id\s*:\s*(\S+)", h100).group(1)).name == "H100-SXM"
    p100 = fixture_path("nvidia-tesla-p100-pcie-vm_nvidia-smi-q-x.xml").read_text()
    pci = re.search(r"<pci_device_id>(\w+)</pci_device_id>", p100).group(1)
    assert catalog.find("0x" + pci).name == "P100"


@pytest.mark.parametrize(
    ("name", "memory", "units", "expected"),
    [
        ("A100", 40960 * MiB, None, "A100-40GB"),
        ("A100", 81559 * MiB, None, "A100-80GB"),
        ("V100", 32510 * MiB, None, "V100-32GB"),
        ("V100", 16160 * MiB, None, "V100-16GB"),
        ("AMD Instinct MI250X/MI250", None, 104, "MI250"),
        ("0x740c", None, 110, "MI250X"),
        ("0x740c", None, None, "MI250X"),
        ("NVIDIA A100-SXM4-40GB", 81559 * MiB, None, "A100-40GB"),  # an exact name wins
    ],
)
def test_find_uses_memory_and_compute_units_to_choose(
    catalog: Catalog, name: str, memory: int | None, units: int | None, expected: str
) -> None:
    spec = catalog.find(name, memory_bytes=memory, compute_units=units)
    assert spec is not None and spec.name == expected


@pytest.mark.parametrize(
    ("name", "memory", "expected"),
    [
        ("AMD Instinct MI300X VF", None, "MI300X"),  # trailing token dropped
        ("Tesla P100-SXM2-16GB", 16280 * MiB, "P100"),
        ("NVIDIA H100 NVL", 95830 * MiB, None),  # 94 GB is not an 80 GB H100
        ("AMD Instinct MI300A", None, None),  # a different product, not a suffix
        ("Radeon RX 7900 XT", 20 * GiB, None),
        ("NVIDIA", None, None),
        ("", None, None),
    ],
)
def test_find_partial_names(
    catalog: Catalog, name: str, memory: int | None, expected: str | None
) -> None:
    spec = catalog.find(name, memory_bytes=memory)
    assert (spec.name if spec else None) == expected


def test_alibaba_trace_gpu_codes_resolve(catalog: Catalog) -> None:
    path = TRACES / "alibaba-gpu-2023" / "openb_node_list_gpu_node.csv"
    with path.open() as f:
        codes = {row["model"] for row in csv.DictReader(f)}
    disclosed = {c for c in codes if not re.fullmatch(r"G\d", c)}  # G1-G3 are undisclosed
    assert disclosed == {"P100", "T4", "V100M16", "V100M32", "A10"}
    expected = {"P100": "P100", "T4": "T4", "V100M16": "V100-16GB", "V100M32": "V100-32GB",
                "A10": "A10"}
    assert {c: catalog.lookup(c).name for c in disclosed} == expected


def test_gavel_gpu_types_resolve(catalog: Catalog) -> None:
    assert [catalog.lookup(t).name for t in ("v100", "p100", "k80")] == ["V100-16GB", "P100", "K80"]


# ---------------------------------------------------------------- strict loading


def test_loads_a_catalog_file_from_a_path(tmp_path: Path) -> None:
    data = _packaged_rows()
    data["accelerators"] = [r for r in data["accelerators"] if r["name"] in {"MI300X", "CPU"}]
    data["shared_aliases"] = {}
    loaded = load_catalog(_write(tmp_path, data))
    assert loaded.names == ("MI300X", "CPU")
    assert loaded.lookup("0x74a1").memory_bytes == 192 * GiB


def _one_row(mutate) -> dict:
    data = _packaged_rows()
    data["shared_aliases"] = {}
    row = next(r for r in data["accelerators"] if r["name"] == "MI300X")
    data["accelerators"] = [row]
    mutate(row)
    return data


@pytest.mark.parametrize(
    ("mutate", "message"),
    [
        (
            lambda r: r.update(memroy_bytes=1),
            r"accelerators\[0\] \(MI300X\): unknown key 'memroy_bytes'.*did you mean 'memory_bytes'",
        ),
        (lambda r: r.pop("source"), r"\(MI300X\): missing key\(s\) source"),
        (lambda r: r.update(fp32_tflops="fast"), r"\(MI300X\): key 'fp32_tflops' must be a number"),
        (lambda r: r.update(links_per_device=7.5), r"key 'links_per_device' must be a whole number"),
        (lambda r: r.update(compute_units=True), r"key 'compute_units' must be a whole number"),
        (lambda r: r.update(vendor="intel"), r"key 'vendor' must be one of"),
        (lambda r: r.update(link_kind="infiniband"), r"key 'link_kind' must be one of"),
        (lambda r: r.update(aliases="MI300"), r"key 'aliases' must be a list of strings"),
        (lambda r: r.update(memory_bytes="lots"), r"key 'memory_bytes': cannot read size"),
        (lambda r: r.update(pci_device_ids=["74a1"]), r"'74a1' is not a PCI device id"),
        (lambda r: r.update(source="  "), r"key 'source' must not be empty"),
        (lambda r: r.update(memory_bandwidth_gbps=-1), r"'memory_bandwidth_gbps' must be positive"),
        (lambda r: r.update(arch=None), r"key 'arch' must not be null for an accelerator row"),
        (lambda r: r.update(link_gbps_per_link=None), r"'link_gbps_per_link' must not be null"),
    ],
)
def test_bad_rows_are_rejected_naming_row_and_key(tmp_path: Path, mutate, message: str) -> None:
    with pytest.raises(InputError, match=message):
        load_catalog(_write(tmp_path, _one_row(mutate)))


def test_memory_may_be_a_size_or_a_byte_count(tmp_path: Path) -> None:
    assert _packaged_rows()["accelerators"][3]["memory_bytes"] == "192GiB"  # as shipped
    data = _one_row(lambda r: r.update(memory_bytes=206158430208))
    assert load_catalog(_write(tmp_path, data)).lookup("MI300X").memory_bytes == 192 * GiB
    data = _one_row(lambda r: r.update(memory_bytes="192 GB"))
    assert load_catalog(_write(tmp_path, data)).lookup("MI300X").memory_bytes == 192 * 10**9


def test_spellings_must_not_collide_across_rows(tmp_path: Path) -> None:
    data = _packaged_rows()
    data["shared_aliases"] = {}
    rows = {r["name"]: r for r in data["accelerators"]}
    rows["MI325X"]["aliases"].append("AMD Instinct MI300X")
    data["accelerators"] = [rows["MI300X"], rows["MI325X"]]
    message = r"'AMD Instinct MI300X' reads the same as a spelling of MI300X"
    with pytest.raises(InputError, match=message):
        load_catalog(_write(tmp_path, data))


def test_shared_alias_must_name_existing_rows(tmp_path: Path) -> None:
    data = _packaged_rows()
    data["shared_aliases"] = {"A100": ["A100-80GB", "A100-40G"]}
    with pytest.raises(InputError, match=r"unknown row 'A100-40G'; did you mean 'A100-40GB'"):
        load_catalog(_write(tmp_path, data))


@pytest.mark.parametrize(
    ("edit", "message"),
    [
        (lambda d: d.update(schema="hetflow.catalog/v0"), "reads 'hetflow.catalog/v1'"),
        (lambda d: d.update(acelerators=[]), "unknown top-level key 'acelerators'"),
        (lambda d: d.update(accelerators=[]), "non-empty list"),
    ],
)
def test_bad_top_level_is_rejected(tmp_path: Path, edit, message: str) -> None:
    data = _packaged_rows()
    edit(data)
    with pytest.raises(InputError, match=message):
        load_catalog(_write(tmp_path, data))


def test_yaml_syntax_error_names_the_line(tmp_path: Path) -> None:
    path = tmp_path / "catalog.yaml"
    path.write_text("schema: hetflow.catalog/v1\naccelerators:\n  - name: [unclosed\n")
    with pytest.raises(ParseError) as info:
        load_catalog(path)
    assert info.value.line is not None and info.value.source == str(path)


def test_missing_file_is_an_input_error(tmp_path: Path) -> None:
    with pytest.raises(InputError, match="cannot read catalog"):
        load_catalog(tmp_path / "nope.yaml")
