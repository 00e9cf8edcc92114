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
    flat = codes.reshape(-1).to(torch.uint8)
    if flat.numel() % per:
        flat = torch.cat([flat, flat.new_zeros(per - flat.numel() % per)])
    groups = flat.view(-1, per)
    out = groups[:, 0].clone()
    for j in range(1, per):  # one uint8 pass per code position in a byte (at most 7), no widening
        out |= groups[:, j] << (j * bits)
    return out


def unpack(packed: torch.Tensor, bits: int, n: int) -> torch.Tensor:
    """The first n codes (uint8) of `pack`'s output."""
    if bits == 8:
        return packed[:n]
    shifts = torch.arange(0, 8, bits, dtype=torch.uint8, device=packed.device)
    codes = (packed.unsqueeze(1) >> shifts) & ((1 << bits) - 1)
    return codes.reshape(-1)[:n]


def index_dtype(n: int) -> torch.dtype:
    """The narrowest signed integer type that holds indices below n (int32 for any layer below 2^31
    entries, as most sparse all_gather implementations send; int16 for small vectors)."""
    return torch.int16 if n <= 2**15 else torch.int32 if n <= 2**31 else torch.int64
