"""docs/writing_a_plugin.md's worked example, added the way the page says, passes the
registry-wide tests with no other file edited; without its reference it fails with the line
that says what to add.

The plugin and its reference are copied out of the page (the code blocks after its
`<!-- example: PATH -->` markers) into a copy of the repository (its tracked and unignored
files, under git of its own), and the registry-wide tests run on them there in a fresh pytest
process (the registry is filled at import). Not into the repository itself: every cli.py and
rank other tests start meanwhile (pytest-xdist's other worker) would find the plugin, and lose
it half-way (a SLURM sweep that pickled its config failed to find dist_algos.doc_example).
"""
from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
DOC = REPO / "docs" / "writing_a_plugin.md"
REGISTRY_TESTS = ["tests/test_reference_registry.py", "tests/test_resume_registry.py", "tests/test_invalid_options.py"]


def examples() -> dict[str, str]:
    """PATH -> code of every `<!-- example: PATH -->` block of the page."""
    found = re.findall(r"<!-- example: (\S+) -->\n```python\n(.*?)```", DOC.read_text(), re.S)
    return {path: code for path, code in found}


def git(*args: str, cwd: Path) -> str:
    return subprocess.run(["git", *args], cwd=cwd, capture_output=True, text=True, check=True).stdout


def git_status(tree: Path) -> set[str]:
    return {line[3:] for line in git("status", "--porcelain", "--untracked-files=all", cwd=tree).splitlines()}


def repository_copy(dest: Path) -> Path:
    """The repository's tracked and unignored files as they are now (edits included), committed
    to a git repository of their own so that what the example adds shows in `git status`. The
    tables' results (docs/results/: most of the repository's files, growing with each table, read
    by none of the tests the example runs) are left out."""
    listed = git("ls-files", "--cached", "--others", "--exclude-standard", "-z", cwd=REPO).split("\0")
    for rel in filter(lambda rel: rel and not rel.startswith("docs/results/"), listed):
        if (REPO / rel).is_file():
            (dest / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(REPO / rel, dest / rel)
    git("init", "-q", cwd=dest)
    git("add", "-A", cwd=dest)
    git("-c", "user.name=test", "-c", "user.email=test@localhost", "commit", "-q", "-m", "copy", cwd=dest)
    return dest


@pytest.fixture
def added(tmp_path: Path) -> dict[str, Path]:
    """Where the page's files go in a copy of the repository (none of them there yet)."""
    tree = repository_copy(tmp_path / "repo")
    files = {rel: tree / rel for rel in examples()}
    assert set(files) == {"dist_algos/doc_example.py", "tests/doc_example_reference.py"}, set(files)
    assert not any(p.exists() for p in files.values()), "the repository already holds the example"
    return files


def run_registry_tests(tree: Path, files: list[str] = REGISTRY_TESTS,
                       timeout: float = 600) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "pytest", *files, "-k", "doc_example", "-q", "-n", "0",
                           "-p", "no:cacheprovider"], cwd=tree, capture_output=True, text=True, timeout=timeout)


def test_the_worked_example_passes_the_registry_tests_and_fails_without_its_reference(
        added: dict[str, Path]) -> None:
    tree = added["dist_algos/doc_example.py"].parents[1]
    before = git_status(tree)
    for rel, code in examples().items():
        added[rel].write_text(code)
    assert git_status(tree) - before == set(added), "the example must need no other file"
    proc = run_registry_tests(tree)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-2000:]
    # reference equivalence, exact resume, the declared invalid setting: one test each
    assert re.search(r"\b3 passed\b", proc.stdout), proc.stdout[-2000:]

    plugin = added["dist_algos/doc_example.py"]
    plugin.write_text(re.sub(r"^    reference = .*\n", "", plugin.read_text(), flags=re.M))
    proc = run_registry_tests(tree, ["tests/test_reference_registry.py"])
    assert proc.returncode != 0
    assert "algo=doc_example declares no reference: add `reference = \"tests.support.references:NAME\"`" in proc.stdout
    assert "doc_example.py:" in proc.stdout and "(class DocExample)" in proc.stdout
