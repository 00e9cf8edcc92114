"""The parameter-server plugins (asgd, gradient_dropping, dgc, dgs) on gloo ranks.

- One worker, density 1.0: each method equals its single-process reference (plain SGD, or
  momentum SGD for DGS) to 1e-6, on one server and on two servers (layers split between them);
  the server's global model equals the reference too.
- Bytes: at density 0.01 a dgs exchange (push + reply) moves at most 2.5% of an asgd exchange.
- 2 and 3 workers with random delays on the workers and inside the server: every push answered,
  versions add up, and a DGS worker's model is exactly what the server's records say it holds
  (synced + sent); the round_robin mode gives the same global model twice in a row.
- A worker that dies is dropped and the others finish; a server that dies makes its workers fail
  quickly with a message naming it.
"""
from __future__ import annotations

import os
import random
import signal
import time
from pathlib import Path
from typing import Any, Optional

import pytest
import torch

from tests.support.harness import run_ranks
from tests.support.plugin_harness import flat_params, loss_of, make_model, worker_batch

LR = 0.05
WD = 1e-4
STEPS = 8
SPARSE_ALGOS = ("gradient_dropping", "dgc", "dgs")


def build(rank: int, world: int, algo: str, overrides: dict[str, Any], momentum: float, width: int,
          batch_norm: bool) -> tuple[Any, torch.nn.Module, torch.optim.Optimizer]:
    from dist_algos import get_algorithm
    from core.distenv import init_distributed
    from core.schema import typed_section
    from dist_algos.base import HyperParams, TrainInfo

    ctx = init_distributed("gloo", device="cpu")  # (the model is on the CPU, on a GPU machine too)
    cls = get_algorithm(algo)
    cfg = typed_section(cls.Config, {"name": algo, **overrides}, "algo")
    hyper = HyperParams(optimizer="sgd", peak_lr=LR, momentum=momentum, weight_decay=WD)
    cls.validate(cfg, world, ctx.local_size, hyper)
    plugin = cls(cfg, ctx)
    torch.manual_seed(0)
    from models.small_cnn import small_cnn

    model = small_cnn(1, 8, 10, width=width, batch_norm=batch_norm) if width != 4 else make_model(batch_norm=batch_norm)
    opt = torch.optim.SGD(model.parameters(), lr=LR, momentum=momentum, weight_decay=WD)
    info = TrainInfo(total_steps=STEPS, steps_per_epoch=STEPS, lr_at=lambda s: LR, warmup_steps=0,
                     train_batches=lambda n: iter(()), forward=lambda m, x: m(x), hyper=hyper)
    plugin.setup(model, opt, info)
    return plugin, model, opt


def run_variant(rank: int, world: int, algo: str, overrides: dict[str, Any], steps: int = STEPS,
                momentum: float = 0.9, width: int = 4, batch_norm: bool = False, worker_delay_ms: float = 0.0,
                server_delay_ms: float = 0.0, seed: int = 0, die: Optional[dict[str, Any]] = None,
                out_dir: Optional[str] = None) -> dict[str, Any]:
    """Build `algo` on this rank, train `steps` steps (workers), finalize; report what happened."""
    from dist_algos.base import Role, StepContext
    from dist_algos.param_server.server import ServerState

    plugin, model, opt = build(rank, world, algo, overrides, momentum, width, batch_norm)
    rng = random.Random(seed * 1000 + rank)
    original_apply = ServerState.apply
    if server_delay_ms or (die and die["rank"] == rank and plugin.role() == Role.SERVER):
        def apply(self: ServerState, worker: int, push: Any) -> Any:
            time.sleep(rng.uniform(0, server_delay_ms) / 1000)
            if die and die["rank"] == rank and self.version >= die["after"]:
                os.kill(os.getpid(), signal.SIGKILL)
            return original_apply(self, worker, push)

        ServerState.apply = apply  # this rank's process only
    out: dict[str, Any] = {"traj": [], "rank": rank}
    try:
        workers = plugin.train_ranks()
        if rank in workers:
            for step in range(steps):
                if die and die["rank"] == rank and step == die["after"]:
                    os.kill(os.getpid(), signal.SIGKILL)
                time.sleep(rng.uniform(0, worker_delay_ms) / 1000)
                xb, yb = worker_batch(workers.index(rank), step, len(workers))
                loss = loss_of(model, xb, yb)
                loss.backward()
                try:
                    plugin.step(StepContext(step=step, epoch=0, loss=loss.detach(), lr=LR, optimizer_step=opt.step))
                except RuntimeError as err:
                    out["error"], out["error_at"] = str(err), time.time()
                    break
                opt.zero_grad(set_to_none=False)
                out["traj"].append(flat_params(model))
        if "error" not in out:
            plugin.finalize(model)
        out["comm"] = plugin.comm.as_metrics()
        out["summary"] = plugin.summary()
        if plugin.server is not None:
            state = plugin.server.state
            out["global"] = flat_params(plugin.eval_model(model))
            if state.synced is not None:  # what each worker holds by the server's records
                out["held"] = {w: state.held(w) for w in state.workers}
                out["shard"] = (state.shard.start, state.shard.end)
    finally:
        ServerState.apply = original_apply
        plugin.close()
    if out_dir is not None:  # survives a rank that dies and so fails run_ranks
        torch.save(out, Path(out_dir) / f"rank_{rank}.pt")
    return out


def drive(rank: int, world: int, variants: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [run_variant(rank, world, **v) for v in variants]


def reference(momentum: float) -> list[torch.Tensor]:
    """One process, one worker's batches, torch SGD (the update each method reduces to)."""
    torch.manual_seed(0)
    model = make_model()
    opt = torch.optim.SGD(model.parameters(), lr=LR, momentum=momentum, weight_decay=WD)
    out = []
    for step in range(STEPS):
        xb, yb = worker_batch(0, step, 1)
        opt.zero_grad()
        loss_of(model, xb, yb).backward()
        opt.step()
        out.append(flat_params(model))
    return out


def close_to(got: torch.Tensor, want: torch.Tensor, tol: float = 1e-6) -> bool:
    return torch.allclose(got, want, atol=tol, rtol=0)


# one worker, density 1: (algo, overrides, momentum of the matching torch SGD)
EQUIVALENT = [
    ("asgd", {}, 0.0),
    ("gradient_dropping", {"density": 1.0, "downlink": "sparse"}, 0.0),
    ("gradient_dropping", {"density": 1.0, "downlink": "model"}, 0.0),
    ("dgc", {"density": 1.0, "warmup_epochs": 0}, 0.0),
    ("dgs", {"density": 1.0}, 0.9),
]


def check_equivalent(results: list[dict[str, Any]], cases: list[tuple[str, dict[str, Any], float]],
                     servers: int) -> None:
    worker = servers  # the first (only) worker's rank
    for i, (algo, overrides, momentum) in enumerate(cases):
        want = reference(momentum)
        traj = results[worker][i]["traj"]
        for step, (got, ref) in enumerate(zip(traj, want)):
            assert close_to(got, ref), f"{algo} {overrides} step {step}: max diff {(got - ref).abs().max()}"
        for srv in range(servers):
            assert close_to(results[srv][i]["global"], want[-1]), f"{algo}: server {srv}'s global model"


def test_one_worker_equals_sgd_and_dgs_bytes_are_a_fortieth_of_asgd() -> None:
    bytes_cases = [{"algo": a, "overrides": {}, "steps": 1, "width": 32, "batch_norm": True} for a in ("asgd", "dgs")]
    variants = [{"algo": a, "overrides": o, "momentum": m} for a, o, m in EQUIVALENT] + bytes_cases
    results = run_ranks(drive, 2, variants)
    check_equivalent(results, EQUIVALENT, servers=1)
    asgd, dgs = results[1][len(EQUIVALENT)]["comm"], results[1][len(EQUIVALENT) + 1]["comm"]
    asgd_bytes = asgd["comm_bytes"] + asgd["comm_recv_bytes"]
    dgs_bytes = dgs["comm_bytes"] + dgs["comm_recv_bytes"]
    assert dgs_bytes <= 0.025 * asgd_bytes, f"dgs exchange {dgs_bytes} B vs asgd {asgd_bytes} B"
    # the server counted the same bytes as the worker, both ways
    assert results[0][len(EQUIVALENT) + 1]["comm"]["comm_recv_bytes"] == dgs["comm_bytes"]


def delayed(algo: str, overrides: dict[str, Any], seed: int) -> dict[str, Any]:
    return {"algo": algo, "overrides": overrides, "steps": 12, "worker_delay_ms": 15, "server_delay_ms": 4,
            "seed": seed, "batch_norm": True}


def check_delayed(results: list[list[dict[str, Any]]], index: int, workers: list[int], steps: int = 12) -> None:
    server = results[0][index]
    assert server["summary"]["version"] == steps * len(workers)
    assert server["summary"]["dropped"] == {}
    assert [rec["pushes"] for rec in server["summary"]["workers"]] == [steps] * len(workers)
    for w in workers:
        got = results[w][index]
        assert len(got["traj"]) == steps and got["summary"]["pushes"] == steps, f"worker {w} was not answered"
        if "held" in server:  # a DGS-style worker holds exactly synced + what it was sent
            assert close_to(got["traj"][-1], server["held"][w], 1e-5)


def test_two_workers_with_delays_and_two_servers() -> None:
    cases = [delayed(a, {}, seed) for seed, a in enumerate(("asgd", "gradient_dropping", "dgc", "dgs"))]
    cases += [delayed("dgs", {"serving": "round_robin", "resync_period": 5}, 7),
              delayed("dgs", {"serving": "round_robin", "resync_period": 5}, 8),
              delayed("dgs", {"value_dtype": "float16"}, 9)]
    two_servers = [("asgd", {"servers": 2}, 0.0), ("dgs", {"servers": 2, "density": 1.0}, 0.9)]
    # world 3: one server + two workers for the delay cases, two servers + one worker after them
    results = run_ranks(drive, 3, cases + [{"algo": a, "overrides": o, "momentum": m} for a, o, m in two_servers])
    for i in range(len(cases)):
        check_delayed(results, i, [1, 2])
    # round_robin: same global model whatever the delays
    assert torch.equal(results[0][4]["global"], results[0][5]["global"])
    assert results[0][4]["summary"]["resyncs"] == 24 // 5
    # float16 values: 2 bytes per pushed value instead of 4, the rest of the message unchanged
    from dist_algos.compress.topk import layer_k

    per_push = sum(layer_k([p.numel() for p in make_model(batch_norm=True).parameters()], 0.01))
    fp16, fp32 = results[1][6]["comm"], results[1][3]["comm"]
    assert fp32["comm_bytes"] - fp16["comm_bytes"] == 12 * per_push * 2
    tail = [[r for r in per_rank[len(cases):]] for per_rank in results]
    check_equivalent(tail, two_servers, servers=2)


def test_three_workers_with_delays() -> None:
    cases = [delayed(a, {}, 10 + seed) for seed, a in enumerate(("asgd", "dgs"))]
    results = run_ranks(drive, 4, cases)
    for i in range(len(cases)):
        check_delayed(results, i, [1, 2, 3])
    assert max(r["staleness_max"] for r in results[0][1]["summary"]["workers"]) >= 1  # asynchrony happened


def test_a_dead_worker_is_dropped_and_the_others_finish(tmp_path: Path) -> None:
    variant = {"algo": "dgs", "overrides": {}, "steps": 10, "die": {"rank": 3, "after": 3},
               "worker_delay_ms": 5, "out_dir": str(tmp_path)}
    with pytest.raises(AssertionError, match="rank 3 produced no result"):
        run_ranks(drive, 4, [variant], timeout=60)
    server = torch.load(tmp_path / "rank_0.pt", weights_only=False)
    assert list(server["summary"]["dropped"]) == ["3"]
    assert server["summary"]["version"] == 3 + 2 * 10
    for w in (1, 2):
        assert len(torch.load(tmp_path / f"rank_{w}.pt", weights_only=False)["traj"]) == 10
    assert not (tmp_path / "rank_3.pt").exists()


def test_a_dead_server_makes_workers_fail_fast(tmp_path: Path) -> None:
    variant = {"algo": "asgd", "overrides": {}, "steps": 200, "die": {"rank": 0, "after": 6},
               "out_dir": str(tmp_path)}
    start = time.time()
    with pytest.raises(AssertionError, match="rank 0 produced no result"):
        run_ranks(drive, 3, [variant], timeout=90, env={"SYNCOPT_TEST_TIMEOUT": "60"})
    for w in (1, 2):
        got = torch.load(tmp_path / f"rank_{w}.pt", weights_only=False)
        assert "parameter server rank 0 stopped answering" in got["error"], got.get("error")
        assert got["error_at"] - start < 60
        assert len(got["traj"]) < 200
