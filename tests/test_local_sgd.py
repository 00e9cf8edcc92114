"""local_sgd on K gloo ranks equals K simulated workers in one process, for every schedule.

The reference below is plain PyTorch with no communication: K model copies with their own
optimizers, each stepping on its own batch, averaged in place when its own (independently
written) H rule says so. Every schedule runs with SGD and with AdamW; further variants average
optimizer fields through tiny buckets, and check the evaluated model for each BatchNorm mode
(and that evaluating leaves training untouched). All variants share one `run_ranks` call.
"""
from __future__ import annotations

import copy
import math
from typing import Any, Callable

import pytest
import torch
import torch.nn as nn

from dist_algos.schedules.sync import SyncRule
from tests.support.harness import run_ranks
from dist_algos.base import HyperParams
from tests.support.plugin_harness import hyper_of, flat_params, grad_step, loss_of, make_model, make_optimizer, worker_batch

K = 3  # not a power of two, so the divide in the average is not exact in binary
STEPS = 20
WARMUP = 4
PEAK = {"sgd": 0.05, "adamw": 0.005}
ALPHA = {"sgd": 0.08, "adamw": 0.008}  # H starts at H_base=2 after warmup and grows past 10


def lr_schedule(kind: str, warmup: int = WARMUP, total: int = STEPS) -> Callable[[int], float]:
    peak = PEAK[kind]

    def lr_at(step: int) -> float:
        if step < warmup:
            return peak * (step + 1) / warmup
        return peak * 0.5 * (1 + math.cos(math.pi * min(1.0, (step - warmup) / (total - warmup))))

    return lr_at


def variant(schedule: str, kind: str, **overrides: Any) -> dict[str, Any]:
    extra = {k: overrides.pop(k) for k in ("batch_norm", "eval_at", "world") if k in overrides}
    algo = {"sync_schedule": schedule, "period": 2, "warmup_period": 3, "alpha": ALPHA[kind], "power": 2.0,
            "switch_step": 6, **overrides}
    return {"kind": kind, "algo": algo, "batch_norm": False, "eval_at": None, **extra}


SCHEDULE_VARIANTS = [variant(s, kind) for kind in ("sgd", "adamw") for s in ("constant", "qsr", "linear", "post_local")]
EXTRA_VARIANTS = [
    variant("qsr", "sgd", average_optimizer_fields=["momentum_buffer"], bucket_mb=0.001),
    variant("constant", "adamw", period=3, average_optimizer_fields=["exp_avg", "exp_avg_sq"], bucket_mb=0.001),
    variant("post_local", "sgd", batch_norm=True, bn="average", eval_at=9),
    *[variant("constant", "sgd", period=3, batch_norm=True, bn=bn, bn_batches=2 * K, eval_at=8)
      for bn in ("local", "average", "recompute")],
]
VARIANTS = SCHEDULE_VARIANTS + EXTRA_VARIANTS


def bn_batches_of(worker: int, world: int) -> Callable[[int], Any]:
    """Worker w's fresh training batches for BN re-estimation (distinct from its training batches)."""
    return lambda n: (worker_batch(worker, 1000 + i, world) for i in range(n))


# ---- the plugin, on K ranks -------------------------------------------------------------------
def run_variants(rank: int, world: int, variants: list[dict[str, Any]]) -> dict[str, Any]:
    from dist_algos import get_algorithm
    from dist_algos.base import StepContext, TrainInfo
    from dist_algos.comm.flat import FlatBuffer, average_
    from core.schema import typed_section
    from core.distenv import init_distributed

    ctx = init_distributed("gloo", device="cpu")  # (the model is on the CPU, on a GPU machine too)
    # PyTorch's averager test: rank r holds r + i; the bucketed average must be the exact mean
    filled = [torch.arange(n, dtype=torch.float64) + rank for n in (5, 1000, 37)]
    average_(FlatBuffer(filled), None, world, bucket_bytes=64, inflight=3)
    averages_exact = all(torch.equal(t, torch.arange(t.numel(), dtype=torch.float64) + (world - 1) / 2) for t in filled)

    cls = get_algorithm("local_sgd")
    out = []
    for v in variants:
        cfg = typed_section(cls.Config, {"name": "local_sgd", **v["algo"]}, "algo")
        plugin = cls(cfg, ctx)
        model = make_model(batch_norm=v["batch_norm"])
        opt = make_optimizer(model, v["kind"])
        cls.validate(cfg, world, world, hyper_of(opt))
        lr_at = lr_schedule(v["kind"])
        info = TrainInfo(total_steps=STEPS, steps_per_epoch=STEPS, lr_at=lr_at, warmup_steps=WARMUP,
                         train_batches=bn_batches_of(rank, world), forward=lambda m, x: m(x))
        plugin.setup(model, opt, info)
        traj, evaluated = [], None
        for step in range(STEPS):
            for g in opt.param_groups:
                g["lr"] = lr_at(step)
            xb, yb = worker_batch(rank, step, world)
            loss = loss_of(model, xb, yb)
            loss.backward()
            plugin.step(StepContext(step=step, epoch=0, loss=loss.detach(), lr=lr_at(step), optimizer_step=opt.step))
            opt.zero_grad(set_to_none=False)
            traj.append(flat_params(model))
            if v["eval_at"] == step + 1:
                evaluated = {k: t.clone() for k, t in plugin.eval_model(model).state_dict().items()}
        plugin.finalize(model)
        traj.append(flat_params(model))
        out.append({"traj": traj, "syncs": plugin.comm.syncs, "rounds": plugin.summary()["H_rounds"],
                    "evaluated": evaluated, "H_seen": sorted({r[1] for r in plugin.rounds})})
    return {"averages_exact": averages_exact, "variants": out}


# ---- the reference: K workers in one process ----------------------------------------------------
def reference_period(algo: dict[str, Any], steps_done: int, lr: float) -> int:
    """QSR's adjust_h, written out again: warmup/alpha=0 -> init_h; else max(floor((a/lr)^p), min_h);
    never beyond the steps left; post-local: 1 before the switch."""
    left = STEPS - steps_done
    if algo["sync_schedule"] == "constant":
        h = algo["period"]
    elif algo["sync_schedule"] == "post_local":
        h = 1 if steps_done < algo["switch_step"] else algo["period"]
    elif steps_done < WARMUP:
        h = algo["warmup_period"]
    else:
        power = 1.0 if algo["sync_schedule"] == "linear" else algo["power"]
        h = max(int((algo["alpha"] / lr) ** power) if lr > 0 else left, algo["period"])
    return max(min(h, left), 1)


def mean_into(tensors: list[torch.Tensor]) -> None:
    mean = torch.stack(tensors).mean(0)
    for t in tensors:
        t.copy_(mean)


def reference(v: dict[str, Any]) -> dict[str, Any]:
    algo, kind = v["algo"], v["kind"]
    base = make_model(batch_norm=v["batch_norm"])
    models = [copy.deepcopy(base) for _ in range(K)]
    opts = [make_optimizer(m, kind) for m in models]
    lr_at = lr_schedule(kind)
    fields = algo.get("average_optimizer_fields", [])
    bn = algo.get("bn", "local")

    def average_models() -> None:
        with torch.no_grad():
            for ps in zip(*(m.parameters() for m in models)):
                mean_into(list(ps))
            if bn == "average":
                for bs in zip(*(m.buffers() for m in models)):
                    if bs[0].is_floating_point():
                        mean_into(list(bs))
            for name in fields:
                for ps in zip(*(m.parameters() for m in models)):
                    mean_into([o.state[p][name] for o, p in zip(opts, ps)])

    period, since, rounds, syncs, evaluated = reference_period(algo, 0, lr_at(0)), 0, [], 0, None
    traj: list[list[torch.Tensor]] = [[] for _ in range(K)]
    for step in range(STEPS):
        for o in opts:
            for g in o.param_groups:
                g["lr"] = lr_at(step)
        for w, (m, o) in enumerate(zip(models, opts)):
            grad_step(m, o, *worker_batch(w, step, K))
        parallel = algo["sync_schedule"] == "post_local" and step < algo["switch_step"]
        if parallel:
            for ps in zip(*(m.parameters() for m in models)):
                mean_into([p.grad for p in ps])
        for o in opts:
            o.step()
        since += 1
        if parallel or since >= period:
            if not parallel:
                average_models()
            syncs += 1
            rounds.append((step + 1 - since, since))
            since, period = 0, reference_period(algo, step + 1, lr_at(step + 1))
        for w, m in enumerate(models):
            traj[w].append(flat_params(m))
        if v["eval_at"] == step + 1:
            evaluated = reference_eval(models, bn, algo.get("bn_batches", 16))
    if since:
        average_models()
        syncs += 1
    for w, m in enumerate(models):
        traj[w].append(flat_params(m))
    return {"traj": traj, "syncs": syncs, "rounds": rounds, "evaluated": evaluated}


def reference_eval(models: list[nn.Module], bn: str, bn_batches: int) -> dict[str, torch.Tensor]:
    """The model local_sgd should evaluate: mean weights; BN statistics per mode."""
    copies = [copy.deepcopy(m) for m in models]
    with torch.no_grad():
        for ps in zip(*(m.parameters() for m in copies)):
            mean_into(list(ps))
        stats = lambda m: [b for name, b in m.named_buffers() if name.endswith(("running_mean", "running_var"))]  # noqa: E731
        if bn == "average":
            for bs in zip(*(stats(m) for m in copies)):
                mean_into(list(bs))
        elif bn == "local":
            for bs in zip(*(stats(m) for m in copies)):
                for b in bs[1:]:
                    b.copy_(bs[0])
        else:  # recompute: cumulative average over bn_batches // K fresh batches per worker, then mean
            for w, m in enumerate(copies):
                m.train()
                for layer in m.modules():
                    if isinstance(layer, nn.BatchNorm2d):
                        layer.reset_running_stats()
                        layer.momentum = None  # None = cumulative moving average, as momentum 1/(1+i)
                for x, _ in bn_batches_of(w, K)(bn_batches // K):
                    m(x)
            for bs in zip(*(stats(m) for m in copies)):
                mean_into(list(bs))
    return copies[0].state_dict()


# ---- tests -------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def plugin_runs() -> list[dict[str, Any]]:
    return run_ranks(run_variants, K, VARIANTS, timeout=300)


def test_bucketed_average_is_the_exact_mean(plugin_runs: list[dict[str, Any]]) -> None:
    assert all(r["averages_exact"] for r in plugin_runs)


@pytest.mark.parametrize("index", range(len(VARIANTS)),
                         ids=[f"{v['algo']['sync_schedule']}-{v['kind']}"
                              + (f"-{'+'.join(v['algo']['average_optimizer_fields'])}" if v['algo'].get('average_optimizer_fields') else "")
                              + (f"-bn_{v['algo']['bn']}" if v['batch_norm'] else "") for v in VARIANTS])
def test_equals_reference_simulation(plugin_runs: list[dict[str, Any]], index: int) -> None:
    v = VARIANTS[index]
    want = reference(v)
    for rank, run in enumerate(plugin_runs):
        got = run["variants"][index]
        for step, (a, b) in enumerate(zip(got["traj"], want["traj"][rank])):
            assert torch.allclose(a, b, atol=1e-6, rtol=0), \
                f"rank {rank} after step {step + 1}: max diff {(a - b).abs().max().item():.3g}"
        assert got["syncs"] == want["syncs"]
        expanded = [(first + i * h, h) for first, h, n in got["rounds"] for i in range(n)]
        assert expanded == want["rounds"], "the H of each round differs from the reference rule"
        if want["evaluated"] is not None:
            for key, ref in want["evaluated"].items():
                if ref.is_floating_point():
                    assert torch.allclose(got["evaluated"][key], ref, atol=1e-6, rtol=0), f"eval model {key}"
    if v["algo"]["sync_schedule"] in ("qsr", "linear"):
        assert len(plugin_runs[0]["variants"][index]["H_seen"]) >= 3, "H never grew: the rule went untested"


# ---- the H rule itself -------------------------------------------------------------------------
def rule(schedule: str, **kw: Any) -> SyncRule:
    args = dict(schedule=schedule, sync_period=4, warmup_period=2, alpha=0.0175, power=2.0, switch_step=10,
                warmup_steps=100, total_steps=1000)
    return SyncRule(**{**args, **kw})


def test_qsr_rule_warmup_floor_and_steps_left() -> None:
    r = rule("qsr")
    assert r.period_after(0, 0.008) == 2 and r.period_after(99, 1e-9) == 2  # warmup: init H whatever the LR
    assert r.period_after(100, 0.008) == 4  # (0.0175/0.008)^2 = 4.79 -> 4 = H_base
    assert r.period_after(100, 0.005) == 12  # 3.5^2 = 12.25 -> floor
    assert r.period_after(100, 0.0175 / 2.999) == 8  # 8.994: floor, not round
    assert r.period_after(100, 0.01) == 4  # 3.06 < H_base
    assert r.period_after(990, 0.001) == 10  # 306 capped by the 10 steps left
    assert r.period_after(999, 0.0) == 1 and r.period_after(500, 0.0) == 500  # LR 0: to the end
    assert rule("qsr", alpha=0.0).period_after(500, 1e-6) == 2  # alpha 0: the init H throughout


def test_linear_constant_and_post_local_rules() -> None:
    assert rule("linear").period_after(100, 0.0025) == 7  # 0.0175/0.0025 = 7, power 1 whatever `power` says
    assert rule("linear", power=3.0).period_after(100, 0.0025) == 7
    assert rule("qsr").period_after(100, 0.0025) == 49
    c = rule("constant")
    assert [c.period_after(s, 1.0) for s in (0, 50, 996, 999)] == [4, 4, 4, 1]
    p = rule("post_local")
    assert [p.parallel_at(s) for s in (0, 9, 10)] == [True, True, False]
    assert [p.period_after(s, 0.1) for s in (1, 9, 10, 998)] == [1, 1, 4, 2]


def test_h_changes_only_right_after_an_average() -> None:
    """One process (world of one): with the LR falling every step, H is re-decided at syncs only."""
    from dist_algos import get_algorithm
    from dist_algos.base import StepContext, TrainInfo
    from core.distenv import DistContext

    cls = get_algorithm("local_sgd")
    cfg = cls.Config(sync_schedule="qsr", period=2, warmup_period=3, alpha=0.1)
    plugin = cls(cfg, DistContext(0, 1, 0, 1, 0, 1, torch.device("cpu"), "gloo", 60.0))
    model = make_model()
    opt = make_optimizer(model, "sgd")
    total = 60
    lr_at = lambda s: 0.1 * (1 - s / total)  # noqa: E731
    plugin.setup(model, opt, TrainInfo(total, total, lr_at, 5, lambda n: iter(()), lambda m, x: m(x)))
    history = []
    for step in range(total):
        loss = loss_of(model, *worker_batch(0, step, 1))
        loss.backward()
        before = (plugin.metrics()["H"], plugin.comm.syncs)
        plugin.step(StepContext(step, 0, loss.detach(), lr_at(step), opt.step))
        opt.zero_grad()
        history.append((before, (plugin.metrics()["H"], plugin.comm.syncs)))
    assert all(h0 == h1 for (h0, s0), (h1, s1) in history if s0 == s1), "H changed between syncs"
    assert history[0][0][0] == 3 and {h for _, (h, _) in history} > {2, 3}
    assert sum(plugin.rounds[i][1] * plugin.rounds[i][2] for i in range(len(plugin.rounds))) == total


@pytest.mark.parametrize("override, message", [
    ({"sync_schedule": "quadratic"}, "algo.sync_schedule"),
    ({"period": 0}, "algo.period"),
    ({"warmup_period": 0}, "algo.warmup_period"),
    ({"alpha": -1.0}, "algo.alpha"),
    ({"bn": "sync"}, "algo.bn"),
    ({"average_optimizer_fields": ["exp_avg", "exp_avg"]}, "algo.average_optimizer_fields"),
    ({"average_optimizer_fields": ["momentum"]}, "algo.average_optimizer_fields"),
])
def test_bad_settings_are_one_line_user_errors(override: dict[str, Any], message: str) -> None:
    from dist_algos import get_algorithm
    from core.errors import UserError

    cls = get_algorithm("local_sgd")
    with pytest.raises(UserError, match=message) as err:
        cls.validate(cls.Config(**override), 4, 4, HyperParams())
    assert "\n" not in str(err.value)


def test_optimizer_fields_must_exist_in_the_optimizer() -> None:
    from dist_algos.local_sgd import check_optimizer_fields
    from core.errors import UserError

    model = make_model()
    with pytest.raises(UserError, match="exp_avg needs optim=adamw"):
        check_optimizer_fields(make_optimizer(model, "sgd"), ["exp_avg"])
    with pytest.raises(UserError, match="momentum_buffer needs"):
        check_optimizer_fields(make_optimizer(model, "adamw"), ["momentum_buffer"])
    check_optimizer_fields(make_optimizer(model, "adamw"), ["exp_avg", "exp_avg_sq"])


# ---- exact resume of the stateful variants (the registry test covers the default config) -------
@pytest.mark.slow
def test_resume_is_bit_exact_with_qsr_fields_and_bn_recompute(tmp_path: Any) -> None:
    """QSR's H and round log, optimizer fields that join the flat buffer only at the first sync
    (before the checkpoint in one run, at set-up in the resumed one) and BN re-estimation at
    every eval: an interrupted-and-resumed run must still equal the uninterrupted one."""
    from tests.test_resume_registry import algo_overrides, resume_configs, resume_scenario

    overrides = algo_overrides("local_sgd") + [
        "optim=adamw", "algo.sync_schedule=qsr", "algo.alpha=0.01", "algo.period=2", "algo.warmup_period=3",
        "sched.warmup_steps=4", "algo.average_optimizer_fields=[exp_avg,exp_avg_sq]", "algo.bn=recompute",
        "algo.bn_batches=4", "algo.bn_micro_batch=8"]
    diffs = run_ranks(resume_scenario, 2, resume_configs(overrides), str(tmp_path), timeout=300)
    for rank, d in enumerate(diffs):
        assert not d, f"rank {rank}: resumed state differs at {d[:10]}"
