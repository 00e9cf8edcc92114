"""Where a rank's training starts: the checkpoint the ranks agree on, or a new run's first model.

A resume loads this rank's own file of the newest checkpoint complete for every rank
(`agree_on_checkpoint`); its parts load in two phases (engine/train/rank_state.py): those the
plugin's set-up reads now, the rest after set-up (the trainer's `run`). A new run starts from
`init_from`'s model (rank 0's file, nothing else) when one is given, and then from rank 0's
parameters on every rank, whatever the initialisation did.
"""
from __future__ import annotations

import logging
from typing import Any, Optional

import torch.distributed as dist
import torch.nn as nn

from core.distenv import DistContext
from core.errors import UserError
from engine.checkpoint.collective import agree_on_checkpoint
from engine.checkpoint.files import Manifest, load_rank_file
from engine.plan import RunPlan
from engine.train.compute import plain_state_dict
from engine.train.rank_state import RankState

log = logging.getLogger("syncopt")


def restore_or_start(plan: RunPlan, ctx: DistContext, saved: RankState, model: nn.Module,
                     reporting: bool) -> Optional[dict[str, Any]]:
    """Load the parts that come before the plugin's set-up from the checkpoint the ranks agree
    on and return the whole loaded state (None: a new run, started as the module says)."""
    manifest = agree_on_checkpoint(plan.resume_from, ctx.rank, plan.run_dir)
    if manifest is None:
        if plan.init_from is not None:
            init_from(model, plan.init_from, plan.config.model.get("name"))
        if ctx.world_size > 1:  # one starting point, whatever the initialisation did
            for tensor in list(model.parameters()) + list(model.buffers()):
                dist.broadcast(tensor.data, src=0)
        return None
    state = load_rank_file(manifest.rank_file(ctx.rank))
    saved.load(state, before_setup=True)
    if reporting:
        log.info("resuming from %s (step %d)", manifest.path, manifest.step)
    return state


def init_from(model: nn.Module, manifest: Manifest, model_name: Any) -> None:
    """A new run starting from a checkpoint's model (rank 0's file), nothing else."""
    try:
        model.load_state_dict(plain_state_dict(load_rank_file(manifest.rank_file(0))["model"]))
    except RuntimeError as err:
        raise UserError(f"init_from={manifest.path}: its model does not fit model.name="
                        f"{model_name} ({str(err).splitlines()[0]})") from None
