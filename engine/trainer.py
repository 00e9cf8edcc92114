"""The algorithm-agnostic training loop of one rank.

Per step: this rank's forward and backward (with gradient accumulation and autocast), then
`plugin.step`, which communicates and applies the update as its algorithm says; then logging,
evaluation, checkpointing and the stop check at step boundaries, which every rank (servers
included) passes through at the same steps. See `dist_algos.base` for the plugin contract.
"""
from __future__ import annotations

import logging
import time
from collections.abc import Iterator
from contextlib import nullcontext
from pathlib import Path
from typing import Any, Optional

import torch
import torch.distributed as dist
import torch.nn as nn

from data import DataRequest, build_data, data_spec
from dist_algos import get_algorithm
from dist_algos.base import DistAlgorithm, Role, StepContext, TrainInfo
from engine import checkpoint as ckpt
from engine.config import RunConfig
from engine.distenv import DistContext
from engine.errors import UserError
from engine.evaluate import evaluate
from engine.imbalance import ImbalanceInjector
from engine.optim import build_optimizer, build_scheduler, lr_factor_fn, peak_lr, warmup_steps
from engine.preempt import StopSignal
from engine.rank_state import find_resume_point, save_checkpoint
from engine.rng import capture_rng, restore_rng, seed_everything
from models import build_model

log = logging.getLogger("syncopt")


def resume_fixed(cfg: RunConfig, world_size: int) -> dict[str, Any]:
    """Settings a resumed run must share with its checkpoint (anything else may be overridden)."""
    family = get_algorithm(cfg.algo.name).family or cfg.algo.name
    return {"world_size": world_size, "model": cfg.model, "data": cfg.data.name, "algo_family": family}


class Trainer:
    def __init__(self, cfg: RunConfig, ctx: DistContext) -> None:
        self.cfg, self.ctx = cfg, ctx
        self.run_dir = Path(cfg.run_dir)
        self.run_dir.mkdir(parents=True, exist_ok=True)
        self.t_start = time.perf_counter()
        self.algo: DistAlgorithm = get_algorithm(cfg.algo.name)(cfg.algo, ctx)
        get_algorithm(cfg.algo.name).validate(cfg.algo, ctx.world_size, ctx.local_size)
        self.train_ranks = self.algo.train_ranks()
        self.is_worker = self.algo.role() == Role.WORKER
        self.reporting = ctx.rank == self.train_ranks[0]
        self.n_train = len(self.train_ranks)
        tr = cfg.train
        if tr.global_batch_size is not None:
            if tr.global_batch_size % self.n_train:
                raise UserError(f"train.global_batch_size={tr.global_batch_size} is not divisible by the "
                                f"{self.n_train} training ranks")
            self.batch_size = tr.global_batch_size // self.n_train
        else:
            self.batch_size = tr.batch_size
        self.micro = tr.micro_batch_size or self.batch_size
        if self.batch_size % self.micro:
            raise UserError(f"train.micro_batch_size={self.micro} must divide the per-rank batch {self.batch_size}")
        self.global_batch = self.batch_size * self.n_train
        self._build()

    # ---- construction -----------------------------------------------------------------------
    def _build(self) -> None:
        cfg, ctx = self.cfg, self.ctx
        self.spec = data_spec(cfg.data)
        eval_ranks = self.algo.eval_ranks()
        request = DataRequest(
            batch_size=self.batch_size, eval_batch_size=cfg.data.eval_batch_size or max(self.batch_size, 64),
            seed=cfg.seed, shard=self.train_ranks.index(ctx.rank) if self.is_worker else None,
            num_shards=self.n_train, eval_shard=eval_ranks.index(ctx.rank) if ctx.rank in eval_ranks else 0,
            eval_num_shards=len(eval_ranks), device=ctx.device)
        self.train_stream, self.eval_stream = build_data(cfg.data, request)
        self.evaluates = ctx.rank in eval_ranks
        seed_everything(cfg.seed)  # identical initial model on every rank
        self.model = build_model(cfg.model, self.spec).to(ctx.device)
        spe = [self.train_stream.steps_per_epoch if self.train_stream is not None else 0]
        dist.broadcast_object_list(spe, src=self.train_ranks[0])
        self.steps_per_epoch = int(spe[0])
        tr = cfg.train
        self.total_steps = tr.max_steps or tr.epochs * self.steps_per_epoch
        self.lr = peak_lr(cfg.optim, self.global_batch)
        self.optimizer = build_optimizer(self.model, cfg.optim, self.lr)
        self.lr_factor = lr_factor_fn(cfg.sched, self.total_steps, self.steps_per_epoch, self.lr)
        self.scheduler = build_scheduler(self.optimizer, self.lr_factor)
        self.precision = self._precision()
        self.scaler = torch.amp.GradScaler(ctx.device.type, enabled=self.precision == "fp16" and ctx.is_cuda)
        self.criterion = nn.CrossEntropyLoss(label_smoothing=tr.label_smoothing)
        self.imbalance = ImbalanceInjector(tr.imbalance, ctx.rank)
        self.fixed = resume_fixed(cfg, ctx.world_size)
        # progress
        self.step = 0
        self.epoch = 0
        self.batch_in_epoch = 0
        self.best: Optional[float] = None
        self.best_step: Optional[int] = None
        self.finalized = False
        self.elapsed_before = 0.0  # wall seconds of earlier segments of this run
        self.train_seconds = 0.0
        self.samples_seen = 0
        self.last_eval: dict[str, float] = {}
        self.resumed_from: Optional[int] = None

    def _precision(self) -> str:
        p = self.cfg.train.precision
        if p == "auto":
            if not self.ctx.is_cuda:
                return "fp32"
            return "bf16" if torch.cuda.is_bf16_supported() else "fp16"
        if p == "fp16" and not self.ctx.is_cuda:
            raise UserError("train.precision=fp16 needs a GPU (its grad scaler is CUDA-only); use fp32 or bf16 on CPU")
        return p

    def forward(self, model: nn.Module, x: torch.Tensor) -> torch.Tensor:
        dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}.get(self.precision)
        ac = torch.autocast(self.ctx.device.type, dtype=dtype) if dtype else nullcontext()
        with ac:
            return model(x)

    def train_batches(self, n: int) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        """Up to n training batches of the current epoch's shard, for BatchNorm re-estimation;
        leaves the training position and the RNG as they were."""
        if self.train_stream is None:
            return
        with torch.random.fork_rng(devices=[]):
            for i, (x, y) in enumerate(self.train_stream.batches(self.epoch, 0)):
                if i >= n:
                    break
                yield x.to(self.ctx.device, non_blocking=True), y.to(self.ctx.device, non_blocking=True)

    # ---- state ------------------------------------------------------------------------------
    def rank_state(self) -> dict[str, Any]:
        return {
            "model": self.model.state_dict(),
            "optimizer": self.optimizer.state_dict(),
            "scheduler": self.scheduler.state_dict(),
            "scaler": self.scaler.state_dict(),
            "algo": self.algo.state_dict(),
            "comm": self.algo.comm.state_dict(),
            "imbalance": self.imbalance.state_dict(),
            "rng": capture_rng(),
            "trainer": {
                "step": self.step, "epoch": self.epoch, "batch_in_epoch": self.batch_in_epoch,
                "best": self.best, "best_step": self.best_step, "finalized": self.finalized,
                "elapsed": self.elapsed_before + (time.perf_counter() - self.t_start),
                "train_seconds": self.train_seconds, "samples_seen": self.samples_seen,
                "last_eval": dict(self.last_eval),
            },
        }

    def _load_model_state(self, state: dict[str, Any]) -> None:
        self.model.load_state_dict(state["model"])
        self.optimizer.load_state_dict(state["optimizer"])
        self.scheduler.load_state_dict(state["scheduler"])
        self.scaler.load_state_dict(state["scaler"])

    def _load_progress(self, state: dict[str, Any]) -> None:
        t = state["trainer"]
        self.step, self.epoch, self.batch_in_epoch = t["step"], t["epoch"], t["batch_in_epoch"]
        self.best, self.best_step, self.finalized = t["best"], t["best_step"], t["finalized"]
        self.elapsed_before, self.train_seconds = t["elapsed"], t["train_seconds"]
        self.samples_seen, self.last_eval = t["samples_seen"], dict(t["last_eval"])
        self.algo.comm.load_state_dict(state["comm"])
        self.imbalance.load_state_dict(state["imbalance"])

    def save(self, reason: str) -> Path:
        if getattr(self, "_saved_step", None) == self.step:
            return ckpt.step_dir(self.run_dir, self.step)
        extra = {"reason": reason, "total_steps": self.total_steps, "best": self.best}
        path = save_checkpoint(self.run_dir, self.step, self.epoch, self.ctx.rank, self.ctx.world_size,
                               self.cfg.algo.name, self.fixed, self.rank_state, extra,
                               self.cfg.checkpoint.keep_last, self.cfg.checkpoint.keep_best)
        self._saved_step = self.step
        return path

    def _resume(self) -> Optional[dict[str, Any]]:
        """Load model/optimizer state from the agreed checkpoint (the rest after plugin set-up)."""
        manifest = find_resume_point(self.cfg.resume, self.run_dir, self.ctx.rank, self.fixed)
        if manifest is None:
            if self.cfg.init_from:
                self._init_from(self.cfg.init_from)
            return None
        state = ckpt.load_rank_file(manifest.rank_file(self.ctx.rank))
        self._load_model_state(state)
        self.resumed_from = manifest.step
        if self.reporting:
            log.info("resuming from %s (step %d)", manifest.path, manifest.step)
        return state

    def _init_from(self, path: str) -> None:
        """A new run starting from a checkpoint's model (rank 0's file), nothing else."""
        manifest = ckpt.resolve_checkpoint(path)
        if manifest is None:
            raise UserError(f"init_from={path}: no complete checkpoint there")
        state = ckpt.load_rank_file(manifest.rank_file(0))
        try:
            self.model.load_state_dict(state["model"])
        except RuntimeError as err:
            raise UserError(f"init_from={path}: its model does not fit model.name={self.cfg.model.get('name')} "
                            f"({str(err).splitlines()[0]})") from None

    # ---- the loop ---------------------------------------------------------------------------
    def run(self) -> Optional[dict[str, Any]]:
        """Train to the end (or to a stop); returns the summary on the reporting rank."""
        from engine.run_report import RunReport

        state = self._resume()
        if state is None and self.ctx.world_size > 1:
            for tensor in list(self.model.parameters()) + list(self.model.buffers()):
                dist.broadcast(tensor.data, src=0)  # one starting point, whatever the init did
        info = TrainInfo(total_steps=self.total_steps, steps_per_epoch=self.steps_per_epoch,
                         lr_at=lambda s: self.lr * self.lr_factor(s),
                         warmup_steps=warmup_steps(self.cfg.sched, self.steps_per_epoch),
                         train_batches=self.train_batches, forward=self.forward,
                         resuming=state is not None)
        self.algo.setup(self.model, self.optimizer, info)
        if state is not None:
            self.algo.load_state_dict(state["algo"])
            self._load_progress(state)
            restore_rng(state["rng"])
        else:  # per-rank streams (dropout differs across ranks), independent of what set-up drew
            seed_everything(self.cfg.seed + 1000 * (self.ctx.rank + 1))
        self.report = RunReport(self) if self.reporting else None
        stop = StopSignal()
        stopped: Optional[str] = None
        try:
            stopped = self._loop(stop)
            if stopped is None:
                return self._finish()
            return None
        finally:
            stop.restore()
            self.algo.close()
            if self.report:
                self.report.close(stopped)

    def _loop(self, stop: StopSignal) -> Optional[str]:
        tr = self.cfg.train
        batches = self._batches()
        while self.step < self.total_steps:
            t0 = time.perf_counter()
            if self.is_worker:
                x, y = next(batches)
                self._train_step(x, y, t0)
            self.step += 1
            self.batch_in_epoch += 1
            epoch_end = self.batch_in_epoch >= self.steps_per_epoch
            if epoch_end:
                self.epoch += 1
                self.batch_in_epoch = 0
                if self.step < self.total_steps:
                    batches = self._batches()
            if self.report:
                self.report.after_step(self, time.perf_counter() - t0)
            self._maybe_eval(epoch_end)
            self._maybe_checkpoint(epoch_end)
            if tr.stop_after is not None and self.step >= tr.stop_after and self.step < self.total_steps:
                self.save("stop_after")
                return f"train.stop_after={tr.stop_after}"
            if stop.agreed(self.step, tr.preempt_check_every):
                self.save("signal")
                return f"signal {stop.received or 'on another rank'}"
        return None

    def _batches(self) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        if not self.is_worker:
            return iter(())
        return iter(self.train_stream.batches(self.epoch, self.batch_in_epoch))

    def _train_step(self, x: torch.Tensor, y: torch.Tensor, t0: float) -> None:
        dev = self.ctx.device
        x, y = x.to(dev, non_blocking=True), y.to(dev, non_blocking=True)
        self.model.train()
        loss_sum = torch.zeros((), device=dev)
        correct = torch.zeros((), device=dev, dtype=torch.long)
        for xm, ym in zip(x.split(self.micro), y.split(self.micro)):
            logits = self.forward(self.model, xm)
            loss = self.criterion(logits.float(), ym)
            self.scaler.scale(loss * (len(xm) / len(x))).backward()
            loss_sum += loss.detach() * len(xm)
            correct += (logits.argmax(1) == ym).sum()
        mean_loss = loss_sum / len(x)
        ctx = StepContext(step=self.step, epoch=self.epoch, loss=mean_loss,
                          lr=self.optimizer.param_groups[0]["lr"], optimizer_step=self._optimizer_step)
        self.imbalance.inject(self.step, time.perf_counter() - t0)
        self.algo.step(ctx)
        self.optimizer.zero_grad(set_to_none=False)
        self.scheduler.step()
        self.train_seconds += time.perf_counter() - t0
        self.samples_seen += len(x) * self.n_train
        if self.report:
            self.report.train_batch(mean_loss, correct, len(x))

    def _optimizer_step(self) -> None:
        if self.cfg.train.grad_clip:
            self.scaler.unscale_(self.optimizer)
            torch.nn.utils.clip_grad_norm_(self.model.parameters(), self.cfg.train.grad_clip)
        self.scaler.step(self.optimizer)
        self.scaler.update()

    def _maybe_eval(self, epoch_end: bool) -> None:
        tr = self.cfg.train
        if self.step >= self.total_steps:
            return  # the final evaluation comes after the plugin's finalize
        due = (tr.eval_every_steps and self.step % tr.eval_every_steps == 0) or \
              (epoch_end and tr.eval_every_epochs and self.epoch % tr.eval_every_epochs == 0)
        if due:
            self._evaluate()

    def _quiesce(self) -> None:
        """On runs with serving ranks, wait until every worker has finished the current step
        before evaluating: a server rank runs no steps, so its main thread would otherwise
        evaluate a global model that workers are still updating. Nobody pushes again before the
        evaluation's all_reduce. (Checkpoints get the same guarantee from save_checkpoint's
        opening barrier.)"""
        if self.n_train < self.ctx.world_size:
            dist.barrier()

    def _evaluate(self) -> dict[str, float]:
        self._quiesce()
        model = self.algo.eval_model(self.model) if self.evaluates else None
        result = evaluate(model, self.eval_stream.batches() if model is not None else iter(()),
                          self.forward, self.ctx.device, self.spec.num_classes)
        sent = torch.tensor([float(self.algo.comm.as_metrics()["comm_bytes"])], dtype=torch.float64)
        dist.all_reduce(sent)  # the x-axis of accuracy-against-communication plots
        result = {**result, "comm_bytes_total": int(sent.item())}
        self.last_eval = result
        metric = result.get(self.cfg.checkpoint.best_metric)
        self._improved = metric is not None and (self.best is None or metric > self.best)
        if self._improved:
            self.best, self.best_step = metric, self.step
        if self.report:
            self.report.after_eval(self, result)
        return result

    def _maybe_checkpoint(self, epoch_end: bool) -> None:
        ck = self.cfg.checkpoint
        due = (ck.every_steps and self.step % ck.every_steps == 0) or \
              (epoch_end and ck.every_epochs and self.epoch % ck.every_epochs == 0)
        improved = getattr(self, "_improved", False) and ck.keep_best
        if (due or improved) and self.step < self.total_steps:
            self.save("best" if improved and not due else "periodic")
        if improved and self.ctx.rank == 0:
            ckpt.mark_best(self.run_dir, self.step, ck.best_metric, self.best)
        self._improved = False

    def _finish(self) -> Optional[dict[str, Any]]:
        if not self.finalized:
            self.algo.finalize(self.model)
            self.finalized = True
        result = self._evaluate()
        improved = getattr(self, "_improved", False)
        if self.resumed_from != self.step:  # else: re-reporting a finished run, nothing new to save
            self.save("final")
        if improved and self.ctx.rank == 0 and self.cfg.checkpoint.keep_best:
            ckpt.mark_best(self.run_dir, self.step, self.cfg.checkpoint.best_metric, self.best)
        return self._summary(result)

    def _summary(self, result: dict[str, float]) -> Optional[dict[str, Any]]:
        comm = self.algo.comm.as_metrics()
        mine = {"rank": self.ctx.rank, "worker": self.is_worker, "comm": comm,
                "algo": self.algo.summary(), "imbalance_s": self.imbalance.injected_s}
        every: list[Any] = [None] * self.ctx.world_size
        dist.all_gather_object(every, mine)
        if not self.reporting:
            return None
        workers = [e for e in every if e["worker"]]
        syncs = [e["comm"]["syncs"] for e in workers]
        elapsed = self.elapsed_before + (time.perf_counter() - self.t_start)
        summary: dict[str, Any] = {
            **result,
            "best_test_acc": max(self.best or 0.0, result.get("test_acc", 0.0))
            if self.cfg.checkpoint.best_metric == "test_acc" else self.best,
            "best_step": self.best_step,
            "steps": self.step,
            "epochs": self.step / max(self.steps_per_epoch, 1),
            "wall_s": round(elapsed, 3),
            "train_s": round(self.train_seconds, 3),
            "samples_per_s": self.samples_seen / self.train_seconds if self.train_seconds else 0.0,
            "world_size": self.ctx.world_size,
            "train_ranks": self.n_train,
            "global_batch": self.global_batch,
            "peak_lr": self.lr,
            "algo": self.cfg.algo.name,
            "model": self.cfg.model.get("name"),
            "data": self.cfg.data.name,
            "pipeline": self.cfg.data.pipeline,
            "seed": self.cfg.seed,
            "syncs": int(round(sum(syncs) / len(syncs))) if syncs else 0,
            "comm_bytes": int(sum(e["comm"]["comm_bytes"] for e in every)),
            "comm_recv_bytes": int(sum(e["comm"]["comm_recv_bytes"] for e in every)),
            "comm_s": max(e["comm"]["comm_s"] for e in every),
            "imbalance_s": [round(e["imbalance_s"], 3) for e in every],
            "resumed_from": self.resumed_from,
        }
        algo_summary = get_algorithm(self.cfg.algo.name).merge_summaries([e["algo"] for e in every])
        if algo_summary:
            summary["algo_stats"] = algo_summary
        self.report.finish(self, summary)
        return summary


def train_rank(cfg: RunConfig, ctx: DistContext) -> Optional[dict[str, Any]]:
    torch.manual_seed(cfg.seed)
    return Trainer(cfg, ctx).run()


