"""Entry point of one launched rank (or of a single-process run): set up, train, report.

Everything a rank does before training that can fail on bad input raises `UserError`, which is
printed once (by rank 0) as one line, with exit code 2; other ranks exit with the same code
silently, and the launcher stops the job. A rank that fails unexpectedly logs its traceback to
`logs/rank_<r>.log` and leaves `logs/rank_<r>.error` with the one-line reason, which cli.py
quotes when it reports the failed job.
"""
from __future__ import annotations

import logging
import os
import shutil
import sys
import traceback
from pathlib import Path
from typing import Any, NoReturn, Optional

import torch
import torch.distributed as dist

from core.distenv import DistContext, apply_user_visible_devices, init_distributed, shutdown_distributed
from core.errors import USER_ERROR_EXIT, UserError
from core.rundir import SUPERVISED_ENV, USER_ERROR_PREFIX, RunDir
from engine.config import load_run_config
from engine.ft.config import Replica
from engine.plan import RunPlan, build_plan
from engine.rank.trainer import Trainer
from engine.train.heartbeat import Heartbeat


def setup_logging(run_dir: RunDir, rank: int, console: bool) -> None:
    run_dir.logs.mkdir(parents=True, exist_ok=True)
    fmt = logging.Formatter(f"%(asctime)s [rank {rank}] %(levelname)s %(message)s")
    root = logging.getLogger("syncopt")
    root.setLevel(logging.INFO)
    root.handlers.clear()
    fh = logging.FileHandler(run_dir.rank_log(rank))
    fh.setFormatter(fmt)
    root.addHandler(fh)
    sh = logging.StreamHandler(sys.stderr)
    sh.setFormatter(logging.Formatter("%(message)s" if console else f"[rank {rank}] %(levelname)s %(message)s"))
    sh.setLevel(logging.INFO if console else logging.WARNING)
    root.addHandler(sh)
    root.propagate = False


def agree_run_dir(run_dir: str) -> str:
    """All ranks use rank 0's run directory (ranks started by hand resolve ${now:} each)."""
    if dist.get_world_size() == 1:
        return run_dir
    box = [run_dir]
    dist.broadcast_object_list(box, src=0)
    mine = Path(run_dir)
    if box[0] != run_dir and mine.is_dir() and {p.name for p in mine.iterdir()} <= {".hydra"}:
        shutil.rmtree(mine, ignore_errors=True)  # what Hydra made for this rank's own ${now:}
    return box[0]


def main(raw_cfg: Any, run_dir: str) -> int:
    """Train as this process's rank; returns the exit code."""
    apply_user_visible_devices()  # before anything touches CUDA
    rank = int(os.environ.get("RANK", "0"))
    rundir = RunDir(Path(run_dir))
    beat: Optional[Heartbeat] = None
    try:
        cfg = load_run_config(raw_cfg)
        if "OMP_NUM_THREADS" in os.environ:
            torch.set_num_threads(int(os.environ["OMP_NUM_THREADS"]))
        ctx = init_distributed(cfg.dist.backend, cfg.dist.timeout_s, cfg.dist.device)
        rundir = RunDir(Path(agree_run_dir(run_dir)))
        replica = Replica.from_env(dict(os.environ))  # fault-tolerant mode: a world of one, its own run directory
        if replica is not None:
            rundir = RunDir(rundir.root / replica.run_dir_name())
        rundir.root.mkdir(parents=True, exist_ok=True)
        setup_logging(rundir, ctx.rank, console=ctx.rank == 0)
        rundir.rank_pid(ctx.rank).write_text(f"{os.getpid()} {os.uname().nodename}\n")
        rundir.rank_error(ctx.rank).unlink(missing_ok=True)
        beat = Heartbeat(rundir.rank_progress(ctx.rank)).start()
        plan = build_plan(cfg, rundir, replica.count if replica else ctx.world_size, ctx.local_size)
        train_rank(plan, ctx, beat, replica)
        shutdown_distributed()
        return _ended(rundir, rank, 0)
    except UserError as err:
        if os.environ.get(SUPERVISED_ENV):  # cli.py prints it once, from the file
            speak = not _leave_error(rundir, rank, f"{USER_ERROR_PREFIX}{err}")
        else:  # started by hand: rank 0 speaks for all
            speak = rank == 0
        if speak:
            print(f"syncopt: error: {err}", file=sys.stderr, flush=True)
        return _ended(rundir, rank, USER_ERROR_EXIT)
    except Exception as err:  # an unexpected failure: keep the evidence, name the rank
        line = f"{type(err).__name__}: {str(err).splitlines()[0] if str(err) else ''}"
        logging.getLogger("syncopt").error("rank %d failed: %s\n%s", rank, line, traceback.format_exc())
        _leave_error(rundir, rank, line)
        print(f"syncopt: rank {rank} failed: {line}", file=sys.stderr, flush=True)
        return _ended(rundir, rank, 1)
    finally:
        if beat is not None:
            beat.stop()


def train_rank(plan: RunPlan, ctx: DistContext, heartbeat: Optional[Heartbeat] = None,
               replica: Optional[Replica] = None) -> Optional[dict[str, Any]]:
    """Train this rank's part of the planned run; the summary on the reporting rank."""
    torch.manual_seed(plan.config.seed)
    trainer = Trainer(plan, ctx, replica)
    if heartbeat is not None:
        heartbeat.state = trainer.state  # the step it reports
    return trainer.run()


def _leave_error(rundir: RunDir, rank: int, line: str) -> bool:
    """Write this rank's one-line error beside its log (what cli.py quotes); False if it could not."""
    try:
        rundir.logs.mkdir(parents=True, exist_ok=True)
        rundir.rank_error(rank).write_text(line + "\n")
    except OSError:
        return False
    return True


def _ended(rundir: RunDir, rank: int, code: int) -> int:
    """Leave the exit code beside the pid file: the launching process then knows the job is over
    as soon as every rank has one, without waiting for the launcher's own polling and teardown."""
    try:
        if rundir.logs.is_dir():
            rundir.rank_exit(rank).write_text(f"{code}\n")
    except OSError:
        pass
    return code


def exit_process(code: int) -> NoReturn:
    """End a launched rank now that its work is written: flush what it printed and logged, then
    leave without the interpreter's teardown.

    That teardown destroys torch's C++ objects (gloo contexts and their transport threads,
    process groups a plugin still references) in no defined order; now and then a thread is
    still joinable when its owner goes, and the rank dies of SIGABRT ("terminate called without
    an active exception") after a successful run, which the launcher reports as a failed job. It
    also costs a second or more per rank. Everything a rank must leave behind (checkpoints,
    metrics, summary, wandb files, logs) is written and closed before this point.
    """
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):
            pass
    logging.shutdown()
    os._exit(code)
