"""Which checkpoints a run may resume from, decided from the files alone (no collective).

`resume=auto` takes the run directory's own checkpoints, newest first; `resume=PATH` a given
checkpoint (a step directory, a run directory's newest, or a manifest) and the older ones beside
it. Every candidate must have been written with the settings a resume must keep (world size,
model, data set, algorithm family); the first one that differs is one line naming the setting.
Cli.py runs this before launching (a mistake costs no launch) and every rank runs it again to
learn the candidates, then the ranks agree on the newest intact one (`collective`).
"""
from __future__ import annotations

from typing import Any, Optional

from core.errors import UserError
from core.rundir import RunDir
from engine.checkpoint import files
from engine.checkpoint.files import Manifest

FRESH = (None, "null", "none", "false")


def wants_resume(resume: Optional[str]) -> bool:
    return resume is not None and str(resume).lower() not in FRESH


def resume_candidates(resume: Optional[str], run_dir: RunDir, keys: dict[str, Any]) -> list[Manifest]:
    """Checkpoints to try, newest first (empty: start fresh); `UserError` for a wrong target or
    a checkpoint written with other settings."""
    if not wants_resume(resume):
        return []
    if resume == "auto":
        candidates = files.complete_checkpoints(run_dir)
    else:
        found = files.resolve_checkpoint(str(resume))
        if found is None:
            raise UserError(f"resume={resume}: no complete checkpoint there (expected a "
                            "checkpoints/step_*/ directory with manifest.json, or a run directory)")
        older = files.complete_checkpoints(RunDir(found.path.parent.parent))
        candidates = [found] + [m for m in older if m.step < found.step]
    for manifest in candidates:
        problem = files.compatibility_problem(manifest, keys)
        if problem:
            raise UserError(problem)
    return candidates


def init_source(init_from: Optional[str]) -> Optional[Manifest]:
    """The checkpoint whose model (rank 0's) starts a new run; `UserError` if there is none."""
    if not init_from:
        return None
    manifest = files.resolve_checkpoint(init_from)
    if manifest is None:
        raise UserError(f"init_from={init_from}: no complete checkpoint there")
    return manifest
