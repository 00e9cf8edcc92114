"""`python cli.py project.run=DIR cluster=NAME`: a finished run (made here from files, no training)
projected at other worker counts, the ledger read as the projection reads it, and every refusal
one line with exit code 2 (projection/command.py, projection/run_inputs.py,
projection/ledger_view.py)."""
from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from omegaconf import OmegaConf

from dist_algos.comm.accounting import allreduce_op
from dist_algos.comm.pattern import ParamLayout
from core.rundir import RunDir
from engine.report.ledger import read_ledger
from engine.report.ledger_writer import DATA_WAIT, FORWARD_BACKWARD, OPTIMIZER, PLUGIN, RankLedger, ReportConfig
from projection.ledger_view import bucket_ready, local_times, measured_wall, profile
from tests.support.cli_runs import error_line, run_cli_here
from tests.support.harness import compose

WORLD, STEPS, STEP_S = 4, 12, 0.1
LAYOUT = ParamLayout((1000, 10))


def write_ledger(run: Path, stagger: float = 0.001) -> None:
    """Every rank: data wait 2 ms, forward and backward 58 ms, the plugin 30 ms (the bucket's
    all_reduce waited for from its start to 80 ms, the optimizer its last 5 ms), a step every
    100 ms; rank r a little later than rank 0, on one wall clock. Written by the ledger's own
    writer, its clock origin set to one instant for every rank."""
    op = allreduce_op(LAYOUT.total_bytes, WORLD, bucket=0)
    for rank in range(WORLD):
        ledger = RankLedger(ReportConfig(ledger=True), RunDir(run), rank, WORLD, WORLD, STEPS, 4, LAYOUT)
        ledger.origin, ledger.origin_ns = 0.0, 10**18
        ledger.meta["origin_ns"] = ledger.origin_ns
        for step in range(STEPS):
            ledger.begin_step(step)
            t = step * STEP_S + rank * stagger
            for kind, a, b in ((DATA_WAIT, 0, 0.002), (FORWARD_BACKWARD, 0.002, 0.06), (PLUGIN, 0.06, 0.09),
                               (OPTIMIZER, 0.085, 0.09)):
                ledger.segment(kind, t + a, t + b)
            ledger.comm(op, t + 0.055, t + 0.08, t + 0.055, step)
        ledger.flush()


def make_run(tmp_path: Path, ledger: bool = True, summary: Any = None) -> Path:
    run = tmp_path / "run"
    run.mkdir()
    OmegaConf.save(compose([f"launch.nproc={WORLD}"]).raw, run / "config.yaml")
    default = {"steps": STEPS, "epochs": 3.0, "world_size": WORLD, "peak_lr": 0.1, "best_step": 7,
               "best_metric": "val_acc", "best_val_acc": 0.9, "algo": "allreduce"}
    (run / "summary.json").write_text(summary if isinstance(summary, str) else json.dumps(summary or default))
    (run / "metrics.jsonl").write_text("\n".join(json.dumps({"step": s, "val_acc": 0.5 + s / 30}) for s in (3, 7, 11)))
    if ledger:
        write_ledger(run)
    return run


def test_the_ledger_read_as_local_time_waits_and_a_wall(tmp_path: Path) -> None:
    ledger = read_ledger(make_run(tmp_path))
    spans = local_times(ledger, spans=True)
    assert spans.ranks == tuple(range(WORLD))
    # before the first wait: up to the plugin's start, 60 ms; after it: the rest of the 100 ms
    # step less the 20 ms waited for the bucket
    np.testing.assert_allclose(spans.before[:, :-1], 0.06, atol=1e-6)
    np.testing.assert_allclose(spans.after[:, :-1], 0.02, atol=1e-6)
    segments = local_times(ledger, spans=False)
    np.testing.assert_allclose(segments.before, 0.06, atol=1e-6)  # data wait + forward and backward
    np.testing.assert_allclose(segments.after, 0.01, atol=1e-6)  # the plugin's 30 ms less its 20 ms wait
    assert bucket_ready(ledger, spans) == pytest.approx((0.055 / 0.06,), abs=1e-5)
    assert measured_wall(spans) == pytest.approx((STEPS - 1) * STEP_S + 3 * 0.001 + 0.09, abs=1e-5)
    assert profile(ledger, "test").median_s == pytest.approx(0.07, abs=1e-5)


def project(tmp_path: Path, *args: str) -> Any:
    return run_cli_here([*args, f"hydra.run.dir={tmp_path / 'out'}"])


def test_a_run_projected_on_a_preset(tmp_path: Path) -> None:
    run = make_run(tmp_path)
    done = project(tmp_path, f"project.run={run}", "cluster=eth25", "project.workers=[16,64]", "project.replicates=2")
    assert done.returncode == 0, done.stderr[-2000:]
    rows = [line.split() for line in done.stdout.splitlines() if line.strip()[:2].strip().isdigit()]
    assert [r[0] for r in rows] == ["4", "16", "64"]
    assert all(r[1] == "recurrence" for r in rows)
    assert "at 4 workers, to its best val_acc 0.9 (step 7)" in done.stdout
    assert "assumptions:" in done.stdout and "cluster.nic.bandwidth_gbit_s: IEEE 802.3" in done.stdout


def test_a_device_profile_stands_in_for_a_missing_ledger(tmp_path: Path) -> None:
    run = make_run(tmp_path, ledger=False)
    device = Path(__file__).resolve().parent.parent / "conf" / "cluster" / "device" / "h100_resnet18_cifar_b512.yaml"
    done = project(tmp_path, f"project.run={run}", "cluster=ib400_8gpu", "project.workers=[64]",
                   f"project.device={device}")
    assert done.returncode == 0, done.stderr[-2000:]
    assert "no measured spread" in done.stdout and "(no band)" in done.stdout


def broken_summary(tmp_path: Path) -> Path:
    return make_run(tmp_path, summary="{not json")


def unfinished(tmp_path: Path) -> Path:
    run = make_run(tmp_path)
    (run / "summary.json").unlink()
    return run


def damaged_config(tmp_path: Path) -> Path:
    run = make_run(tmp_path)
    (run / "config.yaml").write_text("train: {epochs: [unclosed\n")
    return run


def damaged_ledger(tmp_path: Path) -> Path:
    run = make_run(tmp_path)
    next((run / "ledger" / "rank_2").glob("*.npz")).write_bytes(b"garbage")
    return run


REFUSALS = {
    "no such directory": (lambda p: p / "missing", ["cluster=eth25"], "project.run=.*missing: no such directory"),
    "unfinished": (unfinished, ["cluster=eth25"], "has no summary.json: the run has not finished"),
    "damaged summary": (broken_summary, ["cluster=eth25"], "summary.json is not readable JSON"),
    "no ledger": (lambda p: make_run(p, ledger=False), ["cluster=eth25"],
                  "has no time ledger and project.device is unset"),
    "damaged ledger": (damaged_ledger, ["cluster=eth25"], "rank_2"),
    "damaged config": (damaged_config, ["cluster=eth25"], "config.yaml is not a readable run config"),
    "no cluster": (make_run, [], "no cluster chosen: add cluster=NAME"),
    "accuracy elsewhere": (make_run, ["cluster=eth25", "project.target=0.8", "project.workers=[64]"],
                           "accuracy is never projected; only the run's own 4 workers"),
    "bad worker count": (make_run, ["cluster=eth25", "project.workers=[0]"], r"project.workers=\[0\] must be >= 1"),
}


@pytest.mark.parametrize("case", sorted(REFUSALS))
def test_what_the_model_cannot_know_is_refused_in_one_line(case: str, tmp_path: Path) -> None:
    make, args, fragment = REFUSALS[case]
    done = project(tmp_path, f"project.run={make(tmp_path)}", *args)
    assert done.returncode == 2, done.stdout[-2000:] + done.stderr[-2000:]
    assert re.search(fragment, error_line(done)), error_line(done)


def test_a_plugin_without_a_declared_pattern_is_refused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from dist_algos import get_algorithm

    monkeypatch.setattr(get_algorithm("allreduce"), "declares_pattern", classmethod(lambda cls: False))
    done = project(tmp_path, f"project.run={make_run(tmp_path)}", "cluster=eth25")
    assert done.returncode == 2
    assert "algo=allreduce declares no communication pattern" in error_line(done)


def test_time_to_a_target_at_the_runs_own_worker_count(tmp_path: Path) -> None:
    run = make_run(tmp_path)
    done = project(tmp_path, f"project.run={run}", "cluster=eth25", "project.workers=[4]", "project.target=0.7",
                   "project.replicates=2")
    assert done.returncode == 0, done.stderr[-2000:]
    assert "to val_acc 0.7 (step 7)" in done.stdout  # the first evaluation at or above it
