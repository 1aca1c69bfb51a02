"""The reaper an LLM engine runs under (hetflow.workloads.serve.reaper), with real processes:
a command that leaves a child of its own behind (as vLLM's server leaves its engine core and
workers) has its whole family ended when the holder is killed with SIGKILL, when the command
exits by itself, and at a stop; the scratch folder goes too; bad input is one line."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from hetflow.workloads.serve.llm import _reaper_setup, reaped
from tests.procs import alive, group_of, nice_of

# the "engine": starts a child that would outlive it (sleep), writes both PIDs, then waits or exits
ENGINE = """
import os, subprocess, sys, time
child = subprocess.Popen(["sleep", "300"])
open(sys.argv[1], "w").write(f"{os.getpid()} {child.pid}")
if sys.argv[2] == "exit":
    time.sleep(0.5)
    os._exit(3)
time.sleep(300)
"""

# the "actor": holds the reaper (as LLMReplica does), writes its PID, then waits to be killed
HOLDER = """
import json, os, subprocess, sys, time
from hetflow.workloads.serve.llm import _reaper_setup, reaped
argv, env = reaped(json.loads(sys.argv[1]), dict(os.environ), remove=sys.argv[2])
proc = subprocess.Popen(argv, env=env, preexec_fn=_reaper_setup)
open(sys.argv[3], "w").write(str(proc.pid))
time.sleep(300)
"""


AUTOGROUP = Path("/proc/self/autogroup").exists()


def autogroup(pid: int) -> tuple[str, int]:
    """A process's session scheduling group and its nice (``/autogroup-12 nice 0``). The kernel
    prints nothing for the root group, init's, which every process of a session that never
    called setsid() shares (a CI runner's, a container's): ``("root", 0)``, its nice unsettable."""
    text = Path(f"/proc/{pid}/autogroup").read_text().split()
    if not text:
        return "root", 0
    name, _, nice = text
    return name, int(nice)


def wait_file(path: Path, timeout_s: float = 30) -> str:
    deadline = time.monotonic() + timeout_s
    while not (path.exists() and path.read_text().strip()):
        assert time.monotonic() < deadline, f"{path} was not written"
        time.sleep(0.05)
    time.sleep(0.05)
    return path.read_text().strip()


def wait_gone(pids: list[int], timeout_s: float = 15) -> list[int]:
    deadline = time.monotonic() + timeout_s
    while (left := [p for p in pids if alive(p)]) and time.monotonic() < deadline:
        time.sleep(0.1)
    return left


def engine_argv(pids: Path, mode: str) -> list[str]:
    return [sys.executable, "-c", ENGINE, str(pids), mode]


@pytest.fixture
def groups():
    """Process groups a test started: whatever of them a failing test leaves is killed."""
    started: list[int] = []
    yield started
    for pgid in started:
        try:
            os.killpg(pgid, signal.SIGKILL)
        except ProcessLookupError:
            pass


def test_a_killed_holder_takes_the_engines_whole_family_and_its_folder(tmp_path: Path, groups) -> None:
    scratch = tmp_path / "scratch"
    scratch.mkdir()
    (scratch / "socket").write_text("x")
    pids, reaper_pid = tmp_path / "pids", tmp_path / "reaper"
    holder = subprocess.Popen([sys.executable, "-c", HOLDER,
                               json.dumps(engine_argv(pids, "wait")), str(scratch), str(reaper_pid)])
    try:
        engine, child = map(int, wait_file(pids).split())
        reaper = int(wait_file(reaper_pid))
        groups.append(reaper)
        assert all(alive(p) for p in (reaper, engine, child))
        holder.kill()  # kill -9: no handler of the holder runs
        holder.wait(10)
        assert wait_gone([reaper, engine, child]) == []
        deadline = time.monotonic() + 10
        while scratch.exists() and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not scratch.exists()
    finally:
        if holder.poll() is None:
            holder.kill()


def test_an_engine_that_exits_takes_its_orphans_and_its_status_comes_back(tmp_path: Path, groups) -> None:
    pids = tmp_path / "pids"
    argv, env = reaped(engine_argv(pids, "exit"), dict(os.environ))
    proc = subprocess.Popen(argv, env=env, preexec_fn=_reaper_setup)
    groups.append(proc.pid)
    engine, child = map(int, wait_file(pids).split())
    assert proc.wait(30) == 3  # the engine's own exit status
    assert wait_gone([engine, child]) == []  # its child did not outlive it


def test_a_stop_to_the_group_ends_everything(tmp_path: Path, groups) -> None:
    pids = tmp_path / "pids"
    argv, env = reaped(engine_argv(pids, "wait"), dict(os.environ))
    proc = subprocess.Popen(argv, env=env, preexec_fn=_reaper_setup)
    groups.append(proc.pid)
    engine, child = map(int, wait_file(pids).split())
    os.killpg(proc.pid, signal.SIGTERM)  # what LLMReplica.stop sends
    assert proc.wait(30) == 128 + signal.SIGTERM
    assert wait_gone([engine, child]) == []


@pytest.mark.parametrize("start,asked", [(15, 0), (0, 19)])
def test_the_engine_runs_at_the_nice_value_asked(tmp_path: Path, groups, start: int, asked: int) -> None:
    """Ray's workers run at nice 15; the engine is started at the value asked where the OS
    allows it (raising it always is; lowering it needs root/CAP_SYS_NICE), else one line."""
    pids = tmp_path / "pids"
    argv, env = reaped(engine_argv(pids, "wait"), dict(os.environ), nice=asked)

    def setup() -> None:
        os.nice(start)
        _reaper_setup()

    proc = subprocess.Popen(argv, env=env, preexec_fn=setup, stderr=subprocess.PIPE, text=True)
    groups.append(proc.pid)
    engine, child = map(int, wait_file(pids).split())
    if asked >= start or os.geteuid() == 0:
        assert nice_of(engine) == nice_of(child) == asked
        if AUTOGROUP:  # and their session's share against other sessions (session_nice)
            assert autogroup(engine) == autogroup(child) != autogroup(os.getpid())
            assert autogroup(engine)[1] == asked
    else:  # pragma: no cover - where the tests run unprivileged
        assert nice_of(engine) == start
    os.killpg(proc.pid, signal.SIGTERM)
    _out, err = proc.communicate(timeout=30)
    if asked < start and os.geteuid() != 0:  # pragma: no cover
        assert "stays at nice" in err and err.count("\n") == 1
    else:
        assert err == ""


@pytest.mark.skipif(not AUTOGROUP, reason="the kernel has no autogroup scheduling (/proc/self/autogroup)")
def test_a_reaper_that_leads_no_session_leaves_the_callers_session_share_alone(tmp_path: Path, groups) -> None:
    """Started in a process group of its own but in the caller's session, the reaper must not
    set that session's autogroup nice (it would lower every process of the caller's session)."""
    mine = autogroup(os.getpid())
    pids = tmp_path / "pids"
    argv, env = reaped(engine_argv(pids, "wait"), dict(os.environ), nice=19)
    proc = subprocess.Popen(argv, env=env, process_group=0)
    groups.append(proc.pid)
    try:
        engine, _child = map(int, wait_file(pids).split())
        assert nice_of(engine) == 19
        assert autogroup(engine) == autogroup(os.getpid()) == mine
    finally:
        if autogroup(os.getpid()) != mine:  # put it back for the rest of the run
            Path("/proc/self/autogroup").write_text(str(mine[1]))
    os.killpg(proc.pid, signal.SIGTERM)
    assert proc.wait(30) == 128 + signal.SIGTERM


@pytest.mark.parametrize("value", [None, "", "not json", "[]", '["a", 1]', '{"a": 1}'])
def test_a_bad_command_is_one_line_and_exit_2(value: str | None) -> None:
    env = {k: v for k, v in os.environ.items() if k != "HETFLOW_REAPER_ARGV"}
    if value is not None:
        env["HETFLOW_REAPER_ARGV"] = value
    out = subprocess.run([sys.executable, "-m", "hetflow.workloads.serve.reaper"], env=env,
                         capture_output=True, text=True, timeout=30)
    assert out.returncode == 2
    assert out.stderr.count("\n") == 1 and "HETFLOW_REAPER_ARGV" in out.stderr and not out.stdout


@pytest.mark.parametrize("name,value", [("HETFLOW_REAPER_NICE", "high"), ("HETFLOW_REAPER_GRACE_S", "soon")])
def test_a_bad_setting_is_one_line_and_exit_2(name: str, value: str) -> None:
    env = {**os.environ, "HETFLOW_REAPER_ARGV": json.dumps(["true"]), name: value}
    out = subprocess.run([sys.executable, "-m", "hetflow.workloads.serve.reaper"], env=env,
                         capture_output=True, text=True, timeout=30)
    assert out.returncode == 2
    assert out.stderr.count("\n") == 1 and name in out.stderr and not out.stdout


def test_a_killed_reaper_still_takes_the_engines_family(tmp_path: Path, groups) -> None:
    """Ray kills an exiting worker's own children with SIGKILL - the reaper among them: its
    sentinel ends the engine's family and removes the folder."""
    scratch = tmp_path / "scratch"
    scratch.mkdir()
    pids = tmp_path / "pids"
    argv, env = reaped(engine_argv(pids, "wait"), dict(os.environ), remove=str(scratch))
    proc = subprocess.Popen(argv, env=env, preexec_fn=_reaper_setup)
    groups.append(proc.pid)
    engine, child = map(int, wait_file(pids).split())
    proc.kill()
    proc.wait(10)
    assert wait_gone([engine, child]) == []
    deadline = time.monotonic() + 10
    while scratch.exists() and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not scratch.exists()
    assert wait_gone(group_of(proc.pid)) == []  # the sentinel too

