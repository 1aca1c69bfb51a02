"""The interface every recorded-output parser implements.

A parser turns one file's text into a *partial* NodeTopology: only the facts that file shows
(a topology matrix may carry no memory sizes, a memory listing no links). Several partial nodes
describing one machine are merged by :func:`hetflow.accelerators.merge.merge_nodes`.

Parsers record facts, never estimates: ``Link.bandwidth_gbps`` is set only when the tool itself
printed a bandwidth (then ``bandwidth_note`` names it); catalog estimates are filled later by
:mod:`hetflow.accelerators.bandwidth`.

A parser raises :class:`hetflow.core.errors.ParseError` (file, line, what was expected) on
input it cannot read; any other exception escaping a parser is a bug.

The helpers every parser shares live here: the partial node's name and shape
(:func:`partial_node`), sniffers that never raise (:func:`safe_sniff`; every
:class:`RecordedFormat` applies it), and PCI bus ids in one spelling (:func:`bus_id`, through
:func:`hetflow.core.pci.normalize_pci_bus_id`).
"""

from __future__ import annotations

import functools
import re
from dataclasses import dataclass
from typing import Any, Callable, Iterable

from hetflow.core.errors import ParseError
from hetflow.core.pci import normalize_pci_bus_id
from hetflow.core.topology import Device, Link, NodeTopology

NODE_NAME = "node0"  # every partial node's name; merge_nodes names the machine


_TERMINAL_CODES = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")


def strip_terminal_codes(text: str) -> str:
    """``text`` without ANSI escape sequences (bold, underline, colour), which vendor tools may
    write even when their output is recorded to a file. They take no columns on a terminal, so
    removing them keeps the column positions that fixed-width parsers rely on."""
    return _TERMINAL_CODES.sub("", text) if "\x1b" in text else text


def safe_sniff(check: Callable[[str], bool]) -> Callable[[str], bool]:
    """``check`` as a sniffer: it answers yes or no, and any surprise on odd input means "not
    my format" (False), never an exception."""
    if getattr(check, "_never_raises", False):
        return check

    @functools.wraps(check)
    def sniff(text: str) -> bool:
        try:
            return bool(check(text))
        except Exception:  # noqa: BLE001 - a sniffer answers yes or no, nothing else
            return False

    sniff._never_raises = True  # type: ignore[attr-defined]
    return sniff


def bus_id(raw: str, source: str, what: str, line: int | None = None,
           example: str = "0000:26:00.0") -> str:
    """``raw`` as a PCI bus id in the one spelling (``dddd:bb:dd.f``, lower case), or
    ParseError naming ``what`` and showing an ``example`` of the tool's own spelling."""
    normal = normalize_pci_bus_id(raw)
    if normal is None:
        raise ParseError(source, f"{what}: expected a PCI bus id like {example}, found {raw!r}", line)
    return normal


def partial_node(source: str, devices: Iterable[Device], links: Iterable[Link] = (),
                 **host: Any) -> NodeTopology:
    """The partial node a parser returns: named :data:`NODE_NAME`, devices by index, links by
    pair, ``source`` as its only source; ``host``: cpu_cores, host_memory_bytes, numa_nodes."""
    node = NodeTopology(name=NODE_NAME, devices=tuple(sorted(devices, key=lambda d: d.index)),
                        sources=(source,), **host)
    return node.with_links(links)


@dataclass(frozen=True)
class RecordedFormat:
    name: str  # e.g. "nvidia-smi-topo-m"
    command: str  # the command that produces it, e.g. "nvidia-smi topo -m"
    sniff: Callable[[str], bool]  # cheap, no exceptions: does this text look like my format?
    parse: Callable[[str, str], NodeTopology]  # (text, source name) -> partial node

    def __post_init__(self) -> None:
        object.__setattr__(self, "sniff", safe_sniff(self.sniff))  # whatever the parser wrote
