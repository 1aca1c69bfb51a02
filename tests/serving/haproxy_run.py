"""The real HAProxy for the front-door tests: a rendered config started in a folder, waited for
until ``ready()`` (a failure shows HAProxy's own log)."""

from __future__ import annotations

import socket
import subprocess
import time
from collections.abc import Callable
from pathlib import Path

from hetflow.workloads.serve.front import haproxy_binary


def listening(port: int) -> bool:
    try:
        socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
        return True
    except OSError:
        return False


def start_haproxy(root: Path, config: str, ready: Callable[[], bool],
                  env: dict[str, str] | None = None, timeout_s: float = 10) -> tuple[subprocess.Popen, Path]:
    """``config`` written to ``root/haproxy.cfg`` and run (its log: ``root/haproxy.log``) until
    ``ready()``; the process and the log's path."""
    (root / "haproxy.cfg").write_text(config)
    log = root / "haproxy.log"
    proc = subprocess.Popen([haproxy_binary(), "-W", "-db", "-f", str(root / "haproxy.cfg")],
                            stdout=subprocess.DEVNULL, stderr=log.open("wb"), env=env)
    deadline = time.monotonic() + timeout_s
    while not ready():
        assert proc.poll() is None and time.monotonic() < deadline, log.read_text()
        time.sleep(0.05)
    return proc, log
