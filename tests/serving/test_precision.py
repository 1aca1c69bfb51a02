"""Reduced precision against fp32 on the held-out digits: the accuracy each precision costs.

The checkpoint is a real one (conftest trains it in-process). bf16 and fp16 are meant for
GPUs; here they run on the CPU, which computes the same rounded weights and activations, so the
accuracy change is the one a GPU shows up to summation order. int8 is dynamic quantisation of
the linear layers, the CPU path. The figures are printed (pytest -s) for docs/serving.md.

``HETFLOW_TEST_DEVICE=gpu`` runs the fp32/bf16/fp16 runners on the GPU instead (the same tests,
on a host whose torch sees one: scripts/device_check.sh); int8 stays on the CPU.
"""

from __future__ import annotations

import os

import numpy as np
import pytest
import torch

from hetflow.workloads.serve.inference import ReplicaSpec, accuracy, build_runner
from hetflow.workloads.train.data import load_dataset

MAX_DROP_POINTS = {"bf16": 0.5, "fp16": 0.5, "int8": 0.5}  # the bound for digits
DEVICE = os.environ.get("HETFLOW_TEST_DEVICE", "cpu")  # cpu | gpu


@pytest.fixture(scope="module")
def held_out(digits_model):
    cfg = digits_model.config
    val = load_dataset("digits", val_fraction=cfg.data.val_fraction, seed=cfg.data.seed).val
    return val.inputs.numpy(), val.targets.numpy()


def runner(digits_model, precision: str):
    spec = ReplicaSpec("digits", digits_model.train_dict, str(digits_model.checkpoint_dir),
                       precision, DEVICE)
    built = build_runner(spec)
    expected = "cpu" if DEVICE == "cpu" or precision == "int8" else "cuda"
    assert built.device.type == expected, f"{precision} runner on {built.device}, wanted {expected}"
    return built


@pytest.fixture(scope="module")
def fp32_accuracy(digits_model, held_out) -> float:
    return accuracy(runner(digits_model, "fp32"), *held_out)


def test_fp32_checkpoint_is_a_trained_classifier(fp32_accuracy, held_out) -> None:
    assert len(held_out[0]) == 359  # 20% of the 1797 digits
    assert fp32_accuracy > 0.93


@pytest.mark.parametrize("precision", ["bf16", "fp16", "int8"])
def test_precision_accuracy_delta(digits_model, held_out, fp32_accuracy, precision) -> None:
    run = runner(digits_model, precision)
    acc = accuracy(run, *held_out)
    delta_points = (acc - fp32_accuracy) * 100
    print(f"\n{precision} on {run.device}: accuracy {acc:.4f} vs fp32 {fp32_accuracy:.4f} "
          f"({delta_points:+.2f} points)")
    assert delta_points >= -MAX_DROP_POINTS[precision]


def test_precisions_really_change_the_model(digits_model) -> None:
    from torch.ao.nn.quantized.dynamic import Linear as DynamicLinear

    fp32 = runner(digits_model, "fp32").model
    linears = sum(type(m) is torch.nn.Linear for m in fp32.modules())
    assert linears == 3  # two hidden layers and the output layer
    int8 = runner(digits_model, "int8").model
    assert sum(isinstance(m, DynamicLinear) for m in int8.modules()) == linears
    assert not any(type(m) is torch.nn.Linear for m in int8.modules())
    bf16 = runner(digits_model, "bf16").model
    assert {p.dtype for p in bf16.parameters()} == {torch.bfloat16}
    fp16 = runner(digits_model, "fp16").model
    assert {p.dtype for p in fp16.parameters()} == {torch.float16}


def test_batched_forward_matches_one_request_at_a_time(digits_model, held_out) -> None:
    run = runner(digits_model, "fp32")
    inputs = held_out[0][:7]
    requests = [inputs[:1], inputs[1:4], inputs[4:7]]
    together = run.split_predict(requests, [False, True, False])
    alone = [run.predict(r, probabilities=p) for r, p in zip(requests, [False, True, False])]
    assert [t["predictions"] for t in together] == [a["predictions"] for a in alone]
    assert "probabilities" not in together[0] and "probabilities" in together[1]
    np.testing.assert_allclose(together[1]["probabilities"], alone[1]["probabilities"], atol=1e-5)
    assert sum(len(t["predictions"]) for t in together) == 7
