"""README.md stays true to the registry: its table of algorithms names every registered
algorithm once and nothing else, and a count of "registered algorithms" it states is the
registry's. A failure names the algorithm and the row to add or remove."""
from __future__ import annotations

import re
from pathlib import Path

from dist_algos import list_algorithms

README = Path(__file__).resolve().parent.parent / "README.md"


def table_algorithms(text: str) -> list[str]:
    """The `algo=` column of the algorithm table (the table whose header has `algo=`)."""
    lines = text.splitlines()
    header = next(i for i, line in enumerate(lines) if line.startswith("|") and "`algo=`" in line)
    column = [c.strip() for c in lines[header].strip("|").split("|")].index("`algo=`")
    names: list[str] = []
    for line in lines[header + 2:]:
        if not line.startswith("|"):
            break
        cell = [c.strip() for c in line.strip("|").split("|")][column]
        names += re.findall(r"`(\w+)`", cell)
    return names


def test_the_algorithm_table_lists_every_registered_algorithm_once() -> None:
    listed = table_algorithms(README.read_text())
    registered = list_algorithms()
    missing = [n for n in registered if n not in listed]
    assert not missing, (f"README.md's algorithm table (## Algorithms) lacks {missing}: add each to the "
                         "`algo=` column of its paper's row, or a row `| paper | `NAME` | what | recipes |`")
    unknown = [n for n in listed if n not in registered]
    assert not unknown, f"README.md's algorithm table lists {unknown}, which are not registered: remove them"
    twice = sorted({n for n in listed if listed.count(n) > 1})
    assert not twice, f"README.md's algorithm table lists {twice} more than once"


def test_stated_counts_of_registered_algorithms_are_the_registrys() -> None:
    words = {"one": 1, "two": 2, "three": 3, "four": 4, "five": 5, "six": 6, "seven": 7, "eight": 8,
             "nine": 9, "ten": 10}
    count = len(list_algorithms())
    for stated in re.findall(r"\b(\w+) registered algorithms\b", README.read_text()):
        value = words.get(stated.lower(), int(stated) if stated.isdigit() else None)
        if value is not None:
            assert value == count, f"README.md says {stated} registered algorithms; the registry has {count}"
