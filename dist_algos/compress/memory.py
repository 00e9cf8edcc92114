"""Error feedback as its own choice, per worker (`feedback=`), around any compressor C with
decode D. `x` is what the plugin wants averaged (a gradient, an outer gradient, a model delta);
`own` is D(C(p)) of this worker's own payload; `mean` the average over workers of the decoded
payloads (for a majority vote, the vote).

- `none`: send C(x); result mean.
- `ef` (Seide et al. 2014; Stich et al. 2018; Karimireddy et al. 2019, EF-signSGD): p = x + e,
  send C(p), e = p - own; result mean.
- `ef21` (Richtarik et al. 2021): each worker keeps its estimate g_i and everyone the global g;
  send C(x - g_i), g_i += own, g += mean; result g.
- `decayed:BETA` (SparseLoCo's and DeMo's memory): e = BETA e + x, send C(e), e -= own; result
  mean. With BETA = 1 it is `ef`.
- `momentum:BETA` (Signum, Bernstein et al. 2018): m = BETA m + (1 - BETA) x, send C(m); no
  residual; result mean.
- `samomentum:M` (DGS's SAMomentum, Yan et al. 2020; with a sparsifier): u = M u + x, send C(u);
  the entries sent keep u, the others become u / M (`samomentum_keep_`); result mean.

The tensors are created at the first call and saved by `state_dict` (exact on resume)."""
from __future__ import annotations

from typing import Any, Optional

import torch

KINDS = ("none", "ef", "ef21", "decayed", "momentum", "samomentum")


def samomentum_keep_(velocity: torch.Tensor, idx: torch.Tensor, values: torch.Tensor, momentum: float) -> None:
    """SAMomentum's rule after sending `values` at `idx`: the entries not sent become u / m (the
    next u = m u + step restores them: an undecayed residual), the sent ones keep u, their
    momentum. Shared by `sparse_feedback.samomentum_` (DGS) and the `samomentum` memory."""
    velocity.div_(momentum)
    velocity[idx] = values


class Memory:
    def __init__(self, spec: str = "none") -> None:
        kind, *args = str(spec or "none").split(":")
        if kind not in KINDS:
            raise ValueError(f"feedback {spec!r} is not one of {', '.join(KINDS)} (decayed:BETA, momentum:BETA)")
        self.kind = kind
        self.beta = float(args[0]) if args else 0.9
        if kind in ("decayed", "momentum") and not 0 <= self.beta <= 1:
            raise ValueError(f"feedback {spec!r}: BETA must be in [0, 1]")
        if kind == "samomentum" and not 0 < self.beta <= 1:
            raise ValueError(f"feedback {spec!r}: M must be in (0, 1] (the residual is divided by it)")
        self.local: Optional[torch.Tensor] = None  # e (ef, decayed), g_i (ef21) or m (momentum)
        self.shared: Optional[torch.Tensor] = None  # ef21's global g

    def _zeros(self, x: torch.Tensor) -> torch.Tensor:
        return torch.zeros(x.numel(), dtype=torch.float32)

    def prepare(self, x: torch.Tensor) -> torch.Tensor:
        """What this worker compresses."""
        x = x.reshape(-1).float()
        if self.kind == "none":
            return x
        if self.local is None:
            self.local = self._zeros(x)
        if self.kind == "ef":
            return x + self.local
        if self.kind == "ef21":
            return x - self.local
        if self.kind in ("decayed", "samomentum"):
            self.local.mul_(self.beta).add_(x)
            return self.local.clone()
        self.local.mul_(self.beta).add_(x, alpha=1 - self.beta)  # momentum
        return self.local.clone()

    def sent(self, prepared: torch.Tensor, own: torch.Tensor) -> None:
        """Update the memory with what this worker's payload decodes to."""
        if self.kind == "ef":
            assert self.local is not None
            self.local.copy_(prepared - own)
        elif self.kind == "decayed":
            assert self.local is not None
            self.local.sub_(own)
        elif self.kind == "ef21":
            assert self.local is not None
            self.local.add_(own)
        elif self.kind == "samomentum":
            assert self.local is not None
            idx = torch.nonzero(own).flatten()
            samomentum_keep_(self.local, idx, prepared[idx], self.beta)

    def result(self, mean: torch.Tensor) -> torch.Tensor:
        if self.kind != "ef21":
            return mean
        if self.shared is None:
            self.shared = self._zeros(mean)
        self.shared.add_(mean)
        return self.shared.clone()

    def state_dict(self) -> dict[str, Any]:
        return {"kind": self.kind, "local": None if self.local is None else self.local.clone(),
                "shared": None if self.shared is None else self.shared.clone()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if state["kind"] != self.kind:
            raise ValueError(f"checkpoint has error feedback {state['kind']!r}, the config {self.kind!r}")
        self.local = None if state["local"] is None else state["local"].clone()
        self.shared = None if state["shared"] is None else state["shared"].clone()
