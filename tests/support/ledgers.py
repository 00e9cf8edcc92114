"""Time ledgers in tests: recording plugins' ledgers without the trainer (the declared-pattern
test), and checking a trainer run's ledger against its byte counters and its declaration (the
registry's exact-resume runs, which keep one).

`record_cases(rank, world, cases, out)` runs inside a gloo rank (`tests.support.harness.run_ranks`)
and drives each case's plugin for its steps on the test workload (`tests.support.plugin_harness`:
a small CNN with BatchNorm on digits, or a tiny GPT on token windows), with a time ledger
attached to the plugin's accounting (`engine.report.ledger_writer.RankLedger`), the learning rate
following a cosine from the optimizer's (so rate-driven schedules move) and an epoch every
`STEPS_PER_EPOCH` steps; each case's ledger is written to `out/<case index>`. Parameter-server
ranks that serve take no step: their threads answer the workers until these say goodbye at
`finalize`, as under the trainer. Many plugins share one launch, so the ranks and their
process group are made once per world size.
"""
from __future__ import annotations

import functools
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

STEPS_PER_EPOCH = 3
WARMUP_STEPS = 2


@dataclass(frozen=True)
class Case:
    """One plugin run: its `algo.*` values, task and optimizer, for `steps` steps."""

    algo: str
    overrides: dict[str, Any] = field(default_factory=dict)
    task: str = "classification"
    optimizer: str = "sgd"
    steps: int = 8

    @property
    def label(self) -> str:
        return f"{self.algo}:{','.join(f'{k}={v}' for k, v in sorted(self.overrides.items()))}"


def lr_at(base: float, steps: int) -> Callable[[int], float]:
    """A cosine from `base` towards zero over the run (QSR's period, DGS's density follow it)."""
    return lambda step: base * (0.1 + 0.9 * (1 + math.cos(math.pi * step / steps)) / 2)


def record_cases(rank: int, world: int, cases: list[Case], out: str) -> list[dict[str, float]]:
    """Each case's ledger under out/<index>; returns each case's byte counters on this rank (and
    its seconds, `case_s`, for a report of what the test costs)."""
    import time

    counters = []
    for index, case in enumerate(cases):
        start = time.perf_counter()
        try:
            counters.append(_record(rank, world, case, Path(out) / str(index)))
        except Exception as err:
            raise RuntimeError(f"case {case.label}: {err}") from err
        counters[-1]["case_s"] = time.perf_counter() - start
    return counters


def _record(rank: int, world: int, case: Case, run_dir: Path) -> dict[str, float]:
    import torch

    from core.distenv import init_distributed
    from core.rundir import RunDir
    from core.schema import typed_section
    from dist_algos import get_algorithm
    from dist_algos.base import Role, StepContext, TrainInfo
    from dist_algos.comm.pattern import ParamLayout
    from engine.report.ledger_writer import RankLedger, ReportConfig
    from tests.support.plugin_harness import hyper_of, loss_of, make_model, make_optimizer, task_workload, \
        worker_batch

    with task_workload(case.task):
        model = make_model(batch_norm=case.task == "classification")
        opt = make_optimizer(model, case.optimizer)
        schedule = lr_at(opt.param_groups[0]["lr"], case.steps)
        ctx = init_distributed("gloo", device="cpu")
        cls = get_algorithm(case.algo)
        cfg = typed_section(cls.Config, {"name": case.algo, **case.overrides}, "algo")
        hyper = hyper_of(opt)
        cls.validate(cfg, world, ctx.local_size, hyper)
        plugin = cls(cfg, ctx)
        info = TrainInfo(total_steps=case.steps, steps_per_epoch=STEPS_PER_EPOCH, lr_at=schedule,
                         warmup_steps=WARMUP_STEPS, train_batches=lambda n: iter(()), forward=lambda m, x: m(x),
                         hyper=hyper)
        ledger = RankLedger(ReportConfig(ledger=True), RunDir(run_dir), rank, world, ctx.local_size, case.steps,
                            STEPS_PER_EPOCH, ParamLayout.of(model))
        plugin.comm.log = ledger
        plugin.setup(model, opt, info)
        ledger.start(0)
        train = plugin.train_ranks()
        try:
            for step in range(case.steps):
                ledger.begin_step(step)
                if plugin.role() != Role.WORKER:
                    continue
                for group in opt.param_groups:
                    group["lr"] = schedule(step)
                loss = loss_of(model, *worker_batch(train.index(rank), step, len(train)))
                loss.backward()
                plugin.step(StepContext(step=step, epoch=step // STEPS_PER_EPOCH, loss=loss.detach(),
                                        lr=schedule(step), optimizer_step=opt.step))
                opt.zero_grad(set_to_none=False)
            ledger.begin_step(case.steps)
            plugin.finalize(model)
        finally:
            plugin.close()
        ledger.flush()
        torch.distributed.barrier()  # every rank done with this plugin's groups before the next one's
        return plugin.comm.as_metrics()


def base_lr(case: Case) -> float:
    """The learning rate the case's optimizer starts from (its schedule's peak)."""
    return _base_lr(case.task, case.optimizer)


@functools.lru_cache(maxsize=None)
def _base_lr(task: str, optimizer: str) -> float:
    from tests.support.plugin_harness import make_model, make_optimizer, task_workload

    with task_workload(task):
        return make_optimizer(make_model(), optimizer).param_groups[0]["lr"]


def case_config(case: Case, world: int, local_size: int) -> Any:
    """The `PatternConfig` a case ran with, for its plugin's declaration."""
    from core.schema import typed_section
    from dist_algos import get_algorithm
    from dist_algos.comm.pattern import PatternConfig

    cfg = typed_section(get_algorithm(case.algo).Config, {"name": case.algo, **case.overrides}, "algo")
    base = base_lr(case)
    return PatternConfig(cfg, case.steps, STEPS_PER_EPOCH, local_size, lr_at(base, case.steps), base, WARMUP_STEPS)


def counter_differences(ledger: Any, counters: dict[int, tuple[int, int]]) -> list[str]:
    """Ranks whose ledger's bytes (sent, received) differ from their byte counters."""
    from engine.report.ledger import bytes_by_rank

    got = bytes_by_rank(ledger)
    return [f"rank {rank}: ledger {got.get(rank)} bytes (sent, received), counters {want}"
            for rank, want in sorted(counters.items()) if got.get(rank, (0, 0)) != want]


def trainer_run_differences(run_dir: Path, config: Any, world: int, local_size: int, declared: bool = True
                            ) -> list[str]:
    """A trainer run's ledger against its ranks' final byte counters (their last checkpoint) and,
    when `declared`, against its plugin's declared pattern."""
    import torch

    from core.rundir import RunDir
    from engine.checkpoint.files import complete_checkpoints
    from engine.plan import build_plan
    from engine.report.ledger import differences, pattern_config, read_ledger
    from tests.support.registry import declared_pattern

    ledger = read_ledger(run_dir)
    last = complete_checkpoints(RunDir(run_dir))[0]
    counters = {}
    for rank in range(world):
        comm = torch.load(last.path / f"rank_{rank}.pt", weights_only=True)["comm"]
        counters[rank] = (comm["bytes_sent"], comm["bytes_recv"])
    found = counter_differences(ledger, counters)
    if not declared:
        return found
    plan = build_plan(config, RunDir(Path(run_dir) / "plan"), world, local_size)
    declared_pattern(plan.algo)  # (one line naming what to add and where, for a plugin without one)
    shape, layout = pattern_config(plan, ledger), ledger.facts().layout
    return found + differences(ledger, lambda rank, step: plan.algo.comm_pattern(rank, step, world, shape, layout))
