"""PCI addresses as every tool prints them, in one spelling: ``dddd:bb:dd.f`` lower case."""

from __future__ import annotations

import re

_BUS_ID = re.compile(
    r"^(?:(?P<domain>[0-9a-f]{1,8}):)?(?P<bus>[0-9a-f]{1,2}):(?P<dev>[0-9a-f]{1,2})\.(?P<fn>[0-7])$",
    re.ASCII | re.IGNORECASE,
)


def normalize_pci_bus_id(raw: str | bytes | None) -> str | None:
    """``"00000000:1A:00.0"`` (NVML, nvidia-smi), ``"0000:0C:00.0"`` (amd-smi) or ``"c9:0.0"``
    (rocm-bandwidth-test) -> ``"0000:1a:00.0"``; ``None`` for text that is no PCI address.

    The domain keeps at least 4 hex digits (wider ones, e.g. Intel VMD's ``10000``, keep their
    digits); a missing domain is 0000. The device number must be < 0x20 (PCI has 32 slots).
    """
    if raw is None:
        return None
    text = raw.decode(errors="replace") if isinstance(raw, bytes) else raw
    m = _BUS_ID.match(text.strip())
    if m is None or int(m["dev"], 16) > 0x1F:
        return None
    return format_pci_bus_id(int(m["domain"] or "0", 16), int(m["bus"], 16), int(m["dev"], 16), int(m["fn"]))


def format_pci_bus_id(domain: int, bus: int, device: int, function: int) -> str:
    """The one spelling from the address's numbers (KFD sysfs gives them as integers)."""
    return f"{domain:04x}:{bus:02x}:{device:02x}.{function}"
