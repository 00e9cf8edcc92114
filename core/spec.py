"""What a model needs to know about its input, known without reading any data.

Data sets declare it (`data`), model builders take it (`models`); it lives on the ground floor
so that neither of those packages imports the other.

One class per kind of input, each holding only what that kind has: images (channels, side,
classes), 1-D signals (channels, length, classes), text (vocabulary, context length). Every
spec names its `task` (`classification`, `language_model`, or any name `core.task` registers),
which decides the loss, the metrics and the selection metric (`core.task.task_for`), and can make
a batch of its input (`example_input`, for the checks and FLOP counts that run a model on the
meta device) and say what the model must return for it (`output_shape`).

The three kinds here are the shipped data sets'; a data set of another kind defines its own
`DataSpec` subclass beside it (a dataclass naming its task), and every subclass counts as a kind
as soon as it is defined (`spec_kinds`, `SPEC_FIELDS`), so nothing here is edited for it.

A model builder takes the spec's fields it needs by name (`fn(in_channels, image_size,
num_classes, **options)` for an image model, `fn(vocab_size, context_length, **options)` for a
language model): the names it asks for say which inputs it can take (`fields`, `SPEC_FIELDS`).
"""
from __future__ import annotations

import dataclasses
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar, overload

import torch

# the shipped kinds' tasks (core/task/classification.py, core/task/language_model.py register them)
CLASSIFICATION = "classification"  # one label per input: cross-entropy, top-1/top-5 accuracy
LANGUAGE_MODEL = "language_model"  # the next token at every position: token cross-entropy, perplexity

_kinds: list[type["DataSpec"]] = []  # every subclass, in the order they were defined


@dataclass(frozen=True)
class DataSpec:
    """The common face of every kind of input (subclasses add their fields). `task` names a task
    of `core.task`'s registry; `core.task.task_for` refuses one it does not hold, in one line
    before launch (this module cannot ask the registry: the tasks import it)."""

    kind: ClassVar[str] = ""  # "images", "signals", "text": what a model takes, in words
    task: str = field(default=CLASSIFICATION, kw_only=True)

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        _kinds.append(cls)

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


def spec_kinds() -> tuple[type[DataSpec], ...]:
    """Every kind of input defined so far: the three above, then any a data set's module defines."""
    return tuple(_kinds)


class SpecFields(Sequence[str]):
    """Every field some kind of spec has, read from `spec_kinds()` when asked, so that a kind a
    data set defines after this module counts: a model builder's parameter of one of these names
    is filled from the data's spec, never from the model config."""

    def names(self) -> tuple[str, ...]:
        return tuple(dict.fromkeys(f.name for kind in spec_kinds() if dataclasses.is_dataclass(kind)
                                   for f in dataclasses.fields(kind) if f.name != "task"))

    @overload
    def __getitem__(self, index: int) -> str: ...

    @overload
    def __getitem__(self, index: slice) -> Sequence[str]: ...

    def __getitem__(self, index: Any) -> Any:
        return self.names()[index]

    def __len__(self) -> int:
        return len(self.names())

    def __iter__(self) -> Iterator[str]:
        return iter(self.names())

    def __contains__(self, name: object) -> bool:
        return name in self.names()

    def __repr__(self) -> str:
        return f"SpecFields{self.names()!r}"


SPEC_FIELDS = SpecFields()
