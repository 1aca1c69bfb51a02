"""Byte sizes as people write them ("40GiB", "80 GB", "512MiB") and back."""

from __future__ import annotations

import re

from hetflow.core.errors import InputError

_UNITS = {
    "": 1,
    "b": 1,
    "k": 1000, "kb": 1000, "kib": 1024,
    "m": 1000**2, "mb": 1000**2, "mib": 1024**2,
    "g": 1000**3, "gb": 1000**3, "gib": 1024**3,
    "t": 1000**4, "tb": 1000**4, "tib": 1024**4,
}
_SIZE = re.compile(r"^\s*([0-9]+(?:\.[0-9]+)?)\s*([a-zA-Z]*)\s*$")


def parse_bytes(text: str | int | float) -> int:
    """Parse a size such as ``"40GiB"``, ``"80 GB"`` or ``1024`` into bytes.

    GB/MB are decimal (1000-based), GiB/MiB binary, as the SI and IEC define them.
    """
    if isinstance(text, bool):
        raise InputError(f"expected a size such as '40GiB', got {text!r}")
    if isinstance(text, (int, float)):
        if text < 0:
            raise InputError(f"a size cannot be negative: {text!r}")
        return int(text)
    m = _SIZE.match(str(text))
    if not m or m.group(2).lower() not in _UNITS:
        raise InputError(
            f"cannot read size {text!r}: write a number with an optional unit, "
            "e.g. '40GiB', '80GB', '512MiB' (GB = 1e9 bytes, GiB = 2^30 bytes)"
        )
    return int(float(m.group(1)) * _UNITS[m.group(2).lower()])


def format_bytes(n: int | None) -> str:
    """Human form with binary units, e.g. ``80.0 GiB``; ``-`` when unknown."""
    if n is None:
        return "-"
    value = float(n)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if value < 1024 or unit == "TiB":
            return f"{value:.0f} {unit}" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    raise AssertionError("unreachable")


def format_cpus(count: float) -> str:
    """``1 -> "1 CPU"``, ``0.5 -> "0.5 CPU"``, ``2 -> "2 CPUs"``, ``0 -> "0 CPUs"`` (for reasons
    and status lines)."""
    return f"{count:g} CPU" + ("" if 0 < count <= 1 else "s")
