#!/usr/bin/env python
"""syncopt: one command for distributed-training experiments.

    python cli.py                                  # the embedded default: digits, 4 ranks, allreduce
    python cli.py recipe=qsr/cpu_qsr               # an experiment from recipes/
    python cli.py algo=local_sgd launch.nproc=2 train.epochs=5 hydra.run.dir=runs/try
    python cli.py --cfg job                        # print the composed config

Outside a launched rank, this plans the run (validating the config before anything starts), then
re-executes itself through DeepSpeed's launcher (or torchrun) with the run directory fixed, or,
with launch.launcher=fork, forks the ranks from this process (everything is imported and
planned once); inside a launched rank (RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT set) it trains.
See README.md and docs/architecture.md.
"""
from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any

import hydra
from hydra.core.hydra_config import HydraConfig
from hydra.errors import HydraException, MissingConfigException
from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException

from core.distenv import inside_launched_rank
from core.errors import USER_ERROR_EXIT, UserError, report_user_errors
from core.run_files import stopped_message
from core.rundir import RunDir
from core.schema import config_error_line
from data import preload as preload_data
from engine.config import register_schemas
from engine.drivers.ft_over_ssh import launch_over_ssh
from engine.drivers.ft_supervisor import supervise
from engine.drivers.fork_ranks import prepare_parent
from engine.drivers.launcher import stall_after_s
from engine.drivers.restart import launch_with_restarts
from engine.drivers.run_lock import RunLock
from engine.drivers.table_runner import run_table
from engine.launch.config import Launcher
from engine.plan import RunPlan, preflight
from engine.rank import entry
from engine.usage import usage_text

register_schemas()


@hydra.main(version_base="1.3", config_path="conf", config_name="config")
def main(cfg: DictConfig) -> None:
    hc = HydraConfig.get()
    run_dir = RunDir(Path(hc.runtime.output_dir).resolve())
    if inside_launched_rank():
        entry.exit_process(entry.main(cfg, str(run_dir.root)))
    if cfg.get("table") is not None:
        with report_user_errors():
            sys.exit(run_table(cfg.table, run_dir.root))
    if cfg.launch.launcher == Launcher.fork:
        prepare_parent()  # before anything touches torch: the ranks are forked from this process
    with report_user_errors():
        if cfg.launch.no_ssh and not any(o.startswith("hydra.run.dir=") for o in hc.overrides.hydra):
            raise UserError("launch.no_ssh=true: give hydra.run.dir=PATH, the same on every node "
                            "(on storage they share), so that all nodes write one run")
        plan = preflight(cfg, run_dir)  # (its last line, on a GPU machine, says how ranks share the GPUs)
        launch_cfg = plan.config.launch
        if plan.config.ft.enabled and launch_cfg.launcher == Launcher.fork:
            raise UserError("launch.launcher=fork cannot be combined with ft.enabled=true (fault-tolerant mode "
                            "starts and restarts every replica as its own process); use launch.launcher=deepspeed")
        lock = RunLock(run_dir)
        # node 0's cli.py owns a shared directory (in fault-tolerant mode over ssh, the one pdsh starts there)
        over_ssh = plan.config.ft.enabled and launch_cfg.hostfile and not launch_cfg.no_ssh
        if not (launch_cfg.no_ssh and launch_cfg.node_rank) and not over_ssh:
            lock.acquire()  # held until the run ends
        save_hydra_record(run_dir, cfg, hc)
    if over_ssh:  # a supervisor per node, started on every host through pdsh (engine/drivers/ft_over_ssh.py)
        with report_user_errors():  # a host that fails the checks: one line
            code = launch_over_ssh(plan.config.launch, run_dir, list(hc.overrides.task))
    elif plan.config.ft.enabled:  # one process per replica, restarted alone (engine/drivers/ft_supervisor.py)
        code = supervise(plan.config.ft, plan.config.launch, run_dir, plan.world_size, list(hc.overrides.task),
                         stall_after_s(plan.config.dist.timeout_s))
    elif _in_this_process(plan):
        code = entry.main(cfg, str(run_dir.root))
    else:
        def rank_body() -> int:  # a rank forked from here (launch.launcher=fork): what a launched rank runs
            entry.exit_process(entry.main(cfg, str(run_dir.root)))

        if plan.config.launch.launcher == Launcher.fork:
            preload_data(plan.config.data)  # once here, shared by the forked ranks

        code = launch_with_restarts(plan, run_dir, list(hc.overrides.task), rank_body)
    lock.release()
    note = stopped_message(run_dir) if code == 0 else None
    if note:
        print(f"syncopt: {note}", file=sys.stderr)
    if str(hc.mode) != "RunMode.MULTIRUN":
        entry.exit_process(code)  # everything is written; skip the interpreter's slow teardown
    if code:
        raise RuntimeError(f"job {hc.job.num} failed (exit code {code}); see {run_dir.logs}")


def save_hydra_record(run_dir: RunDir, cfg: DictConfig, hc: Any) -> None:
    """Hydra's own record of the run (.hydra/config.yaml, overrides.yaml), written only once the
    directory is ours: conf/config.yaml turns off Hydra's writing it before the job starts,
    which would overwrite the record of a run still going in the same directory."""
    run_dir.hydra_subdir.mkdir(parents=True, exist_ok=True)
    OmegaConf.save(cfg, run_dir.hydra_subdir / "config.yaml")
    OmegaConf.save(OmegaConf.create(list(hc.overrides.task)), run_dir.hydra_subdir / "overrides.yaml")


def _in_this_process(plan: RunPlan) -> bool:
    """One rank on this machine trains here; a hostfile launch goes through DeepSpeed's runner
    even for one rank per node, and so does a run with faults or restarts (a killed rank must not
    take its supervisor with it)."""
    launch_cfg = plan.config.launch
    supervised = plan.config.faults.active or launch_cfg.max_restarts > 0
    return launch_cfg.launcher == Launcher.none or (launch_cfg.nproc == 1 and not launch_cfg.hostfile and not supervised)


def one_line(err: BaseException) -> str:
    """Hydra's multi-line composition errors as one line (the value, then what would work)."""
    if isinstance(err, MissingConfigException) and err.options:
        options = [o for o in err.options if not o.startswith("_")]
        return f"{str(err).splitlines()[0].split(': ', 1)[-1]}; available: {', '.join(options)}"
    if isinstance(err.__cause__, OmegaConfBaseException) or isinstance(err, OmegaConfBaseException):
        return config_error_line(err)
    text = str(err)
    lines = [ln.strip() for ln in text.split("Config search path")[0].splitlines() if ln.strip()]
    cause = err.__cause__
    if cause is not None and str(cause).strip():
        lines.append(str(cause).splitlines()[0])
    keep = [ln for ln in lines if not ln.startswith(("full_key:", "object_type=", "reference_type="))]
    return "; ".join(dict.fromkeys(keep))


if __name__ == "__main__":
    if any(arg in ("--help", "-h") for arg in sys.argv[1:]):  # Hydra's own: --hydra-help
        print(usage_text(Path(__file__).resolve().parent / "conf"), end="")
        sys.exit(0)
    # Let composition errors reach us (instead of Hydra's multi-line report) to print one line.
    os.environ.setdefault("HYDRA_FULL_ERROR", "1")
    try:
        main()
    except UserError as err:  # pragma: no cover - raised inside main is reported there
        print(f"syncopt: error: {err}", file=sys.stderr)
        sys.exit(USER_ERROR_EXIT)
    except (HydraException, OmegaConfBaseException) as err:
        print(f"syncopt: error: {one_line(err)}", file=sys.stderr)
        sys.exit(USER_ERROR_EXIT)
