"""Recorded ``rocm-smi`` output (AMD) -> partial NodeTopology.

Three shapes of output, one reader each:

* **text** (``rocm-smi``, ``-a``, ``--showtopo``, ``--showtoponuma``, ``--showmeminfo vram``, ...):
  sections under ``==== Title ====`` banners. Topology sections hold GPU x GPU matrices
  ("Weight / Hops / Link Type between two GPUs"), "Concise Info" holds the plain table, and
  every other section holds ``GPU[i] : key: value`` lines.
* **CSV** (``--csv``): a ``device,...`` header, then one ``cardN,...`` row per GPU (and a
  ``system,...`` row for system-wide keys). rocm-smi strips commas out of values.
* **JSON** (``--json``): ``{"card0": {key: value}, "system": {key: value}}``; topology pairs sit
  under ``system`` as ``"(Topology) Weight between DRM devices 0 and 1"`` and so on.

All three feed the same key table (:data:`_DEVICE_KEYS`), so a fact means the same thing in
every shape. Each FORMATS entry names the command that produced the file; the text formats
share one parser and differ only in what their ``sniff`` accepts, so exactly one claims a file.

Facts only: a device index is rocm-smi's (``GPU[i]``/``cardi``, what HIP_VISIBLE_DEVICES
addresses), nothing is estimated, and a value rocm-smi could not read (``N/A``) stays None.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from typing import Callable

from hetflow.accelerators.recorded.base import RecordedFormat, partial_node
from hetflow.core.errors import ParseError
from hetflow.core.pci import normalize_pci_bus_id
from hetflow.core.topology import Device, Link, LinkKind, NodeTopology, PcieLevel, Vendor

# ---------------------------------------------------------------- value readers

# Values rocm-smi prints when it could not read a fact.
_UNKNOWN_VALUES = frozenset({"", "n/a", "na", "none", "unknown", "unsupported", "not supported", "xxxx"})
_INT = re.compile(r"[0-9]+")  # ASCII only: int() would also take other scripts' digits
_HEX_ID = re.compile(r"0x[0-9a-fA-F]+")
_GFX = re.compile(r"gfx[0-9a-z]+")
_COMPUTE_PARTITION = re.compile(r"[A-Z]PX")  # SPX, DPX, TPX, QPX, CPX
# KFD reports "no NUMA node" as -1; rocm-smi prints it through an unsigned 32-bit int.
_NO_NUMA = frozenset({-1, 2**32 - 1})


class _BadValue(ValueError):
    """A value that does not read as its key promises; turned into ParseError with the line."""


class _SkipValue(Exception):
    """The value is valid but carries nothing for this key (e.g. a hex Card Model)."""


def _is_unknown(value: str) -> bool:
    return value.strip().lower() in _UNKNOWN_VALUES


def _read_int(value: str) -> int:
    value = value.strip()
    if not _INT.fullmatch(value) or len(value) > 30:
        raise _BadValue(f"expected a whole number, got {value!r}")
    return int(value)


def _read_numa_node(value: str) -> int | None:
    value = value.strip()
    if value == "-1":
        return None
    number = _read_int(value)
    return None if number in _NO_NUMA else number


def _read_device_id(value: str) -> str:
    value = value.strip()
    if not _HEX_ID.fullmatch(value) or len(value) > 10:
        raise _BadValue(f"expected a hexadecimal PCI device id like 0x74a1, got {value!r}")
    return "0x" + value[2:].lower()


def _read_bus_id(value: str) -> str:
    """'0000:26:00.0' (any case, optional domain) -> lowercase 'dddd:bb:dd.f' (core/pci.py)."""
    normal = normalize_pci_bus_id(value)
    if normal is None:
        raise _BadValue(f"expected a PCI bus id like 0000:26:00.0, got {value!r}")
    return normal


def canonical_gfx(value: str) -> str:
    """rocm-smi's "GFX Version" -> the LLVM target name (gfx942, gfx90a, gfx1100).

    rocm-smi prints ``"gfx" + str(target_graphics_version)``: major, minor and stepping as
    decimal numbers written one after another, so gfx90a (9, 0, 10) appears as ``gfx9010`` and
    gfx90c as ``gfx9012``. LLVM writes the stepping as one hex digit. Majors are 7..12, so a
    leading "1" means a two-digit major. Anything else is returned lowercased, unchanged.
    """
    value = value.strip().lower()
    digits = value[3:]
    if not (_GFX.fullmatch(value) and _INT.fullmatch(digits)):
        return value
    major_len = 2 if digits.startswith("1") else 1
    major, minor, stepping = digits[:major_len], digits[major_len : major_len + 1], digits[major_len + 1 :]
    if not minor or not stepping or len(stepping) > 2 or int(stepping) > 15:
        return value
    return f"gfx{major}{minor}{int(stepping):x}"


def _read_gfx(value: str) -> str:
    value = value.strip().lower()
    if not _GFX.fullmatch(value) or len(value) > 16:
        raise _BadValue(f"expected a GFX target like gfx942, got {value!r}")
    return canonical_gfx(value)


def _read_partition(value: str) -> str | None:
    """Compute partition: SPX is the whole device (None); CPX, DPX, ... are partitions."""
    value = value.strip().upper()
    if not _COMPUTE_PARTITION.fullmatch(value):
        raise _BadValue(f"expected a compute partition such as SPX or CPX, got {value!r}")
    return None if value == "SPX" else value


def _read_text(value: str) -> str:
    value = " ".join(value.split())
    if not value:
        raise _BadValue("empty value")
    return value


def _read_model_name(value: str) -> str:
    """Card Model: a product name on older rocm-smi, a hex id on newer (kept only if a name)."""
    value = _read_text(value)
    if _HEX_ID.fullmatch(value):
        raise _SkipValue
    return value


def _read_model_id(value: str) -> str:
    """Card Model on newer rocm-smi is the PCI device id in hex (e.g. 0x744c)."""
    if not _HEX_ID.fullmatch(value.strip()):
        raise _SkipValue
    return _read_device_id(value)


# ---------------------------------------------------------------- per-device key table


@dataclass(frozen=True)
class _Key:
    """How one rocm-smi key becomes one Device field. Lower ``rank`` wins among candidates."""

    field: str
    read: Callable[[str], object]
    rank: int = 0


# Keys as rocm-smi prints them, lowercased and with single spaces. Older versions write
# "Card series"/"Card model" (model is the product name), newer ones "Card Series"/"Card Model"
# (model is the PCI device id in hex, e.g. 0x744c); both are matched case-insensitively.
_DEVICE_KEYS: dict[str, tuple[_Key, ...]] = {
    "vram total memory (b)": (_Key("memory_bytes", _read_int),),
    "device id": (_Key("device_id", _read_device_id),),
    "unique id": (_Key("uuid", _read_text),),
    "gfx version": (_Key("arch", _read_gfx),),
    "pci bus": (_Key("pci_bus_id", _read_bus_id),),
    "(topology) numa node": (_Key("numa_node", _read_numa_node),),
    "compute partition": (_Key("partition", _read_partition),),
    "card series": (_Key("name", _read_text, rank=0),),
    "card model": (
        _Key("name", _read_model_name, rank=1),
        # a hex Card Model is the PCI device id; "Device ID", when shown, is preferred
        _Key("device_id", _read_model_id, rank=1),
    ),
    "device name": (_Key("name", _read_text, rank=2),),
    "marketing name": (_Key("name", _read_text, rank=3),),
}
_CONCISE_NAME_RANK = 9  # the concise table cuts names to 20 characters: the last resort


# ---------------------------------------------------------------- facts collected from a file


@dataclass
class _Facts:
    """Everything one file says, with the line each fact came from, checked for contradictions."""

    source: str
    # device index -> field -> rank -> (value, line)
    devices: dict[int, dict[str, dict[int, tuple[object, int | None]]]] = field(default_factory=dict)
    # (a, b) with a < b -> attribute -> (value, line); attributes: kind, weight, hops
    links: dict[tuple[int, int], dict[str, tuple[object, int | None]]] = field(default_factory=dict)

    def error(self, message: str, line: int | None) -> ParseError:
        return ParseError(self.source, message, line)

    def add_device(self, index: int) -> dict[str, dict[int, tuple[object, int | None]]]:
        return self.devices.setdefault(index, {})

    def set_device(self, index: int, name: str, value: object, line: int | None, rank: int = 0) -> None:
        ranks = self.add_device(index).setdefault(name, {})
        self._check_same(ranks.get(rank), value, f"GPU {index} {name}", line)
        ranks[rank] = (value, line)

    def set_link(self, a: int, b: int, name: str, value: object, line: int | None) -> None:
        assert a != b, "callers skip the diagonal"
        self.add_device(a)
        self.add_device(b)
        attrs = self.links.setdefault((min(a, b), max(a, b)), {})
        self._check_same(attrs.get(name), value, f"link GPU{a}-GPU{b} {name}", line)
        attrs[name] = (value, line)

    def apply_key(self, index: int, key: str, value: object, line: int | None) -> None:
        """One ``key: value`` fact of GPU ``index``; unknown keys and N/A values are ignored."""
        readers = _DEVICE_KEYS.get(" ".join(key.lower().split()))
        self.add_device(index)
        if readers is None or value is None:
            return
        if not isinstance(value, (str, int, float)) or isinstance(value, bool):
            raise self.error(f"GPU {index} {key!r}: expected a plain value, got {type(value).__name__}", line)
        text = str(value)
        if _is_unknown(text):
            return
        for reader in readers:
            try:
                parsed = reader.read(text)
            except _SkipValue:
                continue
            except _BadValue as e:
                raise self.error(f"GPU {index} {key!r}: {e}", line) from None
            if parsed is not None or reader.field == "partition":
                self.set_device(index, reader.field, parsed, line, reader.rank)

    def _check_same(self, old: tuple[object, int | None] | None, value: object, what: str, line: int | None) -> None:
        if old is not None and old[0] != value:
            where = f" (line {old[1]})" if old[1] is not None else ""
            raise self.error(f"{what} is {value!r} here but {old[0]!r} earlier{where}", line)

    def build(self, what: str) -> NodeTopology:
        """The partial node; ParseError when the file showed no GPU at all."""
        if not self.devices:
            raise self.error(f"no GPU found; expected the output of {what}", None)
        devices = tuple(self._device(i) for i in sorted(self.devices))
        links = tuple(self._link(a, b) for a, b in sorted(self.links))
        return partial_node(self.source, devices, links)

    def _device(self, index: int) -> Device:
        best = {name: ranks[min(ranks)][0] for name, ranks in self.devices[index].items() if ranks}
        return Device(index=index, vendor=Vendor.AMD, **best)  # type: ignore[arg-type]

    def _link(self, a: int, b: int) -> Link:
        attrs = {name: value for name, (value, _) in self.links[(a, b)].items()}
        kind = attrs.pop("kind", None)
        if kind is None and attrs.get("weight") is not None:  # --showtopoweight alone
            kind, level = kind_from_weight(int(attrs["weight"]))  # type: ignore[arg-type]
            if level is not None:
                attrs["pcie_level"] = level
        return Link(a=a, b=b, kind=kind or LinkKind.UNKNOWN, **attrs)  # type: ignore[arg-type]


def kind_from_weight(weight: int) -> tuple[LinkKind, PcieLevel | None]:
    """The link kind a KFD weight implies when no link type was reported (``rocm-smi
    --showtopoweight`` alone). KFD adds 15 per xGMI hop and 20 per PCIe segment; observed:
    15/30/45 over xGMI (MI250), 13 between partitions of one socket (MI300X CPX), 40 or 52 for
    PCIe pairs, 60 across sockets (fixtures/topology/API-NOTES.md). So <= 45 and a multiple of 15
    (or below 15) is xGMI; above that PCIe: <= 40 through one host bridge (PHB), <= 52 inside a
    NUMA node (NODE), more across sockets (SYS) - which keeps the pairs in the weights' order."""
    if weight < 15 or (weight <= 45 and weight % 15 == 0):
        return LinkKind.XGMI, None
    if weight <= 40:
        return LinkKind.PCIE, PcieLevel.PHB
    if weight <= 52:
        return LinkKind.PCIE, PcieLevel.NODE
    return LinkKind.PCIE, PcieLevel.SYS


# ---------------------------------------------------------------- text output

_BANNER = re.compile(r"\s*={2,}\s*(?P<title>[^=\s](?:[^=]*[^=\s])?)\s*={2,}\s*")
_FRAME_TITLES = frozenset({"rocm system management interface", "end of rocm smi log"})
# "GPU[0]\t\t: key: value" (most sections) or "GPU 0   : key: value" (older --showtopo)
_KEY_VALUE = re.compile(r"\s*GPU(?:\[\s*(?P<a>[0-9]{1,6})\s*\]|\s+(?P<b>[0-9]{1,6}))\s*:\s*(?P<rest>.*)")
_SPLIT_KEY = re.compile(r"(?P<key>[^:]*[^:\s])\s*:(?:\s+(?P<value>.*)|$)")
_GPU_LABEL = re.compile(r"GPU([0-9]{1,6})")


def _matrix_link_kind(cell: str) -> LinkKind | None:
    upper = cell.upper()
    if upper == "XGMI":
        return LinkKind.XGMI
    if upper == "PCIE":
        return LinkKind.PCIE
    # "XXXX" is rocm-smi's unknown type; "0" off the diagonal is its unfilled initial value
    if upper in ("XXXX", "N/A", "0"):
        return None
    raise _BadValue(f"expected XGMI, PCIE or XXXX, got {cell!r}")


def _matrix_number(cell: str) -> int | None:
    if _is_unknown(cell):
        return None
    number = _read_int(cell)
    # rocm-smi leaves a pair it could not read at its initial 0; no two GPUs are 0 apart
    return number or None


@dataclass(frozen=True)
class _Matrix:
    attribute: str  # Link attribute the cells fill
    read: Callable[[str], object]


_MATRICES = {
    "weight between two gpus": _Matrix("weight", _matrix_number),
    "hops between two gpus": _Matrix("hops", _matrix_number),
    "link type between two gpus": _Matrix("kind", _matrix_link_kind),
}


@dataclass
class _Section:
    title: str  # lowercased; "" for lines before the first banner
    line: int  # 1-based line of the banner
    lines: list[tuple[int, str]] = field(default_factory=list)


def _banner_title(line: str) -> str | None:
    """The lowercased title of a ``=== Title ===`` banner line, else None."""
    stripped = line.strip()
    # cheap test first: the regex backtracks on long lines that are not banners
    if not (stripped.startswith("==") and stripped.endswith("==")):
        return None
    m = _BANNER.fullmatch(stripped)
    return " ".join(m["title"].lower().split()) if m else None


def _sections(text: str) -> list[_Section]:
    """Split at titled ``=== Title ===`` banners; untitled ``=====`` rules stay inside a section."""
    sections = [_Section("", 0)]
    for number, line in enumerate(text.splitlines(), start=1):
        title = _banner_title(line)
        if title is not None:
            sections.append(_Section(title, number))
        else:
            sections[-1].lines.append((number, line))
    return sections


def _banner_titles(text: str) -> set[str]:
    return {t for t in map(_banner_title, text.splitlines()) if t is not None}


def _read_key_values(section: _Section, facts: _Facts) -> None:
    for number, line in section.lines:
        m = _KEY_VALUE.fullmatch(line)
        if not m:
            continue
        kv = _SPLIT_KEY.fullmatch(m["rest"])
        if kv:
            index = int(m["a"] or m["b"])
            facts.apply_key(index, kv["key"], kv["value"] or "", number)


def _read_matrix(section: _Section, matrix: _Matrix, facts: _Facts) -> frozenset[int] | None:
    """One GPU x GPU matrix -> link facts; returns the GPUs it covers (None if it had no header)."""
    columns: list[int] | None = None
    rows: dict[int, tuple[int, list[object]]] = {}
    for number, line in section.lines:
        tokens = line.split()
        if not tokens or _KEY_VALUE.fullmatch(line) or not _GPU_LABEL.fullmatch(tokens[0]):
            continue  # blank lines, warnings, NUMA lines printed inside the section
        labels = [_GPU_LABEL.fullmatch(t) for t in tokens]
        if all(labels):
            if columns is not None:
                raise facts.error(f"second header row in '{section.title}'", number)
            columns = [int(m[1]) for m in labels if m]
            if len(set(columns)) != len(columns):
                raise facts.error("a GPU appears twice in the matrix header", number)
            continue
        row = int(labels[0][1])  # type: ignore[index]
        if columns is None:
            raise facts.error(f"row GPU{row} before the header row of '{section.title}'", number)
        if row not in columns or row in rows:
            what = "is not in the header" if row not in columns else "appears twice"
            raise facts.error(f"row GPU{row} {what}", number)
        cells = tokens[1:]
        if len(cells) != len(columns):
            raise facts.error(f"row GPU{row} has {len(cells)} cells, the header {len(columns)} GPUs", number)
        try:
            rows[row] = (number, [matrix.read(c) for c in cells])
        except _BadValue as e:
            raise facts.error(f"row GPU{row} of '{section.title}': {e}", number) from None
    if columns is None:
        return None
    missing = sorted(set(columns) - set(rows))
    if missing:
        raise facts.error(f"'{section.title}' has no row for GPU{missing[0]}", section.line)
    _record_symmetric(columns, rows, matrix, section.title, facts)
    return frozenset(columns)


def _record_symmetric(
    columns: list[int], rows: dict[int, tuple[int, list[object]]], matrix: _Matrix, title: str, facts: _Facts
) -> None:
    position = {gpu: i for i, gpu in enumerate(columns)}
    for a in columns:
        facts.add_device(a)
        for b in columns:
            if a >= b:
                continue
            line_a, cells_a = rows[a]
            line_b, cells_b = rows[b]
            forward, backward = cells_a[position[b]], cells_b[position[a]]
            if forward != backward:
                raise facts.error(
                    f"'{title}' is not symmetric: GPU{a}->GPU{b} is {forward}, GPU{b}->GPU{a} is {backward}",
                    max(line_a, line_b),
                )
            if forward is not None:
                facts.set_link(a, b, matrix.attribute, forward, line_a)


_CONCISE_ROW = re.compile(r"(?P<index>[0-9]{1,6})\s+(?P<rest>\S.*)")
# ROCm 6.0: "0   [0x74a1 : 0x00]  ..."; ROCm 6.1+: "0   4   0x74a1,   28851  ..." (Node, DID, GUID)
_CONCISE_DID = re.compile(r"\[\s*(?P<a>0x[0-9a-fA-F]+)\s*:|[0-9]+\s+(?P<b>0x[0-9a-fA-F]+),")
_CONCISE_PARTITIONS = re.compile(r"(?:NPS[0-9]+|N/A),\s*(?P<compute>[A-Z]PX|N/A)\b")


def _read_concise(section: _Section, facts: _Facts) -> None:
    """The plain ``rocm-smi`` table: one row per GPU, on ROCm 6.0 a name line under each row."""
    previous_row: int | None = None
    for number, line in section.lines:
        try:
            previous_row = _read_concise_line(number, line, previous_row, facts)
        except _BadValue as e:
            raise facts.error(f"concise table: {e}", number) from None


def _read_concise_line(number: int, line: str, previous_row: int | None, facts: _Facts) -> int | None:
    """One line of the concise table; returns the GPU whose name may follow on the next line."""
    m = _CONCISE_ROW.fullmatch(line)
    if m:
        index = int(m["index"])
        facts.add_device(index)
        did = _CONCISE_DID.match(m["rest"])
        if did:
            facts.set_device(index, "device_id", _read_device_id(did["a"] or did["b"]), number, rank=2)
        partitions = _CONCISE_PARTITIONS.search(m["rest"])
        if partitions and partitions["compute"] != "N/A":
            facts.set_device(index, "partition", _read_partition(partitions["compute"]), number)
        return index
    if previous_row is not None and line[:1].isspace() and line.strip():
        facts.set_device(previous_row, "name", _read_text(line), number, rank=_CONCISE_NAME_RANK)
    return None if line.strip() else previous_row


def parse_text(text: str, source: str) -> NodeTopology:
    """Any rocm-smi text output -> partial node (links from topology matrices, device facts).

    Contract: matrices must have one header row, one row per header GPU with one cell per GPU,
    and be symmetric; every matrix in the file must cover the same GPUs. Values of known keys
    must read as their kind (bytes, hex id, bus id, gfx target). Otherwise ParseError with the
    1-based line. Unknown sections and keys are ignored.
    """
    facts = _Facts(source)
    covered: list[tuple[frozenset[int], _Section]] = []
    for section in _sections(text):
        matrix = _MATRICES.get(section.title)
        if matrix is not None:
            gpus = _read_matrix(section, matrix, facts)
            if gpus is not None:
                covered.append((gpus, section))
        elif section.title == "concise info":
            _read_concise(section, facts)
        _read_key_values(section, facts)
    for gpus, section in covered[1:]:
        if gpus != covered[0][0]:
            raise facts.error(
                f"'{section.title}' covers GPUs {sorted(gpus)} but '{covered[0][1].title}' "
                f"covers {sorted(covered[0][0])}",
                section.line,
            )
    return facts.build("rocm-smi")


# ---------------------------------------------------------------- CSV and JSON output

_CARD = re.compile(r"card([0-9]{1,6})")
_PAIR_KEY = re.compile(
    r"\(topology\) (?P<what>weight|hops|link type|link accessibility) between drm devices "
    r"(?P<a>[0-9]{1,6}) and (?P<b>[0-9]{1,6})"
)
_PAIR_READERS: dict[str, _Matrix] = {
    "weight": _Matrix("weight", _matrix_number),
    "hops": _Matrix("hops", _matrix_number),
    "link type": _Matrix("kind", _matrix_link_kind),
}

# record name ("card0", "system") -> key -> (value, line)
_Records = dict[str, dict[str, tuple[object, int | None]]]


def _read_records(records: _Records, facts: _Facts) -> None:
    for name, fields in records.items():
        card = _CARD.fullmatch(name)
        if card:
            index = int(card[1])
            facts.add_device(index)
            for key, (value, line) in fields.items():
                facts.apply_key(index, key, value, line)
        elif name == "system":
            for key, (value, line) in fields.items():
                _read_pair(key, value, line, facts)


def _read_pair(key: str, value: object, line: int | None, facts: _Facts) -> None:
    m = _PAIR_KEY.fullmatch(" ".join(key.lower().split()))
    if not m or m["what"] not in _PAIR_READERS:
        return  # link accessibility and non-topology system keys carry no Link field
    a, b = int(m["a"]), int(m["b"])
    if a == b:
        raise facts.error(f"{key!r}: a GPU paired with itself", line)
    if value is None:
        return
    if not isinstance(value, (str, int)) or isinstance(value, bool):
        raise facts.error(f"{key!r}: expected a plain value, got {type(value).__name__}", line)
    reader = _PAIR_READERS[m["what"]]
    try:
        parsed = reader.read(str(value).strip())
    except _BadValue as e:
        raise facts.error(f"{key!r}: {e}", line) from None
    facts.add_device(a)
    facts.add_device(b)
    if parsed is not None:
        # newer rocm-smi prints one direction, older both: set_link checks they agree
        facts.set_link(a, b, reader.attribute, parsed, line)


def parse_csv(text: str, source: str) -> NodeTopology:
    """``rocm-smi ... --csv`` -> partial node. Rows must have one cell per header column."""
    facts = _Facts(source)
    header: list[str] | None = None
    records: _Records = {}
    for number, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        cells = [c.strip() for c in line.split(",")]
        if header is None:
            if cells[0].lower() != "device":
                raise facts.error("expected the CSV header 'device,...' first", number)
            header = cells
            continue
        if len(cells) != len(header):
            raise facts.error(f"row has {len(cells)} cells, the header {len(header)}", number)
        name = cells[0].lower()
        if not (_CARD.fullmatch(name) or name == "system"):
            raise facts.error(f"expected a row for cardN or system, got {cells[0]!r}", number)
        if name in records:
            raise facts.error(f"second row for {cells[0]}", number)
        records[name] = {key: (value, number) for key, value in zip(header[1:], cells[1:])}
    _read_records(records, facts)
    return facts.build("rocm-smi --csv")


def _json_line(text: str, record: str, key: str) -> int | None:
    """Line of ``key`` inside ``record`` in the JSON text, for error messages (best effort)."""
    start = text.find(json.dumps(record))
    at = text.find(json.dumps(key), max(start, 0))
    return text.count("\n", 0, at) + 1 if at >= 0 else None


def parse_json(text: str, source: str) -> NodeTopology:
    """``rocm-smi ... --json`` -> partial node. Broken JSON is a ParseError with its line."""
    facts = _Facts(source)
    try:
        data = json.loads(text)
    except json.JSONDecodeError as e:
        raise facts.error(f"not valid JSON: {e.msg} (column {e.colno})", e.lineno) from None
    except (ValueError, RecursionError) as e:  # e.g. a number too long to convert, deep nesting
        raise facts.error(f"not readable JSON: {e}", None) from None
    if not isinstance(data, dict):
        raise facts.error(f"expected a JSON object of cards, got {type(data).__name__}", 1)
    records: _Records = {}
    for name, fields in data.items():
        if not (_CARD.fullmatch(name) or name == "system"):
            continue
        if not isinstance(fields, dict):
            raise facts.error(f"{name!r}: expected an object of key/value pairs", _json_line(text, name, name))
        records[name] = {key: (value, _json_line(text, name, key)) for key, value in fields.items()}
    _read_records(records, facts)
    return facts.build("rocm-smi --json")


# ---------------------------------------------------------------- sniffing


def _topology_titles(titles: set[str]) -> bool:
    return any(t in _MATRICES for t in titles)


def sniff_showtopo(text: str) -> bool:
    """``rocm-smi --showtopo``: at least one "... between two GPUs" matrix banner."""
    return isinstance(text, str) and _topology_titles(_banner_titles(text))


def _only_section(text: str, title: str) -> bool:
    return isinstance(text, str) and _banner_titles(text) - _FRAME_TITLES == {title}


def sniff_showtoponuma(text: str) -> bool:
    """``rocm-smi --showtoponuma``: a "Numa Nodes" section and nothing else."""
    return _only_section(text, "numa nodes")


def sniff_meminfo(text: str) -> bool:
    """``rocm-smi --showmeminfo ...``: a "Memory Usage (Bytes)" section and nothing else."""
    return _only_section(text, "memory usage (bytes)")


def sniff_concise(text: str) -> bool:
    """Plain ``rocm-smi``: a "Concise Info" section and nothing else."""
    return _only_section(text, "concise info")


# Sections that, alone in a file, belong to the single-query formats above.
_SINGLE_QUERY_SECTIONS = frozenset({"numa nodes", "memory usage (bytes)", "concise info"})


def sniff_all(text: str) -> bool:
    """``rocm-smi -a`` (or another per-GPU text query such as ``--showid --showbus``): the
    rocm-smi banner, ``GPU[i] : key: value`` lines, and no file the formats above claim."""
    if not isinstance(text, str):
        return False
    titles = _banner_titles(text)
    sections = titles - _FRAME_TITLES
    if "rocm system management interface" not in titles or _topology_titles(titles):
        return False
    if len(sections) == 1 and sections <= _SINGLE_QUERY_SECTIONS:
        return False
    return any(_KEY_VALUE.fullmatch(line) for line in text.splitlines())


_JSON_PAIR = re.compile(r'"\(Topology\) [A-Za-z ]+ between DRM devices [0-9]+ and [0-9]+"')
_JSON_CARD = re.compile(r'"card[0-9]+"\s*:\s*\{')


def sniff_showtopo_json(text: str) -> bool:
    """``rocm-smi --showtopo --json``: an object with "(Topology) ... between DRM devices" keys."""
    return isinstance(text, str) and text.lstrip().startswith("{") and bool(_JSON_PAIR.search(text))


def sniff_json(text: str) -> bool:
    """Other ``rocm-smi ... --json``: an object of "cardN" objects, no topology pairs."""
    return (
        isinstance(text, str)
        and text.lstrip().startswith("{")
        and bool(_JSON_CARD.search(text))
        and not _JSON_PAIR.search(text)
    )


_CSV_ROW_START = re.compile(r"(card[0-9]+|system),", re.IGNORECASE)


def sniff_csv(text: str) -> bool:
    """``rocm-smi ... --csv``: a "device,..." header, then a "cardN," or "system," row."""
    if not isinstance(text, str):
        return False
    lines = (line.strip() for line in text.splitlines() if line.strip())
    header, first_row = next(lines, ""), next(lines, "")
    return header.lower().startswith("device,") and bool(_CSV_ROW_START.match(first_row))


FORMATS: list[RecordedFormat] = [
    RecordedFormat("rocm-smi-showtopo", "rocm-smi --showtopo", sniff_showtopo, parse_text),
    RecordedFormat("rocm-smi-showtoponuma", "rocm-smi --showtoponuma", sniff_showtoponuma, parse_text),
    RecordedFormat("rocm-smi-meminfo", "rocm-smi --showmeminfo vram", sniff_meminfo, parse_text),
    RecordedFormat("rocm-smi-concise", "rocm-smi", sniff_concise, parse_text),
    RecordedFormat("rocm-smi-all", "rocm-smi -a", sniff_all, parse_text),
    RecordedFormat("rocm-smi-showtopo-json", "rocm-smi --showtopo --json", sniff_showtopo_json, parse_json),
    RecordedFormat("rocm-smi-json", "rocm-smi --showproductname --showmeminfo vram --json", sniff_json, parse_json),
    RecordedFormat("rocm-smi-csv", "rocm-smi --showproductname --showmeminfo vram --csv", sniff_csv, parse_csv),
]
