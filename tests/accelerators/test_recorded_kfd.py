"""The KFD sysfs topology loader against the two real CPX-mode captures.

Run: .venv/bin/python -m pytest -q tests/accelerators/test_recorded_kfd.py
"""

from __future__ import annotations

import io
import random
import re
import tarfile
from collections import Counter
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from hetflow.accelerators.recorded.kfd import gfx_arch, load_kfd, looks_like_kfd, parse_kfd_files
from hetflow.core.errors import ParseError
from hetflow.core.topology import LinkKind, NodeTopology, Vendor

from tests.conftest import fixture_path

MI300X_CPX = "amd-mi300x-oam8-cpx_kfd-sysfs-topology.tar.gz"
MI308X_CPX = "amd-mi308x-oam8-cpx_kfd-sysfs-topology.tar.gz"


@pytest.fixture(scope="module")
def mi300x() -> NodeTopology:
    return load_kfd(fixture_path(MI300X_CPX))


@pytest.fixture(scope="module")
def mi308x() -> NodeTopology:
    return load_kfd(fixture_path(MI308X_CPX))


def tar_files(name: str) -> dict[str, bytes]:
    """Every regular file of a fixture tarball, by member name."""
    with tarfile.open(fixture_path(name)) as archive:
        return {
            m.name: archive.extractfile(m).read()  # type: ignore[union-attr]
            for m in archive
            if m.isfile()
        }


def write_tar(path: Path, files: dict[str, bytes]) -> Path:
    with tarfile.open(path, "w:gz") as archive:
        for name, data in files.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            archive.addfile(info, io.BytesIO(data))
    return path


# ------------------------------------------------------------------------------ MI300X CPX


def test_mi300x_cpx_partitions_and_packages(mi300x: NodeTopology) -> None:
    # 8 MI300X in CPX mode would be 64 partitions; the published capture has only 7 KFD
    # nodes for the last ASIC (nodes 2..64), so it shows 63.
    assert len(mi300x.devices) == 63
    assert [d.index for d in mi300x.devices] == list(range(63))
    sizes = Counter(d.package for d in mi300x.devices)
    assert sorted(sizes) == list(range(8))
    assert sorted(sizes.values()) == [7] + [8] * 7
    for device in mi300x.devices:
        assert device.vendor is Vendor.AMD
        assert (device.partition, device.arch, device.device_id) == ("CPX", "gfx942", "0x74a1")
        assert device.compute_units == 38  # simd_count 152 / simd_per_cu 4 (304 per MI300X)
        assert device.uuid is None  # partitions share their package's unique_id


def test_mi300x_cpx_bus_ids_carry_the_partition_in_the_function(mi300x: NodeTopology) -> None:
    package0 = [d.pci_bus_id for d in mi300x.devices if d.package == 0]
    assert package0 == [f"0000:05:00.{f}" for f in range(8)]  # location_id 1280..1287


def test_mi300x_cpx_same_package_links_are_faster(mi300x: NodeTopology) -> None:
    assert len(mi300x.links) == 63 * 62 // 2  # every partition pair has an xGMI io_link
    package = {d.index: d.package for d in mi300x.devices}
    for link in mi300x.links:
        if package[link.a] == package[link.b]:
            assert (link.kind, link.weight, link.bandwidth_gbps) == (
                LinkKind.SAME_PACKAGE, 13, 819.2,
            )
            assert link.bandwidth_note == "reported by KFD io_link max_bandwidth"
        else:
            assert (link.kind, link.weight, link.bandwidth_gbps) == (LinkKind.XGMI, 41, None)
    assert mi300x.bandwidth(0, 1) > mi300x.bandwidth(0, 8)


def test_mi300x_cpx_host_side(mi300x: NodeTopology) -> None:
    assert (mi300x.numa_nodes, mi300x.cpu_cores) == (2, 192)
    by_package: dict[int | None, set[int | None]] = {}
    for device in mi300x.devices:
        by_package.setdefault(device.package, set()).add(device.numa_node)
    # The PCIe io_link of each partition goes to its socket: half the packages per socket.
    assert [by_package[p] for p in range(8)] == [{0}] * 4 + [{1}] * 4
    assert mi300x.sources == (str(fixture_path(MI300X_CPX)),) and mi300x.name == "node0"


# ------------------------------------------------------------------------------ MI308X CPX


def test_mi308x_cpx_partitions(mi308x: NodeTopology) -> None:
    assert len(mi308x.devices) == 32
    assert sorted(Counter(d.package for d in mi308x.devices).values()) == [4] * 8
    for device in mi308x.devices:
        assert (device.partition, device.arch, device.device_id) == ("CPX", "gfx942", "0x74a2")
        assert device.compute_units == 20  # simd_count 80 / simd_per_cu 4
        assert device.memory_bytes is not None and 47 * 2**30 < device.memory_bytes <= 48 * 2**30
    per_package = Counter()
    for device in mi308x.devices:
        per_package[device.package] += device.compute_units or 0
    assert set(per_package.values()) == {80}  # 80 CUs per MI308X


def test_mi308x_cpx_links_and_host(mi308x: NodeTopology) -> None:
    kinds = Counter((l.kind, l.weight, l.bandwidth_gbps) for l in mi308x.links)
    assert kinds == {
        (LinkKind.SAME_PACKAGE, 13, 819.2): 8 * 6,
        (LinkKind.XGMI, 41, None): 32 * 31 // 2 - 8 * 6,
    }
    assert (mi308x.numa_nodes, mi308x.cpu_cores) == (2, 224)
    assert mi308x.host_memory_bytes == 2164121473024  # the two CPU nodes' system memory banks
    # The second socket's GPUs sit in PCI domain 1.
    assert mi308x.devices[0].pci_bus_id == "0000:0a:00.0"
    assert mi308x.devices[-1].pci_bus_id == "0001:c9:00.3"
    assert Counter(d.numa_node for d in mi308x.devices) == {0: 16, 1: 16}


# ---------------------------------------------------------------------------------- arch


@pytest.mark.parametrize(
    ("version", "arch"),
    [(90402, "gfx942"), (90400, "gfx940"), (90010, "gfx90a"), (90008, "gfx908"),
     (100300, "gfx1030"), (110000, "gfx1100"), (90500, "gfx950"), (0, None)],
)
def test_gfx_arch(version: int, arch: str | None) -> None:
    assert gfx_arch(version) == arch


# ----------------------------------------------------------------- directories and archives


def test_directory_at_and_above_the_topology_dir(tmp_path: Path, mi308x: NodeTopology) -> None:
    for name, data in tar_files(MI308X_CPX).items():
        target = tmp_path / "copy" / name
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(data)
    topology = tmp_path / "copy" / "amd-mi308x-oam8-cpx_kfd-sysfs-topology" / "topology"
    for path in (topology, topology.parent, tmp_path):
        assert looks_like_kfd(path)
        node = load_kfd(path)
        assert (node.devices, node.links) == (mi308x.devices, mi308x.links)
        assert node.sources == (str(path),)


def test_plain_tar_and_tgz_are_read(tmp_path: Path, mi308x: NodeTopology) -> None:
    files = tar_files(MI308X_CPX)
    plain = tmp_path / "kfd.tar"
    with tarfile.open(plain, "w") as archive:
        for name, data in files.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            archive.addfile(info, io.BytesIO(data))
    tgz = write_tar(tmp_path / "kfd.tgz", files)
    for path in (plain, tgz):
        assert looks_like_kfd(path)
        assert load_kfd(path).devices == mi308x.devices


def test_not_kfd(tmp_path: Path) -> None:
    (tmp_path / "notes.txt").write_text("hello")
    assert not looks_like_kfd(tmp_path)
    assert not looks_like_kfd(tmp_path / "notes.txt")
    assert not looks_like_kfd(tmp_path / "missing.tar.gz")
    with pytest.raises(ParseError):
        load_kfd(tmp_path)
    with pytest.raises(ParseError):
        load_kfd(tmp_path / "missing")


@pytest.mark.parametrize("cut", [0.1, 0.5, 0.97])
def test_truncated_tarball_raises_parse_error(tmp_path: Path, cut: float) -> None:
    data = fixture_path(MI308X_CPX).read_bytes()
    broken = tmp_path / "broken.tar.gz"
    broken.write_bytes(data[: int(len(data) * cut)])
    with pytest.raises(ParseError):
        load_kfd(broken)


def test_garbage_tarball_raises_parse_error(tmp_path: Path) -> None:
    garbage = tmp_path / "garbage.tar.gz"
    garbage.write_bytes(bytes(random.Random(7).randrange(256) for _ in range(4096)))
    assert not looks_like_kfd(garbage)
    with pytest.raises(ParseError):
        load_kfd(garbage)


@pytest.mark.parametrize("bad", ["../topology/nodes/0/properties", "/topology/nodes/0/properties"])
def test_unsafe_member_names_are_refused(tmp_path: Path, bad: str) -> None:
    archive = write_tar(tmp_path / "evil.tar.gz", {bad: b"cpu_cores_count 4\nsimd_count 0\n"})
    with pytest.raises(ParseError, match="absolute path or '..'"):
        load_kfd(archive)


# ------------------------------------------------------------------------- malformed trees


def small_tree() -> dict[str, str]:
    """The MI308X capture cut to its 2 CPU nodes and first 2 packages (KFD nodes 0..9)."""
    keep = set(range(10))
    files = {}
    for name, data in tar_files(MI308X_CPX).items():
        match = re.search(r"topology/(nodes/(\d+)/(?:properties|(?:io_links|p2p_links|mem_banks)/\d+/properties))$", name)
        if not match or int(match[2]) not in keep:
            continue
        text = data.decode()
        to = re.search(r"^node_to (\d+)$", text, re.MULTILINE)
        if to and int(to[1]) not in keep:
            continue
        files[match[1]] = text
    return files


SMALL = small_tree()


def test_small_tree_parses() -> None:
    node = parse_kfd_files(SMALL, "small")
    assert len(node.devices) == 8 and len(node.links) == 28
    assert Counter(l.kind for l in node.links) == {LinkKind.SAME_PACKAGE: 12, LinkKind.XGMI: 16}


@pytest.mark.parametrize(
    ("file", "text", "message"),
    [
        ("nodes/2/io_links/0/properties", "type 2\nnode_to zero\n", "expected 'name integer'"),
        ("nodes/2/io_links/0/properties", "type 2\nweight 20\n", "no 'node_to'"),
        ("nodes/2/io_links/0/properties", "type 2\nnode_to 77\n", "node_to 77"),
        ("nodes/2/io_links/0/properties", "type 2\nnode_from 3\nnode_to 0\n", "node_from 3"),
        ("nodes/2/properties", "cpu_cores_count 0\n", "neither simd_count"),
    ],
)
def test_malformed_file_is_named(file: str, text: str, message: str) -> None:
    files = dict(SMALL, **{file: text})
    with pytest.raises(ParseError, match=message) as caught:
        parse_kfd_files(files, "tree")
    assert caught.value.source == f"tree/{file}"


def test_missing_node_properties_is_named() -> None:
    files = {k: v for k, v in SMALL.items() if k != "nodes/3/properties"}
    with pytest.raises(ParseError, match="missing") as caught:
        parse_kfd_files(files, "tree")
    assert caught.value.source == "tree/nodes/3/properties"


def test_malformed_tarball_member_is_named(tmp_path: Path) -> None:
    files = {f"x/topology/{k}": v.encode() for k, v in SMALL.items()}
    files["x/topology/nodes/4/io_links/1/properties"] = b"type eleven\n"
    with pytest.raises(ParseError) as caught:
        load_kfd(write_tar(tmp_path / "bad.tar.gz", files))
    assert caught.value.source.endswith("bad.tar.gz/nodes/4/io_links/1/properties")
    assert caught.value.line == 1


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    seed=st.integers(0, 2**32 - 1),
    drop=st.floats(0.0, 0.5),
    junk=st.text(max_size=80),
    cut=st.floats(0.0, 1.0),
)
def test_fuzz_damaged_tree(seed: int, drop: float, junk: str, cut: float) -> None:
    rng = random.Random(seed)
    files = {k: v for k, v in SMALL.items() if rng.random() >= drop}
    if files:
        victim = rng.choice(sorted(files))
        text = files[victim]
        files[victim] = text[: int(len(text) * cut)] + junk
    try:
        node = parse_kfd_files(files, "fuzz")
    except ParseError as err:
        assert err.source.startswith("fuzz")
        return
    assert isinstance(node, NodeTopology)


@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.binary(max_size=2048))
def test_fuzz_random_archive_bytes(data: bytes) -> None:
    import tempfile

    with tempfile.TemporaryDirectory() as directory:
        path = Path(directory) / "random.tar.gz"
        path.write_bytes(data)
        assert looks_like_kfd(path) in (True, False)
        with pytest.raises(ParseError):
            load_kfd(path)
