"""Files that are not what a command expects - binary, empty, a directory, a name too long for
the system - end every command with one line and exit 2, never a traceback."""

from __future__ import annotations

import os

import pytest

from hetflow.cli.main import main
from tests.conftest import TRACES

TOO_LONG = "x" * 300


@pytest.fixture(scope="module")
def binary(tmp_path_factory) -> str:
    path = tmp_path_factory.mktemp("bad") / "garbage.yaml"
    path.write_bytes(bytes(range(256)) * 4 + os.urandom(64))
    return str(path)


COMMANDS = [
    lambda f: ["train", f], lambda f: ["tune", f], lambda f: ["serve", f], lambda f: ["run", f],
    lambda f: ["submit", f], lambda f: ["plan", "--cluster", f, "--count", "1"],
    lambda f: ["inventory", "--from", f],
    lambda f: ["simulate", "--cluster", "2 * 8x H100", "--trace", f, "--out", "/nonexistent/out"],
]


@pytest.mark.parametrize("command", range(len(COMMANDS)))
@pytest.mark.parametrize("kind", ["binary", "directory", "too long"])
def test_unreadable_input_is_one_line_and_exit_2(command: int, kind: str, binary: str, tmp_path,
                                                 capsys) -> None:
    target = {"binary": binary, "directory": str(tmp_path), "too long": TOO_LONG}[kind]
    code = main(COMMANDS[command](target))
    err = capsys.readouterr().err
    assert code == 2, err
    assert err.startswith("hetflow: error: ") and err.count("\n") == 1, err
    assert "Traceback" not in err


def test_binary_throughput_file(binary: str, capsys) -> None:
    trace = str(TRACES / "gavel" / "philly_vc_traces_seed0" / "51b7ef.trace")
    code = main(["simulate", "--cluster", "2 * 8x H100", "--trace", trace, "--throughputs", binary,
                 "--out", "/nonexistent/out"])
    err = capsys.readouterr().err
    assert code == 2 and "not a text file" in err, err
