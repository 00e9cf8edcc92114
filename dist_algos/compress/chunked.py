"""Top-k inside chunks of each tensor, optionally in the DCT domain: DeMo (Peng, Kingma et al.
2024, `dct_topk:CHUNK:K`) and SparseLoCo's sparsifier (Sarfi et al. 2025, `chunk_topk:CHUNK:K`).

Each layer is cut into chunks the way both reference implementations cut it: a matrix of n rows
and m columns (a convolution's kernel counts as m = in_channels x kh x kw columns) into
h x w tiles, h the largest divisor of n not above CHUNK (n itself when n <= CHUNK), w likewise
for m; a vector into runs of w. DeMo applies an orthonormal 2-D DCT-II to every tile (1-D to a
run), so that a smooth momentum concentrates in few coefficients; SparseLoCo takes the tile as it
is. Then each tile keeps its K entries of largest magnitude. On the wire per tile: K indices
inside the tile (int16: a tile has at most CHUNK^2 <= 32767 entries) and K float32 values (a
chain's next stage can quantise them). Payloads are gathered; since the transform is linear, the
mean of the decoded payloads is the inverse transform of the mean of the sparse tiles.
"""
from __future__ import annotations

import math
from functools import lru_cache
from typing import Optional

import torch

from dist_algos.compress import register_compressor
from dist_algos.compress.contract import Combine, Compressor, EncodeContext, Payload


def smaller_split(n: int, target: int) -> int:
    """The largest divisor of n that is at most `target` (n when n <= target)."""
    if n <= target:
        return n
    return max(d for d in range(1, target + 1) if n % d == 0)


@lru_cache(maxsize=64)
def dct_matrix(n: int) -> torch.Tensor:
    """Orthonormal DCT-II: row b is the b-th cosine basis vector, so y = D x, x = D^T y."""
    k = torch.arange(n, dtype=torch.float64)
    d = torch.cos(math.pi * (2 * k[None, :] + 1) * k[:, None] / (2 * n)) * math.sqrt(2 / n)
    d[0] /= math.sqrt(2)
    return d.float()


def matrix_view(shape: tuple[int, ...]) -> tuple[int, int]:
    if len(shape) <= 1:
        return 1, int(shape[0]) if shape else 1
    return int(shape[0]), int(math.prod(shape[1:]))


class ChunkTopK(Compressor):
    combine = Combine.GATHER
    sparsifier = True
    transform = False
    min_k = 1

    def __init__(self, chunk: str = "64", k: str = "4") -> None:
        self.chunk, self.k = int(chunk), int(k)
        if self.chunk < 1 or self.k < 1:
            raise ValueError(f"chunk {self.chunk} and k {self.k} must be at least 1")

    # tiles: (rows of tiles, cols of tiles, h, w) for matrices; vectors are one row of runs
    def _tiles(self, layer: torch.Tensor, shape: tuple[int, ...]) -> torch.Tensor:
        n, m = matrix_view(shape)
        h, w = (smaller_split(n, self.chunk) if len(shape) > 1 else 1), smaller_split(m, self.chunk)
        tiles = layer.reshape(n // h, h, m // w, w).permute(0, 2, 1, 3)
        if self.transform:
            dh, dw = dct_matrix(h) if h > 1 else torch.ones(1, 1), dct_matrix(w)
            tiles = dh @ tiles @ dw.T
        return tiles.reshape(n // h, m // w, h * w)

    def _untile(self, tiles: torch.Tensor, shape: tuple[int, ...]) -> torch.Tensor:
        n, m = matrix_view(shape)
        h, w = (smaller_split(n, self.chunk) if len(shape) > 1 else 1), smaller_split(m, self.chunk)
        t = tiles.reshape(n // h, m // w, h, w)
        if self.transform:
            dh, dw = dct_matrix(h) if h > 1 else torch.ones(1, 1), dct_matrix(w)
            t = dh.T @ t @ dw
        return t.permute(0, 2, 1, 3).reshape(-1)

    def _k(self, tile: int) -> int:
        k = max(self.min_k, min(self.k, tile))
        return min(k, tile)

    def encode(self, x: torch.Tensor, ctx: EncodeContext) -> Payload:
        indices, values = [], []
        for layer, shape in zip(x.float().split(list(ctx.sizes)), ctx.layer_shapes()):
            tiles = self._tiles(layer, shape)
            idx = torch.topk(tiles.abs(), self._k(tiles.shape[-1]), dim=-1, sorted=False).indices
            indices.append(idx.reshape(-1).to(torch.int16))
            values.append(torch.gather(tiles, -1, idx).reshape(-1))
        return Payload({"indices": torch.cat(indices), "values": torch.cat(values)}, x.numel(),
                       info={"sizes": list(ctx.sizes), "shapes": ctx.layer_shapes()})

    def decode(self, payload: Payload) -> torch.Tensor:
        out, at = [], 0
        idx_all, val_all = payload.tensors["indices"].long(), payload.tensors["values"].float()
        for n, shape in zip(payload.info["sizes"], payload.info["shapes"]):  # type: ignore[call-overload]
            rows, cols = matrix_view(shape)
            h = smaller_split(rows, self.chunk) if len(shape) > 1 else 1
            w = smaller_split(cols, self.chunk)
            tiles = torch.zeros(rows // h, cols // w, h * w)
            k = self._k(h * w)
            count = tiles.shape[0] * tiles.shape[1] * k
            tiles.scatter_add_(-1, idx_all[at:at + count].view(tiles.shape[0], tiles.shape[1], k),
                               val_all[at:at + count].view(tiles.shape[0], tiles.shape[1], k))
            out.append(self._untile(tiles, shape))
            at += count
        return torch.cat(out) if out else torch.zeros(0)

    def kept_sizes(self, payload: Payload) -> Optional[list[int]]:
        out = []
        for shape in payload.info["shapes"]:  # type: ignore[union-attr]
            rows, cols = matrix_view(shape)
            h = smaller_split(rows, self.chunk) if len(shape) > 1 else 1
            w = smaller_split(cols, self.chunk)
            out.append((rows // h) * (cols // w) * self._k(h * w))
        return out

    def spec(self) -> str:
        return f"{self.name}:{self.chunk}:{self.k}"


@register_compressor("dct_topk")
class DctTopK(ChunkTopK):
    """DeMo's compressor: top-k of each tile's DCT coefficients."""

    transform = True


@register_compressor("chunk_topk")
class SparseLoCoTopK(ChunkTopK):
    """SparseLoCo's sparsifier: top-k of each tile as it is (an even k of at least 2, as its code
    packs indices in pairs)."""

    min_k = 2

    def _k(self, tile: int) -> int:
        k = min(max(2, self.k), tile)
        return k - k % 2 if k > 1 else k
