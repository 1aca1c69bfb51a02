"""Building the configured model: its spec's ``build``, seeded the same on every rank.

The models themselves live in :mod:`hetflow.workloads.models` (one package per built-in, each
with its tensor-parallel plan beside it; a user's by import path). The names below are kept
for the code that imported them from here.
"""

from __future__ import annotations

import torch
from torch import nn

from hetflow.workloads.models.gpt.model import BYTE_VOCAB, GPT, Attention, Block, FeedForward
from hetflow.workloads.models.losses import cross_entropy as loss_fn
from hetflow.workloads.models.mlp.model import DIGITS_CLASSES, DIGITS_FEATURES, MLP, HiddenLayer
from hetflow.workloads.models.spec import ModelSpec, spec_of
from hetflow.workloads.train.config import TrainConfig


def model_spec(config: TrainConfig) -> ModelSpec:
    """The spec of the configured model (built-in or the user's)."""
    return spec_of(config.model)


def build_model(config: TrainConfig) -> nn.Module:
    """The configured model on CPU, initialised from ``train.seed``.

    Every rank calls this with the same seed and then keeps or shards its part, so all layouts
    start from the same weights.
    """
    torch.manual_seed(config.train.seed)
    return model_spec(config).build(config.model)


__all__ = ["GPT", "MLP", "Block", "Attention", "FeedForward", "HiddenLayer", "build_model",
           "loss_fn", "model_spec", "BYTE_VOCAB", "DIGITS_CLASSES", "DIGITS_FEATURES"]
