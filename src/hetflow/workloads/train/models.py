"""The two built-in models, written for one device (parallelism is applied from outside).

Both follow one shape so that :mod:`~hetflow.workloads.train.parallelize` can split and shard
them without knowing more (the torchtitan convention):

* ``layers``: an ``nn.ModuleDict`` of blocks, keyed "0", "1", ... in order. A pipeline stage
  keeps a contiguous run of them; the keys (hence the checkpoint names) stay the same.
* ``FIRST_STAGE`` / ``LAST_STAGE``: names of the modules before and after the blocks. A stage
  that does not own one sets it to ``None``; ``forward`` then passes its input through, so a
  middle stage maps hidden states to hidden states.

No dropout and no random ops in ``forward``: for a fixed seed every layout computes the same
function, which the layout-equivalence tests rely on.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from hetflow.workloads.train.config import GPTConfig, MLPConfig, TrainConfig

DIGITS_FEATURES = 64  # 8 x 8 pixels
DIGITS_CLASSES = 10
BYTE_VOCAB = 256  # the text corpus is tokenised as bytes


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


def build_model(config: TrainConfig) -> nn.Module:
    """The configured model on CPU, initialised from ``train.seed``.

    Every rank calls this with the same seed and then keeps or shards its part, so all layouts
    start from the same weights.
    """
    torch.manual_seed(config.train.seed)
    if isinstance(config.model, MLPConfig):
        return MLP(config.model)
    return GPT(config.model)


def loss_fn(output: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    """Mean cross-entropy over every prediction (one per sample, or one per token)."""
    return F.cross_entropy(output.float().flatten(0, -2), target.flatten())


__all__ = ["GPT", "MLP", "Block", "Attention", "FeedForward", "HiddenLayer", "build_model",
           "loss_fn", "BYTE_VOCAB", "DIGITS_CLASSES", "DIGITS_FEATURES"]
