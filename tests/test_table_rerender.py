"""A table made before stores, gathered again from its runs.csv alone (`table.runs_csv`, issue 88):
the same cells, differences and verdicts as a gather of its run folders, each tuned row's setting
from its table.csv, no curve figure, and one line for a file that is not a runs.csv."""

import csv
import shutil
from pathlib import Path

import pytest

from core.errors import UserError
from tests.support.table_files import read_csv, reported, table_node

KEYS = ("test_acc", "test_acc_ci95", "test_acc_low", "test_acc_high", "diff", "diff_low_holm", "diff_high_holm",
        "diff_p", "diff_p_holm", "diff_resolved", "diff_method", "unstable", "mdd", "machines")


def test_a_table_rerendered_from_its_runs_csv_equals_its_gather(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import tables.runner
    from tables.runner import run_table

    made, published, again = tmp_path / "made", tmp_path / "docs" / "t", tmp_path / "again"
    reported(made, "base@iid", [0.90, 0.92, 0.97])
    reported(made, "ps@iid", [0.91, 0.93, 0.96], ranks=7)  # unpaired: Welch
    reported(made, "wide@iid", [0.82, 0.58, 0.46])  # unstable
    node = table_node([{"label": "base"}, {"label": "ps"}, {"label": "wide"}], variants={"iid": ["x=1"]},
                      plots=["intervals", "accuracy"])
    assert run_table(node, made) == 0
    published.mkdir(parents=True)
    for name in ("runs.csv", "table.csv"):
        shutil.copyfile(made / name, published / name)
    (published / "jobs.jsonl").write_text('{"job": "base@iid seed 1", "phase": "rows", "status": "done", '
                                          '"seconds": 10.0, "ended": 1796600000.0}\n')
    monkeypatch.setattr(tables.runner, "REPO", tmp_path)  # (table.runs_csv is the repository's path)
    assert run_table(table_node(**{**_args(node), "runs_csv": "docs/t/runs.csv"}), again) == 0
    first = {r["label"]: r for r in read_csv(made / "table.csv")}
    second = {r["label"]: r for r in read_csv(again / "table.csv")}
    for label, row in first.items():
        assert {k: second[label][k] for k in KEYS} == {k: row[k] for k in KEYS}, label
    markdown = (again / "table.md").read_text()
    assert "Re-rendered from t/runs.csv (table.runs_csv)" in markdown and "## Production" in markdown
    assert (again / "intervals.png").is_file() and not (again / "accuracy.png").exists()
    tuned = read_csv(published / "table.csv")  # a tuned row keeps the setting its table.csv names
    tuned[1].update(tuned="optim.lr_0.1", tuned_within_noise="True")
    with open(published / "table.csv", "w", newline="") as fh:
        writer = csv.DictWriter(fh, fieldnames=[*tuned[0], "tuned", "tuned_within_noise"])
        writer.writeheader()
        writer.writerows(tuned)
    assert run_table(table_node(**{**_args(node), "runs_csv": "docs/t/runs.csv"}), tmp_path / "tuned") == 0
    assert "| ps@iid | " in (text := (tmp_path / "tuned" / "table.md").read_text()) and "optim.lr_0.1 (within noise)" in text
    (published / "runs.csv").write_text("a,b\n1,2\n")
    with pytest.raises(UserError, match="no label column, so it is not a table's runs.csv"):
        run_table(table_node(**{**_args(node), "runs_csv": "docs/t/runs.csv"}), tmp_path / "third")


def _args(node: object) -> dict:
    from omegaconf import OmegaConf

    found = OmegaConf.to_container(node)
    return {"rows": found.pop("rows"), **found}
