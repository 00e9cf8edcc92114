"""The signals that ask a job to stop, and handling them for a while.

Every process of a job that must turn a stop into something orderly (a rank checkpointing at an
agreed step, the launcher passing the stop on, restart-all declining another attempt, the
fault-tolerant supervisor and its ssh launcher) hears the same three: SIGINT (Ctrl-C), SIGTERM
(a job manager's or `kill`'s default) and SIGUSR1 (what the launcher sends the ranks, and a
user can send by hand). One list keeps them from drifting apart: a process that forgot one
would die of it while the others checkpoint.
"""
from __future__ import annotations

import signal
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from types import FrameType
from typing import Any, Callable, Optional

STOP_SIGNALS: tuple[signal.Signals, ...] = (signal.SIGINT, signal.SIGTERM, signal.SIGUSR1)

Handler = Callable[[int, Optional[FrameType]], Any]
Previous = dict[int, Any]


def install(handler: Handler, also: Sequence[int] = ()) -> Previous:
    """Route the stop signals (and `also`: a job manager's own) to `handler`; the handlers they
    had, for `restore`."""
    return {s: signal.signal(s, handler) for s in (*STOP_SIGNALS, *also)}


def restore(previous: Previous) -> None:
    """Give each signal back the handler `install` found."""
    for sig, handler in previous.items():
        signal.signal(sig, handler)


@contextmanager
def stop_signals_to(handler: Handler, also: Sequence[int] = ()) -> Iterator[None]:
    """`handler` hears the stop signals inside the block; the earlier handlers come back when it
    ends, however it ends."""
    previous = install(handler, also)
    try:
        yield
    finally:
        restore(previous)
