"""Plugins' fault-tolerant rounds in one process: replicas in threads, rounds met in memory.

Each replica runs the real plugin in a thread with its own model, optimizer and rounds; the rounds
(`ThreadRounds`) are the `RoundAverager` contract met in memory: a barrier for the quorum, the
mean over this round's participants (possibly several means per round), and a commit vote
scripted per round. (Killing real replicas through torchft is tests/test_ft.py's.)

- EASGD against a one-process simulation of the elastic step with N = the round's participants on
  a committed round and nothing on a failed one: every replica's weights and centre after every
  step, for a run where round 2 fails on every replica and round 3 has only two participants
  (replica 2 sits it out, as a replica that has just died would).
- PowerSGD against itself on three gloo ranks without failures (the same trajectory: the rounds
  take means where the plain path sums P, which orthogonalisation makes the same up to rounding),
  and with a failed round: no step, error buffers and Q's as before it, replicas still identical.
"""
from __future__ import annotations

import threading
from collections.abc import Sequence
from typing import Any

import torch

from dist_algos.comm.round_averager import RoundAverager
from tests.support.plugin_harness import flat_params, loss_of, make_workers, worker_batch

K, TAU, BETA, STEPS = 3, 2, 0.43, 10
FAILS = {1}  # EASGD: round index (0-based) whose commit vote says no on every participant
ABSENT = {2: {2}}  # EASGD: round index -> replicas that do not take part


class Hub:
    """What the replicas' rounds share: who takes part in each round, which rounds fail, and
    the tensors of each mean."""

    def __init__(self, fails: set[int], absent: dict[int, set[int]]) -> None:
        self.fails, self.absent = fails, absent
        self.lock = threading.Lock()
        self.barriers: dict[tuple[int, str], threading.Barrier] = {}
        self.deposits: dict[tuple[int, int], dict[int, list[torch.Tensor]]] = {}

    def members(self, round_index: int) -> list[int]:
        return [r for r in range(K) if r not in self.absent.get(round_index, set())]

    def barrier(self, round_index: int, phase: str) -> threading.Barrier:
        with self.lock:
            key = (round_index, phase)
            if key not in self.barriers:
                self.barriers[key] = threading.Barrier(len(self.members(round_index)))
            return self.barriers[key]


class ThreadRounds(RoundAverager):
    def __init__(self, hub: Hub, replica: int) -> None:
        self.hub, self.replica, self.round_index, self.trainer_step, self.means = hub, replica, -1, 0, 0

    def begin(self) -> None:
        self.round_index += 1
        self.means = 0
        self.hub.barrier(self.round_index, "quorum").wait(timeout=30)

    def average_(self, tensors: Sequence[torch.Tensor]) -> None:
        key = (self.round_index, self.means)
        self.means += 1
        with self.hub.lock:
            self.hub.deposits.setdefault(key, {})[self.replica] = [t.clone() for t in tensors]
        self.hub.barrier(self.round_index, f"gathered {key[1]}").wait(timeout=30)
        deposits = self.hub.deposits[key]
        for i, t in enumerate(tensors):
            t.copy_(torch.stack([deposits[r][i] for r in sorted(deposits)]).mean(0))
        self.hub.barrier(self.round_index, f"averaged {key[1]}").wait(timeout=30)

    def commit(self) -> bool:
        return self.round_index not in self.hub.fails

    @property
    def participants(self) -> int:
        return len(self.hub.members(self.round_index))

    @property
    def healed(self) -> bool:
        return False

    @property
    def step(self) -> int:
        return self.trainer_step


def replica_plugin(algo: str, overrides: dict[str, Any], model: Any, opt: Any, steps: int, hub: Hub,
                   index: int) -> tuple[Any, ThreadRounds]:
    """The real plugin on a replica (a world of one), set up as the trainer sets it up, with its
    rounds attached."""
    from core.distenv import DistContext
    from core.schema import typed_section
    from dist_algos import get_algorithm
    from dist_algos.base import TrainInfo
    from tests.support.plugin_harness import hyper_of

    cls = get_algorithm(algo)
    ctx = DistContext(0, 1, 0, 1, 0, 1, torch.device("cpu"), "gloo", 60.0)
    plugin = cls(typed_section(cls.Config, {"name": algo, **overrides}, "algo"), ctx)
    plugin.setup(model, opt, TrainInfo(total_steps=steps, steps_per_epoch=steps, lr_at=lambda s: 0.05,
                                       warmup_steps=0, train_batches=lambda n: iter(()), forward=lambda m, x: m(x),
                                       hyper=hyper_of(opt)))
    rounds = ThreadRounds(hub, index)
    plugin.attach_ft_rounds(rounds)
    return plugin, rounds


def run_replica_threads(algo: str, target: Any, hub: Hub) -> dict[int, Any]:
    """`target(index, model, opt, hub, out)` for every replica in a thread; their results by index.
    The models are built here (their initialisation draws from the global RNG) and the plugin is
    looked up here (the registry fills on first use, which threads must not race)."""
    from dist_algos import get_algorithm

    get_algorithm(algo)
    out: dict[int, Any] = {}
    models, opts = make_workers(K, "sgd")
    threads = [threading.Thread(target=target, args=(i, models[i], opts[i], hub, out)) for i in range(K)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    assert sorted(out) == list(range(K)), "a replica thread failed"
    return out


def replica_run(index: int, model: Any, opt: Any, hub: Hub, out: dict[int, Any]) -> None:
    from dist_algos.base import StepContext

    plugin, rounds = replica_plugin("easgd", {"sync_period": TAU, "moving_rate": BETA}, model, opt, STEPS, hub, index)
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
    out = run_replica_threads("easgd", replica_run, Hub(FAILS, ABSENT))
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


PSGD = {"start_iter": 2, "rank": 1, "min_compression_rate": 1.0}  # small_cnn's matrices compressed from step 2
PSGD_STEPS = 8


def powersgd_replica(index: int, model: Any, opt: Any, hub: Hub, out: dict[int, Any]) -> None:
    """Replica `index`: the real PowerSGD plugin on `ThreadRounds`; per step its weights and its
    plugin state before and after the step."""
    from dist_algos.base import StepContext

    plugin, rounds = replica_plugin("powersgd", PSGD, model, opt, PSGD_STEPS, hub, index)
    steps = []
    for step in range(PSGD_STEPS):
        rounds.trainer_step = step
        xb, yb = worker_batch(index, step, K)
        loss_of(model, xb, yb).backward()
        before = (flat_params(model), plugin.state_dict())
        plugin.step(StepContext(step=step, epoch=0, loss=torch.tensor(0.0), lr=0.05, optimizer_step=opt.step))
        opt.zero_grad(set_to_none=False)
        steps.append({"before": before, "after": (flat_params(model), plugin.state_dict())})
    out[index] = (steps, plugin.summary())


def run_powersgd_replicas(fails: set[int]) -> dict[int, Any]:
    return run_replica_threads("powersgd", powersgd_replica, Hub(fails, {}))


def test_powersgd_rounds_follow_the_plain_three_rank_run() -> None:
    from tests.support.harness import run_ranks
    from tests.support.plugin_harness import plugin_trajectory

    plain = run_ranks(plugin_trajectory, K, "powersgd", PSGD, PSGD_STEPS, "sgd", timeout=240)
    out = run_powersgd_replicas(set())
    assert out[0][1]["compressed_matrices"] > 0 and out[0][1]["failed_rounds"] == []
    for w in range(K):
        for step, record in enumerate(out[w][0]):
            torch.testing.assert_close(record["after"][0], plain[w][step], rtol=0, atol=1e-5,
                                       msg=f"replica {w} step {step}")


def test_a_failed_powersgd_round_takes_no_step_and_restores_its_state() -> None:
    fails = {1, 5}  # one round of the plain phase, one of the compressed phase
    out = run_powersgd_replicas(fails)
    assert out[0][1]["failed_rounds"] == sorted(fails)
    for w in range(K):
        for step, record in enumerate(out[w][0]):
            (params_before, state_before), (params_after, state_after) = record["before"], record["after"]
            if step in fails:
                assert torch.equal(params_after, params_before), f"replica {w} stepped at failed step {step}"
                assert torch.equal(state_after["q"], state_before["q"]) and state_after["q_ready"] == state_before["q_ready"]
                assert state_after["q_inits"] == state_before["q_inits"]
                for e_after, e_before in zip(state_after["errors"], state_before["errors"]):
                    assert torch.equal(e_after, e_before), f"replica {w} error buffer changed at failed step {step}"
            else:
                assert not torch.equal(params_after, params_before)
            # every replica still holds the same model (the same update on every one)
            torch.testing.assert_close(params_after, out[0][0][step]["after"][0], rtol=0, atol=1e-6)
        # and the error buffers at a failed step were not all zero: the restore had something to undo
        assert any(e.abs().sum() > 0 for e in out[w][0][5]["before"][1]["errors"])
