"""A model's training FLOPs per sample, counted once on the meta device (for MFU).

`torch.utils.flop_counter` counts the matrix multiplications and convolutions that a forward
and backward pass dispatch (2 FLOPs per multiply-add), from shapes alone: on the meta device
nothing is allocated or computed, so even an ImageNet ResNet costs a fraction of a second.
"""
from __future__ import annotations

from typing import Any, Optional

import torch

from core.spec import DataSpec
from models import build_model


def train_flops_per_sample(cfg: dict[str, Any], spec: DataSpec, batch: int = 2) -> Optional[float]:
    """Forward + backward FLOPs of one sample (an image at the data's resolution, a signal, a
    text window); None when the model
    cannot be run on the meta device (then a run reports no MFU rather than failing).
    torch's counter is imported here: it brings Triton, which only a GPU run (MFU) needs, and
    every rank and launching process imports this module through the model registry."""
    from torch.utils.flop_counter import FlopCounterMode

    try:
        with torch.device("meta"):
            model = build_model(cfg, spec)
            x = spec.example_input(batch)
        with FlopCounterMode(display=False) as counter:
            model(x).float().sum().backward()
    except Exception:  # a model the meta device cannot run: no MFU, the run goes on
        return None
    return counter.get_total_flops() / batch
