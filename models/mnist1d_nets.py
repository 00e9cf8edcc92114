"""The four models of MNIST-1D's benchmark (Greydanus & Kobak 2024, the README's table and
`notebooks/models.py`): logistic regression, a residual MLP, a 1-D CNN and a bidirectional GRU,
at the sizes the paper trains (410, 15,210, 5,210 and 5,134 parameters for 40-point signals),
with PyTorch's default initialisation as there.

They take the signals as N x C x L (`core.spec.SignalSpec`); the MLP and the logistic regression
flatten them, the GRU reads the L points as a sequence of C-vectors.
"""
from __future__ import annotations

import torch
import torch.nn as nn

from core.schema import AtLeastOne
from models import register_model


@register_model("mnist1d_linear")
def mnist1d_linear(in_channels: int, length: int, num_classes: int) -> nn.Module:
    """Logistic regression: one linear map of the flattened signal (the table's floor, 32 %)."""
    return nn.Sequential(nn.Flatten(), nn.Linear(in_channels * length, num_classes))


class ResidualMLP(nn.Module):
    """Two ReLU layers of `hidden` units, the second added to the first, then a linear head."""

    def __init__(self, inputs: int, hidden: int, num_classes: int) -> None:
        super().__init__()
        self.linear1 = nn.Linear(inputs, hidden)
        self.linear2 = nn.Linear(hidden, hidden)
        self.linear3 = nn.Linear(hidden, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.linear1(x.flatten(1)).relu()
        h = h + self.linear2(h).relu()
        return self.linear3(h)


@register_model("mnist1d_mlp")
def mnist1d_mlp(in_channels: int, length: int, num_classes: int, hidden: AtLeastOne = 100) -> nn.Module:
    return ResidualMLP(in_channels * length, hidden, num_classes)


def _conv_out(length: int, kernel: int, stride: int, padding: int) -> int:
    return (length + 2 * padding - kernel) // stride + 1


class ConvNet1D(nn.Module):
    """Three strided 1-D convolutions (kernel 5, 3, 3; stride 2; padding 1) with ReLU, then a
    linear classifier on the flattened features: 40 points -> 19 -> 10 -> 5."""

    def __init__(self, in_channels: int, length: int, num_classes: int, channels: int) -> None:
        super().__init__()
        self.conv1 = nn.Conv1d(in_channels, channels, 5, stride=2, padding=1)
        self.conv2 = nn.Conv1d(channels, channels, 3, stride=2, padding=1)
        self.conv3 = nn.Conv1d(channels, channels, 3, stride=2, padding=1)
        out = _conv_out(_conv_out(_conv_out(length, 5, 2, 1), 3, 2, 1), 3, 2, 1)
        if out < 1:
            raise ValueError(f"a signal of {length} points is too short for three stride-2 convolutions")
        self.linear = nn.Linear(channels * out, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.conv1(x).relu()
        h = self.conv2(h).relu()
        h = self.conv3(h).relu()
        return self.linear(h.flatten(1))


@register_model("mnist1d_cnn")
def mnist1d_cnn(in_channels: int, length: int, num_classes: int, channels: AtLeastOne = 25) -> nn.Module:
    return ConvNet1D(in_channels, length, num_classes, channels)


class GRUClassifier(nn.Module):
    """A (bidirectional) GRU over the signal's points from a zero state; every step's output,
    flattened, feeds a linear classifier."""

    def __init__(self, in_channels: int, length: int, num_classes: int, hidden: int, bidirectional: bool) -> None:
        super().__init__()
        self.gru = nn.GRU(input_size=in_channels, hidden_size=hidden, batch_first=True, bidirectional=bidirectional)
        self.linear = nn.Linear((2 if bidirectional else 1) * hidden * length, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out, _ = self.gru(x.transpose(1, 2))  # N x L x C in, N x L x (directions * hidden) out
        return self.linear(out.flatten(1))


@register_model("mnist1d_gru")
def mnist1d_gru(in_channels: int, length: int, num_classes: int, hidden: AtLeastOne = 6,
                bidirectional: bool = True) -> nn.Module:
    return GRUClassifier(in_channels, length, num_classes, hidden, bidirectional)
