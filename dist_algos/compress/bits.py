"""Packing of small integer codes (1, 2, 4 bits) into bytes, so that a sign or a 2-bit level costs
its bits on the wire and not a whole byte. Codes are packed little-end first within a byte."""
from __future__ import annotations

import torch


def pack(codes: torch.Tensor, bits: int) -> torch.Tensor:
    """uint8 codes in [0, 2^bits) -> ceil(n bits / 8) bytes."""
    if bits == 8:
        return codes.to(torch.uint8)
    if bits not in (1, 2, 4):
        raise ValueError(f"pack: {bits} bits per code is not one of 1, 2, 4, 8")
    per = 8 // bits
    n = codes.numel()
    padded = torch.zeros(-(-n // per) * per, dtype=torch.uint8)
    padded[:n] = codes.reshape(-1).to(torch.uint8)
    groups = padded.view(-1, per).to(torch.int32)
    shifts = torch.arange(per, dtype=torch.int32) * bits
    return (groups << shifts).sum(dim=1).to(torch.uint8)


def unpack(packed: torch.Tensor, bits: int, n: int) -> torch.Tensor:
    """The first n codes (uint8) of `pack`'s output."""
    if bits == 8:
        return packed[:n]
    per = 8 // bits
    shifts = torch.arange(per, dtype=torch.int32) * bits
    codes = (packed.to(torch.int32).unsqueeze(1) >> shifts) & ((1 << bits) - 1)
    return codes.reshape(-1)[:n].to(torch.uint8)


def index_dtype(n: int) -> torch.dtype:
    """The narrowest signed integer type that holds indices below n (int32 for any layer below 2^31
    entries, as most sparse all_gather implementations send; int16 for small vectors)."""
    return torch.int16 if n <= 2**15 else torch.int32 if n <= 2**31 else torch.int64
