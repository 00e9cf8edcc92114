"""A table's "projected time to ..." files at its gather (tables/projected*.py, issue 89): real
validation curves joined with projected time, on hand-written run folders (no training), and the
per-batch device profile they read (projection/compute.py, bench/device_profile.py)."""
from __future__ import annotations

import csv
import json
import math
from pathlib import Path
from typing import Any, Optional

import pytest
import yaml
from omegaconf import OmegaConf

from core.errors import UserError
from tests.support.harness import compose

REPO = Path(__file__).resolve().parents[1]
STEPS, STEP_S = 12, 0.01  # every run: 12 steps, evaluated at 4, 8 and 12; the device file's step time
LOCAL_SGD = ["algo=local_sgd", "algo.sync_schedule=constant", "algo.period=4"]
ROWS = {"base": ["algo=allreduce"], "local": LOCAL_SGD, "never": ["algo=allreduce"]}
#: val_acc at steps 4, 8, 12 per row and seed. base's final mean is 0.91 (target a) and 0.9009 its
#: 0.99 (target b): base seed 1 reaches a at step 12, seed 2 never; local reaches b at step 8 (both
#: seeds) and a at 12 (seed 2 only); never reaches neither
CURVES = {"base": {1: (0.5, 0.85, 0.92), 2: (0.5, 0.85, 0.90)},
          "local": {1: (0.6, 0.905, 0.905), 2: (0.6, 0.905, 0.95)},
          "never": {1: (0.3, 0.4, 0.5), 2: (0.3, 0.4, 0.5)}}


def write_device(path: Path, batches: tuple[int, ...] = (8, 16)) -> Path:
    """A device file with one step time per batch and no spread (so every projection is exact)."""
    path.write_text(yaml.safe_dump({"batches": {b: {"step_s": {"value": STEP_S, "source": "a test's figure"}}
                                                for b in batches}}))
    return path


def write_row_run(out: Path, label: str, seed: int, overrides: list[str], world: int,
                  curve: tuple[float, ...]) -> Path:
    """A finished run as the runner writes it: its composed config, summary and eval records."""
    run = out / label / f"seed_{seed}"
    run.mkdir(parents=True)
    OmegaConf.save(compose([*overrides, f"launch.nproc={world}", f"seed={seed}"]).raw, run / "config.yaml")
    summary = {"steps": STEPS, "epochs": 3.0, "world_size": world, "train_ranks": world, "global_batch": 32,
               "peak_lr": 0.1, "val_acc": curve[-1], "test_acc": curve[-1], "best_metric": "val_acc"}
    (run / "summary.json").write_text(json.dumps(summary))
    (run / "metrics.jsonl").write_text("".join(json.dumps({"kind": "eval", "step": s, "val_acc": v}) + "\n"
                                               for s, v in zip((4, 8, 12), curve)))
    return run


def table(rows: list[str], counts: list[int], **project: Any) -> Any:
    """A table node over hand-written runs: rows x worker counts, seeds 1 and 2, baseline `base`."""
    return OmegaConf.create({"name": "t", "baseline": "base", "seeds": [1, 2], "plots": [], "paper_metrics": [],
                             "columns": ["test_acc", "val_acc"], "ratios": [], "gather_only": True,
                             "workers": {"counts": counts}, "rows": [{"label": r} for r in rows],
                             "project": project})


def made(out: Path, runs: dict[str, list[int]]) -> None:
    """Every row's runs at the worker counts given (a count left out: the row was not run there)."""
    for label, counts in runs.items():
        for world in counts:
            for seed, curve in CURVES[label].items():
                write_row_run(out, f"{label}.w{world}", seed, ROWS[label], world, curve)


def gather(node: Any, out: Path, monkeypatch: Any, cluster: Optional[str] = None) -> int:
    """The table gathered in-process; a job started would fail the test (a gather trains nothing)."""
    from tables import runner

    monkeypatch.setattr(runner, "run_row", lambda *a, **k: pytest.fail("a gather ran a job"))
    node_of = None if cluster is None else yaml.safe_load((REPO / "conf" / "cluster" / f"{cluster}.yaml").read_text())
    return runner.run_table(node, out, node_of)


def cells(path: Path) -> dict[tuple[str, str, str], dict[str, str]]:
    """projected_<cluster>.csv by (label, target, seed)."""
    with open(path) as fh:
        return {(r["label"], r["target"], r["seed"]): r for r in csv.DictReader(fh)}


def command_step_s(run: Path, device: Path, cluster: str) -> float:
    """The projected time per step of one run by `project`'s own path (projection/command.py)."""
    from projection.cluster import load_preset
    from projection.command import compute_profile, projections
    from projection.config import ProjectConfig
    from projection.run_inputs import read_run

    cfg = ProjectConfig(run=str(run), device=str(device), replicates=1)
    inputs = read_run(cfg.run, need_ledger=False)
    return projections(cfg, inputs, load_preset(cluster), compute_profile(cfg, inputs), [inputs.world])[
        inputs.world].step_s


@pytest.fixture(scope="module")
def gathered(tmp_path_factory: Any) -> tuple[Path, Path]:
    """base at 2 and 4 workers, local at 2 only, never at 2 and 4, gathered onto eth1 (once)."""
    root = tmp_path_factory.mktemp("projected")
    out, device = root / "out", write_device(root / "device.yaml")
    made(out, {"base": [2, 4], "local": [2], "never": [2, 4]})
    with pytest.MonkeyPatch.context() as monkeypatch:
        assert gather(table(["base", "local", "never"], [2, 4], device=str(device)), out, monkeypatch, "eth1") == 0
    return out, device


def test_time_to_target_is_the_projected_step_time_times_the_first_step_reaching_it(
        gathered: tuple[Path, Path]) -> None:
    out, device = gathered
    found = cells(out / "projected_eth1.csv")
    for label, target, seed, step in (("local.w2@", "loose", "1", 8), ("local.w2@", "baseline", "2", 12),
                                      ("base.w4@", "baseline", "1", 12), ("base.w2@", "loose", "1", 12)):
        label = label.rstrip("@")
        row = found[(label, target, seed)]
        step_s = command_step_s(out / label / f"seed_{seed}", device, "eth1")
        assert int(row["reached_step"]) == step
        assert float(row["projected_s"]) == pytest.approx(step_s * step, rel=1e-5)
    assert found[("base.w2", "baseline", "2")]["reached_step"] == ""  # 0.90 < the mean 0.91
    md = (out / "projected_eth1.md").read_text()
    assert "| projected time to base's final val_acc on eth1 (s) | 2 | 4 |" in md
    assert "| local |" in md and "(1 of 2 seeds)" in md
    assert "projected_eth1.md" in (out / "table.md").read_text()  # table.md names the files


def test_a_row_that_never_reaches_is_not_reached_and_a_count_without_runs_is_not_run(
        gathered: tuple[Path, Path]) -> None:
    out, _ = gathered
    lines = {line.split(" | ")[0]: line for line in (out / "projected_eth1.md").read_text().splitlines()
             if line.startswith("| ")}
    assert lines["| never"].count("not reached") == 2  # both counts, both seeds below the target
    local = lines["| local"].split(" | ")
    assert local[2].strip(" |") == "not run" and "not run" not in local[1]  # ran at 2 workers only, never at 4


def test_slower_links_cost_allreduce_more_than_local_sgd_and_reprojecting_reads_no_training(
        tmp_path: Path, monkeypatch: Any) -> None:
    """Two clusters by table.project.clusters: the same reached steps (the curves are the runs'),
    the times differ, and allreduce's grow more on 1 Gbit/s than local SGD's (it averages 4x as
    often). No job runs, no run folder is written into."""
    out, device = tmp_path / "out", write_device(tmp_path / "device.yaml")
    made(out, {"base": [2], "local": [2], "never": [2]})
    before = sorted(p.relative_to(out).as_posix() for p in out.rglob("*") if "seed_" in p.as_posix())
    assert gather(table(["base", "local", "never"], [2], device=str(device), clusters=["eth25", "eth1"]), out,
                  monkeypatch) == 0
    assert sorted(p.relative_to(out).as_posix() for p in out.rglob("*") if "seed_" in p.as_posix()) == before
    fast, slow = cells(out / "projected_eth25.csv"), cells(out / "projected_eth1.csv")
    assert {k: r["reached_step"] for k, r in fast.items()} == {k: r["reached_step"] for k, r in slow.items()}
    growth = {label: float(slow[(label, "loose", "1")]["projected_s"])
              / float(fast[(label, "loose", "1")]["projected_s"]) for label in ("base.w2", "local.w2")}
    assert growth["base.w2"] > growth["local.w2"] > 1.0
    assert (out / "projected_bandwidth_eth1.png").is_file() and "## Against link bandwidth" in \
        (out / "projected_eth1.md").read_text()


def test_a_run_without_ledger_and_no_device_profile_is_refused_in_one_line(tmp_path: Path, monkeypatch: Any) -> None:
    out = tmp_path / "out"
    made(out, {"base": [2]})
    with pytest.raises(UserError) as err:
        gather(table(["base"], [2]), out, monkeypatch, "eth1")
    assert "\n" not in str(err.value) and "table.project.device" in str(err.value) and "base.w2" in str(err.value)
    assert not (out / "projected_eth1.md").exists()


def write_ledgers(out: Path) -> None:
    """base.w2's two seeds given time ledgers by the ledger's own writer: 30 ms of compute a step,
    the gradient's all-reduce inside the plugin."""
    from core.rundir import RunDir
    from dist_algos.comm.accounting import allreduce_op
    from dist_algos.comm.pattern import ParamLayout
    from engine.report.ledger_writer import DATA_WAIT, FORWARD_BACKWARD, PLUGIN, RankLedger, ReportConfig

    layout = ParamLayout((1000, 10))
    for seed in (1, 2):
        run = RunDir(out / "base.w2" / f"seed_{seed}")
        for rank in range(2):
            ledger = RankLedger(ReportConfig(ledger=True), run, rank, 2, 2, STEPS, 4, layout)
            for step in range(STEPS):
                ledger.begin_step(step)
                t = step * 0.05
                for kind, a, b in ((DATA_WAIT, 0, 0.001), (FORWARD_BACKWARD, 0.001, 0.03), (PLUGIN, 0.03, 0.04)):
                    ledger.segment(kind, t + a, t + b)
                ledger.comm(allreduce_op(layout.total_bytes, 2, bucket=0), t + 0.03, t + 0.035, t + 0.03, step)
            ledger.flush()


def test_a_run_with_its_ledger_is_projected_from_it_without_a_device_profile(tmp_path: Path, monkeypatch: Any) -> None:
    out = tmp_path / "out"
    made(out, {"base": [2]})
    write_ledgers(out)
    assert gather(table(["base"], [2]), out, monkeypatch, "eth1") == 0
    md = (out / "projected_eth1.md").read_text()
    assert "each run's own time ledger" in md and "device profile" not in md
    assert {(r["compute"], r["byte_ratios"]) for r in cells(out / "projected_eth1.csv").values()} == \
        {("its ledger", "its ledger")}


def test_compute_device_takes_the_device_file_for_runs_with_a_ledger(tmp_path: Path, monkeypatch: Any) -> None:
    """table.project.compute=device: every run's compute from the device file (its ledger's
    byte ratios still used), the same time as `project` with that file gives."""
    out, device = tmp_path / "out", write_device(tmp_path / "device.yaml")
    made(out, {"base": [2]})
    write_ledgers(out)
    assert gather(table(["base"], [2], device=str(device), compute="device"), out, monkeypatch, "eth1") == 0
    row = cells(out / "projected_eth1.csv")[("base.w2", "loose", "1")]
    assert (row["compute"], row["byte_ratios"]) == ("table.project.device (device.yaml at batch 16)", "its ledger")
    step_s = command_step_s(out / "base.w2" / "seed_1", device, "eth1")
    assert float(row["projected_s"]) == pytest.approx(step_s * int(row["reached_step"]), rel=1e-5)


def test_compute_ledger_refuses_a_run_without_one_in_one_line(tmp_path: Path, monkeypatch: Any) -> None:
    out, device = tmp_path / "out", write_device(tmp_path / "device.yaml")
    made(out, {"base": [2]})
    with pytest.raises(UserError) as err:
        gather(table(["base"], [2], device=str(device), compute="ledger"), out, monkeypatch, "eth1")
    message = str(err.value)
    assert "\n" not in message and "table.project.compute=ledger" in message and "base.w2" in message


def test_a_per_batch_device_file_gives_each_batch_its_steps_and_old_files_still_load(tmp_path: Path) -> None:
    from projection.compute import device_profile

    path = tmp_path / "d.yaml"
    path.write_text(yaml.safe_dump({"batches": {8: {"step_s": {"value": 0.002, "source": "s"},
                                                    "samples_s": [0.001, 0.003], "samples_source": "bench",
                                                    "after_fraction": 0.25},
                                                64: {"step_s": {"value": 0.005, "source": "s"}}}}))
    eight = device_profile(path, 8)
    assert eight.measured_tail and eight.steps.ravel().tolist() == pytest.approx([0.00075, 0.00025, 0.00225, 0.00075])
    assert device_profile(path, 64).median_s == pytest.approx(0.005) and not device_profile(path, 64).measured_tail
    with pytest.raises(UserError) as err:
        device_profile(path, 16)
    assert "\n" not in str(err.value) and "batch of 16" in str(err.value) and "measured: 8, 64" in str(err.value)
    old = device_profile(REPO / "conf" / "cluster" / "device" / "h200_resnet50_b256.yaml", 32)  # no batches: as before
    assert old.median_s == pytest.approx(0.05934)


def device_bench() -> Any:
    """bench/device_profile.py as a module (bench/ is scripts, not a package), registered as
    importlib's recipe says (its dataclasses look their module up)."""
    import importlib.util
    import sys

    spec = importlib.util.spec_from_file_location("device_bench", REPO / "bench" / "device_profile.py")
    bench = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = bench
    spec.loader.exec_module(bench)
    return bench


def test_the_bench_writes_a_file_the_projection_reads(tmp_path: Path) -> None:
    from projection.compute import device_profile

    bench = device_bench()
    out = tmp_path / "cpu.yaml"
    args = ["--batches", "8", "16", "--steps", "6", "--rounds", "2", "--warmup", "1", "--out", str(out)]
    assert bench.main(args) == 0
    for batch in (8, 16):
        profile = device_profile(out, batch)
        assert len(profile.steps) == 6 and profile.measured_tail and "bench/device_profile.py" in profile.source


def test_the_bench_profiles_the_lm_recipes_gpt_per_window_batch(tmp_path: Path) -> None:
    from data import data_spec
    from models import build_model
    from projection.compute import device_profile

    out = tmp_path / "gpt.yaml"
    args = ["--model", "gpt", "--batches", "1", "2", "--steps", "4", "--rounds", "2", "--warmup", "1",
            "--out", str(out)]
    assert device_bench().main(args) == 0
    doc = yaml.safe_load(out.read_text())
    recipe = compose(["recipe=lm/shakespeare_cpu"])  # the model the file names is the recipe's, not a copy
    params = sum(p.numel() for p in build_model(recipe.model, data_spec(recipe.data)).parameters())
    assert f"{params:,} parameters" in doc["model"] and "AdamW" in doc["model"]
    for batch in (1, 2):
        profile = device_profile(out, batch)
        assert len(profile.steps) == 4 and profile.measured_tail and "--model gpt" in profile.source
        assert 0 < doc["batches"][batch]["after_fraction"] < 1  # clipping and AdamW's step, after the exchange
    with pytest.raises(UserError):
        device_profile(out, 8)


@pytest.mark.parametrize("name", ["frontier_mnist1d_cpu", "frontier_lm_cpu", "head_to_head_mnist1d_cpu",
                                  "head_to_head_lm_cpu"])
def test_a_projected_table_s_device_profile_measured_every_per_worker_batch_its_rows_run(name: str) -> None:
    """Each batch a row runs (the table's, or a row's own: the LM's one-process msgd at 16) was
    measured: a gather of a published table would otherwise stop on the missing batch."""
    from projection.compute import device_profile

    node = yaml.safe_load((REPO / "recipes" / "tables" / f"{name}.yaml").read_text())
    overrides = [*node["overrides"], *(o for row in node["rows"] for o in row.get("overrides", []))]
    batches = {int(o.split("=")[1]) for o in overrides if o.startswith("train.batch_size=")}
    assert node["project"]["compute"] == "device" and batches
    for batch in batches:
        profile = device_profile(REPO / node["project"]["device"], batch)  # refused if that batch was not measured
        assert profile.measured_tail and "bench/device_profile.py" in profile.source


def test_the_headline_ranks_only_rows_that_reached_on_at_least_half_their_seeds() -> None:
    """A row whose one lucky seed of ten reached the target first is not ranked first (SGP on
    MNIST-1D was), in the headline or the bandwidth sweep; a row with half its seeds there is
    ranked and says how many."""
    from types import SimpleNamespace

    from tables.measure import Better
    from tables.projected import Cell, SeedTime, Target
    from tables.projected_render import first_to

    target = Target("baseline", "val_acc", 0.9, Better.higher)

    def cell(label: str, times: list[float], seeds: int) -> Cell:
        return Cell(label, target, seeds, [SeedTime(i, 10, t, t, t) for i, t in enumerate(times)])

    cells = {"lucky@iid": cell("lucky@iid", [1.0], 10), "half@iid": cell("half@iid", [3.0] * 5, 10),
             "all@iid": cell("all@iid", [2.0] * 10, 10)}
    rows = {label: SimpleNamespace(train_ranks=8, row=SimpleNamespace(series=None)) for label in cells}
    projected = SimpleNamespace(rows=rows, cells={k: [v, v] for k, v in cells.items()}, sweep_workers=8,
                                cluster=SimpleNamespace(name="eth25"))
    line = first_to(projected, None, 0, "iid")
    assert line.endswith(": all 2 s, half 3 s (5 of 10 seeds).") and "lucky" not in line
    # rows closer to the first than the projection's speedup error are said not to be ordered by it
    cells["close@iid"] = cell("close@iid", [2.2] * 10, 10)
    rows["close@iid"] = rows["all@iid"]
    projected.cells["close@iid"] = [cells["close@iid"]] * 2
    assert first_to(projected, None, 0, "iid").endswith(
        ": all 2 s, close 2.2 s, half 3 s (5 of 10 seeds). Within the projection's speedup error (11%) of the first, "
        "so not ordered by it: all, close.")
    # the bandwidth sweep compares rows by the same rule (tables/projected.py `sweep`)
    assert cells["lucky@iid"].ranked is None and cells["lucky@iid"].seconds == 1.0
    assert cells["half@iid"].ranked == 3.0


def test_a_crossing_is_found_between_swept_points_on_log_log_axes_and_says_by_how_much() -> None:
    """A row half the baseline's time at 0.1 Gbit/s and twice it at 10 crosses at 1 Gbit/s (the
    geometric midpoint); a row 0.1% faster everywhere says so in its ratio, and that it is faster by
    less than the projection can tell; a row clearly faster at one end says where it stops being so."""
    from tables.projected import crossings

    gbits = [0.1, 10.0]
    e = math.log(1.113) / math.log(4)  # where log(ratio) = -log(1 + SPEEDUP_ERROR), on the way from 0.5 to 2
    assert crossings(gbits, [1.0, 4.0], [2.0, 2.0]) == (
        "faster below 1 Gbit/s (0.500-2.000 x the baseline's time); by more than the projection's speedup error "
        f"(11%) below {10 ** (-1 + 2 * (0.5 - e)):.3g} Gbit/s")
    assert crossings(gbits, [4.0, 1.0], [2.0, 2.0]).startswith(
        "faster above 1 Gbit/s (0.500-2.000 x the baseline's time); by more than the projection's speedup error (11%) "
        "above ")
    assert crossings(gbits, [0.999, 0.999], [1.0, 1.0]) == (
        "faster at every swept bandwidth (0.1-10 Gbit/s; 0.999-0.999 x the baseline's time); nowhere by more than "
        "the projection's speedup error (11%)")
    assert crossings(gbits, [0.5, 0.8], [1.0, 1.0]).endswith("; by more than the projection's speedup error (11%) "
                                                             "throughout")
    assert crossings(gbits, [1.5, 1.0], [1.0, 1.0]).startswith("slower or equal at every swept bandwidth")
    assert crossings(gbits, [2.0, None], [1.0, 1.0]) is None  # one comparable point: no crossing to say


def test_the_speedup_error_is_the_blind_proofs() -> None:
    """SPEEDUP_ERROR is the median |predicted / measured - 1| of the speedups docs/projection.md
    publishes; a new proof of record that moves it moves the crossings' band with it."""
    import re
    import statistics

    from tables.projected import SPEEDUP_ERROR

    text = (REPO / "docs" / "projection.md").read_text()
    table = text[text.index("Speedup over allreduce at the same rate"):text.index("Against the targets, over the")]
    errors = [abs(float(p) / float(m) - 1) for m, p in re.findall(r"([\d.]+)x, ([\d.]+)x", table)]
    assert len(errors) == 21
    assert statistics.median(errors) == pytest.approx(SPEEDUP_ERROR, abs=5e-4)
