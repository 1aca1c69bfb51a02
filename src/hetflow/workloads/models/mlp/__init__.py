"""The built-in ``mlp``: a digits classifier (``model: {kind: mlp, hidden: [128, 128]}``).

``model.py`` is the single-device model and its config section, ``parallelize.py`` its
tensor-parallel plan; ``SPEC`` ties them to the loss, the dataset (scikit-learn's bundled 8x8
digits), the metric (``val_accuracy``) and serving (64 floats in 0..1 -> one of 10 classes).
"""

from __future__ import annotations

from typing import Any

from hetflow.workloads.models.losses import cross_entropy
from hetflow.workloads.models.mlp.model import DIGITS_CLASSES, DIGITS_FEATURES, MLP, MLPConfig
from hetflow.workloads.models.mlp.parallelize import apply_tp, tp_errors
from hetflow.workloads.models.spec import ModelSpec, ServingInfo


def _dataset(config: MLPConfig, data: Any) -> Any:
    from hetflow.workloads.train.data import load_dataset

    return load_dataset("digits", val_fraction=data.val_fraction, seed=data.seed)


def _check(config: MLPConfig, layout: Any) -> list[str]:
    return tp_errors(config, layout.tp) if layout.tp > 1 else []


def _input(config: MLPConfig) -> Any:
    from hetflow.workloads.serve.protocol import InputSpec

    return InputSpec("float", DIGITS_FEATURES, low=0.0, high=1.0, outputs=DIGITS_CLASSES,
                     description="64 pixel values of an 8x8 digit, each in 0..1")


SPEC = ModelSpec(
    name="mlp",
    config=MLPConfig,
    build=MLP,
    loss=cross_entropy,
    dataset=_dataset,
    dataset_name="digits",
    parallelize=apply_tp,
    pipeline_blocks=lambda config: len(config.hidden),
    check=_check,
    accuracy="val_accuracy",
    serving=ServingInfo(input=_input, output="logits"),
)

__all__ = ["MLP", "MLPConfig", "SPEC"]
