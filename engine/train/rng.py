"""Capture and restore every RNG that decides a rank's future, in a weights_only-loadable form.

CUDA's generators are part of that future only for a rank that computes on a GPU. A rank on the
CPU neither captures nor restores them, even where a GPU is visible. Reading them starts a CUDA
context: about 500 MB of that GPU's memory per rank, for every CPU rank of a job on a GPU machine.
They would also make a CPU rank's checkpoint depend on what it could see: DeepSpeed's launcher
shows its ranks GPUs that a user hid from cli.py, and ranks forked by `launch.launcher=fork` see
the same GPUs through a different route. An H100 session found a resume across the two starts
differing in `rng/cuda[0]` alone, on ranks that trained on the CPU.
"""
from __future__ import annotations

import random
from typing import Any

import numpy as np
import torch


def capture_rng(cuda: bool) -> dict[str, Any]:
    """Every RNG of the process; CUDA's (all devices) only when `cuda`: the rank computes on a GPU."""
    np_state = np.random.get_state()
    state: dict[str, Any] = {
        "python": random.getstate(),
        "numpy": {"keys": torch.from_numpy(np_state[1].astype(np.int64)), "pos": int(np_state[2]),
                  "has_gauss": int(np_state[3]), "gauss": float(np_state[4])},
        "torch": torch.get_rng_state(),
    }
    if cuda:
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def restore_rng(state: dict[str, Any], cuda: bool) -> None:
    """The inverse of `capture_rng`. A CUDA rank resuming a checkpoint without CUDA's states
    (written on the CPU) keeps the states its seeding gave; a CPU rank ignores them."""
    version, internal, gauss = state["python"]
    random.setstate((version, tuple(internal), gauss))
    np_state = state["numpy"]
    np.random.set_state(("MT19937", np_state["keys"].numpy().astype(np.uint32), np_state["pos"],
                         np_state["has_gauss"], np_state["gauss"]))
    torch.set_rng_state(state["torch"])
    if cuda and "cuda" in state:
        torch.cuda.set_rng_state_all(state["cuda"])


def seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed % (2**32))
    torch.manual_seed(seed)
