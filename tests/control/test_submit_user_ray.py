"""``hetflow submit`` the way a user meets it on one machine: ``hetflow node start`` (a head with
Ray's own node IP - this machine's LAN address where it has a default route, not a pinned
127.0.0.1), then ``hetflow submit JOB --wait`` and ``hetflow status`` with no address (the
cluster `ray start` recorded), each its own process in a user's environment (no Ray loopback
mode, no RAY_ADDRESS).

The head's processes are this module's alone: Ray's temp folder is one of its own, and at the end
the processes whose command lines name it are stopped by PID (never a blind ``ray stop``) and
the recorded cluster is removed.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest
from tests.net import free_port
from tests.ray_hygiene import command_lines

pytestmark = pytest.mark.ray

HETFLOW = str(Path(sys.executable).with_name("hetflow"))
COUNT_JOB = Path(__file__).with_name("count_job.py")


def ours(folder: str) -> list[int]:
    """PIDs of the processes whose command line names ``folder`` (this module's Ray)."""
    return [pid for pid, argv in command_lines().items() if any(folder in a for a in argv)]


def stop(folder: str) -> None:
    for sig in (signal.SIGTERM, signal.SIGKILL):
        for pid in ours(folder):
            try:
                os.kill(pid, sig)
            except ProcessLookupError:
                pass
        deadline = time.monotonic() + 15
        while ours(folder) and time.monotonic() < deadline:
            time.sleep(0.3)


@pytest.fixture(scope="module")
def user():
    folder = tempfile.mkdtemp(prefix="hfu-", dir="/tmp")  # short: Ray's socket paths live below
    env = {k: v for k, v in os.environ.items()
           if k not in ("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "RAY_ADDRESS")}
    env["RAY_TMPDIR"] = folder

    def hetflow(*args: str, timeout: float = 180) -> subprocess.CompletedProcess:
        return subprocess.run([HETFLOW, *args], env=env, capture_output=True, text=True,
                              timeout=timeout, cwd=folder)

    ports = [free_port() for _ in range(4)]
    try:
        started = hetflow("node", "start", "--num-cpus", "2", "--", f"--port={ports[0]}",
                          f"--dashboard-port={ports[1]}", f"--ray-client-server-port={ports[2]}",
                          f"--dashboard-agent-listen-port={ports[3]}", "--disable-usage-stats")
        assert started.returncode == 0, started.stdout + started.stderr
        yield hetflow, folder
    finally:
        stop(folder)
        Path(folder, "ray", "ray_current_cluster").unlink(missing_ok=True)
        subprocess.run(["rm", "-rf", folder], check=False)


def test_the_head_has_rays_own_node_ip(user) -> None:
    """The control for the rest: the head is not pinned to loopback (where the machine has a
    route elsewhere, its node IP is that interface's address)."""
    _, folder = user
    recorded = Path(folder, "ray", "ray_current_cluster").read_text().strip()
    import ray._private.services as services

    assert recorded.rsplit(":", 1)[0] == services.node_ip_address_from_perspective()


def test_submit_wait_runs_the_job_and_status_shows_it(user, tmp_path) -> None:
    hetflow, _ = user
    job = tmp_path / "count.yaml"
    job.write_text(f"name: count\nkind: python\npython: {{script: {COUNT_JOB}, args: ['3', '0.2', "
                   "'0']}\ndevices: {count: 0}\ncpus: 0.5\nmax_attempts: 1\n")
    done = hetflow("submit", str(job), "--wait")
    assert done.returncode == 0, done.stdout + done.stderr
    assert [line for line in done.stdout.splitlines() if line.startswith("line ")] == \
        ["line 1", "line 2", "line 3"]
    status = hetflow("status", "--json", timeout=60)
    assert status.returncode == 0, status.stderr
    records = json.loads(status.stdout)
    assert [r["status"] for r in records if r["name"] == "count"] == ["SUCCEEDED"]
