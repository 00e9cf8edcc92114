"""How this rank's model computes: memory layout (`train.channels_last`) and compilation
(`train.compile`).

Both change how the forward pass runs, never which tensors hold the model. The module that the
optimizer, the plugins, the evaluator and the checkpoints see stays the plain one: channels_last
re-lays its 4-D parameters in place (the same Parameter objects, so nothing holding them
notices), and torch.compile's wrapper is used only for the training forward (`train_module`), so
no plugin ever meets the wrapper and no state dict carries its `_orig_mod.` prefix. A run saved
with either setting resumes with the other: the values are the same, only their strides differ.

A plugin that flattens parameters into one buffer (`dist_algos.comm.flat`) lays them out there in the
standard (contiguous) order whatever the model's layout, so that its flat state (residuals,
momenta) means the same in a checkpoint whichever layout resumes it; cuDNN (and oneDNN on the
CPU) still runs NHWC kernels, chosen from the channels_last input, at the price of re-laying those
weights on the fly.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
import torch.nn as nn

COMPILE_PREFIX = "_orig_mod."  # what torch.compile's wrapper puts before its module's keys


def is_convolutional(model: nn.Module) -> bool:
    return any(isinstance(m, (nn.Conv2d, nn.Conv3d)) for m in model.modules())


def wants_channels_last(setting: Any, is_cuda: bool, convolutional: bool) -> bool:
    """`train.channels_last`: auto turns it on for convolutional models on a GPU, where cuDNN's
    NHWC kernels (tensor cores) are the fast ones; on the CPU it stays off unless asked for."""
    if setting == "auto":
        return is_cuda and convolutional
    return bool(setting)


@dataclass
class ModelCompute:
    channels_last: bool
    train_module: nn.Module  # what training forwards call: torch.compile's wrapper or the model

    def layout(self, x: torch.Tensor) -> torch.Tensor:
        """An image batch in the model's memory layout (a no-op when it already is)."""
        if x.dim() != 4:
            return x
        return x.contiguous(memory_format=torch.channels_last if self.channels_last else torch.contiguous_format)


def prepare_model(model: nn.Module, channels_last: Any, compile: bool, compile_backend: str,
                  is_cuda: bool) -> ModelCompute:
    """Lay out `model` (in place) and wrap it for training as the settings say."""
    layout = wants_channels_last(channels_last, is_cuda, is_convolutional(model))
    if layout:
        model.to(memory_format=torch.channels_last)
    train_module = torch.compile(model, backend=compile_backend) if compile else model
    return ModelCompute(channels_last=layout, train_module=train_module)


def plain_state_dict(state: dict[str, Any]) -> dict[str, Any]:
    """A model state dict without torch.compile's key prefix (one saved from a compiled module
    by another tool); the trainer itself only ever saves the plain module."""
    if not any(k.startswith(COMPILE_PREFIX) for k in state):
        return state
    return {k[len(COMPILE_PREFIX):] if k.startswith(COMPILE_PREFIX) else k: v for k, v in state.items()}
