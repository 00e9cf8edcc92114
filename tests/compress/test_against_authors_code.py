"""Our DeMo and SparseLoCo compressors against the authors' code on identical inputs.

tests/fixtures/compress_golden.pt was written by scripts/golden_compress.py from checkouts of
bloc97/DeMo (commit 0e48145) and tplr-ai/templar (commit c2397ac): seeded inputs (a matrix, a
vector, a convolution kernel), DeMo's 2-D DCT tiles and transmitted estimate (chunk 64, top-32
per tile), and templar's estimate without the DCT (top-32 per tile, 2-bit statistical
quantisation over 6 sigma). Ours must give the same numbers: `dct_topk:64:32` and
`[chunk_topk:64:32, binquant:2:6]` on one layer of that shape.
"""
from __future__ import annotations

from pathlib import Path

import pytest
import torch

from dist_algos.compress import build_chain
from dist_algos.compress.contract import EncodeContext

GOLDEN = torch.load(Path(__file__).resolve().parents[1] / "fixtures" / "compress_golden.pt", weights_only=True)
NAMES = ["matrix", "vector", "conv"]


def run(spec: list[str], x: torch.Tensor) -> torch.Tensor:
    chain = build_chain(spec)
    ctx = EncodeContext([x.numel()], shapes=[tuple(x.shape)])
    return chain.decode(chain.encode(x.reshape(-1), ctx)).view_as(x)


@pytest.mark.parametrize("name", NAMES)
def test_dct_tiles_equal_demo(name: str) -> None:
    x = GOLDEN[f"input/{name}"]
    ours = build_chain(["dct_topk:64:32"])._tiles(x.reshape(-1), tuple(x.shape))  # (rows, cols, h*w)
    theirs = GOLDEN[f"demo/{name}/tiles"]
    theirs = theirs.reshape(ours.shape) if theirs.dim() == 2 else theirs.reshape(*ours.shape[:2], -1)
    assert torch.allclose(ours, theirs, atol=1e-5), (ours - theirs).abs().max()


@pytest.mark.parametrize("name", NAMES)
def test_dct_topk_equals_demo(name: str) -> None:
    x = GOLDEN[f"input/{name}"]
    theirs = GOLDEN[f"demo/{name}/estimate"]
    ours = run(["dct_topk:64:32"], x)
    assert torch.allclose(ours, theirs, atol=1e-5), (ours - theirs).abs().max()
    assert 0 < float((ours - x).norm()) < float(x.norm())  # it did compress


@pytest.mark.parametrize("name", NAMES)
def test_sparseloco_chain_equals_templar(name: str) -> None:
    x = GOLDEN[f"input/{name}"]
    theirs = GOLDEN[f"templar/{name}/estimate"]
    ours = run(["chunk_topk:64:32", "binquant:2:6"], x)
    assert torch.equal(ours != 0, theirs != 0)  # the same positions kept
    assert torch.allclose(ours, theirs, atol=1e-5), (ours - theirs).abs().max()
