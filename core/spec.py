"""What a model needs to know about its input, known without reading any data.

Data sets declare it (`data`), model builders take it (`models`); it lives on the ground floor
so that neither of those packages imports the other.

One class per kind of input, each holding only what that kind has: images (channels, side,
classes), 1-D signals (channels, length, classes), text (vocabulary, context length). Every
spec names its `task` (`classification`, `language_model`), which decides the loss, the metrics
and the selection metric (`core.task`), and can make a batch of its input (`example_input`,
for the checks and FLOP counts that run a model on the meta device) and say what the model must
return for it (`output_shape`).

A model builder takes the spec's fields it needs by name (`fn(in_channels, image_size,
num_classes, **options)` for an image model, `fn(vocab_size, context_length, **options)` for a
language model): the names it asks for say which inputs it can take (`fields`, `SPEC_FIELDS`).
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any, ClassVar

import torch

CLASSIFICATION = "classification"  # one label per input: cross-entropy, top-1/top-5 accuracy
LANGUAGE_MODEL = "language_model"  # the next token at every position: token cross-entropy, perplexity
TASKS = (CLASSIFICATION, LANGUAGE_MODEL)


@dataclass(frozen=True)
class DataSpec:
    """The common face of every kind of input (subclasses add their fields)."""

    kind: ClassVar[str] = ""  # "images", "signals", "text": what a model takes, in words
    task: str = field(default=CLASSIFICATION, kw_only=True)

    def __post_init__(self) -> None:
        if self.task not in TASKS:
            raise ValueError(f"unknown task {self.task!r}; one of {', '.join(TASKS)}")

    def fields(self) -> dict[str, Any]:
        """The fields a model builder may ask for by name (everything but the task)."""
        return {f.name: getattr(self, f.name) for f in dataclasses.fields(self) if f.name != "task"}

    def example_input(self, batch: int) -> torch.Tensor:
        """A batch of this input's shape and dtype, on torch's current default device (the meta
        device under `with torch.device("meta")`: nothing is allocated)."""
        raise NotImplementedError

    def output_shape(self, batch: int) -> tuple[int, ...]:
        """What a model must return for `example_input(batch)`."""
        raise NotImplementedError

    def describe(self) -> str:
        """The input in a few words, for one-line errors."""
        raise NotImplementedError

    def size(self) -> str:
        """One input's size, e.g. 1x8x8 (an image), 1x40 (a signal), 256-token (a text window)."""
        raise NotImplementedError


@dataclass(frozen=True)
class ImageSpec(DataSpec):
    """Images N x C x H x W (square), one of `num_classes` labels each."""

    in_channels: int
    image_size: int
    num_classes: int
    kind: ClassVar[str] = "images"

    def example_input(self, batch: int) -> torch.Tensor:
        return torch.randn(batch, self.in_channels, self.image_size, self.image_size)

    def output_shape(self, batch: int) -> tuple[int, ...]:
        return (batch, self.num_classes)

    def describe(self) -> str:
        return f"{self.size()} images ({self.num_classes} classes)"

    def size(self) -> str:
        return f"{self.in_channels}x{self.image_size}x{self.image_size}"


@dataclass(frozen=True)
class SignalSpec(DataSpec):
    """1-D signals N x C x L (MNIST-1D: one channel of 40 points), one of `num_classes` labels each."""

    in_channels: int
    length: int
    num_classes: int
    kind: ClassVar[str] = "signals"

    def example_input(self, batch: int) -> torch.Tensor:
        return torch.randn(batch, self.in_channels, self.length)

    def output_shape(self, batch: int) -> tuple[int, ...]:
        return (batch, self.num_classes)

    def describe(self) -> str:
        return f"{self.size()} signals ({self.num_classes} classes)"

    def size(self) -> str:
        return f"{self.in_channels}x{self.length}"


@dataclass(frozen=True)
class TextSpec(DataSpec):
    """Token windows N x T (int64 ids below `vocab_size`); the model returns N x T x vocab_size
    logits, position t predicting token t + 1."""

    vocab_size: int
    context_length: int
    kind: ClassVar[str] = "text"
    task: str = field(default=LANGUAGE_MODEL, kw_only=True)

    def example_input(self, batch: int) -> torch.Tensor:
        return torch.zeros(batch, self.context_length, dtype=torch.long)

    def output_shape(self, batch: int) -> tuple[int, ...]:
        return (batch, self.context_length, self.vocab_size)

    def describe(self) -> str:
        return f"{self.size()} text windows ({self.vocab_size}-symbol vocabulary)"

    def size(self) -> str:
        return f"{self.context_length}-token"


SPEC_KINDS: tuple[type[DataSpec], ...] = (ImageSpec, SignalSpec, TextSpec)
#: every field some kind of spec has: a model builder's parameter of one of these names is filled
#: from the data's spec, never from the model config
SPEC_FIELDS: tuple[str, ...] = tuple(dict.fromkeys(
    f.name for kind in SPEC_KINDS for f in dataclasses.fields(kind) if f.name != "task"))
