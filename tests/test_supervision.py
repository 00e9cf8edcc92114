"""The one supervision loop of the launching side (engine/launch/supervision.py), driven by a
scripted job and no process: what the launcher and the fault-tolerant supervisor both rely on.

A first stop signal is delivered only once the job is ready for it, and only once unless the
job asks to be told again; a second and a third go to the job's `end_now` (no second stop line);
a new stop_request is a first signal; a stall ends the job when its policy says so and not
otherwise; the job ends when it is done. Signals are real (`signal.raise_signal`), raised from
inside the job's `poll`, as they arrive between two looks at a live job.
"""
from __future__ import annotations

import signal
from collections.abc import Iterator, Sequence
from typing import Optional

import pytest

from core import stop_signals
from core.stop_signals import STOP_SIGNALS
from engine.launch.rank_watch import Stall
from engine.launch.supervision import StopSignals, Supervised, supervise, tick


class ScriptedJob:
    """A job whose every look is tick `t` of a script: which signal arrives at which tick, from
    which tick on it is ready, stalls, is done; it records what the loop asked of it."""

    def __init__(self, signals: Optional[dict[int, list[int]]] = None, ready_at: int = 0, done_at: int = 50,
                 stall_at: Optional[int] = None, stall_ends: bool = True, told_once: bool = True,
                 requested_at: Optional[int] = None, ended_code: int = 99) -> None:
        self.signals, self.ready_at, self.done_at = signals or {}, ready_at, done_at
        self.stall_at, self.stall_ends, self.told_once = stall_at, stall_ends, told_once
        self.requested_at, self.ended_code = requested_at, ended_code
        self.t = -1
        self.delivered: list[int] = []  # the ticks a stop was delivered at
        self.ended_now: list[tuple[int, int]] = []  # (signal, its count) for each end_now
        self.stalled: list[int] = []  # the ticks end_stalled was called at
        self.asked: list[int] = []  # the ticks the stop_request file was looked at

    def stop_line(self, signum: int) -> str:
        return f"stop line {signal.Signals(signum).name}"

    def stop_requested(self) -> bool:
        self.asked.append(self.t + 1)
        return self.requested_at == self.t + 1

    def poll(self) -> Optional[int]:
        self.t += 1
        if self.ended_now:  # what end_now ended is reaped at the next look
            return self.ended_code
        for sig in self.signals.get(self.t, []):
            signal.raise_signal(sig)
        return None

    def ready(self) -> bool:
        return self.t >= self.ready_at

    def deliver_stop(self) -> bool:
        self.delivered.append(self.t)
        return self.told_once

    def stalls(self) -> Sequence[Stall]:
        return [Stall(1, 7, 30.0, False)] if self.stall_at is not None and self.t >= self.stall_at else []

    def end_stalled(self, stalls: Sequence[Stall]) -> Optional[int]:
        assert [s.rank for s in stalls] == [1]
        self.stalled.append(self.t)
        return 1 if self.stall_ends else None

    def done(self) -> Optional[int]:
        return 0 if self.t >= self.done_at else None

    def end_now(self, signum: int, count: int) -> None:
        self.ended_now.append((signum, count))


@pytest.fixture
def handlers_kept() -> Iterator[None]:
    """Whatever the test installs, the stop signals' handlers are as they were after it."""
    before = {sig: signal.getsignal(sig) for sig in STOP_SIGNALS}
    yield
    assert {sig: signal.getsignal(sig) for sig in STOP_SIGNALS} == before


def run(job: ScriptedJob, received: Optional[list[int]] = None) -> tuple[int, StopSignals]:
    stops = StopSignals(job, received)
    previous = stops.install()
    try:
        return supervise(job, stops, poll_s=0), stops
    finally:
        stop_signals.restore(previous)


def test_the_first_signal_waits_until_the_job_is_ready_and_is_delivered_once(handlers_kept: None, capsys) -> None:
    job = ScriptedJob(signals={2: [signal.SIGTERM]}, ready_at=6, done_at=12)
    received: list[int] = []
    code, stops = run(job, received)
    assert code == 0 and job.t == 12
    assert job.delivered == [6]  # not before ready, not again after
    assert received == [signal.SIGTERM] and stops.first == signal.SIGTERM and not stops.pending
    assert capsys.readouterr().err.splitlines() == ["stop line SIGTERM"]
    assert job.ended_now == []


def test_a_job_that_asks_to_be_told_again_is_told_every_tick_from_ready_on(handlers_kept: None) -> None:
    """The fault-tolerant supervisor's way: a replica restarted after the stop must hear it too."""
    job = ScriptedJob(signals={1: [signal.SIGINT]}, ready_at=3, done_at=7, told_once=False)
    assert run(job)[0] == 0
    assert job.delivered == [3, 4, 5, 6, 7]  # (the look that finds it done included)


def test_the_second_and_third_signals_go_to_end_now_and_the_job_ends_with_its_code(handlers_kept: None,
                                                                                   capsys) -> None:
    job = ScriptedJob(signals={1: [signal.SIGINT], 2: [signal.SIGINT, signal.SIGTERM]}, ready_at=10, done_at=50,
                      ended_code=130)
    received: list[int] = []
    code, _ = run(job, received)
    assert code == 130 and job.t == 3  # what the second signal ended, seen at the next look
    assert job.ended_now == [(signal.SIGINT, 2), (signal.SIGTERM, 3)]
    assert received == [signal.SIGINT, signal.SIGINT, signal.SIGTERM]
    assert job.delivered == []  # never ready: the stop stayed pending
    assert capsys.readouterr().err.splitlines() == ["stop line SIGINT"]


def test_a_stall_ends_the_job_when_its_policy_says_so(handlers_kept: None) -> None:
    job = ScriptedJob(stall_at=4, done_at=9)
    assert run(job)[0] == 1
    assert job.stalled == [4] and job.t == 4


def test_a_stall_the_policy_handles_alone_leaves_the_job_running_until_done(handlers_kept: None) -> None:
    """The fault-tolerant supervisor's way: the stalled replica is killed alone, the job goes on."""
    job = ScriptedJob(stall_at=4, done_at=7, stall_ends=False)
    assert run(job)[0] == 0
    assert job.stalled == [4, 5, 6, 7] and job.t == 7


def test_a_stop_request_is_a_first_signal_and_is_looked_for_only_until_a_stop_begins(handlers_kept: None,
                                                                                     capsys) -> None:
    job = ScriptedJob(requested_at=3, ready_at=5, done_at=8)
    received: list[int] = []
    assert run(job, received)[0] == 0
    assert received == [signal.SIGUSR1] and job.delivered == [5]
    assert job.asked == [0, 1, 2, 3]
    assert capsys.readouterr().err.splitlines() == ["stop line SIGUSR1"]


def test_the_job_s_own_stop_is_delivered_without_a_signal_or_a_line(capsys) -> None:
    """A quorum that can no longer form: the supervisor begins the stop itself."""
    job = ScriptedJob(done_at=4)
    stops = StopSignals(job)
    assert tick(job, stops) is None and job.delivered == []
    stops.begin(signal.SIGUSR1)
    assert tick(job, stops) is None and job.delivered == [1]
    assert stops.received == [] and capsys.readouterr().err == ""
    # a user's signal after it is still a first one: it says what it does, and asks nothing more of the job
    stops(signal.SIGINT)
    assert capsys.readouterr().err.splitlines() == ["stop line SIGINT"] and job.ended_now == []


def test_both_supervisors_are_jobs_of_the_loop() -> None:
    """The launcher's attempt and the fault-tolerant supervisor (both of its passes) answer every
    call the loop makes (a method renamed on one side would fail only at a signal or a stall)."""
    from engine.ft.launch.supervisor import AwaitingNodes, Supervisor
    from engine.launch.loop import LaunchedRanks

    wanted = [name for name in vars(Supervised) if not name.startswith("_")]
    assert {"poll", "ready", "deliver_stop", "stalls", "end_stalled", "done", "end_now"} <= set(wanted)
    for cls in (LaunchedRanks, Supervisor):
        assert all(callable(getattr(cls, name, None)) for name in wanted), (cls, wanted)
    waiting = AwaitingNodes(Supervisor.__new__(Supervisor), 0)  # (its signal methods are its supervisor's)
    assert all(callable(getattr(waiting, name, None)) for name in wanted), wanted
