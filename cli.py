#!/usr/bin/env python
"""syncopt: one command for distributed-training experiments.

    python cli.py                                  # the embedded default: digits, 4 ranks, allreduce
    python cli.py recipe=qsr/cpu_qsr               # an experiment from recipes/
    python cli.py algo=local_sgd launch.nproc=2 train.epochs=5 hydra.run.dir=runs/try
    python cli.py --cfg job                        # print the composed config

Outside a launched rank, this validates the config, then re-executes itself through DeepSpeed's
launcher (or torchrun) with the run directory fixed; inside a launched rank (RANK, WORLD_SIZE,
MASTER_ADDR, MASTER_PORT set) it trains. See README.md.
"""
from __future__ import annotations

import sys
from pathlib import Path

import hydra
from omegaconf import DictConfig

from engine.errors import USER_ERROR_EXIT, UserError, report_user_errors


def preflight(cfg: DictConfig, run_dir: Path) -> object:
    """Every check that can be made before launching: config types and names, world size
    against the algorithm and the data set, data on disk, and the checkpoint to resume."""
    from data import num_train_samples
    from data.preflight import check_data_on_disk
    from dist_algos import get_algorithm
    from engine import checkpoint as ckpt
    from engine.config import load_run_config
    from engine.launch_config import launch_shape
    from engine.trainer import resume_fixed

    run_cfg = load_run_config(cfg.copy(), str(run_dir))
    world, per_node = launch_shape(run_cfg.launch)
    if run_cfg.launch.launcher == "none" and run_cfg.launch.nproc != 1:
        raise UserError(f"launch.launcher=none trains in this one process; set launch.nproc=1 "
                        f"(not {run_cfg.launch.nproc}) or pick launch.launcher=deepspeed")
    algo = get_algorithm(run_cfg.algo.name)
    algo.validate(run_cfg.algo, world, per_node)
    n_train = algo.num_train_ranks(run_cfg.algo, world)
    tr = run_cfg.train
    per_rank = tr.global_batch_size // n_train if tr.global_batch_size else tr.batch_size
    if tr.global_batch_size and tr.global_batch_size % n_train:
        raise UserError(f"train.global_batch_size={tr.global_batch_size} is not divisible by the "
                        f"{n_train} training ranks; change it or launch.nproc")
    samples = num_train_samples(run_cfg.data)
    if samples is not None and per_rank * n_train > samples:
        raise UserError(f"launch.nproc={world}: {n_train} training ranks x batch {per_rank} is more than "
                        f"the {samples} training samples of {run_cfg.data.name}; use fewer ranks or a smaller batch")
    check_data_on_disk(run_cfg.data)
    fixed = resume_fixed(run_cfg, world)
    if run_cfg.resume == "auto":
        found = ckpt.complete_checkpoints(run_dir)
        if found:
            problem = ckpt.compatibility_problem(found[0], fixed)
            if problem:
                raise UserError(problem)
    elif run_cfg.resume not in (None, "null", "none"):
        found_one = ckpt.resolve_checkpoint(run_cfg.resume)
        if found_one is None:
            raise UserError(f"resume={run_cfg.resume}: no complete checkpoint there")
        problem = ckpt.compatibility_problem(found_one, fixed)
        if problem:
            raise UserError(problem)
    return run_cfg


def register_schemas() -> None:
    """Typed defaults that table configs extend (`defaults: [_schema, _self_]`), so that
    options such as table.dry_run exist without every table file spelling them out."""
    from hydra.core.config_store import ConfigStore

    from engine.tables import TableConfig

    ConfigStore.instance().store(group="table", name="_schema", node=TableConfig)


register_schemas()


@hydra.main(version_base="1.3", config_path="conf", config_name="config")
def main(cfg: DictConfig) -> None:
    from hydra.core.hydra_config import HydraConfig

    from engine.distenv import inside_launched_rank

    hc = HydraConfig.get()
    run_dir = Path(hc.runtime.output_dir).resolve()
    if inside_launched_rank():
        from engine import rank_main

        sys.exit(rank_main.main(cfg, str(run_dir)))
    if cfg.get("table") is not None:
        from engine.tables import run_table

        with report_user_errors():
            sys.exit(run_table(cfg.table, run_dir))
    with report_user_errors():
        run_cfg = preflight(cfg, run_dir)
        if run_cfg.launch.no_ssh and not any(o.startswith("hydra.run.dir=") for o in hc.overrides.hydra):
            raise UserError("launch.no_ssh=true: give hydra.run.dir=PATH, the same on every node "
                            "(on storage they share), so that all nodes write one run")
    if run_cfg.launch.launcher == "none" or (run_cfg.launch.nproc == 1 and not _multi_node(run_cfg)):
        from engine import rank_main

        code = rank_main.main(cfg, str(run_dir))
    else:
        from engine.launch import launch

        code = launch(run_cfg.launch, run_dir, list(hc.overrides.task))
    from engine.launch import stopped_message

    note = stopped_message(run_dir) if code == 0 else None
    if note:
        print(f"syncopt: {note}", file=sys.stderr)
    if code and str(hc.mode) != "RunMode.MULTIRUN":
        sys.exit(code)
    if code:
        raise RuntimeError(f"job {hc.job.num} failed (exit code {code}); see {run_dir}/logs")


def _multi_node(run_cfg: object) -> bool:
    """A hostfile launch goes through DeepSpeed's runner even for one rank per node."""
    return bool(getattr(run_cfg.launch, "hostfile", None))


def one_line(err: BaseException) -> str:
    """Hydra's multi-line composition errors as one line (the value, then what would work)."""
    from hydra.errors import MissingConfigException

    text = str(err)
    if isinstance(err, MissingConfigException) and err.options:
        return f"{text.splitlines()[0].split(': ', 1)[-1]}; available: {', '.join(err.options)}"
    lines = [ln.strip() for ln in text.split("Config search path")[0].splitlines() if ln.strip()]
    cause = err.__cause__
    if cause is not None and str(cause).strip():
        lines.append(str(cause).splitlines()[0])
    keep = [ln for ln in lines if not ln.startswith(("full_key:", "object_type=", "reference_type="))]
    return "; ".join(dict.fromkeys(keep))


if __name__ == "__main__":
    # Let composition errors reach us (instead of Hydra's multi-line report) to print one line.
    import os

    os.environ.setdefault("HYDRA_FULL_ERROR", "1")
    try:
        main()
    except UserError as err:  # pragma: no cover - raised inside main is reported there
        print(f"syncopt: error: {err}", file=sys.stderr)
        sys.exit(USER_ERROR_EXIT)
    except Exception as err:
        from hydra.errors import HydraException
        from omegaconf.errors import OmegaConfBaseException

        if not isinstance(err, (HydraException, OmegaConfBaseException)):
            raise
        print(f"syncopt: error: {one_line(err)}", file=sys.stderr)
        sys.exit(USER_ERROR_EXIT)
