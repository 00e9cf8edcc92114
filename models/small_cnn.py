"""A small CNN for the 8x8 digits set: the embedded default's model.

Two conv blocks and a linear head; BatchNorm by default so that the BN-handling options of the
local methods (QSR's recompute, LSGD's re-estimation) have statistics to act on even here.
"""
from __future__ import annotations

import torch.nn as nn

from core.schema import AtLeastOne, Probability
from models import register_model


@register_model("small_cnn")
def small_cnn(in_channels: int, image_size: int, num_classes: int, width: AtLeastOne = 32,
              batch_norm: bool = True, dropout: Probability = 0.0) -> nn.Module:
    def block(cin: int, cout: int) -> list[nn.Module]:
        layers: list[nn.Module] = [nn.Conv2d(cin, cout, 3, padding=1, bias=not batch_norm)]
        if batch_norm:
            layers.append(nn.BatchNorm2d(cout))
        return layers + [nn.ReLU(inplace=True)]

    pooled = max(image_size // 2, 1)
    return nn.Sequential(
        *block(in_channels, width),
        *block(width, 2 * width),
        nn.MaxPool2d(2) if image_size >= 2 else nn.Identity(),
        nn.Flatten(),
        nn.Dropout(dropout) if dropout > 0 else nn.Identity(),
        nn.Linear(2 * width * pooled * pooled, 4 * width),
        nn.ReLU(inplace=True),
        nn.Linear(4 * width, num_classes),
    )
