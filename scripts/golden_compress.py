"""Golden outputs of the authors' compressors on seeded inputs, for tests/compress/test_against_authors_code.py.

DeMo (bloc97/DeMo, demo.py: TransformDCT + CompressDCT) and SparseLoCo (tplr-ai/templar,
src/tplr/compress.py: ChunkingTransformer + TopKCompressor with 2-bit statistical quantisation)
are run from a local checkout given on the command line; nothing of theirs is copied here, and CI
(which has no network) only reads the small file this writes:

    .venv/bin/python scripts/golden_compress.py --demo PATH/TO/DeMo --templar PATH/TO/templar \
        [--out tests/fixtures/compress_golden.pt]

Their code needs `einops`; templar's module imports its package only for a logger, so a stand-in
`tplr` module is put in its place. For each input (a 128 x 96 matrix, a 96-entry vector, a
32 x 4 x 3 x 3 convolution kernel, drawn from fixed seeds): DeMo's DCT tiles and its transmitted
estimate decode(decompress(compress(encode(x), 32))) with chunk 64; templar's estimate of the same
without the DCT, top-32 per tile, 4 quantisation bins over 6 sigma. The file is loadable with
torch.load(weights_only=True) (tensors and strings only).
"""
from __future__ import annotations

import argparse
import importlib.util
import logging
import sys
import types
from pathlib import Path
from typing import Any

import torch
import torch.nn as nn

CHUNK, TOPK, BINS, SIGMAS = 64, 32, 4, 6
SHAPES = {"matrix": (128, 96), "vector": (96,), "conv": (32, 4, 3, 3)}


def load(path: Path, name: str) -> Any:
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def inputs() -> dict[str, torch.Tensor]:
    return {k: torch.randn(s, generator=torch.Generator().manual_seed(i)) for i, (k, s) in enumerate(SHAPES.items())}


def as_matrix(x: torch.Tensor) -> torch.Tensor:
    """Both references take 1-D or 2-D tensors; a convolution kernel is its (out, in x kh x kw) matrix."""
    return x.reshape(x.shape[0], -1) if x.dim() > 2 else x


def demo_outputs(demo_dir: Path, xs: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    demo = load(demo_dir / "demo.py", "reference_demo")
    out = {}
    for name, x in xs.items():
        m = as_matrix(x)
        param = nn.Parameter(m.clone())
        transform = demo.TransformDCT([{"params": [param]}], CHUNK)
        compress = demo.CompressDCT()
        tiles = transform.encode(m.clone())
        idx, val, xshape, totalk = compress.compress(tiles, TOPK)
        estimate = transform.decode(compress.decompress(param, idx, val, xshape, totalk))
        out[f"demo/{name}/tiles"] = tiles.contiguous()
        out[f"demo/{name}/estimate"] = estimate.reshape(x.shape).contiguous()
    return out


def templar_outputs(templar_dir: Path, xs: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    stand_in = types.ModuleType("tplr")
    stand_in.logger = logging.getLogger("tplr")  # type: ignore[attr-defined]
    sys.modules.setdefault("tplr", stand_in)
    compress = load(templar_dir / "src" / "tplr" / "compress.py", "reference_templar_compress")
    out = {}
    for name, x in xs.items():
        m = as_matrix(x)
        model = nn.Module()
        model.weight = nn.Parameter(m.clone())
        transformer = compress.ChunkingTransformer(model, target_chunk=CHUNK)
        compressor = compress.TopKCompressor(use_quantization=True, quantization_bins=BINS, quantization_range=SIGMAS)
        encoded = transformer.encode(m.clone(), use_dct=False)
        idx, val, xshape, totalk, qparams = compressor.compress(encoded, TOPK)
        dense = compressor.decompress(model.weight, idx, val, xshape, totalk, qparams)
        out[f"templar/{name}/estimate"] = transformer.decode(dense, use_dct=False).reshape(x.shape).contiguous()
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--demo", type=Path, required=True, help="a checkout of github.com/bloc97/DeMo")
    parser.add_argument("--templar", type=Path, required=True, help="a checkout of github.com/tplr-ai/templar")
    parser.add_argument("--out", type=Path, default=Path(__file__).resolve().parent.parent / "tests" / "fixtures"
                        / "compress_golden.pt")
    args = parser.parse_args()
    xs = inputs()
    golden: dict[str, Any] = {f"input/{k}": v for k, v in xs.items()}
    golden.update(demo_outputs(args.demo, xs))
    golden.update(templar_outputs(args.templar, xs))
    golden["settings"] = f"chunk={CHUNK} topk={TOPK} bins={BINS} sigmas={SIGMAS}"
    args.out.parent.mkdir(parents=True, exist_ok=True)
    torch.save(golden, args.out)
    print(f"wrote {args.out} ({len(golden)} entries)")


if __name__ == "__main__":
    main()
