"""`python cli.py table=papers_time`: the papers' wall-clock claims projected from their setups
(tables/papers_claims.py, tables/papers_time.py). The committed table is what the command writes;
a projected figure moves the way the network says it must; a claim file that loses a source, or
names a preset that does not exist, is refused in one line before anything is projected."""
from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest
import yaml

from core.errors import UserError
from tests.support.cli_runs import error_line, run_cli_here

REPO = Path(__file__).resolve().parent.parent
CLAIMS = REPO / "recipes" / "tables" / "papers_time.yaml"
COMMITTED = REPO / "docs" / "results" / "papers_time"


def claim_file() -> dict[str, Any]:
    return yaml.safe_load(CLAIMS.read_text())


def test_the_committed_table_is_what_the_command_writes(tmp_path: Path) -> None:
    """The table config composed as cli.py composes it, dispatched by the tables' runner (a table
    that declares `claims:`), regenerates docs/results/papers_time/table.md and table.csv byte for
    byte: the committed figures come from the committed presets, profiles and plugins, nothing else."""
    from hydra import compose, initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra

    import cli  # registers the schemas cli.py composes with
    from tables.runner import run_table

    assert cli.register_schemas
    GlobalHydra.instance().clear()
    with initialize_config_dir(config_dir=str(REPO / "conf"), version_base="1.3"):
        node = compose(config_name="config", overrides=["table=papers_time"]).table
        assert run_table(node, tmp_path) == 0
    for name in ("table.md", "table.csv"):
        assert (tmp_path / name).read_text() == (COMMITTED / name).read_text(), \
            f"{name} differs from the committed one: run python cli.py table=papers_time " \
            f"hydra.run.dir=docs/results/papers_time"


def small_dgs(node: dict[str, Any]) -> dict[str, Any]:
    """Only the DGS setups and their speed-ups, 20 steps each and a 10-step event window (seconds)."""
    node = copy.deepcopy(node)
    node["setups"] = {k: v for k, v in node["setups"].items() if k.startswith("dgs_")}
    for setup in node["setups"].values():
        setup["samples_per_epoch"] = {"value": 16 * 256 * 20, "source": "a test's short run"}
    node["claims"] = [c for c in node["claims"] if c.get("setup", "").startswith("dgs_")]
    node["event_window"] = 10
    return node


def test_dgs_gains_over_asgd_as_the_network_slows() -> None:
    """From 10 to 1 Gbit/s, ASGD's dense pushes and replies slow it more than DGS's top-1% ones: ASGD's
    speed-up falls, DGS's falls less, and DGS's lead over ASGD grows. (A projection blind to the link
    rate, or that sent DGS dense, fails this.)"""
    from tables.papers_claims import load_claims
    from tables.papers_time import project_setups, rows_of

    claims = load_claims(small_dgs(claim_file()))
    speedup = {row.claim.id: row.projected[0] for row in rows_of(claims, project_setups(claims)[0])}
    assert speedup["asgd_speedup_1g"] < speedup["asgd_speedup_10g"]
    assert speedup["dgs_speedup_1g"] <= speedup["dgs_speedup_10g"]
    lead_1g = speedup["dgs_speedup_1g"] / speedup["asgd_speedup_1g"]
    lead_10g = speedup["dgs_speedup_10g"] / speedup["asgd_speedup_10g"]
    assert lead_1g > lead_10g > 1, (lead_1g, lead_10g)


def test_a_setup_number_without_its_source_is_refused_in_one_line(tmp_path: Path) -> None:
    proc = run_cli_here(["table=papers_time", "~table.setups.wagma_64.workers.source", f"hydra.run.dir={tmp_path}"])
    assert proc.returncode == 2
    line = error_line(proc)
    assert "table.setups.wagma_64.workers" in line and "source" in line, line
    assert not (tmp_path / "table.md").exists()


def test_a_paper_figure_without_its_source_is_refused_in_one_line() -> None:
    from tables.papers_claims import load_claims

    node = claim_file()
    del node["claims"][0]["paper"]["source"]
    with pytest.raises(UserError) as err:
        load_claims(node)
    assert "table.claims[0].paper.source" in str(err.value) and "\n" not in str(err.value)


def test_an_unknown_preset_is_refused_in_one_line(tmp_path: Path) -> None:
    proc = run_cli_here(["table=papers_time", "table.setups.qsr_16.cluster=ib_nowhere", f"hydra.run.dir={tmp_path}"])
    assert proc.returncode == 2
    line = error_line(proc)
    assert "table.setups.qsr_16.cluster=ib_nowhere" in line and "rtx3090_8gpu_eth25" in line, line


@pytest.mark.parametrize("key,value,expected", [
    ("measure", "speedup_by_feel", "table.claims[0].measure"),
    ("method", "sgd_by_hand", "table.claims[0].method"),
    ("setup", "cray_1", "table.claims[0].setup"),
])
def test_a_claim_that_names_what_the_file_lacks_is_refused(key: str, value: str, expected: str) -> None:
    from tables.papers_claims import load_claims

    node = claim_file()
    node["claims"][0][key] = value
    with pytest.raises(UserError) as err:
        load_claims(node)
    assert expected in str(err.value) and "\n" not in str(err.value)
