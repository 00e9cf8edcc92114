"""A table's results: one record per row (mean, spread and 95% interval over seeds, ratios to the
baseline, the difference from the baseline with its raw and Holm-corrected intervals, the paper's
numbers, the tuning grid and its choice), as markdown and CSV, beside runs.csv (tables/runs.py).
See tables/stats.py for the intervals and tables/compare.py for the comparisons."""
from __future__ import annotations

import csv
import math
import statistics
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional

from tables.compare import Comparison, Family, build_family
from tables.config import SplitSeeds, TableConfig, batch_rule, headline, row_dir, target, tie_seeds
from tables.measure import evaluation_set, is_proportion, sign
from tables.run_records import RunsAt
from tables.runs import TASK_METRICS, Summary, read_runs, set_size
from tables.runs import to_target as _to_target
from tables.stats import LEVEL, cell_half_width
from tables.tuning import Tuned, setting_name

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
    """Mean, standard deviation and 95% half-width (with the evaluation set's floor for an
    accuracy) of one metric over a row's seeds."""
    values_ = [float(r[metric]) for r in runs if isinstance(r.get(metric), (int, float))
               and not isinstance(r.get(metric), bool)]
    if not all(math.isfinite(v) for v in values_):
        # a diverged seed's loss is NaN: a mean over the other seeds would hide it, so the cell says so
        rec[metric], rec[f"{metric}_std"], rec[f"{metric}_ci95"] = DIVERGED, None, None
        return
    rec[metric] = statistics.fmean(values_) if values_ else None
    rec[f"{metric}_std"] = statistics.stdev(values_) if len(values_) > 1 else None
    rec[f"{metric}_ci95"] = cell_half_width(values_, set_size_of(table, runs, metric))
    if metric in ("time_to_target_s", "bytes_to_target") and runs and len(values_) < len(runs):
        rec[metric] = NOT_REACHED  # some seed never reached the target: no mean to show
        rec[f"{metric}_ci95"] = None


def set_size_of(table: TableConfig, runs: list[Summary], metric: str) -> Optional[int]:
    """The evaluation set's size under an accuracy's floor, from a row's runs (the smallest they
    record, else the table's test_examples/val_examples; None for a metric that is not a share)."""
    if not is_proportion(metric):
        return None
    known = [n for n in (set_size(s, metric, table) for s in runs) if n]
    return min(known) if known else (table.test_examples if metric.startswith(("test", "best_test"))
                                     else table.val_examples)


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
                               "log": str(row_dir(out, row, (failed or table.seeds)[0]).row_log),
                               "baseline": row.baseline or table.baseline, "x": row.x,
                               "series": row.series or row.label}
        for metric in dict.fromkeys(table.columns + table.ratios):
            _cell(rec, metric, found, table)
        if tuned and row.label in tuned:
            result = tuned[row.label]
            rec["tuned"] = setting_name(result.winner) if result.winner else "none"
            rec["tuned_within_noise"] = result.within_noise
            rec["tuned_at_edge"] = result.at_edge
            rec["tuned_rule"] = result.rule
            rec["tuned_set_aside"] = " ".join(setting_name(s) for s in result.set_aside)
        rec["commits"] = " ".join(sorted({str(s.get("commit") or "unknown")[:7] for s in found}))
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
    for rec in records:
        _difference_fields(rec, family.of_row(rec["label"]), family.notes.get(rec["label"], ""))
    return Gathered(records, runs, family)


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


def _p(value: Optional[float]) -> str:
    if value is None:
        return "-"
    return "<0.0001" if value < 1e-4 else f"{value:.4f}"


def _fmt_diff(rec: dict[str, Any]) -> str:
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


def _tie_rule_text(tie_metric: str, select_metric: str) -> str:
    """Step 5's order (tables/tuning.py): the tie metric, then the selection metric, which is
    named once where the two are the same metric (a loss-selected table breaks ties by that loss)."""
    if tie_metric == select_metric:
        return f"the best mean {tie_metric}"
    return f"the best mean {tie_metric}, then the best mean {select_metric}"


def _tuning_lines(table: TableConfig, tuned: dict[str, Tuned], failed: list[str]) -> list[str]:
    """The grids, each setting's mean validation result (and tie metric), and the chosen setting;
    the rows chosen within noise, at an edge, or with extended grids."""
    first = tuned[next(iter(tuned))]
    lines = ["## Tuning", "",
             f"Each tuned row ran its grid on seeds {table.tune_seeds}; the setting with the best mean "
             f"{first.metric} (validation) was then run on seeds {table.seeds}, whose test "
             f"results are above. No test result chose anything. Settings whose validation results are not "
             f"told apart from the best (the interval of their paired difference, floored by the validation "
             f"set's size, includes 0){_resolution_text(table, first.metric)} are contenders; a one-seed grid with "
             f"several contenders ran again on "
             f"tuning seed(s) {tie_seeds(table)}; {_margin_text(table)}"
             f"the contenders left are decided by {_tie_rule_text(table.tie_metric, first.metric)}, then grid "
             f"order (tables/tuning.py).", "",
             f"| row | setting | mean {first.metric} | runs | chosen | mean {table.tie_metric} | contender |",
             "|---|---|---|---|---|---|---|"]
    for label, result in tuned.items():
        for setting, mean, runs in result.results:
            tie = result.tie_means.get(setting)
            lines.append(f"| {label} | {setting_name(setting)} | {'-' if mean is None else f'{mean:.4f}'} | "
                         f"{runs}/{len(result.seeds) or len(table.tune_seeds)} | "
                         f"{'**yes**' if setting == result.winner else ''} | "
                         f"{'-' if tie is None else f'{tie:.4f}'} | "
                         f"{_contender_cell(result, setting)} |")
    extended = [label for label, result in tuned.items() if result.extended]
    if extended:
        lines += ["", f"Grids extended beyond a winning edge (table.tune_extend={table.tune_extend}): "
                      f"{', '.join(extended)}."]
    noisy = [f"{label} ({len(r.contenders)} contenders on {len(r.seeds)} seed{'s' * (len(r.seeds) != 1)}, "
             f"decided by {r.rule})" for label, r in tuned.items() if r.within_noise]
    if noisy:
        lines += ["", f"Chosen within noise (validation does not tell the contenders apart; the choice rests on "
                      f"the rule named): {', '.join(noisy)}."]
    aside = [f"{label} ({', '.join(setting_name(s) for s in r.set_aside)})"
             for label, r in tuned.items() if r.set_aside]
    if aside:
        lines += ["", f"Set aside by the stability margin (a contender that diverged on a tuning seed, or a grid "
                      f"step below a setting that did): {', '.join(aside)}."]
    blown = [f"{label} {setting_name(s)} (seed{'s' * (len(seeds) > 1)} {', '.join(map(str, seeds))})"
             for label, r in tuned.items() for s, seeds in r.diverged.items()]
    if blown:
        lines += ["", f"Tuning runs that diverged (final validation loss not finite or not below the first "
                      f"logged training loss): {', '.join(blown)}."]
    at_edge = [label for label, result in tuned.items() if result.at_edge]
    if at_edge:
        lines += ["", f"Chosen at an edge of the grid as run, or tied with an edge (the best setting may lie beyond "
                      f"it; these rows' tuning is not resolved): {', '.join(at_edge)}."]
    if failed:
        lines += ["", f"Tuning runs that did not complete (no mean, cannot be chosen): {', '.join(failed)}."]
    return lines + [""]


def _resolution_text(table: TableConfig, metric: str) -> str:
    if table.tune_resolution is None or is_proportion(metric):
        return ""
    return f", or whose mean is within table.tune_resolution = {table.tune_resolution:g} of the best,"


def _margin_text(table: TableConfig) -> str:
    keys = table.tune_stability_keys
    beyond = f", or whose next larger {' / '.join(keys)} did," if keys else ""
    cost = (f"within table.tune_margin_cost = {table.tune_margin_cost:g} of it" if table.tune_margin_cost is not None
            else "validation cannot tell apart from it")
    return (f"among the contenders, one that diverged on a tuning seed{beyond} is set aside unless all would "
            f"be (the stability margin), and the best mean only for a setting the margin keeps {cost}; ")


def _contender_cell(result: Tuned, setting: Any) -> str:
    if not result.within_noise or setting not in result.contenders:
        return ""
    return "set aside" if setting in result.set_aside else "yes"


def _intervals_text(table: TableConfig, family: Optional[Family], gathered_n: Optional[int]) -> list[str]:
    per_seed = table.split_seeds == SplitSeeds.per_seed
    shared = (f" Each seed has validation and test data of its own (table.split_seeds=per_seed: runs.csv's "
              f"split_seed and generator_seed follow the seed; two rows at one seed share it), so the spread "
              f"over seeds includes the test sets' sampling, and the floor of one test set of {gathered_n} "
              f"examples, kept under every interval, is conservative:" if per_seed else
              f" The seeds share one test set of {gathered_n} examples, so an accuracy's interval is never "
              f"narrower than that set allows:")
    floor = (f"{shared} h = sqrt(h_seed^2 + (1.96 SE)^2), SE the Agresti-Coull standard "
             f"error of the mean accuracy on {gathered_n} examples; a difference's floor counts the examples "
             f"it rests on (fewer than 6 are never resolved)." if gathered_n else
             f" No test-set floor: {'the runs record no test-set size (set table.test_examples)' if is_proportion(table.compare_metric) else table.compare_metric + ' is not a proportion, and the runs record no per-example spread'}; "
             f"intervals are over seeds only.")
    m = family.size if family else 0
    holm = (f" The {m} comparisons of this table (each row against its baseline"
            f"{', the skew interaction' if table.interaction_from else ''}"
            f"{', the declared pairs' if table.comparisons else ''}) are corrected together by Holm's method: "
            f"**resolved** means a Holm-adjusted p below 0.05, and the interval shown is at the level of the "
            f"Holm step that decided it." if m > 1 else " **resolved**: the interval excludes 0.")
    return [f"Cells: mean over seeds {table.seeds} ± the half-width of its {LEVEL:.0%} interval "
            f"(Student-t over seeds).{floor} The difference from the baseline row is paired by seed where the "
            f"two rows share what a seed fixes (the same training ranks and partition), else Welch's "
            f"(marked).{holm} Per-seed values: runs.csv.", ""]


def _resolution_lines(table: TableConfig, family: Family) -> list[str]:
    m = max(family.size, 1)
    lines = ["## What this table can resolve", "",
             f"The smallest true difference from the baseline each variant resolves with 80% power, from the "
             f"median standard deviation of its rows' per-seed paired differences (tables/stats.py, "
             f"min_detectable), at alpha 0.05 for one comparison and at alpha 0.05/{m}, Holm's first step "
             f"over this table's {m} comparisons.", "",
             "| variant | paired comparisons | seeds | SD of paired differences | test examples | "
             "smallest resolvable (one comparison) | smallest resolvable (alpha/m) |"
             + (f" seeds for {table.resolve_target:g} |" if table.resolve_target else ""),
             "|---|---|---|---|---|---|---|" + ("---|" if table.resolve_target else "")]
    for r in family.resolution:
        cells = [r.variant or table.name, str(r.comparisons), str(r.seeds),
                 "-" if r.sd is None else f"{r.sd:.4f}", str(r.n_examples or "-"),
                 "-" if r.mdd is None else f"{r.mdd:.4f}", "-" if r.mdd_holm is None else f"{r.mdd_holm:.4f}"]
        if table.resolve_target:
            cells.append("-" if r.seeds_for_target is None else str(r.seeds_for_target))
        lines.append("| " + " | ".join(cells) + " |")
    return lines + [""]


def _comparison_lines(table: TableConfig, family: Family) -> list[str]:
    lines = ["## Comparisons", "",
             f"Every comparison of {table.compare_metric} in the family ({family.size} with an interval), raw 95% "
             f"interval and p, Holm-adjusted p and the verdict; Welch where the two sides are not paired, and why.",
             "", "| comparison | kind | method | estimate | 95% CI | p | p (Holm) | resolved (Holm) | unpaired because |",
             "|---|---|---|---|---|---|---|---|---|"]
    for c in family.comparisons:
        d = c.diff
        ci = "-" if d.low is None else f"[{d.low:+.4f}, {d.high:+.4f}]"
        lines.append(f"| {c.name} | {c.kind} | {d.method} | {d.mean:+.4f} | {ci} | {_p(c.p)} | {_p(c.p_holm)} | "
                     f"{'**yes**' if c.resolved else ('no' if c.resolved is not None else '-')} | {c.unpaired} |")
    return lines + [""]


def _interaction_lines(table: TableConfig, family: Family) -> list[str]:
    found = [c for c in family.comparisons if c.kind == "interaction"]
    if not found:
        return []
    lines = ["## Skew interaction", "",
             f"Each row's change in {table.compare_metric} from {table.interaction_from} to the variant, against its "
             f"baseline's change: (row@V - row@{table.interaction_from}) - (baseline@V - baseline@"
             f"{table.interaction_from}); "
             f"{'positive' if headline(table).sign > 0 else 'negative'} means the row holds up better than its baseline. "
             f"Interval at its Holm level; paired by seed where all four runs of a seed pair.", "",
             "| row | variant | row's change | baseline's change | interaction [Holm CI] | resolved |",
             "|---|---|---|---|---|---|"]
    for c in found:
        low, high = (c.low_holm, c.high_holm) if c.low_holm is not None else (c.diff.low, c.diff.high)
        ci = "" if low is None else f" [{low:+.4f}, {high:+.4f}]"
        drop_row, drop_base = c.parts or (float("nan"), float("nan"))
        lines.append(f"| {c.name.split(':')[0]} | {c.variant} | {drop_row:+.4f} | {drop_base:+.4f} | "
                     f"{c.diff.mean:+.4f}{ci}{' (Welch)' if c.diff.method == 'welch' else ''} | "
                     f"{'**yes**' if c.resolved else ('no' if c.resolved is not None else '-')} |")
    return lines + [""]


def _declared_lines(table: TableConfig, family: Family) -> list[str]:
    found = [c for c in family.comparisons if c.kind == "declared"]
    if not found:
        return []
    lines = ["## Declared comparisons", "", f"The pairs table.comparisons names ({table.compare_metric}, a - b), "
                                            f"interval at its Holm level.", "",
             "| a - b | method | estimate [Holm CI] | resolved |", "|---|---|---|---|"]
    for c in found:
        low, high = (c.low_holm, c.high_holm) if c.low_holm is not None else (c.diff.low, c.diff.high)
        ci = "" if low is None else f" [{low:+.4f}, {high:+.4f}]"
        better = sign(headline(table).better) * c.diff.mean > 0
        verdict = ("**yes**, " + (c.a if better else c.b) + " better") if c.resolved else \
            ("no" if c.resolved is not None else "-")
        lines.append(f"| {c.name} | {c.diff.method} | {c.diff.mean:+.4f}{ci} | {verdict} |")
    return lines + [""]


def render_markdown(table: TableConfig, records: list[dict[str, Any]], tuned: Optional[dict[str, Tuned]] = None,
                    failed_tuning: Optional[list[str]] = None, family: Optional[Family] = None,
                    provenance: Optional[list[str]] = None, test_examples: Optional[int] = None,
                    partial: Optional[list[str]] = None, against: Optional[list[str]] = None) -> str:
    per_row = any(r.baseline for r in table.rows)  # rows with their own baseline: name it per row
    base = "baseline" if per_row else table.baseline
    has_base = per_row or table.baseline is not None
    diff_col = has_base and len(table.seeds) > 1
    corrected = "Holm-corrected 95% CI" if family and family.size > 1 else "95% CI"
    head = ["row", *table.columns, *(["tuned"] if tuned else []), *(["baseline"] if per_row else []),
            *([f"{table.compare_metric} - baseline ({corrected})"] if diff_col else []),
            *(f"{m} vs {base}" for m in table.ratios if has_base),
            *(f"paper {m}" for m in table.paper_metrics), *(["paper source"] if table.paper_metrics else [])]
    title = table.title or table.name
    lines = [f"# Quick form (table.quick=true) of: {title}" if table.quick else
             f"# Partial: {title}" if partial else f"# {title}", ""]
    if table.description:
        lines += [table.description.strip(), ""]
    lines += partial or []
    if batch_rule(table):
        lines += [batch_rule(table), ""]
    if target(table) is not None and {"time_to_target_s", "bytes_to_target"} & set(table.columns):
        lines += [f"time_to_target_s, bytes_to_target: wall-clock and bytes sent (all ranks) of the run at its "
                  f"first evaluation with {table.target_metric} reaching {target(table):g}.", ""]
    if table.quick:
        lines += [f"**Quick form** (table.quick=true): rows {', '.join(r.label for r in table.rows)}, seed "
                  f"{table.seeds[0]}, no tuning, overrides {' '.join(table.overrides)}; not the table's result.", ""]
    if len(table.seeds) > 1:
        lines += _intervals_text(table, family, test_examples)
    lines += ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for rec in records:
        if rec["status"] != "ok":
            cells = [rec["label"], f"**{rec['status']}** (log: {rec['log']})"] + [""] * (len(head) - 2)
        else:
            cells = [rec["label"], *(_fmt(rec[m], m, rec.get(f"{m}_ci95")) for m in table.columns)]
            if tuned:
                noise = " (within noise)" if rec.get("tuned_within_noise") else ""
                cells.append(rec.get("tuned", "-") + noise)
            if per_row:
                cells.append(rec["baseline"] or "-")
            if diff_col:
                cells.append(_fmt_diff(rec))
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
    if notes:
        lines += ["", *notes]
    if family and diff_col and family.comparisons:
        lines += ["", *_resolution_lines(table, family), *_comparison_lines(table, family),
                  *_interaction_lines(table, family), *_declared_lines(table, family)]
    if against:
        lines += ["", *against]
    if tuned:
        lines += ["", *_tuning_lines(table, tuned, failed_tuning or [])]
    if provenance:
        lines += ["", *provenance]
    return "\n".join(lines) + "\n"


def write_csv(path: Path, records: list[dict[str, Any]]) -> None:
    keys = ["label", "recipe", "status", "seeds", "log"]
    rest = sorted({k for r in records for k in r} - set(keys),
                  key=lambda k: (not k.startswith(tuple(METRICS)), k.startswith("paper"), k))
    with open(path, "w", newline="") as fh:
        writer = csv.DictWriter(fh, fieldnames=keys + rest)
        writer.writeheader()
        for rec in records:
            writer.writerow({k: ("" if rec.get(k) is None else rec.get(k)) for k in keys + rest})
