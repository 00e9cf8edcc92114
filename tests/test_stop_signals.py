"""The one list of stop signals (core/stop_signals.py) and the handlers that hold it.

A process that handled two of the three would die of the third while the rest of the job
checkpoints; a handler left installed after its block would swallow a later Ctrl-C. Real
signals are raised at this process (`signal.raise_signal`), which Python delivers to the
handler before the next bytecode.
"""
from __future__ import annotations

import signal
from collections.abc import Iterator
from types import FrameType
from typing import Optional

import pytest

from core import stop_signals
from core.stop_signals import STOP_SIGNALS, stop_signals_to


class Recorder:
    """A handler that keeps the signals it heard, by number."""

    def __init__(self) -> None:
        self.heard: list[int] = []

    def __call__(self, signum: int, frame: Optional[FrameType]) -> None:
        self.heard.append(signum)


@pytest.fixture
def before() -> Iterator[Recorder]:
    """A handler already installed for every stop signal and SIGUSR2 (as cli.py's or a shell's
    would be), put back as it was after the test."""
    outer = Recorder()
    previous = stop_signals.install(outer, also=[signal.SIGUSR2])
    yield outer
    stop_signals.restore(previous)


def test_every_stop_signal_reaches_the_handler_inside_the_block_and_the_old_one_after(before: Recorder) -> None:
    inner = Recorder()
    with stop_signals_to(inner, also=[signal.SIGUSR2]):
        for sig in (*STOP_SIGNALS, signal.SIGUSR2):
            signal.raise_signal(sig)
    assert inner.heard == [*STOP_SIGNALS, signal.SIGUSR2] and before.heard == []
    for sig in (*STOP_SIGNALS, signal.SIGUSR2):
        signal.raise_signal(sig)
    assert before.heard == [*STOP_SIGNALS, signal.SIGUSR2] and len(inner.heard) == 4


def test_a_block_that_raises_still_gives_the_handlers_back(before: Recorder) -> None:
    with pytest.raises(RuntimeError):
        with stop_signals_to(Recorder()):
            raise RuntimeError("the launch failed")
    assert all(signal.getsignal(sig) is before for sig in STOP_SIGNALS)


@pytest.mark.parametrize("sig", STOP_SIGNALS, ids=[s.name for s in STOP_SIGNALS])
def test_a_rank_turns_each_stop_signal_into_a_checkpoint_request(before: Recorder, sig: signal.Signals) -> None:
    """The rank's StopSignal holds the same list: each one is recorded as a stop (the ranks then
    agree on a step and checkpoint), none kills the rank, and `restore` gives the handlers back."""
    from engine.train.stop import StopSignal

    stop = StopSignal()
    try:
        signal.raise_signal(sig)
        assert stop.received == sig.name
    finally:
        stop.restore()
    assert all(signal.getsignal(s) is before for s in STOP_SIGNALS) and before.heard == []
