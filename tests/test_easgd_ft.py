"""EASGD's fault-tolerant round against a one-process simulation of the same update.

Three replicas run the real EASGD plugin, each in a thread with its own model, optimizer and
rounds; the rounds (`ThreadRounds`) are the `RoundAverager` contract met in memory: a barrier for
the quorum, the mean over this round's participants, and a commit vote scripted per round. The
simulation applies the elastic step of the EASGD paper with N = the round's participants on a
committed round, and nothing on a failed one. Checked: every replica's weights and centre after
every step, bit for bit, for a run where round 2 fails on every replica and round 3 has only two
participants (replica 2 sits it out, as a replica that has just died would).
"""
from __future__ import annotations

import threading
from collections.abc import Sequence
from typing import Any

import torch

from dist_algos.ft_round import RoundAverager
from tests.plugin_harness import flat_params, loss_of, make_workers, worker_batch

K, TAU, BETA, STEPS = 3, 2, 0.43, 10
FAILS = {1}  # round index (0-based) whose commit vote says no on every participant
ABSENT = {2: {2}}  # round index -> replicas that do not take part


class Hub:
    """What the replicas' rounds share: who takes part in each round and their tensors."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.barriers: dict[tuple[int, str], threading.Barrier] = {}
        self.deposits: dict[int, dict[int, list[torch.Tensor]]] = {}

    def members(self, round_index: int) -> list[int]:
        return [r for r in range(K) if r not in ABSENT.get(round_index, set())]

    def barrier(self, round_index: int, phase: str) -> threading.Barrier:
        with self.lock:
            key = (round_index, phase)
            if key not in self.barriers:
                self.barriers[key] = threading.Barrier(len(self.members(round_index)))
            return self.barriers[key]


class ThreadRounds(RoundAverager):
    def __init__(self, hub: Hub, replica: int) -> None:
        self.hub, self.replica, self.round_index, self.trainer_step = hub, replica, -1, 0

    def begin(self) -> None:
        self.round_index += 1
        self.hub.barrier(self.round_index, "quorum").wait(timeout=30)

    def average_(self, tensors: Sequence[torch.Tensor]) -> None:
        with self.hub.lock:
            self.hub.deposits.setdefault(self.round_index, {})[self.replica] = [t.clone() for t in tensors]
        self.hub.barrier(self.round_index, "gathered").wait(timeout=30)
        deposits = self.hub.deposits[self.round_index]
        for i, t in enumerate(tensors):
            t.copy_(torch.stack([deposits[r][i] for r in sorted(deposits)]).mean(0))
        self.hub.barrier(self.round_index, "averaged").wait(timeout=30)

    def commit(self) -> bool:
        return self.round_index not in FAILS

    @property
    def participants(self) -> int:
        return len(self.hub.members(self.round_index))

    @property
    def healed(self) -> bool:
        return False

    @property
    def step(self) -> int:
        return self.trainer_step


def replica_run(index: int, model: Any, opt: Any, hub: Hub, out: dict[int, Any]) -> None:
    from core.distenv import DistContext
    from core.schema import typed_section
    from dist_algos.base import StepContext, TrainInfo
    from dist_algos.easgd import EASGD, EASGDConfig
    from tests.plugin_harness import hyper_of

    ctx = DistContext(0, 1, 0, 1, 0, 1, torch.device("cpu"), "gloo", 60.0)  # a replica: a world of one
    plugin = EASGD(typed_section(EASGDConfig, {"name": "easgd", "sync_period": TAU, "moving_rate": BETA}, "algo"), ctx)
    plugin.setup(model, opt, TrainInfo(total_steps=STEPS, steps_per_epoch=STEPS, lr_at=lambda s: 0.05,
                                       warmup_steps=0, train_batches=lambda n: iter(()), forward=lambda m, x: m(x),
                                       hyper=hyper_of(opt)))
    rounds = ThreadRounds(hub, index)
    plugin.attach_ft_rounds(rounds)
    trajectory = []
    for step in range(STEPS):
        rounds.trainer_step = step
        xb, yb = worker_batch(index, step, K)
        loss_of(model, xb, yb).backward()
        if index in ABSENT.get(step // TAU, set()) and (step + 1) % TAU == 0:
            opt.step()  # sits this round out: its local step only
            rounds.round_index += 1
        else:
            plugin.step(StepContext(step=step, epoch=0, loss=torch.tensor(0.0), lr=0.05, optimizer_step=opt.step))
        opt.zero_grad(set_to_none=False)
        trajectory.append((flat_params(model), torch.cat([c.reshape(-1) for c in plugin.center]).clone()))
    out[index] = (trajectory, plugin.summary())


def simulate(fails: set[int]) -> list[list[tuple[torch.Tensor, torch.Tensor]]]:
    """The same run in one process: K workers, the elastic step on committed rounds only."""
    models, opts = make_workers(K, "sgd")
    centers = [[p.detach().clone() for p in models[0].parameters()] for _ in range(K)]
    out: list[list[tuple[torch.Tensor, torch.Tensor]]] = [[] for _ in range(K)]
    for step in range(STEPS):
        for w in range(K):
            xb, yb = worker_batch(w, step, K)
            loss_of(models[w], xb, yb).backward()
            opts[w].step()
            opts[w].zero_grad(set_to_none=False)
        if (step + 1) % TAU == 0 and step // TAU not in fails:
            members = [w for w in range(K) if w not in ABSENT.get(step // TAU, set())]
            with torch.no_grad():
                params = {w: list(models[w].parameters()) for w in members}
                mean = [torch.stack([params[w][i] for w in members]).mean(0) for i in range(len(params[members[0]]))]
                for w in members:
                    old_center = [c.clone() for c in centers[w]]
                    for p, c in zip(params[w], old_center):
                        p.mul_(1 - BETA / len(members)).add_(c, alpha=BETA / len(members))
                    for c, m in zip(centers[w], mean):
                        c.mul_(1 - BETA).add_(m, alpha=BETA)
        for w in range(K):
            out[w].append((flat_params(models[w]), torch.cat([c.reshape(-1) for c in centers[w]]).clone()))
    return out


def test_easgd_rounds_equal_the_one_process_simulation_with_a_failed_and_a_partial_round() -> None:
    hub, out = Hub(), {}
    models, opts = make_workers(K, "sgd")  # here: model initialisation draws from the global RNG
    threads = [threading.Thread(target=replica_run, args=(i, models[i], opts[i], hub, out)) for i in range(K)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    assert sorted(out) == list(range(K)), "a replica thread failed"
    reference = simulate(FAILS)
    for w in range(K):
        for step, ((params, center), (ref_params, ref_center)) in enumerate(zip(out[w][0], reference[w])):
            torch.testing.assert_close(params, ref_params, rtol=0, atol=1e-6, msg=f"replica {w} step {step} weights")
            torch.testing.assert_close(center, ref_center, rtol=0, atol=1e-6, msg=f"replica {w} step {step} centre")
    # the failed round applied nothing and is recorded; the partial one counted as an elastic step
    assert out[0][1] == {"elastic_steps": STEPS // TAU - 1, "failed_rounds": [2 * TAU - 1]}, out[0][1]
    assert out[2][1]["elastic_steps"] == STEPS // TAU - 2  # sat round 2 out
    # the failed round matters: had it been committed, the weights after it would differ
    assert not torch.allclose(simulate(set())[0][2 * TAU - 1][0], reference[0][2 * TAU - 1][0])
