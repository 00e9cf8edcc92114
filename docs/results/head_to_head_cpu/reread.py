"""Read this folder's table.csv again under the protocol the tables follow since issue 34: the
floor of the 360-image test set under every difference, Welch's interval for the rows whose
training ranks differ from allreduce's (the parameter-server rows train on 7 of 8 ranks; msgd is
one process), Holm's correction across the table's 54 comparisons, and the smallest difference
each partition could resolve (tables/stats.py, tables/power.py). The per-seed values of this production
were not kept, so each paired difference's standard error is taken back from its published 95%
interval (half-width / t(0.975, 2)) and a Welch row's from the two rows' published standard
deviations over 3 seeds.

    .venv/bin/python docs/results/head_to_head_cpu/reread.py

It also writes table_reread.csv: each comparison as a table made under the protocol records it
(`diff`, the Holm-level interval `diff_low_holm`/`diff_high_holm`, `diff_p`, `diff_p_holm`,
`diff_resolved`), which the other tasks' head-to-heads read when they set their rows beside this
one (`table.compare_with`, tables/cross_task.py).
"""
from __future__ import annotations

import csv
import math
import statistics
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parents[2]))

from scipy.stats import t  # noqa: E402

from tables.power import min_detectable  # noqa: E402
from tables.stats import Difference, difference_se_floor, holm, holm_levels  # noqa: E402

N_TEST, SEEDS = 360, 3
UNPAIRED = {"asgd", "gradient_dropping", "dgc", "dgs", "msgd"}  # train_ranks 7 (or 1) against allreduce's 8


def comparisons() -> list[tuple[str, Difference]]:
    rows = list(csv.DictReader(open(HERE / "table.csv")))
    by_label = {r["label"]: r for r in rows}
    found = []
    for r in rows:
        if r["label"] == r["baseline"] or not r["diff"]:
            continue
        base, mean = by_label[r["baseline"]], float(r["diff"])
        if r["label"].split("@")[0] in UNPAIRED:
            va, vb = (float(x["test_acc_std"]) ** 2 / SEEDS for x in (r, base))
            se = math.sqrt(va + vb)
            df = (va + vb) ** 2 / ((va ** 2 + vb ** 2) / (SEEDS - 1)) if se else 2.0 * (SEEDS - 1)
            method = "welch"
        else:
            se, df, method = (float(r["diff_high"]) - mean) / t.ppf(0.975, SEEDS - 1), SEEDS - 1, "paired"
        found.append((r["label"], Difference(mean, None, None, method, se, df, difference_se_floor(mean, N_TEST), SEEDS)))
    return found


def write_reread(found: list[tuple[str, Difference]], pvalues: list[float]) -> None:
    fields = ["label", "series", "status", "diff", "diff_low_holm", "diff_high_holm", "diff_level", "diff_method",
              "diff_p", "diff_p_holm", "diff_resolved"]
    with open(HERE / "table_reread.csv", "w", newline="") as fh:
        writer = csv.DictWriter(fh, fieldnames=fields)
        writer.writeheader()
        for (label, d), p, adjusted, level in zip(found, pvalues, holm(pvalues), holm_levels(pvalues)):
            low, high = d.interval(1 - level)
            writer.writerow({"label": label, "series": label.split("@")[0], "status": "ok", "diff": d.mean,
                             "diff_low_holm": low, "diff_high_holm": high, "diff_level": level, "diff_method": d.method,
                             "diff_p": p, "diff_p_holm": adjusted, "diff_resolved": adjusted < 0.05})


def main() -> None:
    found = comparisons()
    pvalues = [d.p_value for _, d in found]
    print(f"{len(found)} comparisons; resolved (Holm-adjusted p < 0.05) marked *, before correction +")
    for (label, d), p, adjusted, level in sorted(zip(found, pvalues, holm(pvalues), holm_levels(pvalues)),
                                                 key=lambda x: x[1]):
        low, high = d.interval()
        print(f"{label:28s} {d.method:6s} {d.mean:+.4f} [{low:+.4f}, {high:+.4f}] p {p:.4f} Holm {adjusted:.4f} "
              f"{'*' if adjusted < 0.05 else ' '}{'+' if low > 0 or high < 0 else ' '}")
    write_reread(found, pvalues)
    m = len(found)
    for variant in ("iid", "dir0.1"):
        sd = statistics.median(d.se_seed * math.sqrt(SEEDS) for label, d in found
                               if label.endswith("@" + variant) and d.method == "paired")
        print(f"{variant}: median SD of paired differences {sd:.4f}; smallest resolvable with 80% power "
              f"{min_detectable(sd, SEEDS, N_TEST):.4f} (alpha 0.05), "
              f"{min_detectable(sd, SEEDS, N_TEST, 0.05 / m):.4f} (alpha 0.05/{m}); with any number of seeds "
              f"at alpha 0.05/{m}: {min_detectable(0.0, 1000, N_TEST, 0.05 / m):.4f}")


if __name__ == "__main__":
    main()
