"""Unit parsing and formatting used in messages and files."""

from __future__ import annotations

import pytest

from hetflow.core.errors import InputError
from hetflow.core.units import format_bytes, format_cpus, parse_bytes


@pytest.mark.parametrize("text, expected", [("40GiB", 40 << 30), ("512MiB", 512 << 20),
                                            ("1.5 GiB", 3 << 29), (1024, 1024)])
def test_parse_bytes(text, expected) -> None:
    assert parse_bytes(text) == expected


def test_parse_bytes_refuses_garbage() -> None:
    with pytest.raises(InputError):
        parse_bytes("forty gigs")


def test_format_bytes_round_trips_whole_units() -> None:
    assert parse_bytes(format_bytes(80 << 30)) == 80 << 30


@pytest.mark.parametrize("count, expected", [(1, "1 CPU"), (0.5, "0.5 CPU"), (2, "2 CPUs"),
                                             (0, "0 CPUs"), (1.5, "1.5 CPUs")])
def test_format_cpus(count, expected) -> None:
    assert format_cpus(count) == expected
