"""`python cli.py --help` (engine/usage.py) lays recipe folders out in one column whatever their
length: a long folder name (the issue's `hier_local_sgd`) must not run into its recipes."""
from __future__ import annotations

from pathlib import Path

from engine.usage import usage_text


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
