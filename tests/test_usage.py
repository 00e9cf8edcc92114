"""`python cli.py --help` (engine/usage.py): every runnable recipe listed, as the recipe itself
declares (the README's and the docs' recipes among them), and recipe folders laid out in one
column whatever their length: a long folder name (the issue's `hier_local_sgd`) must not run into
its recipes."""
from __future__ import annotations

import re
from pathlib import Path

from engine.usage import PARTIAL, recipe_names, usage_text
from tests.support.harness import CONF


def test_long_recipe_folder_names_keep_their_recipes_apart(tmp_path: Path) -> None:
    for folder, names in {"qsr": ["cpu_qsr", "cpu_linear"], "hier_local_sgd": ["cpu_hier_local_sgd"]}.items():
        (tmp_path / "recipe" / folder).mkdir(parents=True)
        for name in names:
            (tmp_path / "recipe" / folder / f"{name}.yaml").write_text("# @package _global_\n")
    (tmp_path / "table").mkdir()
    text = usage_text(tmp_path)
    assert "hier_local_sgd:cpu" not in text
    rows = {line.split(":")[0].strip(): line for line in text.splitlines() if line.startswith("  ") and ":" in line
            and line.split(":")[0].strip() in ("qsr", "hier_local_sgd")}
    starts = {folder: line.index("cpu_") for folder, line in rows.items()}
    assert set(starts) == {"qsr", "hier_local_sgd"} and len(set(starts.values())) == 1, rows
    assert starts["qsr"] > len("  hier_local_sgd:")


#: `recipe=...` forms the docs use as placeholders, not as a recipe's name
PLACEHOLDERS = {"path/name"}


def documented_recipes() -> dict[str, str]:
    """Every `recipe=FOLDER/NAME` that README.md and docs/*.md name -> the file naming it first."""
    repo = Path(__file__).resolve().parents[1]
    found: dict[str, str] = {}
    for doc in [repo / "README.md", *sorted((repo / "docs").glob("*.md"))]:
        for name in re.findall(r"recipe=([a-z0-9_]+/[a-z0-9_]+)\b", doc.read_text()):
            if name not in PLACEHOLDERS:
                found.setdefault(name, doc.name)
    return found


def test_every_recipe_the_readme_and_docs_name_is_listed_by_help() -> None:
    """`--help` lists what the README tells a newcomer to run (it once hid recipe=lm/shakespeare_cpu)."""
    documented = documented_recipes()
    assert "lm/shakespeare_cpu" in documented and "qsr/cpu_qsr" in documented, documented
    listed = {f"{folder}/{name}" for folder, names in recipe_names(CONF / "recipe").items() for name in names}
    missing = {name: doc for name, doc in documented.items() if name not in listed}
    assert not missing, f"named in the docs but not listed by cli.py --help (or no such recipe): {missing}"


def test_a_recipe_is_listed_unless_it_declares_itself_partial(tmp_path: Path) -> None:
    """The declaration decides, not who includes the file: a recipe another one includes and that
    chooses no algorithm (what the old guess took for partial) is listed; a file marked partial
    or named `_*` is not."""
    folder = tmp_path / "lm"
    folder.mkdir()
    (folder / "base_cpu.yaml").write_text("# @package _global_\ndefaults:\n  - override /data: shakespeare_char\n")
    (folder / "long_cpu.yaml").write_text("# @package _global_\ndefaults:\n  - /recipe/lm/base_cpu\n")
    (folder / "shared.yaml").write_text(f"# @package _global_\n{PARTIAL} (the settings lm/* share)\ntrain:\n  epochs: 3\n")
    (folder / "_common.yaml").write_text("# @package _global_\ntrain:\n  epochs: 3\n")
    assert recipe_names(tmp_path) == {"lm": ["base_cpu", "long_cpu"]}
