"""Recorded ``nvidia-smi`` output -> partial NodeTopology.

Six formats, each a :class:`RecordedFormat` in :data:`FORMATS`:

========================  =================================  ==================================
name                      command                            facts it gives
========================  =================================  ==================================
nvidia-smi-topo-m         ``nvidia-smi topo -m``             link matrix (NV#/PCIe level), NUMA
nvidia-smi-q-xml          ``nvidia-smi -q -x``               name, memory, UUID, bus id, PCI id
nvidia-smi-q              ``nvidia-smi -q``                  the same, from the text form
nvidia-smi-nvlink-status  ``nvidia-smi nvlink --status``     name, UUID (+ :func:`nvlink_status`)
nvidia-smi-nvlink-remote  ``nvidia-smi nvlink -R``           name, UUID (+ :func:`nvlink_remotes`)
nvidia-smi-topo-p2p       ``nvidia-smi topo -p2p r|w|rw|..`` the GPUs only
========================  =================================  ==================================

Every parser returns a node named ``node0`` holding only what its file shows (see
:mod:`hetflow.accelerators.recorded.base`); ``Device.index`` is nvidia-smi's GPU index (the
NVML index, what ``CUDA_VISIBLE_DEVICES`` addresses with ``CUDA_DEVICE_ORDER=PCI_BUS_ID``) and
PCI bus ids are normalised to ``dddd:bb:dd.f``. Input a parser cannot read raises ParseError
with the 1-based line and what was expected; any other exception escaping is a bug.

Tests, against the real outputs in tests/fixtures/topology (from the repository root)::

    .venv/bin/python -m pytest -q tests/accelerators/test_recorded_nvidia.py
"""

from __future__ import annotations

import re
import xml.etree.ElementTree as ET
from dataclasses import dataclass
from typing import Collection, Iterable, Iterator, Mapping

from hetflow.accelerators.recorded.base import RecordedFormat, bus_id, partial_node, safe_sniff
from hetflow.core.errors import InputError, ParseError
from hetflow.core.topology import Device, Link, LinkKind, NodeTopology, PcieLevel, Vendor, pair
from hetflow.core.units import parse_bytes


# The most NVLinks one GPU has (H100/B200: 18; A100: 12; V100: 6). Used twice below: to tell
# NVSwitch systems from direct NVLink in `topo -m`, and to recognise switch ports in `nvlink -R`.
MAX_NVLINKS_PER_GPU = 18

_SNIFF_LINES = 40  # sniffers look at the start of a file only: cheap on large inputs


# --- shared helpers ------------------------------------------------------------------------


def _split_lines(text: str) -> list[str]:
    """Lines as editors number them. ``str.splitlines`` would also split on form feeds and
    Unicode separators and so shift the line numbers reported in errors."""
    return [line.rstrip("\r") for line in text.split("\n")]


def _is_command_line(line: str) -> bool:
    """The command (or a shell prompt with it) recorded above the output."""
    stripped = line.strip()
    return "nvidia-smi" in stripped or stripped == "$"


# Lines people put where they cut output: "[...]", "...", "....", "…".
_ELISION = re.compile(r"^\s*\[?\s*(?:\.{3,}|…)\s*\]?\s*$")


def _is_elision(line: str) -> bool:
    return bool(_ELISION.match(line))




def _bus_id(raw: str, source: str, line: int | None, what: str) -> str:
    return bus_id(raw, source, what, line, example="00000000:18:00.0")  # nvidia-smi's spelling


def _memory(raw: str, source: str, line: int | None, what: str) -> int | None:
    if raw.strip() in ("", "N/A"):
        return None
    try:
        return parse_bytes(raw)
    except InputError:
        message = f"{what}: expected a size like '40960 MiB', found {raw!r}"
        raise ParseError(source, message, line) from None


def _uuid(raw: str | None) -> str | None:
    """nvidia-smi UUIDs start with 'GPU-'; anything else ('...', 'N/A') is elided: unknown."""
    if raw is None:
        return None
    raw = raw.strip()
    return raw if raw.startswith("GPU-") and len(raw) > 4 else None


def _known(raw: str | None) -> str | None:
    if raw is None:
        return None
    raw = raw.strip()
    return None if raw in ("", "N/A", "[N/A]", "Unknown Error") else raw


def _pci_device_id(raw: str | None) -> str | None:
    """nvidia-smi prints device and vendor id together, ``0x233010DE``: keep the device half."""
    raw = _known(raw)
    if raw is None:
        return None
    m = re.match(r"^(?:0x)?([0-9a-f]{4})10de$", raw, re.ASCII | re.IGNORECASE)
    return f"0x{m.group(1).lower()}" if m else None


def _node(devices: Iterable[Device], links: Iterable[Link], source: str) -> NodeTopology:
    return partial_node(source, devices, links)


def _head(text: str) -> list[str]:
    return _split_lines(text[: 64 * 1024])[:_SNIFF_LINES]


def _content_lines(lines: Iterable[str]) -> Iterator[str]:
    """Lines that carry output: no blank, command/prompt or elision lines."""
    for line in lines:
        if line.strip() and not _is_command_line(line) and not _is_elision(line):
            yield line


# --- nvidia-smi topo -m -------------------------------------------------------------------

_GPU_NAME = re.compile(r"^GPU([0-9]{1,6})$", re.ASCII)
_TOPO_CELL = re.compile(r"^(?:X|NV([0-9]{1,4})|PIX|PXB|PHB|NODE|SYS|SOC)$", re.ASCII)
_TOPO_LINK_TOKEN = re.compile(r"^(?:NV[0-9]{1,4}|PIX|PXB|PHB|NODE|SYS|SOC)$", re.ASCII)
_PCIE_LEVELS = {
    "PIX": PcieLevel.PIX,
    "PXB": PcieLevel.PXB,
    "PHB": PcieLevel.PHB,
    "NODE": PcieLevel.NODE,
    "SYS": PcieLevel.SYS,
    "SOC": PcieLevel.SYS,  # drivers before NODE existed called the SMP interconnect "SOC"
}
# Columns after the matrix. Known multi-word names are joined before splitting on whitespace,
# because nvidia-smi separates columns with one tab that may expand to a single space.
_TRAILING_COLUMNS = (("CPU", "Affinity"), ("NUMA", "Affinity"), ("GPU", "NUMA", "ID"))
_NUMA_AFFINITY = "NUMA Affinity"
_AFFINITY_LIKE = re.compile(r"^(?:[0-9]|N/A$)", re.ASCII)  # "0-23,48-71", "3", "N/A"
_NUMA_VALUE = re.compile(r"^([0-9]{1,6})(?:[-,][0-9,-]*)?$", re.ASCII)


def _positioned_words(line: str) -> list[tuple[int, str]]:
    """Words of a line with their columns after expanding tabs as a terminal would (every 8):
    nvidia-smi aligns its columns that way, which places cells a row leaves empty."""
    return [(m.start(), m.group()) for m in re.finditer(r"\S+", line.expandtabs(8))]


@dataclass(frozen=True)
class _TopoHeader:
    devices: tuple[str, ...]  # matrix columns in order: GPUn and other devices (NICs)
    gpu_index: dict[str, int]  # 'GPU3' -> 3
    trailing: tuple[tuple[int, str], ...]  # (column start, name) of the columns after the matrix


def _topo_header(line: str, source: str, lineno: int) -> _TopoHeader:
    words = _positioned_words(line)
    devices: list[str] = []
    trailing: list[tuple[int, str]] = []
    i = 0
    while i < len(words):
        joined = next(
            (n for n in _TRAILING_COLUMNS if tuple(w for _, w in words[i : i + len(n)]) == n), None
        )
        if joined is not None:
            trailing.append((words[i][0], " ".join(joined)))
            i += len(joined)
            continue
        if trailing:
            trailing.append(words[i])  # a column this parser does not know: kept, ignored
        else:
            devices.append(words[i][1])
        i += 1
    gpu_index: dict[str, int] = {}
    for name in devices:
        m = _GPU_NAME.match(name)
        if m:
            gpu_index[name] = int(m.group(1))
    if not gpu_index:
        raise ParseError(
            source,
            "expected the header of `nvidia-smi topo -m` (GPU0 GPU1 ... CPU Affinity NUMA Affinity)",
            lineno,
        )
    if len(set(devices)) != len(devices) or len(set(gpu_index.values())) != len(gpu_index):
        raise ParseError(source, "header names a device column twice", lineno)
    return _TopoHeader(tuple(devices), gpu_index, tuple(trailing))


def _trailing_values(
    words: list[tuple[int, str]], header: _TopoHeader, source: str, lineno: int
) -> dict[str, str]:
    """Map the values after the matrix cells to the header's trailing columns.

    All present: in order. Fewer (nvidia-smi leaves unknown affinities blank on some systems):
    by the column each value starts under. More: an error.
    """
    names = [name for _, name in header.trailing]
    if len(words) > len(names):
        raise ParseError(
            source,
            f"expected at most {len(names)} values after the matrix cells "
            f"({', '.join(names) or 'none'}), found {len(words)}",
            lineno,
        )
    if len(words) == len(names):
        return {name: word for name, (_, word) in zip(names, words)}
    values: dict[str, str] = {}
    last = -1
    for pos, word in words:
        column = min(range(len(names)), key=lambda k: abs(header.trailing[k][0] - pos))
        if column <= last:
            raise ParseError(
                source, f"cannot tell which column {word!r} belongs to ({', '.join(names)})", lineno
            )
        values[names[column]] = word
        last = column
    return values


def _numa_node(raw: str | None, source: str, lineno: int) -> int | None:
    if raw is None or raw == "N/A":
        return None
    m = _NUMA_VALUE.match(raw)
    if not m:
        raise ParseError(
            source,
            f"NUMA Affinity: expected a node number, a range like 6-7 or N/A, found {raw!r}",
            lineno,
        )
    # A range ("6-7") means the GPU is equally close to several nodes; the first one is as good
    # a home as any and keeps the device on a real node.
    return int(m.group(1))


@dataclass(frozen=True)
class _TopoCell:
    token: str  # normalised: SOC -> SYS
    line: int


def _topo_cells(
    words: list[tuple[int, str]], header: _TopoHeader, source: str, lineno: int
) -> list[str]:
    label = words[0][1]
    cells = [w for _, w in words[1 : 1 + len(header.devices)]]
    for k, column in enumerate(header.devices):
        cell = cells[k] if k < len(cells) else None
        if cell is not None and _TOPO_CELL.match(cell):
            continue
        if cell is None or _AFFINITY_LIKE.match(cell):
            # the row ran out of cells (the values after the matrix start early)
            raise ParseError(
                source,
                f"row {label}: expected {len(header.devices)} cells, one per column "
                f"{header.devices[0]}..{header.devices[-1]}, found {k}",
                lineno,
            )
        raise ParseError(
            source,
            f"row {label}, column {column}: expected X, NV#, PIX, PXB, PHB, NODE or SYS, found {cell!r}",
            lineno,
        )
    for column, cell in zip(header.devices, cells):
        if (cell == "X") != (column == label):
            expected = "X (the GPU itself)" if column == label else "a link, not X"
            message = f"row {label}, column {column}: expected {expected}, found {cell!r}"
            raise ParseError(source, message, lineno)
    return cells


def parse_topo_matrix(text: str, source: str) -> NodeTopology:
    """``nvidia-smi topo -m`` -> GPUs (index, NUMA node) and the links between them.

    Tab- or space-separated, with or without NIC rows/columns (ignored), the Legend, the
    command line above it, and the "NUMA Affinity"/"GPU NUMA ID" columns. Excerpts: the devices
    come from the header, links only for pairs a shown row gives, NUMA only for shown rows.
    """
    lines = _split_lines(text)
    start = next((i for i, l in enumerate(lines) if l.strip() and not _is_command_line(l)), None)
    if start is None:
        raise ParseError(source, "empty: expected the output of `nvidia-smi topo -m`")
    header = _topo_header(lines[start], source, start + 1)
    cells: dict[tuple[int, int], _TopoCell] = {}
    numa: dict[int, int | None] = {}
    matrix_ended = False
    for i in range(start + 1, len(lines)):
        line, lineno = lines[i], i + 1
        stripped = line.strip()
        if stripped.startswith(("Legend", "NIC Legend")):
            break  # the legend explains the tokens; nothing after it is topology
        if not stripped or _is_command_line(line):
            matrix_ended = matrix_ended or bool(cells or numa)
            continue
        words = _positioned_words(line)
        label = words[0][1]
        if matrix_ended:
            message = f"expected the Legend or the end of the output, found {stripped[:40]!r}"
            raise ParseError(source, message, lineno)
        if label not in header.devices:
            message = f"expected a row starting with a header name (GPU0, ...), found {label[:40]!r}"
            raise ParseError(source, message, lineno)
        if label not in header.gpu_index:
            continue  # NIC rows: hetflow places work on GPUs; NIC affinity is not modelled
        me = header.gpu_index[label]
        if me in numa:
            raise ParseError(source, f"second row for {label}", lineno)
        row = _topo_cells(words, header, source, lineno)
        values = _trailing_values(words[1 + len(header.devices) :], header, source, lineno)
        numa[me] = _numa_node(values.get(_NUMA_AFFINITY), source, lineno)
        for column, cell in zip(header.devices, row):
            other = header.gpu_index.get(column)
            if other is None or other == me:
                continue
            token = "SYS" if cell == "SOC" else cell
            seen = cells.get(pair(me, other))
            if seen is not None and seen.token != token:
                raise ParseError(
                    source,
                    f"matrix contradicts itself: {label}/{column} is {cell} but "
                    f"{column}/{label} on line {seen.line} is {seen.token}",
                    lineno,
                )
            cells.setdefault(pair(me, other), _TopoCell(token, lineno))
    if not numa:
        message = "no GPU rows: expected rows GPU0, GPU1, ... below the header"
        raise ParseError(source, message, start + 1)
    devices = [
        Device(index=idx, vendor=Vendor.NVIDIA, numa_node=numa.get(idx))
        for idx in header.gpu_index.values()
    ]
    return _node(devices, _topo_links(cells), source)


def _topo_links(cells: Mapping[tuple[int, int], _TopoCell]) -> list[Link]:
    # NVSwitch rule. `topo -m` prints NV# both for direct NVLinks and for NVLinks into
    # NVSwitches. A GPU has at most MAX_NVLINKS_PER_GPU links, so a GPU whose NV counts to its
    # peers add up to more than that cannot be wired to each of them directly: its NVLinks go
    # through switches (H100 x8: 7 x NV18 = 126; DGX-2: 15 x NV6 = 90), and every NV pair it is
    # part of is NVSWITCH. Otherwise the links are direct NVLINK (a 2-GPU NV2 bridge, the DGX-1
    # hybrid cube mesh, 4-GPU HGX boards wired all-to-all). In an excerpt, a GPU whose row is
    # cut only shows a lower bound, but every known pair has one endpoint with a full row.
    nv_total: dict[int, int] = {}
    for (a, b), cell in cells.items():
        m = _TOPO_CELL.match(cell.token)
        if m and m.group(1):
            for g in (a, b):
                nv_total[g] = nv_total.get(g, 0) + int(m.group(1))
    links = []
    for (a, b), cell in cells.items():
        m = _TOPO_CELL.match(cell.token)
        if m and m.group(1):
            switched = max(nv_total[a], nv_total[b]) > MAX_NVLINKS_PER_GPU
            kind = LinkKind.NVSWITCH if switched else LinkKind.NVLINK
            links.append(Link(a, b, kind, count=int(m.group(1))))
        else:
            links.append(Link(a, b, LinkKind.PCIE, pcie_level=_PCIE_LEVELS[cell.token]))
    return links


def _matrix_start(text: str) -> tuple[list[str], list[str]] | None:
    """Words of the header and of the first row of a GPU matrix at the top of ``text``."""
    content = list(_content_lines(_head(text)))
    if len(content) < 2:
        return None
    header, row = content[0].split(), content[1].split()
    if not header or not _GPU_NAME.match(header[0]) or not row or not _GPU_NAME.match(row[0]):
        return None
    return header, row


@safe_sniff
def sniff_topo_matrix(text: str) -> bool:
    """A GPU header line, then a GPU row of X/NV#/PCIe-level cells or an Affinity column."""
    start = _matrix_start(text)
    if start is None:
        return False
    header, row = start
    if any(_P2P_STATUS_ONLY.match(w) for w in row[1:]):
        return False
    return "Affinity" in header or any(_TOPO_LINK_TOKEN.match(w) for w in row[1:])


# --- nvidia-smi topo -p2p r|w|rw|n|a -----------------------------------------------------

_P2P_CELL = re.compile(r"^(?:X|OK|CNS|GNS|TNS|NS|DR|U)$", re.ASCII)
_P2P_STATUS_ONLY = re.compile(r"^(?:OK|CNS|GNS|TNS|NS|DR|U)$", re.ASCII)


def parse_topo_p2p(text: str, source: str) -> NodeTopology:
    """``nvidia-smi topo -p2p r|w|rw|n|a`` -> the GPUs it lists (index only).

    The matrix says whether CUDA peer access would be allowed, not how GPUs are wired, so it
    adds no links; it is checked (one cell per GPU, X on the diagonal) and otherwise dropped.
    """
    lines = _split_lines(text)
    start = next((i for i, l in enumerate(lines) if l.strip() and not _is_command_line(l)), None)
    if start is None:
        raise ParseError(source, "empty: expected the output of `nvidia-smi topo -p2p`")
    names = lines[start].split()
    if not names or not all(_GPU_NAME.match(n) for n in names):
        raise ParseError(source, "expected a header of GPU names (GPU0 GPU1 ...)", start + 1)
    indices = [int(_GPU_NAME.match(n).group(1)) for n in names]  # type: ignore[union-attr]
    if len(set(indices)) != len(indices):
        raise ParseError(source, "header names a GPU twice", start + 1)
    seen: set[str] = set()
    for i in range(start + 1, len(lines)):
        line, lineno = lines[i], i + 1
        if line.strip().startswith("Legend"):
            break
        if not line.strip():
            continue
        words = line.split()
        label, row = words[0], words[1:]
        if label not in names or label in seen:
            message = f"expected a row for one of {', '.join(names)} (once), found {label[:40]!r}"
            raise ParseError(source, message, lineno)
        seen.add(label)
        if len(row) != len(names):
            message = f"row {label}: expected {len(names)} cells, found {len(row)}"
            raise ParseError(source, message, lineno)
        for column, cell in zip(names, row):
            if not _P2P_CELL.match(cell) or (cell == "X") != (column == label):
                expected = "X" if column == label else "OK, CNS, GNS, TNS, NS, DR or U"
                message = f"row {label}, column {column}: expected {expected}, found {cell!r}"
                raise ParseError(source, message, lineno)
    if not seen:
        raise ParseError(source, "no GPU rows below the header", start + 1)
    return _node((Device(index=i, vendor=Vendor.NVIDIA) for i in indices), (), source)


@safe_sniff
def sniff_topo_p2p(text: str) -> bool:
    """A GPU-only header, then a GPU row of X and P2P status codes (OK, GNS, ...)."""
    start = _matrix_start(text)
    if start is None:
        return False
    header, row = start
    return (
        all(_GPU_NAME.match(w) for w in header)
        and all(_P2P_CELL.match(w) for w in row[1:])
        and any(_P2P_STATUS_ONLY.match(w) for w in row[1:])
    )


# --- nvidia-smi -q -x and nvidia-smi -q ---------------------------------------------------


@dataclass(frozen=True)
class QueriedGpu:
    """One GPU as ``nvidia-smi -q`` or ``-q -x`` describes it; unknown facts are None.

    Holds facts :class:`Device` has no field for (MIG mode, architecture family, fabric state)
    for callers that need them; :meth:`device` gives the Device.
    """

    index: int  # position in the output: nvidia-smi lists GPUs in NVML index order
    name: str | None = None
    uuid: str | None = None
    pci_bus_id: str | None = None
    memory_bytes: int | None = None
    device_id: str | None = None  # "0x2330"
    arch: str | None = None  # "sm_80", only when the output has the compute capability
    architecture: str | None = None  # "Hopper", "Ampere", ... as printed
    minor_number: int | None = None  # /dev/nvidiaN: not always the index (comment below)
    mig_enabled: bool | None = None
    fabric_state: str | None = None  # "Completed", "In Progress", ... (NVLink fabric manager)
    fabric_clique_id: int | None = None

    def device(self) -> Device:
        # MIG: the whole GPU stays one Device with partition None; MIG instances are not listed.
        return Device(
            index=self.index,
            vendor=Vendor.NVIDIA,
            name=self.name,
            memory_bytes=self.memory_bytes,
            arch=self.arch,
            pci_bus_id=self.pci_bus_id,
            uuid=self.uuid,
            device_id=self.device_id,
        )


# Why the index is the position and not "Minor Number": nvidia-smi lists GPUs in NVML index
# order (the GPUn of `topo -m`), while the minor number is the /dev/nvidiaN the driver gave at
# probe time; on some machines the two differ (NVIDIA/nvidia-installer#21,
# PrincetonUniversity/jobstats#34).


def _mig(raw: str | None) -> bool | None:
    raw = _known(raw)
    return {"Enabled": True, "Disabled": False}.get(raw) if raw else None


def _small_int(raw: str | None) -> int | None:
    raw = _known(raw)
    return int(raw) if raw is not None and re.fullmatch(r"[0-9]{1,9}", raw, re.ASCII) else None


def _line_of(text: str, needle: str) -> int | None:
    at = text.find(needle)
    return text.count("\n", 0, at) + 1 if at >= 0 else None


def query_gpus_xml(text: str, source: str) -> tuple[QueriedGpu, ...]:
    """Every ``<gpu>`` of ``nvidia-smi -q -x`` output, in output order."""
    try:
        # ElementTree resolves no external entities, and the expat it ships with limits entity
        # expansion, so a hostile file cannot make it fetch or balloon.
        root = ET.fromstring(text)
    except ET.ParseError as e:
        line = e.position[0] if getattr(e, "position", None) else None
        raise ParseError(source, f"not well-formed XML ({e})", line) from None
    except ValueError as e:  # text the XML parser cannot even encode (lone surrogates)
        raise ParseError(source, f"not readable as XML ({e})") from None
    if root.tag != "nvidia_smi_log":
        message = f"expected <nvidia_smi_log> (the output of `nvidia-smi -q -x`), found <{root.tag}>"
        raise ParseError(source, message, 1)
    return tuple(_xml_gpu(gpu, k, text, source) for k, gpu in enumerate(root.findall("gpu")))


def _xml_text(gpu: ET.Element, path: str) -> str | None:
    el = gpu.find(path)
    return el.text.strip() if el is not None and el.text is not None else None


def _xml_gpu(gpu: ET.Element, position: int, text: str, source: str) -> QueriedGpu:
    raw_bus = _known(_xml_text(gpu, "pci/pci_bus_id")) or _known(gpu.get("id"))
    bus_id = _bus_id(raw_bus, source, _line_of(text, raw_bus), f"GPU {position}") if raw_bus else None
    raw_total = _xml_text(gpu, "fb_memory_usage/total")
    memory = None
    if raw_total is not None:
        line = _line_of(text, f"<total>{raw_total}")
        memory = _memory(raw_total, source, line, f"GPU {position} fb_memory_usage/total")
    major, minor = _small_int(_xml_text(gpu, "cuda_compute_capability/major")), _small_int(
        _xml_text(gpu, "cuda_compute_capability/minor")
    )
    return QueriedGpu(
        index=position,
        name=_known(_xml_text(gpu, "product_name")),
        uuid=_uuid(_xml_text(gpu, "uuid")),
        pci_bus_id=bus_id,
        memory_bytes=memory,
        device_id=_pci_device_id(_xml_text(gpu, "pci/pci_device_id")),
        arch=f"sm_{major}{minor}" if major is not None and minor is not None else None,
        architecture=_known(_xml_text(gpu, "product_architecture")),
        minor_number=_small_int(_xml_text(gpu, "minor_number")),
        mig_enabled=_mig(_xml_text(gpu, "mig_mode/current_mig")),
        fabric_state=_known(_xml_text(gpu, "fabric/state")),
    )


def parse_query_xml(text: str, source: str) -> NodeTopology:
    """``nvidia-smi -q -x`` -> GPUs with name, memory, UUID, PCI bus id and device id."""
    return _node((g.device() for g in query_gpus_xml(text, source)), (), source)


@safe_sniff
def sniff_query_xml(text: str) -> bool:
    head = text[:4096]
    return head.lstrip().startswith("<") and "<nvidia_smi_log" in head


_Q_GPU = re.compile(r"^GPU ([0-9A-Fa-f]{1,8}:[0-9A-Fa-f]{1,2}:[0-9A-Fa-f]{1,2}\.[0-7])\s*$", re.ASCII)
_Q_FIELD = re.compile(r"^(\s*)([^:]*?)\s*:(?:\s(.*))?$")


@dataclass
class _TextBlock:
    bus_id: str
    line: int
    fields: dict[tuple[str, ...], tuple[str, int]]  # section path + key -> (value, line)


def _text_blocks(text: str, source: str) -> list[_TextBlock]:
    """Split ``nvidia-smi -q`` into one block per GPU, each a map from the indented path of a
    field (e.g. ("FB Memory Usage", "Total")) to its value. First occurrence wins: the same path
    repeats only inside lists (MIG devices, processes) this parser does not read."""
    blocks: list[_TextBlock] = []
    stack: list[tuple[int, str]] = []  # (indent, section name) of the open sections
    for i, raw in enumerate(_split_lines(text)):
        lineno, line = i + 1, raw.expandtabs(8).rstrip()
        if not line.strip() or _is_command_line(line) or _is_elision(line):
            continue
        m = _Q_GPU.match(line)
        if m:
            blocks.append(_TextBlock(_bus_id(m.group(1), source, lineno, "GPU"), lineno, {}))
            stack = []
            continue
        indent = len(line) - len(line.lstrip())
        if not blocks:
            # above the first GPU: the "NVSMI LOG" banner and "Driver Version : ..." lines
            if indent == 0 and (line.startswith("=") or _Q_FIELD.match(line)):
                continue
            message = "expected 'Key : value' lines, then 'GPU 00000000:18:00.0'"
            raise ParseError(source, message, lineno)
        if indent == 0:
            message = f"expected an indented field or 'GPU <bus id>', found {line.strip()[:40]!r}"
            raise ParseError(source, message, lineno)
        while stack and stack[-1][0] >= indent:
            stack.pop()
        field = _Q_FIELD.match(line)
        if field is None:
            stack.append((indent, line.strip()))  # a section heading such as "FB Memory Usage"
            continue
        path = (*(name for _, name in stack), field.group(2))
        blocks[-1].fields.setdefault(path, ((field.group(3) or "").strip(), lineno))
    return blocks


def query_gpus_text(text: str, source: str) -> tuple[QueriedGpu, ...]:
    """Every GPU of ``nvidia-smi -q`` (text) output, in output order."""
    gpus = []
    seen: set[str] = set()
    for k, block in enumerate(_text_blocks(text, source)):
        if block.bus_id in seen:
            raise ParseError(source, f"GPU {block.bus_id} appears twice", block.line)
        seen.add(block.bus_id)

        def value(*path: str) -> str | None:
            found = block.fields.get(path)
            return found[0] if found else None

        listed_bus = _known(value("PCI", "Bus Id"))
        if listed_bus is not None:
            line = block.fields[("PCI", "Bus Id")][1]
            if _bus_id(listed_bus, source, line, "PCI Bus Id") != block.bus_id:
                message = f"PCI Bus Id {listed_bus} differs from the GPU heading {block.bus_id}"
                raise ParseError(source, message, line)
        memory = None
        if ("FB Memory Usage", "Total") in block.fields:
            raw, line = block.fields[("FB Memory Usage", "Total")]
            memory = _memory(raw, source, line, "FB Memory Usage / Total")
        gpus.append(
            QueriedGpu(
                index=k,
                name=_known(value("Product Name")),
                uuid=_uuid(value("GPU UUID")),
                pci_bus_id=block.bus_id,
                memory_bytes=memory,
                device_id=_pci_device_id(value("PCI", "Device Id")),
                architecture=_known(value("Product Architecture")),
                minor_number=_small_int(value("Minor Number")),
                mig_enabled=_mig(value("MIG Mode", "Current")),
                fabric_state=_known(value("Fabric", "State")),
                fabric_clique_id=_small_int(value("Fabric", "CliqueId")),
            )
        )
    return tuple(gpus)


def parse_query_text(text: str, source: str) -> NodeTopology:
    """``nvidia-smi -q`` -> GPUs with name, memory, UUID, PCI bus id and device id."""
    return _node((g.device() for g in query_gpus_text(text, source)), (), source)


@safe_sniff
def sniff_query_text(text: str) -> bool:
    """The "NVSMI LOG" banner, or output that starts at a 'GPU <bus id>' heading."""
    content = list(_content_lines(_head(text)))
    if not content:
        return False
    if "NVSMI LOG" in content[0]:
        return True
    return (
        bool(_Q_GPU.match(content[0]))
        and len(content) > 1
        and content[1].strip().startswith("Product Name")
    )


# --- nvidia-smi nvlink --status / -R ----------------------------------------------------

_NVLINK_GPU = re.compile(r"^GPU ([0-9]{1,6}): (.*?)\s*\(UUID: ([^)]*)\)", re.ASCII)
_NVLINK_LINE = re.compile(r"^\s*Link ([0-9]{1,4}): (.*?)\s*$", re.ASCII)
_NVLINK_SPEED = re.compile(r"^([0-9]{1,6}(?:\.[0-9]{1,6})?) GB/s$", re.ASCII)
_NVLINK_REMOTE = re.compile(r"^Remote Device (\S+): Link ([0-9]{1,4})$", re.ASCII)
_INACTIVE = "<inactive>"


@dataclass(frozen=True)
class _NvlinkGpu:
    index: int
    name: str | None
    uuid: str | None
    links: tuple[tuple[int, str, int], ...]  # (link number, status text, line)


def _nvlink_blocks(text: str, source: str) -> list[_NvlinkGpu]:
    """'GPU n: name (UUID: ...)' headings, each with its 'Link k: ...' lines. Elided parts
    ('[...]', '...') are skipped: an excerpt gives what it shows."""
    blocks: list[tuple[int, str | None, str | None, list[tuple[int, str, int]]]] = []
    for i, line in enumerate(_split_lines(text)):
        lineno = i + 1
        if not line.strip() or _is_command_line(line) or _is_elision(line):
            continue
        gpu = _NVLINK_GPU.match(line.strip())
        if gpu:
            index = int(gpu.group(1))
            if any(b[0] == index for b in blocks):
                raise ParseError(source, f"GPU {index} appears twice", lineno)
            blocks.append((index, _known(gpu.group(2)), _uuid(gpu.group(3)), []))
            continue
        link = _NVLINK_LINE.match(line)
        if link is None:
            message = f"expected 'GPU n: <name> (UUID: ...)' or 'Link k: ...', found {line.strip()[:40]!r}"
            raise ParseError(source, message, lineno)
        if not blocks:
            raise ParseError(source, "a 'Link' line before any 'GPU n: <name> (UUID: ...)' line", lineno)
        number = int(link.group(1))
        if any(n == number for n, _, _ in blocks[-1][3]):
            raise ParseError(source, f"GPU {blocks[-1][0]}: link {number} appears twice", lineno)
        blocks[-1][3].append((number, link.group(2), lineno))
    if not blocks:
        raise ParseError(source, "no 'GPU n: <name> (UUID: ...)' line")
    return [_NvlinkGpu(index, name, uuid, tuple(links)) for index, name, uuid, links in blocks]


def _nvlink_devices(blocks: Iterable[_NvlinkGpu]) -> list[Device]:
    return [Device(index=b.index, vendor=Vendor.NVIDIA, name=b.name, uuid=b.uuid) for b in blocks]


def nvlink_status(text: str, source: str) -> dict[int, tuple[int, float | None]]:
    """``nvidia-smi nvlink --status`` -> {GPU index: (active links, GB/s per link)}.

    Active links are those printed with a speed (``<inactive>`` ones are not). The speed is
    the slowest active link's, None when no link is active. In an excerpt ('[...]') the count
    is of the links shown, a lower bound.
    """
    result: dict[int, tuple[int, float | None]] = {}
    for block in _nvlink_blocks(text, source):
        speeds = []
        for number, status, lineno in block.links:
            if status == _INACTIVE:
                continue
            m = _NVLINK_SPEED.match(status)
            if m is None:
                message = (
                    f"GPU {block.index} link {number}: expected '<speed> GB/s' or '<inactive>', "
                    f"found {status[:40]!r}"
                )
                raise ParseError(source, message, lineno)
            speeds.append(float(m.group(1)))
        result[block.index] = (len(speeds), min(speeds) if speeds else None)
    return result


def parse_nvlink_status(text: str, source: str) -> NodeTopology:
    """``nvidia-smi nvlink --status`` -> GPUs with name and UUID. The command does not say
    where links lead, so no pair links; :func:`nvlink_status` gives the link counts."""
    nvlink_status(text, source)  # validates every link line
    return _node(_nvlink_devices(_nvlink_blocks(text, source)), (), source)


@dataclass(frozen=True)
class NvlinkRemote:
    """One active NVLink of a GPU and the PCI device at its other end."""

    link: int
    remote_bus_id: str  # normalised
    remote_link: int  # the port number on the remote device


def nvlink_remotes(text: str, source: str) -> dict[int, tuple[NvlinkRemote, ...]]:
    """``nvidia-smi nvlink -R`` -> {GPU index: its active links and their remote ends}."""
    result: dict[int, tuple[NvlinkRemote, ...]] = {}
    for block in _nvlink_blocks(text, source):
        remotes = []
        for number, status, lineno in block.links:
            if status == _INACTIVE:
                continue
            m = _NVLINK_REMOTE.match(status)
            if m is None:
                message = (
                    f"GPU {block.index} link {number}: expected 'Remote Device <bus id>: Link <n>', "
                    f"found {status[:40]!r}"
                )
                raise ParseError(source, message, lineno)
            bus_id = _bus_id(m.group(1), source, lineno, f"GPU {block.index} link {number}")
            remotes.append(NvlinkRemote(number, bus_id, int(m.group(2))))
        result[block.index] = tuple(remotes)
    return result


def nvswitch_bus_ids(
    remotes: Mapping[int, Iterable[NvlinkRemote]], gpu_bus_ids: Collection[str] | None = None
) -> frozenset[str]:
    """Remote devices that are NVSwitches, as far as the facts prove it.

    A remote reached on a port numbered MAX_NVLINKS_PER_GPU or higher is not a GPU (no GPU has
    that many links). When the GPUs' own bus ids are known (``nvidia-smi -q``), any remote that
    is not one of them is a switch too; ``nvlink -R`` alone does not print them.
    """
    gpus = set(gpu_bus_ids) if gpu_bus_ids is not None else None
    switches = set()
    for links in remotes.values():
        for r in links:
            if r.remote_link >= MAX_NVLINKS_PER_GPU or (gpus is not None and r.remote_bus_id not in gpus):
                switches.add(r.remote_bus_id)
    return frozenset(switches)


def nvlink_pair_links(
    remotes: Mapping[int, Iterable[NvlinkRemote]], gpu_bus_ids: Mapping[int, str] | None = None
) -> tuple[Link, ...]:
    """Pair links that ``nvlink -R`` proves, for the GPUs it shows.

    Two GPUs that both reach one NVSwitch are NVSWITCH, count = the smaller number of their
    links into switches (nvidia-smi's NV# on such systems). With ``gpu_bus_ids`` ({index: bus
    id}), links whose remote is another GPU are direct NVLINK, count = the links between them.
    """
    remotes = {g: tuple(rs) for g, rs in remotes.items()}
    bus_ids = dict(gpu_bus_ids or {})
    switches = nvswitch_bus_ids(remotes, bus_ids.values() if gpu_bus_ids is not None else None)
    into_switches = {g: [r for r in rs if r.remote_bus_id in switches] for g, rs in remotes.items()}
    gpu_at = {bus: g for g, bus in bus_ids.items()}
    links: dict[tuple[int, int], Link] = {}
    for a, b in ((a, b) for a in remotes for b in remotes if a < b):
        shared = {r.remote_bus_id for r in into_switches[a]} & {r.remote_bus_id for r in into_switches[b]}
        if shared:
            count = min(len(into_switches[a]), len(into_switches[b]))
            links[(a, b)] = Link(a, b, LinkKind.NVSWITCH, count=count)
    for g, rs in remotes.items():
        direct: dict[int, int] = {}
        for r in rs:
            peer = gpu_at.get(r.remote_bus_id)
            if peer is not None and peer != g:
                direct[peer] = direct.get(peer, 0) + 1
        for peer, count in direct.items():
            key = pair(g, peer)
            known = links.get(key)
            if known is not None and known.kind is LinkKind.NVLINK and known.count is not None:
                count = min(count, known.count)  # both ends listed: trust the smaller count
            if known is None or known.kind is LinkKind.NVLINK:
                links[key] = Link(*key, LinkKind.NVLINK, count=count)
    return tuple(sorted(links.values(), key=lambda l: (l.a, l.b)))


def parse_nvlink_remote(text: str, source: str) -> NodeTopology:
    """``nvidia-smi nvlink -R`` -> GPUs with name and UUID, and NVSWITCH pairs for GPUs that
    provably share a switch (none when one GPU is shown); see :func:`nvlink_pair_links`."""
    remotes = nvlink_remotes(text, source)
    return _node(_nvlink_devices(_nvlink_blocks(text, source)), nvlink_pair_links(remotes), source)


def _first_nvlink_status(text: str) -> str | None:
    """Status text of the first 'Link k:' line, if the output starts with a GPU heading."""
    content = list(_content_lines(_head(text)))
    if not content or not _NVLINK_GPU.match(content[0].strip()):
        return None
    for line in content[1:]:
        m = _NVLINK_LINE.match(line)
        if m:
            return m.group(2)
    return None


@safe_sniff
def sniff_nvlink_status(text: str) -> bool:
    status = _first_nvlink_status(text)
    return status is not None and (status == _INACTIVE or bool(_NVLINK_SPEED.match(status)))


@safe_sniff
def sniff_nvlink_remote(text: str) -> bool:
    status = _first_nvlink_status(text)
    return status is not None and status.startswith("Remote Device ")


FORMATS: list[RecordedFormat] = [
    RecordedFormat("nvidia-smi-topo-m", "nvidia-smi topo -m", sniff_topo_matrix, parse_topo_matrix),
    RecordedFormat("nvidia-smi-q-xml", "nvidia-smi -q -x", sniff_query_xml, parse_query_xml),
    RecordedFormat("nvidia-smi-q", "nvidia-smi -q", sniff_query_text, parse_query_text),
    RecordedFormat(
        "nvidia-smi-nvlink-status", "nvidia-smi nvlink --status", sniff_nvlink_status, parse_nvlink_status
    ),
    RecordedFormat(
        "nvidia-smi-nvlink-remote", "nvidia-smi nvlink -R", sniff_nvlink_remote, parse_nvlink_remote
    ),
    RecordedFormat("nvidia-smi-topo-p2p", "nvidia-smi topo -p2p rw", sniff_topo_p2p, parse_topo_p2p),
]

__all__ = [
    "FORMATS",
    "MAX_NVLINKS_PER_GPU",
    "NvlinkRemote",
    "QueriedGpu",
    "nvlink_pair_links",
    "nvlink_remotes",
    "nvlink_status",
    "nvswitch_bus_ids",
    "parse_nvlink_remote",
    "parse_nvlink_status",
    "parse_query_text",
    "parse_query_xml",
    "parse_topo_matrix",
    "parse_topo_p2p",
    "query_gpus_text",
    "query_gpus_xml",
]
