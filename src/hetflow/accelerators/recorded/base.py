"""The interface every recorded-output parser implements.

A parser turns one file's text into a *partial* NodeTopology: only the facts that file shows
(a topology matrix may carry no memory sizes, a memory listing no links). Several partial nodes
describing one machine are merged by :func:`hetflow.accelerators.merge.merge_nodes`.

Parsers record facts, never estimates: ``Link.bandwidth_gbps`` is set only when the tool itself
printed a bandwidth (then ``bandwidth_note`` names it); catalog estimates are filled later by
:mod:`hetflow.accelerators.bandwidth`.

A parser raises :class:`hetflow.core.errors.ParseError` (file, line, what was expected) on
input it cannot read; any other exception escaping a parser is a bug.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Callable

from hetflow.core.topology import NodeTopology


_TERMINAL_CODES = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")


def strip_terminal_codes(text: str) -> str:
    """``text`` without ANSI escape sequences (bold, underline, colour), which vendor tools may
    write even when their output is recorded to a file. They take no columns on a terminal, so
    removing them keeps the column positions that fixed-width parsers rely on."""
    return _TERMINAL_CODES.sub("", text) if "\x1b" in text else text


@dataclass(frozen=True)
class RecordedFormat:
    name: str  # e.g. "nvidia-smi-topo-m"
    command: str  # the command that produces it, e.g. "nvidia-smi topo -m"
    sniff: Callable[[str], bool]  # cheap, no exceptions: does this text look like my format?
    parse: Callable[[str, str], NodeTopology]  # (text, source name) -> partial node
