"""Models behind one registry: `model.name` picks a builder, the other `model.*` keys are its
keyword arguments. The builder's signature is the one source of the model's options and their
defaults: `register_configs` hands it to Hydra as the `model=NAME` option, and the options are
checked against it (names and simple types) before launch. Input channels, resolution and
number of classes come from the data set (`core.spec.DataSpec`), never from the model config.
"""
from __future__ import annotations

from typing import Any, Callable

import torch
import torch.nn as nn
from hydra.core.config_store import ConfigStore

from core.errors import UserError
from core.registry import Registry
from core.schema import check_kwargs, signature_defaults
from core.spec import DataSpec

Builder = Callable[..., nn.Module]
MODELS: Registry[Builder] = Registry("model", "model.name", packages=["models"])
SPEC_ARGS = ("in_channels", "image_size", "num_classes")


def register_model(name: str) -> Callable[[Builder], Builder]:
    """Register `fn(in_channels, image_size, num_classes, **options) -> nn.Module` as `name`."""
    return MODELS.register(name)


def list_models() -> list[str]:
    return MODELS.names()


def model_options(cfg: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in cfg.items() if k != "name"}


def check_model_config(cfg: dict[str, Any], spec: DataSpec) -> None:
    """Unknown model names and options that are not the builder's keyword arguments (or have the
    wrong simple type) are one line; values are checked by building (see `build_model`)."""
    builder = MODELS.get(cfg.get("name"))
    check_kwargs("model", builder, model_options(cfg), skip=SPEC_ARGS)


def build_model(cfg: dict[str, Any], spec: DataSpec) -> nn.Module:
    check_model_config(cfg, spec)
    builder = MODELS.get(cfg["name"])
    return builder(spec.in_channels, spec.image_size, spec.num_classes, **model_options(cfg))


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
    shape = f"{spec.in_channels}x{spec.image_size}x{spec.image_size}"
    try:
        with torch.device("meta"):
            model = build_model(cfg, spec)
        small = sum(p.numel() for p in model.parameters()) <= CPU_CHECK_PARAMS and spec.image_size <= CPU_CHECK_SIZE
        device = "cpu" if small else "meta"
        with torch.random.fork_rng(devices=[]), torch.device(device), torch.no_grad():
            model = build_model(cfg, spec) if small else model
            out = model(torch.zeros(2, spec.in_channels, spec.image_size, spec.image_size))
    except UserError:
        raise
    except Exception as err:  # the builder's or torch's own complaint, shortened to its first line
        reason = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
        raise UserError(f"model={cfg.get('name')} with {model_options(cfg) or 'its defaults'} cannot be built "
                        f"for {shape} input ({reason}); change the model.* options or the data's image size") from None
    if tuple(out.shape) != (2, spec.num_classes):
        raise UserError(f"model={cfg.get('name')} gives outputs of shape {tuple(out.shape)[1:]} for {shape} input, "
                        f"not {spec.num_classes} class scores; change the model.* options")


def register_configs() -> None:
    """One Hydra option per model (`model=NAME`): its name and its builder's keyword defaults."""
    store = ConfigStore.instance()
    for name, builder in MODELS.items():
        store.store(group="model", name=name, node={"name": name, **signature_defaults(builder, SPEC_ARGS)})
