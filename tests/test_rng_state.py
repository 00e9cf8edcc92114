"""A rank's RNG part (engine/train/rng.py): every generator that decides its future, and CUDA's
only for a rank that computes on a GPU."""
from __future__ import annotations

import random

import pytest
import torch

from engine.train.rank_state import RngState


def test_a_cpu_rank_never_reads_cudas_generators_even_where_a_gpu_is_visible(monkeypatch: pytest.MonkeyPatch) -> None:
    """On a GPU machine, reading CUDA's RNG starts a CUDA context (about 500 MB of the GPU) in each
    CPU rank, and made a CPU run's checkpoint depend on the GPUs its start showed it (an H100 found
    a resume across launcher and fork differing in rng/cuda[0] alone)."""
    def touched(*_: object) -> None:
        raise AssertionError("a CPU rank touched CUDA's generators")

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_rng_state_all", touched)
    monkeypatch.setattr(torch.cuda, "set_rng_state_all", touched)
    part = RngState(cuda=False)
    state = part.state_dict()
    assert "cuda" not in state
    part.load_state_dict({**state, "cuda": [torch.zeros(16, dtype=torch.uint8)]})  # written by a GPU rank


def test_a_gpu_rank_saves_and_restores_cudas_generators(monkeypatch: pytest.MonkeyPatch) -> None:
    saved = [torch.arange(16, dtype=torch.uint8)]
    restored: list[list[torch.Tensor]] = []
    monkeypatch.setattr(torch.cuda, "get_rng_state_all", lambda: saved)
    monkeypatch.setattr(torch.cuda, "set_rng_state_all", restored.append)
    part = RngState(cuda=True)
    state = part.state_dict()
    assert state["cuda"] is saved
    part.load_state_dict(state)
    assert restored == [saved]
    part.load_state_dict({k: v for k, v in state.items() if k != "cuda"})  # a checkpoint from CPU ranks
    assert restored == [saved]


def test_the_cpu_generators_come_back_exactly() -> None:
    part = RngState(cuda=False)
    state = part.state_dict()
    drawn = (random.random(), torch.rand(3).tolist())
    part.load_state_dict(state)
    assert (random.random(), torch.rand(3).tolist()) == drawn
