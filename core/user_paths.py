"""Checks of the folders a user names for the run to write (a run directory, a table's store),
made before anything is written or launched.

A folder that cannot be made (under /proc, under a file, on a read-only or unwritable mount) used
to surface as the traceback of the first `mkdir`, deep inside Hydra or a table's store, after
the work before it was done (a 53-line FileNotFoundError for `table.store=/proc/1/nonexistent/store`).
`check_creatable` decides it from the path alone, without making anything: the folder is there
and writable, or its nearest existing ancestor is a writable folder; else one line naming the
value, why, and the fix.
"""
from __future__ import annotations

import os
from pathlib import Path

from core.errors import UserError


def creatable_problem(path: Path) -> str | None:
    """Why `path` cannot be (or be used as) a folder this process writes into; None if it can.
    Nothing is created: the nearest existing ancestor decides (where a parent would be made)."""
    path = Path(os.path.abspath(path))
    if path.exists():
        if not path.is_dir():
            return f"{path} is a file, not a folder"
        return None if os.access(path, os.W_OK | os.X_OK) else f"{path} is not writable by this user"
    ancestor = path.parent
    while not ancestor.exists():
        ancestor = ancestor.parent
    if not ancestor.is_dir():
        return f"{ancestor} is a file, so no folder can be made under it"
    if not os.access(ancestor, os.W_OK | os.X_OK):
        return f"no folder can be made in {ancestor} (not writable by this user)"
    if {Path("/proc"), Path("/sys")} & {ancestor, *ancestor.parents}:
        return f"{ancestor} is in a kernel file system, where no folder can be made"
    return None


def check_creatable(path: str | Path, key: str, fix: str) -> None:
    """One-line `UserError` naming `key`=`path` when the folder cannot be written (`creatable_problem`);
    `fix`: what to do instead (the sentence after the semicolon)."""
    problem = creatable_problem(Path(path))
    if problem:
        raise UserError(f"{key}={path}: {problem}; {fix}")
