"""LocalSGD's public extension interface: a subclass with its own config (no `sync_schedule`,
`period`, `average_optimizer_fields`) overrides only the sync rule, its check and the round
hook, and `validate` and `summary` work for it unchanged (the issue's hierarchical local SGD)."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import pytest
import torch

from core.errors import UserError
from core.schema import option
from dist_algos.base import AlgoConfig, HyperParams, StepContext, TrainInfo
from dist_algos.local_sgd import LocalModelConfig, LocalSGD
from dist_algos.schedules.sync import SyncRule
from tests.support.harness import run_ranks
from tests.support.plugin_harness import loss_of, make_model, make_optimizer, worker_batch


@dataclass
class EveryOtherConfig(LocalModelConfig):
    name: str = "every_other"
    rounds_of: int = option(3, ge=1)  # steps per round


class EveryOther(LocalSGD):
    """Averages every `rounds_of` steps; its round hook counts the rounds it ran."""

    Config = EveryOtherConfig  # type: ignore[assignment]

    @classmethod
    def validate_sync_rule(cls, cfg: AlgoConfig) -> None:
        if cfg.rounds_of > 100:  # type: ignore[attr-defined]
            raise UserError(f"algo.rounds_of={cfg.rounds_of} is longer than a test run")  # type: ignore[attr-defined]

    def sync_rule(self, info: TrainInfo) -> SyncRule:
        h = self.cfg.rounds_of  # type: ignore[attr-defined]
        return SyncRule(schedule="every_other", sync_period=h, warmup_period=h, alpha=0.0, power=2.0,
                        switch_step=0, warmup_steps=info.warmup_steps, total_steps=info.total_steps)

    def sync_round(self) -> None:
        self.hooked = getattr(self, "hooked", 0) + 1
        super().sync_round()


def test_validate_needs_no_override() -> None:
    EveryOther.validate(EveryOtherConfig(), 2, 2, HyperParams())
    with pytest.raises(UserError, match="algo.rounds_of=200"):
        EveryOther.validate(EveryOtherConfig(rounds_of=200), 2, 2, HyperParams())


def drive(rank: int, world: int) -> dict[str, Any]:
    from core.distenv import init_distributed

    plugin = EveryOther(EveryOtherConfig(rounds_of=3), init_distributed("gloo", device="cpu"))
    model = make_model()
    opt = make_optimizer(model, "sgd")
    plugin.setup(model, opt, TrainInfo(7, 7, lambda s: 0.05, 0, lambda n: iter(()), lambda m, x: m(x)))
    for step in range(7):
        loss_of(model, *worker_batch(rank, step, world)).backward()
        plugin.step(StepContext(step=step, epoch=0, loss=torch.zeros(()), lr=0.05, optimizer_step=opt.step))
        opt.zero_grad()
    plugin.finalize(model)
    return {"summary": plugin.summary(), "hooked": plugin.hooked, "synced": plugin.synced,
            "params": torch.cat([p.detach().reshape(-1) for p in model.parameters()])}


def test_rounds_run_through_the_hook_and_summary_needs_no_override() -> None:
    a, b = run_ranks(drive, 2)
    assert a["hooked"] == 3 and a["synced"]  # after steps 3 and 6, and the leftover step at finalize
    assert a["summary"]["sync_schedule"] == "every_other" and a["summary"]["H_rounds"] == [[0, 3, 2], [6, 1, 1]]
    assert torch.equal(a["params"], b["params"])
