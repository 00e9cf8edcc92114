"""What a model needs to know about its input, known without reading any data.

Data sets declare it (`data`), model builders take it (`models`); it lives on the ground floor
so that neither of those packages imports the other.
"""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class DataSpec:
    in_channels: int
    image_size: int
    num_classes: int
