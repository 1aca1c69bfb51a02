"""Controller jobs in Ray's own tooling, and ``hetflow submit --wait`` / ``logs -f`` / ``--tail N``,
as a user meets them: the hetflow and ``ray`` commands run as separate processes against one real
local Ray cluster that runs Ray's dashboard (its job API), on loopback, on free ports.

Covered: each attempt is the Ray job ``hetflow-<job>-<attempt>`` in ``ray job list`` with the
attempt's outcome (SUCCEEDED, FAILED) and its output in ``ray job logs``; ``submit --wait`` prints
the output and exits with the job's outcome (0, 1); ``logs --tail N`` prints the last N lines;
``logs -f`` keeps printing until the job ends; ``ray job stop`` on a running attempt cancels the
hetflow job (CANCELLED, and the Ray job STOPPED); ``submit --dry-run`` runs the admission check on
the cluster without queuing. One cluster for the module; every wait has a deadline.
"""

from __future__ import annotations

import os

os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")

import json
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest
import ray
from ray.cluster_utils import Cluster

from hetflow.accelerators.synthetic import synthetic_node
from hetflow.control import client
from hetflow.control.controller import NAMESPACE
from hetflow.control.jobspec import load_job
from hetflow.runtime.binding import publish_node
from hetflow.runtime.resources import node_labels, node_resources
from tests.control.test_controller_ray import wait_for
from tests.net import free_port

pytestmark = pytest.mark.ray

REPO = Path(__file__).resolve().parents[2]
COUNT_JOB = Path(__file__).with_name("count_job.py")
RAY = str(Path(sys.executable).with_name("ray"))


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory):
    dashboard = free_port()
    head = Cluster(initialize_head=True, head_node_args={
        "num_cpus": 2, "node_ip_address": "127.0.0.1", "include_dashboard": True, "dashboard_host": "127.0.0.1",
        "dashboard_port": dashboard, "dashboard_agent_listen_port": free_port()})
    root = tmp_path_factory.mktemp("rayjobs")
    gpus = synthetic_node("2x MI210", "a")  # a node that declares devices it does not have
    try:
        head.add_node(num_cpus=1, num_gpus=0, resources=node_resources(gpus), labels=node_labels(gpus))
        ray.init(address=head.address, namespace=NAMESPACE)
        publish_node(gpus)
        client.controller({"policy": "fifo", "tick_s": 0.2, "log_dir": str(root / "logs"), "stop_grace_s": 5.0})
        yield {"address": head.address, "api": f"http://127.0.0.1:{dashboard}", "root": root}
    finally:
        if ray.is_initialized():
            ray.shutdown()
        head.shutdown()


def job_file(root: Path, name: str, count: int, delay: float, code: int) -> Path:
    path = root / f"{name}.yaml"
    path.write_text(f"name: {name}\nkind: python\npython: {{script: {COUNT_JOB}, args: ['{count}', '{delay}', "
                    f"'{code}']}}\ndevices: {{count: 0}}\ncpus: 0.5\nmax_attempts: 1\nwork: {{seconds: 5}}\n")
    return path


def _env() -> dict[str, str]:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO / "src"), os.environ.get("PYTHONPATH", "")])}
    env.pop("RAY_ADDRESS", None)
    return env


def run(*argv: str, timeout: float = 90) -> subprocess.CompletedProcess:
    return subprocess.run(list(argv), capture_output=True, text=True, timeout=timeout, env=_env(), cwd=REPO)


def hetflow_together(cluster: dict, *commands: list[str], timeout: float = 120) -> list[subprocess.CompletedProcess]:
    """Several hetflow commands at once (separate processes), each's result."""
    procs = [subprocess.Popen([sys.executable, "-m", "hetflow.cli.main", *argv, "--address", cluster["address"]],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=_env(), cwd=REPO)
             for argv in commands]
    results = []
    for proc, argv in zip(procs, commands):
        out, err = proc.communicate(timeout=timeout)
        results.append(subprocess.CompletedProcess(argv, proc.returncode, out, err))
    return results


def hetflow(cluster: dict, *argv: str, timeout: float = 90) -> subprocess.CompletedProcess:
    return run(sys.executable, "-m", "hetflow.cli.main", *argv, "--address", cluster["address"], timeout=timeout)


def ray_job_list(cluster: dict) -> str:
    done = run(RAY, "job", "list", "--address", cluster["api"])
    assert done.returncode == 0, done.stderr
    return done.stdout + done.stderr


def ray_job_status(listing: str, submission_id: str) -> str | None:
    """The status `ray job list` prints for ``submission_id`` (its JobDetails repr)."""
    for details in listing.split("JobDetails(")[1:]:
        if f"submission_id='{submission_id}'" in details:
            return re.search(r"status=<JobStatus\.(\w+)", details).group(1)
    return None


def ray_status(cluster: dict, submission_id: str) -> str | None:
    """The Ray job's status through Ray's SDK (cheap, for waiting; assertions use the CLI)."""
    from ray.job_submission import JobSubmissionClient

    try:
        return JobSubmissionClient(cluster["api"]).get_job_status(submission_id).value
    except RuntimeError:  # not submitted yet
        return None


def test_submit_wait_exits_with_the_outcome_and_each_attempt_is_a_ray_job(cluster: dict) -> None:
    ok, bad = hetflow_together(cluster, ["submit", str(job_file(cluster["root"], "count-ok", 5, 0.1, 0)), "--wait"],
                               ["submit", str(job_file(cluster["root"], "count-bad", 2, 0.1, 3)), "--wait"])
    assert ok.returncode == 0, ok.stderr
    job_id = ok.stdout.splitlines()[0]
    assert [line for line in ok.stdout.splitlines() if line.startswith("line ")] == [f"line {i}" for i in range(1, 6)]
    assert f"{job_id}: SUCCEEDED" in ok.stderr

    assert bad.returncode == 1, bad.stderr
    bad_id = bad.stdout.splitlines()[0]
    assert "line 2" in bad.stdout and f"{bad_id}: FAILED" in bad.stderr

    # Ray's own tooling: the attempt is a Ray job with the attempt's outcome and output
    wait_for(lambda: ray_status(cluster, f"hetflow-{bad_id}-1") == "FAILED", 120, "the failed attempt's Ray job")
    listing = ray_job_list(cluster)
    assert ray_job_status(listing, f"hetflow-{bad_id}-1") == "FAILED"
    assert ray_job_status(listing, f"hetflow-{job_id}-1") == "SUCCEEDED"
    assert f"'hetflow_job': '{job_id}'" in listing
    logs = run(RAY, "job", "logs", f"hetflow-{job_id}-1", "--address", cluster["api"])
    assert logs.returncode == 0 and "line 5" in logs.stdout and "succeeded" in logs.stdout, logs.stderr

    # --tail counts lines
    tail = hetflow(cluster, "logs", job_id, "--tail", "3")
    assert tail.returncode == 0
    lines = tail.stdout.splitlines()
    assert len(lines) == 3 and lines[-1].startswith(f"=== attempt 1: succeeded"), lines
    assert "line 5" in lines


def test_logs_follow_prints_until_the_job_ends(cluster: dict) -> None:
    job_id = client.submit(load_job(job_file(cluster["root"], "count-slow", 12, 0.5, 0)))["job_id"]
    wait_for(lambda: "line 2" in client.logs(job_id), 60, "the job's first lines")
    t0 = time.monotonic()
    follow = hetflow(cluster, "logs", job_id, "-f", timeout=120)
    assert follow.returncode == 0, follow.stderr
    assert time.monotonic() - t0 > 1.0  # it stayed while the job ran (the job prints for ~6 s)
    printed = [line for line in follow.stdout.splitlines() if line.startswith("line ")]
    assert printed == [f"line {i}" for i in range(int(printed[0].split()[1]), 13)], printed
    assert "=== attempt 1: succeeded" in follow.stdout


def test_ray_job_stop_cancels_the_hetflow_job(cluster: dict) -> None:
    job_id = client.submit(load_job(job_file(cluster["root"], "count-long", 600, 0.1, 0)))["job_id"]
    sid = f"hetflow-{job_id}-1"
    wait_for(lambda: ray_status(cluster, sid) == "RUNNING", 60, "the attempt's Ray job running")
    stop = run(RAY, "job", "stop", sid, "--address", cluster["api"])
    assert stop.returncode == 0, stop.stderr
    record = wait_for(lambda: (lambda r: r if r["status"] == "CANCELLED" else None)(client.status(job_id)[0]),
                      60, "the job cancelled")
    assert "cancelled" in record["reason"]
    wait_for(lambda: ray_status(cluster, sid) == "STOPPED", 30, "the Ray job stopped")
    assert ray_job_status(ray_job_list(cluster), sid) == "STOPPED"


def test_submit_dry_run_checks_admission_on_the_cluster_and_queues_nothing(cluster: dict) -> None:
    before = client.status()
    done = hetflow(cluster, "submit", str(job_file(cluster["root"], "count-dry", 1, 0.0, 0)), "--dry-run", "--json")
    assert done.returncode == 0, done.stderr
    data = json.loads(done.stdout)
    assert data["dry_run"] and "CPU" in data["could_run_on"] and data["cluster"]["address"] == cluster["address"]
    big = cluster["root"] / "big.yaml"
    big.write_text(f"name: big\nkind: python\npython: {{script: {COUNT_JOB}, args: ['1', '0', '0']}}\n"
                   "devices: {count: 0}\ncpus: 64\n")
    refused = hetflow(cluster, "submit", str(big), "--dry-run")
    assert refused.returncode == 3 and "can never run on this cluster" in refused.stderr, refused.stderr
    assert [r["job_id"] for r in client.status()] == [r["job_id"] for r in before]  # nothing was queued


def test_train_dry_run_plans_exact_devices_on_the_cluster_and_reserves_nothing(cluster: dict) -> None:
    from ray.util import placement_group_table

    done = hetflow(cluster, "train", "examples/train_digits.yaml", "--dry-run", "--json",
                   "--set", "resources.devices.kind=gpu")
    assert done.returncode == 0, done.stderr
    data = json.loads(done.stdout)
    assert data["ray"]["address"] == cluster["address"] and data["ray"]["hetflow_nodes"] == ["a"]
    assert data["placement"]["devices"] == "hetflow" and sorted(data["placement"]["where"]) == ["a:0", "a:1"]
    assert not [g for g in placement_group_table().values() if g["state"] != "REMOVED"]
    refused = hetflow(cluster, "train", "examples/train_digits.yaml", "--dry-run", "--set", "resources.devices.kind=gpu",
                      "--set", "layout.dp=4")
    assert refused.returncode == 3, refused.stderr
