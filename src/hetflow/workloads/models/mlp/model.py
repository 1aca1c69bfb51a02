"""The digits MLP, written for one device (its tensor-parallel plan is ``parallelize.py``).

It follows the pipeline-split convention of :mod:`~hetflow.workloads.train.parallelize`:
``layers`` is an ``nn.ModuleDict`` of blocks keyed "0", "1", ...; ``FIRST_STAGE`` /
``LAST_STAGE`` name the modules before and after them (a stage that does not own one sets it to
``None`` and ``forward`` passes its input through). No dropout, no random ops in ``forward``.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from hetflow.workloads.models.mlp.config import DIGITS_CLASSES, DIGITS_FEATURES, MLPConfig

class HiddenLayer(nn.Module):
    """One hidden layer of the MLP: linear then ReLU."""

    def __init__(self, in_features: int, out_features: int) -> None:
        super().__init__()
        self.linear = nn.Linear(in_features, out_features)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.relu(self.linear(x))


class MLP(nn.Module):
    """Digits classifier: 64 pixel values -> hidden layers -> 10 logits."""

    FIRST_STAGE: tuple[str, ...] = ()
    LAST_STAGE: tuple[str, ...] = ("output",)

    def __init__(self, config: MLPConfig, in_features: int = DIGITS_FEATURES,
                 classes: int = DIGITS_CLASSES) -> None:
        super().__init__()
        widths = [in_features, *config.hidden]
        self.layers = nn.ModuleDict(
            {str(i): HiddenLayer(widths[i], widths[i + 1]) for i in range(len(config.hidden))}
        )
        self.output: nn.Module | None = nn.Linear(widths[-1], classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for layer in self.layers.values():
            x = layer(x)
        return self.output(x) if self.output is not None else x


__all__ = ["DIGITS_CLASSES", "DIGITS_FEATURES", "HiddenLayer", "MLP", "MLPConfig"]
