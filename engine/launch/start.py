"""Which start a run's ranks get: `launch.launcher=auto` (the default) decided, in one place.

Forking one machine's ranks from cli.py (engine/launch/fork.py) is the same run as DeepSpeed's
launcher to the last bit, and starts in a fraction of the time: no interpreter, Hydra composition,
imports and plan per rank (the default job: 0.68x a bare PyTorch DDP script against the
launcher's 1.12x, issue 87). So `auto` forks wherever forking can carry the run, and names the
launcher only for what the fork does not do:

- a hostfile (`launch.hostfile`: other machines' ranks, over pdsh or one cli.py per node) and an
  emulated cluster (`launch.network`: each node's ranks inside its namespace) go through
  DeepSpeed's launcher; so does fault-tolerant mode (`ft.enabled`), whose supervisor starts and
  restarts every replica as a process of its own;
- one rank that nothing supervises (no faults, no restarts) trains in cli.py itself (`none`), as
  it did under the launcher;
- a cli.py that cannot fork safely (CUDA initialised here, another Python thread, a process
  group: `fork_blocker`) starts the launcher instead, saying why in one line. An explicit
  `launch.launcher=fork` with CUDA initialised or a process group is refused in one line (a
  thread is looked for again at the fork itself, `engine.launch.fork.check_fork_safe`).

The plan (engine/plan.py's `preflight`) calls `choose_start` once, before anything is launched;
engine/launch/job.py then hands the chosen start to the ranks, whose config.yaml records it.
"""
from __future__ import annotations

import sys
import threading
from dataclasses import dataclass
from typing import Optional

import torch
import torch.distributed

from core.errors import UserError
from engine.launch.config import Launcher, LaunchConfig

#: what `launch.launcher=auto` does, in one line (cli.py --help and the docs say it)
AUTO_RULE = ("fork one machine's ranks from cli.py; DeepSpeed's launcher for a hostfile, launch.network "
             "or ft.enabled (deepspeed|torchrun|fork|none force one)")


@dataclass(frozen=True)
class Start:
    """The start a run gets: its launcher (never `auto`) and why, when that is not the usual one."""

    launcher: Launcher
    note: Optional[str] = None  # one line for the user when auto could not fork


def fork_blocker(threads: bool = True) -> Optional[str]:
    """Why this process cannot fork ranks now, or None: CUDA initialised (a forked child cannot use
    it), a process group (its sockets would be shared), and with `threads` a Python thread besides
    this one (its locks, logging's or tqdm's, would stay held forever in the children). Native
    pools that handle a fork themselves do not count: numpy's OpenBLAS shuts its own down around
    a fork; OpenMP's is kept from starting by engine.launch.fork.prepare_parent."""
    if torch.cuda.is_initialized():
        return "CUDA is initialised in cli.py, and ranks forked from it could not use it"
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        return "a process group exists in cli.py, whose connections forked ranks would share"
    others = [t.name for t in threading.enumerate() if t is not threading.current_thread()] if threads else []
    if others:
        return (f"cli.py has started {len(others)} thread(s) ({', '.join(others[:4])}), which forked ranks "
                "could deadlock on")
    return None


def _needs_launcher(launch: LaunchConfig, ft_enabled: bool) -> Optional[str]:
    """What of the run only DeepSpeed's launcher (or the fault-tolerant supervisor) starts."""
    if launch.hostfile:
        return f"launch.hostfile={launch.hostfile} (several machines)"
    if launch.network.emulated:
        return "launch.network (emulated nodes, each in its own namespace)"
    if ft_enabled:
        return "ft.enabled=true (the supervisor starts every replica as its own process)"
    return None


def choose_start(launch: LaunchConfig, ft_enabled: bool, supervised: bool) -> Start:
    """The start of a run with this `launch` section: an explicit launcher as given (fork checked),
    `auto` decided (module docstring). `supervised`: faults are injected or restarts allowed, which
    need a launching process that outlives the ranks (so one rank is launched, not trained here)."""
    if launch.launcher == Launcher.fork:
        needs = _needs_launcher(launch, ft_enabled)
        if needs:
            raise UserError(f"launch.launcher=fork starts one machine's ranks from cli.py and cannot run {needs}; "
                            "use launch.launcher=auto or deepspeed")
        # (a thread of the program that runs cli.py may still end before the fork, where
        # engine.launch.fork.check_fork_safe looks again; CUDA initialised stays so)
        blocked = fork_blocker(threads=False)
        if blocked:
            raise UserError(f"launch.launcher=fork: {blocked}; use launch.launcher=auto or deepspeed")
        return Start(Launcher.fork)
    if launch.launcher != Launcher.auto:
        return Start(launch.launcher)
    if _needs_launcher(launch, ft_enabled):
        return Start(Launcher.deepspeed)
    if launch.nproc == 1 and not supervised:
        return Start(Launcher.none)  # one rank trains in cli.py, as it always has
    blocked = fork_blocker()
    if blocked:
        return Start(Launcher.deepspeed, f"starting the ranks through DeepSpeed's launcher, not forked: {blocked}")
    return Start(Launcher.fork)


def announce(start: Start) -> None:
    """The one line a start that auto could not fork prints (nothing otherwise)."""
    if start.note:
        print(f"syncopt: note: {start.note}", file=sys.stderr, flush=True)

