"""``--window START:STOP``: the jobs by arrival index that a simulation measures (Gavel's
steady-state window), parsed once for every protocol of ``hetflow simulate``."""

from __future__ import annotations

from hetflow.core.errors import InputError


def parse_window(text: str | None) -> tuple[int, int] | None:
    """``"4000:5000"`` -> (4000, 5000)."""
    if text is None:
        return None
    start, colon, stop = text.partition(":")
    try:
        window = (int(start), int(stop))
    except ValueError:
        window = None
    if not colon or window is None or window[0] < 0 or window[0] >= window[1]:
        raise InputError(f"--window {text!r}: write START:STOP with 0 <= START < STOP, e.g. 4000:5000")
    return window


__all__ = ["parse_window"]
