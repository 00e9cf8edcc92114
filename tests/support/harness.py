"""Running code on several gloo ranks from a test, without the launcher.

`run_ranks(fn, world_size, *args)` starts `world_size` spawned processes that initialise
torch.distributed (gloo, a fresh TCP store) with the same environment a launcher gives, on the
CPU unless the test asks for `device="auto"` (so the suite runs alike on a GPU machine; an
`env` with LOCAL_SIZE below the world size lays the ranks out over several nodes), call
`fn(rank, world_size, *args)`, and return each rank's result (anything torch.save can write).
A rank that raises fails the test with its traceback; a hang fails it after `timeout` seconds,
with the Python stacks of every thread of the hung ranks and of the processes they started
(loader workers, say), so that a hang seen only on another machine names where it waits.

`compose(overrides)` builds a validated `RunConfig` exactly as cli.py would, for trainer runs
inside those ranks (`train_in_rank`); `rank_config` composes one for every rank to share.

Trainer runs in these ranks draw no plots (curves.png, a schedule plot) unless the test asks
(`plots=True`): the reporting rank spends about 0.5 s of CPU on each, more than a test's short
run trains, and the suite's hundreds of such runs are compared by their checkpoints, metrics and
summaries. Runs through cli.py (tests/test_cli.py, the tables, the launchers) draw them.
"""
from __future__ import annotations

import faulthandler
import os
import signal
import tempfile
import time
import traceback
from pathlib import Path
from typing import Any, Callable

import torch
import torch.multiprocessing as mp

from engine.launch.commands import free_port  # noqa: F401 - the tests' ports: below the ephemeral range
from engine.launch.procs import descendants

REPO = Path(__file__).resolve().parents[2]
CONF = REPO / "conf"


def _entry(rank: int, world_size: int, port: int, out_dir: str, fn: Callable, args: tuple,
           env: dict[str, str], device: str, plots: bool) -> None:
    # SIGUSR2 writes every thread's stack to a file run_ranks reads when it gives up on the rank.
    # The handler and the open file survive fork, so the processes this rank forks (loader
    # workers) answer it too, into the same file. (SIGUSR1 is the trainer's stop request.)
    stacks = open(Path(out_dir) / f"rank_{rank}.stacks", "a")
    faulthandler.register(STACKS_SIGNAL, file=stacks, all_threads=True)
    local_size = int(env.pop("LOCAL_SIZE", world_size))  # fewer than world_size: several "nodes"
    os.environ.update({"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port), "RANK": str(rank),
                       "WORLD_SIZE": str(world_size), "LOCAL_RANK": str(rank % local_size),
                       "LOCAL_SIZE": str(local_size), "OMP_NUM_THREADS": "1", **env})
    torch.set_num_threads(1)
    if not plots:
        no_run_plots()
    out = Path(out_dir) / f"rank_{rank}.pt"
    try:
        import torch.distributed as dist

        from core.distenv import init_distributed

        init_distributed("gloo", timeout_s=float(env.get("SYNCOPT_TEST_TIMEOUT", 60)), device=device)
        # gloo returns from forming the group on one rank while a peer may still be finishing its
        # side of their connection: a rank whose fn needs no collective (a warm-up) could then
        # exit and close that connection under the peer ("Gloo connectFullMesh failed ...
        # Connection closed by peer" at rank 1's init, seen once in CI). No rank goes on until
        # every rank has formed the group.
        dist.barrier()
        result = fn(rank, world_size, *args)
        torch.save({"ok": True, "result": result}, out)
        dist.destroy_process_group()
    except BaseException:  # report, do not hang the others
        torch.save({"ok": False, "error": traceback.format_exc()}, out)
        os._exit(1)


#: the signal at which a test rank, and every process it forked, writes its threads' stacks
STACKS_SIGNAL = signal.SIGUSR2


def _signal(pids: list[int], sig: int) -> int:
    """Sends `sig` to each of `pids` that still exists; how many it reached."""
    reached = 0
    for pid in pids:
        try:
            os.kill(pid, sig)
            reached += 1
        except ProcessLookupError:
            pass
    return reached


def _stacks_of_hung(procs: list[Any], hung: list[int], out_dir: str, limit: int = 12000) -> str:
    """Asks each hung rank and its descendants for their stacks (`STACKS_SIGNAL`) and returns
    what they wrote, the end of each rank's file where it is long."""
    asked = {r: _signal([procs[r].pid, *descendants(procs[r].pid)], STACKS_SIGNAL) for r in hung}
    paths = {r: Path(out_dir) / f"rank_{r}.stacks" for r in hung}

    def read(r: int) -> str:
        return paths[r].read_text(errors="replace") if paths[r].exists() else ""

    # each process answers with one "Current thread" block: wait for all of them (a loaded
    # machine may take a while to schedule them), at most 10 s
    deadline = time.monotonic() + 10.0
    while time.monotonic() < deadline and any(read(r).count("Current thread") < n for r, n in asked.items()):
        time.sleep(0.1)
    return "\n".join(f"--- rank {r} and the processes it started ---\n{read(r)[-limit:] or '(nothing written)'}"
                     for r in hung)


_CTX = None


def _context() -> Any:
    """A forkserver that has imported torch and the project once: ranks start in ~0.1 s
    instead of re-importing everything (spawn), without fork's hazards in a threaded parent."""
    global _CTX
    if _CTX is None:
        _CTX = mp.get_context("forkserver")
        # torch._dynamo: every optimizer's constructor imports it on first use (10-20 s per rank
        # on a loaded machine, paid again in every run_ranks call unless the server holds it)
        _CTX.set_forkserver_preload(["torch", "torch.distributed", "torch._dynamo", "tests.support.harness",
                                     "tests.support.plugin_harness", "engine.rank.trainer", "cli", "dist_algos",
                                     "data.sets.digits"])
    return _CTX


def run_ranks(fn: Callable, world_size: int, *args: Any, timeout: float = 120.0,
              env: dict[str, str] | None = None, device: str = "cpu", plots: bool = False) -> list[Any]:
    """fn(rank, world_size, *args) on `world_size` gloo ranks; returns the results by rank.
    `device`: the ranks' `dist.device` (auto: share the GPUs where there are any); `plots`: let
    trainer runs draw their plots (the module's docstring says why they do not by default)."""
    with tempfile.TemporaryDirectory() as tmp:
        ctx = _context()
        port = free_port()
        procs = [ctx.Process(target=_entry, args=(r, world_size, port, tmp, fn, args, dict(env or {}), device, plots))
                 for r in range(world_size)]
        for p in procs:
            p.start()
        deadline = time.monotonic() + timeout  # one limit for all ranks, not one each
        for p in procs:
            p.join(max(deadline - time.monotonic(), 0.0))
        hung = [r for r, p in enumerate(procs) if p.is_alive()]
        stacks = _stacks_of_hung(procs, hung, tmp) if hung else ""
        for p in procs:
            if p.is_alive():
                _signal(descendants(p.pid), signal.SIGKILL)
                p.kill()
        results = []
        for r in range(world_size):
            path = Path(tmp) / f"rank_{r}.pt"
            if not path.exists():
                raise AssertionError(f"rank {r} produced no result" + (
                    f" (hung after {timeout}s: ranks {hung}); their stacks:\n{stacks}" if hung else ""))
            got = torch.load(path, weights_only=False)
            if not got["ok"]:
                raise AssertionError(f"rank {r} failed:\n{got['error']}")
            results.append(got["result"])
        return results


def compose(overrides: list[str], run_dir: str | Path | None = None) -> Any:
    """A validated RunConfig from cli.py's config tree and these overrides; a mistake is the
    one-line `UserError` cli.py would print. Ranks train on the CPU (`dist.device=cpu`) unless
    the overrides say otherwise, so that bit-exact comparisons hold on a GPU machine too."""
    from hydra import compose as hydra_compose
    from hydra import initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra
    from hydra.errors import HydraException
    from omegaconf.errors import OmegaConfBaseException

    from cli import one_line
    from core.errors import UserError
    from engine.config import load_run_config, register_schemas

    register_schemas()
    GlobalHydra.instance().clear()
    try:
        with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
            if not any(o.startswith("dist.device=") for o in overrides):
                overrides = [*overrides, "dist.device=cpu"]
            cfg = hydra_compose(config_name="config", overrides=overrides)
    except (HydraException, OmegaConfBaseException) as err:
        raise UserError(one_line(err)) from None
    return load_run_config(cfg)


def no_run_plots() -> None:
    """This process's trainer runs draw no curves.png or schedule plot (`run_ranks` without
    `plots=True`; the module's docstring says why)."""
    import engine.report.run_report as run_report

    run_report.plot_run = run_report.plot_series = lambda *args, **kwargs: None


def rank_config(overrides: list[str]) -> Any:
    """The RunConfig a test rank trains with these overrides (no progress bar). Composed once by
    the test and handed to every rank (`plan_in_rank`), it spares each rank its own composition
    (about 0.25 s of CPU each, which the registry-wide tests repeat hundreds of times)."""
    return compose(overrides + ["train.progress=false"])


def plan_in_rank(run: list[str] | Any, run_dir: str) -> Any:
    """The run plan this rank's trainer gets (the world from the launched environment), for
    overrides (composed here) or a `rank_config`."""
    from core.distenv import init_distributed
    from core.rundir import RunDir
    from engine.plan import build_plan

    cfg = rank_config(run) if isinstance(run, list) else run
    ctx = init_distributed(cfg.dist.backend, cfg.dist.timeout_s, cfg.dist.device)
    return build_plan(cfg, RunDir(Path(run_dir)), ctx.world_size, ctx.local_size), ctx


def train_in_rank(rank: int, world_size: int, run: list[str] | Any, run_dir: str) -> Any:
    """Run the real trainer on this rank, for overrides or a `rank_config`; returns the summary
    (reporting rank) or None."""
    from engine.rank.entry import train_rank

    plan, ctx = plan_in_rank(run, run_dir)
    return train_rank(plan, ctx)
