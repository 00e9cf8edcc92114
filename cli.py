#!/usr/bin/env python
"""syncopt: one command for distributed-training experiments.

    python cli.py                                  # the embedded default: digits, 4 ranks, allreduce
    python cli.py recipe=qsr/cpu_qsr               # an experiment from recipes/
    python cli.py algo=local_sgd launch.nproc=2 train.epochs=5 hydra.run.dir=runs/try
    python cli.py --cfg job                        # print the composed config

Inside a launched rank (RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT set) it trains; with `table=NAME`
it runs a paper table (tables/); with `project.run=DIR cluster=NAME` it projects a finished run's
time onto a cluster (projection/, docs/projection.md); otherwise it hands the composed config to one place,
engine.launch.job.start_job, which plans the run (validating it before anything starts) and starts
its ranks: through DeepSpeed's launcher (or torchrun) with the run directory fixed, or forked from
this process (launch.launcher=fork: everything is imported and planned once).
See README.md and docs/architecture.md.
"""
from __future__ import annotations

import os
import sys
from pathlib import Path

import hydra
from hydra.core.hydra_config import HydraConfig
from hydra.errors import HydraException, MissingConfigException
from omegaconf import DictConfig
from omegaconf.errors import OmegaConfBaseException

from core.distenv import inside_launched_rank
from core.errors import USER_ERROR_EXIT, UserError, report_user_errors
from core.rundir import RunDir
from core.schema import config_error_line
from engine.config import register_schemas
from engine.launch.job import check_output_dirs, start_job
from engine.rank import entry
from engine.usage import usage_text
from projection import register_project_schema
from projection.command import run_project
from tables import register_table_schema
from tables.runner import run_table

register_schemas()
register_table_schema()
register_project_schema()


@hydra.main(version_base="1.3", config_path="conf", config_name="config")
def main(cfg: DictConfig) -> None:
    hc = HydraConfig.get()
    run_dir = RunDir(Path(hc.runtime.output_dir).resolve())
    if inside_launched_rank():
        entry.exit_process(entry.main(cfg, str(run_dir.root)))
    if cfg.get("table") is not None:
        with report_user_errors():
            sys.exit(run_table(cfg.table, run_dir.root, cfg.get("cluster")))
    if (cfg.get("project") or {}).get("run") is not None:
        with report_user_errors():
            sys.exit(run_project(cfg.project, cfg.get("cluster")))
    code = start_job(cfg, run_dir, list(hc.overrides.task), list(hc.overrides.hydra), entry.main, entry.exit_process)
    if str(hc.mode) != "RunMode.MULTIRUN":
        entry.exit_process(code)  # everything is written; skip the interpreter's slow teardown
    if code:
        raise RuntimeError(f"job {hc.job.num} failed (exit code {code}); see {run_dir.logs}")


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
        check_output_dirs(sys.argv[1:])  # before Hydra makes the run directory
        main()
    except UserError as err:  # a folder that cannot be made; one raised inside main is reported there
        print(f"syncopt: error: {err}", file=sys.stderr)
        sys.exit(USER_ERROR_EXIT)
    except (HydraException, OmegaConfBaseException) as err:
        print(f"syncopt: error: {one_line(err)}", file=sys.stderr)
        sys.exit(USER_ERROR_EXIT)
