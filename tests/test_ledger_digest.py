"""A run's ledger digest (projection/ledger_digest.py): what the projection takes from a time ledger,
carried in a table's store (tables/store.py, both forms) and written for runs carried before
(`python -m tables.ledger_digests`). The run is written here from files, no training: two ranks of
algo=compressed (top-k, whose all-gather carries fewer bytes than declared, by a known share), its
ledger by the ledger's own writer."""
from __future__ import annotations

import dataclasses
import json
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow.parquet as pq
import pytest
from omegaconf import OmegaConf

from core.errors import UserError
from core.rundir import RunDir
from dist_algos.comm.pattern import ParamLayout
from engine.report.ledger_writer import DATA_WAIT, FORWARD_BACKWARD, PLUGIN, RankLedger, ReportConfig
from projection.ledger_digest import DIGEST_FILE, digest_of, parse, read, to_text, write
from projection.run_inputs import read_run
from projection.workload import declared
from tests.support.harness import compose

WORLD, STEPS, REL = 2, 12, "top.w2/seed_1"
LAYOUT = ParamLayout((1000, 10))
SENT = 0.4  # the share of its declared most that the data-dependent all-gather carries in the run
MACHINE = {"cpu": "Test CPU", "cores": 2, "gpu": None, "gpus": 0, "type": "abc123"}


def step_seconds(rank: int, step: int) -> tuple[float, float]:
    """(forward and backward, the plugin's own time) of a rank's step: every pair different."""
    return 0.02 + 0.001 * step + 0.0005 * rank, 0.005 + 0.0002 * ((step * 7 + rank) % 5)


def write_run(out: Path, summary: dict[str, Any] | None = None) -> Path:
    """A finished 2-rank run of algo=compressed with its time ledger (the module doc)."""
    run = out / REL
    run.mkdir(parents=True)
    OmegaConf.save(compose(["algo=compressed", f"launch.nproc={WORLD}", "seed=1"]).raw, run / "config.yaml")
    (run / "summary.json").write_text(json.dumps(summary or {
        "steps": STEPS, "epochs": 3.0, "world_size": WORLD, "train_ranks": WORLD, "global_batch": 32, "peak_lr": 0.1,
        "val_acc": 0.9, "best_metric": "val_acc", "machine": MACHINE}))
    (run / "metrics.jsonl").write_text("".join(json.dumps({"kind": "eval", "step": s, "val_acc": 0.3 * s / 4}) + "\n"
                                               for s in (4, 8, 12)))
    plan = read_run(str(run), need_ledger=False)
    work = declared(plan.algorithm, plan.config.algo, WORLD, plan.pattern_config(WORLD), LAYOUT, STEPS)
    for rank in range(WORLD):
        ledger = RankLedger(ReportConfig(ledger=True), RunDir(run), rank, WORLD, WORLD, STEPS, 4, LAYOUT)
        ledger.origin, ledger.origin_ns = 0.0, 1_800_000_000 * 10**9
        ledger.meta["origin_ns"] = ledger.origin_ns
        for step in range(STEPS):
            ledger.begin_step(step)
            t, (fb, own) = step * 0.1, step_seconds(rank, step)
            ledger.segment(DATA_WAIT, t, t + 0.001)
            ledger.segment(FORWARD_BACKWARD, t + 0.001, t + 0.001 + fb)
            at = t + 0.001 + fb
            ledger.segment(PLUGIN, at, at + own + 0.01)
            for op in work.ops(rank, step):
                if op.data_dependent:
                    op = dataclasses.replace(op, payload_bytes=int(op.payload_bytes * SENT),
                                             wire_bytes=int(op.wire_bytes * SENT), recv_bytes=int(op.recv_bytes * SENT))
                ledger.comm(op, at, at + 0.005, None, step)
                at += 0.005
        ledger.flush()
    return run


@pytest.fixture(scope="module")
def made(tmp_path_factory: Any) -> Path:
    """The run folder root holding the run, written once."""
    out = tmp_path_factory.mktemp("digest") / "out"
    write_run(out)
    return out


def test_a_digest_round_trips_exactly_and_keeps_what_the_ledger_measured(made: Path, tmp_path: Path) -> None:
    run = read_run(str(made / REL), need_ledger=True)
    digest = digest_of(run, f"run {REL}")
    text = to_text(digest)
    write(tmp_path / DIGEST_FILE, text)
    back = read(tmp_path / DIGEST_FILE)
    assert to_text(back) == text and to_text(parse(text, "here")) == text and len(text) < 20_000
    assert np.array_equal(back.pairs, digest.pairs) and back.count == (STEPS - 2) * WORLD == len(back.pairs)
    expected = sorted(step_seconds(r, s)[0] + 0.001 for r in range(WORLD) for s in range(2, STEPS))
    assert sorted(back.pairs[:, 0]) == pytest.approx(expected, abs=1e-6)  # data wait + forward/backward, not warm-up
    assert back.measures.layout == run.layout() and back.measures.layout.numels == LAYOUT.numels
    assert (back.world, back.steps) == (WORLD, STEPS)
    (key, ratio), = back.measures.byte_ratios.items()  # one data-dependent op shape: the top-k all-gather
    assert key[0] == "allgather" and ratio == pytest.approx(SENT, abs=0.01)  # of a 66-byte most: whole bytes
    assert back.source["machine"] == MACHINE and back.source["measured"] == "2027-01-15T08:00:00Z"


def test_a_digest_over_the_cap_keeps_the_middle_step_of_each_equal_share_in_their_order(made: Path) -> None:
    run = read_run(str(made / REL), need_ledger=True)
    full, small = digest_of(run, "r"), digest_of(run, "r", cap=5)
    assert small.count == full.count == 20 and len(small.pairs) == 5
    totals = full.pairs.sum(axis=1)
    kept = [int(np.flatnonzero((full.pairs == pair).all(axis=1))[0]) for pair in small.pairs]
    assert kept == sorted(kept)  # in the order they were pooled
    assert sorted(small.pairs.sum(axis=1)) == sorted(totals)[2::4]  # 5 shares of 4 sorted steps: each one's 3rd
    assert small.quantiles["total"] == full.quantiles["total"]  # the quantiles are of every pooled step


def project_both(out: Path, store: Path, **cfg: Any) -> tuple[Any, Any]:
    """The run projected on eth1 from its run folder (ledger) and from the store alone (digest)."""
    from projection.cluster import load_preset
    from tables.projected_config import ProjectedColumns
    from tables.projected_runs import Projector, run_inputs
    from tables.store import store_records

    cluster, settings = load_preset("eth1"), ProjectedColumns(replicates=4, **cfg)
    with_ledger = run_inputs(store_records(store), REL, out)
    with_digest = run_inputs(store_records(store), REL, out.parent / "elsewhere")
    assert with_ledger.ledger is not None and with_digest.ledger is None and with_digest.digest is not None
    return [(Projector(settings).project(run, cluster), Projector(settings).used(run))
            for run in (with_ledger, with_digest)]


def carried(made: Path, tmp_path: Path) -> tuple[Path, Path]:
    from tables.store import save_run

    out, store = tmp_path / "out", tmp_path / "store"
    shutil.copytree(made, out)
    save_run(store, out, out / REL)
    return out, store


def test_the_projection_from_the_stored_digest_alone_equals_the_one_from_the_ledger(made: Path, tmp_path: Path) -> None:
    out, store = carried(made, tmp_path)
    (ledger, used_ledger), (digest, used_digest) = project_both(out, store)
    assert (digest.step_s, digest.step_band, digest.wall_s, digest.wall_band) == \
        (ledger.step_s, ledger.step_band, ledger.wall_s, ledger.wall_band)
    assert used_ledger == ("its ledger", "its ledger")
    assert used_digest == ("its ledger digest (20 of 20 steps)", "its ledger digest")


def test_the_byte_ratio_the_digest_carries_moves_the_projection(made: Path, tmp_path: Path) -> None:
    """The equality above is not vacuous: without the digest's ratio the all-gather is at its most."""
    out, store = carried(made, tmp_path)
    node = json.loads((store / REL / DIGEST_FILE).read_text())
    node["byte_ratios"] = []
    (store / REL / DIGEST_FILE).write_text(json.dumps(node))
    (ledger, _), (most, _) = project_both(out, store)
    assert most.step_s > ledger.step_s


def test_a_store_carries_the_digest_and_its_sealed_form_reads_it_back(made: Path, tmp_path: Path) -> None:
    from tables.run_records import LEDGER_DIGEST, SEALED_RUNS
    from tables.seal import seal
    from tables.sealed import SealedRecords, write
    from tables.store import store_records

    out, store = carried(made, tmp_path)
    (store / "store.json").write_text(json.dumps({"table": "t", "quick": False}) + "\n")
    text = (store / REL / DIGEST_FILE).read_text()
    assert text == to_text(digest_of(read_run(str(out / REL), need_ledger=True), f"run {REL}"))
    seal(store)
    assert not (store / REL).exists() and store_records(store).text(REL, LEDGER_DIGEST) == text
    old = pq.read_table(store / SEALED_RUNS)  # a store sealed before digests: no such column
    write(old.drop_columns([LEDGER_DIGEST]), store / SEALED_RUNS, {"table": "t", "quick": False})
    before = SealedRecords(store)
    assert before.text(REL, LEDGER_DIGEST) is None and before.summary(REL)["steps"] == STEPS


@pytest.mark.parametrize("damage", ["truncated", "foreign", "another run"])
def test_a_damaged_or_foreign_digest_is_one_line_naming_the_file(made: Path, tmp_path: Path, damage: str) -> None:
    from tables.projected_runs import run_inputs
    from tables.store import store_records

    out, store = carried(made, tmp_path)
    path = store / REL / DIGEST_FILE
    text = path.read_text()
    node = json.loads(text)
    path.write_text({"truncated": text[: len(text) // 2], "foreign": json.dumps({**node, "format": "other"}),
                     "another run": json.dumps({**node, "world": 4})}[damage])
    with pytest.raises(UserError) as err:
        run_inputs(store_records(store), REL, tmp_path / "elsewhere")
    assert "\n" not in str(err.value) and str(path) in str(err.value)


def test_the_backfill_writes_the_digests_a_store_lacks_and_counts_the_rest(made: Path, tmp_path: Path,
                                                                           capsys: Any) -> None:
    from tables.ledger_digests import main
    from tables.store import save_run

    out, store = tmp_path / "out", tmp_path / "store"
    shutil.copytree(made, out)
    for rel in ("no_ledger/seed_1", "remade/seed_1"):
        shutil.copytree(made / REL, out / rel, ignore=shutil.ignore_patterns("ledger"))
    shutil.copytree(made / REL / "ledger", out / "remade/seed_1/ledger")
    for rel in (REL, "no_ledger/seed_1", "remade/seed_1"):
        save_run(store, out, out / rel)
        (store / rel / DIGEST_FILE).unlink(missing_ok=True)  # carried before digests were written
    (out / "remade/seed_1/summary.json").write_text("{}")  # made again since: not the store's run
    (store / "store.json").write_text(json.dumps({"table": "t", "quick": False}) + "\n")
    assert main([str(store), str(out)]) == 0
    line = capsys.readouterr().out
    assert "1 ledger digests written" in line and "1 runs had no ledger" in line and "1 left alone" in line
    assert parse((store / REL / DIGEST_FILE).read_text(), "x").count == 20
    assert not any((store / rel / DIGEST_FILE).exists() for rel in ("no_ledger/seed_1", "remade/seed_1"))
    assert main([str(store), str(out)]) == 0 and "1 had a digest already" in capsys.readouterr().out


def test_a_run_whose_ledger_cannot_be_read_is_carried_without_a_digest(made: Path, tmp_path: Path,
                                                                        capsys: Any) -> None:
    """A production is not stopped by a damaged ledger: the run's record is carried, the ledger
    named in one line, and no digest written (the backfill can write one later)."""
    from tables.store import save_run, store_records

    out, store = tmp_path / "out", tmp_path / "store"
    shutil.copytree(made, out)
    next((out / REL / "ledger" / "rank_1").glob("*.npz")).write_bytes(b"garbage")
    save_run(store, out, out / REL)
    line = capsys.readouterr().out
    assert line.count("\n") == 1 and "carried without a ledger digest" in line and "rank_1" in line
    assert store_records(store).summary(REL)["steps"] == STEPS and not (store / REL / DIGEST_FILE).exists()
