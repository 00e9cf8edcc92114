"""Which code a table's numbers came from, and the rules that keep it one piece of code.

- A table refuses to start on a dirty tree (core/provenance.py: tracked changes or untracked
  files, the table's own folder aside) in one line naming `table.allow_dirty=true`, which runs it
  anyway and puts that in table.md. The check is made again before every job, so that a tree
  edited while a table runs stops it there (the runs so far are kept; the same command resumes).
- A finished run made at another commit is KEPT and FLAGGED, not re-run: re-running costs hours
  and most commits do not change what a run computes, but a reader must see the mix. The table
  prints one line when it starts, and table.md lists every commit its runs were made at, with the
  rows they belong to. To re-run such a run, delete its directory.
"""
from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import Any, Optional

from core.errors import UserError
from core.provenance import CodeVersion, code_version
from tables.config import TableConfig
from tables.store import store_path

Summary = dict[str, Any]


def table_folders(table: TableConfig, out: Path) -> list[Path]:
    """What the table writes, left out of the dirty-tree check: its run folder and its store."""
    return [out, *([store_path(table)] if table.store else [])]


def check_tree(table: TableConfig, out: Path) -> CodeVersion:
    """The checkout's version; a dirty tree is refused unless table.allow_dirty (one line)."""
    version = code_version(ignore=table_folders(table, out))
    if version.dirty and not table.allow_dirty:
        shown = ", ".join(version.changed[:3]) + (", ..." if len(version.changed) > 3 else "")
        raise UserError(f"table {table.name}: the working tree has uncommitted changes ({len(version.changed)} "
                        f"path{'s' * (len(version.changed) != 1)}: {shown}), so its runs could not be traced to a "
                        f"commit; commit or stash them, or pass table.allow_dirty=true to run anyway (table.md "
                        f"will say so)")
    return version


def commit_of(summary: Summary) -> str:
    """A run's commit, short (`unknown`: made before runs recorded it, or outside a checkout)."""
    commit = summary.get("commit")
    return str(commit)[:7] if commit else "unknown"


def other_commits(runs: dict[str, dict[int, Summary]], version: CodeVersion) -> Counter[str]:
    """How many of the finished runs were made at each commit other than the checkout's."""
    return Counter(c for by_seed in runs.values() for s in by_seed.values()
                   if (c := commit_of(s)) != version.short)


def mixed_notice(table: TableConfig, runs: dict[str, dict[int, Summary]], version: CodeVersion) -> Optional[str]:
    """The one line a table prints when it starts with finished runs from other commits."""
    others = other_commits(runs, version)
    if not others:
        return None
    listed = ", ".join(f"{c}: {n}" for c, n in others.most_common())
    return (f"table {table.name}: {sum(others.values())} finished runs were made at other commits than "
            f"{version.short} ({listed}); they are kept and flagged in table.md; delete a run's directory to run "
            f"it again")


def provenance_lines(table: TableConfig, version: CodeVersion, runs: dict[str, dict[int, Summary]],
                     tuning: dict[str, dict[int, Summary]]) -> list[str]:
    """table.md's provenance section: the commit it was gathered at, every commit its runs were
    made at (reported and tuning runs apart), the rows of each, and runs made on a dirty tree."""
    lines = ["## Provenance", "",
             f"Gathered at commit {version.short}" + (" on a DIRTY tree" if version.dirty else "")
             + (" (table.allow_dirty=true: runs may have been made from uncommitted code)" if table.allow_dirty
                else "") + "."]
    for what, found in (("Reported runs", runs), ("Tuning runs", tuning)):
        by_commit: dict[str, list[str]] = {}
        dirty: list[str] = []
        for label, by_seed in found.items():
            for seed, summary in sorted(by_seed.items()):
                by_commit.setdefault(commit_of(summary), []).append(label)
                if summary.get("dirty"):
                    dirty.append(f"{label} seed {seed}")
        if not by_commit:
            continue
        if len(by_commit) == 1:
            lines.append(f"{what}: all {sum(len(v) for v in by_commit.values())} at commit {next(iter(by_commit))}.")
        else:
            lines.append(f"{what} were made at {len(by_commit)} commits (a mix, flagged):")
            for commit, labels in sorted(by_commit.items(), key=lambda kv: -len(kv[1])):
                rows = sorted(set(labels))
                shown = ", ".join(rows[:8]) + (f" and {len(rows) - 8} more rows" if len(rows) > 8 else "")
                lines.append(f"- {commit}: {len(labels)} runs ({shown})")
        if dirty:
            lines.append(f"{what} made on a dirty tree: {', '.join(dirty[:10])}"
                         + (f" and {len(dirty) - 10} more" if len(dirty) > 10 else "") + ".")
    return lines + [""]
