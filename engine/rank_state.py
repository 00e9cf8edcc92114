"""Saving and restoring one rank's complete state, collectively with the other ranks.

`save_checkpoint` is called by every rank at the same step: a barrier (so that a server rank's
background thread is idle when its state is captured: every worker has finished the step),
each rank writes its own file, the sha256 sums are gathered, another barrier, then rank 0
writes the manifest and prunes old checkpoints. `find_resume_point` makes all ranks agree on
one checkpoint: the newest whose every rank file matches its manifest, warning about and
skipping corrupted ones.
"""
from __future__ import annotations

import logging
from pathlib import Path
from typing import Any, Callable, Optional

import torch.distributed as dist

from engine import checkpoint as ckpt
from engine.errors import UserError

log = logging.getLogger("syncopt")


def save_checkpoint(run_dir: Path, step: int, epoch: int, rank: int, world_size: int, algo: str,
                    fixed: dict[str, Any], state: Callable[[], dict[str, Any]], extra: dict[str, Any],
                    keep_last: int, keep_best: bool) -> Path:
    """`state()` is called after the opening barrier: by then every rank has finished the step
    (a server's serving thread is idle), and nobody moves on before the closing barrier."""
    dist.barrier()
    path = ckpt.step_dir(run_dir, step)
    digest = ckpt.write_rank_file(path / f"rank_{rank}.pt", ckpt.serialize(state()))
    digests: list[Any] = [None] * world_size
    dist.all_gather_object(digests, (rank, digest))
    if rank == 0:
        files = {f"rank_{r}.pt": d for r, d in digests}
        ckpt.write_manifest(path, step, epoch, world_size, algo, fixed, files, extra)
        ckpt.prune(run_dir, keep_last, keep_best)
    dist.barrier()
    return path


def find_resume_point(resume: Optional[str], run_dir: Path, rank: int,
                      fixed: dict[str, Any]) -> Optional[ckpt.Manifest]:
    """The checkpoint every rank will load (None: start fresh). A collective."""
    if resume is None or str(resume).lower() in ("null", "none", "false"):
        return None
    if resume == "auto":
        candidates = ckpt.complete_checkpoints(run_dir)
    else:
        found = ckpt.resolve_checkpoint(resume)
        if found is None:
            raise UserError(f"resume={resume}: no complete checkpoint there (expected a "
                            "checkpoints/step_*/ directory with manifest.json, or a run directory)")
        candidates = [found] + [m for m in ckpt.complete_checkpoints(found.path.parent.parent)
                                if m.step < found.step]
    for manifest in candidates:
        problem = ckpt.compatibility_problem(manifest, fixed)
        if problem:
            raise UserError(problem)
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
        raise UserError(f"no intact checkpoint under {run_dir}/checkpoints (every one is damaged); "
                        "resume=null starts fresh")
    return None
