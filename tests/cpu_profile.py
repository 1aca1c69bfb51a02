"""CPU seconds per test, for finding where the suite's time goes (issue 28: the suite is
CPU-bound on 2 cores, so what a test costs is its CPU, not its wall time).

    make test-cpu                      # the suite with this plugin, then the summary
    python -m tests.cpu_profile FILE   # the summary of a recorded run

Each test process (an xdist worker, or a lone pytest) moves itself into a cgroup-v1 ``cpuacct``
group of its own (root only; ``/sys/fs/cgroup/cpuacct``); everything it starts - hetflow
commands, Ray's daemons and workers, training scripts, load generators - is counted there too,
which ``time``'s user+sys is not (Ray daemonises its processes). Each test's CPU is the group's
usage from its setup to its teardown: a module's shared fixture lands on its first test, and
what a module's processes spend between its tests on the test running then. One JSON line per
test goes to ``$HETFLOW_CPU_PROFILE`` (default ``.cpu-profile.jsonl``). Off unless loaded with
``-p tests.cpu_profile``; where cgroups cannot be written it records nothing and says so once.
"""

from __future__ import annotations

import json
import os
import sys
import time
from collections import defaultdict
from pathlib import Path

import pytest

ROOT = Path("/sys/fs/cgroup/cpuacct")
OUT = Path(os.environ.get("HETFLOW_CPU_PROFILE", ".cpu-profile.jsonl"))
WORKER = os.environ.get("PYTEST_XDIST_WORKER", "main")
GROUP = ROOT / f"hetflow-tests-{os.getpid()}"
_ready = False


def _usage() -> float:
    return int((GROUP / "cpuacct.usage").read_text()) / 1e9


def pytest_configure(config) -> None:
    global _ready
    if WORKER == "main" and (config.getoption("numprocesses", None) or 0):
        return  # the xdist controller runs no test
    try:
        GROUP.mkdir(exist_ok=True)
        (GROUP / "cgroup.procs").write_text(str(os.getpid()))
        _ready = True
    except OSError as exc:
        print(f"cpu_profile: no cpuacct cgroup ({exc}); nothing recorded", file=sys.stderr)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item, nextitem):
    if not _ready:
        yield
        return
    c0, t0, started = _usage(), time.monotonic(), time.time()
    yield
    with OUT.open("a") as f:
        f.write(json.dumps({"test": item.nodeid, "cpu_s": round(_usage() - c0, 3),
                            "wall_s": round(time.monotonic() - t0, 3), "worker": WORKER,
                            "start": round(started, 3)}) + "\n")


def pytest_unconfigure(config) -> None:
    """Back to the root group; the group goes once the processes left in it have ended."""
    if not _ready:
        return
    try:
        (ROOT / "cgroup.procs").write_text(str(os.getpid()))
        GROUP.rmdir()
    except OSError:
        pass  # a process of the run still lives in it (the run's own checks name those)


def summary(path: Path, top: int = 30) -> str:
    rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    if not rows:
        return f"{path}: no tests recorded"
    modules: dict[str, list[float]] = defaultdict(lambda: [0.0, 0.0, 0])
    for r in rows:
        m = modules[r["test"].split("::", 1)[0]]
        m[0] += r["cpu_s"]
        m[1] += r["wall_s"]
        m[2] += 1
    total = sum(r["cpu_s"] for r in rows)
    lines = [f"{len(rows)} tests, {total:.0f} CPU-s in all (their processes' and what those started)",
             "", f"modules by CPU (top {top}):  CPU-s  wall-s  tests"]
    for name, (cpu, wall, n) in sorted(modules.items(), key=lambda kv: -kv[1][0])[:top]:
        lines.append(f"  {cpu:8.1f} {wall:7.1f} {n:5d}  {name}")
    lines += ["", f"tests by CPU (top {top}):  CPU-s  wall-s"]
    for r in sorted(rows, key=lambda r: -r["cpu_s"])[:top]:
        lines.append(f"  {r['cpu_s']:8.1f} {r['wall_s']:7.1f}  {r['test']}")
    return "\n".join(lines)


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit("usage: python -m tests.cpu_profile FILE (the JSON lines of a -p tests.cpu_profile run)")
    print(summary(Path(sys.argv[1])))
