"""`python cli.py --help`: what a new user needs on one screen.

Hydra's own help (still there as `--hydra-help`) opens with "cli is powered by Hydra", prints
the whole composed config, and lists every file of every config group, including recipe files
that only hold settings other recipes share. This help names the tool, the options people
change most, and the runnable recipes and tables, read from the config tree and the registries
so that it never goes stale.

Which recipes are runnable is what each file declares, not a guess from who includes it (a
guess once hid recipe=lm/shakespeare_cpu, the README's language-model command): a file that only
holds settings other recipes share says so, either by its name (`_*.yaml`) or by a line
`# syncopt: partial` (`PARTIAL`) with what it is shared by; every other recipe is listed.
"""
from __future__ import annotations

import textwrap
from pathlib import Path

from data import DATASETS
from engine.launch.start import AUTO_RULE
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
  launch.launcher=auto        {start_rule}
  launch.hostfile=PATH        several machines (docs/multinode.md)
  launch.max_restarts=N       re-launch a failed job from its last checkpoint, up to N times
  faults.kill=[RANK@STEP]     inject failures: kill, stall=[R@S:SEC], mtbf_s (docs/faults.md)
  logger=wandb                log to Weights & Biases (offline unless WANDB_MODE says otherwise)
  resume=auto|never|PATH      continue the run in hydra.run.dir (auto), or from a checkpoint
  hydra.run.dir=PATH          where the run writes (default runs/DATE/TIME)
  --cfg job                   print the composed config and exit
  --hydra-help                Hydra's help: every config group and option

"""


#: the line a recipe that only holds settings other recipes share carries (or its name starts with `_`)
PARTIAL = "# syncopt: partial"


def is_partial(path: Path) -> bool:
    """Whether the recipe declares itself partial: named `_*`, or a line starting with `PARTIAL`."""
    return path.stem.startswith("_") or any(line.startswith(PARTIAL) for line in path.read_text().splitlines())


def recipe_names(recipes: Path) -> dict[str, list[str]]:
    """Runnable recipes per folder: every recipe file but the tables and those that declare
    themselves partial (`is_partial`)."""
    found: dict[str, list[str]] = {}
    for path in sorted(recipes.glob("*/*.yaml")):
        if path.parent.name == "tables" or is_partial(path):
            continue
        found.setdefault(path.parent.name, []).append(path.stem)
    return found


def table_names(tables: Path) -> list[str]:
    return sorted(p.stem for p in tables.glob("*.yaml") if not p.stem.startswith("_"))


def usage_text(conf: Path) -> str:
    text = USAGE.format(algos=", ".join(ALGORITHMS.names()), models=", ".join(MODELS.names()),
                        datasets=", ".join(DATASETS.names()), start_rule=AUTO_RULE)
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
