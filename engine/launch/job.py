"""cli.py's one hand-off for a run: plan it, own its run directory, start it, and say how it ended.

Everything cli.py did after composing the config, in one place, so that following a run from the
command to its ranks reads down one path: `start_job` -> `preflight` (engine/plan.py) -> one of
the ways to start ranks (fault-tolerant supervisor, this process, or restart-all around one
launch, engine/launch/restart.py -> engine/launch/loop.py -> engine/launch/plans.py). What a rank
runs is handed in (`rank_main`, engine.rank.entry's): the launching side never imports the
rank's code; the two meet in the run directory's files.
"""
from __future__ import annotations

import sys
from collections.abc import Sequence
from typing import Callable

from omegaconf import DictConfig, OmegaConf

from core.errors import UserError, report_user_errors
from core.run_files import stopped_message
from core.rundir import RunDir
from data import preload as preload_data
from engine.ft.launch.over_ssh import launch_over_ssh
from engine.ft.launch.supervisor import supervise
from engine.launch.config import Launcher
from engine.launch.fork import prepare_parent
from engine.launch.loop import stall_after_s
from engine.launch.restart import launch_with_restarts
from engine.launch.run_lock import RunLock
from engine.plan import RunPlan, preflight

#: what a rank runs: (the composed config, the run directory) -> exit code (engine.rank.entry.main)
RankMain = Callable[[DictConfig, str], int]
#: how a forked rank ends its process with its code (engine.rank.entry.exit_process)
RankExit = Callable[[int], None]


def start_job(cfg: DictConfig, run_dir: RunDir, task_overrides: Sequence[str], hydra_overrides: Sequence[str],
              rank_main: RankMain, rank_exit: RankExit) -> int:
    """Plan the composed run, take its run directory, start its ranks the way its config asks and
    supervise them to the end; the job's exit code. `task_overrides`: the command line's config
    overrides (every launched rank composes the same config from them); `hydra_overrides`: its
    hydra.* ones (a multi-node run without ssh must name its shared run directory)."""
    if cfg.launch.launcher == Launcher.fork:
        prepare_parent()  # before anything touches torch: the ranks are forked from this process
    overrides = list(task_overrides)
    with report_user_errors():
        if cfg.launch.no_ssh and not any(o.startswith("hydra.run.dir=") for o in hydra_overrides):
            raise UserError("launch.no_ssh=true: give hydra.run.dir=PATH, the same on every node "
                            "(on storage they share), so that all nodes write one run")
        plan = preflight(cfg, run_dir)  # (its last line, on a GPU machine, says how ranks share the GPUs)
        launch_cfg = plan.config.launch
        if plan.config.ft.enabled and launch_cfg.launcher == Launcher.fork:
            raise UserError("launch.launcher=fork cannot be combined with ft.enabled=true (fault-tolerant mode "
                            "starts and restarts every replica as its own process); use launch.launcher=deepspeed")
        lock = RunLock(run_dir)
        # node 0's cli.py owns a shared directory (in fault-tolerant mode over ssh, the one pdsh starts there)
        over_ssh = bool(plan.config.ft.enabled and launch_cfg.hostfile and not launch_cfg.no_ssh)
        if not (launch_cfg.no_ssh and launch_cfg.node_rank) and not over_ssh:
            lock.acquire()  # held until the run ends
        save_hydra_record(run_dir, cfg, overrides)
    code = _run(plan, cfg, run_dir, overrides, over_ssh, rank_main, rank_exit)
    lock.release()
    note = stopped_message(run_dir) if code == 0 else None
    if note:
        print(f"syncopt: {note}", file=sys.stderr)
    return code


def _run(plan: RunPlan, cfg: DictConfig, run_dir: RunDir, overrides: list[str], over_ssh: bool,
         rank_main: RankMain, rank_exit: RankExit) -> int:
    """Start the planned job the one way its config asks; its exit code."""
    if over_ssh:  # a supervisor per node, started on every host through pdsh (engine/ft/launch/over_ssh.py)
        with report_user_errors():  # a host that fails the checks: one line
            return launch_over_ssh(plan.config.launch, run_dir, overrides)
    if plan.config.ft.enabled:  # one process per replica, restarted alone (engine/ft/launch/supervisor.py)
        return supervise(plan.config.ft, plan.config.launch, run_dir, plan.world_size, overrides,
                         stall_after_s(plan.config.dist.timeout_s))
    if in_this_process(plan):
        return rank_main(cfg, str(run_dir.root))

    def rank_body() -> int:  # a rank forked from here (launch.launcher=fork): what a launched rank runs
        rank_exit(rank_main(cfg, str(run_dir.root)))
        return 0  # (not reached: rank_exit ends the process)

    if plan.config.launch.launcher == Launcher.fork:
        preload_data(plan.config.data)  # once here, shared by the forked ranks
    return launch_with_restarts(plan, run_dir, overrides, rank_body)


def save_hydra_record(run_dir: RunDir, cfg: DictConfig, overrides: list[str]) -> None:
    """Hydra's own record of the run (.hydra/config.yaml, overrides.yaml), written only once the
    directory is ours: conf/config.yaml turns off Hydra's writing it before the job starts,
    which would overwrite the record of a run still going in the same directory."""
    run_dir.hydra_subdir.mkdir(parents=True, exist_ok=True)
    OmegaConf.save(cfg, run_dir.hydra_subdir / "config.yaml")
    OmegaConf.save(OmegaConf.create(overrides), run_dir.hydra_subdir / "overrides.yaml")


def in_this_process(plan: RunPlan) -> bool:
    """One rank on this machine trains here; a hostfile launch goes through DeepSpeed's runner
    even for one rank per node, and so does a run with faults or restarts (a killed rank must not
    take its supervisor with it)."""
    launch_cfg = plan.config.launch
    supervised = plan.config.faults.active or launch_cfg.max_restarts > 0
    return launch_cfg.launcher == Launcher.none or (launch_cfg.nproc == 1 and not launch_cfg.hostfile and not supervised)
