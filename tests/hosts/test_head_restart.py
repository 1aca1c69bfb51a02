"""The head host lost whole and started again, with Ray's GCS fault tolerance on a real Redis.

The head is started by ``hetflow node start --gcs-redis ADDR --gcs-namespace NAME`` (the
documented recipe, docs/reliability.md) against Debian's ``redis-server`` running outside every
host. Three controller jobs are submitted from a worker host with ``hetflow submit``: a
training job (one CPU rank of a paced model, checkpoints every 40 steps), a ``python`` job on the other host
that holds its CPUs until the test releases it (after the restart), and a third that must wait
in the queue for the second one's CPUs. Mid-run the head host loses every process at once (the controller with it) and is started again at the same address.

Checked: the controller answers again (``hetflow status`` on a worker host) with every job's
record; the queued job is still queued and then runs; the jobs that ran on the worker hosts
end SUCCEEDED; the training job's final checkpoint holds every step's loss exactly once; no
placement group is left. See tests/hosts/netns.py for the hosts.
"""

from __future__ import annotations

import json
import re
import shutil
import time
from pathlib import Path

import pytest
import yaml

from tests.hosts.netns import REPO, HostCluster, available

WHY_NOT = available()
NO_REDIS = None if shutil.which("redis-server") else (
    "redis-server is not installed: run scripts/system_deps.sh (apt-get install -y redis-server)")
pytestmark = [pytest.mark.ray, pytest.mark.hosts,
              pytest.mark.skipif(WHY_NOT is not None, reason=f"no namespace hosts here: {WHY_NOT}")]

SLEEP_JOB = REPO / "tests" / "control" / "sleep_job.py"
UNTIL_FILE_JOB = REPO / "tests" / "control" / "until_file_job.py"
# the paced model (tests/fixtures/user_pkg/paced.py: each step waits 20 ms, ~45 steps/s here):
# it outlasts the restart by ~20 s as a busy 768x768 MLP once did, without burning the CPU
STEPS = 1000
ENDED = {"SUCCEEDED", "FAILED", "CANCELLED"}


def _jobs(hosts: HostCluster, client, timeout: float = 30) -> dict[str, dict] | None:
    out = hosts.run(client, ["hetflow", "status", "--json", "--address", hosts.address],
                    check=False, timeout=timeout)
    if out.returncode != 0:
        return None
    return {r["job_id"]: r for r in json.loads(out.stdout)}


def _records(hosts: HostCluster) -> dict[str, dict] | None:
    """The controller's job records as it keeps them (Ray's GCS key-value store, which Redis
    keeps across the head's loss), read from here without a process joining Ray: the waits below
    use these, `hetflow status` is run where the test is about what a user sees."""
    from hetflow.control.state import JOB_PREFIX, KV_NAMESPACE

    values = hosts.kv_values(JOB_PREFIX, KV_NAMESPACE)
    return None if values is None else {json.loads(v)["job_id"]: json.loads(v) for v in values.values()}


def _submit(hosts: HostCluster, client, path: Path) -> str:
    out = hosts.run(client, ["hetflow", "submit", str(path), "--json", "--policy", "fifo",
                             "--address", hosts.address], timeout=120)
    return json.loads(out.stdout)["job_id"]


def _wait(check, timeout: float, what: str, every: float = 2.0):
    """Until ``check()`` is true (a `hetflow status` on a host is a process that starts Python
    and joins Ray, about 2 CPU-s on this machine: the waits read the records directly)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = check()
        if value:
            return value
        time.sleep(every)
    raise AssertionError(f"timed out after {timeout:g}s waiting for {what}")


def test_the_head_restarts_and_the_queue_and_running_jobs_survive(hosts: HostCluster, tmp_path: Path) -> None:
    if NO_REDIS or not hosts.redis_address:
        # namespaces work here but the set-up is incomplete: a failure, not a skip
        pytest.fail(NO_REDIS or "the namespace cluster runs without Redis")
    ckpt = tmp_path / "ckpt"
    release = tmp_path / "release-the-holder"  # the holder keeps the queued job waiting until then
    files = {
        "train": {"name": "train", "kind": "train", "preemptible": True,
                  "train": {"name": "head-restart", "model": {"spec": "user_pkg.paced:SPEC", "hidden": 16},
                            "train": {"steps": STEPS, "batch_size": 64, "log_every": 10},
                            "checkpoint": {"dir": str(ckpt), "interval": 40},
                            "resources": {"devices": "cpu", "cpus_per_rank": 1}}},
        "holder": {"name": "holder", "kind": "python", "cpus": 2, "devices": {"count": 0},
                    "python": {"script": str(UNTIL_FILE_JOB), "args": [str(release)]},
                    "work": {"seconds": 30}},
        "queued": {"name": "queued", "kind": "python", "cpus": 2, "devices": {"count": 0},
                   "python": {"script": str(SLEEP_JOB), "args": ["2"]}, "work": {"seconds": 2}},
    }
    paths = {}
    for key, data in files.items():
        paths[key] = tmp_path / f"{key}.yaml"
        paths[key].write_text(yaml.safe_dump(data))
    try:
        client = hosts.worker_hosts[0]
        ids = {key: _submit(hosts, client, paths[key]) for key in ("train", "holder")}
        _wait(lambda: (j := _records(hosts)) and all(j[i]["status"] == "RUNNING"
                                                      for i in ids.values()), 120,
              "both jobs to run", every=0.5)
        ids["queued"] = _submit(hosts, client, paths["queued"])

        def trained_some():
            job = (_records(hosts) or {}).get(ids["train"], {})
            return (job.get("progress_step") or 0) >= 60
        _wait(trained_some, 120, "the training job to pass step 60", every=0.5)
        before = _records(hosts)
        assert before is not None and before[ids["queued"]]["status"] == "QUEUED", before
        assert before[ids["train"]]["status"] == "RUNNING", before  # the restart meets a running job

        started = time.monotonic()
        hosts.restart_head()
        after = _wait(lambda: _jobs(hosts, client, timeout=20), 90,
                      "the controller to answer after the head restart", every=0.5)
        answered_s = time.monotonic() - started
        print(f"head restart: controller answering after {answered_s:.1f} s; training at step "
              f"{before[ids['train']]['progress_step']} before, {after[ids['train']]['progress_step']} after")
        assert set(ids.values()) <= set(after), after  # every record kept
        # not lost nor failed: still waiting for the holder's CPUs (PLACING: its runner already
        # reserving them, which it gets only once the holder ends); every job ends SUCCEEDED (below)
        assert after[ids["queued"]]["status"] in ("QUEUED", "PLACING"), after
        release.touch()

        _wait(lambda: (j := _records(hosts)) and all(j[i]["status"] in ENDED for i in ids.values()),
              400, "every job to end", every=0.5)
        ended = _jobs(hosts, client)  # as `hetflow status` shows them
        assert ended is not None
        assert {k: ended[i]["status"] for k, i in ids.items()} == dict.fromkeys(ids, "SUCCEEDED")
        from hetflow.workloads.train.checkpoint import latest_checkpoint

        final = latest_checkpoint(ckpt)
        assert final is not None and final.step == STEPS
        losses = final.meta["losses"]
        assert sorted(int(k) for k in losses) == list(range(1, STEPS + 1))  # each step once
        out = hosts.python(client, "import ray\nray.init(address=ADDRESS)\n"
                                   "from ray.util import placement_group_table\n"
                                   "live = sum(g['state'] != 'REMOVED' for g in placement_group_table().values())\n"
                                   "print(f'LIVE_GROUPS={live}')\n")
        assert re.findall(r"LIVE_GROUPS=(\d+)", out.stdout)[-1:] == ["0"], out.stdout + out.stderr
    finally:  # a failure here must not leave the holder's CPUs taken for the next tests
        release.touch()
