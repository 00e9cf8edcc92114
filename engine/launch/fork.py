"""`launch.launcher=fork`: one machine's ranks forked from cli.py instead of launched as new interpreters.

DeepSpeed's launcher starts every rank as a new Python process that composes Hydra's config,
imports torch and the project and plans the run again: about 10 s of CPU per rank, so 64 ranks on
a 2-core machine wait over 10 minutes for their first step. Here cli.py has already composed,
planned and imported all of that once; the ranks are forked from it (copy-on-write: the imported
modules and the data set in memory are shared until written) and each then does what a launched
rank does from `engine.rank.entry.main` on, unchanged: its own process group (gloo or NCCL,
env:// on a free port, as under the launcher), device, RNG, heartbeat, pid/exit/error files and
checkpoint.

The shape mirrors DeepSpeed's one-machine launch so that everything around it stays the same:

    cli.py (engine/launch/loop.py's loop: signals, the rank watch, stalls, the job's end)
      └─ the group leader (forked, its own session: what `deepspeed.launcher.launch` is)
           └─ rank 0 .. rank n-1 (forked, each with DeepSpeed's environment for its rank)

`ForkedRanks` is the leader as `run_launcher` sees a launcher: a process with `pid`, `poll`,
`wait` and `returncode`, whose session the second stop signal kills. The leader behaves as
DeepSpeed's per-node launcher does: it waits for its ranks; when one ends non-zero it kills the
others and exits with that code (a negative signal number as Python's `sys.exit` gives it, e.g.
247 for SIGKILL); a SIGTERM or SIGINT to it kills the ranks.

Fork safety (a child of a multi-threaded process inherits only the forking thread; a lock another
thread held stays locked forever in the child): cli.py calls `prepare_parent` before it plans
anything (GPUs counted through NVML, so CUDA stays uninitialised; torch on one thread, so no
OpenMP pool is started before the fork); the plan forks only from a process with no other Python
thread, no CUDA initialised and no process group (engine/launch/start.py: `launch.launcher=auto`
starts DeepSpeed's launcher instead, an explicit fork is refused in one line), and
`check_fork_safe` checks it again at the fork. Each rank sets
its thread count from OMP_NUM_THREADS (the machine's cores / its ranks, as under the launcher:
`engine.rank.entry.main` calls torch.set_num_threads), starts its torch, Python and numpy random
state as a new interpreter would, and flushes and leaves through `os._exit` so that nothing of
cli.py's (atexit handlers, the run lock, Hydra) runs twice.
"""
from __future__ import annotations

import importlib
import os
import random
import signal
import sys
import time
from types import FrameType
from typing import Callable, Optional

import numpy as np
import psutil
import torch

from core.stop_signals import STOP_SIGNALS
from engine.launch.commands import forked_rank_env
from engine.launch.start import fork_blocker

#: seconds between a rank's failure and the killing of the others (see `_lead`)
FAILED_RANK_GRACE_S = 1.0

#: the body of one rank: train as the rank the environment names, and end the process (as cli.py
#: ends a launched rank: engine.rank.entry.exit_process); returning, its value is the exit code
RankBody = Callable[[], int]

#: torch's default CPU generator as a new interpreter has it once the project is imported (the
#: state a launched rank starts from); a forked rank starts from it too, whatever cli.py drew since
_FRESH_TORCH_RNG = torch.get_rng_state()


def prepare_parent() -> int:
    """Make this process fit to fork ranks from, before it plans anything (engine/launch/job.py
    calls it first with launch.launcher=fork or auto); returns torch's thread count before, which
    a run that is not forked after all takes back. Count GPUs through NVML, not the CUDA runtime
    (which initialises the driver, after which a forked child cannot use CUDA); run torch on one
    thread here, so that no parallel region before the fork starts OpenMP's pool (GNU libgomp's
    children hang in their first parallel region when the parent had one). Each rank sets its
    own count from OMP_NUM_THREADS (engine.rank.entry.main), as a launched rank does; nothing this
    process computes with torch reaches a rank (the ranks plan again; the preloaded data is numpy's)."""
    os.environ.setdefault("PYTORCH_NVML_BASED_CUDA_CHECK", "1")
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    return threads


#: modules a rank imports lazily on its way to its first step, which cli.py has not imported by
#: then: torch.optim.Optimizer's constructor imports torch._dynamo (with sympy, triton's stubs and
#: FSDP: about 1 CPU s, forked rank after forked rank, most of a 64-rank start-up's CPU)
RANK_LAZY_IMPORTS = ("torch._dynamo",)


def import_rank_modules() -> None:
    """Import once, before the fork, what every rank would otherwise import for itself: after the
    fork each rank's imports are its own work and its own pages; before it, they are shared."""
    for name in RANK_LAZY_IMPORTS:
        importlib.import_module(name)


def check_fork_safe() -> None:
    """Refuse to fork ranks from a process whose state a child cannot use (`engine.launch.start.
    fork_blocker`: another Python thread, CUDA initialised, a process group). The plan has chosen
    the fork in this state already (`choose_start`), so this is a bug of the caller, not of the
    user's input: RuntimeError naming what is there."""
    blocked = fork_blocker()
    if blocked:
        raise RuntimeError(f"launch.launcher=fork: {blocked}, before forking the ranks")


class ForkedRanks:
    """The group leader of a forked launch, as `run_launcher` sees a launcher process (module docstring)."""

    def __init__(self, nproc: int, master_addr: str, port: int, base_env: dict[str, str], body: RankBody,
                 ignore_signal: Optional[int] = None) -> None:
        import_rank_modules()
        check_fork_safe()
        for stream in (sys.stdout, sys.stderr):  # else what is buffered is written once per process
            stream.flush()
        self.returncode: Optional[int] = None
        pid = os.fork()
        if pid == 0:  # the leader: never returns
            code = 1
            try:
                os.setsid()  # its own session, as run_launcher's Popen(start_new_session=True)
                # a fork keeps cli.py's Python handlers, an exec resets them: without this the
                # ranks would start with run_launcher's SIGUSR1 handler, which /proc reports as
                # caught, so the rank watch would deliver a stop before a rank had its own
                # handler, and that inherited copy would print it and drop it. The stop signals
                # start at their defaults, as in a launched rank, until the leader (`_lead`) and
                # each rank (engine.train.stop) install their own
                for sig in STOP_SIGNALS:
                    signal.signal(sig, signal.SIG_DFL)
                if ignore_signal is not None:  # the job manager's signal: not for the ranks
                    signal.signal(ignore_signal, signal.SIG_IGN)
                code = _lead(nproc, master_addr, port, base_env, body)
            finally:
                os._exit(code)
        self.pid = pid

    def poll(self) -> Optional[int]:
        if self.returncode is None:
            done, status = os.waitpid(self.pid, os.WNOHANG)
            if done:
                self.returncode = os.waitstatus_to_exitcode(status)
        return self.returncode

    def wait(self) -> int:
        if self.returncode is None:
            _, status = os.waitpid(self.pid, 0)
            self.returncode = os.waitstatus_to_exitcode(status)
        return self.returncode


def _lead(nproc: int, master_addr: str, port: int, base_env: dict[str, str], body: RankBody) -> int:
    """Fork the ranks, then wait for them as DeepSpeed's per-node launcher does."""
    ranks: dict[int, int] = {}  # pid -> rank

    def end_all(code: int) -> int:
        for pid in ranks:
            _kill_tree(pid)
        return code

    def on_signal(signum: int, frame: Optional[FrameType]) -> None:
        os._exit(end_all(1))

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    for rank in range(nproc):
        env = {**base_env, **forked_rank_env(nproc, master_addr, port, rank)}
        pid = os.fork()
        if pid == 0:
            _be_rank(env, body)
        ranks[pid] = rank
    alive = set(ranks)
    while alive:
        pid, status = os.waitpid(-1, 0)
        if pid not in alive:
            continue
        alive.discard(pid)
        code = os.waitstatus_to_exitcode(status)
        if code != 0:  # as DeepSpeed: the others are killed, the job ends with this code
            # DeepSpeed's launcher polls its ranks once a second, so the survivors go about a
            # second after the failed rank; so here, so that the rank watch (polling every 0.2 s)
            # sees the failed rank go first and names it, not a survivor killed with it
            time.sleep(FAILED_RANK_GRACE_S)
            return end_all(job_exit_code(code, alive)) & 0xFF
    return 0


def job_exit_code(first: int, alive: set[int]) -> int:
    """The job's exit code once a rank has ended with `first`: a signal's (negative) where one of
    the ranks that have ended by now was killed by one. A rank killed with -9 makes its peers fail
    with gloo's 'connection reset' within milliseconds, and on a loaded machine `waitpid(-1)` can
    return a peer first (the kernel lists children oldest first): the code must name the cause, as
    the rank watch names the killed rank (seen on a 16-core GPU machine under a parallel suite)."""
    codes = [first]
    for pid in list(alive):
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            alive.discard(pid)
            codes.append(os.waitstatus_to_exitcode(status))
    return min(codes) if min(codes) < 0 else first


def _be_rank(env: dict[str, str], body: RankBody) -> None:
    """Become one rank: its environment, signals and random state as a launched rank has them; never returns."""
    code = 1
    try:
        os.environ.clear()
        os.environ.update(env)
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        signal.signal(signal.SIGINT, signal.default_int_handler)
        torch.set_rng_state(_FRESH_TORCH_RNG)
        random.seed()  # from the OS's entropy, as a new interpreter seeds it
        np.random.seed()
        for stream in (sys.stdout, sys.stderr):  # python -u, as the launcher starts a rank
            stream.reconfigure(write_through=True)
        code = body()
    except BaseException:  # body() reports its own failures; this is a failure to become a rank
        import traceback

        traceback.print_exc()
    finally:
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except (OSError, ValueError):
                pass
        os._exit(code)


def _kill_tree(pid: int) -> None:
    """SIGKILL a rank and what it started (deepspeed.launcher.launch's terminate_process_tree)."""
    try:
        proc = psutil.Process(pid)
        procs = [*proc.children(recursive=True), proc]
    except psutil.Error:
        return
    for p in procs:
        try:
            p.kill()
        except psutil.Error:
            pass
