"""Saving every rank's state, and agreeing on the checkpoint to resume from, collectively.

`save_checkpoint` is called by every rank at the same step: a barrier (so that a server rank's
background thread is idle when its state is captured: every worker has finished the step),
each rank writes its own file, the sha256 sums are gathered, another barrier, then rank 0
writes the manifest and prunes old checkpoints. `agree_on_checkpoint` makes all ranks agree on
one checkpoint: the newest whose every rank file matches its manifest, warning about and
skipping damaged ones.
"""
from __future__ import annotations

import logging
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Callable, Optional

import torch.distributed as dist

from core.errors import UserError
from core.rundir import RunDir
from engine.checkpoint import files
from engine.checkpoint.files import Manifest

log = logging.getLogger("syncopt")


def save_checkpoint(run_dir: RunDir, step: int, epoch: int, rank: int, world_size: int, algo: str,
                    keys: dict[str, Any], state: Callable[[], dict[str, Any]], extra: dict[str, Any],
                    keep_last: int, keep_best: bool) -> Path:
    """`state()` is called after the opening barrier: by then every rank has finished the step
    (a server's serving thread is idle), and nobody moves on before the closing barrier."""
    dist.barrier()
    path = run_dir.step_dir(step)
    digest = files.write_rank_file(files.rank_file(path, rank), files.serialize(state()))
    digests: list[Any] = [None] * world_size
    dist.all_gather_object(digests, (rank, digest))
    if rank == 0:
        written = {files.rank_file(path, r).name: d for r, d in digests}
        files.write_manifest(path, step, epoch, world_size, algo, keys, written, extra)
        files.prune(run_dir, keep_last, keep_best)
    dist.barrier()
    return path


def agree_on_checkpoint(candidates: Sequence[Manifest], rank: int, run_dir: RunDir) -> Optional[Manifest]:
    """The newest candidate every rank finds intact (None: start fresh). A collective."""
    for manifest in candidates:
        ok = manifest.verify_rank(rank) if rank < manifest.world_size else False
        flags: list[Any] = [None] * dist.get_world_size()
        dist.all_gather_object(flags, ok)
        if all(flags):
            return manifest
        if rank == 0:
            bad = [r for r, f in enumerate(flags) if not f]
            log.warning("checkpoint %s is damaged (rank file(s) %s missing or not matching the "
                        "manifest's sha256); falling back to the previous one", manifest.path, bad)
    if candidates:
        raise UserError(f"no intact checkpoint under {run_dir.checkpoints} (every one is damaged); "
                        "resume=null starts fresh")
    return None
