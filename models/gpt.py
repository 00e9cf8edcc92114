"""A small decoder-only transformer for language modelling (GPT-2's layout, Radford et al. 2019, at
the sizes of nanoGPT's shakespeare_char configurations).

Tokens and learned positions are embedded and added; `layers` pre-norm blocks follow, each causal
multi-head self-attention (through `torch.nn.functional.scaled_dot_product_attention` with
`is_causal=True`, which picks a fused kernel where there is one) and a 4x-wide GELU MLP, each
added to the residual stream; a final LayerNorm and a linear head give logits N x T x vocab, the
logits at position t predicting token t + 1. The head shares the token embedding's matrix by
default (`tie_weights`, Press & Wolf 2017). Initialisation as GPT-2: normal(0, 0.02) weights,
zero biases, the two projections into the residual stream scaled by 1/sqrt(2 layers).

Parameters (d = width, V = vocabulary, P = positions, L = layers; `bias` adds the terms in
brackets): V d + P d + L (12 d^2 + 2 d [+ 11 d]) + d [+ d] (+ V d untied): `num_parameters`.
"""
from __future__ import annotations

import math
from typing import Optional

import torch
import torch.nn as nn
import torch.nn.functional as F

from core.schema import AtLeastOne, Probability
from models import register_model


def num_parameters(vocab: int, positions: int, width: int, layers: int, bias: bool, tie_weights: bool) -> int:
    """The parameter count of `GPT` (the module docstring's formula)."""
    per_layer = 12 * width * width + (13 * width if bias else 2 * width)  # attention, MLP, two LayerNorms
    final_norm = 2 * width if bias else width
    head = 0 if tie_weights else vocab * width
    return vocab * width + positions * width + layers * per_layer + final_norm + head


class CausalSelfAttention(nn.Module):
    def __init__(self, width: int, heads: int, dropout: float, bias: bool) -> None:
        super().__init__()
        self.heads, self.dropout = heads, dropout
        self.qkv = nn.Linear(width, 3 * width, bias=bias)
        self.proj = nn.Linear(width, width, bias=bias)
        self.resid_dropout = nn.Dropout(dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        n, t, width = x.shape
        q, k, v = (z.view(n, t, self.heads, width // self.heads).transpose(1, 2) for z in self.qkv(x).split(width, 2))
        y = F.scaled_dot_product_attention(q, k, v, dropout_p=self.dropout if self.training else 0.0, is_causal=True)
        return self.resid_dropout(self.proj(y.transpose(1, 2).reshape(n, t, width)))


class Block(nn.Module):
    def __init__(self, width: int, heads: int, dropout: float, bias: bool) -> None:
        super().__init__()
        self.ln1 = nn.LayerNorm(width, bias=bias)
        self.attn = CausalSelfAttention(width, heads, dropout, bias)
        self.ln2 = nn.LayerNorm(width, bias=bias)
        self.fc = nn.Linear(width, 4 * width, bias=bias)
        self.proj = nn.Linear(4 * width, width, bias=bias)
        self.dropout = nn.Dropout(dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.ln1(x))
        return x + self.dropout(self.proj(F.gelu(self.fc(self.ln2(x)))))


class GPT(nn.Module):
    def __init__(self, vocab_size: int, positions: int, layers: int, heads: int, width: int, dropout: float,
                 bias: bool, tie_weights: bool) -> None:
        super().__init__()
        if width % heads:
            raise ValueError(f"width {width} is not a multiple of heads {heads}")
        self.positions = positions
        self.token_embedding = nn.Embedding(vocab_size, width)
        self.position_embedding = nn.Embedding(positions, width)
        self.dropout = nn.Dropout(dropout)
        self.blocks = nn.ModuleList(Block(width, heads, dropout, bias) for _ in range(layers))
        self.ln_f = nn.LayerNorm(width, bias=bias)
        self.head = nn.Linear(width, vocab_size, bias=False)
        if tie_weights:
            self.head.weight = self.token_embedding.weight
        self._init(layers)

    def _init(self, layers: int) -> None:
        for module in self.modules():
            if isinstance(module, (nn.Linear, nn.Embedding)):
                nn.init.normal_(module.weight, mean=0.0, std=0.02)
            if isinstance(module, nn.Linear) and module.bias is not None:
                nn.init.zeros_(module.bias)
        for block in self.blocks:  # the projections that add to the residual stream
            for proj in (block.attn.proj, block.proj):
                nn.init.normal_(proj.weight, mean=0.0, std=0.02 / math.sqrt(2 * layers))

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        t = tokens.shape[1]
        if t > self.positions:
            raise ValueError(f"a window of {t} tokens is longer than the model's {self.positions} positions")
        positions = torch.arange(t, device=tokens.device)
        x = self.dropout(self.token_embedding(tokens) + self.position_embedding(positions))
        for block in self.blocks:
            x = block(x)
        return self.head(self.ln_f(x))


@register_model("gpt")
def gpt(vocab_size: int, context_length: int, layers: AtLeastOne = 4, heads: AtLeastOne = 4,
        width: AtLeastOne = 128, dropout: Probability = 0.0, block_size: Optional[int] = None,
        bias: bool = False, tie_weights: bool = True) -> nn.Module:
    """`block_size`: positions the model has (None: the data's context length; at least that);
    the defaults are nanoGPT's small shakespeare_char configuration for a CPU (4 layers, 4 heads,
    width 128, no biases), with the head tied to the embedding."""
    positions = context_length if block_size is None else block_size
    if positions < context_length:
        raise ValueError(f"model.block_size={positions} is shorter than the data's context of {context_length}")
    return GPT(vocab_size, positions, layers, heads, width, dropout, bias, tie_weights)
