"""The accelerator catalog: load ``data/catalog.yaml`` and find rows by any spelling.

Usage::

    from hetflow.accelerators.catalog import default_catalog
    spec = default_catalog().lookup("AMD-Instinct-MI300X-OAM")   # -> the MI300X row
    spec = default_catalog().find("NVIDIA A100-SXM4-80GB")       # None when unknown

Names are canonicalised before matching: case is ignored, every run of characters other than
letters and digits separates tokens and is dropped, and vendor words ("NVIDIA", "AMD",
"Tesla", "GeForce", "Instinct", ...) are dropped, so "mi300x", "AMD Instinct MI300X" and
"AMD-Instinct-MI300X-OAM" all reach the MI300X row through its aliases. PCI device ids
("0x74a1") are aliases too; NVML's combined form "0x233010DE" (device << 16 | vendor) is
reduced to the device part.

The file is read strictly: a missing or unknown key, a wrong type or a duplicate spelling is an
:class:`InputError` naming the row and the key.
"""

from __future__ import annotations

import dataclasses
import difflib
import enum
import functools
import re
import types
import typing
from importlib import resources
from pathlib import Path
from typing import Callable, Any, Iterator

import yaml

from hetflow.core.errors import InputError, ParseError
from hetflow.core.topology import LinkKind, Vendor
from hetflow.core.units import parse_bytes
from hetflow.accelerators.spec import AcceleratorSpec

SCHEMA = "hetflow.catalog/v1"
_TOP_LEVEL_KEYS = ("schema", "shared_aliases", "accelerators")

# Words that name a vendor or a product line rather than a model; dropped before matching.
_NOISE_WORDS = frozenset(
    {
        "nvidia", "amd", "ati", "advanced", "micro", "devices", "inc", "corporation", "corp",
        "tesla", "geforce", "instinct", "radeon", "gpu", "accelerator",
    }
)
_TOKEN = re.compile(r"[a-z0-9]+")
# NVML's pciDeviceId: device id in the high 16 bits, vendor (NVIDIA 10de, AMD 1002) below.
_NVML_PCI_ID = re.compile(r"^0x([0-9a-f]{4})(?:10de|1002)$")
_PCI_ID = re.compile(r"^0x[0-9a-f]{4}$")
# A device's reported memory is a few percent under the nominal size (T4: 15360 of 16384 MiB);
# beyond this relative distance a name match is not trusted for a partial (prefix) match.
_MEMORY_TOLERANCE = 0.12


def name_tokens(text: str) -> list[str]:
    """The tokens of a product name that identify the model (lower case, no vendor words)."""
    tokens = [t for t in _TOKEN.findall(text.lower()) if t not in _NOISE_WORDS]
    if len(tokens) == 1:
        nvml = _NVML_PCI_ID.match(tokens[0])
        if nvml:
            return [f"0x{nvml.group(1)}"]
    return tokens


def model_matcher(text: str | None, catalog: "Catalog | None" = None) -> "Callable[[str | None], bool] | None":
    """The one model-name rule of every request (``hetflow plan --model``, a job file's
    ``devices.model`` of every config schema, hetflow.core.devices): a device's model matches when it is
    the asked-for catalog model ("RTX4090" is "RTX-4090") or starts with the asked-for words,
    ignoring case, punctuation and vendor words - "H100" matches "H100-SXM" and "H100-PCIe",
    "V100" both V100 rows, but "A10" not "A100-80GB". None for no constraint. ``catalog``:
    whose spellings count (default: the shipped catalog)."""
    if not text:
        return None
    catalog = catalog if catalog is not None else default_catalog()
    spec = catalog.find(text)
    canonical = spec.name if spec else None
    words = tuple(name_tokens(text))

    def matches(model: str | None) -> bool:
        if canonical is not None and model is not None:
            if model == canonical:
                return True
            found = catalog.find(model)  # another spelling of the same catalog model
            if found is not None and found.name == canonical:
                return True
        tokens = tuple(name_tokens(model or ""))
        return bool(words) and tokens[:len(words)] == words

    return matches


def canonical_key(text: str) -> str:
    """The matching key of a name: ``"AMD-Instinct-MI300X-OAM"`` -> ``"mi300xoam"``."""
    return "".join(name_tokens(text))


class Catalog:
    """Accelerator specs with lookup by canonical name, alias, product name or PCI id.

    ``specs`` keeps the file's row order. Immutable after construction.
    """

    def __init__(
        self,
        specs: typing.Iterable[AcceleratorSpec],
        shared_aliases: typing.Mapping[str, typing.Sequence[str]] | None = None,
        source: str = "<catalog>",
    ) -> None:
        self.specs: tuple[AcceleratorSpec, ...] = tuple(specs)
        self.source = source
        self._by_name: dict[str, AcceleratorSpec] = {}
        # key -> candidate row names; more than one only for shared aliases (default first)
        self._index: dict[str, tuple[str, ...]] = {}
        for spec in self.specs:
            if spec.name in self._by_name:
                raise InputError(
                    f"{source}: two rows are named {spec.name!r}; names must be unique"
                )
            self._by_name[spec.name] = spec
        for spec in self.specs:
            for spelling in (spec.name, *spec.aliases, *spec.pci_device_ids):
                self._add_key(spelling, (spec.name,), f"row {spec.name}")
        for alias, targets in (shared_aliases or {}).items():
            for target in targets:
                if target not in self._by_name:
                    raise InputError(
                        f"{source}: shared_aliases[{alias!r}] names unknown row {target!r}"
                        + _did_you_mean(target, list(self._by_name))
                    )
            self._add_key(alias, tuple(targets), f"shared_aliases[{alias!r}]")

    def _add_key(self, spelling: str, targets: tuple[str, ...], where: str) -> None:
        key = canonical_key(spelling)
        if not key:
            raise InputError(
                f"{self.source}: {where}: {spelling!r} has no letters or digits to match on"
            )
        existing = self._index.get(key)
        if existing is not None and existing != targets:
            raise InputError(
                f"{self.source}: {where}: {spelling!r} reads the same as a spelling of "
                f"{', '.join(existing)} (both match {key!r}); make it unique or list it "
                "under shared_aliases"
            )
        self._index[key] = targets

    # ------------------------------------------------------------------ queries

    @property
    def names(self) -> tuple[str, ...]:
        """Canonical names, in file order."""
        return tuple(s.name for s in self.specs)

    def __iter__(self) -> Iterator[AcceleratorSpec]:
        return iter(self.specs)

    def __len__(self) -> int:
        return len(self.specs)

    def __contains__(self, name: object) -> bool:
        return isinstance(name, str) and canonical_key(name) in self._index

    def lookup(self, name: str) -> AcceleratorSpec:
        """The row a user-typed name means; ``InputError`` with "did you mean" when none.

        A shared alias ("A100", "V100") returns its default row (the first one listed).
        """
        key = canonical_key(name)
        targets = self._index.get(key)
        if targets:
            return self._by_name[targets[0]]
        raise InputError(
            f"unknown accelerator {name!r}"
            + self._suggest(key)
            + f" Known models: {', '.join(self.names)}. A new model is a new row in the catalog"
            " file (accelerators/data/catalog.yaml)."
        )

    def find(
        self,
        name: str,
        memory_bytes: int | None = None,
        compute_units: int | None = None,
    ) -> AcceleratorSpec | None:
        """Best-effort match of a raw product name (or PCI id) as a tool printed it; no errors.

        An exact (canonicalised) match wins; among the rows of a shared alias the one whose
        compute units equal ``compute_units`` and whose memory is nearest ``memory_bytes`` is
        chosen. Otherwise trailing tokens are dropped one at a time ("AMD Instinct MI300X VF"
        -> "mi300x"), and such a partial match is accepted only when ``memory_bytes`` is
        unknown or within 12% of the row's memory. Returns None when nothing fits.
        """
        tokens = name_tokens(name)
        targets = self._index.get("".join(tokens)) if tokens else None
        if targets:
            return self._pick(targets, memory_bytes, compute_units)
        for end in range(len(tokens) - 1, 0, -1):
            targets = self._index.get("".join(tokens[:end]))
            if targets:
                spec = self._pick(targets, memory_bytes, compute_units)
                return spec if _memory_fits(spec, memory_bytes) else None
        return None

    def _pick(
        self, targets: tuple[str, ...], memory_bytes: int | None, compute_units: int | None
    ) -> AcceleratorSpec:
        specs = [self._by_name[t] for t in targets]
        if compute_units is not None:
            same_units = [s for s in specs if s.compute_units == compute_units]
            specs = same_units or specs
        if memory_bytes is not None and len(specs) > 1:
            # min() keeps the first of equals, so the listed default wins ties
            return min(specs, key=lambda s: _memory_distance(s, memory_bytes))
        return specs[0]

    def _suggest(self, key: str) -> str:
        close = difflib.get_close_matches(key, list(self._index), n=5, cutoff=0.5)
        names: list[str] = []
        for match in close:
            for target in self._index[match]:
                if target not in names:
                    names.append(target)
        return f"; did you mean {' or '.join(repr(n) for n in names[:3])}?" if names else "."


def _memory_distance(spec: AcceleratorSpec, memory_bytes: int) -> float:
    if spec.memory_bytes is None:
        return float("inf")
    return abs(memory_bytes - spec.memory_bytes) / spec.memory_bytes


def _memory_fits(spec: AcceleratorSpec, memory_bytes: int | None) -> bool:
    return memory_bytes is None or _memory_distance(spec, memory_bytes) <= _MEMORY_TOLERANCE


def _did_you_mean(word: str, choices: list[str]) -> str:
    close = difflib.get_close_matches(word, choices, n=1, cutoff=0.6)
    return f"; did you mean {close[0]!r}?" if close else "."


# ---------------------------------------------------------------------- loading


def load_catalog(path: str | Path | None = None) -> Catalog:
    """Read a catalog file; ``None`` reads the packaged default (cached, see default_catalog).

    Raises InputError (ParseError for YAML syntax) naming the file, the row and the key.
    """
    if path is None:
        return default_catalog()
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise InputError(f"cannot read catalog {path}: {exc.strerror or exc}") from None
    return _parse_catalog(text, str(path))


@functools.lru_cache(maxsize=1)
def default_catalog() -> Catalog:
    """The catalog shipped with hetflow (``hetflow/accelerators/data/catalog.yaml``), cached."""
    resource = resources.files("hetflow.accelerators").joinpath("data/catalog.yaml")
    return _parse_catalog(resource.read_text(encoding="utf-8"), "catalog.yaml")


def _parse_catalog(text: str, source: str) -> Catalog:
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        line = mark.line + 1 if mark is not None else None
        raise ParseError(source, f"not valid YAML: {exc}", line) from None
    if not isinstance(data, dict):
        raise InputError(f"{source}: expected a mapping with keys {list(_TOP_LEVEL_KEYS)}")
    for key in data:
        if key not in _TOP_LEVEL_KEYS:
            hint = _did_you_mean(str(key), list(_TOP_LEVEL_KEYS))
            raise InputError(
                f"{source}: unknown top-level key {key!r}{hint}"
                f" Known keys: {', '.join(_TOP_LEVEL_KEYS)}."
            )
    if data.get("schema") != SCHEMA:
        raise InputError(
            f"{source}: schema is {data.get('schema')!r}; this hetflow reads {SCHEMA!r}"
        )
    rows = data.get("accelerators")
    if not isinstance(rows, list) or not rows:
        raise InputError(f"{source}: 'accelerators' must be a non-empty list of rows")
    specs = [_parse_row(row, i, source) for i, row in enumerate(rows)]
    shared = _parse_shared_aliases(data.get("shared_aliases") or {}, source)
    return Catalog(specs, shared, source)


def _parse_shared_aliases(value: Any, source: str) -> dict[str, list[str]]:
    if not isinstance(value, dict):
        raise InputError(f"{source}: shared_aliases must map a name to a list of row names")
    shared: dict[str, list[str]] = {}
    for alias, targets in value.items():
        if (
            not isinstance(targets, list)
            or len(targets) < 2
            or not all(isinstance(t, str) for t in targets)
        ):
            raise InputError(
                f"{source}: shared_aliases[{alias!r}] must list at least two row names"
                " (a name for one row belongs in that row's aliases)"
            )
        shared[str(alias)] = targets
    return shared


_SPEC_FIELDS = {f.name: f for f in dataclasses.fields(AcceleratorSpec)}
_SPEC_TYPES = typing.get_type_hints(AcceleratorSpec)
# Fields that must be filled for accelerators (not the generic CPU row) and for fabrics.
_ACCELERATOR_REQUIRED = (
    "memory_bytes", "arch", "fp32_tflops", "memory_bandwidth_gbps", "link_kind", "pcie_gbps",
    "compute_units",
)
_FABRIC_REQUIRED = ("link_generation", "link_gbps_per_link", "links_per_device")
_FABRICS = (LinkKind.NVLINK, LinkKind.NVSWITCH, LinkKind.XGMI)


def _parse_row(row: Any, index: int, source: str) -> AcceleratorSpec:
    label = f"accelerators[{index}]"
    if not isinstance(row, dict):
        raise InputError(
            f"{source}: {label}: expected a mapping of fields, got {type(row).__name__}"
        )
    if isinstance(row.get("name"), str):
        label += f" ({row['name']})"
    where = f"{source}: {label}"
    for key in row:
        if key not in _SPEC_FIELDS:
            raise InputError(
                f"{where}: unknown key {key!r}{_did_you_mean(str(key), list(_SPEC_FIELDS))}"
                f" Known keys: {', '.join(_SPEC_FIELDS)}."
            )
    missing = [name for name in _SPEC_FIELDS if name not in row]
    if missing:
        raise InputError(
            f"{where}: missing key(s) {', '.join(missing)}; every row spells out every field"
            " (write null for an unknown figure)"
        )
    values = {name: _convert(_SPEC_TYPES[name], row[name], name, where) for name in _SPEC_FIELDS}
    spec = AcceleratorSpec(**values)
    _check_row(spec, where)
    return spec


def _check_row(spec: AcceleratorSpec, where: str) -> None:
    """Semantic checks a type cannot express: non-empty text, positive figures, completeness."""
    for name in ("name", "source"):
        if not getattr(spec, name).strip():
            raise InputError(f"{where}: key {name!r} must not be empty")
    for f in dataclasses.fields(spec):
        value = getattr(spec, f.name)
        if isinstance(value, (int, float)) and not isinstance(value, bool) and value <= 0:
            raise InputError(f"{where}: key {f.name!r} must be positive, got {value!r}")
    for pci_id in spec.pci_device_ids:
        if not _PCI_ID.match(pci_id):
            raise InputError(
                f"{where}: key 'pci_device_ids': {pci_id!r} is not a PCI device id like '0x74a1'"
                " (lower-case hex, four digits)"
            )
    if spec.vendor is not Vendor.CPU:
        _require(spec, _ACCELERATOR_REQUIRED, where, "an accelerator row")
    if spec.link_kind in _FABRICS:
        _require(spec, _FABRIC_REQUIRED, where, f"a {spec.link_kind.value} row")
    if spec.link_kind is LinkKind.PCIE and spec.pcie_gbps is None:
        raise InputError(f"{where}: key 'pcie_gbps' is required for a pcie row")


def _require(spec: AcceleratorSpec, names: tuple[str, ...], where: str, what: str) -> None:
    for name in names:
        if getattr(spec, name) is None:
            raise InputError(f"{where}: key {name!r} must not be null for {what}")


def _convert(tp: Any, value: Any, key: str, where: str) -> Any:
    """Check ``value`` against the field type ``tp``; sizes may be written like ``"80GiB"``."""
    origin = typing.get_origin(tp)
    if origin in (typing.Union, types.UnionType):
        if value is None:
            return None
        (inner,) = [a for a in typing.get_args(tp) if a is not type(None)]
        return _convert(inner, value, key, where)
    if origin is tuple:
        if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
            raise InputError(f"{where}: key {key!r} must be a list of strings, got {value!r}")
        return tuple(value)
    if isinstance(tp, type) and issubclass(tp, enum.Enum):
        try:
            return tp(value)
        except ValueError:
            raise InputError(
                f"{where}: key {key!r} must be one of {[m.value for m in tp]}, got {value!r}"
            ) from None
    if tp is str:
        if not isinstance(value, str):
            raise InputError(f"{where}: key {key!r} must be text, got {value!r}")
        return value.strip()
    if tp is int:
        if key.endswith("_bytes") and isinstance(value, str):
            try:
                return parse_bytes(value)
            except InputError as exc:
                raise InputError(f"{where}: key {key!r}: {exc}") from None
        if isinstance(value, bool) or not isinstance(value, int):
            raise InputError(f"{where}: key {key!r} must be a whole number, got {value!r}")
        return value
    if tp is float:
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise InputError(f"{where}: key {key!r} must be a number, got {value!r}")
        return float(value)
    raise AssertionError(f"catalog loader has no rule for field type {tp!r} ({key})")
