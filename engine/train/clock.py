"""Training time as a GPU sees it: wall-clock seconds of the training loop, evaluation and
checkpoints excluded, with the device synchronised only where the time is read.

Timing each step on the host counts the time to launch its GPU work, not to do it: work still
queued when a log line, an evaluation or a checkpoint starts was never counted, and throughput
came out too high (2,975 img/s in a summary against 2,050 between log lines on an H100). Here
the loop's time is read at window edges only: a log step, and before and after an evaluation or
a checkpoint (`pause`/`resume`); each reading first waits for the device, so that everything
launched before it is counted, while the steps in between run without synchronising.

It also adds up the time the loop waited for its next batch (`waited`), so that a log line and
the summary can say what share of training went to waiting for input.

Each segment's first log window is also added up apart, as warm-up (`TrainState.warmup`): cuDNN's
autotuning, the caching allocator's first allocations, torch.compile's compilation and the
loader's first fill all land there. On an H100 (ResNet-18, CIFAR, batch 512) the first 5 steps
took 0.88 s against 0.08 s at steady state, so that a summary counting them reported 5.6% fewer
images/s than the log lines' own wall-clock; the summary's throughput is steady-state, with the
warm-up reported beside it.
"""
from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Optional

import torch

from engine.train.train_state import TrainState


class TrainClock:
    def __init__(self, device: torch.device, state: TrainState, log_every: int) -> None:
        self.device, self.state, self.log_every = device, state, log_every
        self._since: Optional[float] = None
        self._segment_start: Optional[tuple[float, int, float]] = None  # (train s, samples, wait s) at its start
        self._warm = False  # this segment's first log window has been counted as warm-up

    def _sync(self) -> None:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)

    def resume(self) -> None:
        """Training (re)starts now: at the loop's start, after an evaluation or a checkpoint."""
        if self._segment_start is None:
            st = self.state
            self._segment_start = (st.train_seconds, st.samples_seen, st.data_wait_seconds)
        self._since = time.perf_counter()

    def read(self) -> None:
        """Count the training time up to now into the state (waiting for the device first)."""
        if self._since is None:
            return
        self._sync()
        now = time.perf_counter()
        self.state.train_seconds += now - self._since
        self._since = now

    def pause(self) -> None:
        """Training stops for an evaluation or a checkpoint: count it up to here."""
        self.read()
        self._since = None

    @contextmanager
    def paused(self) -> Iterator[None]:
        """Leave what runs inside (an evaluation, a checkpoint) out of training time."""
        self.pause()
        try:
            yield
        finally:
            self.resume()

    def waited(self, seconds: float) -> None:
        self.state.data_wait_seconds += seconds

    def after_step(self, step: int, last: int) -> None:
        """At a log step (where the report reads the time), count up to here."""
        if step % self.log_every == 0 or step == last:
            self.read()
            if not self._warm and self._segment_start is not None:
                self._warm = True
                st, (seconds, samples, wait) = self.state, self._segment_start
                st.warmup["seconds"] += st.train_seconds - seconds
                st.warmup["samples"] += st.samples_seen - samples
                st.warmup["wait_seconds"] += st.data_wait_seconds - wait
