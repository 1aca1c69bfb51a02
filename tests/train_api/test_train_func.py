"""``hetflow.train.run``: a Ray-Train-style train_func on hetflow's placement, on a real local
Ray cluster (a CPU head and a hetflow node declaring 8 V100s wired as a DGX-1).

The example ``examples/train_func/ddp_train_func.py`` (a Ray Train function with its imports
changed) runs as a user runs it; its rank 1 process is killed once and the run must resume from
the newest committed checkpoint with the losses of an undisturbed run.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")

import pytest
import ray.cloudpickle

import hetflow.train as train
from hetflow.accelerators.synthetic import synthetic_node
from hetflow.core.errors import InputError
from hetflow.core.request import ParallelLayout, PlacementRequest
from hetflow.runtime.binding import live_snapshot
from hetflow.scheduling.planner import plan
from tests.ray_cluster import hetflow_cluster

pytestmark = pytest.mark.ray
REPO = Path(__file__).resolve().parents[2]
EXAMPLE = REPO / "examples" / "train_func" / "ddp_train_func.py"

# the functions below travel to the ranks by value, as a user's __main__ functions do
ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])


@pytest.fixture(scope="module")
def cluster():
    with hetflow_cluster([synthetic_node("8x V100", "dgx1")], head_cpus=4, node_cpus=4):
        yield


def _record_context(config):
    ctx = train.get_context()
    mesh = ctx.device_mesh
    out = {"rank": ctx.get_world_rank(), "world": ctx.get_world_size(),
           "local": ctx.get_local_rank(), "local_world": ctx.get_local_world_size(),
           "node": ctx.get_node_rank(), "backend": ctx.backend, "device": str(ctx.device),
           "mesh_axes": list(mesh.mesh_dim_names), "mesh_shape": list(mesh.mesh.shape),
           "tp_group_size": mesh["tp"].size(), "env_rank": os.environ["RANK"],
           "visible": os.environ.get("CUDA_VISIBLE_DEVICES"), "first_checkpoint": train.get_checkpoint()}
    Path(config["out"], f"rank-{ctx.world_rank}.json").write_text(json.dumps(out, default=str))
    return ctx.world_rank * 10


def test_every_rank_knows_its_place_and_mesh(cluster, tmp_path) -> None:
    result = train.run(_record_context, config={"out": str(tmp_path)}, layout={"pp": 2, "tp": 2},
                       resources={"devices": "cpu", "cpus_per_rank": 1}, checkpoint_dir=tmp_path / "ck")
    assert result.return_value == 0 and result.restarts == 0 and result.checkpoint is None
    records = [json.loads((tmp_path / f"rank-{r}.json").read_text()) for r in range(4)]
    for rank, rec in enumerate(records):
        assert (rec["rank"], rec["world"], rec["env_rank"]) == (rank, 4, str(rank))
        assert rec["mesh_axes"] == ["dp", "pp", "tp"] and rec["mesh_shape"] == [1, 2, 2]
        assert rec["tp_group_size"] == 2 and rec["backend"] == "gloo" and rec["device"] == "cpu"
        assert rec["visible"] == "" and rec["first_checkpoint"] is None
    assert sorted(r["local"] for r in records if r["node"] == 0) == list(
        range(sum(r["node"] == 0 for r in records)))


def _visible(config):
    ctx = train.get_context()
    Path(config["out"], f"rank-{ctx.world_rank}").write_text(os.environ["CUDA_VISIBLE_DEVICES"])


def test_gpu_ranks_see_exactly_their_planned_device(cluster, tmp_path) -> None:
    expected = plan(live_snapshot(), PlacementRequest("e", layout=ParallelLayout(dp=2, tp=2)))
    train.run(_visible, config={"out": str(tmp_path)}, layout={"dp": 2, "tp": 2},
              resources={"devices": "gpu"}, checkpoint_dir=tmp_path / "ck")
    seen = [(tmp_path / f"rank-{r}").read_text() for r in range(4)]
    assert seen == [str(ref.device) for ref in expected.devices]
    assert seen[:2] != ["0", "1"]  # the planner's NV2 pair on a DGX-1, not Ray's first fit


def _checkpointing(config):
    ctx = train.get_context()
    latest = train.get_checkpoint()
    start = 0 if latest is None else latest.metrics["step"] + 1
    for step in range(start, config["steps"]):
        d = Path(config["scratch"], f"r{ctx.world_rank}-s{step}-a{ctx.attempt}")
        d.mkdir(parents=True)
        (d / f"shard-{ctx.world_rank}.txt").write_text(f"{step}")
        train.report({"step": step, "value": step * 1.5}, checkpoint=train.Checkpoint.from_directory(d))
        if step == config["fail_at"] and ctx.attempt == 0 and ctx.world_rank == 0:
            raise ValueError("on purpose")


def test_reports_commit_merged_checkpoints_and_a_failure_resumes(cluster, tmp_path) -> None:
    root = tmp_path / "ck"
    result = train.run(_checkpointing, config={"steps": 5, "fail_at": 2, "scratch": str(tmp_path / "s")},
                       layout=2, resources={"devices": "cpu", "cpus_per_rank": 1},
                       checkpoint_dir=root, keep_last=2, max_failures=1)
    assert result.restarts == 1 and "ValueError: on purpose" in result.failures[0]
    assert [m["step"] for m in result.metrics_history] == [0, 1, 2, 3, 4]  # resumed after step 2
    assert result.metrics == {"step": 4, "value": 6.0}
    kept = sorted(p.name for p in root.iterdir())
    assert kept == ["checkpoint_000004", "checkpoint_000005"]  # keep_last 2, no staging left
    final = result.checkpoint
    assert final is not None and final.metrics["step"] == 4
    assert sorted(p.name for p in Path(final.path).iterdir() if not p.name.startswith(".")) == [
        "shard-0.txt", "shard-1.txt"]  # both ranks' files in one checkpoint


def _always_fails(config):
    Path(config["marker"]).open("a").write("ran\n")
    raise RuntimeError("broken training code")


def test_after_max_failures_the_run_fails_with_the_cause(cluster, tmp_path) -> None:
    marker = tmp_path / "ran.txt"
    with pytest.raises(train.TrainingFailed, match="RuntimeError: broken training code"):
        train.run(_always_fails, config={"marker": str(marker)}, layout=1,
                  resources={"devices": "cpu"}, checkpoint_dir=tmp_path / "ck", max_failures=1)
    assert marker.read_text().count("ran") == 2  # the first try and one restart
    with pytest.raises(InputError, match="layout: unknown key 'ddp'"):
        train.run(_always_fails, layout={"ddp": 2})
    with pytest.raises(InputError, match="resources"):
        train.run(_always_fails, resources={"device": "tpu"}, checkpoint_dir=tmp_path / "ck")


def _losses(stdout: str) -> list[tuple[int, float]]:
    return [(int(e), float(v)) for e, v in re.findall(r"epoch (\d+) loss ([0-9.]+)", stdout)]


def test_the_ported_ray_train_function_resumes_after_a_worker_is_killed(tmp_path) -> None:
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}

    def run(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, str(EXAMPLE), "--epochs", "4", *args], cwd=tmp_path,
                              capture_output=True, text=True, timeout=300, env=env)

    reference = run("--checkpoint-dir", str(tmp_path / "ref"))
    assert reference.returncode == 0, reference.stderr
    killed = run("--checkpoint-dir", str(tmp_path / "killed"), "--die-at-epoch", "1")
    assert killed.returncode == 0, killed.stderr
    assert "restarts: 1" in killed.stdout and "restarts: 0" in reference.stdout
    ref, ours = dict(_losses(reference.stdout)), _losses(killed.stdout)
    assert sorted({e for e, _ in ours}) == [0, 1, 2, 3]
    for epoch, loss in ours:  # epochs redone after the resume give the same loss again
        assert loss == pytest.approx(ref[epoch], rel=1e-6)


# -- Ray Train's trainer API (hetflow.train.torch.TorchTrainer) --------------------------------

ACCURACY = [0.5, 0.9, 0.2, 0.7, 0.1]  # reported at steps 0..4; a checkpoint with each


def _scored(config):
    ctx = train.get_context()
    start = 0
    if (ckpt := train.get_checkpoint()) is not None:
        with ckpt.as_directory() as d:
            start = int(Path(d, "step").read_text()) + 1
    if ctx.world_rank == 0:
        Path(config["starts"]).open("a").write(f"{ctx.attempt} {start}\n")
    for step in range(start, len(ACCURACY)):
        d = Path(config["scratch"], f"{ctx.attempt}-{step}-{ctx.world_rank}")
        d.mkdir(parents=True)
        if ctx.world_rank == 0:
            (d / "step").write_text(str(step))
        train.report({"step": step, "acc": ACCURACY[step]}, checkpoint=train.Checkpoint.from_directory(d))
        if step == config["fail_at"] and ctx.attempt == 0:
            raise ValueError("on purpose")
    return start


def test_torch_trainer_keeps_the_best_checkpoints_resumes_and_fails_as_ray_trains_does(cluster, tmp_path) -> None:
    from hetflow.train import CheckpointConfig, FailureConfig, RunConfig, ScalingConfig
    from hetflow.train.torch import TorchTrainer

    starts = tmp_path / "starts.txt"
    config = {"fail_at": 2, "scratch": str(tmp_path / "s"), "starts": str(starts)}
    run_config = RunConfig(name="scored", storage_path=str(tmp_path / "store"),
                           failure_config=FailureConfig(max_failures=1),
                           checkpoint_config=CheckpointConfig(num_to_keep=2, checkpoint_score_attribute="acc",
                                                              checkpoint_score_order="max"))

    def trainer() -> TorchTrainer:
        return TorchTrainer(_scored, train_loop_config=config, run_config=run_config,
                            scaling_config=ScalingConfig(num_workers=2, resources_per_worker={"CPU": 1}))

    result = trainer().fit()
    assert result.error is None and result.restarts == 1
    assert result.path == str(tmp_path / "store" / "scored")
    assert [m["step"] for m in result.metrics_history] == [0, 1, 2, 3, 4]  # resumed after step 2
    assert result.metrics == {"step": 4, "acc": 0.1}
    assert list(result.metrics_dataframe["acc"]) == ACCURACY
    # the best two by acc (0.9 at step 1, 0.7 at step 3) and the newest (step 4)
    assert sorted(p.name for p in (tmp_path / "store" / "scored").iterdir()) == [
        "checkpoint_000002", "checkpoint_000004", "checkpoint_000005"]
    assert [m["acc"] for _, m in result.best_checkpoints] == [0.1, 0.7, 0.9]  # worst first, as Ray's
    assert result.checkpoint is not None and result.checkpoint.metrics["step"] == 4
    # fit() again with the same name and storage: it resumes from the newest checkpoint
    again = trainer().fit()
    assert again.return_value == 5 and again.restarts == 0
    assert starts.read_text().split("\n")[:-1] == ["0 0", "1 3", "0 5"]
    # more failures than max_failures: fit() raises, with the cause
    with pytest.raises(train.TrainingFailedError, match="ValueError: on purpose"):
        TorchTrainer(_scored, train_loop_config=dict(config, fail_at=0, scratch=str(tmp_path / "s2")),
                     run_config=RunConfig(name="fails", storage_path=str(tmp_path / "store")),
                     scaling_config=ScalingConfig(num_workers=1)).fit()
