"""The built-in mlp's ``model:`` section and the layout rules it sets (pure: pydantic, no torch:
a training config is read without importing torch)."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import Field

from hetflow.workloads.models.spec import ModelSection

DIGITS_FEATURES = 64  # 8 x 8 pixels
DIGITS_CLASSES = 10


class MLPConfig(ModelSection):
    """A multi-layer perceptron for scikit-learn's 8x8 digits (64 inputs, 10 classes)."""

    kind: Literal["mlp"] = "mlp"
    """Model family: ``mlp`` (digits classifier) or ``gpt`` (character-level transformer)."""
    hidden: tuple[Annotated[int, Field(gt=0)], ...] = (128, 128)
    """Widths of the hidden layers, input side first. Tensor parallelism shards them in
    (column, row) pairs, so each width must divide by ``layout.tp``."""


def tp_errors(config: Any, tp: int) -> list[str]:
    """What keeps ``tp`` from sharding this MLP, each saying how to fix the file."""
    if len(config.hidden) < 2:
        return [f"tensor parallelism shards the MLP's hidden layers in pairs; model.hidden "
                f"{list(config.hidden)} has fewer than 2"]
    bad = [w for w in config.hidden if w % tp]
    return [f"layout.tp {tp} must divide every hidden width; {bad} do not"] if bad else []


__all__ = ["DIGITS_CLASSES", "DIGITS_FEATURES", "MLPConfig", "tp_errors"]
