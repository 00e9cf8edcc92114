"""A table's results: one record per row (mean, spread and 95% interval over seeds, ratios to the
baseline, the difference from the baseline with its raw and Holm-corrected intervals, the paper's
numbers, the tuning grid and its choice, its own power), as markdown and CSV, beside runs.csv
(tables/runs.py). See tables/stats.py for the intervals, tables/ranges.py for the range they are cut
at and the rows marked unstable, tables/compare.py for the comparisons and tables/resolution.py for
what each row can resolve.

A record names its row's log relative to the table's folder (`<label>/seed_<s>/run.log`): a
published table.csv carries no path of the machine that gathered it, so that a gather of the same
runs anywhere writes the same file."""
from __future__ import annotations

import csv
import math
import statistics
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional

from tables.compare import Comparison, Family, build_family
from tables.config import TableConfig, WorkerBatch, headline, row_dir, target
from tables.measure import evaluation_set, is_proportion
from tables.ranges import UNSTABLE, cell_bounds, unstable_reason
from tables.render_family import comparison_lines, declared_lines, interaction_lines, intervals_text, resolution_lines
from tables.render_tuning import tuning_lines
from tables.power import RowPower
from tables.resolution import resolve
from tables.run_records import RunsAt
from tables.runs import (TASK_METRICS, Summary, loss_set_se, machine_type, metric_set, read_runs, row_rel,
                         scored_units)
from tables.runs import to_target as _to_target
from tables.stats import cell_half_width, cut
from tables.tuning import Tuned, setting_name, stale_in

#: the default columns of table.csv, after the label (TableConfig.columns); ratios and paper columns follow
METRICS = ["test_acc", "val_acc", "best_val_acc", "test_acc_at_best", "steps", "syncs", "comm_bytes", "wall_s", "samples_per_s"]
RATIOS = ["syncs", "comm_bytes", "wall_s", "samples_per_s"]
NOT_REACHED = "not reached"
DIVERGED = "diverged"  # a seed ended with this metric not finite (a NaN or infinite loss): no mean to show


def to_target(run_dir: Any, target_value: float, metric: str = "test_acc") -> tuple[Optional[float], Optional[int]]:
    """Wall-clock seconds and bytes sent (all ranks) of the run at its first evaluation whose
    `metric` reaches the target in its direction ((None, None): never)."""
    return _to_target(run_dir, target_value, metric)


def time_to_target(run_dir: Any, target_value: float, metric: str = "test_acc") -> Optional[float]:
    """Wall-clock seconds of the run at its first evaluation reaching the target (None: never)."""
    return to_target(run_dir, target_value, metric)[0]


@dataclass
class Gathered:
    """A table's records (one per row), the per-seed summaries they come from, and its family of
    comparisons."""
    records: list[dict[str, Any]]
    runs: dict[str, dict[int, Summary]]
    family: Family = field(default_factory=Family)


def _cell(rec: dict[str, Any], metric: str, runs: list[Summary], table: TableConfig) -> None:
    """Mean, standard deviation and 95% half-width over a row's seeds of one metric, with the
    evaluation set's floor (an accuracy's from the units it counts; a loss's from the standard
    error its runs record), and the interval cut at what the metric can take (`_low`, `_high`)."""
    values_ = [float(r[metric]) for r in runs if isinstance(r.get(metric), (int, float))
               and not isinstance(r.get(metric), bool)]
    if not all(math.isfinite(v) for v in values_):
        # a diverged seed's loss is NaN: a mean over the other seeds would hide it, so the cell says so
        rec[metric], rec[f"{metric}_std"], rec[f"{metric}_ci95"] = DIVERGED, None, None
        rec[f"{metric}_low"], rec[f"{metric}_high"] = None, None
        return
    rec[metric] = statistics.fmean(values_) if values_ else None
    rec[f"{metric}_std"] = statistics.stdev(values_) if len(values_) > 1 else None
    floor = loss_floor_of(runs, metric)
    h = cell_half_width(values_, set_size_of(table, runs, metric), se_set=floor)
    rec[f"{metric}_ci95"] = h
    if floor is not None:
        rec[f"{metric}_floor"] = floor  # (a loss: the set's standard error under its interval)
    rec[f"{metric}_low"], rec[f"{metric}_high"] = (None, None) if h is None else \
        cut(rec[metric] - h, rec[metric] + h, cell_bounds(metric))
    if metric in ("time_to_target_s", "bytes_to_target") and runs and len(values_) < len(runs):
        rec[metric] = NOT_REACHED  # some seed never reached the target: no mean to show
        rec[f"{metric}_ci95"], rec[f"{metric}_low"], rec[f"{metric}_high"] = None, None, None


def set_size_of(table: TableConfig, runs: list[Summary], metric: str) -> Optional[int]:
    """The units an accuracy's floor counts, from a row's runs (tables/runs.py `scored_units`: the
    smallest they record, else the table's test_examples/val_examples; None for a metric that is
    not a share)."""
    if not is_proportion(metric):
        return None
    known = [n for n in (scored_units(s, metric, table) for s in runs) if n]
    return min(known) if known else (table.test_examples if metric.startswith(("test", "best_test"))
                                     else table.val_examples)


def loss_floor_of(runs: list[Summary], metric: str) -> Optional[float]:
    """A loss cell's floor: the mean over its seeds of the standard error of the mean loss each run
    records over the set's scoring groups (None unless every seed records it). The seeds share the
    set, so its error does not average out over them; the mean of their standard errors bounds the
    standard error of their mean's (the standard deviation of a mean of variables is at most the
    mean of theirs)."""
    found = [loss_set_se(s, metric) for s in runs]
    return statistics.fmean(found) if found and all(v is not None for v in found) else None  # type: ignore[arg-type]


def collect(table: TableConfig, out: Path, status: dict[tuple[str, int], str],
            tuned: Optional[dict[str, Tuned]] = None, runs_at: Optional[RunsAt] = None) -> Gathered:
    """One record per row: mean/std/95% half-width over seeds of each metric, ratios, the
    comparison of `compare_metric` with the baseline row (raw and Holm-corrected), the paper's
    numbers, the tuning; the per-seed summaries and the table's family of comparisons. The runs are
    read from `runs_at` (tables/run_records.py; default: the table's folder `out`)."""
    runs = read_runs(table, out if runs_at is None else runs_at)
    records = []
    for row in table.rows:
        found = [runs[row.label][s] for s in table.seeds if s in runs[row.label]]
        failed = [s for s in table.seeds if status.get((row.label, s)) == "failed"]
        rec: dict[str, Any] = {"label": row.label, "recipe": row.recipe or "", "seeds": len(found),
                               "status": "ok" if len(found) == len(table.seeds) else
                               ("failed" if failed else "missing"),
                               "log": row_dir(Path(), row, (failed or table.seeds)[0]).job_log.as_posix(),
                               "baseline": row.baseline or table.baseline, "x": row.x,
                               "series": row.series or row.label}
        for metric in dict.fromkeys(table.columns + table.ratios):
            _cell(rec, metric, found, table)
        by_seed = {s: float(v) for s in table.seeds if s in runs[row.label]
                   and isinstance(v := runs[row.label][s].get(table.compare_metric), (int, float))}
        losses = {f"{metric_set(table.compare_metric) or 'test'}_loss", table.compare_metric}
        diverged = [s for s in by_seed if any(isinstance(v := runs[row.label][s].get(m), float) and not math.isfinite(v)
                                              for m in losses)]
        rec[UNSTABLE] = unstable_reason(by_seed, table.compare_metric, diverged) or ""
        if tuned and row.label in tuned:
            result = tuned[row.label]
            rec["tuned"] = setting_name(result.winner) if result.winner else "none"
            rec["tuned_within_noise"] = result.within_noise
            rec["tuned_at_edge"] = result.at_edge
            rec["tuned_rule"] = result.rule
            rec["tuned_set_aside"] = " ".join(setting_name(s) for s in result.set_aside)
            stale = [f"seed {s}" for s in table.seeds if s in runs[row.label] and result.winner
                     and stale_in(runs_at or out, row_rel(row, s), result.winner)]
            rec["tuned_stale"] = " ".join(stale)
        rec["commits"] = " ".join(sorted({str(s.get("commit") or "unknown")[:7] for s in found}))
        rec["machines"] = " ".join(sorted({machine_type(s) for s in found}))
        for key, value in row.paper.items():
            rec[f"paper_{key}"] = value
        records.append(rec)
    by_label = {r["label"]: r for r in records}
    for rec in records:
        base = by_label.get(rec["baseline"]) if rec["baseline"] else None
        for metric in table.ratios:
            ok = base and isinstance(rec[metric], float) and isinstance(base[metric], float) and base[metric]
            rec[f"{metric}_vs_base"] = rec[metric] / base[metric] if ok else None
    family = build_family(table, runs, headline(table))
    resolve(table, runs, family, table.compare_metric)
    for rec in records:
        c = family.of_row(rec["label"])
        stale = (f"its reported runs ({rec['tuned_stale']}) were made with another setting than the one chosen now, "
                 f"{rec.get('tuned')} (the choice changed after they were made): the table's command runs them "
                 f"again; until then these cells are the old setting's" if rec.get("tuned_stale") else "")
        note = "; ".join(filter(None, [family.notes.get(rec["label"], ""), c.machines if c else "", stale]))
        _difference_fields(rec, c, note)
        _power_fields(rec, family.powers.get(rec["label"]))
    return Gathered(records, runs, family)


def _power_fields(rec: dict[str, Any], power: Optional[RowPower]) -> None:
    """table.csv's power columns: the row's own smallest difference resolved with 80% power at
    alpha 0.05 (`mdd`) and at its Holm step's level (`mdd_step`, `mdd_level`)."""
    rec["mdd"] = power.mdd if power else None
    rec["mdd_step"] = power.mdd_step if power else None
    rec["mdd_level"] = power.level if power else None


def _difference_fields(rec: dict[str, Any], c: Optional[Comparison], note: str) -> None:
    """table.csv's comparison columns: `diff`, its 95% interval (`diff_low`, `diff_high`), how it
    was formed, its p-values raw and Holm-adjusted, the Holm-level interval, and `diff_resolved`
    (Holm-corrected; `diff_resolved_raw` before the correction)."""
    d = c.diff if c else None
    rec["diff"] = d.mean if d else None
    rec["diff_low"], rec["diff_high"] = (d.low, d.high) if d else (None, None)
    rec["diff_method"] = d.method if d else None
    rec["diff_unpaired"] = c.unpaired if c else ""
    rec["diff_p"] = c.p if c else None
    rec["diff_p_holm"] = c.p_holm if c else None
    rec["diff_level"] = c.level if c else None
    rec["diff_low_holm"], rec["diff_high_holm"] = (c.low_holm, c.high_holm) if c else (None, None)
    rec["diff_resolved_raw"] = d.resolved if d else None
    rec["diff_resolved"] = (c.resolved if c.p_holm is not None else d.resolved) if c and d else None
    rec["note"] = note


def gather(table: TableConfig, out: Path, status: dict[tuple[str, int], str],
           tuned: Optional[dict[str, Tuned]] = None, runs_at: Optional[RunsAt] = None) -> list[dict[str, Any]]:
    """The records of `collect` alone."""
    return collect(table, out, status, tuned, runs_at).records


def _is_measure(metric: str) -> bool:
    """A value measured on an evaluation set (shown with 4 decimals and its interval)."""
    return evaluation_set(metric) is not None or metric in TASK_METRICS or "_acc" in metric or metric.endswith("acc")


def cell_text(rec: dict[str, Any], metric: str) -> str:
    """A cell as table.md shows it: `mean ± h`, or `mean [low, high]` where the interval was cut at
    the metric's range."""
    value, h = rec.get(metric), rec.get(f"{metric}_ci95")
    low, high = rec.get(f"{metric}_low"), rec.get(f"{metric}_high")
    if isinstance(value, float) and h is not None and low is not None and _is_measure(metric) \
            and (low > value - h or high < value + h):
        return f"{_fmt(value, metric)} [{low:.4f}, {high:.4f}]"
    return _fmt(value, metric, h)


def _fmt(value: Any, metric: str, ci: Any = None) -> str:
    if value is None:
        return "-"
    if isinstance(value, str):
        return value
    if metric == "time_to_target_s" and isinstance(value, float):
        return f"{value:.1f} s" + (f" ± {ci:.1f}" if ci is not None else "")
    if metric in ("comm_bytes", "bytes_to_target"):
        text = f"{value / 1e6:.1f} MB"
    elif metric in ("steps", "syncs"):
        text = f"{value:.0f}"
    elif _is_measure(metric):
        text = f"{value:.4f}"
    elif isinstance(value, float):
        text = f"{value:.3g}" if abs(value) < 1000 else f"{value:.0f}"
    else:
        text = str(value)
    return f"{text} ± {ci:.4f}" if ci is not None and _is_measure(metric) else text


def diff_text(rec: dict[str, Any]) -> str:
    """`+0.0123 [+0.0050, +0.0196] resolved`: the difference, its interval at the Holm level (the
    95% one where no correction applies), and the Holm-corrected flag; the mean alone without one."""
    if rec.get("diff") is None:
        return "-"
    low, high = rec.get("diff_low_holm"), rec.get("diff_high_holm")
    if low is None:
        low, high = rec.get("diff_low"), rec.get("diff_high")
    if low is None:
        return f"{rec['diff']:+.4f}"
    mark = " **resolved**" if rec["diff_resolved"] else ""
    unpaired = " (Welch)" if rec.get("diff_method") == "welch" else ""
    return f"{rec['diff']:+.4f} [{low:+.4f}, {high:+.4f}]{mark}{unpaired}"


def render_markdown(table: TableConfig, records: list[dict[str, Any]], tuned: Optional[dict[str, Tuned]] = None,
                    failed_tuning: Optional[list[str]] = None, family: Optional[Family] = None,
                    provenance: Optional[list[str]] = None, test_examples: Optional[int] = None,
                    partial: Optional[list[str]] = None, against: Optional[list[str]] = None,
                    unit: str = "example", preface: Optional[list[str]] = None) -> str:
    """table.md. `test_examples`: the units the headline's floor counts (`unit`: what one is);
    `partial`: a gather's lines on the rows not yet made (the title says "Partial"); `preface`:
    other lines to put first (a re-render's)."""
    per_row = any(r.baseline for r in table.rows)  # rows with their own baseline: name it per row
    base = "baseline" if per_row else table.baseline
    has_base = per_row or table.baseline is not None
    diff_col = has_base and len(table.seeds) > 1
    corrected = "Holm-corrected 95% CI" if family and family.size > 1 else "95% CI"
    show_tuned = bool(tuned) or any("tuned" in r for r in records)
    head = ["row", *table.columns, *(["tuned"] if show_tuned else []), *(["baseline"] if per_row else []),
            *([f"{table.compare_metric} - baseline ({corrected})"] if diff_col else []),
            *(f"{m} vs {base}" for m in table.ratios if has_base),
            *(f"paper {m}" for m in table.paper_metrics), *(["paper source"] if table.paper_metrics else [])]
    title = table.title or table.name
    lines = [f"# Quick form (table.quick=true) of: {title}" if table.quick else
             f"# Partial: {title}" if partial else f"# {title}", ""]
    if table.description:
        lines += [table.description.strip(), ""]
    lines += [*(preface or []), *(partial or [])]
    if batch_rule(table):
        lines += [batch_rule(table), ""]
    if target(table) is not None and {"time_to_target_s", "bytes_to_target"} & set(table.columns):
        lines += [f"time_to_target_s, bytes_to_target: wall-clock and bytes sent (all ranks) of the run at its "
                  f"first evaluation with {table.target_metric} reaching {target(table):g}.", ""]
    if table.quick:
        lines += [f"**Quick form** (table.quick=true): rows {', '.join(r.label for r in table.rows)}, seed "
                  f"{table.seeds[0]}, no tuning, overrides {' '.join(table.overrides)}; not the table's result.", ""]
    if len(table.seeds) > 1:
        lines += intervals_text(table, family, test_examples, unit, _loss_floor_words(table, records))
    lines += ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for rec in records:
        if rec["status"] != "ok":
            cells = [rec["label"], f"**{rec['status']}** (log: {rec['log']})"] + [""] * (len(head) - 2)
        else:
            cells = [rec["label"], *(cell_text(rec, m) + (" **unstable**" if m == table.compare_metric
                                                            and rec.get(UNSTABLE) else "") for m in table.columns)]
            if show_tuned:
                noise = " (within noise)" if rec.get("tuned_within_noise") in (True, "True") else ""
                stale = " (**its runs were made at another setting**)" if rec.get("tuned_stale") else ""
                cells.append(rec.get("tuned", "-") + noise + stale)
            if per_row:
                cells.append(rec["baseline"] or "-")
            if diff_col:
                cells.append(diff_text(rec))
            if has_base:
                cells += [_fmt(rec[f"{m}_vs_base"], "ratio") + "x" if rec[f"{m}_vs_base"] else "-"
                          for m in table.ratios]
            cells += [_fmt(rec.get(f"paper_{m}") if rec.get(f"paper_{m}") is not None else "not reported", m)
                      for m in table.paper_metrics]
            if table.paper_metrics:
                cells.append(str(rec.get("paper_source", "-")))
        lines.append("| " + " | ".join(cells) + " |")
    notes = [f"- {r.label}: {r.note}" for r in table.rows if r.note]
    notes += [f"- {rec['label']}: {rec['note']}" for rec in records if rec.get("note")]
    notes += [f"- {rec['label']}: unpaired (Welch): {rec['diff_unpaired']}" for rec in records
              if rec.get("diff_unpaired") and rec.get("diff_method") == "welch"]
    notes += [f"- {rec['label']}: **unstable**: {rec[UNSTABLE]}" for rec in records if rec.get(UNSTABLE)]
    if notes:
        lines += ["", *notes]
    if family and diff_col and family.comparisons:
        lines += ["", *resolution_lines(table, family), *comparison_lines(table, family),
                  *interaction_lines(table, family), *declared_lines(table, family)]
    if against:
        lines += ["", *against]
    if tuned:
        lines += ["", *tuning_lines(table, tuned, failed_tuning or [])]
    if provenance:
        lines += ["", *provenance]
    return "\n".join(lines) + "\n"


def _loss_floor_words(table: TableConfig, records: list[dict[str, Any]]) -> Optional[str]:
    """How a loss headline's cells are floored, where every shown row's runs record the set's
    standard error (None otherwise: intervals over seeds only)."""
    metric = table.compare_metric
    if is_proportion(metric) or not records or any(rec.get(f"{metric}_floor") is None for rec in records
                                                   if rec["status"] == "ok"):
        return None
    return (f"The seeds share one test set, so a {metric} cell's interval is never narrower than that set "
            f"allows: h = sqrt(h_seed^2 + (1.96 SE_set)^2), SE_set the mean over the seeds of the standard error "
            f"of the mean loss each run records over the set's scoring groups (summary.json's test_loss_se: "
            f"windows of text, samples). A difference of two rows' losses has no such floor: the runs record "
            f"each model's spread over the set, not that of their per-window differences, and no lower bound "
            f"follows from them.")


def batch_rule(table: TableConfig) -> str:
    """The workers axis's batch rule in words, for table.md ("" without the axis)."""
    axis = table.workers
    if not axis.counts:
        return ""
    counts = ", ".join(str(n) for n in sorted({int(r.x) for r in table.rows if r.x is not None}))
    if axis.batch == WorkerBatch.global_constant:
        rule = (f"the global batch is {axis.global_batch} at every count (train.global_batch_size): each worker "
                f"takes {axis.global_batch} / N samples per step, and the learning rate is the recipe's, or "
                f"lr x update batch / B where a row sets optim.scale_lr_with_batch=B (a parameter server's update "
                f"is one worker's push, {axis.global_batch} / N samples)")
    else:
        rule = ("each worker keeps its recipe's batch (train.batch_size), so the global batch grows with the "
                "workers; the learning rate follows each recipe's rule (its optim.lr, or lr x update batch / B "
                "where the recipe sets optim.scale_lr_with_batch=B: the global batch, a worker's batch for a "
                "parameter server)")
    return (f"Workers axis: every row at {counts} training workers (label `<row>.w<N>`; launch.nproc = N plus "
            f"the row's extra ranks, a parameter server's). Batch rule: {rule}.")


def write_csv(path: Path, records: list[dict[str, Any]]) -> None:
    keys = ["label", "recipe", "status", "seeds", "log"]
    rest = sorted({k for r in records for k in r} - set(keys),
                  key=lambda k: (not k.startswith(tuple(METRICS)), k.startswith("paper"), k))
    with open(path, "w", newline="") as fh:
        writer = csv.DictWriter(fh, fieldnames=keys + rest)
        writer.writeheader()
        for rec in records:
            writer.writerow({k: ("" if rec.get(k) is None else rec.get(k)) for k in keys + rest})
