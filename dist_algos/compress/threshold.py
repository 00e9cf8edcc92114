"""Threshold sparsification (Strom 2015; Dryden et al. 2016): every entry with |x| >= tau is sent,
so how many depends on the data (the communicator all_gathers the counts first and pads). Biased;
meant for error feedback."""
from __future__ import annotations

import torch

from dist_algos.compress import register_compressor
from dist_algos.compress.contract import EncodeContext, Payload
from dist_algos.compress.sparse import IndexSparsifier, sparse_payload


@register_compressor("threshold")
class Threshold(IndexSparsifier):
    fixed_size = False
    def __init__(self, tau: str = "0.001") -> None:
        self.tau = float(tau)
        if self.tau <= 0:
            raise ValueError(f"threshold {self.tau} must be positive")

    def encode(self, x: torch.Tensor, ctx: EncodeContext) -> Payload:
        return sparse_payload(x, torch.nonzero(x.abs() >= self.tau).flatten())

    def spec(self) -> str:
        return f"threshold:{self.tau:g}"
