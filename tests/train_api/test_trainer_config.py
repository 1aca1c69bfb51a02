"""Ray Train's trainer configuration in hetflow.train: what maps, and one clear line for what
does not (no Ray started)."""

from __future__ import annotations

import pytest

import hetflow.train as train
from hetflow.core.errors import InputError
from hetflow.train import CheckpointConfig, FailureConfig, RunConfig, ScalingConfig
from hetflow.train.torch import TorchConfig, TorchTrainer


def _f(config):
    return config


def test_train_torch_is_reachable_from_the_package() -> None:
    assert train.torch.TorchTrainer is TorchTrainer
    assert callable(train.torch.prepare_model) and callable(train.torch.prepare_data_loader)


def test_scaling_config_maps_to_hetflow_layout_and_resources() -> None:
    layout, res = ScalingConfig(num_workers=4, resources_per_worker={"CPU": 2})._resolved()
    assert (layout.dp, layout.pp, layout.tp) == (4, 1, 1)
    assert res == {"devices": {"kind": "cpu"}, "cpus_per_rank": 2.0}
    layout, res = ScalingConfig(use_gpu=True, accelerator_type="MI300X", layout={"dp": 2, "tp": 4},
                                memory="40GiB", vendor="amd")._resolved()
    assert layout.world_size == 8 and res == {"devices": {"kind": "gpu", "model": "MI300X",
                                                           "vendor": "amd", "memory": "40GiB"}}
    assert ScalingConfig(num_workers=3, use_gpu=True).total_resources == {"CPU": 3.0, "GPU": 3.0}
    assert ScalingConfig()._resolved()[0].world_size == 1


@pytest.mark.parametrize("scaling, message", [
    (ScalingConfig(num_workers=(2, 4)), "elastic ranges are not supported"),
    (ScalingConfig(num_workers=0), "whole number >= 1"),
    (ScalingConfig(use_gpu=True, resources_per_worker={"GPU": 2}), "exactly one device"),
    (ScalingConfig(resources_per_worker={"TPU": 1}), "'TPU' is not supported"),
    (ScalingConfig(num_workers=2, layout={"dp": 2, "tp": 2}), "num_workers=2 but layout"),
    (ScalingConfig(placement_strategy="ANYWHERE"), "not a Ray strategy"),
])
def test_scaling_config_refuses_what_it_cannot_do(scaling, message) -> None:
    with pytest.raises(InputError, match=message):
        TorchTrainer(_f, scaling_config=scaling)


@pytest.mark.parametrize("kwargs, message", [
    ({"datasets": {"train": object()}}, "Ray Data datasets are not supported"),
    ({"resume_from_checkpoint": train.Checkpoint("/x")}, "same RunConfig"),
    ({"run_config": RunConfig(storage_path="s3://bucket/runs")}, "not to object storage"),
    ({"run_config": RunConfig(name="a/b")}, "a name, not a path"),
    ({"run_config": RunConfig(callbacks=[object()])}, "callbacks"),
    ({"run_config": RunConfig(failure_config=FailureConfig(max_failures=-2))}, "-1 \\(no limit\\)"),
    ({"run_config": RunConfig(checkpoint_config=CheckpointConfig(num_to_keep=0))}, "num_to_keep=0"),
    ({"run_config": RunConfig(checkpoint_config=CheckpointConfig(checkpoint_score_order="up"))}, "'max' or 'min'"),
    ({"torch_config": TorchConfig(backend="mpi")}, "nccl .*gloo"),
    ({"scaling_config": {"num_workers": 2}}, "expected hetflow.train.ScalingConfig"),
])
def test_trainer_refuses_bad_input_with_one_line(kwargs, message) -> None:
    with pytest.raises(InputError, match=message):
        TorchTrainer(_f, **kwargs)


def test_ray_trains_own_config_objects_are_named_in_the_message() -> None:
    from ray.train import ScalingConfig as RayScalingConfig

    with pytest.raises(InputError, match="change the script's ray.train imports to hetflow.train"):
        TorchTrainer(_f, scaling_config=RayScalingConfig(num_workers=2))


def test_a_backend_that_does_not_fit_the_device_is_refused_at_fit() -> None:
    trainer = TorchTrainer(_f, torch_config=TorchConfig(backend="nccl"),
                           scaling_config=ScalingConfig(num_workers=2))
    with pytest.raises(InputError, match="nccl is for GPU workers"):
        trainer.fit()


def test_failure_and_checkpoint_rules() -> None:
    assert FailureConfig(max_failures=-1)._limit() >= 10**9 and FailureConfig()._limit() == 0
    name, directory = RunConfig(name="x", storage_path="/tmp/store")._directory()
    assert (name, str(directory)) == ("x", "/tmp/store/x")
    assert RunConfig()._directory()[0].startswith("ray_train_run-")


def test_best_checkpoints_rank_by_score_and_keep_the_newest(tmp_path) -> None:
    import json

    from hetflow.workloads.train.checkpoint import META_FILE, beyond_keep, committed_checkpoints, ranked_checkpoints

    for index, loss in enumerate([3.0, 1.0, None, 2.0, 5.0], start=1):
        d = tmp_path / f"checkpoint_{index:06d}"
        d.mkdir()
        metrics = {} if loss is None else {"loss": loss}
        (d / META_FILE).write_text(json.dumps({"index": index, "metrics": metrics}))
    found = committed_checkpoints(tmp_path)
    by_loss = [c.index for c in ranked_checkpoints(found, ("loss", "min"))]
    assert by_loss == [3, 5, 1, 4, 2]  # no loss ranks worst; then 5.0, 3.0, 2.0, 1.0
    assert [c.index for c in beyond_keep(found, 2, ("loss", "min"))] == [3, 1]  # 5 is the newest
    assert [c.index for c in beyond_keep(found, 2, None)] == [1, 2, 3]
    assert beyond_keep(found, 5, None) == []
