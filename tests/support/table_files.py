"""Result files the table tests write by hand (a run's summary.json and eval records, a table's
node), shared by tests/test_table_intervals.py, test_table_tuning.py and test_table_provenance.py."""

import calendar
import csv
import json
import math
import os
import statistics
import subprocess
from pathlib import Path
from typing import Any, Optional

import pytest
from omegaconf import OmegaConf
from scipy import stats as st

from core.errors import UserError

N_TEST = 360  # digits' test set


def write_run(run: Any, summary: dict[str, Any], evals: list[dict[str, Any]] = ()) -> None:
    run.root.mkdir(parents=True, exist_ok=True)
    run.summary.write_text(json.dumps(summary))
    run.metrics.write_text("".join(json.dumps({"kind": "eval", **e}) + "\n" for e in evals))


def run_summary(acc: float, ranks: int = 8, partition: str = "iid", commit: str = "a" * 40, **extra: Any) -> dict[str, Any]:
    split = {"partition": partition, "val_samples": 144, **({"dirichlet_alpha": 0.1} if partition != "iid" else {})}
    return {"test_acc": acc, "val_acc": acc, "test_loss": 1 - acc, "comm_bytes": 1e6, "steps": 10,
            "train_ranks": ranks, "test_samples": N_TEST, "data_split": split, "commit": commit, "dirty": False,
            **extra}


def reported(out: Path, label: str, accs: list[float], **kw: Any) -> None:
    from tables.config import RowConfig, row_dir

    for seed, acc in zip([1, 2, 3], accs):
        write_run(row_dir(out, RowConfig(label=label), seed), run_summary(acc, **kw),
                   [{"step": 5, "test_acc": acc - 0.1, "comm_bytes_total": 5e5},
                    {"step": 10, "test_acc": acc, "comm_bytes_total": 1e6}])


def table_node(rows: list[dict[str, Any]], **extra: Any) -> Any:
    return OmegaConf.create({"name": "t", "baseline": "base", "seeds": [1, 2, 3], "plots": [], "paper_metrics": [],
                             "columns": ["test_acc", "val_acc"], "ratios": [], "rows": rows, **extra})


def read_csv(path: Path) -> list[dict[str, str]]:
    with open(path) as fh:
        return list(csv.DictReader(fh))


def images(k: int) -> float:
    return k / N_TEST


def write_tuning_run(out: Path, lr: float, seed: int, val_acc: float, val_loss: float,
                      first_loss: float = 2.30) -> None:
    """A tuning run of lr on seed whose first logged training loss is `first_loss`."""
    from tables.tuning import tune_dir

    run = tune_dir(out, "r", (("optim.lr", lr),), seed)
    write_run(run, {"val_acc": val_acc, "val_loss": val_loss, "data_split": {"val_samples": 6000}})
    run.metrics.write_text(json.dumps({"kind": "train", "step": 10, "loss": first_loss}) + "\n"
                           + json.dumps({"kind": "eval", "step": 100, "val_loss": val_loss}) + "\n")
