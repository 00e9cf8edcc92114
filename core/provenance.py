"""Which code a result came from: the git commit of the checkout and whether its tree was dirty.

A number in a table is only evidence if a reader can rebuild the code that made it. Every run
records the commit and the dirty flag of the checkout it started from (summary.json `commit`,
`dirty`), and a table refuses to start on a dirty tree unless told to (tables/provenance.py).

"Dirty" counts tracked changes and untracked files git does not ignore: an untracked recipe or
module changes what a run does as much as an edited one. Paths under `ignore` (a table's own output
folder, when it lies inside the checkout) do not count, nor do those named in OUTPUT_FOLDERS_ENV: a
table sets it for its runs, so that a run whose table writes its run folder or store inside the
checkout records the same dirty flag as the table's jobs.jsonl, not one raised by the table's own
output. Outside a git checkout, or without git, both are None: unknown, which the callers say
rather than guess.
"""
from __future__ import annotations

import os
import subprocess
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

REPO = Path(__file__).resolve().parents[1]
# folders (os.pathsep-separated) a table writes inside the checkout: not dirt (the module doc)
OUTPUT_FOLDERS_ENV = "SYNCOPT_OUTPUT_FOLDERS"


@dataclass(frozen=True)
class CodeVersion:
    commit: Optional[str]  # the full hash of HEAD (None: not a git checkout, or no git)
    dirty: Optional[bool]  # uncommitted changes (None: unknown)
    changed: tuple[str, ...] = ()  # the changed paths, as `git status --porcelain` names them

    @property
    def short(self) -> str:
        return self.commit[:7] if self.commit else "unknown"


def _git(repo: Path, *args: str) -> Optional[str]:
    try:
        proc = subprocess.run(["git", "-C", str(repo), *args], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return proc.stdout if proc.returncode == 0 else None


def _under(path: str, folders: Sequence[Path], repo: Path) -> bool:
    full = (repo / path).resolve()
    return any(full == f or f in full.parents for f in folders)


def code_version(repo: Path = REPO, ignore: Sequence[Path] = ()) -> CodeVersion:
    """The checkout's HEAD and whether its tree differs from it (see the module doc). Untracked
    files are listed one by one, so that those under an ignored folder can be told apart."""
    head = _git(repo, "rev-parse", "HEAD")
    if head is None:
        return CodeVersion(None, None)
    status = _git(repo, "status", "--porcelain", "--untracked-files=all")
    if status is None:
        return CodeVersion(head.strip(), None)
    named = [p for p in os.environ.get(OUTPUT_FOLDERS_ENV, "").split(os.pathsep) if p]
    folders = [Path(p).resolve() for p in [*ignore, *named]]
    changed = tuple(p for p in (line[3:].strip().strip('"') for line in status.splitlines() if line.strip())
                    if not _under(p.split(" -> ")[-1], folders, repo))
    return CodeVersion(head.strip(), bool(changed), changed)
