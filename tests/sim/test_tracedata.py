"""The trace catalogue (hetflow/sim/data/traces.yaml) against what the repository ships: every file
shipped in full is the upstream file (its SHA-256, after decompression), a slice is the file the
catalogue names, and every dataset's folder is there. No network: the checksums were recorded
from the upstream files, so a shipped copy that matches them is the upstream file."""

from __future__ import annotations

import csv
import hashlib
import io
import re

import pytest

from hetflow.core.errors import InputError
from hetflow.sim.tracedata import CATALOGUE, base_url, default_dest, find_dataset, load_catalogue, sha256_of
from hetflow.sim.textio import decompressed_bytes, existing
from tests.conftest import REPO

CATALOG = load_catalogue()


def test_the_catalogue_names_the_seven_datasets_with_their_licences() -> None:
    assert list(CATALOG) == ["gavel", "philly", "alibaba-gpu-2023", "fgd-expected-results", "fgd-reference",
                             "gavel-calibration", "sia"]
    for d in CATALOG.values():
        assert d.shipped in ("full", "slice", "none") and d.licence and d.source and d.description
        assert d.in_repo and (REPO / d.in_repo).is_dir(), d.in_repo
        if d.fetchable:
            assert re.fullmatch(r"[\w.-]+/[\w.-]+", d.repo) and re.fullmatch(r"[0-9a-f]{40}", d.commit), d.name
            for f in d.files:
                assert re.fullmatch(r"[0-9a-f]{64}", f.sha256) and f.size > 0 and not f.name.startswith("/")
        else:
            assert d.local_size and d.shipped == "full"  # made by the team: only the repository has it
    for licence_file in set(re.findall(r"data/licenses/[\w.-]+", CATALOGUE.read_text())):
        assert (REPO / licence_file).is_file(), licence_file


@pytest.mark.parametrize("name", [n for n, d in CATALOG.items() if d.fetchable and d.shipped == "full"])
def test_each_file_shipped_in_full_is_the_upstream_file(name: str) -> None:
    d = CATALOG[name]
    for f in d.files:
        path = existing(REPO / d.in_repo / f.name)  # plain, or its .xz / .gz
        data = decompressed_bytes(path)
        assert len(data) == f.size, path
        assert hashlib.sha256(data).hexdigest() == f.sha256, path


def test_the_philly_slice_is_the_head_of_the_upstream_file() -> None:
    d = CATALOG["philly"]
    assert d.shipped == "slice" and d.fetchable and d.files[0].name == "philly.csv"
    path = REPO / d.in_repo / d.slice["name"]
    assert sha256_of(path) == d.slice["sha256"] and path.stat().st_size == d.slice["size"]
    rows = list(csv.reader(io.StringIO(path.read_text())))
    assert rows[0] == ["timestamp", "duration", "num_gpus", "gpu_time", "cluster"] and len(rows) - 1 == 2000
    assert not (REPO / d.in_repo / "philly.csv").exists()  # the full log is fetched, never shipped


def test_lookups_and_their_errors(monkeypatch, tmp_path) -> None:
    assert find_dataset("philly", CATALOG).repo == "siasosp23/artifacts"
    with pytest.raises(InputError, match=r"unknown trace 'phily'; known: gavel, philly"):
        find_dataset("phily", CATALOG)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    assert default_dest("gavel") == tmp_path / "hetflow" / "traces" / "gavel"
    monkeypatch.delenv("HETFLOW_TRACES_MIRROR", raising=False)
    assert base_url() == ("https://raw.githubusercontent.com", "the catalogue")
    monkeypatch.setenv("HETFLOW_TRACES_MIRROR", "http://127.0.0.1:9/raw")
    assert base_url() == ("http://127.0.0.1:9/raw", "HETFLOW_TRACES_MIRROR")
    assert base_url("https://m.example") == ("https://m.example", "--mirror")
    with pytest.raises(InputError, match=r"'file:///x' \(--mirror\) is not an http:// or https:// URL"):
        base_url("file:///x")
    gavel = CATALOG["gavel"]
    vc = next(f for f in gavel.files if f.name.endswith("51b7ef.trace"))
    assert gavel.url(vc, "https://raw.githubusercontent.com/") == (
        "https://raw.githubusercontent.com/stanford-futuredata/gavel/c4fa40097339e9608ab71fd64c8bdea96a5e4a4c/"
        "scheduler/traces/msr/seed=0/51b7ef.trace")
