"""The training state every component reads: where the run is, and what it has measured.

One object, owned by the trainer and handed to the components (checkpointer, evaluator,
report), so none of them reads the trainer's own attributes. It is saved in every rank's
checkpoint (`state_dict`) and restored on resume.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any, Optional


@dataclass
class TrainState:
    step: int = 0  # optimizer steps taken (over the whole run)
    epoch: int = 0
    batch_in_epoch: int = 0  # the next batch of the current epoch
    best: Optional[float] = None  # best value of checkpoint.best_metric (validation) so far
    best_step: Optional[int] = None
    test_at_best: dict[str, float] = field(default_factory=dict)  # test metrics at that evaluation
    finalized: bool = False  # the plugin's finalize ran (the final model is in place)
    elapsed_before: float = 0.0  # wall seconds of earlier segments of this run
    train_seconds: float = 0.0  # wall seconds of training, evaluation and checkpoints excluded (all segments)
    data_wait_seconds: float = 0.0  # of which the loop waited for its next batch
    samples_seen: int = 0  # training samples over all training ranks
    # each segment's first log window (seconds, samples, wait_seconds), counted apart as warm-up (clock.py)
    warmup: dict[str, float] = field(default_factory=lambda: {"seconds": 0.0, "samples": 0, "wait_seconds": 0.0})
    last_eval: dict[str, float] = field(default_factory=dict)
    budget_stop: Optional[dict[str, Any]] = None  # the budget that ended the run (StopAgreement.budget_spent)
    resumed_from: Optional[int] = None  # the step this segment resumed at (None: fresh)
    started: float = field(default_factory=time.perf_counter)  # this segment's start

    def advance(self, steps_per_epoch: int) -> bool:
        """Count one step; returns whether it ended an epoch."""
        self.step += 1
        self.batch_in_epoch += 1
        if self.batch_in_epoch < steps_per_epoch:
            return False
        self.epoch += 1
        self.batch_in_epoch = 0
        return True

    def steady(self) -> tuple[float, int, float]:
        """(training seconds, samples, data-wait seconds) after the warm-up windows; all of them
        where nothing followed a warm-up (a run of one log window)."""
        seconds, samples = self.train_seconds - self.warmup["seconds"], self.samples_seen - self.warmup["samples"]
        if seconds <= 0 or samples <= 0:
            return self.train_seconds, self.samples_seen, self.data_wait_seconds
        return seconds, samples, self.data_wait_seconds - self.warmup["wait_seconds"]

    def elapsed(self) -> float:
        return self.elapsed_before + (time.perf_counter() - self.started)

    def state_dict(self) -> dict[str, Any]:
        return {"step": self.step, "epoch": self.epoch, "batch_in_epoch": self.batch_in_epoch,
                "best": self.best, "best_step": self.best_step, "finalized": self.finalized,
                "elapsed": self.elapsed(), "train_seconds": self.train_seconds,
                "data_wait_seconds": self.data_wait_seconds,
                "samples_seen": self.samples_seen, "warmup": dict(self.warmup), "last_eval": dict(self.last_eval),
                "test_at_best": dict(self.test_at_best), "budget_stop": self.budget_stop}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.step, self.epoch, self.batch_in_epoch = state["step"], state["epoch"], state["batch_in_epoch"]
        self.best, self.best_step, self.finalized = state["best"], state["best_step"], state["finalized"]
        self.elapsed_before, self.train_seconds = state["elapsed"], state["train_seconds"]
        self.data_wait_seconds = state.get("data_wait_seconds", 0.0)  # (absent from older checkpoints)
        self.samples_seen, self.last_eval = state["samples_seen"], dict(state["last_eval"])
        self.test_at_best = dict(state.get("test_at_best", {}))  # (absent from older checkpoints)
        self.budget_stop = state.get("budget_stop")  # (absent from older checkpoints)
        self.warmup = dict(state.get("warmup", self.warmup))  # (absent from older checkpoints)
        self.resumed_from = self.step
