"""The Ray side of one launched rank: an actor on the rank's bundle that runs the user's script
as a child process and hands its output to the launcher.

The actor is created with its placement's options (bundle, device resource, visibility
variables), so the child inherits exactly the rank's device. The child:

* runs ``python -u SCRIPT ARGS`` (or ``-m MODULE``) with the torchrun environment, in its own
  process group (a stop reaches the DataLoader workers it forks too);
* dies with its supervising thread (``PR_SET_PDEATHSIG``): a killed actor - a lost node, a
  killed launcher - never leaves a rank running unseen;
* writes stdout and stderr into one pipe, read line by line into a buffer that the launcher
  drains with :meth:`RankProcess.poll` (a long poll: it returns as soon as there is output or
  the child has exited).

* stops (SIGKILL to its process group) when the launcher has not polled it for
  ``HETFLOW_RANK_LEASE_S`` seconds (default 5; the launcher polls about every second): a rank
  whose launcher died, or whose host lost its network while its processes kept running, fences
  itself instead of running on - and writing snapshots - beside the group the launcher started
  again elsewhere (tests/hosts/test_node_loss.py cuts a host's link mid-run).

One actor serves every attempt of its rank while it lives; each attempt is a new child.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import threading
import time
from typing import Any

LEASE_ENV = "HETFLOW_RANK_LEASE_S"
DEFAULT_LEASE_S = 5.0
MAX_LINE = 64 * 1024  # a longer "line" (no newline in sight) is handed over in pieces


def _child_setup() -> None:
    """In the child, before exec: its own process group, and death with its parent thread."""
    os.setsid()
    try:
        import ctypes

        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("", 0))
        return int(s.getsockname()[1])


class RankProcess:
    """One rank's supervisor (wrapped with ``ray.remote(max_concurrency=4)`` by the launcher)."""

    def __init__(self) -> None:
        self._lock = threading.Condition()
        self._lines: list[str] = []
        self._base = 0  # index of self._lines[0] in the attempt's whole output
        self._code: int | None = None
        self._proc: subprocess.Popen | None = None
        self._attempt = -1
        self._last_poll: float | None = None  # the attempt's latest poll (None: none yet)
        self._lease_s = float(os.environ.get(LEASE_ENV) or DEFAULT_LEASE_S)
        self._fence: threading.Thread | None = None

    def where(self) -> dict[str, Any]:
        """This rank's node: address, Ray node id, a port free there, the actor's pid and cwd."""
        import ray

        from hetflow.runtime.resources import visible_devices

        return {"ip": ray.util.get_node_ip_address(), "node_id": ray.get_runtime_context().get_node_id(),
                "port": free_port(), "pid": os.getpid(), "cwd": os.getcwd(),
                "visible": {k: v for k, v in visible_devices().items() if v is not None}}

    def free_port(self) -> int:
        return free_port()

    def start(self, attempt: int, argv: list[str], env: dict[str, str], cwd: str | None) -> int:
        """Start the attempt's child (the previous one must have ended); returns its pid.

        ``argv[0]`` ``"python"`` is this worker's interpreter. ``cwd`` None (or missing on this
        node): the actor's own directory (with a runtime_env working_dir: that directory)."""
        with self._lock:
            assert self._proc is None or self._proc.poll() is not None, "previous child still running"
            self._lines, self._base, self._code, self._attempt = [], 0, None, attempt
            self._last_poll = None  # the lease starts with the launcher's first poll
        if self._fence is None and self._lease_s > 0:
            self._fence = threading.Thread(target=self._watch_lease, name="rank-lease", daemon=True)
            self._fence.start()
        argv = [sys.executable if argv[0] == "python" else argv[0], *argv[1:]]
        full_env = {**os.environ, **env}
        where = cwd if cwd and os.path.isdir(cwd) else None
        started = threading.Event()
        failure: list[BaseException] = []

        def supervise() -> None:
            # The child is forked from this thread, which lives until the child has exited: its
            # PDEATHSIG then fires only when the actor process itself dies.
            try:
                proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                        stdin=subprocess.DEVNULL, env=full_env, cwd=where,
                                        preexec_fn=_child_setup)
            except OSError as exc:
                failure.append(exc)
                started.set()
                return
            self._proc = proc
            started.set()
            assert proc.stdout is not None
            while True:
                chunk = proc.stdout.readline(MAX_LINE)
                if not chunk:
                    break
                text = chunk.decode("utf-8", errors="replace").rstrip("\n")
                with self._lock:
                    self._lines.append(text)
                    self._lock.notify_all()
            code = proc.wait()
            with self._lock:
                self._code = code
                self._lock.notify_all()

        threading.Thread(target=supervise, name=f"rank-attempt-{attempt}", daemon=True).start()
        started.wait()
        if failure:
            with self._lock:
                self._lines.append(f"hetflow launch: cannot start {argv[0]}: {failure[0]}")
                self._code = 127
            return -1
        assert self._proc is not None
        return self._proc.pid

    def _watch_lease(self) -> None:
        """Fence the child when the launcher has gone quiet (see the module docstring)."""
        while True:
            time.sleep(min(0.5, self._lease_s / 4))
            with self._lock:
                proc, last = self._proc, self._last_poll
            quiet = 0.0 if last is None else time.monotonic() - last
            if proc is None or proc.poll() is not None or quiet <= self._lease_s:
                continue
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                continue
            with self._lock:
                self._lines.append(f"hetflow launch: no poll from the launcher for {quiet:.0f} s (it "
                                   "is gone, or this host lost the cluster): rank stopped")
                self._lock.notify_all()

    def poll(self, attempt: int, offset: int, wait_s: float = 1.0) -> tuple[list[str], int | None]:
        """Output lines from ``offset`` on and the exit code once the child has exited and all
        its output is read (None while it runs). Waits up to ``wait_s`` for something new."""
        deadline = time.monotonic() + wait_s
        with self._lock:
            self._last_poll = time.monotonic()
            assert attempt == self._attempt, f"poll of attempt {attempt}, running {self._attempt}"
            while self._base + len(self._lines) <= offset and self._code is None:
                left = deadline - time.monotonic()
                if left <= 0:
                    break
                self._lock.wait(left)
            # Lines before ``offset`` were received by the launcher: drop them.
            drop = max(0, min(offset - self._base, len(self._lines)))
            del self._lines[:drop]
            self._base += drop
            # The reader sets the code only after the pipe's end: every line is in the buffer.
            return list(self._lines[max(0, offset - self._base):]), self._code

    def stop(self, grace_s: float) -> int | None:
        """SIGTERM the child's process group, SIGKILL it after ``grace_s``; its exit code."""
        proc = self._proc
        if proc is None:
            return None
        if proc.poll() is None:
            _signal_group(proc.pid, signal.SIGTERM)
            try:
                proc.wait(timeout=grace_s)
            except subprocess.TimeoutExpired:
                _signal_group(proc.pid, signal.SIGKILL)
                proc.wait()
        _signal_group(proc.pid, signal.SIGKILL)  # what it forked and left behind
        return proc.returncode

    def child_pid(self) -> int | None:
        proc = self._proc
        return proc.pid if proc is not None and proc.poll() is None else None


def _signal_group(pgid: int, sig: int) -> None:
    try:
        os.killpg(pgid, sig)
    except (ProcessLookupError, PermissionError):
        pass


__all__ = ["RankProcess", "free_port"]
