"""Cluster presets (conf/cluster/*.yaml): every shipped one loads, every number in it carries its
source, a number without one is refused in one line naming its key, and a calibrated preset reads
its fit and is refused when the fit's residuals miss their targets (projection/cluster.py,
projection/calibration.py)."""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from core.errors import UserError
from projection.calibration import Point, fit, make_record, predict, residuals, write_record
from projection.cluster import GBIT, PRESETS, load_cluster, load_preset, preset_names, read_calibration
from projection.command import check_cluster

SHIPPED = [p.stem for p in sorted(PRESETS.glob("*.yaml"))]


def numbers(node: Any, path: str = "cluster") -> list[tuple[str, Any]]:
    """Every number of a preset tree with its path, and the mapping that holds it."""
    found = []
    if isinstance(node, dict):
        if set(node) == {"value", "source"}:
            return [(path, node)]
        for key, value in node.items():
            found += numbers(value, f"{path}.{key}")
    elif isinstance(node, (int, float)) and not isinstance(node, bool):
        found.append((path, node))
    return found


@pytest.mark.parametrize("name", SHIPPED)
def test_every_number_of_a_shipped_preset_names_its_source(name: str) -> None:
    tree = yaml.safe_load((PRESETS / f"{name}.yaml").read_text())
    assert tree["name"] == name
    found = numbers(tree)
    assert found, f"{name}: no numbers"
    for path, item in found:
        assert isinstance(item, dict), f"{name}: {path} is a bare number"
        assert str(item["source"]).strip(), f"{name}: {path} has no source"
    cluster = load_preset(name)
    assert cluster.name == name and cluster.ranks_per_node >= 1
    assert set(cluster.sources) >= {p for p, _ in found}  # the loader kept every source it read


def test_the_ib_preset_says_what_its_sources_say() -> None:
    ib = load_preset("ib400_8gpu")
    assert ib.nic.bandwidth_Bps == pytest.approx(47e9) and ib.nics_per_node == 8
    assert ib.intra.bandwidth_Bps == pytest.approx(370e9) and ib.intra.latency_s == pytest.approx(3.4e-6)
    assert ib.leaf_uplink_Bps(nodes=128) == pytest.approx(32 * 8 * 47e9)  # non-blocking: 32 nodes' NICs
    assert load_preset("eth1").nic.bandwidth_Bps == pytest.approx(0.9415 * GBIT)


def preset(**changes: Any) -> dict[str, Any]:
    base = yaml.safe_load((PRESETS / "eth25.yaml").read_text())
    base.update(changes)
    return base


@pytest.mark.parametrize("changes,fragment", [
    ({"ranks_per_node": 1}, "cluster.ranks_per_node=1: every number of a cluster preset is {value: X, source"),
    ({"nic": {"bandwidth_gbit_s": {"value": 25, "source": " "}, "latency_us": {"value": 1, "source": "x"},
              "per_node": {"value": 1, "source": "x"}}}, "cluster.nic.bandwidth_gbit_s.source is empty"),
    ({"nic": {"latency_us": {"value": 1, "source": "x"}, "per_node": {"value": 1, "source": "x"}}},
     "cluster.nic.bandwidth_gbit_s is missing"),
    ({"reduce_gbyte_s": {"value": -1, "source": "x"}}, "cluster.reduce_gbyte_s.value=-1: expected a positive number"),
    ({"library": "mpich"}, "cluster.library='mpich': expected one of gloo, nccl, mpi"),
])
def test_a_number_without_its_source_is_refused_in_one_line(changes: dict[str, Any], fragment: str) -> None:
    with pytest.raises(UserError) as err:
        load_cluster(preset(**changes))
    assert fragment in str(err.value) and "\n" not in str(err.value)


def test_no_cluster_chosen_lists_the_presets() -> None:
    with pytest.raises(UserError, match="no cluster chosen: add cluster=NAME") as err:
        load_cluster(None)
    assert all(name in str(err.value) for name in preset_names())


def synthetic_points(params: dict[str, Any]) -> list[Point]:
    shapes = [("allreduce", w, n, 1) for w in (2, 4) for n in (65_536, 1_048_576, 4_194_304)]
    shapes += [("allreduce", 2, 1_048_576, 4), ("p2p", 2, 16_384, 1), ("p2p", 2, 1_048_576, 1)]
    points = [Point(kind, world, n, 100.0, 1.0, groups=groups) for kind, world, n, groups in shapes]
    return [Point(p.kind, p.world, p.nbytes, p.mbit, predict(p, params), p.groups) for p in points]


def test_a_fit_recovers_the_parameters_that_made_the_points() -> None:
    truth = {"alpha_s": 8e-4, "efficiency": 0.95, "reduce_s_per_byte": 5e-9, "burst_bytes": 50_000.0,
             "message_s": 1e-3}
    found = fit(synthetic_points(truth), list(truth))
    for key, value in truth.items():
        assert found[key] == pytest.approx(value, rel=1e-3), key
    assert residuals(synthetic_points(truth), found)["worst"] < 1e-6


def calibrated(tmp_path: Path, median: float, worst: float, monkeypatch: pytest.MonkeyPatch) -> Any:
    truth = {"alpha_s": 8e-4, "efficiency": 0.95}
    record = make_record(synthetic_points(truth), {**truth, "reduce_s_per_byte": 0.0}, "test")
    record["residuals"].update(median=median, worst=worst)
    folder = tmp_path / "calibration"
    write_record(record, folder / "fit.json")
    monkeypatch.setattr("projection.cluster.CALIBRATIONS", folder)
    return load_cluster({"name": "emulated", "library": "gloo", "calibration": "fit",
                         "nominal_mbit": {"value": 20, "source": "the runs'"},
                         "ranks_per_node": {"value": 1, "source": "one per node"}})


def test_a_calibrated_preset_applies_the_fit_to_its_nominal_rate(tmp_path: Path,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    cluster = calibrated(tmp_path, 0.03, 0.12, monkeypatch)
    assert cluster.nic.bandwidth_Bps == pytest.approx(0.95 * 20e6 / 8)  # the fitted share of 20 Mbit/s
    assert cluster.nic.latency_s == pytest.approx(8e-4)
    assert "calibration.efficiency" in cluster.sources and cluster.calibration is not None
    check_cluster(cluster)  # within the targets: accepted


def test_a_calibration_that_misses_its_targets_is_refused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    cluster = calibrated(tmp_path, 0.04, 0.35, monkeypatch)
    with pytest.raises(UserError, match=r"calibration cannot be trusted: its residuals are 4\.0% median and "
                                        r"35\.0% worst against targets of 10% and 20%"):
        check_cluster(cluster)


def test_a_missing_or_damaged_calibration_is_one_line(tmp_path: Path) -> None:
    with pytest.raises(UserError, match="cluster.calibration=nope: no .*nope.json; run bench/calibrate_network.py"):
        read_calibration("nope", tmp_path)
    (tmp_path / "bad.json").write_text(json.dumps({"params": {}}))
    with pytest.raises(UserError, match="bad.json is not a calibration file"):
        read_calibration("bad", tmp_path)


@pytest.mark.parametrize("name", SHIPPED)
def test_cluster_equals_name_composes_with_the_project_section(name: str) -> None:
    """`cluster=NAME project.run=DIR` composes on cli.py's config tree, as the command reads it."""
    from hydra import compose, initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra

    from engine.config import register_schemas
    from projection import register_project_schema

    register_schemas()
    register_project_schema()
    GlobalHydra.instance().clear()
    with initialize_config_dir(config_dir=str(PRESETS.parent), version_base="1.3"):
        cfg = compose(config_name="config", overrides=[f"cluster={name}", "project.run=/somewhere",
                                                       "project.workers=[64,256]"])
    assert load_cluster(cfg.cluster).name == name
    assert cfg.project.run == "/somewhere" and list(cfg.project.workers) == [64, 256]
