"""The test harness's own promise for hangs: `run_ranks` gives up after its limit, and the failure
carries the stacks of the hung ranks and of the processes they forked. A GPU machine is lent for
minutes, so a hang seen only there (the loader-worker resume of tests/test_gpu.py) must name
where it waits in the one failure message a session gets back."""
from __future__ import annotations

import multiprocessing
import os
import time
from pathlib import Path

import pytest

from engine.launch.procs import alive
from tests.support.harness import run_ranks


def _loader_worker_waits_forever(pid_file: str) -> None:
    Path(pid_file).write_text(str(os.getpid()))
    while True:
        time.sleep(0.5)


def _rank_waits_for_its_worker(rank: int, world: int, tmp: str) -> None:
    # forked, as torch's DataLoader forks its workers on Linux
    worker = multiprocessing.get_context("fork").Process(
        target=_loader_worker_waits_forever, args=(str(Path(tmp) / f"worker_{rank}.pid"),))
    worker.start()
    worker.join()


def _ready(rank: int, world: int) -> int:
    return rank


def test_a_hang_fails_with_the_stacks_of_the_ranks_and_their_workers(tmp_path: Path) -> None:
    # the forkserver's first start imports torch and the project (tens of seconds on a loaded
    # machine): paid here, so that the limit below is the hung ranks' alone. A warm forkserver
    # starts a rank in a fraction of a second, so 12 s leave each rank ample time to fork its
    # worker and hang there; the limit is slept through whole, so longer only costs CI.
    assert run_ranks(_ready, 2, timeout=300) == [0, 1]
    with pytest.raises(AssertionError) as failure:
        run_ranks(_rank_waits_for_its_worker, 2, str(tmp_path), timeout=12)
    message = str(failure.value)
    assert "hung after 12" in message and "ranks [0, 1]" in message
    for rank in (0, 1):
        assert f"--- rank {rank} and the processes it started ---" in message
    # the ranks' frames and the forked workers' frames, from both ranks' files
    assert message.count("_rank_waits_for_its_worker") >= 2, message[-3000:]
    assert message.count("_loader_worker_waits_forever") >= 2, message[-3000:]
    # and nothing of the hung job is left running
    for rank in (0, 1):
        pid = int((tmp_path / f"worker_{rank}.pid").read_text())
        deadline = time.monotonic() + 10
        while alive(pid) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not alive(pid), f"the forked worker {pid} of rank {rank} still runs"
