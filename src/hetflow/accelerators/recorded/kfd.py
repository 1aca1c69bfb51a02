"""Read a copy of the KFD sysfs topology (``/sys/class/kfd/kfd/topology``) into a NodeTopology.

KFD is what amdsmi, rocm-smi and ROCr read underneath: one *node* per CPU NUMA domain and one
per GPU (or per GPU partition in CPX/DPX/QPX mode), each with ``properties`` and
``io_links/N/properties`` (and on newer kernels ``p2p_links`` and ``mem_banks``). The loader
takes the topology directory, any directory above it, or a ``.tar``/``.tar.gz``/``.tgz`` of
one (read in memory, never extracted). Try it from the repository root (one command)::

    python -c 'import sys, pathlib; from hetflow.accelerators.recorded.kfd import load_kfd;
    print(load_kfd(pathlib.Path(sys.argv[1])))' tests/fixtures/topology/amd-mi308x-oam8-cpx_kfd-sysfs-topology.tar.gz

What becomes what:

* GPU nodes (``simd_count > 0`` or ``gfx_target_version != 0``) -> Devices, index = order of
  node ids. ``arch`` from ``gfx_target_version`` (90402 -> gfx942, 90010 -> gfx90a);
  ``compute_units`` = simd_count / simd_per_cu; ``memory_bytes`` = the frame-buffer
  ``mem_banks``; ``pci_bus_id`` from ``domain`` and ``location_id`` (for partitions KFD puts
  the partition number in the function bits); ``numa_node`` = the CPU node the GPU's PCIe
  io_link reaches.
* Nodes that share a physical package (same ``unique_id``; else same domain/bus/device) are
  partitions: ``package`` numbers the packages in node order and ``partition`` names the mode
  (one XCC per partition is CPX, else the count: 2 DPX, 3 TPX, 4 QPX). Partitions share their
  package's unique id, so their ``uuid`` is left unset rather than duplicated.
* GPU-GPU io_links: type 11 XGMI, type 2 PCIe, weight, and ``max_bandwidth`` MB/s as
  ``bandwidth_gbps`` when > 0. An XGMI io_link inside one package is ``SAME_PACKAGE``.
* CPU nodes give ``numa_nodes``, ``cpu_cores`` (sum of ``cpu_cores_count``, logical CPUs) and
  ``host_memory_bytes`` (their system-memory banks, when the copy has them).

A malformed tree raises ParseError naming the file inside the tree.
"""

from __future__ import annotations

import re
import tarfile
import zlib
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Mapping

from hetflow.accelerators.recorded.base import partial_node
from hetflow.core.errors import ParseError
from hetflow.core.pci import format_pci_bus_id
from hetflow.core.topology import Device, Link, LinkKind, NodeTopology, Vendor

NOTE_KFD = "reported by KFD io_link max_bandwidth"

# KFD io_link types (kfd_crat.h CRAT_IOLINK_TYPE_*): the two that connect GPUs.
IOLINK_TYPE_PCIE = 2
IOLINK_TYPE_XGMI = 11
_IOLINK_KINDS = {IOLINK_TYPE_PCIE: LinkKind.PCIE, IOLINK_TYPE_XGMI: LinkKind.XGMI}

# mem_banks heap_type (HSA_HEAPTYPE_*): 0 system memory, 1/2 the GPU's frame buffer.
HEAP_SYSTEM = 0
HEAP_FRAME_BUFFER = (1, 2)

# Partition mode by partitions per package, when one-XCC-per-partition (CPX) does not apply.
PARTITION_MODES = {2: "DPX", 3: "TPX", 4: "QPX"}
CPX = "CPX"

TAR_SUFFIXES = (".tar.gz", ".tgz", ".tar")
_MAX_PROPERTIES_BYTES = 1 << 20  # sysfs property files are a few hundred bytes
_SEARCH_DEPTH = 4  # how far below the given directory the topology dir may be

# Relative to the topology dir: the files this loader reads.
_WANTED = re.compile(r"^nodes/(\d+)/(?:properties|(io_links|p2p_links|mem_banks)/(\d+)/properties)$")
_NODE_PROPERTIES = re.compile(r"^(?P<prefix>(?:.*/)?)nodes/\d+/properties$")
_PROPERTY_LINE = re.compile(r"^([A-Za-z_][A-Za-z0-9_]*)\s+(-?\d+)$")


# ----------------------------------------------------------------------------- entry points


def looks_like_kfd(path: Path) -> bool:
    """Whether ``path`` is (or holds) a KFD topology tree: a directory with ``nodes/N/properties``
    at or below it, or a tar archive containing one. Never raises."""
    try:
        if path.is_dir():
            return _find_topology_dir(path) is not None
        if path.is_file() and path.name.lower().endswith(TAR_SUFFIXES):
            with tarfile.open(path, mode="r:*") as archive:
                return any(_NODE_PROPERTIES.match(m.name) for m in archive if m.isfile())
    except Exception:  # noqa: BLE001 - a yes/no probe: unreadable means "no"
        return False
    return False


def load_kfd(path: Path) -> NodeTopology:
    """Read a KFD topology directory (or a directory above it) or a tar archive of one.

    Returns a partial node named ``node0`` whose source is ``str(path)``. Raises ParseError
    for a missing or malformed tree, an unreadable archive, or archive members with absolute
    paths or ``..``.
    """
    source = str(path)
    if path.is_dir():
        files = _read_directory(path, source)
    elif path.is_file():
        files = _read_archive(path, source)
    else:
        raise ParseError(source, "no such file or directory: give a KFD topology dir or a tarball")
    return parse_kfd_files(files, source)


def parse_kfd_files(files: Mapping[str, str], source: str) -> NodeTopology:
    """Build the node from ``{path relative to the topology dir: file text}``, e.g.
    ``{"nodes/0/properties": "cpu_cores_count 96\\n...", "nodes/2/io_links/0/properties": ...}``.

    This is the loader without the file system; ``source`` prefixes file names in errors.
    """
    tree = _Tree(files, source)
    nodes = tree.nodes()
    if not nodes:
        raise ParseError(source, "no nodes/N/properties file: not a KFD topology tree")
    gpus = [n for n in nodes if n.is_gpu]
    cpus = [n for n in nodes if n.is_cpu]
    index = {n.node_id: i for i, n in enumerate(gpus)}
    numa = {n.node_id: i for i, n in enumerate(cpus)}
    packages = _packages(gpus)
    devices = [_device(index[n.node_id], n, packages, numa, tree) for n in gpus]
    links = _links(gpus, index, packages, tree)
    cores = sum(n.props.get("cpu_cores_count", 0) for n in nodes)
    host_memory = [_bank_bytes(n, tree, (HEAP_SYSTEM,)) for n in cpus]
    known_memory = [m for m in host_memory if m is not None]
    return partial_node(
        source, devices, links,
        cpu_cores=cores or None,
        host_memory_bytes=sum(known_memory) if cpus and len(known_memory) == len(cpus) else None,
        numa_nodes=len(cpus) or None,
    )


# -------------------------------------------------------------------------------- reading


def _find_topology_dir(path: Path) -> Path | None:
    """The shallowest directory at or below ``path`` with ``nodes/<digits>/properties``."""
    frontier = [path]
    for _ in range(_SEARCH_DEPTH + 1):
        for candidate in frontier:
            nodes = candidate / "nodes"
            if nodes.is_dir() and any(
                child.name.isdigit() and (child / "properties").is_file()
                for child in nodes.iterdir()
            ):
                return candidate
        frontier = [c for d in frontier for c in sorted(d.iterdir()) if c.is_dir()]
        if not frontier:
            break
    return None


def _read_directory(path: Path, source: str) -> dict[str, str]:
    try:
        root = _find_topology_dir(path)
    except OSError as exc:
        raise ParseError(source, f"cannot list the directory: {exc}") from None
    if root is None:
        raise ParseError(
            source, "no KFD topology below this directory (expected nodes/N/properties)"
        )
    files: dict[str, str] = {}
    # Explicit patterns rather than a recursive walk: sysfs nodes also hold caches/ (dozens of
    # entries per GPU) that hetflow does not read.
    candidates = list(root.glob("nodes/*/properties"))
    for kind in ("io_links", "p2p_links", "mem_banks"):
        candidates += root.glob(f"nodes/*/{kind}/*/properties")
    for file in sorted(candidates):
        relative = file.relative_to(root).as_posix()
        if not _WANTED.match(relative):
            continue
        try:
            if file.stat().st_size > _MAX_PROPERTIES_BYTES:
                raise ParseError(f"{source}/{relative}", "file too large for a KFD property file")
            files[relative] = file.read_text(encoding="utf-8", errors="replace")
        except OSError as exc:
            raise ParseError(f"{source}/{relative}", f"cannot read: {exc}") from None
    return files


def _read_archive(path: Path, source: str) -> dict[str, str]:
    """Read the wanted members of a tar archive in memory, refusing unsafe member names."""
    try:
        with tarfile.open(path, mode="r:*") as archive:
            return _archive_files(archive, source)
    except ParseError:
        raise
    except (tarfile.TarError, EOFError, OSError, zlib.error, UnicodeDecodeError) as exc:
        raise ParseError(source, f"cannot read the archive ({exc}); give a .tar, .tar.gz or .tgz") from None


def _archive_files(archive: tarfile.TarFile, source: str) -> dict[str, str]:
    members: dict[str, tarfile.TarInfo] = {}
    prefixes: set[str] = set()
    for member in archive:
        name = member.name
        parts = PurePosixPath(name).parts
        if name.startswith(("/", "\\")) or ".." in parts or re.match(r"^[A-Za-z]:", name):
            raise ParseError(source, f"archive member {name!r} has an absolute path or '..'")
        if not member.isfile():
            continue  # links and devices are never followed
        match = _NODE_PROPERTIES.match(name)
        if match:
            prefixes.add(match["prefix"])
        members[name] = member
    if not prefixes:
        raise ParseError(source, "the archive holds no nodes/N/properties: not a KFD topology")
    if len(prefixes) > 1:
        raise ParseError(source, f"the archive holds several KFD topologies: {sorted(prefixes)}")
    prefix = prefixes.pop()
    files: dict[str, str] = {}
    for name, member in members.items():
        if not name.startswith(prefix) or not _WANTED.match(name[len(prefix) :]):
            continue
        if member.size > _MAX_PROPERTIES_BYTES:
            raise ParseError(f"{source}/{name}", "file too large for a KFD property file")
        handle = archive.extractfile(member)
        if handle is None:
            raise ParseError(f"{source}/{name}", "cannot read this archive member")
        files[name[len(prefix) :]] = handle.read().decode("utf-8", errors="replace")
    return files


# -------------------------------------------------------------------------------- the tree


@dataclass
class _KfdNode:
    node_id: int
    props: dict[str, int]
    file: str  # for error messages

    @property
    def is_gpu(self) -> bool:
        return self.props.get("simd_count", 0) > 0 or self.props.get("gfx_target_version", 0) != 0

    @property
    def is_cpu(self) -> bool:
        return self.props.get("cpu_cores_count", 0) > 0


@dataclass
class _IoLink:
    node_from: int
    node_to: int
    type: int
    weight: int | None
    max_bandwidth: int | None
    file: str


class _Tree:
    """The files of one KFD topology tree, indexed by node and parsed on demand."""

    def __init__(self, files: Mapping[str, str], source: str) -> None:
        self.files = files
        self.source = source
        self.node_files: dict[int, str] = {}
        # (node id, "io_links" | "p2p_links" | "mem_banks") -> [(entry number, relative path)]
        self.entry_files: dict[tuple[int, str], list[tuple[int, str]]] = defaultdict(list)
        for relative in files:
            match = _WANTED.match(relative)
            if match is None:
                continue
            node_id = int(match[1])
            if match[2] is None:
                self.node_files[node_id] = relative
            else:
                self.entry_files[(node_id, match[2])].append((int(match[3]), relative))
        self._links: dict[tuple[int, str], list[_IoLink]] = {}

    def where(self, relative: str) -> str:
        return f"{self.source}/{relative}"

    def properties(self, relative: str) -> dict[str, int]:
        """``key value`` lines -> dict; ParseError (file, line) on anything else."""
        result: dict[str, int] = {}
        for lineno, raw in enumerate(self.files[relative].splitlines(), start=1):
            line = raw.strip()
            if not line:
                continue
            match = _PROPERTY_LINE.match(line)
            if match is None:
                raise ParseError(
                    self.where(relative), f"expected 'name integer', got {line[:60]!r}", lineno
                )
            result[match[1]] = int(match[2])
        return result

    def nodes(self) -> list[_KfdNode]:
        for node_id, kind in sorted(self.entry_files):
            if node_id not in self.node_files:
                raise ParseError(
                    self.where(f"nodes/{node_id}/properties"),
                    f"missing, but nodes/{node_id}/{kind} exists: the copy of the tree is incomplete",
                )
        nodes = []
        for node_id, relative in sorted(self.node_files.items()):
            node = _KfdNode(node_id, self.properties(relative), relative)
            if "simd_count" not in node.props and "gfx_target_version" not in node.props:
                raise ParseError(self.where(relative), "has neither simd_count nor gfx_target_version")
            nodes.append(node)
        return nodes

    def entries(self, node_id: int, kind: str) -> list[tuple[str, dict[str, int]]]:
        """The ``kind`` (io_links, p2p_links, mem_banks) property files of one node, in order."""
        found = sorted(self.entry_files.get((node_id, kind), []))
        return [(relative, self.properties(relative)) for _, relative in found]

    def links(self, node_id: int, kind: str) -> list[_IoLink]:
        key = (node_id, kind)
        if key not in self._links:
            self._links[key] = [
                self._link(relative, props, node_id) for relative, props in self.entries(node_id, kind)
            ]
        return self._links[key]

    def _link(self, relative: str, props: dict[str, int], node_id: int) -> _IoLink:
        for required in ("type", "node_to"):
            if required not in props:
                raise ParseError(self.where(relative), f"io_link has no {required!r} line")
        if props.get("node_from", node_id) != node_id:
            raise ParseError(
                self.where(relative), f"node_from {props['node_from']} is not its node {node_id}"
            )
        if props["node_to"] not in self.node_files:
            raise ParseError(
                self.where(relative), f"node_to {props['node_to']} is not a node of this tree"
            )
        return _IoLink(
            node_from=node_id,
            node_to=props["node_to"],
            type=props["type"],
            weight=props.get("weight"),
            max_bandwidth=props.get("max_bandwidth"),
            file=relative,
        )


# -------------------------------------------------------------------------------- devices


def gfx_arch(gfx_target_version: int) -> str | None:
    """KFD ``gfx_target_version`` (major*10000 + minor*100 + stepping) -> ``gfxNNN``.

    90402 -> gfx942 (MI300X/MI308X/MI325X), 90400 -> gfx940, 90010 -> gfx90a (MI200),
    100300 -> gfx1030, 110000 -> gfx1100. Minor and stepping print as one hex digit each.
    """
    if gfx_target_version <= 0:
        return None
    major, rest = divmod(gfx_target_version, 10000)
    minor, stepping = divmod(rest, 100)
    if minor > 15 or stepping > 15:
        return None
    return f"gfx{major}{minor:x}{stepping:x}"


@dataclass(frozen=True)
class _Package:
    number: int
    size: int  # partitions (KFD GPU nodes) in this package


def _package_key(node: _KfdNode) -> tuple[int, ...]:
    unique_id = node.props.get("unique_id", 0)
    if unique_id:
        return (0, unique_id)
    location = node.props.get("location_id", 0)
    if location:
        # Without a unique id, partitions still share domain, bus and device; only the
        # function bits of location_id differ.
        return (1, node.props.get("domain", 0), location >> 3)
    return (2, node.node_id)  # nothing identifies the package: the node stands alone


def _packages(gpus: list[_KfdNode]) -> dict[int, _Package]:
    """KFD node id -> its physical package, numbered in node order."""
    members: dict[tuple[object, ...], list[int]] = defaultdict(list)
    for node in gpus:
        members[_package_key(node)].append(node.node_id)
    result: dict[int, _Package] = {}
    for number, node_ids in enumerate(members.values()):
        for node_id in node_ids:
            result[node_id] = _Package(number, len(node_ids))
    return result


def _partition_mode(node: _KfdNode, package: _Package) -> str | None:
    if package.size <= 1:
        return None
    if node.props.get("num_xcc") == 1:
        return CPX
    return PARTITION_MODES.get(package.size, f"{package.size}-way")


def _bank_bytes(node: _KfdNode, tree: _Tree, heap_types: tuple[int, ...]) -> int | None:
    banks = [props for _, props in tree.entries(node.node_id, "mem_banks")]
    sizes = [b.get("size_in_bytes", 0) for b in banks if b.get("heap_type") in heap_types]
    return sum(sizes) or None


def _bus_id(node: _KfdNode) -> str | None:
    location = node.props.get("location_id", 0)
    if not location:
        return None
    domain = node.props.get("domain", 0)
    bus, device, function = (location >> 8) & 0xFF, (location >> 3) & 0x1F, location & 0x7
    return format_pci_bus_id(domain & 0xFFFF, bus, device, function)


def _numa_node(node: _KfdNode, numa: dict[int, int], tree: _Tree) -> int | None:
    """The NUMA node of the CPU the GPU's lightest io_link reaches (None when ambiguous)."""
    to_cpu = [l for l in tree.links(node.node_id, "io_links") if l.node_to in numa]
    if not to_cpu:
        return None
    weights = {numa[l.node_to]: l.weight for l in to_cpu}
    known = [w for w in weights.values() if w is not None]
    lightest = min(known) if known else None
    nearest = {n for n, w in weights.items() if w == lightest}
    return nearest.pop() if len(nearest) == 1 else None


def _device(
    index: int, node: _KfdNode, packages: dict[int, _Package], numa: dict[int, int], tree: _Tree
) -> Device:
    props = node.props
    package = packages[node.node_id]
    partition = _partition_mode(node, package)
    simd_per_cu = props.get("simd_per_cu", 0)
    unique_id = props.get("unique_id", 0)
    device_id = props.get("device_id", 0)
    return Device(
        index=index,
        vendor=Vendor.AMD,
        arch=gfx_arch(props.get("gfx_target_version", 0)),
        memory_bytes=_bank_bytes(node, tree, HEAP_FRAME_BUFFER),
        numa_node=_numa_node(node, numa, tree),
        pci_bus_id=_bus_id(node),
        # rocminfo/ROCR_VISIBLE_DEVICES spell the KFD unique id as GPU-<16 hex digits>.
        uuid=f"GPU-{unique_id:016x}" if 0 < unique_id < 1 << 64 and partition is None else None,
        partition=partition,
        package=package.number if partition is not None else None,
        compute_units=props.get("simd_count", 0) // simd_per_cu if simd_per_cu > 0 else None,
        device_id=f"0x{device_id:04x}" if device_id > 0 else None,
    )


# ---------------------------------------------------------------------------------- links


def _links(
    gpus: list[_KfdNode], index: dict[int, int], packages: dict[int, _Package], tree: _Tree
) -> list[Link]:
    """One link per GPU pair that an io_link (or, failing that, a p2p_link) connects."""
    chosen: dict[tuple[int, int], _IoLink] = {}
    for kind in ("io_links", "p2p_links"):
        for node in gpus:
            for io_link in tree.links(node.node_id, kind):
                if io_link.node_to not in index or io_link.node_to == node.node_id:
                    continue
                a, b = index[node.node_id], index[io_link.node_to]
                chosen.setdefault((min(a, b), max(a, b)), io_link)
    links = []
    for (a, b), io_link in sorted(chosen.items()):
        kind = _IOLINK_KINDS.get(io_link.type, LinkKind.UNKNOWN)
        first, second = packages[io_link.node_from], packages[io_link.node_to]
        if kind is LinkKind.XGMI and first.number == second.number and first.size > 1:
            kind = LinkKind.SAME_PACKAGE
        bandwidth = io_link.max_bandwidth / 1000.0 if io_link.max_bandwidth else None
        if bandwidth is not None and bandwidth <= 0:
            bandwidth = None
        links.append(
            Link(
                a=a,
                b=b,
                kind=kind,
                weight=io_link.weight,
                bandwidth_gbps=bandwidth,
                bandwidth_note=NOTE_KFD if bandwidth is not None else None,
            )
        )
    return links
