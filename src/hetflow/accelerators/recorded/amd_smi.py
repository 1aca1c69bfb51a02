"""Parsers for recorded AMD tool outputs: ``amd-smi topology`` (text and both JSON schemas),
``amd-smi xgmi``, ``rocminfo`` and ``rocm-bandwidth-test``.

Each parser turns one file into a *partial* :class:`NodeTopology` (only what that file shows)
named ``node0``; :mod:`hetflow.accelerators.merge` joins the partial nodes of one machine.
Device indices are the GPU indices the tool printed, or the order of the GPUs in
the file when it prints none. Bus ids are normalised to lowercase ``dddd:bb:dd.f``.

Try them on a fixture from the repository root (FILE = any fixture named below)::

    python -c 'import sys; from hetflow.accelerators.recorded.amd_smi import FORMATS as F;
    t = open(sys.argv[1]).read(); print([f.parse(t, "x") for f in F if f.sniff(t)])' FILE

(one command: join the two lines). Fixtures: tests/fixtures/topology/amd-mi300x-oam8_*,
amd-2gpu-pcie_*, amd-mi300x-x4-sriov-vm_rocminfo.txt, amd-mi210x4-*_rocm-bandwidth-test.txt.

Choices worth knowing (each is tested):

* ``amd-smi topology`` text may show any subset of its tables (the MI250X excerpt shows only a
  HOPS header and row 0). The parser keeps what is shown: devices from the header, one link per
  pair that any shown cell describes, with ``LinkKind.UNKNOWN`` when no LINK TYPE table names
  the kind. It fails only when no table is present or a table is malformed.
* A ``DISABLED`` access / link status is P2P accessibility, not absence of a path: the link is
  kept and its kind comes from the link type.
* ``rocminfo`` and ``rocm-bandwidth-test`` print bus/device/function without the PCI domain;
  the domain is taken as 0000 (checked against ``rocm-smi`` on the MI300X VM fixture: BDFID 9728
  = 0x2600 is ``0000:26:00.0`` there).
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from typing import Any, Callable

from hetflow.accelerators.recorded.base import RecordedFormat, partial_node
from hetflow.core.errors import ParseError
from hetflow.core.pci import normalize_pci_bus_id
from hetflow.core.topology import Device, Link, LinkKind, NodeTopology, Vendor

NOTE_AMD_SMI = "reported by amd-smi (max)"
NOTE_AMD_SMI_XGMI = "reported by amd-smi xgmi"
NOTE_RBT = "measured by rocm-bandwidth-test (unidirectional)"

# KFD link weights (API-NOTES.md): each xGMI hop adds 15, each PCIe segment 20 (the CPU-CPU
# fallback adds 10 or 12). A weight that is a multiple of 15 but not of 20 can only be made of
# xGMI hops; 60 is ambiguous (3 PCIe segments = MI210x8 across sockets), so it counts as PCIe.
XGMI_HOP_WEIGHT = 15
PCIE_SEGMENT_WEIGHT = 20

_LINK_KINDS = {"XGMI": LinkKind.XGMI, "PCIE": LinkKind.PCIE}


# --------------------------------------------------------------------------- shared helpers


def _amd_device(index: int, **facts: Any) -> Device:
    return Device(index=index, vendor=Vendor.AMD, **facts)


def _link_kind(link_type: str | None) -> LinkKind:
    if link_type is None:
        return LinkKind.UNKNOWN
    return _LINK_KINDS.get(link_type.upper(), LinkKind.UNKNOWN)


@dataclass
class _PairFacts:
    """What one file says about the path between two GPUs (either direction)."""

    link_type: str | None = None
    weight: int | None = None
    hops: int | None = None
    max_bandwidth_mbps: int | None = None
    seen: bool = False

    def add(
        self,
        *,
        link_type: str | None = None,
        weight: int | None = None,
        hops: int | None = None,
        max_bandwidth_mbps: int | None = None,
    ) -> None:
        # The first direction seen wins; the other only fills gaps (the tools print symmetric
        # matrices, so a disagreement would be a tool quirk, not something to resolve here).
        self.seen = True
        self.link_type = self.link_type or link_type
        self.weight = self.weight if self.weight is not None else weight
        self.hops = self.hops if self.hops is not None else hops
        if self.max_bandwidth_mbps is None:
            self.max_bandwidth_mbps = max_bandwidth_mbps

    def link(self, a: int, b: int) -> Link:
        kind = _link_kind(self.link_type)
        bandwidth = None
        if kind is LinkKind.XGMI and self.max_bandwidth_mbps:
            # amdsmi's min/max bandwidth is meaningful only for direct xGMI peers (API-NOTES).
            bandwidth = self.max_bandwidth_mbps / 1000.0
        return Link(
            a=min(a, b),
            b=max(a, b),
            kind=kind,
            weight=self.weight,
            hops=self.hops,
            bandwidth_gbps=bandwidth,
            bandwidth_note=NOTE_AMD_SMI if bandwidth is not None else None,
        )


@dataclass
class _PairTable:
    """Facts per unordered GPU pair, filled row by row."""

    pairs: dict[tuple[int, int], _PairFacts] = field(default_factory=dict)

    def add(self, a: int, b: int, **facts: Any) -> None:
        if a == b:
            return
        key = (min(a, b), max(a, b))
        self.pairs.setdefault(key, _PairFacts()).add(**facts)

    def links(self) -> list[Link]:
        return [facts.link(a, b) for (a, b), facts in sorted(self.pairs.items()) if facts.seen]


_NUMA_BW = re.compile(r"^(\d+)-(\d+)$")


def _numa_bandwidth_max(value: object, source: str, line: int | None = None) -> int | None:
    """``"50000-50000"`` (min-max MB/s) -> 50000; ``"N/A"`` -> None."""
    if value is None or (isinstance(value, str) and value.strip().upper() in ("N/A", "")):
        return None
    if isinstance(value, str):
        match = _NUMA_BW.match(value.strip())
        if match:
            return int(match[2])
    raise ParseError(source, f"NUMA bandwidth {value!r} is not 'min-max' in MB/s or N/A", line)


def _int_or_na(value: object, what: str, source: str, line: int | None = None) -> int | None:
    """An integer cell; ``"N/A"``, empty or absent (None) -> None."""
    if value is None:
        return None
    if isinstance(value, bool):
        raise ParseError(source, f"{what} {value!r} is not an integer", line)
    if isinstance(value, int):
        return value
    if isinstance(value, str):
        text = value.strip()
        if text.upper() in ("N/A", ""):
            return None
        if re.fullmatch(r"-?\d+", text):
            return int(text)
    raise ParseError(source, f"{what} {value!r} is not an integer or N/A", line)


# --------------------------------------------------------------- amd-smi topology (text)

_TOPOLOGY_TITLE = re.compile(r"^\s*([A-Z][A-Z /_-]*?)\s+TABLE:\s*$")
_TOPOLOGY_KNOWN = ("ACCESS", "WEIGHT", "HOPS", "LINK TYPE", "NUMA BW")


@dataclass
class _TextTable:
    title: str
    line: int
    header: list[str] | None = None
    header_line: int | None = None
    rows: list[tuple[int, str, list[str]]] = field(default_factory=list)  # (line, bdf, cells)


def _sniff_amd_smi_topology(text: str) -> bool:
    """An ``amd-smi topology`` text report: ``WEIGHT TABLE:``-style titles over BDF matrices."""
    for match in re.finditer(r"^\s*([A-Z][A-Z ]*?) TABLE:\s*$", text, re.MULTILINE):
        if match[1] in _TOPOLOGY_KNOWN:
            return True
    return False


def _read_text_tables(text: str, source: str) -> list[_TextTable]:
    tables: list[_TextTable] = []
    current: _TextTable | None = None
    for lineno, raw in enumerate(text.splitlines(), start=1):
        line = raw.strip()
        title = _TOPOLOGY_TITLE.match(raw)
        if title:
            current = _TextTable(title=title[1], line=lineno)
            tables.append(current)
            continue
        if not line:
            if current is not None and current.rows:
                current = None  # a blank line after rows ends the table
            continue
        if current is None:
            continue  # text between tables (warnings, banners) carries no topology
        tokens = line.split()
        if current.header is None:
            bus_ids = [normalize_pci_bus_id(t) for t in tokens]
            if any(b is None for b in bus_ids):
                raise ParseError(
                    source,
                    f"expected the {current.title} TABLE header (PCI bus ids), got {line!r}",
                    lineno,
                )
            current.header = [b for b in bus_ids if b is not None]
            current.header_line = lineno
            if len(set(current.header)) != len(current.header):
                raise ParseError(source, "a PCI bus id appears twice in the table header", lineno)
            continue
        row_bdf = normalize_pci_bus_id(tokens[0])
        if row_bdf is None or row_bdf not in current.header:
            raise ParseError(
                source,
                f"{current.title} TABLE row must start with a bus id from the header, "
                f"got {tokens[0]!r}",
                lineno,
            )
        cells = tokens[1:]
        if len(cells) != len(current.header):
            raise ParseError(
                source,
                f"{current.title} TABLE row has {len(cells)} cells, the header has "
                f"{len(current.header)} bus ids",
                lineno,
            )
        current.rows.append((lineno, row_bdf, cells))
    return tables


def _topology_cell(title: str, cell: str, source: str, line: int) -> dict[str, Any]:
    """One matrix cell -> the pair facts it states (empty when it states nothing)."""
    value = cell.strip()
    if title == "WEIGHT":
        return {"weight": _int_or_na(value, "weight", source, line)}
    if title == "HOPS":
        return {"hops": _int_or_na(value, "hop count", source, line)}
    if title == "LINK TYPE":
        kind = value.upper()
        if not re.fullmatch(r"[A-Z_/]+", kind):
            raise ParseError(source, f"link type {value!r} is not a word like XGMI or PCIE", line)
        return {"link_type": None if kind in ("N/A", "SELF") else kind}
    if title == "NUMA BW":
        return {"max_bandwidth_mbps": _numa_bandwidth_max(value, source, line)}
    if title == "ACCESS":
        if value.upper() not in ("ENABLED", "DISABLED", "N/A"):
            raise ParseError(source, f"access {value!r} is not ENABLED, DISABLED or N/A", line)
        return {}  # accessibility, not a link property hetflow records
    return {}


def parse_amd_smi_topology(text: str, source: str) -> NodeTopology:
    """Parse ``amd-smi topology`` text: devices from the table header, one link per pair.

    Tables may be any subset of ACCESS, WEIGHT, HOPS, LINK TYPE and NUMA BW (others are
    skipped); all must share one header. Raises ParseError when no table is present, headers
    differ, or a cell is unreadable.
    """
    tables = _read_text_tables(text, source)
    if not tables:
        raise ParseError(source, "no amd-smi topology table found (expected e.g. 'WEIGHT TABLE:')")
    with_header = [t for t in tables if t.header is not None]
    if not with_header:
        first = tables[0]
        raise ParseError(source, f"{first.title} TABLE has no header of PCI bus ids", first.line)
    header = with_header[0].header
    assert header is not None
    for table in with_header[1:]:
        if table.header != header:
            raise ParseError(
                source,
                f"{table.title} TABLE lists other GPUs than {with_header[0].title} TABLE",
                table.header_line,
            )
    position = {bdf: i for i, bdf in enumerate(header)}
    pairs = _PairTable()
    for table in with_header:
        if table.title not in _TOPOLOGY_KNOWN:
            continue
        for lineno, row_bdf, cells in table.rows:
            a = position[row_bdf]
            for b, cell in enumerate(cells):
                facts = _topology_cell(table.title, cell, source, lineno)
                if a != b and any(v is not None for v in facts.values()):
                    pairs.add(a, b, **facts)
    devices = [_amd_device(i, pci_bus_id=bdf) for i, bdf in enumerate(header)]
    return partial_node(source, devices, pairs.links())


# --------------------------------------------------------------- amd-smi topology --json


def _sniff_json_v1(text: str) -> bool:
    """ROCm 6.1 ``amd-smi topology --json``: a list of per-GPU dicts of ``gpu_N`` maps."""
    is_list = text.lstrip().startswith("[")
    return is_list and '"link_accessibility"' in text and '"links"' not in text


def _sniff_json_v2(text: str) -> bool:
    """ROCm 6.2 ``amd-smi topology -a -t --json``: per-GPU dicts with a ``links`` list."""
    return text.lstrip().startswith("[") and '"links"' in text and '"link_status"' in text


def _load_json_list(text: str, source: str) -> list[dict[str, Any]]:
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ParseError(source, f"not valid JSON: {exc.msg}", exc.lineno) from None
    except (RecursionError, ValueError) as exc:
        raise ParseError(source, f"not valid JSON: {exc}") from None
    if not isinstance(data, list) or not all(isinstance(item, dict) for item in data):
        raise ParseError(source, "expected a JSON list with one object per GPU")
    if not data:
        raise ParseError(source, "the JSON list is empty: no GPU was reported")
    return data


def _gpu_index(value: object, source: str, where: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ParseError(source, f"{where}: 'gpu' must be a GPU index (integer >= 0), got {value!r}")
    return value


def _gpu_key_index(key: str, source: str, where: str) -> int:
    match = re.fullmatch(r"gpu_(\d+)", key)
    if match is None:
        raise ParseError(source, f"{where}: key {key!r} is not of the form gpu_N")
    return int(match[1])


def _bus_id_field(value: object, source: str, where: str) -> str | None:
    if value is None:
        return None
    bdf = normalize_pci_bus_id(value) if isinstance(value, str) else None
    if bdf is None:
        raise ParseError(source, f"{where}: 'bdf' {value!r} is not a PCI bus id")
    return bdf


class _DeviceTable:
    """GPU index -> bus id, refusing contradictions."""

    def __init__(self, source: str) -> None:
        self.source = source
        self.bus_ids: dict[int, str | None] = {}

    def add(self, index: int, bdf: str | None, where: str) -> None:
        known = self.bus_ids.get(index)
        if known is not None and bdf is not None and known != bdf:
            raise ParseError(self.source, f"{where}: GPU {index} has bus id {bdf}, earlier {known}")
        if known is None:
            self.bus_ids[index] = bdf

    def devices(self) -> list[Device]:
        seen: dict[str, int] = {}
        for index, bdf in sorted(self.bus_ids.items()):
            if bdf is not None and bdf in seen:
                raise ParseError(self.source, f"GPUs {seen[bdf]} and {index} share bus id {bdf}")
            if bdf is not None:
                seen[bdf] = index
        return [_amd_device(i, pci_bus_id=b) for i, b in sorted(self.bus_ids.items())]


def parse_amd_smi_topology_json_v1(text: str, source: str) -> NodeTopology:
    """Parse the ROCm 6.1 ``amd-smi topology --json`` schema (no bus ids in it).

    Each entry: ``gpu``, and maps ``link_accessibility``, ``weight``, ``hops``, ``link_type``,
    ``numa_bandwidth`` keyed ``gpu_N``.
    """
    entries = _load_json_list(text, source)
    devices = _DeviceTable(source)
    pairs = _PairTable()
    field_readers: dict[str, Callable[[object, str], dict[str, Any]]] = {
        "weight": lambda v, w: {"weight": _int_or_na(v, f"{w} weight", source)},
        "hops": lambda v, w: {"hops": _int_or_na(v, f"{w} hops", source)},
        "link_type": lambda v, w: {"link_type": _json_link_type(v, source, w)},
        "numa_bandwidth": lambda v, w: {"max_bandwidth_mbps": _numa_bandwidth_max(v, source)},
    }
    for position, entry in enumerate(entries):
        where = f"entry {position}"
        a = _gpu_index(entry.get("gpu"), source, where)
        devices.add(a, _bus_id_field(entry.get("bdf"), source, where), where)
        for name, read in field_readers.items():
            table = entry.get(name)
            if table is None:
                continue
            if not isinstance(table, dict):
                raise ParseError(source, f"{where}: {name!r} must be an object keyed gpu_N")
            for key, value in table.items():
                b = _gpu_key_index(key, source, f"{where} {name}")
                devices.add(b, None, where)
                if a != b:
                    pairs.add(a, b, **read(value, f"{where} {key}"))
    return partial_node(source, devices.devices(), pairs.links())


def _json_link_type(value: object, source: str, where: str) -> str | None:
    if not isinstance(value, str) or not re.fullmatch(r"[A-Za-z_/]+", value.strip()):
        raise ParseError(source, f"{where}: link_type {value!r} is not a word like XGMI or PCIE")
    kind = value.strip().upper()
    return None if kind in ("SELF", "N/A") else kind


def parse_amd_smi_topology_json_v2(text: str, source: str) -> NodeTopology:
    """Parse the ROCm 6.2 ``amd-smi topology -a -t --json`` schema.

    Each entry: ``gpu``, ``bdf`` and ``links``, a list of ``{gpu, bdf, link_status,
    link_type}`` plus, when amd-smi printed them, ``weight``, ``hops``/``num_hops`` and
    ``bandwidth``/``numa_bandwidth`` ("min-max" MB/s).
    """
    entries = _load_json_list(text, source)
    devices = _DeviceTable(source)
    pairs = _PairTable()
    for position, entry in enumerate(entries):
        where = f"entry {position}"
        a = _gpu_index(entry.get("gpu"), source, where)
        devices.add(a, _bus_id_field(entry.get("bdf"), source, where), where)
        links = entry.get("links")
        if not isinstance(links, list):
            raise ParseError(source, f"{where}: 'links' must be a list")
        for link_position, link in enumerate(links):
            link_where = f"{where} link {link_position}"
            if not isinstance(link, dict):
                raise ParseError(source, f"{link_where}: expected an object")
            b = _gpu_index(link.get("gpu"), source, link_where)
            devices.add(b, _bus_id_field(link.get("bdf"), source, link_where), link_where)
            status = link.get("link_status")
            if status is not None and (
                not isinstance(status, str) or status.upper() not in ("ENABLED", "DISABLED", "N/A")
            ):
                raise ParseError(
                    source, f"{link_where}: link_status {status!r} is not ENABLED or DISABLED"
                )
            if a == b:
                continue
            hops = link.get("hops", link.get("num_hops"))
            bandwidth = link.get("bandwidth", link.get("numa_bandwidth"))
            pairs.add(
                a,
                b,
                link_type=_json_link_type(link.get("link_type", "N/A"), source, link_where),
                weight=_int_or_na(link.get("weight"), f"{link_where} weight", source),
                hops=_int_or_na(hops, f"{link_where} hops", source),
                max_bandwidth_mbps=_numa_bandwidth_max(bandwidth, source),
            )
    return partial_node(source, devices.devices(), pairs.links())


# --------------------------------------------------------------------------- amd-smi xgmi

_XGMI_TITLE = re.compile(r"^\s*LINK METRIC TABLE:\s*$", re.MULTILINE)
_XGMI_GPU_ROW = re.compile(r"^\s*GPU(\d+)\s+(\S+)\s+(.*)$")
_RATE = re.compile(r"^(\d+(?:\.\d+)?)\s*([KMGT]?)([bB])/s$")
_RATE_SCALE = {"": 1e-9, "K": 1e-6, "M": 1e-3, "G": 1.0, "T": 1e3}


def _sniff_amd_smi_xgmi(text: str) -> bool:
    """``amd-smi xgmi``: a ``LINK METRIC TABLE:`` with per-GPU bit rate and max bandwidth."""
    return _XGMI_TITLE.search(text) is not None and "max_bandwidth" in text


def _rate_gbytes(value: str, source: str, line: int) -> float | None:
    """``"512 Gb/s"`` -> 64.0 (GB/s); ``"N/A"`` -> None."""
    if value.upper() == "N/A":
        return None
    match = _RATE.match(value)
    if match is None:
        raise ParseError(source, f"rate {value!r} is not a number with a unit like Gb/s", line)
    amount = float(match[1]) * _RATE_SCALE[match[2]]
    return amount / 8.0 if match[3] == "b" else amount


def _split_rates(rest: str) -> list[str]:
    """``"32 Gb/s  512 Gb/s      XGMI"`` -> ``["32 Gb/s", "512 Gb/s", "XGMI"]``."""
    tokens = rest.split()
    values: list[str] = []
    for token in tokens:
        if values and re.fullmatch(r"[KMGT]?[bB]/s", token) and re.fullmatch(r"[\d.]+", values[-1]):
            values[-1] = f"{values[-1]} {token}"
        else:
            values.append(token)
    return values


def parse_amd_smi_xgmi(text: str, source: str) -> NodeTopology:
    """Parse ``amd-smi xgmi``: GPUs with bus ids; an XGMI link between every pair of GPUs
    whose link type is XGMI, at the per-link max bandwidth (512 Gb/s -> 64 GB/s per direction).

    This assumes the GPUs of the table form one fully connected hive, as on MI300X/MI325X
    (8 GPUs, 7 links each); the table does not say which peer each link reaches.
    """
    lines = text.splitlines()
    start = next((i for i, l in enumerate(lines) if _XGMI_TITLE.match(l)), None)
    if start is None:
        raise ParseError(source, "no 'LINK METRIC TABLE:' found: not amd-smi xgmi output")
    header: list[str] | None = None
    rows: dict[int, tuple[str, float | None, str]] = {}
    bus_seen: dict[str, int] = {}
    for lineno in range(start + 2, len(lines) + 1):
        line = lines[lineno - 1]
        tokens = line.split()
        if not tokens:
            continue
        if header is None and tokens[0] == "bdf":
            header = [b for b in (normalize_pci_bus_id(t) for t in tokens) if b is not None]
            continue
        row = _XGMI_GPU_ROW.match(line)
        if row is None:
            continue  # Read/Write counter rows and anything amd-smi adds later
        index, bdf = int(row[1]), normalize_pci_bus_id(row[2])
        if bdf is None:
            raise ParseError(source, f"GPU{index} row: {row[2]!r} is not a PCI bus id", lineno)
        values = _split_rates(row[3])
        if len(values) < 3:
            raise ParseError(
                source, f"GPU{index} row: expected bit_rate, max_bandwidth and link_type", lineno
            )
        _rate_gbytes(values[0], source, lineno)  # validated; bit rate alone is not bandwidth
        max_bandwidth = _rate_gbytes(values[1], source, lineno)
        if index in rows or bdf in bus_seen:
            raise ParseError(source, f"GPU{index} ({bdf}) is listed twice", lineno)
        rows[index] = (bdf, max_bandwidth, values[2].upper())
        bus_seen[bdf] = index
    if not rows and not header:
        raise ParseError(source, "LINK METRIC TABLE lists no GPU")
    if not rows:
        assert header is not None
        return partial_node(source, [_amd_device(i, pci_bus_id=b) for i, b in enumerate(header)], [])
    devices = [_amd_device(i, pci_bus_id=bdf) for i, (bdf, _, _) in rows.items()]
    xgmi = sorted(i for i, (_, _, kind) in rows.items() if kind == "XGMI")
    links = []
    for pos, a in enumerate(xgmi):
        for b in xgmi[pos + 1 :]:
            known = [bw for bw in (rows[a][1], rows[b][1]) if bw is not None]
            bandwidth = min(known) if known else None
            links.append(
                Link(
                    a=a,
                    b=b,
                    kind=LinkKind.XGMI,
                    bandwidth_gbps=bandwidth,
                    bandwidth_note=NOTE_AMD_SMI_XGMI if bandwidth is not None else None,
                )
            )
    return partial_node(source, devices, links)


# ------------------------------------------------------------------------------- rocminfo

_AGENT = re.compile(r"^\s*Agent\s+(\d+)\s*$")
_AGENT_FIELD = re.compile(r"^ {2}(?! )([^:]+?):\s*(.*?)\s*$")  # top level = two-space indent
_LEADING_INT = re.compile(r"^(\d+)")


def _sniff_rocminfo(text: str) -> bool:
    """``rocminfo``: an ``HSA Agents`` section of ``Agent N`` blocks with a ``Device Type``."""
    device_type = re.search(r"^\s*Device Type:\s*\w+", text, re.MULTILINE)
    return "HSA Agents" in text and device_type is not None


def _agent_blocks(text: str) -> list[tuple[int, dict[str, tuple[str, int]]]]:
    """Each ``Agent N`` block -> (first line, {top-level key: (value, line)})."""
    blocks: list[tuple[int, dict[str, tuple[str, int]]]] = []
    current: dict[str, tuple[str, int]] | None = None
    for lineno, line in enumerate(text.splitlines(), start=1):
        if _AGENT.match(line):
            current = {}
            blocks.append((lineno, current))
            continue
        if current is None:
            continue
        match = _AGENT_FIELD.match(line)
        if match and match[1] not in current:
            current[match[1]] = (match[2], lineno)
    return blocks


def _agent_int(fields: dict[str, tuple[str, int]], key: str, source: str) -> int | None:
    """``"29857(0x74a1)"`` or ``"304"`` -> int; None when the key is absent."""
    if key not in fields:
        return None
    value, line = fields[key]
    match = _LEADING_INT.match(value)
    if match is None:
        raise ParseError(source, f"rocminfo field {key!r} = {value!r} is not a number", line)
    return int(match[1])


def _rocminfo_gpu(index: int, fields: dict[str, tuple[str, int]], source: str) -> Device:
    chip = _agent_int(fields, "Chip ID", source)
    bdfid = _agent_int(fields, "BDFID", source)
    domain = _agent_int(fields, "Domain", source) or 0
    bus_id = None
    if bdfid:
        # ROCr's BDFID packs bus << 8 | device << 3 | function (KFD location_id).
        bus_id = f"{domain:04x}:{(bdfid >> 8) & 0xFF:02x}:{(bdfid >> 3) & 0x1F:02x}.{bdfid & 0x7}"
    name = fields.get("Name", ("", 0))[0]
    uuid = fields.get("Uuid", ("", 0))[0]
    marketing = fields.get("Marketing Name", ("", 0))[0]
    return _amd_device(
        index,
        name=marketing or None,
        arch=name if re.fullmatch(r"gfx[0-9a-f]+", name) else None,
        compute_units=_agent_int(fields, "Compute Unit", source),
        device_id=f"0x{chip:04x}" if chip else None,
        # "GPU-XX" is rocminfo's placeholder when the GPU has no unique id.
        uuid=uuid if re.fullmatch(r"GPU-[0-9a-fA-F]+", uuid) else None,
        pci_bus_id=bus_id,
    )


def parse_rocminfo(text: str, source: str) -> NodeTopology:
    """Parse ``rocminfo``: GPU agents become devices (index = order of GPU agents); CPU agents
    (one per NUMA node) give ``numa_nodes`` and ``cpu_cores`` (the sum of their Compute Unit,
    i.e. logical CPUs as KFD counts them). No links: rocminfo shows none.
    """
    blocks = _agent_blocks(text)
    if not blocks:
        raise ParseError(source, "no 'Agent N' block found: not rocminfo output")
    gpus: list[Device] = []
    cpu_cores: list[int | None] = []
    for first_line, fields in blocks:
        if "Device Type" not in fields:
            raise ParseError(source, "agent block has no 'Device Type' line", first_line)
        kind = fields["Device Type"][0].upper()
        if kind == "GPU":
            gpus.append(_rocminfo_gpu(len(gpus), fields, source))
        elif kind == "CPU":
            cpu_cores.append(_agent_int(fields, "Compute Unit", source))
    known_cores = [c for c in cpu_cores if c is not None]
    return partial_node(
        source,
        gpus,
        [],
        cpu_cores=sum(known_cores) if cpu_cores and len(known_cores) == len(cpu_cores) else None,
        numa_nodes=len(cpu_cores) or None,
    )


# ---------------------------------------------------------------------- rocm-bandwidth-test

_RBT_DEVICE = re.compile(r"^\s*Device:\s*(\d+)\s*,(.*)$")
_RBT_HEADER = re.compile(r"^\s*D/D((?:\s+\d+)+)\s*$")
_RBT_ROW = re.compile(r"^\s*(\d+)((?:\s+\S+)+)\s*$")
_RBT_UUID = re.compile(r"^GPU-[0-9a-fA-F]+$")
_Matrix = dict[tuple[int, int], float | None]  # (row device, column device) -> value


def _sniff_rocm_bandwidth_test(text: str) -> bool:
    """``rocm-bandwidth-test``: ``Device: N, name`` lines and ``D/D`` matrices."""
    return (
        re.search(r"^\s*Device:\s*\d+\s*,", text, re.MULTILINE) is not None
        and re.search(r"^\s*D/D\s", text, re.MULTILINE) is not None
    )


@dataclass
class _RbtDevice:
    number: int  # rocm-bandwidth-test's device number (CPUs and GPUs together)
    name: str | None
    uuid: str | None
    bus_id: str | None

    @property
    def is_gpu(self) -> bool:
        return self.uuid is not None or self.bus_id is not None


def _rbt_device(match: re.Match[str]) -> _RbtDevice:
    fields = [f.strip() for f in match[2].split(",")]
    uuid = next((f for f in fields[1:] if _RBT_UUID.match(f)), None)
    bus_id = next((b for b in (normalize_pci_bus_id(f) for f in fields[1:]) if b), None)
    return _RbtDevice(int(match[1]), fields[0] or None, uuid, bus_id)


def _rbt_read(text: str, source: str) -> tuple[list[_RbtDevice], dict[str, _Matrix]]:
    """Devices, and each matrix (by lower-case title) as {(row, column): value or None}."""
    devices: list[_RbtDevice] = []
    matrices: dict[str, _Matrix] = {}
    title: str | None = None
    columns: list[int] | None = None
    matrix: _Matrix | None = None
    for lineno, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        device = _RBT_DEVICE.match(line)
        if device:
            devices.append(_rbt_device(device))
            continue
        header = _RBT_HEADER.match(line)
        if header:
            if title is None:
                raise ParseError(source, "a D/D matrix header without a title above it", lineno)
            columns = [int(c) for c in header[1].split()]
            matrix = matrices.setdefault(title, {})
            continue
        row = _RBT_ROW.match(line)
        if row and matrix is not None and columns is not None:
            cells = row[2].split()
            if len(cells) != len(columns):
                raise ParseError(
                    source,
                    f"matrix row has {len(cells)} values, the D/D header has {len(columns)}",
                    lineno,
                )
            for column, cell in zip(columns, cells):
                matrix[(int(row[1]), column)] = _rbt_value(cell, source, lineno)
            continue
        # Any other line titles the next matrix ("Inter-Device Numa Distance", ...).
        title, columns, matrix = line.strip().lower(), None, None
    return devices, matrices


def _rbt_value(cell: str, source: str, line: int) -> float | None:
    if cell.upper() == "N/A":
        return None
    try:
        value = float(cell)
    except ValueError:
        raise ParseError(source, f"matrix value {cell!r} is not a number or N/A", line) from None
    if value != value or value in (float("inf"), float("-inf")):
        raise ParseError(source, f"matrix value {cell!r} is not a finite number", line)
    return value


def _rbt_matrix(matrices: dict[str, _Matrix], *words: str) -> _Matrix:
    for title, matrix in matrices.items():
        if all(word in title for word in words):
            return matrix
    return {}


def _rbt_kind(distance: int | None) -> LinkKind:
    if distance is None:
        return LinkKind.UNKNOWN
    only_xgmi = distance % XGMI_HOP_WEIGHT == 0 and distance % PCIE_SEGMENT_WEIGHT != 0
    return LinkKind.XGMI if distance > 0 and only_xgmi else LinkKind.PCIE


def _both_ways(matrix: _Matrix, a: int, b: int) -> list[float]:
    return [v for v in (matrix.get((a, b)), matrix.get((b, a))) if v is not None]


def parse_rocm_bandwidth_test(text: str, source: str) -> NodeTopology:
    """Parse ``rocm-bandwidth-test``: GPU devices (index = order among GPUs) and GPU-GPU links.

    A link's weight is the Numa Distance (the KFD weight); its kind is XGMI when that weight is
    made only of 15-per-hop xGMI steps, else PCIE. ``bandwidth_gbps`` is the measured
    unidirectional copy peak, the slower of the two directions. A GPU's NUMA node is the CPU
    device nearest to it. No matrices (a truncated run) still gives the devices.
    """
    devices, matrices = _rbt_read(text, source)
    if not devices:
        raise ParseError(source, "no 'Device: N, ...' line found: not rocm-bandwidth-test output")
    numbers = [d.number for d in devices]
    if len(set(numbers)) != len(numbers):
        raise ParseError(source, "a device number is listed twice")
    distance = _rbt_matrix(matrices, "numa", "distance")
    unidirectional = _rbt_matrix(matrices, "unidirectional")
    cpus = [d.number for d in devices if not d.is_gpu]
    gpus = [d for d in devices if d.is_gpu]
    result: list[Device] = []
    for index, gpu in enumerate(gpus):
        result.append(
            _amd_device(
                index,
                name=gpu.name,
                uuid=gpu.uuid,
                pci_bus_id=gpu.bus_id,
                numa_node=_rbt_numa_node(gpu.number, cpus, distance),
            )
        )
    links = []
    for i, a in enumerate(gpus):
        for j in range(i + 1, len(gpus)):
            b = gpus[j]
            weights = _both_ways(distance, a.number, b.number)
            measured = _both_ways(unidirectional, a.number, b.number)
            if not weights and not measured:
                continue
            weight = int(weights[0]) if weights else None
            bandwidth = min(measured) if measured else None
            links.append(
                Link(
                    a=i,
                    b=j,
                    kind=_rbt_kind(weight),
                    weight=weight,
                    bandwidth_gbps=bandwidth,
                    bandwidth_note=NOTE_RBT if bandwidth is not None else None,
                )
            )
    return partial_node(source, result, links, numa_nodes=len(cpus) or None)


def _rbt_numa_node(gpu: int, cpus: list[int], distance: _Matrix) -> int | None:
    """The position of the unique nearest CPU device (one per NUMA node), else None."""
    known = [(d[0], pos) for pos, cpu in enumerate(cpus) if (d := _both_ways(distance, gpu, cpu))]
    if not known:
        return None
    nearest = min(d for d, _ in known)
    closest = [pos for d, pos in known if d == nearest]
    return closest[0] if len(closest) == 1 else None


# -------------------------------------------------------------------------------- formats

AMD_SMI_TOPOLOGY = RecordedFormat(
    name="amd-smi-topology",
    command="amd-smi topology",
    sniff=_sniff_amd_smi_topology,
    parse=parse_amd_smi_topology,
)
AMD_SMI_TOPOLOGY_JSON_V1 = RecordedFormat(
    name="amd-smi-topology-json-v1",
    command="amd-smi topology --json  (ROCm 6.1)",
    sniff=_sniff_json_v1,
    parse=parse_amd_smi_topology_json_v1,
)
AMD_SMI_TOPOLOGY_JSON_V2 = RecordedFormat(
    name="amd-smi-topology-json-v2",
    command="amd-smi topology -a -t --json  (ROCm 6.2+)",
    sniff=_sniff_json_v2,
    parse=parse_amd_smi_topology_json_v2,
)
AMD_SMI_XGMI = RecordedFormat(
    name="amd-smi-xgmi",
    command="amd-smi xgmi",
    sniff=_sniff_amd_smi_xgmi,
    parse=parse_amd_smi_xgmi,
)
ROCMINFO = RecordedFormat(
    name="rocminfo",
    command="rocminfo",
    sniff=_sniff_rocminfo,
    parse=parse_rocminfo,
)
ROCM_BANDWIDTH_TEST = RecordedFormat(
    name="rocm-bandwidth-test",
    command="rocm-bandwidth-test",
    sniff=_sniff_rocm_bandwidth_test,
    parse=parse_rocm_bandwidth_test,
)

FORMATS: list[RecordedFormat] = [
    AMD_SMI_TOPOLOGY,
    AMD_SMI_TOPOLOGY_JSON_V1,
    AMD_SMI_TOPOLOGY_JSON_V2,
    AMD_SMI_XGMI,
    ROCMINFO,
    ROCM_BANDWIDTH_TEST,
]
