"""The one-process references the plugins declare (`DistAlgorithm.reference = "tests.support.references:NAME"`).

A reference replays a plugin's update with K model copies in one process, no communication:
`simulate(overrides, world, steps, kind)` returns, per rank, the flat parameters after each
step (and, optionally, after `finalize`), or None for a rank it does not model (a server).
tests/test_reference_registry.py runs every declared scenario of the plugin on gloo ranks
through `tests.support.plugin_harness.plugin_trajectory` and compares to 1e-6.

Why here and named by a string: the runtime (dist_algos/) must never import test code, and a
reference that lived beside the plugin would be a second implementation shipped with it. The
declaration next to the plugin's class says where its reference is; the simulations themselves
stay in the tests that wrote them first (tests/test_<plugin>.py), and this module adapts each to
the one signature, so what those tests assert and what the registry asserts is the same code.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Optional

import torch

from tests.support.plugin_harness import flat_params, grad_step, make_workers, worker_batch

Trajectories = list[Optional[list[torch.Tensor]]]


@dataclass(frozen=True)
class Reference:
    """A simulation and what the plugin run must share with it."""

    simulate: Callable[[dict[str, Any], int, int, str], Trajectories]
    steps: int = 12  # steps both sides take
    lr_at: Optional[Callable[[str], Callable[[int], float]]] = None  # optimizer kind -> LR schedule
    warmup_steps: int = 0  # what TrainInfo tells the plugin
    loss_hook: Optional[Callable[[int, int], float]] = None  # the loss each worker reports, by (worker, step)


# ---- synchronous gradient averaging -------------------------------------------------------------
def _allreduce(overrides: dict[str, Any], world: int, steps: int, kind: str) -> Trajectories:
    from tests.test_allreduce import reference

    return [reference(world, kind, steps)] * world


ALLREDUCE = Reference(_allreduce)


def _msgd(overrides: dict[str, Any], world: int, steps: int, kind: str) -> Trajectories:
    """One worker, the run's optimizer on its own batches: the baseline is exactly that."""
    (model,), (opt,) = make_workers(1, kind)
    out = []
    for step in range(steps):
        grad_step(model, opt, *worker_batch(0, step, 1))
        opt.step()
        out.append(flat_params(model))
    return [out + [flat_params(model)]]


MSGD = Reference(_msgd)


# ---- compressed gradient exchange (dist_algos/compress) -----------------------------------------
def _compressed(overrides: dict[str, Any], world: int, steps: int, kind: str) -> Trajectories:
    from tests.compress.test_error_feedback import reference

    traj = reference(overrides.get("compress", ["topk:0.01"]), overrides.get("feedback", "ef"),
                     overrides.get("sign_result", False), k=world, steps=steps, kind=kind)
    return [traj] * world  # every rank steps on the same combined gradient


COMPRESSED = Reference(_compressed, steps=5)


# ---- model averaging: local SGD, DiLoCo -----------------------------------------------------------
def _local_sgd(overrides: dict[str, Any], world: int, steps: int, kind: str) -> Trajectories:
    from tests import test_local_sgd as t

    assert world == t.K and steps == t.STEPS, "the local SGD reference models K ranks for STEPS steps"
    algo = {k: v for k, v in overrides.items() if k not in ("sync_schedule",)}
    return t.reference(t.variant(overrides.get("sync_schedule", "constant"), kind, **algo))["traj"]


def _local_sgd_lr(kind: str) -> Callable[[int], float]:
    from tests.test_local_sgd import lr_schedule

    return lr_schedule(kind)


LOCAL_SGD = Reference(_local_sgd, steps=20, lr_at=_local_sgd_lr, warmup_steps=4)


def _diloco(overrides: dict[str, Any], world: int, steps: int, kind: str) -> Trajectories:
    from tests import test_diloco as t

    assert world == t.K and steps == t.STEPS, "the DiLoCo reference models K ranks for STEPS steps"
    return t.reference(t.variant(kind, **overrides))["traj"]


DILOCO = Reference(_diloco, steps=20)


# ---- groups, gossip, leaders ------------------------------------------------------------------------
def _wagma(overrides: dict[str, Any], world: int, steps: int, kind: str) -> Trajectories:
    from dist_algos.wagma import WagmaConfig
    from tests.test_wagma import reference

    cfg = WagmaConfig(**overrides)
    return reference(world, cfg.group_size, cfg.global_period, kind, steps)


WAGMA = Reference(_wagma)


def _dpsgd(overrides: dict[str, Any], world: int, steps: int, kind: str) -> Trajectories:
    from tests.test_gossip import reference_dpsgd

    return reference_dpsgd(world, kind, steps)


def _sgp(overrides: dict[str, Any], world: int, steps: int, kind: str) -> Trajectories:
    from dist_algos.sgp import SgpConfig
    from tests.test_gossip import reference_sgp

    return reference_sgp(world, SgpConfig(**overrides).num_peers, kind, steps)


def _adpsgd(overrides: dict[str, Any], world: int, steps: int, kind: str) -> Trajectories:
    from tests.test_gossip import reference_adpsgd

    return reference_adpsgd(world, kind, steps)


DPSGD, SGP, ADPSGD = Reference(_dpsgd), Reference(_sgp), Reference(_adpsgd)


def _lsgd(overrides: dict[str, Any], world: int, steps: int, kind: str) -> Trajectories:
    from tests import test_lsgd as t

    assert world == t.WORLD, "the LSGD reference models WORLD ranks"
    return t.reference(overrides, kind, steps)["traj"]


def _table_loss(worker: int, step: int) -> float:
    from tests.test_lsgd import table_loss

    return table_loss(worker, step)


LSGD = Reference(_lsgd, loss_hook=_table_loss)


def _easgd(overrides: dict[str, Any], world: int, steps: int, kind: str) -> Trajectories:
    from dist_algos.easgd import EASGDConfig
    from tests import test_easgd as t

    assert world == t.WORLD, "the EASGD reference models WORLD ranks"
    cfg = EASGDConfig(**overrides)
    return t.reference(cfg.sync_period, cfg.moving_rate, kind, steps)["traj"]


EASGD = Reference(_easgd)
