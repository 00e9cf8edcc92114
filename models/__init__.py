"""Models behind one registry: `model.name` picks a builder, the other `model.*` keys are its
keyword arguments. The builder's signature is the one source of the model's options and their
defaults: `register_configs` hands it to Hydra as the `model=NAME` option, and the options are
checked against it (names and simple types) before launch.

What a model knows of its input comes from the data set (`core.spec.DataSpec`), never from the
model config: a builder names the spec fields it needs among its parameters (`in_channels,
image_size, num_classes` for an image model; `in_channels, length, num_classes` for a 1-D signal
model; `vocab_size, context_length` for a language model) and gets them from the data's spec.
Those names also say which inputs a model can take: a model asking for a field the data's spec
does not have (`model=gpt` on `data=mnist1d`) is refused in one line before launch.
"""
from __future__ import annotations

import inspect
from typing import Any, Callable

import torch
import torch.nn as nn
from hydra.core.config_store import ConfigStore

from core.errors import UserError
from core.registry import Registry
from core.schema import check_kwargs, signature_defaults
from core.spec import SPEC_FIELDS, DataSpec

Builder = Callable[..., nn.Module]
MODELS: Registry[Builder] = Registry("model", "model.name", packages=["models"])
SPEC_ARGS = SPEC_FIELDS  # builder parameters filled from the data's spec


def register_model(name: str) -> Callable[[Builder], Builder]:
    """Register `fn(<spec fields it needs>, **options) -> nn.Module` as `name`, e.g.
    `fn(in_channels, image_size, num_classes, width=32)` for images."""
    return MODELS.register(name)


def list_models() -> list[str]:
    return MODELS.names()


def model_options(cfg: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in cfg.items() if k != "name"}


def spec_params(builder: Builder) -> tuple[str, ...]:
    """The spec fields a builder asks for (its parameters named in `core.spec.SPEC_FIELDS`)."""
    return tuple(p for p in inspect.signature(builder).parameters if p in SPEC_FIELDS)


def takes(name: str, spec: DataSpec) -> bool:
    """Whether model `name` can be built for inputs like `spec` (it asks only for fields the spec has)."""
    return set(spec_params(MODELS.get(name))) <= set(spec.fields())


def models_for(spec: DataSpec) -> list[str]:
    """The registered models that take this kind of input."""
    return [name for name in list_models() if takes(name, spec)]


def check_model_config(cfg: dict[str, Any], spec: DataSpec) -> None:
    """Unknown model names and options that are not the builder's keyword arguments (or have the
    wrong simple type) are one line; whether the model takes the data's input is checked when it
    is built (`check_takes`, by `check_buildable` before launch), values by building."""
    builder = MODELS.get(cfg.get("name"))
    check_kwargs("model", builder, model_options(cfg), skip=SPEC_ARGS)


def check_takes(name: str, spec: DataSpec) -> None:
    """One line when model `name` asks for a field of its input that the data's spec lacks (an
    image model on signals, a language model on images), naming the models that fit."""
    builder = MODELS.get(name)
    if not takes(name, spec):
        missing = [p for p in spec_params(builder) if p not in spec.fields()]
        fits = ", ".join(models_for(spec)) or "none registered"
        raise UserError(f"model={name} needs the {', '.join(missing)} of its input, which the data's "
                        f"{spec.describe()} do not have; pick a model for {spec.kind}: {fits}")


def build_model(cfg: dict[str, Any], spec: DataSpec) -> nn.Module:
    check_model_config(cfg, spec)
    check_takes(cfg["name"], spec)
    builder = MODELS.get(cfg["name"])
    given = spec.fields()
    return builder(**{p: given[p] for p in spec_params(builder)}, **model_options(cfg))


#: a model up to this many parameters, for inputs up to CPU_CHECK_SIZE pixels a side, is checked
#: by a real forward pass on the CPU (a few MB and milliseconds): on the meta device the first
#: convolution's shape check imports torch's symbolic shapes (SymPy) and BatchNorm's decomposition
#: torch._dynamo, seconds of the launching process's start-up for the default job (bench/startup.py)
CPU_CHECK_PARAMS = 20_000_000
CPU_CHECK_SIZE = 64


def check_buildable(cfg: dict[str, Any], spec: DataSpec) -> None:
    """Build the model and pass it one batch of two samples of the data's shape, so that a model
    that cannot be built, or cannot take this input size, is one line before launch instead of a
    traceback on every rank. Built on the meta device first (no memory, no time); a small model
    at a small size is then run for real on the CPU (`CPU_CHECK_PARAMS`), a large one on meta.
    The global RNG is left as it was (a run in this process seeds its own model later)."""
    check_model_config(cfg, spec)
    check_takes(cfg.get("name"), spec)
    try:
        with torch.device("meta"):
            model = build_model(cfg, spec)
        small = (sum(p.numel() for p in model.parameters()) <= CPU_CHECK_PARAMS
                 and getattr(spec, "image_size", 0) <= CPU_CHECK_SIZE)
        device = "cpu" if small else "meta"
        with torch.random.fork_rng(devices=[]), torch.device(device), torch.no_grad():
            model = build_model(cfg, spec) if small else model
            out = model(spec.example_input(2))
    except UserError:
        raise
    except Exception as err:  # the builder's or torch's own complaint, shortened to its first line
        reason = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
        raise UserError(f"model={cfg.get('name')} with {model_options(cfg) or 'its defaults'} cannot be built "
                        f"for {spec.size()} input ({reason}); change the model.* options or the data's "
                        "input size") from None
    if tuple(out.shape) != spec.output_shape(2):
        raise UserError(f"model={cfg.get('name')} gives outputs of shape {tuple(out.shape)[1:]} for {spec.size()} "
                        f"input, not {spec.output_shape(2)[1:]}; change the model.* options")


def register_configs() -> None:
    """One Hydra option per model (`model=NAME`): its name and its builder's keyword defaults."""
    store = ConfigStore.instance()
    for name, builder in MODELS.items():
        store.store(group="model", name=name, node={"name": name, **signature_defaults(builder, SPEC_ARGS)})
