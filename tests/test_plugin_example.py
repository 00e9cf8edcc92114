"""docs/writing_a_plugin.md's worked example, added the way the page says, passes the
registry-wide tests with no other file edited; without its reference it fails with the line
that says what to add.

The plugin and its reference are copied out of the page (the code blocks after its
`<!-- example: PATH -->` markers) into the repository for the length of the test, and the
registry-wide tests run on them in a fresh pytest process (the registry is filled at import).
"""
from __future__ import annotations

import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
DOC = REPO / "docs" / "writing_a_plugin.md"
REGISTRY_TESTS = ["tests/test_reference_registry.py", "tests/test_resume_registry.py", "tests/test_invalid_options.py"]


def examples() -> dict[str, str]:
    """PATH -> code of every `<!-- example: PATH -->` block of the page."""
    found = re.findall(r"<!-- example: (\S+) -->\n```python\n(.*?)```", DOC.read_text(), re.S)
    return {path: code for path, code in found}


def git_status() -> set[str]:
    out = subprocess.run(["git", "status", "--porcelain", "--untracked-files=all"], cwd=REPO,
                         capture_output=True, text=True, check=True).stdout
    return {line[3:] for line in out.splitlines()}


@pytest.fixture
def added() -> Iterator[dict[str, Path]]:
    """The page's files written into the repository, removed afterwards whatever happens."""
    files = {rel: REPO / rel for rel in examples()}
    assert set(files) == {"dist_algos/doc_example.py", "tests/doc_example_reference.py"}, set(files)
    assert not any(p.exists() for p in files.values()), "a previous run left the example behind"
    try:
        yield files
    finally:
        for path in files.values():
            path.unlink(missing_ok=True)


def run_registry_tests(files: list[str] = REGISTRY_TESTS, timeout: float = 600) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "pytest", *files, "-k", "doc_example", "-q",
                           "-p", "no:cacheprovider"], cwd=REPO, capture_output=True, text=True, timeout=timeout)


def test_the_worked_example_passes_the_registry_tests_and_fails_without_its_reference(
        added: dict[str, Path]) -> None:
    before = git_status()
    for rel, code in examples().items():
        added[rel].write_text(code)
    assert git_status() - before == set(added), "the example must need no other file"
    proc = run_registry_tests()
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-2000:]
    # reference equivalence, exact resume, the declared invalid setting: one test each
    assert re.search(r"\b3 passed\b", proc.stdout), proc.stdout[-2000:]

    plugin = added["dist_algos/doc_example.py"]
    plugin.write_text(re.sub(r"^    reference = .*\n", "", plugin.read_text(), flags=re.M))
    proc = run_registry_tests(["tests/test_reference_registry.py"])
    assert proc.returncode != 0
    assert "algo=doc_example declares no reference: add `reference = \"tests.support.references:NAME\"`" in proc.stdout
    assert "doc_example.py:" in proc.stdout and "(class DocExample)" in proc.stdout
