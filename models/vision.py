"""ImageNet-style models from torchvision: ResNet-18/50/101/152 and ViT-B/16 (plus a small ViT).

Taken from torchvision rather than rewritten. For small inputs (CIFAR's 32x32, DGS's CIFAR-10
ResNet-18) `small_input=True` (the default below 64 px) swaps the 7x7/2 stem and max-pool for a
3x3/1 stem, the usual CIFAR adaptation.
"""
from __future__ import annotations

import torch.nn as nn

from core.schema import AtLeastOne, Probability
from models import register_model


def _resnet(arch: str, in_channels: int, image_size: int, num_classes: int,
            small_input: bool | None, zero_init_residual: bool) -> nn.Module:
    import torchvision.models as tvm

    model = getattr(tvm, arch)(weights=None, num_classes=num_classes, zero_init_residual=zero_init_residual)
    if small_input is None:
        small_input = image_size < 64
    if small_input:
        model.conv1 = nn.Conv2d(in_channels, 64, 3, 1, 1, bias=False)
        model.maxpool = nn.Identity()
    elif in_channels != 3:
        model.conv1 = nn.Conv2d(in_channels, 64, 7, 2, 3, bias=False)
    return model


def _register_resnet(depth: int) -> None:
    @register_model(f"resnet{depth}")
    def build(in_channels: int, image_size: int, num_classes: int, small_input: bool | None = None,
              zero_init_residual: bool = False) -> nn.Module:
        return _resnet(f"resnet{depth}", in_channels, image_size, num_classes, small_input, zero_init_residual)


for _depth in (18, 50, 101, 152):
    _register_resnet(_depth)


def _vit(in_channels: int, image_size: int, num_classes: int, patch_size: int, num_layers: int,
         num_heads: int, hidden_dim: int, mlp_dim: int, dropout: float) -> nn.Module:
    from torchvision.models.vision_transformer import VisionTransformer

    if image_size % patch_size:
        raise ValueError(f"image size {image_size} is not a multiple of the patch size {patch_size}")
    model = VisionTransformer(image_size=image_size, patch_size=patch_size, num_layers=num_layers,
                              num_heads=num_heads, hidden_dim=hidden_dim, mlp_dim=mlp_dim,
                              dropout=dropout, num_classes=num_classes)
    if in_channels != 3:
        model.conv_proj = nn.Conv2d(in_channels, hidden_dim, patch_size, patch_size)
    return model


@register_model("vit_b_16")
def vit_b_16(in_channels: int, image_size: int, num_classes: int, dropout: Probability = 0.0) -> nn.Module:
    """ViT-B/16 (86M parameters), torchvision's architecture, trained from scratch."""
    return _vit(in_channels, image_size, num_classes, 16, 12, 12, 768, 3072, dropout)


@register_model("vit_small")
def vit_small(in_channels: int, image_size: int, num_classes: int, patch_size: AtLeastOne = 4,
              num_layers: AtLeastOne = 6, num_heads: AtLeastOne = 4, hidden_dim: AtLeastOne = 192,
              mlp_dim: AtLeastOne = 384, dropout: Probability = 0.0) -> nn.Module:
    """A small ViT for CPU-scale runs (defaults: ViT-Tiny-like width, 6 layers, 4x4 patches)."""
    return _vit(in_channels, image_size, num_classes, patch_size, num_layers, num_heads, hidden_dim, mlp_dim, dropout)
