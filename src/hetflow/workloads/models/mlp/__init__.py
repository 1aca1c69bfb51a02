"""The built-in ``mlp``: a digits classifier (``model: {kind: mlp, hidden: [128, 128]}``).

``config.py`` is its config section (no torch), ``model.py`` the single-device model,
``parallelize.py`` its tensor-parallel plan; ``SPEC`` ties them to the loss, the dataset (scikit-learn's bundled 8x8
digits), the metric (``val_accuracy``) and serving (64 floats in 0..1 -> one of 10 classes).
"""

from __future__ import annotations

from typing import Any

from hetflow.workloads.models.mlp.config import DIGITS_CLASSES, DIGITS_FEATURES, MLPConfig, tp_errors
from hetflow.workloads.models.spec import ModelSpec, ServingInfo


# torch is imported when the model is built, sharded or scored, not when a config is read
def _build(config: Any) -> Any:
    from hetflow.workloads.models.mlp.model import MLP

    return MLP(config)


def _apply_tp(model: Any, tp_mesh: Any) -> None:
    from hetflow.workloads.models.mlp.parallelize import apply_tp

    apply_tp(model, tp_mesh)


def _loss(output: Any, target: Any) -> Any:
    from hetflow.workloads.models.losses import cross_entropy

    return cross_entropy(output, target)


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
    build=_build,
    loss=_loss,
    dataset=_dataset,
    dataset_name="digits",
    parallelize=_apply_tp,
    pipeline_blocks=lambda config: len(config.hidden),
    check=_check,
    accuracy="val_accuracy",
    serving=ServingInfo(input=_input, output="logits"),
)



def __getattr__(attr: str) -> Any:  # the model class, imported (with torch) on first use
    if attr == "MLP":
        from hetflow.workloads.models.mlp.model import MLP

        return MLP
    raise AttributeError(f"module {__name__!r} has no attribute {attr!r}")


__all__ = ["MLP", "MLPConfig", "SPEC"]
