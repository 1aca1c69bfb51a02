"""Helpers of the launch tests: run ``hetflow launch`` / ``torchrun`` as a user does, find the
ranks' processes by their run id, read the example scripts' output."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
EXAMPLES = REPO / "examples" / "launch"
SCRIPTS = Path(__file__).resolve().parent / "scripts"
BIN = Path(sys.executable).parent


def clean_env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("RAY_ADDRESS", "OMP_NUM_THREADS")}
    env.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")
    env.update(extra)
    return env


def hetflow_launch(*args: str, timeout: float = 240, cwd: Path | None = None,
                   **popen: object) -> subprocess.CompletedProcess:
    return subprocess.run([str(BIN / "hetflow"), "launch", *args], capture_output=True, text=True,
                          timeout=timeout, cwd=cwd, env=clean_env(), **popen)


def torchrun(script: Path, *args: str, nproc: int = 2, timeout: float = 240,
             env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([str(BIN / "torchrun"), "--standalone", "--nproc_per_node", str(nproc),
                           str(script), *args], capture_output=True, text=True, timeout=timeout,
                          env=clean_env(**(env or {})))


def final_loss(stdout: str) -> float:
    found = re.findall(r"final loss ([0-9.]+)", stdout)
    assert len(found) == 1, f"expected one 'final loss' line in:\n{stdout}"
    return float(found[0])


def step_losses(stdout: str) -> list[tuple[int, float]]:
    return [(int(s), float(v)) for s, v in re.findall(r"step (\d+) loss ([0-9.]+)", stdout)]


def processes_of_run(run_id: str) -> dict[int, dict[str, str]]:
    """pid -> environment of every live process started for ``run_id`` (TORCHELASTIC_RUN_ID)."""
    found = {}
    needle = f"TORCHELASTIC_RUN_ID={run_id}".encode()
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            raw = Path(f"/proc/{entry}/environ").read_bytes()
            state = Path(f"/proc/{entry}/stat").read_text().split(")")[-1].split()[0]
        except OSError:
            continue
        if needle in raw.split(b"\0") and state != "Z":
            env = dict(item.decode(errors="replace").partition("=")[::2]
                       for item in raw.split(b"\0") if item)
            found[int(entry)] = env
    return found


def dumped(out: Path) -> dict[tuple[int, int], dict]:
    """(rank, attempt) -> the environment env_dump.py wrote."""
    records = {}
    for path in out.glob("rank-*-attempt-*.json"):
        _, rank, _, attempt = path.stem.split("-")
        records[(int(rank), int(attempt))] = json.loads(path.read_text())
    return records
