"""An elastic training job resized by the live controller through its checkpoint (real Ray).

One hetflow node ``a`` declares 4 L40S it does not have (4 Ray CPUs for the ranks) beside a
plain 1-CPU head. A training job (CPU ranks, gloo; dp 1 in its config; the user model
``tests/fixtures/user_pkg/paced.py``, whose steps take at least 20 ms, so that its steps outlast
the controller's decisions on a fast machine too) declares
``devices: {count: 1, max: 2}``: alone, policy ``hetflow`` starts it at its max, 2 (growing into
idle devices costs a waiting job nothing). A rigid 3-device job arrives with a much smaller
remaining area: at the next round boundary the training job shrinks to 1 through its checkpoint
(dp 2 -> 1, the global batch kept) instead of being preempted; the rigid job ends once the test
has seen the shrunk job train (``until_file_job.py``), and the training job grows back to 2,
since the
time its remaining steps save at 4 pays for the restart (``1 + hysteresis`` restores of
``restore_s``). Every attempt resumes at the step the one before checkpointed, and the job ends
with exactly its steps, every step's loss kept.
"""

from __future__ import annotations

import os

os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")

import argparse
import json
import sys
from pathlib import Path
from typing import Any

import pytest

from hetflow.accelerators.synthetic import synthetic_node
from hetflow.cli.jobs import register
from hetflow.control import client
from hetflow.control.controller import NAMESPACE
from hetflow.control.jobspec import job_from_dict, resolve
from hetflow.workloads.train.checkpoint import list_checkpoints
from tests.control.test_controller_ray import all_ended, assert_every_step_kept, jobs_by_id, wait_for
from tests.ray_cluster import hetflow_cluster

pytestmark = pytest.mark.ray

STEPS = 250
FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"  # user_pkg: the paced model
UNTIL_FILE_JOB = Path(__file__).with_name("until_file_job.py")


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory):
    # the model is imported here, in the controller and in every rank: its directory on the
    # path of this process and of the cluster's workers (they inherit PYTHONPATH)
    saved = os.environ.get("PYTHONPATH")
    os.environ["PYTHONPATH"] = os.pathsep.join([str(FIXTURES), *([saved] if saved else [])])
    sys.path.insert(0, str(FIXTURES))
    try:
        yield from _cluster(tmp_path_factory)
    finally:
        sys.path.remove(str(FIXTURES))
        if saved is None:
            os.environ.pop("PYTHONPATH", None)
        else:
            os.environ["PYTHONPATH"] = saved


def _cluster(tmp_path_factory: pytest.TempPathFactory):
    with hetflow_cluster([synthetic_node("4x L40S", "a")], head_cpus=1, node_cpus=4, namespace=NAMESPACE):
        root = tmp_path_factory.mktemp("elastic")
        client.controller({"policy": "hetflow", "round_s": 1.0, "restore_s": 2.0, "tick_s": 0.2,
                           "log_dir": str(root / "logs"), "stop_grace_s": 30.0})
        yield root


def status_json(capsys: pytest.CaptureFixture, job: str) -> dict[str, Any]:
    """``hetflow status JOB --json`` (this process is connected already)."""
    cli = argparse.ArgumentParser()
    register(cli.add_subparsers())
    args = cli.parse_args(["status", job, "--json"])
    capsys.readouterr()
    assert args.func(args) == 0
    return json.loads(capsys.readouterr().out)


def test_an_elastic_training_job_shrinks_for_a_rigid_one_and_grows_back(cluster: Path,
                                                                        capsys: pytest.CaptureFixture) -> None:
    ckpt = cluster / "elastic-ckpt"
    spec = resolve(job_from_dict({
        "name": "elastic", "kind": "train",
        "train": {"name": "elastic-live", "model": {"spec": "user_pkg.paced:SPEC", "hidden": 16},
                  "train": {"steps": STEPS, "batch_size": 64, "log_every": 10},
                  "checkpoint": {"dir": str(ckpt)},
                  "resources": {"devices": "cpu", "cpus_per_rank": 1}},
        "devices": {"count": 1, "max": 2, "scaling": "eff:0.85"},
    }), cluster)
    assert spec.sizes == (1, 2)
    job = client.submit(spec)["job_id"]
    wait_for(lambda: (jobs_by_id()[job]["progress_step"] or 0) >= 10, 60, "training progress at 2 devices")
    first = jobs_by_id()[job]
    assert first["size"] == 2 and first["devices"].startswith("2x L40S on a") and first["resizes"] == 0

    # 3 devices for an estimated 8 s: a far smaller area than the training job's remaining steps;
    # it really ends when `release` exists
    release = cluster / "release"
    rigid = client.submit(resolve(job_from_dict({
        "name": "rigid", "kind": "python", "python": {"script": str(UNTIL_FILE_JOB), "args": [str(release)]},
        "devices": {"count": 3}, "work": {"seconds": 8}, "preemptible": False}), cluster))["job_id"]
    shrunk = wait_for(lambda: (r := jobs_by_id()[job])["size"] == 1 and r["runs"][0]["end_step"] is not None
                      and (r["progress_step"] or 0) > r["runs"][0]["end_step"] and r, 90,
                      "the training job to train shrunk to 1 device")
    assert shrunk["status"] == "RUNNING" and shrunk["resizes"] == 1 and shrunk["runs"][0]["outcome"] == "preempted"
    assert "resized by policy hetflow from 2 to 1 devices" in " ".join(h for _, h in shrunk["history"])
    shown = status_json(capsys, job)  # `hetflow status --json` shows the current size and resizes
    assert (shown["size"], shown["resizes"], shown["sizes"]) == (1, 1, [1, 2])
    assert shown["devices"].startswith("1x L40S on a")
    release.touch()  # the rigid job ends: 3 devices idle

    jobs = wait_for(lambda: all_ended([job, rigid]), 120, "both jobs to end")
    assert jobs[rigid]["status"] == "SUCCEEDED"
    record = jobs[job]
    assert record["status"] == "SUCCEEDED", record["reason"]
    runs = record["runs"]
    sizes = [run["size"] for run in runs]
    assert sizes[:2] == [2, 1] and sizes[-1] == 2, sizes  # shrunk, then grown back once the rigid job ended
    assert record["resizes"] == sum(a != b for a, b in zip(sizes, sizes[1:])) >= 2
    assert runs[-1]["started_at"] > jobs[rigid]["finished_at"]
    assert all(run["outcome"] == "preempted" for run in runs[:-1]) and runs[-1]["outcome"] == "succeeded"
    for earlier, later in zip(runs, runs[1:]):
        assert later["start_step"] == earlier["end_step"]  # resumed right after its checkpoint
    assert 10 <= runs[0]["end_step"] and runs[-1]["end_step"] == STEPS
    assert runs[-1]["start_step"] < STEPS  # the grown attempt trained too
    # each attempt's checkpoint was written by its own layout: dp = size (tp = pp = 1)
    layouts = {info.step: info.meta["layout"]["dp"] for info in list_checkpoints(ckpt)}
    assert [layouts[run["end_step"]] for run in runs] == sizes
    assert_every_step_kept(ckpt, STEPS)  # no step lost, none repeated
