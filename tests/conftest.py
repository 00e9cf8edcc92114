"""Shared fixtures and markers. Multi-process tests spawn gloo ranks on the CPU (tests/support/harness.py),
and cli.py runs see no GPU (`cli_env`), so that bit-exact comparisons hold on a GPU machine too;
tests marked `gpu` need CUDA and are skipped without it."""
from __future__ import annotations

import os
import sys
import tempfile
import threading
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
os.environ.setdefault("OMP_NUM_THREADS", "1")


#: modules whose tests make network namespaces, sshd, SLURM daemons or tc qdiscs: one xdist worker
#: runs them one after another (each is several processes on two hosts; two at once only contend)
HOST_MODULES = {"test_multinode", "test_multinode_slurm", "test_ft_multinode", "test_network"}
#: modules whose module-scoped fixture starts gloo ranks or trains (4-20 s each on CI's machine):
#: an xdist group each, so that the fixture runs once in the suite, not once on each worker
RANK_FIXTURE_MODULES = {"test_wagma", "test_local_sgd", "test_lsgd", "test_easgd", "test_powersgd", "test_diloco",
                        "test_budgets", "test_error_feedback", "test_outer_loops", "test_comm_pattern"}
#: each module's xdist group (`--dist loadgroup` keeps a group on one worker): the emulated hosts
#: together; the data-pipeline module, whose data sets and per-pipeline reports are built once per
#: worker; each of RANK_FIXTURE_MODULES on its own
XDIST_GROUPS = {**dict.fromkeys(HOST_MODULES, "hosts"), "test_data_pipelines": "pipelines",
                **{module: module for module in RANK_FIXTURE_MODULES}}


def _keep_bytecode_for_children() -> None:
    """Where PYTHONDONTWRITEBYTECODE is set (this project's development and CI machines), every
    cli.py, launcher and rank process a test starts would compile the project's modules from
    source again; a bytecode cache of the suite's own (PYTHONPYCACHEPREFIX, outside the tree)
    lets each compile once. The running interpreter keeps its own flags; only children see it."""
    if os.environ.pop("PYTHONDONTWRITEBYTECODE", None):
        os.environ.setdefault("PYTHONPYCACHEPREFIX",
                              str(Path(tempfile.gettempdir()) / f"syncopt-test-pycache-{os.getuid()}"))


def pytest_configure(config: pytest.Config) -> None:
    _keep_bytecode_for_children()
    config.addinivalue_line("markers", "multinode: runs across emulated hosts (network namespaces)")
    config.addinivalue_line("markers", "slow: takes more than ~30 s")
    config.addinivalue_line("markers", "gpu: needs CUDA (skipped where none is visible)")


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Before pytest-xdist's own (which reads each item's xdist_group into the id its `loadgroup`
    scheduling goes by): run after it, the groups were added too late, and every module of
    XDIST_GROUPS was spread over both workers, its fixtures built on each (tests/test_xdist_groups.py)."""
    for item in items:
        group = XDIST_GROUPS.get(item.module.__name__.rsplit(".", 1)[-1]) if item.module is not None else None
        if group:
            item.add_marker(pytest.mark.xdist_group(group))
    import torch

    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


_EXIT_STATUS = {"code": 0}


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    _EXIT_STATUS["code"] = int(exitstatus)


@pytest.hookimpl(trylast=True)
def pytest_unconfigure(config: pytest.Config) -> None:
    """End the interpreter without joining threads a test left behind. A torchft request blocked
    on its quorum timeout (up to an hour) keeps its executor's thread alive, and
    concurrent.futures joins every such thread at exit: the summary is printed, then the process
    waits, and CI times out with every test passed. Name them, then leave with pytest's status."""
    left = [t for t in threading.enumerate()
            if t is not threading.main_thread() and t.is_alive() and not t.daemon]
    if not left:
        return
    names = ", ".join(sorted(t.name for t in left))
    sys.stdout.flush()
    print(f"conftest: {len(left)} thread(s) still running after the suite ({names}); "
          "exiting without waiting for them", file=sys.stderr, flush=True)
    os._exit(_EXIT_STATUS["code"])


@pytest.fixture
def cli_env() -> dict[str, str]:
    """Environment for running cli.py as a user would, quiet and single-threaded per rank."""
    env = dict(os.environ)
    env.pop("HYDRA_FULL_ERROR", None)
    for var in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT", "LOCAL_RANK"):
        env.pop(var, None)
    env["CUDA_VISIBLE_DEVICES"] = ""  # CPU ranks: these runs compare bit for bit with CPU references
    return env


@pytest.fixture(scope="module")
def hosts(tmp_path_factory: pytest.TempPathFactory):
    """Two emulated hosts (network namespaces, tests/support/emulated_hosts.py) for a module's multi-node
    tests; skipped where namespaces cannot be made; removed even when a test fails."""
    from tests.support.emulated_hosts import EmulatedHosts, namespaces_usable

    reason = namespaces_usable()
    if reason:
        pytest.skip(reason)
    made = EmulatedHosts(tmp_path_factory.mktemp("hosts"))
    try:
        yield made
    finally:
        made.close()
