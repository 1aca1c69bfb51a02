"""Recorded output of vendor tools -> partial NodeTopology, with the format detected.

Text formats are found by each parser's ``sniff``; KFD sysfs trees (a directory or a tarball of
one) by :func:`hetflow.accelerators.recorded.kfd.looks_like_kfd`. Exactly one text format must
claim a file; none or several is a clear error listing what is supported.
"""

from __future__ import annotations

from pathlib import Path

from hetflow.core.errors import InputError, ParseError
from hetflow.core.topology import NodeTopology
from hetflow.accelerators.recorded.base import RecordedFormat, strip_terminal_codes

MAX_FILE_BYTES = 64 * 1024 * 1024  # recorded outputs are kilobytes; refuse to slurp a disk image


def text_formats() -> list[RecordedFormat]:
    from hetflow.accelerators.recorded import amd_smi, nvidia, rocm_smi

    return [*nvidia.FORMATS, *rocm_smi.FORMATS, *amd_smi.FORMATS]


def detect_format(text: str, source: str) -> RecordedFormat:
    """The one text format that claims ``text``, or ParseError saying what is supported."""
    matches = [f for f in text_formats() if f.sniff(text)]
    if len(matches) == 1:
        return matches[0]
    if not matches:
        known = ", ".join(sorted({f.command for f in text_formats()}))
        raise ParseError(
            source,
            "not a recorded tool output hetflow recognises; supported: "
            f"{known}, KFD sysfs topology (a directory or .tar.gz), or a hetflow JSON snapshot",
        )
    names = ", ".join(f.name for f in matches)
    raise ParseError(source, f"ambiguous recorded output: it looks like each of {names}")


def parse_text(text: str, source: str) -> NodeTopology:
    # Terminal styling goes first, for every format: `nvidia-smi topo -m` underlines its header
    # even into a pipe or file (ESC[4m GPU0 ... ESC[0m, seen on an H200 with driver 580).
    text = strip_terminal_codes(text)
    fmt = detect_format(text, source)
    return fmt.parse(text, source)


def read_text(path: Path) -> str:
    try:
        size = path.stat().st_size
    except OSError as e:
        raise InputError(f"{path}: cannot read ({e.strerror})") from None
    if size > MAX_FILE_BYTES:
        raise ParseError(str(path), f"file is {size} bytes; recorded tool outputs are far smaller")
    raw = path.read_bytes()
    if b"\x00" in raw[:4096]:
        raise ParseError(str(path), "binary file; expected text output of a vendor tool")
    return raw.decode("utf-8", errors="replace")


def parse_file(path: str | Path) -> NodeTopology:
    """One recorded file or KFD tree -> partial NodeTopology (facts only, not enriched)."""
    from hetflow.accelerators.recorded import kfd

    p = Path(path)
    if not p.exists():
        raise InputError(f"{p}: no such file or directory")
    if kfd.looks_like_kfd(p) or p.name.endswith((".tar", ".tgz", ".tar.gz")):
        return kfd.load_kfd(p)  # a tarball is only ever a KFD tree; its errors say why not
    if p.is_dir():
        raise ParseError(str(p), "a directory, but not a KFD sysfs topology tree (nodes/N/properties)")
    return parse_text(read_text(p), str(p))
