"""The cluster controller on a real local multi-node Ray cluster with fake accelerators.

Nodes ``a`` (2x MI210) and ``b`` (2x L40S) declare devices they do not have; the head is a
plain Ray node (no hetflow label, no published topology); every node gives Ray 1 CPU. Jobs are
short CPU programs (``sleep_job.py``) and real digits training jobs. Covered: the simulator and
the live controller agree on a small trace (start order and devices); submit, status, cancel
and logs; a job that can never fit is refused at submit; a training job preempted by the
policy checkpoints and resumes right after its checkpointed step; the controller killed and
restarted loses and duplicates nothing; CPU jobs (no device) run on the CPUs of every node -
the plain head's too - beside device jobs, a CPU training job's ranks run in its reservation
and checkpoint when stopped, and a CPU job bigger than any node is refused at submit. Every
wait has a deadline.
"""

from __future__ import annotations

import os

os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")

import argparse
import json
import time
from pathlib import Path
from typing import Any, Callable

import pytest
import ray

from hetflow.accelerators.synthetic import synthetic_node
from hetflow.cli.jobs import register
from hetflow.control import client
from hetflow.control.controller import CONTROLLER_NAME, NAMESPACE
from hetflow.control.jobspec import JobSpec, job_from_dict, resolve
from hetflow.control.scheduler import live_throughputs
from hetflow.core.errors import Unschedulable
from hetflow.runtime.binding import live_snapshot
from hetflow.scheduling.policies.capacity import ClusterModel
from hetflow.scheduling.policies.registry import make_policy
from hetflow.scheduling.throughput import FIXED_DURATION
from hetflow.sim.engine import SimConfig, Simulator
from hetflow.sim.traces import Job
from hetflow.workloads.train.checkpoint import latest_checkpoint
from tests.ray_cluster import hetflow_cluster

pytestmark = pytest.mark.ray

SLEEP_JOB = Path(__file__).with_name("sleep_job.py")
UNTIL_FILE_JOB = Path(__file__).with_name("until_file_job.py")
ENDED = {"SUCCEEDED", "FAILED", "CANCELLED"}


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory):
    nodes = [synthetic_node("2x MI210", "a"), synthetic_node("2x L40S", "b")]
    with hetflow_cluster(nodes, head_cpus=1, namespace=NAMESPACE):
        root = tmp_path_factory.mktemp("control")
        client.controller({"policy": "fifo", "tick_s": 0.2, "log_dir": str(root / "logs"),
                           "stop_grace_s": 30.0})
        yield root


def sleep_spec(name: str, count: int, seconds: float, marker: Path | None = None,
               devices: dict[str, Any] | None = None, **extra: Any) -> JobSpec:
    args = [str(seconds)] + ([str(marker)] if marker else [])
    data = {"name": name, "kind": "python", "python": {"script": str(SLEEP_JOB), "args": args},
            "devices": {"count": count, **(devices or {})}, "work": {"seconds": seconds}, **extra}
    return resolve(job_from_dict(data), SLEEP_JOB.parent)


def until_spec(name: str, count: int, release: Path, marker: Path) -> JobSpec:
    """A job on ``count`` devices that runs until ``release`` exists (until_file_job.py)."""
    data = {"name": name, "kind": "python",
            "python": {"script": str(UNTIL_FILE_JOB), "args": [str(release), str(marker)]},
            "devices": {"count": count}, "work": {"seconds": 5}}
    return resolve(job_from_dict(data), UNTIL_FILE_JOB.parent)


def train_job(cluster: Path, name: str, hidden: int, steps: int, interval: int,
              devices: dict[str, Any] | None = None) -> tuple[JobSpec, Path]:
    """A digits training job (one CPU rank of an MLP [hidden, hidden]) checkpointing every
    ``interval`` steps into ``cluster/<name>-ckpt``; ``devices`` None makes it a CPU job."""
    ckpt = cluster / f"{name}-ckpt"
    data: dict[str, Any] = {
        "name": name, "kind": "train",
        "train": {
            "name": f"{name}-live", "model": {"kind": "mlp", "hidden": [hidden, hidden]},
            "train": {"steps": steps, "batch_size": 256, "log_every": 10},
            "checkpoint": {"dir": str(ckpt), "interval": interval},
            "resources": {"devices": "cpu", "cpus_per_rank": 1},
        },
    }
    if devices is not None:
        data["devices"] = devices
    return resolve(job_from_dict(data), cluster), ckpt


def assert_every_step_kept(ckpt: Path, steps: int) -> None:
    """The newest checkpoint is the last step's and holds every step's loss: none lost."""
    final = latest_checkpoint(ckpt)
    assert final is not None and final.step == steps
    assert {int(k) for k in final.meta["losses"]} == set(range(1, steps + 1))


# Each wait's limit is what the step takes on this machine idle, times SLOW_MACHINE: a limit only
# ends a hang, and CI's machine (and this one, some days) runs the suite two to three times
# slower (an 8 s `import torch`; the preempted training once missed 120 s there).
SLOW_MACHINE = 3


def wait_for(check: Callable[[], Any], timeout_s: float, what: str) -> Any:
    timeout_s *= SLOW_MACHINE
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        value = check()
        if value:
            return value
        time.sleep(0.2)
    raise AssertionError(f"timed out after {timeout_s:g}s waiting for {what}; jobs: "
                         f"{[(r['job_id'], r['status'], r['reason']) for r in client.status()]}")


def jobs_by_id() -> dict[str, dict[str, Any]]:
    return {r["job_id"]: r for r in client.status()}


def all_ended(ids: list[str]) -> dict[str, dict[str, Any]] | None:
    jobs = jobs_by_id()
    return jobs if all(jobs[i]["status"] in ENDED for i in ids) else None


# --- the same policy in the simulator and live --------------------------------------------------

# (name, devices, seconds), submitted in this order at once. With fifo and first fit on the
# node order a, b: j1 -> a, j2 -> b0 (to the end), j3 waits (2 devices), j4 -> b1; at 8 s j1
# ends and j3 takes a; at 12 s j4 ends and j5 takes b1; at 16 s j3 ends and j6 takes a. Events
# are 4 s apart and j2 outlasts them all, far more than a job's start-up skew on a loaded
# machine (at 2 s apart, a late start let j2 end before j4 and j5 took b0), so the order cannot race.
TRACE = [("j1", 2, 8.0), ("j2", 1, 30.0), ("j3", 2, 8.0), ("j4", 1, 12.0), ("j5", 1, 8.0), ("j6", 2, 4.0)]


def test_simulator_and_live_controller_agree(cluster: Path) -> None:
    snapshot = live_snapshot()
    model = ClusterModel.from_snapshot(snapshot)
    trace = [Job(name, FIXED_DURATION, 0.0, n, s) for name, n, s in TRACE]
    sim = Simulator(model, trace, make_policy("fifo"), live_throughputs(), SimConfig()).run()
    sim_order = [r.job.job_id for r in sorted(sim.jobs, key=lambda r: r.first_start)]
    first_segment = {}
    for seg in sim.segments:
        first_segment.setdefault(sim.jobs[seg.job].job.job_id, seg)
    sim_devices = {name: sorted((model.nodes[n].machine, model.nodes[n].devices[p]) for n, p in seg.slots)
                   for name, seg in first_segment.items()}

    ids = [client.submit(sleep_spec(name, n, s))["job_id"] for name, n, s in TRACE]
    jobs = wait_for(lambda: all_ended(ids), 120, "the trace to finish")
    live = [jobs[i] for i in ids]
    assert all(j["status"] == "SUCCEEDED" for j in live)
    assert all(len(j["runs"]) == 1 for j in live)  # nothing preempted or retried
    live_order = [j["name"] for j in sorted(live, key=lambda j: (j["first_started_at"], j["seq"]))]
    live_devices = {j["name"]: sorted((node, dev) for node, dev in j["runs"][0]["devices"]) for j in live}

    assert sim_order == ["j1", "j2", "j4", "j3", "j5", "j6"]  # the trace does what it says
    assert live_order == sim_order
    assert live_devices == sim_devices
    assert sim_devices["j3"] == [("a", 0), ("a", 1)] and sim_devices["j5"] == [("b", 1)]


# --- the commands ----------------------------------------------------------------------------------


def test_submit_status_cancel_and_logs(cluster: Path, capsys: pytest.CaptureFixture) -> None:
    long = client.submit(sleep_spec("long", 2, 120, devices={"model": "L40S"}))
    assert long["status"] == "QUEUED" and long["job_id"].startswith("long-")
    running = wait_for(lambda: jobs_by_id()[long["job_id"]]["status"] == "RUNNING"
                       and jobs_by_id()[long["job_id"]], 30, "the long job to run")
    assert running["devices"] == "2x L40S on b [0 1]"

    behind = client.submit(sleep_spec("behind", 1, 1, devices={"model": "L40S"}))
    why = wait_for(lambda: jobs_by_id()[behind["job_id"]]["reason"].startswith("waiting")
                   and jobs_by_id()[behind["job_id"]]["reason"], 10, "a waiting reason")
    assert jobs_by_id()[behind["job_id"]]["status"] == "QUEUED"
    assert "needs 1x L40S" in why and "L40S: none free" in why
    cli = argparse.ArgumentParser()
    register(cli.add_subparsers())
    args = cli.parse_args(["status"])
    assert args.func(args) == 0  # `hetflow status`: the process is connected already
    lines = {line.split()[0]: line for line in capsys.readouterr().out.splitlines()[1:]}
    assert "RUNNING" in lines[long["job_id"]] and "2x L40S on b [0 1]" in lines[long["job_id"]]
    assert "QUEUED" in lines[behind["job_id"]] and lines[behind["job_id"]].endswith(why)

    logs = wait_for(lambda: "CUDA_VISIBLE_DEVICES" in client.logs(long["job_id"])
                    and client.logs(long["job_id"]), 20, "the job's output in its log")
    assert f"job {long['job_id']} attempt 1 on b:0,b:1 CUDA_VISIBLE_DEVICES=0,1" in logs

    assert client.cancel(behind["job_id"])["status"] == "CANCELLED"  # queued: at once
    client.cancel(long["job_id"])
    ended = wait_for(lambda: all_ended([long["job_id"]]), 30, "the cancel to stop the job")
    assert ended[long["job_id"]]["status"] == "CANCELLED"
    assert ended[behind["job_id"]]["runs"] == []  # it never started
    assert "attempt 1: cancelled" in client.logs(long["job_id"])
    # its devices are free again: a job on them starts
    after = client.submit(sleep_spec("after", 2, 0.5, devices={"model": "L40S"}))
    done = wait_for(lambda: all_ended([after["job_id"]]), 30, "a job on the freed devices")
    assert done[after["job_id"]]["status"] == "SUCCEEDED"


def test_job_that_can_never_fit_is_refused_at_submit(cluster: Path) -> None:
    before = len(client.status())
    with pytest.raises(Unschedulable, match=r"MI210: 2 in the whole cluster, it needs 3.*L40S: 2 in the whole cluster"):
        client.submit(sleep_spec("huge", 3, 1))
    with pytest.raises(Unschedulable, match=r"no MI300X devices in this cluster \(it has MI210, L40S\)"):
        client.submit(sleep_spec("absent", 1, 1, devices={"model": "MI300X"}))
    with pytest.raises(Unschedulable, match=r"L40S: 48.0 GiB per device, it needs 80.0 GiB"):
        client.submit(sleep_spec("fat", 1, 1, devices={"vendor": "nvidia", "memory": "80GiB"}))
    assert len(client.status()) == before  # nothing was queued


# --- durability ------------------------------------------------------------------------------------


def test_controller_killed_and_restarted_loses_and_duplicates_nothing(cluster: Path) -> None:
    marker, release = cluster / "ran.txt", cluster / "release-k"
    # the first two run until released after the restart (a fixed sleep could end before the
    # test sees both running, on a busy machine); the third waits for their devices
    specs = [until_spec("k1", 2, release, marker), until_spec("k2", 2, release, marker),
             sleep_spec("k3", 2, 3, marker)]
    ids = [client.submit(s)["job_id"] for s in specs]
    wait_for(lambda: sum(jobs_by_id()[i]["status"] == "RUNNING" for i in ids) == 2, 60, "two jobs running")
    before = client.info()
    ray.kill(ray.get_actor(CONTROLLER_NAME, namespace=NAMESPACE), no_restart=False)
    def restarted() -> dict | None:
        try:
            info = client.info()
        except Exception:  # noqa: BLE001 - not answering yet
            return None
        return info if info["started_at"] > before["started_at"] else None

    after = wait_for(restarted, 60, "the controller to come back")
    release.touch()
    jobs = wait_for(lambda: all_ended(ids), 90, "every job to end after the restart")
    assert after["restarted"]
    assert [jobs[i]["status"] for i in ids] == ["SUCCEEDED"] * 3
    assert all(len(jobs[i]["runs"]) == 1 and jobs[i]["token"] == 1 for i in ids)  # no second attempt
    ran = marker.read_text().split("\n")
    assert sorted(line for line in ran if line) == sorted(f"{i} 1" for i in ids)  # each ran once


# --- preemption ------------------------------------------------------------------------------------


def test_preempted_training_resumes_from_its_checkpoint(cluster: Path) -> None:
    client.configure({"policy": "srtf", "round_s": 1.0})
    train, ckpt = train_job(cluster, "digits", 512, 600, 100, devices={"model": "MI210"})
    job = client.submit(train)["job_id"]
    wait_for(lambda: (jobs_by_id()[job]["progress_step"] or 0) >= 30, 90, "training progress")
    # shorter remaining work on the same two devices: srtf preempts the training job for it
    short = client.submit(sleep_spec("short", 2, 2, devices={"model": "MI210"}))["job_id"]
    jobs = wait_for(lambda: all_ended([job, short]), 120, "both jobs to end")
    client.configure({"policy": "fifo"})

    record = jobs[job]
    assert record["status"] == "SUCCEEDED" and jobs[short]["status"] == "SUCCEEDED"
    assert record["preemptions"] >= 1
    runs = record["runs"]
    assert runs[0]["outcome"] == "preempted" and runs[-1]["outcome"] == "succeeded"
    stopped_at = runs[0]["end_step"]
    assert 30 <= stopped_at < 600
    for earlier, later in zip(runs, runs[1:]):
        assert later["start_step"] == earlier["end_step"]  # resumed right after its checkpoint
    assert runs[-1]["end_step"] == 600
    assert jobs[short]["first_started_at"] < runs[1]["started_at"]  # the short job ran in between
    assert_every_step_kept(ckpt, 600)  # no completed step lost


def test_a_job_whose_runner_dies_restarts_from_its_checkpoint(cluster: Path) -> None:
    """The runner process of a running training job is killed (as when its node fails): the
    controller notices it vanished, queues the job again, and the next attempt resumes from the
    newest complete checkpoint - on devices that were given back, finishing every step."""
    from hetflow.control.runner import runner_name

    train, ckpt = train_job(cluster, "lost", 256, 800, 50, devices={"model": "MI210"})
    job = client.submit(train)["job_id"]
    wait_for(lambda: (jobs_by_id()[job]["progress_step"] or 0) >= 120, 120, "training progress")
    complete_before = latest_checkpoint(ckpt)
    ray.kill(ray.get_actor(runner_name(job), namespace=NAMESPACE), no_restart=True)
    record = wait_for(lambda: all_ended([job]), 180, "the job to restart and finish")[job]

    assert record["status"] == "SUCCEEDED", record["reason"]
    runs = record["runs"]
    assert [r["outcome"] for r in runs] == ["lost", "succeeded"]
    assert "died without reporting" in " ".join(h for _, h in record["history"])
    assert complete_before is not None and complete_before.step >= 100
    # the second attempt began at a complete checkpoint no older than the one seen at the kill
    resumed = runs[1]["start_step"]
    assert resumed % 50 == 0 and complete_before.step <= resumed < 800
    assert_every_step_kept(ckpt, 800)


# --- CPU jobs ----------------------------------------------------------------------------------------


def cpu_groups() -> dict[str, list[tuple[str, float]]]:
    """Placement groups now holding CPUs: job id -> [(Ray node id, CPUs)]."""
    from ray.util import placement_group_table

    out: dict[str, list[tuple[str, float]]] = {}
    for group in placement_group_table().values():
        if group.get("state") == "REMOVED":
            continue
        for index, resources in (group.get("bundles") or {}).items():
            if resources.get("CPU"):
                node = (group.get("bundles_to_node_id") or {}).get(index, "")
                out.setdefault(group["name"].removeprefix("hetflow-"), []).append((node, resources["CPU"]))
    return out


def test_cpu_jobs_run_on_every_nodes_cpus_while_device_jobs_run(cluster: Path) -> None:
    head = next(n["NodeID"] for n in ray.nodes() if n["Alive"] and "hetflow.io/node" not in (n.get("Labels") or {}))
    # long enough to outlast the CPU jobs on a loaded machine (CI took more than 12 s); cancelled below
    device = client.submit(sleep_spec("gangs", 2, 120, devices={"model": "L40S"}))["job_id"]
    # the CPU jobs run until released (CI's loaded machine started them more than 6 s apart)
    release = cluster / "cpu-release"
    cpu_ids = [client.submit(until_spec(f"cpu{i}", 0, release, cluster / "cpu-started"))["job_id"]
               for i in range(3)]
    late = client.submit(sleep_spec("cpu-late", 0, 1))["job_id"]

    def all_running():  # the records and the placement groups read together (a loaded machine)
        jobs = jobs_by_id()
        if not all(jobs[i]["status"] == "RUNNING" for i in cpu_ids):
            return None
        groups = cpu_groups()
        return (jobs, groups) if all(i in groups for i in cpu_ids) else None
    running, groups = wait_for(all_running, 60, "three CPU jobs running")
    # one CPU each on a, b and the plain head: the cluster's three CPUs, reserved in Ray
    assert sorted(running[i]["devices"] for i in cpu_ids) == ["1 CPU on a", "1 CPU on b", f"1 CPU on ray-{head[:12]}"]
    assert sorted(cpu for i in cpu_ids for _, cpu in groups[i]) == [1.0, 1.0, 1.0]
    assert head in {node for i in cpu_ids for node, _ in groups[i]}
    assert running[late]["status"] == "QUEUED"
    assert running[late]["reason"].startswith(f"waiting: needs 1 CPU on one node; CPUs free: 0 on a, 0 on b, "
                                              f"0 on ray-{head[:12]}")

    release.touch()
    jobs = wait_for(lambda: all_ended(cpu_ids + [late]), 60, "the CPU jobs to end")
    assert all(jobs[i]["status"] == "SUCCEEDED" for i in cpu_ids + [late])
    assert jobs[device]["status"] == "RUNNING"  # they ran beside the device job
    assert "on  CUDA_VISIBLE_DEVICES=\n" in client.logs(late)  # no device, none visible
    client.cancel(device)
    wait_for(lambda: all_ended([device]), 30, "the device job to stop")


def test_a_cpu_job_bigger_than_any_node_is_refused_at_submit(cluster: Path) -> None:
    before = len(client.status())
    with pytest.raises(Unschedulable, match=r"job big \(2 CPUs on one node\) can never run on this cluster, even "
                                            r"empty: the largest node has too few \(a: 1 CPU, b: 1 CPU, ray-\w+: 1 CPU\)"):
        client.submit(sleep_spec("big", 0, 1, cpus=2))
    assert len(client.status()) == before


def test_cpu_training_ranks_run_in_the_reservation_and_checkpoint_when_stopped(cluster: Path) -> None:
    train, ckpt = train_job(cluster, "digits-cpu", 512, 5000, 1000)
    assert train.cpu_only  # no devices section: resources.device cpu makes it a CPU job
    job = client.submit(train)["job_id"]
    wait_for(lambda: (jobs_by_id()[job]["progress_step"] or 0) >= 20, 90, "CPU training progress")
    assert [cpu for _, cpu in cpu_groups()[job]] == [1.0]
    client.cancel(job)  # the stop file: the rank checkpoints at its current step and returns
    record = wait_for(lambda: all_ended([job]), 60, "the training to stop")[job]
    assert record["status"] == "CANCELLED"
    run = record["runs"][0]
    assert run["device_type"] == "CPU" and run["where"].startswith("1 CPU on ")
    final = latest_checkpoint(ckpt)
    assert final is not None and final.step == run["end_step"] and 20 <= final.step < 5000
    assert job not in cpu_groups()  # its CPUs were given back


# --- launch jobs (an unchanged torchrun script as N ranks) ------------------------------------------

LAUNCH_EXAMPLES = Path(__file__).resolve().parents[2] / "examples" / "launch"


def launch_spec(name: str, script: Path, args: list[str], nproc: int, seconds: float,
                devices: dict[str, Any] | None = None, **launch: Any) -> JobSpec:
    data = {"name": name, "kind": "launch",
            "launch": {"script": str(script), "args": args, "nproc": nproc, **launch},
            "devices": devices or {}, "work": {"seconds": seconds}}
    return resolve(job_from_dict(data), script.parent)


def test_a_launch_job_runs_its_ranks_on_the_policys_devices(cluster: Path) -> None:
    out = cluster / "launch-env"
    env_dump = Path(__file__).resolve().parents[1] / "launch" / "scripts" / "env_dump.py"
    job = client.submit(launch_spec("ranks", env_dump, [str(out), "--init"], 2, 5,
                                    devices={"model": "MI210"}))["job_id"]
    record = wait_for(lambda: all_ended([job]), 90, "the launch job to end")[job]
    assert record["status"] == "SUCCEEDED", record["reason"]
    records = {p.name: json.loads(p.read_text()) for p in out.glob("rank-*.json")}
    assert sorted(records) == ["rank-0-attempt-0.json", "rank-1-attempt-0.json"]
    for rank in (0, 1):
        env = records[f"rank-{rank}-attempt-0.json"]
        assert env["RANK"] == env["LOCAL_RANK"] == str(rank) and env["WORLD_SIZE"] == "2"
        assert env["TORCHELASTIC_RUN_ID"] == job
        assert env["HIP_VISIBLE_DEVICES"] == "0,1"  # node a's two MI210s, in local-rank order
        assert env["allreduce"] == 3.0
    logs = client.logs(job)
    assert "[rank 1] rank 1 attempt 0 wrote its environment" in logs


def test_a_preempted_launch_job_restarts_its_group_and_the_script_resumes(cluster: Path) -> None:
    client.configure({"policy": "srtf", "round_s": 1.0})
    snapshot = cluster / "launch-snap.pt"
    args = ["--steps", "500", "--save-every", "20", "--log-every", "50", "--step-sleep", "0.01",
            "--snapshot", str(snapshot)]
    job = client.submit(launch_spec("torchrun", LAUNCH_EXAMPLES / "ddp_snapshot.py", args, 2, 60,
                                    devices={"model": "MI210"}))["job_id"]
    wait_for(lambda: snapshot.exists(), 90, "the script's first snapshot")
    # shorter remaining work on the same two devices: srtf preempts the launch job for it
    short = client.submit(sleep_spec("short2", 2, 2, devices={"model": "MI210"}))["job_id"]
    jobs = wait_for(lambda: all_ended([job, short]), 240, "both jobs to end")
    client.configure({"policy": "fifo"})
    record = jobs[job]
    assert record["status"] == "SUCCEEDED", record["reason"]
    assert jobs[short]["status"] == "SUCCEEDED"
    runs = record["runs"]
    assert runs[0]["outcome"] == "preempted" and runs[-1]["outcome"] == "succeeded"
    assert jobs[short]["first_started_at"] < runs[1]["started_at"]
    logs = client.logs(job)
    assert "resumed from step" in logs and "[rank 0] final loss" in logs
