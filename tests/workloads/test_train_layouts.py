"""Layout equivalence: for a fixed seed, every parallel layout computes the same losses as one
process, within a stated tolerance, and writes a checkpoint that loads into one device.

Runs on CPU with gloo in up to 4 processes (see conftest.py). Tolerances, absolute, on a loss
of about 2.3 (digits) or 5.5 (text) over the first 4 steps:

* fp32: 1e-4. Only the order of floating-point sums differs (all-reduce, sharded matmuls,
  microbatch accumulation); observed differences are about 1e-6.
* bf16 / fp16: 5e-3 against the single-process run in the same precision. Sharded
  reductions round differently in 8 (bf16) or 11 (fp16) mantissa bits; observed up to 1e-3.
"""

from __future__ import annotations

import pytest

from hetflow.workloads.train.checkpoint import latest_checkpoint
from hetflow.workloads.train.job import evaluate_checkpoint
from tests.workloads.conftest import LAYOUTS, STEPS, Worlds

EVAL_SAMPLES = 128  # validation samples per evaluation: enough to tell weights apart
TOLERANCE = {"fp32": 1e-4, "bf16": 5e-3, "fp16": 5e-3}


def _reference(name: str) -> str:
    model, _, precision = LAYOUTS[name]
    family = "gpt" if model["kind"] == "gpt" else "mlp"
    return f"{family}-single" + ("" if precision == "fp32" else f"-{precision}")


PARALLEL = [n for n in LAYOUTS if "single" not in n]


@pytest.mark.parametrize("name", PARALLEL)
def test_layout_losses_match_single_process(worlds: Worlds, name: str) -> None:
    got, ref = worlds.outcomes[name], worlds.outcomes[_reference(name)]
    assert got.error is None, got.error
    assert ref.error is None, ref.error
    assert sorted(got.losses) == list(range(1, STEPS + 1))
    tolerance = TOLERANCE[LAYOUTS[name][2]]
    for step in range(1, STEPS + 1):
        assert got.losses[step] == pytest.approx(ref.losses[step], abs=tolerance), (
            f"{name} step {step}: {got.losses[step]} vs single-process {ref.losses[step]}")


def test_training_moves_the_loss(worlds: Worlds) -> None:
    # Equal losses prove nothing if no step changed the weights.
    for ref in ("gpt-single", "mlp-single"):
        losses = worlds.outcomes[ref].losses
        assert abs(losses[STEPS] - losses[1]) > 0.01


@pytest.mark.parametrize("name", ["gpt-dp2-fsdp", "gpt-tp2", "gpt-pp2-1f1b", "gpt-dp2-tp2-fsdp",
                                  "gpt-dp2-pp2-ddp", "gpt-pp2-tp2", "mlp-dp4-fsdp"])
def test_sharded_checkpoint_loads_into_one_device(worlds: Worlds, name: str) -> None:
    """Each layout's final checkpoint, read into the plain single-device model, evaluates like
    the single-process run's: every shard was written under its single-device name."""
    config = worlds.configs[name]
    ref_config = worlds.configs[_reference(name)]
    info = latest_checkpoint(config.checkpoint_dir)
    assert info is not None and info.step == STEPS
    assert info.meta["layout"] == {"dp": config.layout.dp, "pp": config.layout.pp,
                                   "tp": config.layout.tp}
    got = evaluate_checkpoint(config, info, max_samples=EVAL_SAMPLES)["val_loss"]
    ref_info = latest_checkpoint(ref_config.checkpoint_dir)
    want = evaluate_checkpoint(ref_config, ref_info, max_samples=EVAL_SAMPLES)["val_loss"]
    assert got == pytest.approx(want, abs=1e-4)
