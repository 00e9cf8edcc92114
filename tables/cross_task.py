"""One table's differences from its baseline set beside another task's (`table.compare_with`).

A head-to-head on one task says which methods beat its baseline there. The question a reader asks
next is whether the answer carries over: does the method that wins on MNIST-1D also win on the
language model, and did digits say the same? The tables measure different metrics (accuracy,
higher is better; loss, lower is better) on different scales, so only two things compare across
them, and this module computes both from the tables' own table.csv:

- **Each row's verdict, per pair of variants** (this table's `iid` against the other's `iid`,
  `roles` against `dir0.1`, as `compare_with` maps them). A row's difference from its baseline
  is oriented so that positive is better than the baseline. Then both verdicts are resolved
  (Holm-corrected, each table's own family) with the same sign (**agree**) or opposite signs
  (**disagree**); or one task resolves it and the other does not; or neither does.
- **The order of the methods**: Kendall's tau-b between the two tasks' oriented mean differences
  over the rows they share. It is descriptive (no interval): with each mean a few seeds' worth of
  noise, a tau near 0 says the orders are unrelated *or* unresolved, and the per-row verdicts say
  which.

A table made before the protocol had Holm's correction is read from its re-reading under the
protocol where its folder has one (`table_reread.csv`: digits' head-to-head,
docs/results/head_to_head_cpu/reread.py); otherwise by its uncorrected intervals, and the section
says so.
"""
from __future__ import annotations

import csv
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional

from omegaconf import OmegaConf

from tables.config import TABLE_CONFIGS, TableConfig, headline
from tables.measure import Better, sign

REPO = Path(__file__).resolve().parents[1]
RESULTS = REPO / "docs" / "results"  # where produced tables are kept
REREAD = "table_reread.csv"  # an older table's comparisons read again under the protocol


@dataclass(frozen=True)
class Verdict:
    """A row's difference from its baseline under one variant, oriented: positive is better."""
    mean: float
    low: float
    high: float
    resolved: bool


@dataclass(frozen=True)
class OtherTable:
    name: str
    metric: str
    corrected: bool  # its intervals and resolutions are Holm's
    verdicts: dict[tuple[str, str], Verdict]  # (series, variant) ->
    source: str  # the file read


def _float(value: Any) -> Optional[float]:
    try:
        out = float(value)
    except (TypeError, ValueError):
        return None
    return out if math.isfinite(out) else None


def read_verdicts(rows: list[dict[str, Any]], better: Better) -> tuple[dict[tuple[str, str], Verdict], bool]:
    """The oriented verdicts of a table's records (table.csv's rows, or the records it is written
    from), and whether they are Holm-corrected. Baseline rows and rows without a difference are
    left out."""
    corrected = any("diff_low_holm" in r for r in rows)
    s = sign(better)
    out: dict[tuple[str, str], Verdict] = {}
    for r in rows:
        mean = _float(r.get("diff"))
        low = _float(r.get("diff_low_holm" if corrected else "diff_low"))
        high = _float(r.get("diff_high_holm" if corrected else "diff_high"))
        if mean is None or low is None or high is None or r.get("status", "ok") != "ok":
            continue
        resolved = str(r.get("diff_resolved")).lower() == "true"
        variant = str(r["label"]).split("@", 1)[1] if "@" in str(r["label"]) else ""
        series = str(r.get("series") or str(r["label"]).split("@", 1)[0])
        lo, hi = sorted((s * low, s * high))
        out[(series, variant)] = Verdict(s * mean, lo, hi, resolved)
    return out, corrected


def table_direction(name: str, configs: Path = TABLE_CONFIGS) -> tuple[str, Better]:
    """The compared metric of table `name` and its direction, from its config (conf/table), by the
    rule its own gather follows (`headline`)."""
    node = OmegaConf.load(configs / f"{name}.yaml")
    stated = node.get("better")
    other = TableConfig(name=name, compare_metric=str(node.get("compare_metric", "test_acc")),
                        select_metric=str(node.get("select_metric", "val_acc")), better=Better(stated) if stated else None)
    return other.compare_metric, headline(other).better


def read_other(name: str, results: Path = RESULTS, configs: Path = TABLE_CONFIGS) -> Optional[OtherTable]:
    """Table `name` as produced in `results/<name>/`: its re-reading under the protocol
    (table_reread.csv) where there is one, else its table.csv (None while there is neither)."""
    path = next((p for p in (results / name / REREAD, results / name / "table.csv") if p.exists()), None)
    if path is None:
        return None
    metric, better = table_direction(name, configs)
    with open(path, newline="") as fh:
        rows = list(csv.DictReader(fh))
    verdicts, corrected = read_verdicts(rows, better)
    return OtherTable(name, metric, corrected, verdicts, path.name)


def agreement(here: Verdict, there: Verdict) -> str:
    if here.resolved and there.resolved:
        return "agree" if (here.mean > 0) == (there.mean > 0) else "**disagree**"
    if here.resolved:
        return "resolved here only"
    if there.resolved:
        return "resolved there only"
    return "neither resolved"


def kendall_tau_b(xs: list[float], ys: list[float]) -> Optional[float]:
    """Kendall's tau-b of two paired lists (ties in either list counted as tau-b does); None for
    fewer than two pairs or a list without two distinct values."""
    n = len(xs)
    concordant = discordant = ties_x = ties_y = 0
    for i in range(n):
        for j in range(i + 1, n):
            dx, dy = xs[i] - xs[j], ys[i] - ys[j]
            if dx == 0 and dy == 0:
                continue
            if dx == 0:
                ties_x += 1
            elif dy == 0:
                ties_y += 1
            elif (dx > 0) == (dy > 0):
                concordant += 1
            else:
                discordant += 1
    pairs_x = concordant + discordant + ties_y  # pairs not tied in x
    pairs_y = concordant + discordant + ties_x
    if pairs_x == 0 or pairs_y == 0:
        return None
    return (concordant - discordant) / math.sqrt(pairs_x * pairs_y)


@dataclass(frozen=True)
class Pairing:
    """One pair of variants of the two tables and the rows both have under them."""
    here_variant: str
    there_variant: str
    rows: list[tuple[str, Verdict, Verdict]]  # (series, here, there)

    @property
    def tau(self) -> Optional[float]:
        return kendall_tau_b([h.mean for _, h, _ in self.rows], [t.mean for _, _, t in self.rows])

    def count(self, verdict: str) -> int:
        return sum(agreement(h, t) == verdict for _, h, t in self.rows)


def pairings(here: dict[tuple[str, str], Verdict], there: OtherTable, variants: dict[str, str]) -> list[Pairing]:
    out = []
    for mine, theirs in variants.items():
        rows = sorted((series, verdict, there.verdicts[(series, theirs)])
                      for (series, v), verdict in here.items() if v == mine and (series, theirs) in there.verdicts)
        out.append(Pairing(mine, theirs, rows))
    return out


def _num(x: float) -> str:
    return f"{x:+.4f}"


def across_lines(metric: str, here: dict[tuple[str, str], Verdict], compare_with: dict[str, dict[str, str]],
                 results: Path = RESULTS, configs: Path = TABLE_CONFIGS) -> list[str]:
    """table.md's section: for each table `compare_with` names, the counts of each verdict and
    Kendall's tau per pair of variants, then the rows where the two disagree or only one resolves."""
    lines = ["## Against the other tasks", "",
             f"Each row's difference from its baseline ({metric} here), oriented so that **positive is better "
             "than the baseline**, beside the same row's in another task's table (its own metric and baseline). "
             "`agree` / `disagree`: both tables resolve it (each by its own Holm correction) with the same / the "
             "opposite sign. Kendall's tau-b orders the methods by their mean differences in both tasks; it is "
             "descriptive, without an interval (tables/cross_task.py).", ""]
    if not here:
        return lines + ["No row of this table has a difference from its baseline yet.", ""]
    for name, variants in compare_with.items():
        other = read_other(name, results, configs)
        if other is None:
            path = results / name / "table.csv"
            shown = path.relative_to(REPO) if path.is_relative_to(REPO) else path
            lines += [f"- **{name}**: not produced yet (no {shown}).", ""]
            continue
        note = "" if other.corrected else " (its record predates Holm's correction: uncorrected intervals)"
        if other.source == REREAD:
            note = f" (its comparisons re-read under the protocol: {REREAD})"
        lines += [f"### Against {name} ({other.metric}){note}", "",
                  "| here | there | rows in both | agree | disagree | here only | there only | neither | tau-b |",
                  "|---|---|---|---|---|---|---|---|---|"]
        found = pairings(here, other, variants)
        for p in found:
            shown = "-" if (tau := p.tau) is None else f"{tau:+.2f}"
            lines.append(f"| {p.here_variant} | {p.there_variant} | {len(p.rows)} | {p.count('agree')} | "
                         f"{p.count('**disagree**')} | {p.count('resolved here only')} | "
                         f"{p.count('resolved there only')} | {p.count('neither resolved')} | {shown} |")
        detail = [(p, series, h, t) for p in found for series, h, t in p.rows if agreement(h, t) != "neither resolved"]
        if detail:
            lines += ["", "| row | here | there | difference here (95% CI) | there (95% CI) | verdict |",
                      "|---|---|---|---|---|---|"]
            for p, series, h, t in detail:
                lines.append(f"| {series} | {p.here_variant} | {p.there_variant} | {_num(h.mean)} "
                             f"[{_num(h.low)}, {_num(h.high)}] | {_num(t.mean)} [{_num(t.low)}, {_num(t.high)}] | "
                             f"{agreement(h, t)} |")
        lines.append("")
    return lines
