"""A table's projected times on one cluster as files a reader opens: projected_<cluster>.md and .csv.

Every header says "projected time to <target> on <cluster> (s)", so no reader takes a cell for a
measured time; the file opens with what the numbers rest on (the compute's source, the cluster,
the targets, the projection's published errors) and what they cannot say. A table with a workers
axis is pivoted (one line per method, one column per worker count, "not run" where the method has
no runs at that count); any other table lists its rows, one column per target.
"""
from __future__ import annotations

import csv
import math
import re
from pathlib import Path
from typing import Optional

from tables.config import TableConfig
from tables.projected import BASELINE, SPEEDUP_ERROR, Cell, Projected, crossings, variant_rows
from tables.runs import variant_of

FILE_STEM = "projected_"
#: the blind proof of record (docs/projection.md): what a projection's wall time misses by
PROOF = ("the projection's own error, from docs/projection.md's blind proof on emulated links (24 runs, 8 "
         "methods): median 5.0%, worst 26.9% of the measured wall time (DGS and D-PSGD), speedups over allreduce "
         "within 10% for 9 of 21")


def seconds(value: float) -> str:
    return f"{value:.3g}" if value < 1000 else f"{value:,.0f}"


def cell_text(c: Cell, seeds: int) -> str:
    """A cell in words: the mean and band of the seeds that reached, or why there is none."""
    if c.state != "reached":
        return c.state
    low, high = c.band or (0.0, 0.0)
    band = "" if math.isclose(low, high, rel_tol=1e-9) else f" [{seconds(low)}-{seconds(high)}]"
    return f"{seconds(c.seconds or 0.0)}{band}{seeds_note(c, seeds)}"


def seeds_note(c: Cell, seeds: Optional[int] = None) -> str:
    """" (k of n seeds)" where not every seed that ran (or not the table's `seeds` of them) reached."""
    full = len(c.reached) == c.seeds_run and (seeds is None or c.seeds_run == seeds)
    return "" if full else f" ({len(c.reached)} of {c.seeds_run} seeds)"


def series_of(projected: Projected, label: str) -> str:
    row = projected.rows[label].row
    return row.series or label.partition("@")[0]


def target_words(projected: Projected, which: int, table: TableConfig) -> str:
    """Target (a) or (b) in words: "allreduce's final val_acc", "0.99 x allreduce's final val_acc"."""
    first = next(iter(projected.baselines.values()))
    base = series_of(projected, first) if first in projected.rows else first
    if which == 0:
        return f"{base}'s final {table.select_metric}"
    if _higher(projected):
        return f"{table.project.loose_ratio:g} x {base}'s final {table.select_metric}"
    return f"{base}'s final {table.select_metric} + {table.project.loose_margin:g}"


def header(projected: Projected, which: int, table: TableConfig) -> str:
    """The column header's words: what is timed, to what, on which cluster."""
    return f"projected time to {target_words(projected, which, table)} on {projected.cluster.name} (s)"


def _higher(projected: Projected) -> bool:
    pair = next((p for p in projected.targets.values() if p), None)
    return pair is None or pair[0].better.value == "higher"


def pivot(projected: Projected, table: TableConfig, which: int, variant: str) -> list[str]:
    """One markdown table: methods by worker count (or rows by one column) for one target."""
    labels = [r.label for r in table.rows if variant_of(r.label) == variant]
    counts = sorted({r.x for r in table.rows if r.x is not None and variant_of(r.label) == variant})
    names = list(dict.fromkeys(series_of(projected, label) for label in labels))
    at = {(series_of(projected, label), table_row.x): label for label in labels
          for table_row in [projected.rows[label].row]}
    columns = [f"{c:g}" for c in counts] if counts else ["all seeds"]
    lines = [f"| {header(projected, which, table)} | " + " | ".join(columns) + " |",
             "|---|" + "---|" * len(columns)]
    keys = counts or [None]
    targets = []
    for key in keys:
        label = at.get((names[0], key)) if names else None
        pair = projected.targets.get(label) if label else None
        targets.append(f"{pair[which].value:.4g}" if pair else "no baseline run")
    lines.append(f"| *the target, {table.select_metric}* | " + " | ".join(targets) + " |")
    for name in names:
        cells = []
        for key in keys:
            label = at.get((name, key))
            cells.append("not run" if label is None else cell_text(projected.cells[label][which], len(table.seeds)))
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    return lines


def first_to(projected: Projected, table: TableConfig, which: int, variant: str) -> Optional[str]:
    """Which rows reach a target first at the sweep's worker count, in order (the headline), among
    the rows that reached it on at least half their seeds: a cell's time is the mean of the seeds
    that reached, so a row ranked on 1 of its 10 seeds (SGP on MNIST-1D was, first) would be
    ranked on the luckiest run. A row ranked on some of its seeds says how many."""
    chosen = [label for label, r in projected.rows.items() if variant_of(label) == variant
              and r.train_ranks == projected.sweep_workers and projected.cells[label][which].ranked is not None]
    order = sorted(chosen, key=lambda label: projected.cells[label][which].ranked or 0.0)
    if not order:
        return None
    times = [projected.cells[label][which].ranked or 0.0 for label in order]
    text = ", ".join(f"{series_of(projected, label)} {seconds(t)} s{seeds_note(projected.cells[label][which])}"
                     for label, t in zip(order[:5], times))
    return (f"First to target ({'ab'[which]}) at {projected.sweep_workers} workers on {projected.cluster.name}, "
            f"among rows that reached it on at least half their seeds: {text}."
            + tied_with_first([series_of(projected, label) for label in order], times))


def tied_with_first(names: list[str], times: list[float]) -> str:
    """The rows (in order, fastest first) whose time is within the projection's speedup error of the
    first's (SPEEDUP_ERROR, the crossings' band), in words; "" when only the first is."""
    tied = [name for name, t in zip(names, times) if t <= times[0] * (1 + SPEEDUP_ERROR)]
    if len(tied) < 2:
        return ""
    return (f" Within the projection's speedup error ({SPEEDUP_ERROR:.0%}) of the first, so not ordered by it: "
            f"{', '.join(tied)}.")


def compute_sources(sources: list[str]) -> list[str]:
    """The compute's sources, a device file's batches named once ("F at batches 8, 16: S")."""
    grouped: dict[tuple[str, str], list[str]] = {}
    others = []
    for source in sources:
        match = re.fullmatch(r"(.*) at batch (\d+): (.*)", source, flags=re.S)
        if match:
            grouped.setdefault((match[1], match[3]), []).append(match[2])
        else:
            others.append(source)
    named = [f"a device profile (table.project.device), {name} at per-worker batches "
             f"{', '.join(sorted(batches, key=int))}: {rest}" for (name, rest), batches in grouped.items()]
    return named + others


def sweep_lines(projected: Projected, figure: str) -> list[str]:
    """The bandwidth sweep: each row's and each method's best setting's crossing with its baseline."""
    gbits = sorted(projected.sweep.get(0, {}))
    if not gbits:
        return []
    lines = ["## Against link bandwidth", "",
             f"Each cluster preset with its NIC bandwidth set to {gbits[0]:g}-{gbits[-1]:g} Gbit/s (everything else "
             f"as the preset says), at {projected.sweep_workers} workers, one replicate (no band): the projected time "
             f"to each target, and where it crosses the baseline's (interpolated on log-log axes between the swept "
             f"points). A row is compared where at least half its seeds reached the target (as in the headlines), else "
             f"\"not reached\". A method's best setting is, at each bandwidth, the fastest of its rows (its "
             f"algorithm's). The projection's speedups over allreduce missed the measured ones by "
             f"{SPEEDUP_ERROR:.0%} at the median in its blind proof (docs/projection.md), so each line also says "
             f"where a row is faster by more than that: a crossing inside that band is one the model cannot place.",
             ""]
    if figure:
        lines += [f"![projected time to target against NIC bandwidth]({figure})", ""]
    for variant, labels in variant_rows(projected).items():
        base = projected.baselines[labels[0]]
        lines += [f"| {variant or 'rows'}: row, against {series_of(projected, base)} end to end | target (a) | "
                  "target (b) |", "|---|---|---|"]
        methods: dict[str, list[str]] = {}
        for label in labels:
            if label != base:
                methods.setdefault(projected.rows[label].algo, []).append(label)
                words = [crossing_text(projected, gbits, which, [label], base) for which in (0, 1)]
                lines.append(f"| {series_of(projected, label)} | {words[0]} | {words[1]} |")
        for algo, own in methods.items():
            if len(own) > 1:
                words = [crossing_text(projected, gbits, which, own, base) for which in (0, 1)]
                lines.append(f"| **{algo}, best setting** | {words[0]} | {words[1]} |")
        lines.append("")
    return lines


def crossing_text(projected: Projected, gbits: list[float], which: int, labels: list[str], base: str) -> str:
    """The fastest of `labels` against the baseline across the sweep, for one target, in words."""
    at = projected.sweep[which]
    best = [min((t for t in (at[g].get(label) for label in labels) if t is not None), default=None) for g in gbits]
    if all(t is None for t in best):
        return "not reached"
    return crossings(gbits, best, [at[g].get(base) for g in gbits]) or "baseline did not reach it"


def render(projected: Projected, table: TableConfig, figure: str) -> str:
    """projected_<cluster>.md (the module doc)."""
    c = projected.cluster
    higher = _higher(projected)
    loose = (f"{table.project.loose_ratio:g} x (a) (table.project.loose_ratio)" if higher
             else f"(a) + {table.project.loose_margin:g} (table.project.loose_margin)")
    lines = [f"# {table.name}: projected time to quality on {c.name}", "",
             f"**Projected, not measured.** Cluster `{c.name}`: {c.description} (conf/cluster/{c.name}.yaml, every "
             f"number with its source). Each cell joins a row's real validation curve, measured at the worker count "
             f"it ran, with the projected wall clock to the first evaluation reaching the target, at that same "
             f"worker count (docs/projection.md); no accuracy is extrapolated.", "",
             f"- Targets, on validation ({table.select_metric}, {'higher' if higher else 'lower'} is better): "
             f"(a) each row's baseline's final value (its baseline row at the same worker count and partition, the "
             f"mean over its seeds); (b) looser: {loose}.",
             "- A cell: the mean over the seeds that reached the target, [the lowest seed's 5th to the highest seed's "
             "95th percentile of the compute tail's bootstrap]; \"(k of n seeds)\" where not all did; \"not reached\" "
             "when none did; \"not run\" where the row has no runs at that count. A run reaches a target at an "
             "evaluation, so the time is to the first evaluation step at or past it (the curve's resolution).",
             "- Compute: " + ("; ".join(compute_sources(projected.sources)) or "none yet") + " (per run, with where "
             "its data-dependent ops' byte ratios came from: the CSV's compute and byte_ratios columns). A "
             "synchronous step at P workers waits for the slowest of P draws from it, so its measured tail counts as "
             "its median does.",
             f"- What it cannot say: {PROOF}; what the model ignores (docs/projection.md: transport detail, compute "
             f"interference, correlated slow ranks); a quality at any worker count or batch other than the one that "
             f"ran (each cell's steps are its own runs').", ""]
    if not any(r.runs for r in projected.rows.values()):
        return "\n".join([*lines, "No row has a finished run yet: nothing is projected."]) + "\n"
    for variant in dict.fromkeys(variant_of(r.label) for r in table.rows):
        lines += [f"## {variant or 'rows'}", ""]
        for which in (0, 1):
            lines += [*pivot(projected, table, which, variant), ""]
        firsts = [line for which in (0, 1) if (line := first_to(projected, table, which, variant))]
        lines += [*firsts, ""] if firsts else []
    lines += sweep_lines(projected, figure)
    return "\n".join(lines).rstrip() + "\n"


def write_csv(projected: Projected, path: Path) -> None:
    """projected_<cluster>.csv: one line per row, target and seed that ran (the cells' inputs)."""
    with open(path, "w", newline="") as fh:
        writer = csv.writer(fh)
        writer.writerow(["cluster", "label", "series", "workers", "target", "metric", "target_value", "seed",
                         "reached_step", "projected_s", "projected_low_s", "projected_high_s", "compute",
                         "byte_ratios"])
        for label, (a, b) in projected.cells.items():
            row = projected.rows[label]
            for c in (a, b):
                kind = c.target.kind if c.target else BASELINE
                value = f"{c.target.value:.6g}" if c.target else ""
                times = {s.seed: s for s in c.reached}
                for seed in row.runs:
                    t = times.get(seed)
                    writer.writerow([projected.cluster.name, label, series_of(projected, label), row.train_ranks, kind,
                                     c.target.metric if c.target else "", value, seed, t.step if t else "",
                                     *(f"{v:.6g}" for v in ((t.seconds, t.low, t.high) if t else ()))]
                                    + ([] if t else ["", "", ""]) + list(projected.used[(label, seed)]))
