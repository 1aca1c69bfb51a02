"""``scripts/device_check.sh`` where there is no GPU: its steps, deadline and outputs work (the GPU
steps themselves run on a GPU host only: docs/gpu.md)."""

from __future__ import annotations

import os
import subprocess
import sys
import tarfile
from pathlib import Path

from hetflow.accelerators.load import load_cluster

SCRIPT = Path(__file__).parents[2] / "scripts" / "device_check.sh"


def run(tmp_path: Path, **env: str) -> tuple[subprocess.CompletedProcess, list[str]]:
    out = tmp_path / "out"
    done = subprocess.run(
        ["bash", str(SCRIPT)], capture_output=True, text=True, timeout=120,
        env={**os.environ, "OUT": str(out), "PYTHON": sys.executable, **env})
    log = (out / "log.txt").read_text()
    summary = log.split("=== summary", 1)[1].splitlines()[1:]
    return done, [line.strip() for line in summary if line.strip()]


def test_record_and_inventory_steps_leave_their_files(tmp_path: Path) -> None:
    done, summary = run(tmp_path, ONLY="record inventory", DEADLINE_S="100")
    assert done.returncode == 0, done.stderr
    assert summary == ["record 0", "inventory 0"]
    with tarfile.open(tmp_path / "out" / "recorded.tar.gz") as archive:
        names = set(archive.getnames())
        assert {"recorded/inventory.json", "recorded/python.txt", "recorded/when.txt"} <= names
        archive.extractall(tmp_path / "x", filter="data")
    node = load_cluster(tmp_path / "x" / "recorded" / "inventory.json").nodes[0]
    assert node.cpu_cores == os.cpu_count() and "cpu" in node.sources
    python = (tmp_path / "x" / "recorded" / "python.txt").read_text()
    assert f"python {sys.version.split()[0]}" in python and "torch " in python


def test_a_step_past_the_deadline_is_skipped_not_run(tmp_path: Path) -> None:
    done, summary = run(tmp_path, ONLY="record", DEADLINE_S="20")
    assert done.returncode == 0
    assert summary == ["record skipped"]
    with tarfile.open(tmp_path / "out" / "recorded.tar.gz") as archive:
        assert archive.getnames() == ["recorded"]  # nothing was recorded
