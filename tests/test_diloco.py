"""diloco on K gloo ranks equals K simulated DiLoCo workers in one process (to 1e-6).

The reference below is plain PyTorch with no communication and none of the plugin's code: K
model copies with their own inner optimizers, a global model with its own `torch.optim.SGD`
(Nesterov or plain momentum) as the outer optimizer; after every H / F inner steps the next
fragment's parameters are averaged over the workers, the outer gradient (global minus average)
is handed to the outer optimizer, and the workers copy the new global fragment. The last round is
cut short at the last step, where every fragment takes a last outer step. Variants cover SGD and
AdamW inner optimizers, plain and Nesterov outer momentum, Streaming DiLoCo's fragments, and the
evaluated model (global weights, BatchNorm statistics per `bn`).
"""
from __future__ import annotations

import copy
from typing import Any

import pytest
import torch

from tests.support.harness import run_ranks
from dist_algos.base import HyperParams
from tests.support.plugin_harness import hyper_of, flat_params, grad_step, loss_of, make_model, make_optimizer, worker_batch

K = 3  # not a power of two, so the divide in the average is not exact in binary
STEPS = 20
# the test model's parameter tensors (conv, conv, linear, linear; weight and bias each) in each
# fragment, as the plugin must cut them: contiguous runs closing at (f + 1) / F of the 2570 entries
FRAGMENTS = {1: [range(0, 8)], 2: [range(0, 5), range(5, 8)], 4: [range(0, 5), range(5, 6), range(6, 7), range(7, 8)]}


def variant(kind: str, **algo: Any) -> dict[str, Any]:
    extra = {k: algo.pop(k) for k in ("batch_norm", "eval_at") if k in algo}
    return {"kind": kind, "algo": {"inner_steps": 6, "outer_lr": 0.7, "outer_momentum": 0.9, "nesterov": True,
                                   "fragments": 1, **algo}, "batch_norm": False, "eval_at": None, **extra}


VARIANTS = [
    variant("sgd"),  # H = 6: rounds end at 6, 12, 18 and, cut short, 20
    variant("adamw", inner_steps=5, nesterov=False, outer_momentum=0.5, outer_lr=0.9),
    variant("sgd", fragments=2),  # a fragment every 3 steps
    variant("adamw", inner_steps=4, fragments=4),  # a fragment every step
    variant("sgd", inner_steps=4, batch_norm=True, bn="average", eval_at=10),
    variant("sgd", inner_steps=4, batch_norm=True, bn="local", eval_at=10),
]


def name_of(v: dict[str, Any]) -> str:
    a = v["algo"]
    return (f"{v['kind']}-H{a['inner_steps']}-F{a['fragments']}-{'nesterov' if a['nesterov'] else 'momentum'}"
            + (f"-bn_{a['bn']}" if v["batch_norm"] else ""))


# ---- the plugin, on K ranks -------------------------------------------------------------------
def run_variants(rank: int, world: int, variants: list[dict[str, Any]]) -> list[dict[str, Any]]:
    from core.distenv import init_distributed
    from core.schema import typed_section
    from dist_algos import get_algorithm
    from dist_algos.base import StepContext, TrainInfo

    ctx = init_distributed("gloo", device="cpu")  # (the model is on the CPU, on a GPU machine too)
    cls = get_algorithm("diloco")
    out = []
    for v in variants:
        cfg = typed_section(cls.Config, {"name": "diloco", **v["algo"]}, "algo")
        plugin = cls(cfg, ctx)
        model = make_model(batch_norm=v["batch_norm"])
        opt = make_optimizer(model, v["kind"])
        cls.validate(cfg, world, world, hyper_of(opt))
        info = TrainInfo(total_steps=STEPS, steps_per_epoch=STEPS, lr_at=lambda s: opt.param_groups[0]["lr"],
                         warmup_steps=0, train_batches=lambda n: iter(()), forward=lambda m, x: m(x))
        plugin.setup(model, opt, info)
        traj, evaluated = [], None
        for step in range(STEPS):
            loss = loss_of(model, *worker_batch(rank, step, world))
            loss.backward()
            plugin.step(StepContext(step=step, epoch=0, loss=loss.detach(), lr=0.05, optimizer_step=opt.step))
            opt.zero_grad(set_to_none=False)
            traj.append(flat_params(model))
            if v["eval_at"] == step + 1:
                evaluated = {k: t.clone() for k, t in plugin.eval_model(model).state_dict().items()}
        plugin.finalize(model)
        traj.append(flat_params(model))
        out.append({"traj": traj, "syncs": plugin.comm.syncs, "evaluated": evaluated})
    return out


# ---- the reference: K workers and a global model in one process ---------------------------------
class Reference:
    def __init__(self, v: dict[str, Any]) -> None:
        algo = v["algo"]
        base = make_model(batch_norm=v["batch_norm"])
        self.workers = [copy.deepcopy(base) for _ in range(K)]
        self.inner = [make_optimizer(m, v["kind"]) for m in self.workers]
        self.global_model = copy.deepcopy(base)
        self.outer = torch.optim.SGD(self.global_model.parameters(), lr=algo["outer_lr"],
                                     momentum=algo["outer_momentum"], nesterov=algo["nesterov"])
        count = len(list(base.parameters()))  # the BatchNorm model has more tensors: one fragment
        self.fragments = FRAGMENTS[algo["fragments"]] if algo["fragments"] > 1 else [range(count)]
        self.average_stats = algo.get("bn") == "average"
        self.syncs = 0

    def outer_step(self, fragments: list[int]) -> None:
        """Average the fragments over the workers, step the outer optimizer on them, broadcast."""
        self.syncs += 1
        globals_ = list(self.global_model.parameters())
        workers = [list(m.parameters()) for m in self.workers]
        chosen = {i for f in fragments for i in self.fragments[f]}
        with torch.no_grad():
            for i, g in enumerate(globals_):
                if i in chosen:
                    mean = torch.stack([w[i] for w in workers]).mean(0)
                    g.grad = g.detach() - mean
                else:
                    g.grad = None  # torch's SGD leaves it and its momentum alone
        self.outer.step()
        with torch.no_grad():
            for i in chosen:
                for w in workers:
                    w[i].copy_(globals_[i])
            if self.average_stats:
                stats = [[b for b in m.buffers() if b.is_floating_point()] for m in self.workers]
                for j, g in enumerate(b for b in self.global_model.buffers() if b.is_floating_point()):
                    g.copy_(torch.stack([s[j] for s in stats]).mean(0))
                    for s in stats:
                        s[j].copy_(g)

    def evaluated(self) -> dict[str, torch.Tensor]:
        """Global weights; BN statistics: global (averaged at outer steps) or worker 0's current ones."""
        if self.average_stats:
            return {k: v.clone() for k, v in self.global_model.state_dict().items()}
        model = copy.deepcopy(self.workers[0])
        model.load_state_dict({k: v for k, v in self.global_model.state_dict().items()
                               if k in dict(self.global_model.named_parameters())}, strict=False)
        return model.state_dict()


def reference(v: dict[str, Any]) -> dict[str, Any]:
    algo = v["algo"]
    ref = Reference(v)
    stride = algo["inner_steps"] // algo["fragments"]
    traj: list[list[torch.Tensor]] = [[] for _ in range(K)]
    since, next_fragment, evaluated = 0, 0, None
    for step in range(STEPS):
        for w, (m, o) in enumerate(zip(ref.workers, ref.inner)):
            grad_step(m, o, *worker_batch(w, step, K))
            o.step()
        since += 1
        if since == stride or step + 1 == STEPS:
            ref.outer_step([next_fragment])
            next_fragment, since = (next_fragment + 1) % algo["fragments"], 0
        for w, m in enumerate(ref.workers):
            traj[w].append(flat_params(m))
        if v["eval_at"] == step + 1:
            evaluated = ref.evaluated()
    rest = [f for f in range(algo["fragments"]) if f != (next_fragment - 1) % algo["fragments"]]
    if rest:  # the end: every other fragment, which has had inner steps since its outer step
        ref.outer_step(rest)
    for w, m in enumerate(ref.workers):
        traj[w].append(flat_params(m))
    return {"traj": traj, "syncs": ref.syncs, "evaluated": evaluated}


# ---- tests -------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def plugin_runs() -> list[list[dict[str, Any]]]:
    return run_ranks(run_variants, K, VARIANTS, timeout=300)


@pytest.mark.parametrize("index", range(len(VARIANTS)), ids=[name_of(v) for v in VARIANTS])
def test_equals_reference_simulation(plugin_runs: list[list[dict[str, Any]]], index: int) -> None:
    v = VARIANTS[index]
    want = reference(v)
    for rank, runs in enumerate(plugin_runs):
        got = runs[index]
        for step, (a, b) in enumerate(zip(got["traj"], want["traj"][rank])):
            assert torch.allclose(a, b, atol=1e-6, rtol=0), \
                f"rank {rank} after step {step + 1}: max diff {(a - b).abs().max().item():.3g}"
        assert got["syncs"] == want["syncs"]
        if want["evaluated"] is not None:
            for key, ref in want["evaluated"].items():
                if ref.is_floating_point():
                    assert torch.allclose(got["evaluated"][key], ref, atol=1e-6, rtol=0), f"eval model {key}"
    final = [runs[index]["traj"][-1] for runs in plugin_runs]
    assert all(torch.equal(f, final[0]) for f in final), "the final model is not one global model"


def test_fragments_are_contiguous_runs_of_nearly_equal_size() -> None:
    from dist_algos.diloco import split_fragments

    sizes = [p.numel() for p in make_model().parameters()]
    for count, expected in FRAGMENTS.items():
        assert [range(s.start, s.stop) for s in split_fragments(sizes, count)] == expected
    assert split_fragments([10, 10, 10, 10], 2) == [slice(0, 2), slice(2, 4)]
    assert split_fragments([1, 1, 1, 100], 3) == [slice(0, 2), slice(2, 3), slice(3, 4)]  # one tensor each at least


def test_outer_lr_one_without_momentum_is_local_sgd() -> None:
    """The outer step with lr 1 and no momentum puts the global model at the workers' average."""
    from dist_algos.diloco import outer_step_

    g, avg = torch.tensor([1.0, 2.0]), torch.tensor([3.0, -1.0])
    outer_step_(g, torch.zeros(2), avg, lr=1.0, momentum_factor=0.0, nesterov=False)
    assert torch.equal(g, torch.tensor([3.0, -1.0])) and torch.equal(avg, g)


@pytest.mark.parametrize("override, message", [
    ({"inner_steps": 0}, "algo.inner_steps"),
    ({"outer_lr": 0.0}, "algo.outer_lr"),
    ({"outer_momentum": 1.0}, "algo.outer_momentum"),
    ({"fragments": 0}, "algo.fragments"),
    ({"inner_steps": 10, "fragments": 3}, "algo.fragments=3 must divide algo.inner_steps=10"),
    ({"bn": "sync"}, "algo.bn"),
])
def test_bad_settings_are_one_line_user_errors(override: dict[str, Any], message: str) -> None:
    from core.errors import UserError
    from core.schema import typed_section
    from dist_algos import get_algorithm

    cls = get_algorithm("diloco")
    with pytest.raises(UserError, match=message) as err:
        cls.validate(typed_section(cls.Config, {"name": "diloco", **override}, "algo"), 4, 4, HyperParams())
    assert "\n" not in str(err.value)


def test_too_many_fragments_for_the_model() -> None:
    from core.errors import UserError
    from dist_algos.diloco import split_fragments

    with pytest.raises(UserError, match="algo.fragments=9 is more than the model's 8 parameter tensors"):
        split_fragments([p.numel() for p in make_model().parameters()], 9)


@pytest.mark.slow
def test_resume_is_bit_exact_streaming_with_adamw_and_averaged_statistics(tmp_path: Any) -> None:
    """Streaming DiLoCo's turn (next fragment, which ones have pending inner steps), the global
    model with its averaged BN statistics, the outer momentum and the inner AdamW state: an
    interrupted-and-resumed run must equal the uninterrupted one (the stop falls mid-round)."""
    from tests.test_resume_registry import algo_overrides, resume_scenario

    overrides = algo_overrides("diloco") + ["optim=adamw", "optim.lr=3e-3", "algo.inner_steps=8",
                                            "algo.fragments=4", "algo.bn=average"]
    diffs = run_ranks(resume_scenario, 2, overrides, str(tmp_path), timeout=300)
    for rank, d in enumerate(diffs):
        assert not d, f"rank {rank}: resumed state differs at {d[:10]}"
