"""Per-rank checkpoints with a manifest written last.

Layout: `<run_dir>/checkpoints/step_<8 digits>/rank_<r>.pt`, one file per rank (workers of local
and asynchronous methods hold different models, momenta, residuals), and `manifest.json`,
written by rank 0 only after every rank's file is in place (a barrier). Files are written to a
temporary name, fsync'ed and renamed, so a directory without a manifest, or whose files do not
match the manifest's sha256, is never taken for a complete checkpoint. Loading uses
`torch.load(weights_only=True)`: state is tensors, numbers, strings, lists and dicts only.

The manifest functions use only the standard library, so cli.py can check a run directory
against the new configuration before launching anything.
"""
from __future__ import annotations

import hashlib
import io
import json
import os
import shutil
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional

from core.rundir import MANIFEST, RunDir, rank_file, step_of

FORMAT_VERSION = 1
Where = RunDir | str | Path  # a run directory, or its path


def step_dir(run_dir: Where, step: int) -> Path:
    return RunDir.of(run_dir).step_dir(step)


def _write_atomic(path: Path, data: bytes) -> None:
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    with open(tmp, "wb") as fh:
        fh.write(data)
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(tmp, path)


def _sha256_file(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


@dataclass
class Manifest:
    path: Path  # the step directory
    step: int
    epoch: int
    world_size: int
    algo: str
    fixed: dict[str, Any]  # the config parts a resume must not change
    fixed_hash: str
    files: dict[str, str]  # file name -> sha256
    extra: dict[str, Any]

    @classmethod
    def read(cls, step_path: Path) -> Optional["Manifest"]:
        """The step directory's manifest, or None where it is missing or not a sound one
        (`read_manifest` says what is wrong)."""
        try:
            return read_manifest(step_path)
        except ManifestError:
            return None

    def rank_file(self, rank: int) -> Path:
        return rank_file(self.path, rank)

    def verify_rank(self, rank: int) -> bool:
        """Whether this rank's file exists and matches the manifest's sha256."""
        path = self.rank_file(rank)
        expected = self.files.get(path.name)
        return expected is not None and path.is_file() and _sha256_file(path) == expected


class ManifestError(ValueError):
    """A manifest.json that is there but is not a sound manifest: one line naming it and what is wrong."""


#: a manifest's fields and their JSON types (`extra`, optional, is an object too)
MANIFEST_FIELDS: dict[str, type] = {"step": int, "epoch": int, "world_size": int, "algo": str, "fixed": dict,
                                    "fixed_hash": str, "files": dict}


_JSON_KIND = {int: "an integer", str: "a string", dict: "a JSON object"}


def read_manifest(step_path: Path) -> Manifest:
    """The step directory's manifest, checked field by field before anything trusts it: a file
    cut short, edited by hand or of another format raises `ManifestError` (the file, what is wrong).
    JSON only: nothing in it can run code."""
    path = step_path / MANIFEST
    try:
        raw = json.loads(path.read_text())
    except OSError as err:
        raise ManifestError(f"{path} cannot be read ({err.strerror or err})") from None
    except ValueError as err:
        raise ManifestError(f"{path} is not valid JSON ({err}): cut short or edited") from None
    problem = manifest_problem(raw, step_path)
    if problem:
        raise ManifestError(f"{path}: {problem}")
    return Manifest(step_path, raw["step"], raw["epoch"], raw["world_size"], raw["algo"], raw["fixed"],
                    raw["fixed_hash"], raw["files"], raw.get("extra", {}))


def manifest_problem(raw: Any, step_path: Path) -> Optional[str]:
    """What is wrong with a parsed manifest of `step_path` (None: nothing): a field missing or of
    another type, a step that is not its directory's, rank files not named to their sha256, or
    the settings a resume must keep changed since they were hashed (an edit by hand)."""
    if not isinstance(raw, dict):
        return f"holds a JSON {type(raw).__name__}, not a manifest's object"
    if raw.get("format", FORMAT_VERSION) != FORMAT_VERSION:
        return f"is of format {raw.get('format')!r}; this syncopt reads format {FORMAT_VERSION}"
    for key, kind in {**MANIFEST_FIELDS, **({"extra": dict} if "extra" in raw else {})}.items():
        value = raw.get(key)
        if key not in raw or not isinstance(value, kind) or isinstance(value, bool):
            return f"{key}={json.dumps(value)[:60]} is not {_JSON_KIND[kind]}"
    if step_of(step_path) not in (None, raw["step"]):
        return f"says step {raw['step']}, but lies in {step_path.name}"
    if raw["world_size"] < 1 or raw["epoch"] < 0:
        return f"world_size={raw['world_size']}, epoch={raw['epoch']}: not a run's"
    if not all(isinstance(name, str) and isinstance(digest, str) for name, digest in raw["files"].items()):
        return "files must map each rank's file name to its sha256"
    if fixed_hash(raw["fixed"]) != raw["fixed_hash"]:
        return "its settings (fixed) no longer match the hash written with them: edited by hand"
    return None


def fixed_hash(fixed: dict[str, Any]) -> str:
    return hashlib.sha256(json.dumps(fixed, sort_keys=True, default=str).encode()).hexdigest()[:16]


def complete_checkpoints(run_dir: Where) -> list[Manifest]:
    """Checkpoints with a readable manifest, newest first (rank files are not hashed here)."""
    root = RunDir.of(run_dir).checkpoints
    if not root.is_dir():
        return []
    found = [Manifest.read(p) for p in root.glob("step_*") if p.is_dir()]
    return sorted((m for m in found if m is not None), key=lambda m: m.step, reverse=True)


def unsound_manifests(run_dir: Where, below: Optional[int] = None) -> list[str]:
    """What is wrong with each manifest in the run directory that is there but not sound
    (`read_manifest`), newest step first (only steps up to `below`, if given): such a checkpoint
    is neither complete nor incomplete, and a resume must not pass over it in silence."""
    root = RunDir.of(run_dir).checkpoints
    steps = sorted(((step_of(p), p) for p in root.glob("step_*")), key=lambda sp: -1 if sp[0] is None else sp[0],
                   reverse=True) if root.is_dir() else []
    problems = []
    for step, path in steps:
        if (path / MANIFEST).is_file() and (below is None or step is None or step <= below):
            try:
                read_manifest(path)
            except ManifestError as err:
                problems.append(str(err))
    return problems


def resolve_checkpoint(path: str | Path) -> Optional[Manifest]:
    """A checkpoint given as a step directory, a run directory (newest) or a manifest file;
    `ManifestError` where the step directory's manifest is there but not sound."""
    p = Path(path)
    if p.name == MANIFEST:
        p = p.parent
    if (p / MANIFEST).is_file():
        return read_manifest(p)
    found = complete_checkpoints(RunDir(p))
    return found[0] if found else None


def compatibility_problem(manifest: Manifest, fixed: dict[str, Any]) -> Optional[str]:
    """One line naming the first setting that differs between a checkpoint and this run."""
    for key, value in fixed.items():
        old = manifest.fixed.get(key)
        if old != value:
            return (f"checkpoint {manifest.path} was written with {key}={json.dumps(old, default=str)}, "
                    f"this run has {key}={json.dumps(value, default=str)}; use the same {key}, "
                    "or resume=null to start fresh (init_from=PATH to start from its weights)")
    return None


def serialize(state: dict[str, Any]) -> bytes:
    import torch

    buf = io.BytesIO()
    torch.save(state, buf)
    return buf.getvalue()


def write_rank_file(path: Path, data: bytes) -> str:
    """Write one rank's file atomically; returns its sha256."""
    path.parent.mkdir(parents=True, exist_ok=True)
    _write_atomic(path, data)
    return hashlib.sha256(data).hexdigest()


def write_manifest(step_path: Path, step: int, epoch: int, world_size: int, algo: str,
                   fixed: dict[str, Any], files: dict[str, str], extra: dict[str, Any]) -> None:
    body = {"format": FORMAT_VERSION, "step": step, "epoch": epoch, "world_size": world_size,
            "algo": algo, "fixed": fixed, "fixed_hash": fixed_hash(fixed), "files": files,
            "extra": extra, "written_at": time.strftime("%Y-%m-%dT%H:%M:%S%z")}
    _write_atomic(step_path / MANIFEST, json.dumps(body, indent=1, default=str).encode())


def load_rank_file(path: Path) -> dict[str, Any]:
    import torch

    return torch.load(path, map_location="cpu", weights_only=True)


def mark_best(run_dir: Where, step: int, metric: str, value: float) -> None:
    _write_atomic(RunDir.of(run_dir).best, json.dumps({"step": step, "metric": metric, "value": value}).encode())


def best_step(run_dir: Where) -> Optional[int]:
    """The best checkpoint's step (None: none marked, or a mark that is not readable as one)."""
    try:
        return int(json.loads(RunDir.of(run_dir).best.read_text())["step"])
    except (OSError, ValueError, KeyError, TypeError):
        return None


def prune(run_dir: Where, keep_last: int, keep_best: bool) -> list[Path]:
    """Delete complete checkpoints beyond the newest `keep_last` (sparing the best), and
    incomplete directories older than the newest complete one. Returns what was removed."""
    run_dir = RunDir.of(run_dir)
    complete = complete_checkpoints(run_dir)
    keep = {m.path for m in complete[:keep_last]}
    best = best_step(run_dir) if keep_best else None
    if best is not None:
        keep.add(run_dir.step_dir(best))
    newest = complete[0].step if complete else -1
    removed = []
    for path in run_dir.checkpoints.glob("step_*"):
        is_complete = (path / MANIFEST).is_file()
        step = step_of(path)
        step = -1 if step is None else step
        if path in keep or (not is_complete and step >= newest):
            continue
        shutil.rmtree(path, ignore_errors=True)
        removed.append(path)
    return removed
