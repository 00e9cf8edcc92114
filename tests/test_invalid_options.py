"""Every plugin's declared invalid settings fail before launch, in one line (exit code 2).

Each plugin lists next to its class the settings that cannot work (`invalid_options`: overrides
-> a fragment of the expected message). They go through the same steps cli.py takes before it
launches anything (Hydra composition, `engine.plan.preflight`: types, ranges, the plugin's
`validate` with the run's real optimizer settings and world); each must raise `UserError` whose
one line contains the fragment. One case also runs through cli.py itself to check the exit code
and that no rank started (the issue's: averaging AdamW's fields while training with SGD).
"""
from __future__ import annotations

from pathlib import Path

import pytest

from core.errors import UserError
from dist_algos import get_algorithm, list_algorithms
from tests.support.harness import CONF
from tests.support.cli_runs import error_line, run_cli_here

CASES = [(name, overrides, fragment) for name in list_algorithms()
         for overrides, fragment in get_algorithm(name).invalid_options.items()]


def preflight_of(overrides: list[str], run_dir: Path) -> None:
    """cli.py's steps before launch, in this process."""
    from hydra import compose, initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra
    from hydra.errors import HydraException
    from omegaconf.errors import OmegaConfBaseException

    from cli import one_line
    from core.rundir import RunDir
    from engine.config import register_schemas
    from engine.plan import preflight

    register_schemas()
    GlobalHydra.instance().clear()
    try:
        with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
            cpu = [] if any(o.startswith("dist.device=") for o in overrides) else ["dist.device=cpu"]
            raw = compose(config_name="config", overrides=[*overrides, *cpu])
    except (HydraException, OmegaConfBaseException) as err:
        raise UserError(one_line(err)) from None
    preflight(raw, RunDir(run_dir))


@pytest.mark.parametrize("name,overrides,fragment", CASES, ids=[f"{n}:{o}" for n, o, _ in CASES])
def test_declared_invalid_option_fails_before_launch(name: str, overrides: str, fragment: str, tmp_path: Path) -> None:
    with pytest.raises(UserError) as err:
        preflight_of([f"algo={name}", *overrides.split()], tmp_path)
    message = str(err.value)
    assert fragment in message, f"algo={name} {overrides}: {message!r} lacks {fragment!r}"
    assert "\n" not in message


def test_the_declared_cases_cover_the_plugins_with_options() -> None:
    """A plugin with options of its own declares at least one setting that must fail."""
    from dataclasses import fields

    from dist_algos.base import AlgoConfig

    base = {f.name for f in fields(AlgoConfig)}
    for name in list_algorithms():
        cls = get_algorithm(name)
        own = {f.name for f in fields(cls.Config)} - base
        assert not own or cls.invalid_options, (
            f"algo={name} has options {sorted(own)} but declares no `invalid_options` next to its class")


def test_optimizer_fields_the_optimizer_lacks_fail_before_launch(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    proc = run_cli_here(["algo=local_sgd", "algo.average_optimizer_fields=[exp_avg]", f"hydra.run.dir={run_dir}"])
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert "exp_avg needs optim=adamw" in error_line(proc)
    assert "[ERROR]" not in proc.stderr, "the error must come before DeepSpeed's launcher starts"
    assert not (run_dir / "logs").exists(), "no rank may have been launched"
