"""Which checkpoints a run may resume from, decided from the files alone (no collective).

`resume=auto` takes the run directory's own checkpoints, newest first; `resume=PATH` a given
checkpoint (a step directory, a run directory's newest, or a manifest) and the older ones beside
it. Every candidate must have been written with the settings a resume must keep (world size,
model, data set, algorithm family); the first one that differs is one line naming the setting.
Cli.py runs this before launching (a mistake costs no launch) and every rank runs it again to
learn the candidates, then the ranks agree on the newest intact one (`collective`).
"""
from __future__ import annotations

from pathlib import Path
from typing import Any, Callable, Optional

from core.errors import UserError
from core.rundir import MANIFEST, RunDir
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
        check_manifests(run_dir, "resume=auto")
        candidates = files.complete_checkpoints(run_dir)
    else:
        found = readable(lambda: files.resolve_checkpoint(str(resume)), f"resume={resume}")
        if found is None:
            raise UserError(f"resume={resume}: no complete checkpoint there (expected a "
                            "checkpoints/step_*/ directory with manifest.json, or a run directory)")
        named_step = Path(str(resume)).resolve() in (found.path.resolve(), found.path.resolve() / MANIFEST)
        # a step directory given: it and the older ones are the candidates; a run directory: all of them
        check_manifests(RunDir(found.path.parent.parent), f"resume={resume}", below=found.step if named_step else None)
        older = files.complete_checkpoints(RunDir(found.path.parent.parent))
        candidates = [found] + [m for m in older if m.step < found.step]
    for manifest in candidates:
        problem = files.compatibility_problem(manifest, keys)
        if problem:
            raise UserError(problem)
    return candidates


def check_manifests(run_dir: RunDir, key: str, below: Optional[int] = None) -> None:
    """Refuse, in one line naming the file and what is wrong, a run directory holding a manifest
    that is there but not sound (cut short, edited by hand) among the checkpoints a resume would
    try (up to step `below`): passing over it would resume from an older checkpoint than the
    user's newest without a word."""
    problems = files.unsound_manifests(run_dir, below)
    if problems:
        raise UserError(f"{key}: {problems[0]}; restore it, or delete its step directory to resume from the "
                        "checkpoint before it (resume=null starts afresh)")


def readable(find: Callable[[], Optional[Manifest]], key: str) -> Optional[Manifest]:
    """`find()`, with a manifest that is there but not sound refused in one line (`key`: the setting)."""
    try:
        return find()
    except files.ManifestError as err:
        raise UserError(f"{key}: {err}; give a sound checkpoint (a checkpoints/step_*/ directory or a run "
                        "directory)") from None


def init_source(init_from: Optional[str]) -> Optional[Manifest]:
    """The checkpoint whose model (rank 0's) starts a new run; `UserError` if there is none."""
    if not init_from:
        return None
    manifest = readable(lambda: files.resolve_checkpoint(init_from), f"init_from={init_from}")
    if manifest is None:
        raise UserError(f"init_from={init_from}: no complete checkpoint there")
    check_manifests(RunDir.of(init_from), f"init_from={init_from}")  # (given as a run directory: its newest)
    return manifest
