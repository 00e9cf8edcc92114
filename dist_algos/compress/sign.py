"""Sign compressors, one bit per entry (packed; >= 0 counts as +).

- `sign`: scaled sign, ||g||_1 / n sign(g) per layer (EF-signSGD, Karimireddy et al. 2019, which
  runs it with error feedback; one float32 scale per layer is sent), payloads gathered;
- `signmv`: signSGD with majority vote (Bernstein et al., ICLR 2019): the workers' signs are
  gathered and the result is sign(sum of signs), entries with a tied vote 0. With momentum
  memory (`feedback=momentum`) it is Signum's distributed form."""
from __future__ import annotations

import torch

from dist_algos.compress import register_compressor
from dist_algos.compress.bits import pack, unpack
from dist_algos.compress.blocks import layer_ids, per_layer
from dist_algos.compress.contract import Combine, Compressor, EncodeContext, Payload


def sign_bits(x: torch.Tensor) -> torch.Tensor:
    return pack((x < 0).to(torch.uint8), 1)


def signs_of(packed: torch.Tensor, n: int) -> torch.Tensor:
    return 1.0 - 2.0 * unpack(packed, 1, n).float()


@register_compressor("sign")
class ScaledSign(Compressor):
    combine = Combine.GATHER

    def encode(self, x: torch.Tensor, ctx: EncodeContext) -> Payload:
        sizes = list(ctx.sizes)
        scales = per_layer(x, sizes, "l1") / torch.tensor(sizes, dtype=torch.float32).clamp(min=1)
        return Payload({"scales": scales, "signs": sign_bits(x)}, x.numel(), info={"sizes": sizes})

    def decode(self, payload: Payload) -> torch.Tensor:
        scale = payload.tensors["scales"][layer_ids(payload.info["sizes"])]  # type: ignore[arg-type]
        return signs_of(payload.tensors["signs"], payload.numel) * scale


@register_compressor("signmv")
class MajorityVoteSign(Compressor):
    combine = Combine.VOTE

    def encode(self, x: torch.Tensor, ctx: EncodeContext) -> Payload:
        return Payload({"signs": sign_bits(x)}, x.numel())

    def decode(self, payload: Payload) -> torch.Tensor:
        return signs_of(payload.tensors["signs"], payload.numel)
