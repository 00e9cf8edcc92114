"""table.md's "Tuning" section: each tuned row's grid with every setting's mean validation result
and tie metric, the choice, and the rows chosen within noise, set aside by the stability margin,
diverged, at an edge, or extended (the rules are tables/tuning.py's)."""
from __future__ import annotations

from typing import Any

from tables.config import TableConfig, tie_seeds
from tables.measure import is_proportion
from tables.tuning import Tuned, setting_name


def _tie_rule_text(tie_metric: str, select_metric: str) -> str:
    """Step 5's order (tables/tuning.py): the tie metric, then the selection metric, which is
    named once where the two are the same metric (a loss-selected table breaks ties by that loss)."""
    if tie_metric == select_metric:
        return f"the best mean {tie_metric}"
    return f"the best mean {tie_metric}, then the best mean {select_metric}"


def tuning_lines(table: TableConfig, tuned: dict[str, Tuned], failed: list[str]) -> list[str]:
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
