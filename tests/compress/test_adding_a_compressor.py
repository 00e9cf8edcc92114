"""Adding a compressor is one file (issue 22): a module dropped into dist_algos/compress/ with a
`@register_compressor` class is found by the registry, composes in a chain with the existing
stages, runs under error feedback and passes the plugin's pre-launch check, with no other file
edited. The module is written for the test and removed after it; the checks run in a fresh
interpreter so that the registry walks the package as a user's run would."""
from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]

#: the whole of the new compressor: every `stride`-th entry from a shared offset that moves each
#: step (a deterministic relative of random-k); the positions are known to every worker, so only
#: the values travel and the payloads sum
TOY = '''
"""Strided sparsification: every STRIDE-th entry, from an offset shared by all workers."""
from __future__ import annotations

import torch

from dist_algos.compress import register_compressor
from dist_algos.compress.contract import Combine, Compressor, EncodeContext, Payload


@register_compressor("toy_stride")
class ToyStride(Compressor):
    combine = Combine.SUM
    sparsifier = True  # keeps positions: a later stage may compress its `values`

    def __init__(self, stride: str = "4") -> None:
        self.stride = int(stride)
        if self.stride < 1:
            raise ValueError(f"stride {self.stride} must be at least 1")

    def encode(self, x: torch.Tensor, ctx: EncodeContext) -> Payload:
        offset = ctx.step % self.stride
        return Payload({"values": x[offset::self.stride].float().clone()}, x.numel(), {"offset": offset})

    def decode(self, payload: Payload) -> torch.Tensor:
        out = torch.zeros(payload.numel)
        out[int(payload.info["offset"])::self.stride] = payload.tensors["values"]
        return out
'''

CHECKS = '''
import torch
from core.errors import UserError
from dist_algos.base import HyperParams
from dist_algos.compress import build_chain, check_chain, list_compressors
from dist_algos.compress.contract import EncodeContext
from dist_algos.compress.memory import Memory
from dist_algos.compressed_sync import CompressedAllreduce, CompressedConfig

assert "toy_stride" in list_compressors(), list_compressors()
x = torch.arange(1.0, 13.0)
stage = build_chain(["toy_stride:4"])
payload = stage.encode(x, EncodeContext(sizes=[12], step=1))
assert payload.wire_bytes == 3 * 4, payload.wire_bytes  # three float32 values, no indices
dense = stage.decode(payload)
assert torch.equal(dense[1::4], x[1::4]) and dense.count_nonzero() == 3, dense

# composed with an existing stage: the kept values then travel in fp16
chain = build_chain(["toy_stride:4", "fp16"])
assert chain.encode(x, EncodeContext(sizes=[12], step=2)).wire_bytes == 3 * 2

# under classic error feedback what is not sent is carried: over `stride` steps every entry goes
mem, sent = Memory("ef"), torch.zeros(12)
for step in range(4):
    g = mem.prepare(x.clone())  # the gradient plus what earlier steps did not send
    out = stage.decode(stage.encode(g, EncodeContext(sizes=[12], step=step)))
    mem.sent(g, out)
    sent += out
# nothing is lost: what was sent plus the residual still held is every gradient put in, and
# every entry went out once its offset came round
assert torch.allclose(sent + mem.local, 4 * x) and sent.count_nonzero() == 12, (sent, mem.local)

# the plugin's pre-launch check accepts it, and a bad argument is one line naming the override
CompressedAllreduce.validate(CompressedConfig(compress=["toy_stride:4"], feedback="ef"), 2, 2, HyperParams())
try:
    check_chain(["toy_stride:0"], "ef")
except UserError as exc:
    assert "algo.compress" in str(exc) and "stride 0" in str(exc), exc
else:
    raise AssertionError("toy_stride:0 was accepted")
print("OK")
'''


def test_a_compressor_is_one_file() -> None:
    module = REPO / "dist_algos" / "compress" / "toy_stride_for_test.py"
    assert not module.exists()
    module.write_text(textwrap.dedent(TOY))
    try:
        out = subprocess.run([sys.executable, "-c", CHECKS], cwd=REPO, capture_output=True, text=True, timeout=120)
    finally:
        module.unlink()
    assert out.returncode == 0 and out.stdout.strip().endswith("OK"), out.stderr[-3000:]
