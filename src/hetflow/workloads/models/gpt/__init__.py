"""The built-in ``gpt``: a byte-level decoder (``model: {kind: gpt, layers: 2, ...}``).

``config.py`` is its config section (no torch), ``model.py`` the single-device model,
``parallelize.py`` its tensor-parallel plan; ``SPEC`` ties them to the loss (per-token cross-entropy), the dataset (the
``python-source`` corpus in windows of ``seq_len + 1`` bytes), the metric
(``val_token_accuracy``) and serving (``seq_len`` byte tokens -> the next byte).
"""

from __future__ import annotations

from typing import Any

from hetflow.workloads.models.gpt.config import BYTE_VOCAB, GPTConfig, tp_errors
from hetflow.workloads.models.spec import ModelSpec, ServingInfo


# torch is imported when the model is built, sharded or scored, not when a config is read
def _build(config: Any) -> Any:
    from hetflow.workloads.models.gpt.model import GPT

    return GPT(config)


def _apply_tp(model: Any, tp_mesh: Any) -> None:
    from hetflow.workloads.models.gpt.parallelize import apply_tp

    apply_tp(model, tp_mesh)


def _loss(output: Any, target: Any) -> Any:
    from hetflow.workloads.models.losses import cross_entropy

    return cross_entropy(output, target)


def _dataset(config: GPTConfig, data: Any) -> Any:
    from hetflow.workloads.train.data import load_dataset

    return load_dataset("python-source", val_fraction=data.val_fraction, seed=data.seed,
                        seq_len=config.seq_len)


def _check(config: GPTConfig, layout: Any) -> list[str]:
    errors = tp_errors(config, layout.tp) if layout.tp > 1 else []
    if config.dim % config.heads:
        errors.append(f"model.dim {config.dim} must divide by model.heads {config.heads}")
    return errors


def _input(config: GPTConfig) -> Any:
    from hetflow.workloads.serve.protocol import InputSpec

    seq = config.seq_len
    return InputSpec("int", seq, low=0, high=BYTE_VOCAB - 1, outputs=BYTE_VOCAB,
                     description=f"{seq} byte tokens (0..255); predicts the next byte")


SPEC = ModelSpec(
    name="gpt",
    config=GPTConfig,
    build=_build,
    loss=_loss,
    dataset=_dataset,
    dataset_name="python-source",
    parallelize=_apply_tp,
    pipeline_blocks=lambda config: config.layers,
    check=_check,
    accuracy="val_token_accuracy",
    serving=ServingInfo(input=_input, output="sequence_logits"),
)



def __getattr__(attr: str) -> Any:  # the model class, imported (with torch) on first use
    if attr == "GPT":
        from hetflow.workloads.models.gpt.model import GPT

        return GPT
    raise AttributeError(f"module {__name__!r} has no attribute {attr!r}")


__all__ = ["GPT", "GPTConfig", "SPEC"]
