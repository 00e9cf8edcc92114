"""The algorithm-agnostic training loop of one rank.

The trainer builds what a rank trains (data, model, optimizer, schedule, plugin) for the plan's
task (`core.task`: the loss a step differentiates, the metrics evaluation reports and the
direction selection follows; nothing here assumes images or classes), restores it on resume,
and loops: this rank's forward and backward (`LocalStep`), then `plugin.step`, which
communicates and applies the update as its algorithm says. At fixed points it hands over to its
components, which read the shared `TrainState`: after a step the report, the evaluator, the
checkpointer and the stop agreement; at the end the plugin's finalize, the final evaluation and
checkpoint, and the summary. Every rank (servers included) passes the same points at the same
steps. What decides the rank's future is declared once (`self.saved`, engine/train/rank_state.py),
for the checkpoint, resume and fault-tolerant healing alike. See `dist_algos.base` for the
plugin contract and `engine.plan` for what is decided before.
"""
from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any, Optional

import torch

from core.distenv import DistContext
from data import build_streams
from dist_algos.base import Role, StepContext, TrainInfo
from engine.ft.config import Replica
from engine.plan import RunPlan
from engine.rank.run_facts import run_facts
from engine.rank.rank_data import agree_steps_per_epoch, data_request, reestimation_batches
from engine.rank.restore import restore_or_start
from engine.report.ledger_writer import DATA_WAIT, FORWARD_BACKWARD, IMBALANCE, OPTIMIZER, PLUGIN, RankLedger
from engine.report.run_report import RunReport
from engine.report.summary import gather_summary
from engine.train.checkpointer import Checkpointer
from engine.train.clock import TrainClock
from engine.train.compute import prepare_model
from engine.train.evaluation import Evaluator
from engine.train.faults import FaultInjector, fault_summary
from engine.train.imbalance import ImbalanceInjector
from engine.train.optim import Schedule, build_optimizer
from engine.train.rng import seed_everything
from engine.train.train_state import TrainState
from engine.train.rank_state import ModelState, Part, RankState, RngState
from engine.train.step import LocalStep
from engine.train.stop import Budget, StopAgreement
from models import build_model

Batch = tuple[torch.Tensor, torch.Tensor]


class Trainer:
    def __init__(self, plan: RunPlan, ctx: DistContext, replica: Optional[Replica] = None) -> None:
        self.plan, self.ctx, cfg = plan, ctx, plan.config
        self.replica = replica  # fault-tolerant mode: this process is one replica (a world of one)
        self.ft_rounds: Any = None  # engine.ft.rank.rounds.ManagerRounds in fault-tolerant mode
        self._healed = False  # a heal replaced the trainer state: the batch stream must follow it
        plan.run_dir.root.mkdir(parents=True, exist_ok=True)
        self.algo = plan.algo(cfg.algo, ctx)
        self.is_worker = plan.layout.role(ctx.rank) == Role.WORKER
        self.reporting = ctx.rank == plan.layout.train[0]
        streams = build_streams(cfg.data, data_request(plan, ctx, replica))
        self.train_stream, self.eval_stream, self.val_stream = streams.train, streams.test, streams.val
        self.split_record = streams.split  # (summary.json: partition, skew, validation size)
        self.task = plan.task
        # selection reads validation only; without a validation split nothing is selected
        self.best_metric = plan.best_metric if self.val_stream is not None else None
        seed_everything(cfg.seed)  # identical initial model on every rank
        self.model = build_model(cfg.model, plan.spec).to(ctx.device)
        self.compute = prepare_model(self.model, cfg.train.channels_last, cfg.train.compile,
                                     cfg.train.compile_backend, ctx.is_cuda)
        self.steps_per_epoch = agree_steps_per_epoch(self.train_stream, plan.layout.train[0])
        self.total_steps = cfg.train.max_steps or cfg.train.epochs * self.steps_per_epoch
        self.optimizer = build_optimizer(self.model, cfg.optim, plan.hyper.peak_lr)
        self.schedule = Schedule(cfg.sched, plan.hyper.peak_lr, self.total_steps, self.steps_per_epoch)
        self.local = LocalStep(cfg.train, ctx, self.model, self.optimizer, plan.batch.micro, self.task,
                               self.compute, self.algo.no_sync)
        self.imbalance = ImbalanceInjector(cfg.train.imbalance, ctx.rank)
        # the time ledger (report.ledger): this rank's compute segments and the plugin's communications
        self.ledger = RankLedger.build(cfg.report, plan.run_dir, ctx.rank, ctx.world_size, ctx.local_size,
                                       self.total_steps, self.steps_per_epoch, self.model)
        self.algo.comm.log = self.ledger.log()
        self.optimizer_step = self.ledger.timed(OPTIMIZER, self.local.optimizer_step)
        # faults name ranks; in fault-tolerant mode a rank is a replica (a world of its own)
        self.faults = FaultInjector(cfg.faults, replica.index if replica else ctx.rank,
                                    replica.count if replica else ctx.world_size, plan.run_dir)
        self.state = TrainState()
        # what decides this rank's future, in load order (engine/train/rank_state.py): the checkpoint,
        # resume and healing read this one declaration
        self.saved = RankState({"model": Part(ModelState(self.model), before_setup=True),
                                "optimizer": Part(self.optimizer, before_setup=True),
                                "scaler": Part(self.local.scaler, before_setup=True),
                                "algo": Part(self.algo), "comm": Part(self.algo.comm),
                                "imbalance": Part(self.imbalance), "trainer": Part(self.state),
                                "rng": Part(RngState(ctx.is_cuda), heals=False)})
        self.clock = TrainClock(ctx.device, self.state, cfg.train.log_every_steps)
        self.checkpointer = Checkpointer(cfg.checkpoint, plan.run_dir, ctx, cfg.algo.name, plan.resume_keys,
                                         self.saved.capture, self.total_steps, plan.best_metric)
        self.evaluator = Evaluator(cfg.train, self.best_metric, self.total_steps, self.algo, self.model,
                                   ctx, ctx.rank in plan.layout.evaluate, self.eval_stream, self.local.forward,
                                   self.task, quiesce=plan.num_train_ranks < ctx.world_size,
                                   val_stream=self.val_stream)
        self.report: Optional[RunReport] = None

    # ---- state --------------------------------------------------------------------------------
    def load_healed(self, state: dict[str, Any]) -> None:
        """Fault-tolerant mode: take a live peer's state (its capture, received as tensors only) in
        the middle of a round; the batch stream then follows the healed position."""
        self.saved.heal(state)
        self._healed = True

    def restore(self) -> Optional[dict[str, Any]]:
        """Load what the plugin's set-up reads from the checkpoint the ranks agree on (the rest
        after it); else start from `init_from`'s model or rank 0's initialisation."""
        return restore_or_start(self.plan, self.ctx, self.saved, self.model, self.reporting)

    # ---- the loop -----------------------------------------------------------------------------
    def run(self) -> Optional[dict[str, Any]]:
        """Train to the end (or to a stop); returns the summary on the reporting rank."""
        cfg, st = self.plan.config, self.state
        saved = self.restore()
        info = TrainInfo(total_steps=self.total_steps, steps_per_epoch=self.steps_per_epoch,
                         lr_at=self.schedule.lr_at, warmup_steps=self.schedule.warmup_steps,
                         train_batches=lambda n: reestimation_batches(self.train_stream, st.epoch, n, self.ctx.device),
                         forward=self.local.forward, resuming=saved is not None, hyper=self.plan.hyper)
        self.algo.setup(self.model, self.optimizer, info)
        if self.replica is not None:
            self._attach_ft(self.replica)
        if saved is not None:
            self.saved.load(saved, before_setup=False)
        else:  # per-rank streams (dropout differs across ranks), independent of what set-up drew
            seed_everything(cfg.seed + 1000 * (self.ctx.rank + 1))
        self.facts = run_facts(self.plan, self.ctx, self.reporting, self.local.precision, self.total_steps,
                               self.steps_per_epoch)
        if self.reporting:
            self.report = RunReport(self.plan.run_dir, cfg.raw, cfg.logger, cfg.train.log_every_steps,
                                    cfg.train.progress, self.facts, st, self.algo.plot_keys(), self.task)
        started = self.faults.start(st.step, saved is not None, self.reporting)
        if started is not None and started["event"] == "resume" and self.report:
            self.report.note({"kind": "restart", "step": st.step, "attempt": started["attempt"],
                              **fault_summary(self.faults.log.events(), self.plan.num_train_ranks)})
        stop = self.stop = StopAgreement(cfg.train.stop_after, cfg.train.preempt_check_every, self.total_steps,
                                         Budget.of(cfg.train), self.plan.batch.per_rank * self.plan.num_train_ranks)
        if self.ft_rounds is not None:  # replicas agree on a stop in their rounds (engine/ft/rank/rounds.py)
            rounds = self.ft_rounds
            rounds.stop_pending = lambda: stop.signal.received is not None
            stop.agreement = lambda: rounds.stop_note
        stopped: Optional[str] = None
        self.ledger.start(st.step)
        try:
            stopped = None if stop.resumed_spent(st, cfg.train, self.reporting) else self._loop(stop)
            return self._finish() if stopped is None else None
        finally:
            stop.close()
            self.algo.close()
            if self.ft_rounds is not None:
                self.ft_rounds.close()
            for stream in (self.train_stream, self.eval_stream, self.val_stream):
                close = getattr(stream, "close", None)  # loader workers end now, not at exit
                if close is not None:
                    close()
            if self.report:
                self.report.close(stopped)

    def _loop(self, stop: StopAgreement) -> Optional[str]:
        st, clock = self.state, self.clock
        batches = self._batches()
        clock.resume()
        while st.step < self.total_steps:
            t0 = time.perf_counter()
            self.ledger.begin_step(st.step)
            if self.is_worker:
                batch = next(batches)
                t1 = time.perf_counter()
                clock.waited(t1 - t0)
                self.ledger.segment(DATA_WAIT, t0, t1)
                self._train_step(*batch, t0)
            epoch_end = st.advance(self.steps_per_epoch)
            if (epoch_end or self._healed) and st.step < self.total_steps:
                batches = self._batches()
                self._healed = False
            clock.after_step(st.step, self.total_steps)
            if self.report:
                self.report.after_step(st, self.schedule.lr_at(st.step), self.is_worker,
                                       lambda: {**self.algo.comm.as_metrics(), **self.algo.metrics()})
            if stop.budget.active():  # (no per-step work without a budget)
                st.budget_stop = stop.budget_spent(st.step, self.algo.comm.as_metrics()["comm_bytes"], st.elapsed())
                if st.budget_stop is not None:  # the run ends here: _finish evaluates and checkpoints it
                    break
            # before the step's evaluation and checkpoint: a fault at a step that also checkpoints
            # (a new best) loses the work since the checkpoint before, as at any other step
            self.faults.after_step(st.step)
            improved = False
            if self.evaluator.due(st.step, st.epoch, epoch_end):
                with clock.paused():
                    improved = self._evaluate()[1]
            if self.checkpointer.will_save(st, epoch_end, improved):
                with clock.paused():
                    self.checkpointer.after_step(st, epoch_end, improved)
                    self.ledger.flush()
            reason = stop.reason(st.step)
            if reason is not None:
                clock.pause()
                self.checkpointer.save(st, reason.kind)
                self.ledger.flush()
                return reason.message
        clock.pause()
        return None

    def _attach_ft(self, replica: Replica) -> None:
        """Fault-tolerant mode: the plugin averages through torchft's Manager (engine.ft)."""
        from engine.ft.rank.rounds import ManagerRounds  # torchft only in this mode

        cfg = self.plan.config
        self.ft_rounds = ManagerRounds(cfg.ft, replica.index, replica.count, replica.host, replica.store_port,
                                       replica.lighthouse, cfg.dist.timeout_s, self.saved.capture, self.load_healed,
                                       lambda: self.state.step, gate=self.plan.run_dir.root.parent.parent / "logs")
        self.saved.add("ft", Part(self.ft_rounds, heals=False, optional=True))  # (checkpoints from before ft lack it)
        self.algo.attach_ft_rounds(self.ft_rounds)

    def _batches(self) -> Iterator[Batch]:
        if not self.is_worker:
            return iter(())
        return iter(self.train_stream.batches(self.state.epoch, self.state.batch_in_epoch))

    def _train_step(self, x: torch.Tensor, y: torch.Tensor, t0: float) -> None:
        st = self.state
        lr = self.schedule.apply(self.optimizer, st.step)
        t1 = time.perf_counter()
        loss, hits = self.local.backward(x, y)
        t2 = time.perf_counter()
        self.ledger.segment(FORWARD_BACKWARD, t1, t2)
        if self.imbalance.inject(st.step, t2 - t0):
            t3 = time.perf_counter()
            self.ledger.segment(IMBALANCE, t2, t3)
        else:
            t3 = t2
        self.algo.step(StepContext(step=st.step, epoch=st.epoch, loss=loss, lr=lr,
                                   optimizer_step=self.optimizer_step))
        self.ledger.segment(PLUGIN, t3, time.perf_counter())
        self.optimizer.zero_grad(set_to_none=False)
        st.samples_seen += len(x) * self.plan.num_train_ranks
        if self.report:
            self.report.train_batch(loss, hits, len(x))

    def _evaluate(self) -> tuple[dict[str, float], bool]:
        result, improved = self.evaluator.run(self.state)
        if self.report:
            self.report.after_eval(self.state, result, self.algo.comm.as_metrics())
        return result, improved

    def _finish(self) -> Optional[dict[str, Any]]:
        st = self.state
        self.ledger.begin_step(st.step)  # (what finalize communicates belongs to the end, step = total)
        if not st.finalized:
            self.algo.finalize(self.model)
            st.finalized = True
        result, improved = self._evaluate()
        self.checkpointer.at_end(st, improved)
        self.ledger.flush()
        mine = {"rank": self.ctx.rank, "worker": self.is_worker, "comm": self.algo.comm.as_metrics(),
                "algo": self.algo.summary(), "imbalance_s": self.imbalance.injected_s,
                **({"ft": self.ft_rounds.summary()} if self.ft_rounds is not None else {})}
        sizes = {f"{name}_samples": stream.num_samples
                 for name, stream in (("test", self.eval_stream), ("val", self.val_stream)) if stream is not None}
        summary = gather_summary(mine, self.ctx.world_size, self.reporting, result, st, self.facts,
                                 self.best_metric, self.plan.algo.merge_summaries, self.split_record,
                                 self.plan.best_metric, sizes)
        if summary is None:
            return None
        summary.update(self.stop.summary(st.budget_stop, {"samples": st.samples_seen, "bytes": summary["comm_bytes"],
                                                           "wall_s": summary["wall_s"]}))
        if self.report:
            summary.update(fault_summary(self.faults.log.events(), self.plan.num_train_ranks))
            self.report.finish(summary)
        return summary

