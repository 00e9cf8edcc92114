"""The suite's own scheduling: pytest.ini runs it on two pytest-xdist workers with `--dist loadgroup`,
and two kinds of module rely on their `xdist_group` keeping them on one worker: the emulated-host
modules (conftest.py's HOST_MODULES: network namespaces, sshd and SLURM daemons, which only contend
two at a time), tests/test_data_pipelines.py and conftest.py's RANK_FIXTURE_MODULES (their data
sets, per-pipeline reports and module-scoped ranks are built once per worker), all named in
XDIST_GROUPS. pytest 9.2 with pytest-xdist 3.8 dropped every group without a word (a test's name
became a structured id that xdist cannot suffix), so requirements.txt pins pytest 9.1.1; this fails
if a version change drops them again.
"""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent

GROUPED = '''
import os
import time
from pathlib import Path

import pytest

OUT = Path(__file__).parent / "ran"


def record(kind: str, i: int) -> None:
    time.sleep(0.2)  # long enough that an idle worker would take the next test
    (OUT / f"{kind}_{i}").write_text(os.environ["PYTEST_XDIST_WORKER"])


@pytest.mark.xdist_group("together")
@pytest.mark.parametrize("i", range(6))
def test_grouped(i: int) -> None:
    record("grouped", i)


@pytest.mark.parametrize("i", range(6))  # ungrouped, beside them, as in the suite
def test_free(i: int) -> None:
    record("free", i)
'''


#: a module grouped the suite's way: by its name in conftest.py's XDIST_GROUPS, through the suite's
#: own collection hook (a group added after pytest-xdist's hook had read them counts for nothing)
NAMED = GROUPED.split("@pytest.mark.xdist_group")[0] + '''
@pytest.mark.parametrize("i", range(6))
def test_named(i: int) -> None:
    record("named", i)
'''
SUITE_HOOK = f'''
import sys
sys.path.insert(0, {str(REPO)!r})
from tests import conftest as suite

suite.XDIST_GROUPS["test_named"] = "named"
pytest_collection_modifyitems = suite.pytest_collection_modifyitems
'''


def test_an_xdist_group_runs_on_one_worker(tmp_path: Path) -> None:
    (tmp_path / "ran").mkdir()
    (tmp_path / "test_grouped.py").write_text(GROUPED)
    (tmp_path / "test_named.py").write_text(NAMED)
    (tmp_path / "conftest.py").write_text(SUITE_HOOK)
    # the repository's pytest.ini (its -n and --dist), on throw-away test files
    proc = subprocess.run([sys.executable, "-m", "pytest", "-c", str(REPO / "pytest.ini"), "--rootdir", str(tmp_path),
                           "-p", "no:cacheprovider", "-q", str(tmp_path / "test_grouped.py"),
                           str(tmp_path / "test_named.py")],
                          cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    # each test read its worker's name (a run without xdist workers fails there, on a KeyError)
    ran = {p.name: p.read_text() for p in (tmp_path / "ran").iterdir()}
    assert len(ran) == 18
    for kind in ("grouped", "named"):
        workers = {w for name, w in ran.items() if name.startswith(f"{kind}_")}
        assert len(workers) == 1, f"{kind}: ran on {sorted(workers)}: `--dist loadgroup` ignored its xdist_group"
