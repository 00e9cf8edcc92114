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
from pathlib import Path
from typing import Callable, Optional

import torch
from omegaconf import DictConfig, OmegaConf

from core.errors import UserError, report_user_errors
from core.user_paths import creatable_problem
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
    with report_user_errors():
        if cfg.launch.no_ssh and not any(o.startswith("hydra.run.dir=") for o in hydra_overrides):
            raise UserError("launch.no_ssh=true: give hydra.run.dir=PATH, the same on every node "
                            "(on storage they share), so that all nodes write one run")
        plan = plan_for_start(cfg, run_dir)
        launch_cfg = plan.config.launch
        overrides = with_start(cfg, list(task_overrides), launch_cfg.launcher)
        lock = RunLock(run_dir)
        # node 0's cli.py owns a shared directory (in fault-tolerant mode over ssh, the one pdsh starts there)
        over_ssh = bool(plan.config.ft.enabled and launch_cfg.hostfile and not launch_cfg.no_ssh)
        if not (launch_cfg.no_ssh and launch_cfg.node_rank) and not over_ssh:
            lock.acquire()  # held until the run ends
        save_hydra_record(run_dir, cfg, list(task_overrides))  # (the command line's own overrides)
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


def plan_for_start(cfg: DictConfig, run_dir: RunDir) -> RunPlan:
    """`preflight`, in a process made fit to fork ranks from first wherever the plan may fork them
    (launch.launcher=fork or auto: `prepare_parent`, before anything touches torch); a run that is
    not forked after all, or is refused, gets this process's own torch thread count back."""
    threads = prepare_parent() if str(cfg.launch.launcher) in (Launcher.fork, Launcher.auto) else None
    plan: Optional[RunPlan] = None
    try:
        plan = preflight(cfg, run_dir)  # (its last line, on a GPU machine, says how ranks share the GPUs)
        return plan
    finally:
        if threads is not None and (plan is None or plan.config.launch.launcher != Launcher.fork):
            torch.set_num_threads(threads)


def with_start(cfg: DictConfig, overrides: list[str], launcher: Launcher) -> list[str]:
    """Hand the start the plan chose (`launch.launcher=auto` decided) to the ranks, so that every
    rank's config.yaml records how the run was started: in the composed config a forked rank or
    this process trains with, and in the overrides a launched rank composes its config from."""
    OmegaConf.update(cfg, "launch.launcher", str(launcher))
    kept = [o for o in overrides if o.lstrip("+~").split("=", 1)[0] != "launch.launcher"]
    return [*kept, f"launch.launcher={launcher}"]


#: where Hydra puts a run, and a multirun's jobs, when the command line does not say (conf/config.yaml)
DEFAULT_OUTPUT = {"hydra.run.dir": "runs", "hydra.sweep.dir": "runs/multirun"}
#: Hydra's flags for a command that prints and exits, making no run directory
PRINT_ONLY = ("--cfg", "-c", "--info", "-i", "--hydra-help", "--shell-completion", "-sc")


def check_output_dirs(argv: Sequence[str]) -> None:
    """The folder the command will write to (hydra.run.dir, or hydra.sweep.dir with -m) can be
    made, checked from cli.py's arguments before Hydra makes it: a folder that cannot be ends in
    one line naming it (core.user_paths), not in the traceback of Hydra's own mkdir. A value
    with an interpolation (${now:...}) is checked up to it. A command that only prints (--cfg,
    --info) writes nothing and is not checked."""
    if any(a.split("=", 1)[0] in PRINT_ONLY for a in argv):
        return
    key = "hydra.sweep.dir" if any(a in ("-m", "--multirun") for a in argv) else "hydra.run.dir"
    given = [a.split("=", 1)[1] for a in argv if a.lstrip("+").split("=", 1)[0] == key and "=" in a]
    value = given[-1] if given else DEFAULT_OUTPUT[key]
    fixed = value.split("${", 1)[0]
    fixed = fixed if fixed.endswith("/") or fixed == value else str(Path(fixed).parent)
    problem = creatable_problem(Path(fixed or "."))
    if problem:
        raise UserError(f"{key}={value}: {problem}; give {key}=PATH, a folder this user can write")


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
