"""Training on a real local Ray cluster: the actor group, placement, recovery and the command.

One cluster for the module: a head with 4 CPUs and one hetflow-managed node that declares two
L40S GPUs it does not have (``ray.cluster_utils.Cluster``). Jobs with ``devices: cpu`` run as
plain CPU actors; jobs with ``devices: auto`` are placed by the planner on the "GPU" node, where
each rank sees exactly its planned device (and, with a CPU build of torch, trains on the CPU).

A worker is killed with SIGKILL from outside while the job runs; the job must finish by itself
with the same losses as an undisturbed run and every completed checkpoint kept.
"""

from __future__ import annotations

import argparse
import os
import signal
import time
from pathlib import Path

os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")

import pytest
import ray

from hetflow.accelerators.synthetic import synthetic_node
from hetflow.cli import train as train_cli
from hetflow.runtime.binding import live_snapshot
from hetflow.workloads.train.checkpoint import latest_checkpoint, list_checkpoints
from hetflow.workloads.train.config import TrainConfig, config_from_dict
from hetflow.workloads.train.job import (
    TrainingFailed,
    TrainingJob,
    evaluate_checkpoint,
    run_training,
)
from tests.ray_cluster import hetflow_cluster

pytestmark = pytest.mark.ray

REPO = Path(__file__).resolve().parents[2]
STEPS, INTERVAL = 150, 30


@pytest.fixture(scope="module")
def cluster():
    gpu_node = synthetic_node("2x L40S", "gpu-node")
    with hetflow_cluster([gpu_node], head_cpus=4, node_cpus=2):
        yield gpu_node


def digits(tmp: Path, name: str, **sections: dict) -> TrainConfig:
    base = {
        "name": name,
        "model": {"kind": "mlp", "hidden": [64, 64]},
        "layout": {"dp": 2},
        "train": {"steps": STEPS, "batch_size": 64, "log_every": 5},
        "checkpoint": {"dir": str(tmp / name), "interval": INTERVAL},
        "resources": {"devices": "cpu", "max_failures": 2},
    }
    for section, values in sections.items():
        base[section] = {**base.get(section, {}), **values}
    return config_from_dict(base)


@pytest.fixture(scope="module")
def reference(cluster, tmp_path_factory):
    """An undisturbed run, the yardstick of the recovery test."""
    return run_training(digits(tmp_path_factory.mktemp("ref"), "reference"))


class Killer:
    """Kills one rank's process with SIGKILL once rank 0 has reported ``at_step``."""

    def __init__(self, rank: int, at_step: int, root: Path) -> None:
        self.rank, self.at_step, self.root = rank, at_step, root
        self.killed_at: float | None = None
        self.step: int | None = None
        self.complete_before: dict[int, float] = {}  # step -> saved_at, seen at the kill

    def __call__(self, record: dict, job: TrainingJob) -> None:
        if self.killed_at is None and record["step"] >= self.at_step and job.worker_pids:
            self.complete_before = {c.step: c.meta["saved_at"] for c in list_checkpoints(self.root)}
            os.kill(job.worker_pids[self.rank], signal.SIGKILL)
            self.killed_at, self.step = time.time(), record["step"]


def test_dp2_digits_trains_and_checkpoints(reference) -> None:
    result = reference
    assert result.steps == STEPS and sorted(result.losses) == list(range(1, STEPS + 1))
    assert result.final_loss < result.losses[1] / 4
    assert result.metrics["val_accuracy"] > 0.9
    steps = [c.step for c in list_checkpoints(Path(result.checkpoint).parent)]
    assert steps == list(range(INTERVAL, STEPS + 1, INTERVAL))
    assert result.restarts == 0 and result.samples_per_s > 0
    assert [r.backend for r in result.ranks] == ["gloo", "gloo"]
    assert len({r.pid for r in result.ranks}) == 2


def test_killed_worker_recovers_from_the_last_checkpoint(reference, tmp_path) -> None:
    config = digits(tmp_path, "recover")
    killer = Killer(rank=1, at_step=10, root=config.checkpoint_dir)
    job = TrainingJob(config, on_progress=killer)
    result = job.run()
    assert killer.step is not None and killer.step < STEPS, "the kill came after the end"
    assert result.restarts == 1
    assert result.steps == STEPS and sorted(result.losses) == list(range(1, STEPS + 1))
    # Loss continuity: every step's loss is the undisturbed run's (same weights, same batches).
    for step in range(1, STEPS + 1):
        assert result.losses[step] == pytest.approx(reference.losses[step], abs=1e-6), step
    # The second attempt began right after a complete checkpoint...
    first_resumed = min(r["step"] for r in job.records if r["attempt"] == 1)
    resumed_from = first_resumed - 1
    assert resumed_from % INTERVAL == 0 and resumed_from >= max(killer.complete_before, default=0)
    # ...and steps done twice (killed attempt, then replayed) gave the same loss both times.
    replayed = {r["step"]: r["loss"] for r in job.records if r["attempt"] == 0
                and r["step"] > resumed_from}
    for step, loss in replayed.items():
        assert loss == pytest.approx(result.losses[step], abs=1e-6)
    # No completed checkpoint was lost or rewritten.
    after = {c.step: c.meta["saved_at"] for c in list_checkpoints(config.checkpoint_dir)}
    assert sorted(after) == list(range(INTERVAL, STEPS + 1, INTERVAL))
    for step, saved_at in killer.complete_before.items():
        assert after[step] == saved_at
    assert result.recovery_s and 0 < result.recovery_s[0] < 120


def test_too_many_failures_stop_the_job_then_rerun_resumes(cluster, tmp_path) -> None:
    config = digits(tmp_path, "give-up", checkpoint={"interval": 5},
                    resources={"max_failures": 0})
    killer = Killer(rank=0, at_step=12, root=config.checkpoint_dir)
    with pytest.raises(TrainingFailed) as err:
        TrainingJob(config, on_progress=killer).run()
    info = latest_checkpoint(config.checkpoint_dir)
    assert info is not None and info.step >= 10
    assert str(info.path) in str(err.value)  # the message says where to resume from
    # Running the same config again resumes there and finishes.
    result = run_training(config)
    assert result.ranks[0].start_step == info.step
    assert result.steps == STEPS and result.restarts == 0


def test_planner_binds_each_rank_to_its_device(cluster, tmp_path) -> None:
    config = digits(tmp_path, "placed", train={"steps": 20}, resources={"devices": "auto"})
    result = run_training(config)
    gpu_node_id = next(n["NodeID"] for n in ray.nodes()
                       if n["Alive"] and n["Labels"].get("hetflow.io/node") == "gpu-node")
    assert [r.node_id for r in result.ranks] == [gpu_node_id, gpu_node_id]
    seen = sorted(r.visible_devices["CUDA_VISIBLE_DEVICES"] for r in result.ranks)
    assert seen == ["0", "1"]  # one planned device per rank
    # torch here is a CPU build: the ranks fell back to the CPU and gloo
    assert {(r.device, r.backend) for r in result.ranks} == {("cpu", "gloo")}
    deadline = time.monotonic() + 15
    while live_snapshot().allocations and time.monotonic() < deadline:
        time.sleep(0.2)
    assert live_snapshot().allocations == ()  # the devices were given back


def test_error_in_training_code_fails_at_once(cluster, tmp_path) -> None:
    # devices: gpu on a worker whose torch sees no GPU is an error of the job, not of a process:
    # restarting would repeat it, so the job fails without using its max_failures.
    config = digits(tmp_path, "no-gpu", resources={"devices": "gpu", "max_failures": 3})
    job = TrainingJob(config)
    with pytest.raises(TrainingFailed, match="sees no GPU"):
        job.run()
    assert job.attempt == 0


def test_hetflow_train_command_runs_the_example(cluster, tmp_path) -> None:
    parser = argparse.ArgumentParser()
    train_cli.register(parser.add_subparsers())
    ckpt = tmp_path / "example"
    args = parser.parse_args(["train", str(REPO / "examples" / "train_digits.yaml"),
                              "--set", f"checkpoint.dir={ckpt}", "--quiet"])
    assert args.func(args) == 0
    info = latest_checkpoint(ckpt)
    config = config_from_dict({**_example_dict(), "checkpoint": {"dir": str(ckpt)}})
    assert info is not None and info.step == config.train.steps
    assert evaluate_checkpoint(config, info)["val_accuracy"] > 0.9


def _example_dict() -> dict:
    import yaml

    return yaml.safe_load((REPO / "examples" / "train_digits.yaml").read_text())


def test_ranks_train_on_arrays_handed_over_through_the_object_store(cluster, tmp_path) -> None:
    """``run_training(data=ref)``: the ranks and the final evaluation use the arrays in the
    object store, not the bundled dataset. The handed-over split labels every sample 3, which
    the bundled digits never do (a tenth of them are 3s): only a job that trained and was scored
    on these arrays reaches a validation accuracy of 1.0."""
    import numpy as np

    from hetflow.workloads.train.data import load_dataset, split_arrays

    arrays = split_arrays(load_dataset("digits", val_fraction=0.2, seed=0))
    arrays["train_targets"] = np.full_like(arrays["train_targets"], 3)
    arrays["val_targets"] = np.full_like(arrays["val_targets"], 3)
    ref = ray.put(arrays)
    config = digits(tmp_path, "handed-over", train={"steps": 30})
    result = run_training(config, data=ref)
    assert result.metrics["val_accuracy"] == 1.0
    bundled = evaluate_checkpoint(config, latest_checkpoint(config.checkpoint_dir))
    assert bundled["val_accuracy"] < 0.3  # the same model on the real labels: mostly wrong
