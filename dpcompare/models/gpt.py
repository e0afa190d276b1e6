"""A decoder-only transformer language model in the style of nanoGPT (ideas, not its text).

Pre-LayerNorm blocks of causal self-attention (``F.scaled_dot_product_attention(is_causal=True)``) and a
4x-wide GELU MLP, learned position embeddings, and an output layer tied to the token embedding. Dropout is
left out: its random masks would differ between strategies and break parity.

The token and position tables are parameters of the root module itself (not ``nn.Embedding`` children), and
the tied output layer is ``F.linear(x, self.wte)``: every strategy then sees one tensor, and FSDP2, which
shards each parameter-owning module as a unit, gathers the shared table once for the root's forward.

Initialisation draws from a generator seeded by ``seed`` only, so every process builds the same weights
whatever else touched torch's global generator before.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn


@dataclass(frozen=True)
class GPTConfig:
    n_layer: int
    n_head: int
    n_embd: int
    block_size: int          # the longest sequence the position table holds
    vocab_size: int = 256    # bytes


#: named sizes: (layers, heads, width, context). Parameter counts with the byte vocabulary are in SIZE_NOTES.
SIZES: dict[str, tuple[int, int, int, int]] = {
    "gpt-tiny": (4, 4, 128, 256),
    "gpt-mini": (6, 8, 256, 256),
    "gpt-small": (6, 6, 384, 256),
    "gpt-base": (8, 8, 512, 512),
    "gpt2-small": (12, 12, 768, 1024),
}


def config_for(name: str, vocab_size: int = 256) -> GPTConfig:
    layers, heads, width, context = SIZES[name]
    return GPTConfig(layers, heads, width, context, vocab_size)


def parameter_count(c: GPTConfig) -> int:
    """Parameters of :class:`GPT` built from ``c``, without building it (the tied output layer counts once)."""
    d = c.n_embd
    block = 2 * 2 * d + (d * 3 * d + 3 * d) + (d * d + d) + (d * 4 * d + 4 * d) + (4 * d * d + d)
    return c.vocab_size * d + c.block_size * d + c.n_layer * block + 2 * d


class CausalSelfAttention(nn.Module):
    def __init__(self, c: GPTConfig) -> None:
        super().__init__()
        if c.n_embd % c.n_head:
            raise ValueError(f"width {c.n_embd} is not a multiple of {c.n_head} heads")
        self.n_head = c.n_head
        self.qkv = nn.Linear(c.n_embd, 3 * c.n_embd)
        self.proj = nn.Linear(c.n_embd, c.n_embd)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, d = x.shape
        q, k, v = self.qkv(x).split(d, dim=2)
        q, k, v = (z.view(b, t, self.n_head, d // self.n_head).transpose(1, 2) for z in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.proj(y.transpose(1, 2).reshape(b, t, d))


class Block(nn.Module):
    def __init__(self, c: GPTConfig) -> None:
        super().__init__()
        self.ln1 = nn.LayerNorm(c.n_embd)
        self.attn = CausalSelfAttention(c)
        self.ln2 = nn.LayerNorm(c.n_embd)
        self.mlp = nn.Sequential(nn.Linear(c.n_embd, 4 * c.n_embd), nn.GELU(), nn.Linear(4 * c.n_embd, c.n_embd))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.ln1(x))
        return x + self.mlp(self.ln2(x))


class GPT(nn.Module):
    """Token ids ``(batch, time)`` → next-token logits ``(batch, time, vocab)``."""

    def __init__(self, c: GPTConfig, seed: int = 0) -> None:
        super().__init__()
        self.config = c
        self.wte = nn.Parameter(torch.empty(c.vocab_size, c.n_embd))
        self.wpe = nn.Parameter(torch.empty(c.block_size, c.n_embd))
        self.blocks = nn.ModuleList(Block(c) for _ in range(c.n_layer))
        self.ln_f = nn.LayerNorm(c.n_embd)
        self.init_weights(seed)

    @torch.no_grad()
    def init_weights(self, seed: int) -> None:
        """GPT-2's scheme: N(0, 0.02), residual projections N(0, 0.02/sqrt(2·layers)), zero biases."""
        g = torch.Generator().manual_seed(seed)
        residual_std = 0.02 / math.sqrt(2 * self.config.n_layer)
        for name, p in self.named_parameters():
            if p.dim() < 2:  # biases and LayerNorm
                p.fill_(1.0 if name.endswith("weight") else 0.0)
            else:
                std = residual_std if name.endswith(("attn.proj.weight", "mlp.2.weight")) else 0.02
                p.copy_(torch.randn(p.shape, generator=g) * std)

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        t = idx.shape[1]
        if t > self.config.block_size:
            raise ValueError(f"sequence of {t} tokens is longer than the model's context of {self.config.block_size}")
        x = F.embedding(idx, self.wte) + self.wpe[:t]
        for block in self.blocks:
            x = block(x)
        return F.linear(self.ln_f(x), self.wte)  # the output layer is the token table (weight tying)
