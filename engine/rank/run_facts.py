"""What the run is, for its report and summary.json (`RunFacts`)."""
from __future__ import annotations

from typing import Any

import torch

from core.distenv import DistContext
from engine.plan import RunPlan
from engine.report.run_report import RunFacts
from engine.report.utilisation import peak_flops
from models.flops import train_flops_per_sample


def run_facts(plan: RunPlan, ctx: DistContext, reporting: bool, precision: Any, total_steps: int,
              steps_per_epoch: int) -> RunFacts:
    """What the run is; on the reporting rank of a GPU run also what MFU needs (the model's
    FLOPs, counted once on the meta device, and the GPU's peak at the run's `precision`; the CPU
    has no peak to divide by, so nothing is counted there)."""
    cfg = plan.config
    flops = peak = None
    if reporting and ctx.is_cuda:
        flops = train_flops_per_sample(cfg.model, plan.spec)
        peak = peak_flops(torch.cuda.get_device_name(ctx.device), str(precision))
    net = cfg.launch.network
    return RunFacts(algo=cfg.algo.name, model=cfg.model.get("name"), data=cfg.data.name,
                    pipeline=str(cfg.data.pipeline), seed=cfg.seed, world_size=plan.world_size,
                    train_ranks=plan.num_train_ranks, global_batch=plan.batch.global_batch,
                    peak_lr=plan.hyper.peak_lr, total_steps=total_steps,
                    steps_per_epoch=steps_per_epoch, num_gpus=ctx.num_devices if ctx.is_cuda else 0,
                    flops_per_sample=flops, peak_flops=peak, task=plan.task.name,
                    tokens_per_sample=plan.spec.fields().get("context_length"),
                    network=net.record(plan.world_size // plan.ranks_per_node) if net.emulated else None)
