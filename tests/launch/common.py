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
    """A user's environment: no RAY_ADDRESS, and no Ray loopback mode (the test process has it
    for its own loopback clusters): an embedded local Ray gets the node IP Ray picks - the LAN
    address on a machine with a default route, as for users - and ``--address 127.0.0.1:PORT``
    gets loopback mode from hetflow itself."""
    drop = ("RAY_ADDRESS", "OMP_NUM_THREADS", "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER")
    env = {k: v for k, v in os.environ.items() if k not in drop}
    env.update(extra)
    return env


# torch 2.13's gloo now and then aborts a rank as its process exits, after the script has done
# everything ("terminate called without an active exception", SIGABRT). Reproduced under plain
# torchrun, without hetflow (examples/launch/fsdp2.py: 2 of 12 runs on a loaded 2-core host),
# so it is torch's, not the launcher's; the examples' barrier before destroy_process_group made
# it rarer. A run that failed only that way - its final line printed, then that abort, and no
# snapshot it could resume from - runs once more; any other failure, or the abort twice, fails.
EXIT_ABORT = "terminate called without an active exception"


def _aborted_at_exit(run: subprocess.CompletedProcess, args: tuple[str, ...]) -> bool:
    return (run.returncode != 0 and EXIT_ABORT in run.stdout + run.stderr
            and "final loss" in run.stdout and "--snapshot" not in args)


def _run_once_more_on_exit_abort(cmd: list[str], args: tuple[str, ...],
                                 **kwargs: object) -> subprocess.CompletedProcess:
    import warnings

    run = subprocess.run(cmd, capture_output=True, text=True, **kwargs)
    if _aborted_at_exit(run, args):
        warnings.warn(f"a rank hit torch's exit abort ({EXIT_ABORT}); ran once more: "
                      f"{' '.join(cmd[:4])} ...", stacklevel=3)
        run = subprocess.run(cmd, capture_output=True, text=True, **kwargs)
    return run


def hetflow_launch(*args: str, timeout: float = 240, cwd: Path | None = None,
                   **popen: object) -> subprocess.CompletedProcess:
    return _run_once_more_on_exit_abort([str(BIN / "hetflow"), "launch", *args], args,
                                        timeout=timeout, cwd=cwd, env=clean_env(), **popen)


def torchrun(script: Path, *args: str, nproc: int = 2, timeout: float = 240,
             env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    return _run_once_more_on_exit_abort(
        [str(BIN / "torchrun"), "--standalone", "--nproc_per_node", str(nproc), str(script), *args],
        args, timeout=timeout, env=clean_env(**(env or {})))


def final_loss(stdout: str) -> float:
    found = re.findall(r"final loss ([0-9.]+)", stdout)
    assert len(found) == 1, f"expected one 'final loss' line in:\n{stdout}"
    return float(found[0])


def step_losses(stdout: str) -> list[tuple[int, float]]:
    return [(int(s), float(v)) for s, v in re.findall(r"step (\d+) loss ([0-9.]+)", stdout)]


def processes_of_run(run_id: str) -> dict[int, dict[str, str]]:
    """pid -> environment of every live process started for ``run_id`` (TORCHELASTIC_RUN_ID).

    It sees every process of the machine: tests running side by side (xdist) must use run ids
    no other test uses (tests/hosts prefixes its own with ``hosts-``)."""
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
