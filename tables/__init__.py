"""Paper tables by one command (`python cli.py table=NAME`), above the engine, which knows nothing
of them: the table config and directory layout (`config`), the headline metric's direction
(`measure`), the tuning (`tuning`, and as the runner makes it, `tuning_runs`), the per-seed results
and what each metric counts (`runs`), intervals and tests (`stats`), the ranges they are cut at and
the rows marked unstable (`ranges`), the family of comparisons (`compare`), the power of each
comparison (`power`) and what the table resolves per variant and per row (`resolution`), the
machines the runs ran on (`machines`), each row set beside other tasks' tables (`cross_task`),
provenance (`provenance`), the jobs' record (`jobs`), the one reader of finished runs
(`run_records`), the store carried between machines (`store`) and its sealed form (`sealed`, sealed
by `python -m tables.seal`; its curves read by `python -m tables.curves`), a published runs.csv read
as runs (`runs_csv`), the results (`render`, with its sections `render_family` and
`render_tuning`), figures (`plots`: curves; `plot_levels`: each row's final value; `plot_style`)
and the runner that makes the rows' runs (`runner`)."""
from __future__ import annotations

from hydra.core.config_store import ConfigStore

from tables.config import TableConfig


def register_table_schema() -> None:
    """The typed node under every `recipes/tables/*.yaml` (`defaults: [_schema, _self_]`): Hydra's
    `table/_schema`, registered by the commands that compose tables (cli.py), not by the engine."""
    ConfigStore.instance().store(group="table", name="_schema", node=TableConfig)
