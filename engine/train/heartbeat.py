"""A rank's sign of life: `logs/rank_<r>.progress` rewritten every few seconds with its step.

A rank that stops responding (SIGSTOP, swapped out, a hung driver) blocks its peers inside a
collective until `dist.timeout_s`, after which every survivor fails with a timeout that names
nobody. The launching process reads these files (engine/launch/rank_watch.py; their format is
core/run_files.py's): a rank whose file stops changing while its process is still there is the
one that stopped, and the file says at which step. The beat comes from a thread, not the training loop, so a long evaluation, a slow
data set or a big checkpoint is not mistaken for a stall; a stopped process stops every thread.
"""
from __future__ import annotations

import threading
from pathlib import Path
from typing import Any, Optional

from core.run_files import write_step

BEAT_S = 2.0  # seconds between beats; the watcher allows many missed beats before it acts


class Heartbeat:
    """Writes "<step> <unix time>" to `path` every `every_s` seconds until `stop()`."""

    def __init__(self, path: Path, every_s: float = BEAT_S) -> None:
        self.path, self.every_s = path, every_s
        self.state: Optional[Any] = None  # anything with a `step` (the trainer's TrainState)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="syncopt-heartbeat", daemon=True)

    def start(self) -> "Heartbeat":
        self._beat()
        self._thread.start()
        return self

    def _beat(self) -> None:
        try:
            write_step(self.path, getattr(self.state, "step", -1))
        except OSError:  # a full or vanished disk must not kill training; the watcher will see it
            pass

    def _run(self) -> None:
        while not self._stop.wait(self.every_s):
            self._beat()

    def stop(self) -> None:
        self._stop.set()
        self.path.unlink(missing_ok=True)

