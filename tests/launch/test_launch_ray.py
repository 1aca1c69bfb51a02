"""``hetflow launch`` on a real local multi-node Ray cluster, run as a user runs it (the CLI,
``--address``), with unchanged torchrun scripts.

One cluster for the module: a CPU head (4 CPUs) and a hetflow-managed node declaring 8 V100s
it does not have, wired as a DGX-1 (hybrid cube mesh; ``ray.cluster_utils.Cluster``). CPU jobs
run as plain processes with gloo; ``--device gpu`` jobs are placed by the planner on the V100
node, where each rank sees exactly the planned devices (and trains nothing: CPU-only torch).

The scripts in ``examples/launch`` are written as a user would for torchrun; the same script
under ``torchrun --standalone`` is the yardstick (same final loss). Processes of a run are found
by their TORCHELASTIC_RUN_ID (``/proc``): a kill and the no-orphans checks hit exactly them.
"""

from __future__ import annotations

import os
import signal
import subprocess
import time
from pathlib import Path

os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")

import pytest
import ray

from hetflow.accelerators.synthetic import synthetic_node
from hetflow.core.request import ParallelLayout, PlacementRequest
from hetflow.runtime.binding import live_snapshot
from hetflow.scheduling.planner import plan
from tests.launch.common import (
    BIN,
    EXAMPLES,
    SCRIPTS,
    clean_env,
    dumped,
    final_loss,
    hetflow_launch,
    processes_of_run,
    step_losses,
    torchrun,
)
from tests.ray_cluster import hetflow_cluster

pytestmark = pytest.mark.ray


@pytest.fixture(scope="module")
def address():
    node = synthetic_node("8x V100", "dgx1")
    with hetflow_cluster([node], head_cpus=4, node_cpus=4) as cluster:
        yield cluster.address


DDP_ARGS = ["--steps", "120", "--log-every", "1"]


@pytest.fixture(scope="module")
def ddp_reference():
    """The DDP example under torchrun, once for the module (its losses do not depend on
    --snapshot, --save-every or --step-sleep)."""
    run = torchrun(EXAMPLES / "ddp_snapshot.py", *DDP_ARGS)
    assert run.returncode == 0, run.stderr
    return run


def _groups_of_run(run_id: str) -> list[dict]:
    return [g for g in ray.util.placement_group_table().values()
            if g.get("name", "").startswith(f"hetflow-{run_id}")]


def _no_leftovers(run_id: str) -> None:
    assert processes_of_run(run_id) == {}
    deadline = time.monotonic() + 15
    while time.monotonic() < deadline:
        if all(g["state"] == "REMOVED" for g in _groups_of_run(run_id)):
            break
        time.sleep(0.2)
    groups = _groups_of_run(run_id)
    assert groups and all(g["state"] == "REMOVED" for g in groups), groups


@pytest.mark.parametrize("script, extra, launch_flags", [
    ("ddp_snapshot.py", DDP_ARGS, []),
    ("fsdp2.py", ["--steps", "20"], []),
    ("tensor_parallel.py", ["--steps", "20"], ["--tp", "2"]),
    # Hugging Face Accelerate, as `accelerate launch --cpu` runs it (ACCELERATE_USE_CPU: on CPUs
    # Accelerate is multi-process only when asked; on GPUs the torchrun variables suffice)
    ("accelerate_train.py", ["--steps", "20"], ["--env", "ACCELERATE_USE_CPU=1"]),
])
def test_unchanged_scripts_end_as_under_torchrun(address, ddp_reference, script, extra,
                                                 launch_flags) -> None:
    env = dict(flag.split("=", 1) for flag in launch_flags[1::2] if "=" in flag)
    reference = ddp_reference if script == "ddp_snapshot.py" else torchrun(EXAMPLES / script, *extra, env=env)
    assert reference.returncode == 0, reference.stderr
    run = hetflow_launch("--address", address, "--device", "cpu", "--nproc", "2", *launch_flags,
                         str(EXAMPLES / script), *extra)
    assert run.returncode == 0, run.stderr + "\nlast output:\n" + run.stdout[-3000:]
    assert final_loss(run.stdout) == pytest.approx(final_loss(reference.stdout), rel=1e-5, abs=1e-6)
    ours, theirs = step_losses(run.stdout), step_losses(reference.stdout)
    assert ours and [s for s, _ in ours] == [s for s, _ in theirs]
    assert [v for _, v in ours] == pytest.approx([v for _, v in theirs], rel=1e-5, abs=1e-6)
    assert all(line.startswith("[rank ") for line in run.stdout.splitlines())


def test_every_rank_gets_the_torchrun_environment_over_two_nodes(address, tmp_path) -> None:
    out = tmp_path / "env"
    run = hetflow_launch("--address", address, "--device", "cpu", "--nproc", "4",
                         "--cpus-per-rank", "2", "--env", "MY_FLAG=on", "--run-id", "envrun",
                         "--log-dir", str(tmp_path / "logs"), str(SCRIPTS / "env_dump.py"),
                         str(out), "--init")
    assert run.returncode == 0, run.stderr
    records = dumped(out)
    assert sorted(records) == [(r, 0) for r in range(4)]
    by_group: dict[str, list[dict]] = {}
    for (rank, _), env in records.items():
        assert env["RANK"] == env["ROLE_RANK"] == str(rank)
        assert env["WORLD_SIZE"] == env["ROLE_WORLD_SIZE"] == "4"
        assert env["ROLE_NAME"] == "default" and env["MY_FLAG"] == "on"
        assert env["TORCHELASTIC_RUN_ID"] == "envrun" and env["TORCHELASTIC_RESTART_COUNT"] == "0"
        assert env["TORCHELASTIC_MAX_RESTARTS"] == "0"
        assert env["GROUP_WORLD_SIZE"] == "2" and env["OMP_NUM_THREADS"] == "1"
        assert env["CUDA_VISIBLE_DEVICES"] == ""  # a CPU rank sees no device
        assert env["allreduce"] == 1 + 2 + 3 + 4  # init_process_group(env://) joined all four
        by_group.setdefault(env["GROUP_RANK"], []).append(env)
    assert {e["MASTER_PORT"] for e in records.values()} == {records[(0, 0)]["MASTER_PORT"]}
    assert sorted(by_group) == ["0", "1"]  # 2 CPUs per rank: two ranks on each node
    for envs in by_group.values():
        assert sorted(e["LOCAL_RANK"] for e in envs) == ["0", "1"]
        assert {e["LOCAL_WORLD_SIZE"] for e in envs} == {"2"}
    assert records[(0, 0)]["GROUP_RANK"] == "0"
    # each rank's output is kept, and streamed with its prefix
    for rank in range(4):
        log = (tmp_path / "logs" / f"rank-{rank}.log").read_text()
        assert f"rank {rank} attempt 0 wrote its environment" in log
        assert f"[rank {rank}] rank {rank} attempt 0 wrote its environment" in run.stdout
    _no_leftovers("envrun")


def test_a_failure_restarts_the_whole_group_with_a_fresh_rendezvous(address, tmp_path) -> None:
    out = tmp_path / "env"
    run = hetflow_launch("--address", address, "--device", "cpu", "--nproc", "2",
                         "--max-restarts", "2", "--run-id", "restarts", str(SCRIPTS / "env_dump.py"),
                         str(out), "--init", "--fail-rank", "1", "--fail-attempts", "2", "--code", "5")
    assert run.returncode == 0, run.stderr
    records = dumped(out)
    assert sorted(records) == [(r, a) for r in range(2) for a in range(3)]
    ports = {records[(0, a)]["MASTER_PORT"] for a in range(3)}
    assert len(ports) == 3  # a new store every attempt (no stale TCPStore, pytorch#135712)
    for (rank, attempt), env in records.items():
        assert env["TORCHELASTIC_RESTART_COUNT"] == str(attempt)
        assert env["TORCHELASTIC_MAX_RESTARTS"] == "2"
        assert env["allreduce"] == 3.0  # both ranks rendezvoused again in every attempt
    assert len({records[(1, a)]["pid"] for a in range(3)}) == 3  # new processes each time
    assert run.stderr.count("exited with code 5") == 2
    _no_leftovers("restarts")


def test_the_exit_code_is_the_failing_ranks_once_restarts_are_used_up(address, tmp_path) -> None:
    out = tmp_path / "env"
    run = hetflow_launch("--address", address, "--device", "cpu", "--nproc", "2",
                         "--max-restarts", "1", "--run-id", "gaveup", str(SCRIPTS / "env_dump.py"),
                         str(out), "--fail-rank", "1", "--fail-attempts", "9", "--code", "7",
                         "--fail-delay", "3", "--sleep", "60")  # rank 0 has written before rank 1 fails
    assert run.returncode == 7, run.stderr
    assert sorted(dumped(out)) == [(r, a) for r in range(2) for a in range(2)]
    assert "rank 1 exited with code 7" in run.stderr.splitlines()[-1]
    _no_leftovers("gaveup")  # rank 0 slept 60 s: it was stopped, not waited for


def test_a_killed_rank_resumes_from_the_scripts_snapshot_with_the_same_losses(
        address, ddp_reference, tmp_path) -> None:
    args = [*DDP_ARGS, "--save-every", "20", "--step-sleep", "0.03"]
    reference = ddp_reference
    snapshot = tmp_path / "snap.pt"
    proc = subprocess.Popen(
        [str(BIN / "hetflow"), "launch", "--address", address, "--device", "cpu", "--nproc", "2",
         "--max-restarts", "2", "--run-id", "launch-killed", "--log-dir", str(tmp_path / "logs"),
         str(EXAMPLES / "ddp_snapshot.py"), *args, "--snapshot", str(snapshot)],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=clean_env())
    try:
        deadline = time.monotonic() + 120
        while not snapshot.exists() and time.monotonic() < deadline and proc.poll() is None:
            time.sleep(0.1)
        assert snapshot.exists(), "no snapshot was written"
        victims = [pid for pid, env in processes_of_run("launch-killed").items() if env.get("RANK") == "1"
                   and "ddp_snapshot.py" in Path(f"/proc/{pid}/cmdline").read_text()]
        assert len(victims) == 1
        os.kill(victims[0], signal.SIGKILL)
        stdout, stderr = proc.communicate(timeout=180)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0, stderr
    assert "rank 1 was killed by SIGKILL" in stderr and "resumed from step" in stdout
    expected = dict(step_losses(reference.stdout))
    seen = step_losses(stdout)
    assert {s for s, _ in seen} == set(expected)  # every logged step is there
    for step, loss in seen:  # steps redone after the resume give the same loss again
        assert loss == pytest.approx(expected[step], rel=1e-5, abs=1e-6), step
    assert final_loss(stdout) == pytest.approx(final_loss(reference.stdout), rel=1e-5, abs=1e-6)
    _no_leftovers("launch-killed")


@pytest.mark.parametrize("visible", ["node", "own"])
def test_gpu_ranks_see_exactly_the_planned_devices(address, tmp_path, visible) -> None:
    expected = plan(live_snapshot(), PlacementRequest("expected", layout=ParallelLayout(dp=2, tp=2)))
    devices = [ref.device for ref in expected.devices]
    assert sorted(devices[:2]) != [0, 1]  # DGX-1: the planner's TP pairs are not first fit
    out = tmp_path / "env"
    run = hetflow_launch("--address", address, "--device", "gpu", "--nproc", "4", "--tp", "2",
                         "--visible-devices", visible, "--run-id", f"gpu-{visible}",
                         str(SCRIPTS / "env_dump.py"), str(out))
    assert run.returncode == 0, run.stderr
    records = dumped(out)
    for rank in range(4):
        env = records[(rank, 0)]
        seen = [int(d) for d in env["CUDA_VISIBLE_DEVICES"].split(",")]
        if visible == "own":
            assert seen == [devices[rank]]
        else:  # the job's devices on the node in local-rank order: cuda:LOCAL_RANK is its own
            assert seen == devices and seen[int(env["LOCAL_RANK"])] == devices[rank]
    _no_leftovers(f"gpu-{visible}")


def test_a_working_dir_is_shipped_and_modules_run(address, tmp_path) -> None:
    project = tmp_path / "project"
    (project / "trainer").mkdir(parents=True)
    (project / "trainer" / "__init__.py").write_text("")
    (project / "trainer" / "helpers.py").write_text("def greet(rank):\n    return f'hello from {rank}'\n")
    (project / "trainer" / "main.py").write_text(
        "import os, sys\nfrom trainer.helpers import greet\n"
        "print(greet(os.environ['RANK']), sys.argv[1:], flush=True)\n")
    (project / "run.py").write_text(
        "import os\nfrom trainer.helpers import greet\nprint(greet(os.environ['RANK']), flush=True)\n")
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    run = hetflow_launch("--address", address, "--device", "cpu", "--nproc", "2",
                         "--working-dir", str(project), "run.py", cwd=elsewhere)
    assert run.returncode == 0, run.stderr
    assert "[rank 1] hello from 1" in run.stdout
    run = hetflow_launch("--address", address, "--device", "cpu", "--nproc", "2",
                         "--working-dir", str(project), "-m", "trainer.main", "--lr", "3", cwd=elsewhere)
    assert run.returncode == 0, run.stderr
    assert "[rank 0] hello from 0 ['--lr', '3']" in run.stdout


def test_ctrl_c_stops_every_rank_and_exits_130(address, tmp_path) -> None:
    out = tmp_path / "env"
    proc = subprocess.Popen(
        [str(BIN / "hetflow"), "launch", "--address", address, "--device", "cpu", "--nproc", "2",
         "--run-id", "interrupted", str(SCRIPTS / "env_dump.py"), str(out), "--sleep", "120"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=clean_env())
    try:
        deadline = time.monotonic() + 90
        while len(dumped(out)) < 2 and time.monotonic() < deadline:
            time.sleep(0.1)
        assert len(processes_of_run("interrupted")) == 2
        proc.send_signal(signal.SIGINT)
        _, stderr = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 130, stderr
    assert "Traceback" not in stderr
    _no_leftovers("interrupted")


def test_more_ranks_than_the_cluster_can_ever_hold_exit_3(address) -> None:
    run = hetflow_launch("--address", address, "--device", "cpu", "--nproc", "64",
                         str(SCRIPTS / "env_dump.py"), "/tmp/unused", timeout=90)
    assert run.returncode == 3, run.stderr
    assert "64 ranks" in run.stderr and "Traceback" not in run.stderr
    run = hetflow_launch("--address", address, "--device", "gpu", "--nproc", "16", "--tp", "8",
                         str(SCRIPTS / "env_dump.py"), "/tmp/unused", timeout=90)
    assert run.returncode == 3, run.stderr
    assert "Traceback" not in run.stderr
