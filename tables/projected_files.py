"""The gather's projected-time files (tables/projected.py), one set per named cluster.

    python cli.py table=NAME table.gather_only=true table.store=... cluster=eth1
    python cli.py table=NAME table.gather_only=true table.store=... 'table.project.clusters=[ib400_8gpu,eth1]'

writes, beside table.md, for each cluster: projected_<cluster>.md (the cells, the targets, the
crossings with the baseline across bandwidth), projected_<cluster>.csv (per row, target and seed)
and projected_bandwidth_<cluster>.png; table.md gains a short section naming them. It reads the
runs' records (and ledgers where the run folder has them), never trains: re-projecting onto another
cluster is a gather. With no cluster named it does nothing, and the table is what it always was.
"""
from __future__ import annotations

import time
from pathlib import Path
from typing import Any, Optional

from projection.cluster import Cluster, load_cluster, load_preset
from projection.command import check_cluster
from tables.config import TableConfig, headline
from tables.projected import Projected, project_table, read_rows, sweep
from tables.projected_plot import draw_bandwidth
from tables.projected_render import FILE_STEM, render, write_csv
from tables.projected_runs import Projector
from tables.run_records import RunsAt, records_of


def clusters_of(table: TableConfig, cluster_node: Optional[Any]) -> list[Cluster]:
    """The command's `cluster=NAME` (with its overrides) and table.project.clusters, each checked
    (a calibrated preset whose fit misses its targets is refused), each once by name."""
    found: list[Cluster] = []
    if cluster_node is not None:
        found.append(load_cluster(cluster_node))
    for name in table.project.clusters:
        if name not in {c.name for c in found}:
            found.append(load_preset(name))
    for cluster in found:
        check_cluster(cluster)
    return found


def project_clusters(table: TableConfig, out: Path, runs_at: RunsAt, clusters: list[Cluster]) -> list[Projected]:
    """Every cluster's cells and bandwidth sweep (a refusal, one line, before any file is written)."""
    rows = read_rows(table, records_of(runs_at), out, headline(table).select)
    cells, swept = Projector(table.project), Projector(table.project, replicates=1)
    found = []
    for cluster in clusters:
        start = time.monotonic()
        projected = project_table(table, rows, cluster, cells)
        sweep(projected, table, swept)
        print(f"table {table.name}: projected onto cluster={cluster.name} in {time.monotonic() - start:.0f} s",
              flush=True)
        found.append(projected)
    return found


def write_projected(table: TableConfig, out: Path, runs_at: RunsAt, cluster_node: Optional[Any]) -> list[str]:
    """Project and write the files (module doc); returns table.md's section ([] with no cluster)."""
    clusters = clusters_of(table, cluster_node)
    if not clusters:
        return []
    lines = ["", "## Projected time to quality (not measured)", "",
             "Each row's real validation curve at the worker count it ran, joined with the projected wall clock "
             "to its baseline's final quality on a named cluster (tables/projected.py, docs/projection.md):", ""]
    for projected in project_clusters(table, out, runs_at, clusters):
        name = projected.cluster.name
        figure = f"projected_bandwidth_{name}.png"
        drawn = draw_bandwidth(projected, table, out / figure)
        (out / f"{FILE_STEM}{name}.md").write_text(render(projected, table, figure if drawn else ""))
        write_csv(projected, out / f"{FILE_STEM}{name}.csv")
        lines.append(f"- `{name}` ({projected.cluster.description}): [{FILE_STEM}{name}.md]({FILE_STEM}{name}.md), "
                     f"[{FILE_STEM}{name}.csv]({FILE_STEM}{name}.csv)" + (f", [{figure}]({figure})" if drawn else ""))
    return lines


def with_projected(markdown: str, table: TableConfig, out: Path, runs_at: RunsAt, cluster_node: Optional[Any]) -> str:
    """table.md's text with the projected files written and named in it (unchanged with no cluster)."""
    lines = write_projected(table, out, runs_at, cluster_node)
    return markdown if not lines else markdown.rstrip("\n") + "\n" + "\n".join(lines) + "\n"
