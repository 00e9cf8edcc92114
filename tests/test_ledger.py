"""The time ledger (`report.ledger`), in one process: counting an operation and logging it are one
call, a rank's records survive the file and the reader's stitching of a resumed run's attempts,
a truncated or foreign part is one line naming the file and runs no code, and a declaration is
compared with a record as dist_algos/comm/pattern.py says. The ledger of real runs is checked
against their byte counters and declarations in tests/test_comm_pattern.py (every plugin at
P = 2, 4, 8) and tests/test_resume_registry.py (the trainer's runs, resumed too)."""
from __future__ import annotations

import pickle
import zipfile
from pathlib import Path

import numpy as np
import pytest

from core.errors import UserError
from core.rundir import RunDir
from dist_algos.comm.accounting import CommStats, allreduce_bytes, allreduce_bytes_split, allreduce_op
from dist_algos.comm.pattern import WORLD, CommOp, OpKind, ParamLayout, first_difference
from engine.report.ledger import bytes_by_rank, read_ledger
from engine.report.ledger_writer import DATA_WAIT, FORWARD_BACKWARD, PLUGIN, RankLedger, ReportConfig

LAYOUT = ParamLayout((6, 2), 4, ((2, 3), (2,)), (4,))


def ledger(tmp_path: Path, rank: int = 0, on: bool = True) -> RankLedger:
    return RankLedger(ReportConfig(ledger=on), RunDir(tmp_path), rank, 2, 2, 10, 5, LAYOUT)


def one_step(log: RankLedger, stats: CommStats, step: int, t: float) -> None:
    """A step's records: two segments, a bucket's all_reduce (ready before its issue) and a send."""
    log.begin_step(step)
    log.segment(FORWARD_BACKWARD, t, t + 0.5)
    stats.record(allreduce_op(1000, 2, bucket=0), t + 0.2, t + 0.7, ready=t + 0.1, syncs=1)
    stats.record(CommOp(OpKind.SEND, "ring:+1", 2, 40, 40, thread="worker"), t + 0.6, t + 0.9)
    log.segment(PLUGIN, t + 0.5, t + 1.0)


def test_counting_and_logging_are_one_call(tmp_path: Path) -> None:
    stats, log = CommStats(), ledger(tmp_path)
    stats.log = log
    one_step(log, stats, 0, log.origin)
    stats.record(allreduce_op(500, 1), log.origin, log.origin)  # a group of one: a round, nothing moved
    log.flush()
    got = read_ledger(tmp_path)
    metrics = stats.as_metrics()
    assert bytes_by_rank(got) == {0: (metrics["comm_bytes"], metrics["comm_recv_bytes"])}
    assert metrics["comm_bytes"] == allreduce_bytes(1000, 2) + 40 and metrics["syncs"] == 1
    assert [r.op for r in got.comm] == [allreduce_op(1000, 2, bucket=0),
                                        CommOp(OpKind.SEND, "ring:+1", 2, 40, 40, thread="worker")]


def test_records_survive_the_file(tmp_path: Path) -> None:
    stats, log = CommStats(), ledger(tmp_path, rank=1)
    stats.log = log
    one_step(log, stats, 3, log.origin + 2.0)
    log.flush()
    got = read_ledger(tmp_path)
    facts = got.ranks[1]
    assert (facts.world, facts.local_size, facts.total_steps, facts.steps_per_epoch) == (2, 2, 10, 5)
    assert facts.layout == LAYOUT
    bucket = got.comm[0]
    assert (bucket.rank, bucket.step, bucket.seq) == (1, 3, 0)
    assert bucket.issue_s == pytest.approx(2.2) and bucket.complete_s == pytest.approx(2.7)
    assert bucket.ready_s == pytest.approx(2.1) and got.comm[1].ready_s is None
    assert [(s.segment, s.start_s, s.end_s) for s in got.compute] == [
        ("forward_backward", pytest.approx(2.0), pytest.approx(2.5)),
        ("plugin", pytest.approx(2.5), pytest.approx(3.0))]


def test_a_resumed_attempt_replaces_the_lost_steps(tmp_path: Path) -> None:
    """Attempt 1 wrote steps 0-5 (its last part after the checkpoint at 4 it resumes from);
    attempt 2 trains from step 4: the reader keeps 0-3 of the first and all of the second."""
    first = ledger(tmp_path)
    stats = CommStats()
    stats.log = first
    first.start(0)
    for step in range(4):
        one_step(first, stats, step, first.origin + step)
    first.flush()
    for step in (4, 5):
        one_step(first, stats, step, first.origin + step)
    first.flush()
    second = ledger(tmp_path)
    second.origin_ns = first.origin_ns + 1  # (a later attempt: its parts sort after)
    stats.log = second
    second.start(4)
    for step in (4, 5, 6):
        one_step(second, stats, step, second.origin + step)
    second.flush()
    got = read_ledger(tmp_path)
    assert [(r.step, r.attempt) for r in got.comm if r.op.kind == OpKind.ALLREDUCE] == \
        [(0, 0), (1, 0), (2, 0), (3, 0), (4, 1), (5, 1), (6, 1)]
    assert got.ranks[0].starts == (0, 4)
    assert {(s.step, s.attempt) for s in got.compute if s.step >= 4} == {(4, 1), (5, 1), (6, 1)}


def test_off_records_and_writes_nothing(tmp_path: Path) -> None:
    log = ledger(tmp_path, on=False)
    stats = CommStats()
    stats.log = log.log()
    assert stats.log is None
    one_step(log, stats, 0, log.origin)
    log.segment(DATA_WAIT, 0.0, 1.0)
    log.flush()
    assert not RunDir(tmp_path).ledger.exists()
    with pytest.raises(UserError, match="report.ledger=true"):
        read_ledger(tmp_path)


def written_part(tmp_path: Path) -> Path:
    log = ledger(tmp_path)
    stats = CommStats()
    stats.log = log
    one_step(log, stats, 0, log.origin)
    log.flush()
    (part,) = RunDir(tmp_path).ledger.glob("rank_0/part_*.npz")
    return part


def test_a_truncated_part_is_one_line_naming_it(tmp_path: Path) -> None:
    part = written_part(tmp_path)
    part.write_bytes(part.read_bytes()[: part.stat().st_size // 2])
    with pytest.raises(UserError) as err:
        read_ledger(tmp_path)
    assert str(part) in str(err.value) and "\n" not in str(err.value)


class Planted:
    """An object whose unpickling would leave a file behind: a reader that ran code would show."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self) -> tuple:
        return (Path.write_text, (self.marker, "ran"))


def test_a_foreign_part_is_refused_without_running_it(tmp_path: Path) -> None:
    part = written_part(tmp_path)
    with np.load(part) as arrays:
        columns = {k: arrays[k] for k in arrays.files}
    marker = tmp_path / "ran.txt"
    planted = np.empty(1, dtype=object)
    planted[0] = Planted(marker)
    np.savez(part, **{**columns, "segments": planted})  # an array that only pickle could read
    with pytest.raises(UserError, match=str(part)):
        read_ledger(tmp_path)
    assert not marker.exists()
    with zipfile.ZipFile(part, "w") as zf:  # a zip that is not ours at all
        zf.writestr("notes.txt", pickle.dumps("hello"))
    with pytest.raises(UserError, match="not a readable time ledger part"):
        read_ledger(tmp_path)


def test_bucket_bytes_add_up_to_the_whole() -> None:
    """DDP's buckets, one collective each, count what one all_reduce of them all counts (a world
    of 3 does not divide the bytes evenly)."""
    parts = [1_048_580, 4, 26_214_404, 12]
    for world in (2, 3, 4, 8):
        split = allreduce_bytes_split(parts, world)
        assert sum(split) == allreduce_bytes(sum(parts), world)
        assert all(abs(s - allreduce_bytes(p, world)) <= 1 for s, p in zip(split, parts))


def test_a_declaration_is_matched_op_for_op() -> None:
    exact = allreduce_op(100, 4)
    varying = CommOp(OpKind.ALLGATHER, WORLD, 4, 80, 240, recv_bytes=240, data_dependent=True)
    fewer = CommOp(OpKind.ALLGATHER, WORLD, 4, 64, 192, recv_bytes=192)
    assert first_difference([exact, varying], [exact, fewer]) is None
    assert first_difference([exact, varying], [exact]) is None  # the run may skip a data-dependent op
    too_big = CommOp(OpKind.ALLGATHER, WORLD, 4, 96, 288, recv_bytes=288)
    diff = first_difference([exact, varying, exact], [exact, too_big, exact])  # more than the most declared
    assert diff is not None and "recorded ('allgather', 'world', 4, 96, 288" in diff
    assert "beyond the 1 declared" in (first_difference([exact], [exact, exact]) or "")
    assert first_difference([exact], [allreduce_op(100, 4, bucket=0)]) is not None  # the bucket is part of it


def test_the_report_section_is_off_by_default_and_checked() -> None:
    from tests.support.harness import compose

    assert compose([]).report.ledger is False
    assert compose(["report.ledger=true"]).report.ledger is True
    with pytest.raises(UserError) as err:
        compose(["report.ledger=sometimes"])
    assert "report.ledger" in str(err.value) and "\n" not in str(err.value)
