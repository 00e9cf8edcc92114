"""Every registered image model builds from a data spec and maps a batch to class logits (the models
of other inputs: tests/test_mnist1d.py, tests/test_gpt.py)."""
from __future__ import annotations

import pytest
import torch

from core.spec import ImageSpec
from models import build_model, list_models, takes

SPECS = {"small_cnn": ImageSpec(1, 8, 10), "vit_small": ImageSpec(3, 32, 100), "vit_b_16": ImageSpec(3, 224, 1000)}
CIFAR = ImageSpec(3, 32, 10)
# Parameter counts of He et al. (2016), Table 6: ResNet-20 0.27M, -32 0.46M, -56 0.85M, -110 1.7M.
CIFAR_PARAMS = {"resnet20": 0.27e6, "resnet32": 0.46e6, "resnet56": 0.85e6, "resnet110": 1.7e6}
# torchvision's ImageNet ResNets and ViT-B/16
IMAGENET_PARAMS = {"resnet18": 11.69e6, "resnet50": 25.56e6, "vit_b_16": 86.57e6}


@pytest.mark.parametrize("name", [m for m in list_models() if takes(m, CIFAR)])
def test_model_builds_and_gives_logits(name: str) -> None:
    spec = SPECS.get(name, CIFAR)
    model = build_model({"name": name}, spec)
    x = torch.randn(2, spec.in_channels, spec.image_size, spec.image_size)
    with torch.no_grad():
        out = model.eval()(x)
    assert out.shape == (2, spec.num_classes)
    n = sum(p.numel() for p in model.parameters())
    if name in CIFAR_PARAMS:
        assert n == pytest.approx(CIFAR_PARAMS[name], rel=0.06), n
    if name in IMAGENET_PARAMS:
        full = build_model({"name": name, **({"small_input": False} if name.startswith("resnet") else {})},
                           ImageSpec(3, 224, 1000)) if spec.num_classes != 1000 else model
        assert sum(p.numel() for p in full.parameters()) == pytest.approx(IMAGENET_PARAMS[name], rel=0.01)


def test_small_input_resnet_keeps_resolution_in_the_stem() -> None:
    model = build_model({"name": "resnet18"}, CIFAR)
    assert model.conv1.kernel_size == (3, 3) and isinstance(model.maxpool, torch.nn.Identity)
