"""Communication as a composition: compressors, error feedback and the collective that combines
them, usable by any plugin (issue 22); every compression of the project lives here.

- `contract`: the `Compressor` / `Payload` / `Combine` contract; `bits`: code packing; `sparse`,
  `blocks`: what the sparsifiers and the block-scaled quantisers share;
- one module per compressor, each registering itself with `@register_compressor`; adding a
  compressor is one file here plus its test (the registry imports every module of this folder);
- `chain`: compressors in sequence (`[topk:0.01, quant:2]`, a sparsifier then a value quantiser);
- `memory`: error feedback as its own choice (none, ef, ef21, decayed, momentum), per worker;
- `communicator`: memory + chain + the collective, over torch.distributed or simulated for K
  workers in one process (the tests' reference); `overlap`: its DDP-style buckets during backward;
- what plugins compose from these: `model_delta` (local SGD's compressed delta), `outer`
  (DiLoCo's compressed outer step);
- the methods that are plugins of their own, as pure functions: `sparse_feedback` (the
  parameter-server family's top-k with memory: gradient dropping, DGC, SAMomentum) and
  `powersgd_math` (PowerSGD's power iteration: P, Q, orthogonalisation), not to be confused
  with `lowrank_sketch`, the one-round random sketch stage `lowrank:R`.

A chain is written as a list of stages, each `name` or `name:arg:arg` (positional arguments of the
compressor, e.g. `topk:0.01`, `qsgd:4`, `int8:256`), the form `algo.compress=[topk:0.01,quant:2]`
takes on the command line.
"""
from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Callable, Union

from core.errors import UserError
from core.registry import Registry
from dist_algos.compress.chain import Chain
from dist_algos.compress.contract import Combine, Compressor, EncodeContext, Payload
from dist_algos.compress.memory import Memory

COMPRESSORS: Registry[type[Compressor]] = Registry("compressor", "compress stage", packages=["dist_algos.compress"])


def register_compressor(name: str) -> Callable[[type[Compressor]], type[Compressor]]:
    return COMPRESSORS.register_named(name)


def list_compressors() -> list[str]:
    return COMPRESSORS.names()


def build_stage(spec: str) -> Compressor:
    """One stage from `name:arg:arg`; a wrong name or argument is a one-line UserError."""
    name, *args = str(spec).split(":")
    cls = COMPRESSORS.get(name.strip())
    try:
        return cls(*[a.strip() for a in args])
    except (TypeError, ValueError) as exc:
        raise UserError(f"compress stage {spec!r}: {exc} (see docs/compression.md for each stage's arguments)") from None


def build_chain(spec: Union[str, Sequence[str], None]) -> Compressor | None:
    """The compressor a config names: None for no compression (`[]`, `none`, null)."""
    stages = [spec] if isinstance(spec, str) else list(spec or [])
    stages = [s for s in stages if str(s).strip() not in ("", "none")]
    if not stages:
        return None
    built = [build_stage(s) for s in stages]
    return built[0] if len(built) == 1 else Chain(built)


def check_chain(compress: Any, feedback: str, key: str = "algo.compress", fb_key: str = "algo.feedback") -> None:
    """Build the chain and the memory once before launch, so that a wrong stage or feedback is a
    one-line UserError naming the override."""
    try:
        build_chain(compress)
    except UserError as exc:
        raise UserError(f"{key}: {exc}") from None
    except ValueError as exc:
        shown = compress if isinstance(compress, str) else list(compress or [])
        raise UserError(f"{key}={shown}: {exc}") from None
    try:
        Memory(feedback)
    except ValueError as exc:
        raise UserError(f"{fb_key}: {exc}") from None


__all__ = ["check_chain", "COMPRESSORS", "Combine", "Compressor", "EncodeContext", "Payload", "build_chain",
           "build_stage", "list_compressors", "register_compressor"]
