"""Trace and reference files as text, compressed or not: ``NAME.gz`` and ``NAME.xz`` are read as
if they were ``NAME`` (decided by the suffix, as ``gzip``/``xz`` name their output).

The repository keeps its larger trace files xz-compressed (data/README.md); every loader of the
simulator opens files through :func:`open_text`, so a compressed and a plain copy of a trace
give the same jobs. A compressed file is decompressed whole when it is opened (trace files are
a few MB), so a damaged one is one clear :class:`ParseError` before any row is read.
"""

from __future__ import annotations

import gzip
import io
import lzma
import zlib
from pathlib import Path
from typing import TextIO

from hetflow.core.errors import InputError, ParseError

COMPRESSED = {".gz": "gzip", ".xz": "xz"}


def compression(path: str | Path) -> str | None:
    """"gzip" or "xz" for a compressed file's name, else None."""
    return COMPRESSED.get(Path(path).suffix.lower())


def plain_name(path: str | Path) -> str:
    """The file's name without a compression suffix: ``6214e9.trace.xz`` -> ``6214e9.trace``."""
    p = Path(path)
    return p.stem if compression(p) else p.name


def plain_suffix(path: str | Path) -> str:
    """The suffix under any compression suffix: ``.csv`` for ``pods.csv.gz``."""
    return Path(plain_name(path)).suffix


def decompressed_bytes(path: str | Path) -> bytes:
    """The file's bytes, decompressed when its suffix says so (OSError when it cannot be read,
    ParseError when it is not what its suffix says)."""
    p = Path(path)
    kind = compression(p)
    data = p.read_bytes()
    if kind is None:
        return data
    try:
        return gzip.decompress(data) if kind == "gzip" else lzma.decompress(data, format=lzma.FORMAT_XZ)
    except (OSError, EOFError, lzma.LZMAError, zlib.error) as e:
        raise ParseError(str(p), f"not a readable {kind} file ({e or 'truncated'}); "
                                 f"give the file plain or as a complete .{'gz' if kind == 'gzip' else 'xz'}") from None


def open_text(path: str | Path, newline: str | None = None, errors: str | None = None) -> TextIO:
    """``path.open()`` for reading text, decompressing ``.gz``/``.xz`` files. OSError as open
    raises it; a compressed file that is damaged or not UTF-8 text is a ParseError here (a plain
    one raises UnicodeDecodeError as it is read, unless ``errors`` says otherwise)."""
    p = Path(path)
    if compression(p) is None:
        return p.open(newline=newline, errors=errors)
    try:
        text = decompressed_bytes(p).decode("utf-8", errors=errors or "strict")
    except UnicodeDecodeError as e:
        raise ParseError(str(p), f"not a text file once decompressed (byte {e.start} is not UTF-8)") from None
    return io.StringIO(text, newline=newline)


def read_text(path: str | Path, errors: str | None = None) -> str:
    """The whole file as text (see :func:`open_text`)."""
    with open_text(path, errors=errors) as f:
        return f.read()


def existing(path: str | Path) -> Path:
    """``path`` if it is a file, else its ``.xz`` or ``.gz`` copy if one is there (for files
    found by name inside a reference folder), else ``path`` (for the caller's own error)."""
    p = Path(path)
    if p.is_file():
        return p
    for suffix in COMPRESSED:
        q = p.with_name(p.name + suffix)
        if q.is_file():
            return q
    return p


def read_lines(path: Path) -> list[str]:
    """The file's lines; InputError when it cannot be read, ParseError when it is not text."""
    try:
        return read_text(path).splitlines()
    except OSError as e:
        raise InputError(f"{path}: cannot read ({e.strerror})") from None
    except UnicodeDecodeError:
        raise ParseError(str(path), "not a text file") from None
