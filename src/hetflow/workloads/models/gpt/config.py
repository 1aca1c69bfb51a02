"""The built-in gpt's ``model:`` section and the layout rules it sets (pure: pydantic, no torch:
a training config is read without importing torch)."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field

from hetflow.workloads.models.spec import ModelSection

BYTE_VOCAB = 256  # the text corpus is tokenised as bytes


class GPTConfig(ModelSection):
    """A small GPT-style decoder: token + position embeddings, pre-norm blocks, no dropout."""

    kind: Literal["gpt"] = "gpt"
    """Model family: ``mlp`` (digits classifier) or ``gpt`` (character-level transformer)."""
    layers: int = Field(2, gt=0)
    """Transformer blocks. Pipeline parallelism gives each stage a contiguous run of them
    (earlier stages take any remainder), so ``layout.pp`` may not exceed it."""
    heads: int = Field(4, gt=0)
    """Attention heads per block; ``layout.tp`` must divide it (heads are sharded)."""
    dim: int = Field(64, gt=0)
    """Width of the residual stream; must divide by ``heads``."""
    ffn_mult: int = Field(4, gt=0)
    """Hidden width of each block's MLP, as a multiple of ``dim``."""
    seq_len: int = Field(64, gt=1)
    """Tokens per training sample (the context length)."""


def tp_errors(config: Any, tp: int) -> list[str]:
    """What keeps ``tp`` from sharding this GPT, each saying how to fix the file."""
    errs = []
    if config.heads % tp:
        errs.append(f"layout.tp {tp} must divide model.heads {config.heads}")
    if (config.dim * config.ffn_mult) % tp:
        errs.append(f"layout.tp {tp} must divide the MLP width {config.dim * config.ffn_mult}")
    return errs


__all__ = ["BYTE_VOCAB", "GPTConfig", "tp_errors"]
