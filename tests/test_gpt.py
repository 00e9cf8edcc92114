"""model=gpt: logits of the right shape, causal (a later token never changes an earlier position's
logits), the parameter count of its formula, tied weights, and the refusals before launch."""
from __future__ import annotations

import pytest
import torch

from core.errors import UserError
from core.spec import ImageSpec, TextSpec
from models import build_model, check_buildable
from models.gpt import num_parameters

SPEC = TextSpec(vocab_size=75, context_length=32)


def small(**options) -> torch.nn.Module:
    return build_model({"name": "gpt", "layers": 2, "heads": 2, "width": 32, **options}, SPEC)


def test_logits_per_position() -> None:
    model = small().eval()
    tokens = torch.randint(0, 75, (3, 32))
    assert model(tokens).shape == (3, 32, 75)
    assert model(tokens[:, :10]).shape == (3, 10, 75)  # shorter windows are fine
    check_buildable({"name": "gpt"}, TextSpec(75, 256))


@pytest.mark.parametrize("dropout", [0.0, 0.3])
def test_a_later_token_never_changes_earlier_logits(dropout: float) -> None:
    torch.manual_seed(0)
    model = small(dropout=dropout).eval()
    tokens = torch.randint(0, 75, (4, 32))
    for t in (0, 5, 31):
        changed = tokens.clone()
        changed[:, t:] = (changed[:, t:] + 1 + torch.arange(32 - t)) % 75
        before, after = model(tokens), model(changed)
        assert torch.equal(before[:, :t], after[:, :t])
        assert not torch.allclose(before[:, t], after[:, t])  # and the changed position does see it
    model.train()  # with dropout the training pass is random; the causal mask holds all the same
    embedded = model.token_embedding(tokens).detach().requires_grad_(True)
    x = embedded + model.position_embedding(torch.arange(32))
    for block in model.blocks:
        x = block(x)
    out = model.head(model.ln_f(x))[:, 10].sum()
    (grad,) = torch.autograd.grad(out, embedded)
    assert grad[:, 11:].abs().max() == 0 and grad[:, :11].abs().max() > 0


@pytest.mark.parametrize("layers,width,heads,bias,tie", [(1, 16, 2, False, True), (2, 32, 4, True, True),
                                                          (3, 48, 3, False, False), (6, 384, 6, False, True)])
def test_parameter_count_formula(layers: int, width: int, heads: int, bias: bool, tie: bool) -> None:
    model = build_model({"name": "gpt", "layers": layers, "width": width, "heads": heads, "bias": bias,
                         "tie_weights": tie}, SPEC)
    assert sum(p.numel() for p in model.parameters()) == num_parameters(75, 32, width, layers, bias, tie)
    assert (model.head.weight is model.token_embedding.weight) == tie


def test_nanogpt_sizes() -> None:
    # nanoGPT's shakespeare_char model (6 layers, 6 heads, width 384, 256 positions, no biases, 65
    # symbols) reports "number of parameters: 10.65M", counted without the position embedding
    big = build_model({"name": "gpt", "layers": 6, "heads": 6, "width": 384}, TextSpec(65, 256))
    total = sum(p.numel() for p in big.parameters())
    assert round((total - big.position_embedding.weight.numel()) / 1e6, 2) == 10.65


def test_block_size_and_inputs_are_checked_before_launch() -> None:
    with pytest.raises(UserError, match="cannot be built for 32-token input .*block_size=16 is shorter"):
        check_buildable({"name": "gpt", "block_size": 16}, SPEC)
    assert small(block_size=64).position_embedding.num_embeddings == 64
    with pytest.raises(UserError, match="model=gpt needs the vocab_size, context_length of its input"):
        check_buildable({"name": "gpt"}, ImageSpec(1, 8, 10))
    with pytest.raises(UserError, match="model=small_cnn needs the in_channels, image_size, num_classes"):
        check_buildable({"name": "small_cnn"}, SPEC)
    with pytest.raises(UserError, match="not a multiple of heads"):
        check_buildable({"name": "gpt", "width": 30, "heads": 4}, SPEC)


def test_it_learns_a_repeated_text() -> None:
    torch.manual_seed(0)
    model = small()
    tokens = torch.arange(33).remainder(7).repeat(4, 1)  # a period-7 sequence
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
    first = None
    for _ in range(60):
        logits = model(tokens[:, :-1])
        loss = torch.nn.functional.cross_entropy(logits.reshape(-1, 75), tokens[:, 1:].reshape(-1))
        first = first if first is not None else loss.item()
        opt.zero_grad()
        loss.backward()
        opt.step()
    assert first > 4.0 and loss.item() < 0.5
