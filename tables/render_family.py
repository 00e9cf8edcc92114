"""table.md's sections about the family of comparisons: how its cells and intervals are made
(`intervals_text`), what it can resolve per variant and per row (`resolution_lines`), every
comparison with its raw and Holm-corrected verdict, the skew interaction and the declared pairs."""
from __future__ import annotations

from typing import Optional

from tables.compare import Family
from tables.config import SplitSeeds, TableConfig, headline
from tables.measure import is_proportion, sign
from tables.power import Resolution
from tables.stats import LEVEL


def p_text(value: Optional[float]) -> str:
    if value is None:
        return "-"
    return "<0.0001" if value < 1e-4 else f"{value:.4f}"


def _mdd(value: Optional[float]) -> str:
    return "-" if value is None else f"{value:.4f}"


def intervals_text(table: TableConfig, family: Optional[Family], units: Optional[int], unit: str,
                   loss_floor: Optional[str]) -> list[str]:
    """How the cells and differences are made: the seeds' t interval, the floor of the evaluation
    set in the units its metric counts (`units` of `unit`), a loss's recorded standard error
    (`loss_floor`: its words, or None), the range every interval is cut at, Holm's correction."""
    per_seed = table.split_seeds == SplitSeeds.per_seed
    counted = f"{units:,} {unit}s" if units else ""
    shared = (f" Each seed has validation and test data of its own (table.split_seeds=per_seed: runs.csv's "
              f"split_seed and generator_seed follow the seed; two rows at one seed share it), so the spread "
              f"over seeds includes the test sets' sampling, and the floor of one test set of {counted}, kept "
              f"under every interval, is conservative:" if per_seed else
              f" The seeds share one test set of {counted}, so an accuracy's interval is never narrower than that "
              f"set allows:")
    if units:
        floor = (f"{shared} h = sqrt(h_seed^2 + (1.96 SE)^2), SE the Agresti-Coull standard error of the mean "
                 f"accuracy on the {counted} it is a share of; a difference's floor counts the {unit}s it rests on "
                 f"(fewer than 6 are never resolved).")
    elif loss_floor:
        floor = f" {loss_floor}"
    elif is_proportion(table.compare_metric):
        floor = (" No test-set floor: the runs record no test-set size (set table.test_examples); intervals are "
                 "over seeds only.")
    else:
        floor = (f" No test-set floor: {table.compare_metric} is not a proportion, and the runs record no spread of "
                 f"it over the set's scoring units (summary.json's test_loss_se, recorded by runs made since issue "
                 f"88); intervals are over seeds only.")
    m = family.size if family else 0
    holm = (f" The {m} comparisons of this table (each row against its baseline"
            f"{', the skew interaction' if table.interaction_from else ''}"
            f"{', the declared pairs' if table.comparisons else ''}) are corrected together by Holm's method: "
            f"**resolved** means a Holm-adjusted p below 0.05, and the interval shown is at the level of the "
            f"Holm step that decided it." if m > 1 else " **resolved**: the interval excludes 0.")
    return [f"Cells: mean over seeds {table.seeds} ± the half-width of its {LEVEL:.0%} interval "
            f"(Student-t over seeds).{floor} The difference from the baseline row is paired by seed where the "
            f"two rows share what a seed fixes (the same training ranks and partition), else Welch's "
            f"(marked).{holm} Every interval is cut at what the metric can take (an accuracy in [0, 1], a "
            f"difference of two in [-1, 1], a loss at 0), shown as [low, high] where it was; a row whose seeds "
            f"spread past that range is marked **unstable**, its seeds listed below (tables/ranges.py). "
            f"Per-seed values: runs.csv.", ""]


def _headline(table: TableConfig, resolution: list[Resolution]) -> list[str]:
    """The sentence that states the target against every row, not only the median one."""
    target = table.resolve_target
    if not target:
        return []
    parts = []
    for r in resolution:
        if not r.rows:
            continue
        median = ("-" if r.mdd is None else f"{r.mdd:.4f}, {'meets' if r.mdd <= target else 'misses'} it")
        parts.append(f"{r.variant or table.name}: the median row resolves {median}; by their own spread, "
                     f"{r.met} of {r.rows} rows resolve {target:g} at one comparison and {r.met_step} at the Holm "
                     f"step that decided their verdict")
    return [f"**Against the target {target:g}** (table.resolve_target): " + "; ".join(parts) + ".", ""] if parts else []


def resolution_lines(table: TableConfig, family: Family) -> list[str]:
    """"What this table can resolve": per variant from the median spread, then per row."""
    m = max(family.size, 1)
    target = table.resolve_target
    lines = ["## What this table can resolve", "",
             f"The smallest true difference from the baseline resolved with 80% power, by the exact power of the "
             f"interval test (tables/power.py: the noncentral t over the seeds, with the evaluation set's floor for "
             f"an accuracy). Per variant, from the median standard deviation of its rows' per-seed paired "
             f"differences, at alpha 0.05 for one comparison and at alpha 0.05/{m}, Holm's first step over this "
             f"table's {m} comparisons; the range beside the SD is where an SD from that many seeds may lie (95%, "
             f"chi-square). Per row (below), from its own comparison.", "",
             *_headline(table, family.resolution),
             "| variant | paired comparisons | seeds | SD of paired differences (95% range) | test units | "
             "smallest resolvable (one comparison) | smallest resolvable (alpha/m) |"
             + (f" seeds for {target:g} | rows resolving {target:g} (one comparison / own Holm step) |" if target else ""),
             "|---|---|---|---|---|---|---|" + ("---|---|" if target else "")]
    for r in family.resolution:
        sd = "-" if r.sd is None else f"{r.sd:.4f}" + (f" ({r.sd * r.sd_range[0]:.4f}-{r.sd * r.sd_range[1]:.4f})"
                                                       if r.sd_range else "")
        cells = [r.variant or table.name, str(r.comparisons), str(r.seeds), sd, str(r.n_examples or "-"),
                 _mdd(r.mdd), _mdd(r.mdd_holm)]
        if target:
            cells += ["-" if r.seeds_for_target is None else str(r.seeds_for_target),
                      f"{r.met} / {r.met_step} of {r.rows}"]
        lines.append("| " + " | ".join(cells) + " |")
    return lines + ["", *_row_power_lines(table, family)]


def _row_power_lines(table: TableConfig, family: Family) -> list[str]:
    if not family.powers:
        return []
    target = table.resolve_target
    lines = ["### Power per row", "",
             "Each row's own smallest difference from its baseline resolved with 80% power: from its comparison's "
             "standard error and degrees of freedom (paired; Welch's where marked), at alpha 0.05 and at the level "
             "of the Holm step that decided its verdict.", "",
             "| row | method | SD | df | one comparison | Holm step's level | at that level |"
             + (f" resolves {target:g} |" if target else ""), "|---|---|---|---|---|---|---|" + ("---|" if target else "")]
    for p in family.powers.values():
        level = "-" if p.level is None else f"{p.level:.2g}"
        cells = [p.label, p.method, f"{p.sd:.4f}", f"{p.df:.3g}", _mdd(p.mdd), level, _mdd(p.mdd_step)]
        if target:
            cells.append(("yes" if p.mdd is not None and p.mdd <= target else "no") + " / "
                         + ("yes" if p.mdd_step is not None and p.mdd_step <= target else "no"))
        lines.append("| " + " | ".join(cells) + " |")
    return lines + [""]


def comparison_lines(table: TableConfig, family: Family) -> list[str]:
    lines = ["## Comparisons", "",
             f"Every comparison of {table.compare_metric} in the family ({family.size} with an interval), raw 95% "
             f"interval and p, Holm-adjusted p and the verdict; Welch where the two sides are not paired, and why.",
             "", "| comparison | kind | method | estimate | 95% CI | p | p (Holm) | resolved (Holm) | unpaired because |",
             "|---|---|---|---|---|---|---|---|---|"]
    for c in family.comparisons:
        d = c.diff
        ci = "-" if d.low is None else f"[{d.low:+.4f}, {d.high:+.4f}]"
        lines.append(f"| {c.name} | {c.kind} | {d.method} | {d.mean:+.4f} | {ci} | {p_text(c.p)} | {p_text(c.p_holm)} | "
                     f"{'**yes**' if c.resolved else ('no' if c.resolved is not None else '-')} | {c.unpaired} |")
    return lines + [""]


def interaction_lines(table: TableConfig, family: Family) -> list[str]:
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


def declared_lines(table: TableConfig, family: Family) -> list[str]:
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
