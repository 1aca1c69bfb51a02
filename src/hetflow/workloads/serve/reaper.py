"""An engine's process family goes when its holder goes: ``python -m hetflow.workloads.serve.reaper``.

vLLM's OpenAI server starts an engine-core process, which starts its workers. When the Ray
actor that holds the server dies hard (``kill -9`` of ``hetflow serve``, the OOM killer, a
raylet that kills its workers), the server dies with it (a parent-death signal), but its
engine core and workers do not: measured here, a ``VLLM::EngineCore`` and a ``VLLM::Worker``
still ran 15 minutes after a SIGKILLed ``hetflow serve``, holding their memory and cores (on
a GPU, the device memory the next start needs).

This process sits between the actor and the engine: it leads a session of its own, asks the
kernel for SIGTERM when its parent dies (``HETFLOW_REAPER_PARENT``: the parent's PID, for a
parent gone before that), and starts the command it is given (JSON in
``HETFLOW_REAPER_ARGV``, so that its own command line stays short and the engine's stays the
engine's) in its process group. Whichever ends first - the parent (SIGTERM), a stop
(SIGTERM/SIGINT/SIGHUP to the group), or the command itself - everything else in the group is
ended (SIGTERM, then SIGKILL after ``HETFLOW_REAPER_GRACE_S``, default 5 s), the folder named
in ``HETFLOW_REAPER_REMOVE`` (the engine's scratch files) is removed, and it exits with the
command's exit status (128 + signal when the command was ended by one). ``HETFLOW_REAPER_NICE``:
the CPU priority the family runs at (Ray's workers run at nice 15), where the OS allows it: the
processes' nice and, on kernels that share the CPU by session first, their session's
(:func:`session_nice`).

Ray itself kills an exiting worker's children with SIGKILL (``kill_child_processes_on_worker_exit``):
when ``hetflow serve`` is killed, its embedded Ray's workers exit and this process is killed
before it can act. So it forks a sentinel first, which waits on a pipe only this process
writes to; when this process is gone, however, the sentinel ends the group and removes the
folder.

Imports nothing beyond the standard library: it starts in a few hundredths of a second.
"""

from __future__ import annotations

import ctypes
import json
import os
import shutil
import signal
import subprocess
import sys
import time

PR_SET_PDEATHSIG = 1


def group_members(pgid: int, exclude: int) -> list[int]:
    """PIDs of the live processes in process group ``pgid``, ``exclude`` left out."""
    out = []
    for name in os.listdir("/proc"):
        if not name.isdigit() or int(name) == exclude:
            continue
        try:
            with open(f"/proc/{name}/stat", "rb") as f:
                fields = f.read().rsplit(b")", 1)[1].split()
        except OSError:
            continue
        # fields after the command: state, ppid, pgrp, ...; a zombie has already ended
        if int(fields[2]) == pgid and fields[0] != b"Z":
            out.append(int(name))
    return out


def end_group(pgid: int, grace_s: float, spare: int = 0) -> None:
    """SIGTERM to every other process of the group (``spare`` left alone), then SIGKILL to
    what is left after ``grace_s`` (new children started meanwhile included)."""
    me = os.getpid()

    def members() -> list[int]:
        return [p for p in group_members(pgid, me) if p != spare]

    for pid in members():
        try:
            os.kill(pid, signal.SIGTERM)
        except ProcessLookupError:
            pass
    deadline = time.monotonic() + grace_s
    while members() and time.monotonic() < deadline:
        time.sleep(0.1)
    for _ in range(50):  # until none is left (a process may fork while being killed)
        left = members()
        if not left:
            return
        for pid in left:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        time.sleep(0.1)


def session_nice(nice: int, quiet: bool = False) -> None:
    """The nice value of this session's *autogroup*, the same as the family's own.

    Where the kernel groups tasks by session (``kernel.sched_autogroup_enabled``, on in many
    distributions' kernels, on in this machine's), the CPU is shared between sessions first, by
    each session's autogroup nice (0 unless set), and a process's own nice orders it only
    against the processes of its session. The reaper leads a session of its own, so without
    this the family's nice would not raise or lower it against anything else on the node
    (measured here: a nice-19 process in another session still took a whole core of two from
    a nice-0 simulation). Where there is no autogroup (no ``/proc/self/autogroup``), nothing to
    do; raising the value is always allowed, lowering it below 0 needs CAP_SYS_NICE (one line,
    unless the process nice already failed and said so: ``quiet``)."""
    try:
        with open("/proc/self/autogroup", "w") as f:
            f.write(str(nice))
    except FileNotFoundError:
        return
    except OSError as exc:
        if not quiet:
            print(f"hetflow reaper: the engine's session keeps its CPU share (autogroup nice {nice}: {exc.strerror})",
                  file=sys.stderr, flush=True)


def main() -> int:
    try:
        argv = json.loads(os.environ.pop("HETFLOW_REAPER_ARGV"))
        assert isinstance(argv, list) and argv and all(isinstance(a, str) for a in argv)
    except (KeyError, ValueError, AssertionError):
        print("hetflow reaper: HETFLOW_REAPER_ARGV must hold the command as a JSON list of "
              "strings", file=sys.stderr)
        return 2
    remove = os.environ.pop("HETFLOW_REAPER_REMOVE", "")
    try:
        nice = int(os.environ.pop("HETFLOW_REAPER_NICE")) if "HETFLOW_REAPER_NICE" in os.environ else None
        grace_s = float(os.environ.pop("HETFLOW_REAPER_GRACE_S", "5"))
    except ValueError:
        print("hetflow reaper: HETFLOW_REAPER_NICE must be an integer (a nice value, -20..19) "
              "and HETFLOW_REAPER_GRACE_S a number of seconds", file=sys.stderr)
        return 2
    if nice is not None and nice != os.getpriority(os.PRIO_PROCESS, 0):
        try:
            os.setpriority(os.PRIO_PROCESS, 0, max(-20, min(19, nice)))
        except PermissionError:
            print(f"hetflow reaper: the engine stays at nice {os.getpriority(os.PRIO_PROCESS, 0)} "
                  f"(asked {nice}: lowering it needs root, CAP_SYS_NICE or RLIMIT_NICE)",
                  file=sys.stderr, flush=True)
    # the holder's PID as it started this (a parent that died before prctl below shows here)
    parent = int(os.environ.pop("HETFLOW_REAPER_PARENT", "0")) or os.getppid()
    if os.getpid() != os.getpgid(0):
        os.setsid()  # started without a session of its own: lead one
    if nice is not None and os.getsid(0) == os.getpid():  # (never another session's group)
        session_nice(max(-20, min(19, nice)), quiet=os.getpriority(os.PRIO_PROCESS, 0) != nice)
    pgid = os.getpgid(0)
    ending: list[int] = []

    def on_signal(signum: int, _frame: object) -> None:
        ending.append(signum)

    sentinel, alive_w = start_sentinel(pgid, grace_s, remove)
    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(sig, on_signal)
    try:
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGTERM)
    except OSError:
        pass
    child = subprocess.Popen(argv)  # same process group: ended with it
    code = None
    while code is None:
        if ending or os.getppid() != parent:  # a stop, or the parent gone (also before prctl)
            break
        try:
            code = child.wait(timeout=0.5)
        except subprocess.TimeoutExpired:
            pass
    end_group(pgid, grace_s if code is None else 1.0, spare=sentinel)
    if code is None:
        code = child.wait()
    if remove:
        shutil.rmtree(remove, ignore_errors=True)
    os.close(alive_w)  # the sentinel finds nothing left and exits
    return code if code >= 0 else 128 - code


def start_sentinel(pgid: int, grace_s: float, remove: str) -> tuple[int, int]:
    """A forked copy that ends the group if this process is killed before it could (Ray kills
    an exiting worker's own children with SIGKILL - the reaper among them - while the engine's
    family would live on): it waits for the end of a pipe only this process writes to, then
    ends what is left of the group. (pid, the pipe's write end)."""
    r, w = os.pipe()
    reaper = os.getpid()
    pid = os.fork()
    if pid:
        os.close(r)
        return pid, w
    try:
        os.close(w)
        for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
            signal.signal(sig, signal.SIG_IGN)  # a stop is the reaper's; SIGKILL still ends it
        while True:
            try:
                if not os.read(r, 1):
                    break
            except InterruptedError:
                continue
        end_group(pgid, grace_s, spare=reaper)  # the reaper: gone, or exiting on its own
        if remove:
            shutil.rmtree(remove, ignore_errors=True)
    finally:
        os._exit(0)


if __name__ == "__main__":
    sys.exit(main())
