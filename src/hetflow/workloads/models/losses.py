"""Losses the built-in models share."""

from __future__ import annotations

import torch
import torch.nn.functional as F


def cross_entropy(output: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    """Mean cross-entropy over every prediction (one per sample, or one per token)."""
    return F.cross_entropy(output.float().flatten(0, -2), target.flatten())


__all__ = ["cross_entropy"]
