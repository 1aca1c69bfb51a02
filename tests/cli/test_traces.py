"""``hetflow traces list`` and ``hetflow traces fetch`` as a user runs them, against a mirror on
127.0.0.1 (Python's http.server over a folder laid out as OWNER/REPO/COMMIT/PATH, filled from the
repository's own copies). No test reaches the internet: every URL opened is checked to be on
loopback. A file is kept only with the catalogue's SHA-256, written under a temporary name and
renamed, so a tampered download leaves nothing; an unknown name is exit 2."""

from __future__ import annotations

import functools
import hashlib
import http.server
import json
import socket
import threading
import urllib.parse
import urllib.request
from pathlib import Path

import pytest

from hetflow.cli.main import main
from hetflow.sim.tracedata import load_catalogue
from hetflow.sim.textio import decompressed_bytes, existing
from tests.conftest import REPO

CATALOG = load_catalogue()


@pytest.fixture(autouse=True)
def loopback_only(monkeypatch):
    """Every download of these tests goes to 127.0.0.1, with no proxy in between."""
    real = urllib.request.urlopen

    def guarded(url, *a, **kw):
        host = urllib.parse.urlparse(url if isinstance(url, str) else url.full_url).hostname
        assert host == "127.0.0.1", f"a test tried to reach {url}"
        return real(url, *a, **kw)

    monkeypatch.setattr(urllib.request, "urlopen", guarded)
    for var in ("http_proxy", "https_proxy", "HTTP_PROXY", "HTTPS_PROXY", "HETFLOW_TRACES_MIRROR"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("no_proxy", "127.0.0.1")


class _Quiet(http.server.SimpleHTTPRequestHandler):
    requests: list[str] = []

    def log_message(self, *args) -> None:
        pass

    def do_GET(self) -> None:
        type(self).requests.append(urllib.parse.unquote(self.path))
        super().do_GET()


@pytest.fixture
def mirror(tmp_path):
    """(base URL, root folder, request log): a mirror serving the `gavel` dataset from the
    repository's copies (decompressed: the upstream bytes)."""
    root = tmp_path / "mirror"
    ds = CATALOG["gavel"]
    for f in ds.files:
        out = root / ds.repo / ds.commit / f.path
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_bytes(decompressed_bytes(existing(REPO / ds.in_repo / f.name)))
    handler = type("Handler", (_Quiet,), {"requests": []})
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), functools.partial(handler, directory=str(root)))
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.02}, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}", root, handler.requests
    finally:
        server.shutdown()
        server.server_close()


def files_in(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.rglob("*") if p.is_file()) if folder.exists() else []


def one_line_error(capsys, code: int, expected: int) -> str:
    err = capsys.readouterr().err.strip().splitlines()
    assert code == expected, err
    assert err and err[-1].startswith("hetflow: error: ") and "Traceback" not in "\n".join(err), err
    return err[-1]


def test_list_shows_every_dataset_with_size_source_licence_and_shipped(capsys) -> None:
    assert main(["traces", "list"]) == 0
    out = capsys.readouterr().out
    for d in CATALOG.values():
        line = next(ln for ln in out.splitlines() if ln.startswith(d.name + " "))
        assert d.shipped in line and d.source in line, line
        assert f"licence: {d.licence}" in out
    assert "slice (2000 rows)" in out and "stanford-futuredata/gavel@c4fa400" in out
    assert main(["traces", "list", "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)
    assert [r["name"] for r in rows] == list(CATALOG)
    philly = rows[1]
    assert philly["shipped"] == "slice" and philly["size_bytes"] == 3444496 and philly["fetchable"]


def test_fetch_from_a_mirror_checks_every_file(mirror, tmp_path, capsys, monkeypatch) -> None:
    base, _, requests = mirror
    dest = tmp_path / "dest"
    assert main(["traces", "fetch", "gavel", "--dest", str(dest), "--mirror", base]) == 0, capsys.readouterr().err
    captured = capsys.readouterr()
    ds = CATALOG["gavel"]
    for f in ds.files:
        assert hashlib.sha256((dest / f.name).read_bytes()).hexdigest() == f.sha256
    assert sorted(p.relative_to(dest).as_posix() for p in dest.rglob("*") if p.is_file()) == sorted(
        f.name for f in ds.files)  # nothing else left behind (no .part files)
    assert len(requests) == 16 and f"/{ds.repo}/{ds.commit}/scheduler/traces/msr/seed=0/51b7ef.trace" in requests
    assert f"gavel: 16 file(s) in {dest}" in captured.out and captured.err.count("sha256 ok") == 16
    # again, through the environment variable: every file is there with its checksum, none is downloaded
    requests.clear()
    monkeypatch.setenv("HETFLOW_TRACES_MIRROR", base)
    assert main(["traces", "fetch", "gavel", "--dest", str(dest)]) == 0
    assert requests == [] and capsys.readouterr().err.count("(already there)") == 16


def test_a_wrong_checksum_keeps_nothing(mirror, tmp_path, capsys) -> None:
    base, root, _ = mirror
    ds = CATALOG["gavel"]
    served = root / ds.repo / ds.commit / "scheduler/simulation_throughputs.json"
    data = bytearray(served.read_bytes())
    data[100] ^= 1  # same size, one bit different
    served.write_bytes(bytes(data))
    dest = tmp_path / "dest"
    line = one_line_error(capsys, main(["traces", "fetch", "gavel", "--dest", str(dest), "--mirror", base]), 1)
    assert "simulation_throughputs.json: 1240176 bytes with SHA-256" in line and "not kept" in line, line
    assert files_in(dest) == []  # the first file failed: neither it nor its temporary .part is left
    # a longer answer is cut off at the catalogue's size, and refused the same way
    served.write_bytes(bytes(data) + b"x" * 5000)
    line = one_line_error(capsys, main(["traces", "fetch", "gavel", "--dest", str(dest), "--mirror", base]), 1)
    assert "more than 1240176 bytes" in line and files_in(dest) == []


def test_a_file_the_mirror_lacks_is_exit_2_and_leaves_nothing(mirror, tmp_path, capsys) -> None:
    base, root, _ = mirror
    ds = CATALOG["gavel"]
    (root / ds.repo / ds.commit / "scheduler/simulation_throughputs.json").unlink()
    dest = tmp_path / "dest"
    line = one_line_error(capsys, main(["traces", "fetch", "gavel", "--dest", str(dest), "--mirror", base]), 2)
    assert "HTTP 404" in line and "(--mirror)" in line, line
    assert files_in(dest) == []


def test_bad_names_and_sources_are_one_line_exit_2(tmp_path, capsys) -> None:
    for argv, pattern in [
        (["traces", "fetch", "nope", "--dest", str(tmp_path)], "unknown trace 'nope'; known: gavel, philly"),
        (["traces", "fetch", "gavel-calibration", "--dest", str(tmp_path)], "has no upstream file to fetch"),
        (["traces", "fetch", "gavel", "--dest", str(tmp_path), "--mirror", "ftp://m"], "not an http:// or https://"),
    ]:
        assert pattern in one_line_error(capsys, main(argv), 2)
    with pytest.raises(SystemExit) as stop:  # a parse error: argparse exits, with the same one line
        main(["traces"])
    assert "the following arguments are required" in one_line_error(capsys, stop.value.code, 2)
    assert list(tmp_path.iterdir()) == []  # none of these wrote anything
    # nothing listens on this port: unreachable, one line, exit 2
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        dead = f"http://127.0.0.1:{s.getsockname()[1]}"
    line = one_line_error(capsys, main(["traces", "fetch", "philly", "--dest", str(tmp_path / "d"),
                                        "--mirror", dead]), 2)
    assert "cannot download" in line and "philly.csv" in line and files_in(tmp_path / "d") == []
