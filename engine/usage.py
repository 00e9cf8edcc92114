"""`python cli.py --help`: what a new user needs on one screen.

Hydra's own help (still there as `--hydra-help`) opens with "cli is powered by Hydra", prints
the whole composed config, and lists every file of every config group, including recipe files
that only hold settings other recipes share. This help names the tool, the options people
change most, and the runnable recipes and tables, read from the config tree and the registries
so that it never goes stale.
"""
from __future__ import annotations

import re
import textwrap
from pathlib import Path

from data import DATASETS
from dist_algos import ALGORITHMS
from models import MODELS

USAGE = """\
syncopt: distributed-training experiments from one command (README.md, docs/)

usage: python cli.py [recipe=PAPER/NAME | table=NAME] [group=option ...] [key=value ...]

Most-used options:
  recipe=qsr/cpu_qsr          an experiment from recipes/ (listed below)
  table=qsr_cpu               a paper table: runs its rows, writes table.md and plots
  algo=NAME                   the distributed algorithm ({algos})
  model=NAME                  the model ({models})
  data=NAME data.root=PATH    the data set ({datasets}); data.pipeline=torchvision|ffcv|dali
  optim=sgd|adamw optim.lr=LR sched=constant|cosine|step|multistep
  train.epochs=N train.batch_size=B seed=S
  launch.nproc=N              ranks on this machine (4 on a CPU machine, one per GPU)
  launch.hostfile=PATH        several machines (docs/multinode.md)
  launch.max_restarts=N       re-launch a failed job from its last checkpoint, up to N times
  faults.kill=[RANK@STEP]     inject failures: kill, stall=[R@S:SEC], mtbf_s (docs/faults.md)
  logger=wandb                log to Weights & Biases (offline unless WANDB_MODE says otherwise)
  resume=auto|never|PATH      continue the run in hydra.run.dir (auto), or from a checkpoint
  hydra.run.dir=PATH          where the run writes (default runs/DATE/TIME)
  --cfg job                   print the composed config and exit
  --hydra-help                Hydra's help: every config group and option

"""


def recipe_names(recipes: Path) -> dict[str, list[str]]:
    """Runnable recipes per folder: not the tables, not files named `_*`, and not the partial
    files that hold settings other recipes share (included by another recipe, choosing no
    algorithm themselves)."""
    included: set[str] = set()
    for path in recipes.rglob("*.yaml"):
        for ref in re.findall(r"^\s*-\s*(?:/?recipe/)?([\w]+/[\w]+)\s*$", path.read_text(), re.M):
            included.add(ref)
    found: dict[str, list[str]] = {}
    for path in sorted(recipes.glob("*/*.yaml")):
        folder, name = path.parent.name, path.stem
        partial = f"{folder}/{name}" in included and not re.search(r"^\s*-\s*override /algo:", path.read_text(), re.M)
        if folder == "tables" or name.startswith("_") or partial:
            continue
        found.setdefault(folder, []).append(name)
    return found


def table_names(tables: Path) -> list[str]:
    return sorted(p.stem for p in tables.glob("*.yaml") if not p.stem.startswith("_"))


def usage_text(conf: Path) -> str:
    text = USAGE.format(algos=", ".join(ALGORITHMS.names()), models=", ".join(MODELS.names()),
                        datasets=", ".join(DATASETS.names()))
    lines = ["Recipes (recipe=FOLDER/NAME; each folder's README.md explains them):"]
    recipes = recipe_names(conf / "recipe")
    # the names start in one column, past the longest folder name (at least the usual 10)
    column = max([10, *(len(folder) + 2 for folder in recipes)])
    for folder, names in recipes.items():
        lines += textwrap.wrap(", ".join(names), width=96, initial_indent=f"  {folder + ':':{column}}",
                               subsequent_indent=" " * (column + 2), break_on_hyphens=False)
    lines.append("Tables (table=NAME):")
    lines += textwrap.wrap(", ".join(table_names(conf / "table")), width=96, initial_indent="  ",
                           subsequent_indent="  ")
    return text + "\n".join(lines) + "\n"
