"""The helpers every recorded-output parser shares (accelerators/recorded/base.py)."""

from __future__ import annotations

import pytest

from hetflow.accelerators.recorded import text_formats
from hetflow.accelerators.recorded.base import NODE_NAME, RecordedFormat, bus_id, partial_node
from hetflow.core.errors import ParseError
from hetflow.core.topology import Device, Link, LinkKind, Vendor


def test_every_format_sniffs_without_raising() -> None:
    def crashes(text: str) -> bool:
        raise IndexError("a sniffer that trips over odd input")

    fmt = RecordedFormat("odd", "odd-tool", crashes, lambda text, source: partial_node(source, []))
    assert fmt.sniff("anything") is False
    odd = ["", "\x00\xff", "GPU[", "=" * 80 + "\n", "{", "card0,", "GPU0 GPU1\nGPU0 X", "\n" * 500]
    for f in text_formats():
        for text in odd:
            assert f.sniff(text) in (True, False), f.name


def test_partial_nodes_are_named_and_ordered_alike() -> None:
    devices = [Device(2, Vendor.AMD), Device(0, Vendor.AMD), Device(1, Vendor.AMD)]
    links = [Link(1, 2, LinkKind.XGMI), Link(0, 2, LinkKind.XGMI), Link(0, 1, LinkKind.XGMI)]
    node = partial_node("f.txt", devices, links, numa_nodes=2)
    assert node.name == NODE_NAME and node.sources == ("f.txt",) and node.numa_nodes == 2
    assert [d.index for d in node.devices] == [0, 1, 2]
    assert [(l.a, l.b) for l in node.links] == [(0, 1), (0, 2), (1, 2)]


def test_bus_ids_have_one_spelling_and_one_error() -> None:
    assert bus_id("00000000:1A:00.0", "f.txt", "GPU 0") == "0000:1a:00.0"
    with pytest.raises(ParseError) as err:
        bus_id("x", "f.txt", "GPU 3", 7)
    assert str(err.value) == "f.txt:7: GPU 3: expected a PCI bus id like 0000:26:00.0, found 'x'"
