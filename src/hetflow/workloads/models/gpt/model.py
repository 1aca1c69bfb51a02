"""The small GPT, written for one device (its tensor-parallel plan is ``parallelize.py``).

Token + position embeddings, pre-norm blocks, no dropout (every layout computes the same
function). It follows the pipeline-split convention of
:mod:`~hetflow.workloads.train.parallelize`: ``layers`` is an ``nn.ModuleDict`` of blocks keyed
"0", "1", ...; ``FIRST_STAGE`` / ``LAST_STAGE`` name the modules before and after them (a stage
that does not own one sets it to ``None``; ``forward`` then maps hidden states to hidden states).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from hetflow.workloads.models.gpt.config import BYTE_VOCAB, GPTConfig

class Attention(nn.Module):
    """Causal multi-head self-attention.

    The head count is read from the projection's output width at run time (``view(..., -1,
    head_dim)``), so the same code runs when tensor parallelism leaves each rank a share of
    the heads.
    """

    def __init__(self, dim: int, heads: int) -> None:
        super().__init__()
        self.head_dim = dim // heads
        self.wq = nn.Linear(dim, dim, bias=False)
        self.wk = nn.Linear(dim, dim, bias=False)
        self.wv = nn.Linear(dim, dim, bias=False)
        self.wo = nn.Linear(dim, dim, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        batch, seq, _ = x.shape

        def heads(t: torch.Tensor) -> torch.Tensor:
            return t.view(batch, seq, -1, self.head_dim).transpose(1, 2)

        q, k, v = heads(self.wq(x)), heads(self.wk(x)), heads(self.wv(x))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.wo(y.transpose(1, 2).reshape(batch, seq, -1))


class FeedForward(nn.Module):
    """The block's MLP: dim -> hidden (GELU) -> dim."""

    def __init__(self, dim: int, hidden: int) -> None:
        super().__init__()
        self.w1 = nn.Linear(dim, hidden)
        self.w2 = nn.Linear(hidden, dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.w2(F.gelu(self.w1(x)))


class Block(nn.Module):
    """Pre-norm transformer block: x + attention(norm(x)), then x + mlp(norm(x))."""

    def __init__(self, config: GPTConfig) -> None:
        super().__init__()
        self.attention_norm = nn.LayerNorm(config.dim)
        self.attention = Attention(config.dim, config.heads)
        self.ffn_norm = nn.LayerNorm(config.dim)
        self.feed_forward = FeedForward(config.dim, config.dim * config.ffn_mult)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attention(self.attention_norm(x))
        return x + self.feed_forward(self.ffn_norm(x))


class GPT(nn.Module):
    """Small GPT-style decoder over byte tokens: tokens (batch, seq) -> logits (batch, seq, 256)."""

    FIRST_STAGE: tuple[str, ...] = ("tok_embeddings", "pos_embeddings")
    LAST_STAGE: tuple[str, ...] = ("norm", "output")

    def __init__(self, config: GPTConfig, vocab: int = BYTE_VOCAB) -> None:
        super().__init__()
        self.tok_embeddings: nn.Module | None = nn.Embedding(vocab, config.dim)
        self.pos_embeddings: nn.Module | None = nn.Embedding(config.seq_len, config.dim)
        self.layers = nn.ModuleDict({str(i): Block(config) for i in range(config.layers)})
        self.norm: nn.Module | None = nn.LayerNorm(config.dim)
        self.output: nn.Module | None = nn.Linear(config.dim, vocab, bias=False)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        h = tokens
        if self.tok_embeddings is not None:
            positions = torch.arange(tokens.shape[1], device=tokens.device)
            h = self.tok_embeddings(tokens) + self.pos_embeddings(positions)
        for layer in self.layers.values():
            h = layer(h)
        if self.norm is not None:
            h = self.norm(h)
        return self.output(h) if self.output is not None else h


__all__ = ["Attention", "BYTE_VOCAB", "Block", "FeedForward", "GPT", "GPTConfig"]
