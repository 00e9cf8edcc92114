"""Typed config sections: dataclasses with declared ranges and choices, frozen after planning.

Hydra composes YAML and command-line overrides into an untyped tree; every section of it has a
dataclass here or next to the component it configures, and that dataclass is the one source of
the section's defaults (Hydra's ConfigStore holds it, so the YAML files carry only what differs).
A field declares what it accepts with `option(default, ge=..., gt=..., le=..., lt=..., choices=...)`
or an enum type, so that `optim.lr=-1` is one line naming the key, the value and the range, found
before anything is launched, instead of a traceback on every rank. This is the one way a section
states a range or a set of choices; checks that relate several keys, or a key and the world size,
stay with the component that knows why.

Sections derive from `Section`: `freeze(obj)` makes a validated section (and the sections inside
it) read-only, so that once a run is planned nobody changes the config behind the plan's back.
"""
from __future__ import annotations

import dataclasses
import enum
import inspect
import math
import typing
from collections.abc import Callable, Iterable
from dataclasses import MISSING, field
from typing import Any, Optional

from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException

from core.errors import UserError


class FrozenSection(AttributeError):
    """Raised when a frozen config section is assigned to."""


class Section:
    """Base of every config dataclass: assignable while it is built and validated, read-only
    after `freeze` (use `dataclasses.replace` to derive a changed copy)."""

    _frozen = False

    def __setattr__(self, name: str, value: Any) -> None:
        if self._frozen:
            raise FrozenSection(f"{type(self).__name__}.{name}: the config is frozen once the run is "
                                "planned; derive a copy with dataclasses.replace")
        object.__setattr__(self, name, value)


def freeze(obj: Any) -> Any:
    """Make `obj` and every `Section` inside it (fields, lists, dicts) read-only; returns it."""
    if isinstance(obj, Section):
        for f in dataclasses.fields(obj):  # type: ignore[arg-type]
            freeze(getattr(obj, f.name))
        object.__setattr__(obj, "_frozen", True)
    elif isinstance(obj, (list, tuple)):
        for item in obj:
            freeze(item)
    elif isinstance(obj, dict):
        for item in obj.values():
            freeze(item)
    return obj


def option(default: Any = MISSING, *, factory: Optional[Callable[[], Any]] = None,
           ge: Optional[float] = None, gt: Optional[float] = None, le: Optional[float] = None,
           lt: Optional[float] = None, choices: Optional[Iterable[Any]] = None, doc: str = "",
           hint: str = "") -> Any:
    """A dataclass field with the values it accepts (None always passes: it means "not set").
    `hint` follows the accepted range in the error, in brackets: what null means, the usual value."""
    meta = {k: v for k, v in {"ge": ge, "gt": gt, "le": le, "lt": lt, "doc": doc, "hint": hint}.items()
            if v not in (None, "")}
    if choices is not None:
        meta["choices"] = tuple(choices)
    if factory is not None:
        return field(default_factory=factory, metadata=meta)
    return field(default=default, metadata=meta)


def _bound_text(meta: dict[str, Any]) -> str:
    low = f"> {meta['gt']:g}" if "gt" in meta else (f">= {meta['ge']:g}" if "ge" in meta else "")
    high = f"< {meta['lt']:g}" if "lt" in meta else (f"<= {meta['le']:g}" if "le" in meta else "")
    return " and ".join(t for t in (low, high) if t)


def range_problem(value: Any, meta: dict[str, Any]) -> Optional[str]:
    """What is wrong with `value` under a field's declared range/choices (None: nothing)."""
    problem = _range_problem(value, meta)
    return f"{problem} ({meta['hint']})" if problem and meta.get("hint") else problem


def _range_problem(value: Any, meta: dict[str, Any]) -> Optional[str]:
    if value is None:
        return None
    if "choices" in meta and value not in meta["choices"]:
        return f"is not one of {', '.join(map(str, meta['choices']))}"
    values = value if isinstance(value, (list, tuple)) else [value]
    for v in values:
        if isinstance(v, bool) or not isinstance(v, (int, float)):
            continue
        bad = (("ge" in meta and not v >= meta["ge"]) or ("gt" in meta and not v > meta["gt"])
               or ("le" in meta and not v <= meta["le"]) or ("lt" in meta and not v < meta["lt"])
               or (isinstance(v, float) and not math.isfinite(v)))
        if bad:
            bound = _bound_text(meta)
            return f"must be {bound}" if bound else "must be a finite number"
    return None


def check_ranges(obj: Any, where: str) -> None:
    """Check every field of a (nested) section against its declared range; `UserError` names
    the first key that is out of range, its value and what is allowed."""
    if not dataclasses.is_dataclass(obj):
        return
    for f in dataclasses.fields(obj):
        value = getattr(obj, f.name)
        key = f"{where}.{f.name}" if where else f.name
        problem = range_problem(value, dict(f.metadata))
        if problem:
            shown = value.value if isinstance(value, enum.Enum) else value
            raise UserError(f"{key}={shown!r} {problem}")
        if dataclasses.is_dataclass(value):
            check_ranges(value, key)


def typed_section(schema: type, node: Any, where: str) -> Any:
    """Merge a config node onto a dataclass schema, check the declared ranges, and return the
    dataclass; a bad key, type or value becomes a one-line `UserError` naming it."""
    try:
        base = OmegaConf.structured(schema)
        merged = OmegaConf.merge(base, node if node is not None else {})
        obj = OmegaConf.to_object(merged)
    except OmegaConfBaseException as err:
        raise UserError(config_error_line(err, where)) from None
    check_ranges(obj, where)
    return obj


def config_error_line(err: BaseException, where: str = "") -> str:
    """An OmegaConf/Hydra validation error as one line: the key, the value and the fix."""
    cause = err.__cause__ if isinstance(err.__cause__, OmegaConfBaseException) else err
    key = getattr(cause, "full_key", None) or ""
    full = f"{where}.{key}" if where and key and not key.startswith(where) else (key or where)
    text = str(cause).splitlines()[0] if str(cause) else type(cause).__name__
    if text.startswith("Invalid value "):  # an enum: "Invalid value 'x', expected one of [a, b]"
        value, _, allowed = text[len("Invalid value "):].partition(", expected one of ")
        return f"{full}={value} is not one of {allowed.strip('[]')}"
    if text.startswith("Value ") and "could not be converted to" in text:
        value = text[len("Value "):].split(" of type ")[0]
        wanted = text.rsplit("converted to ", 1)[1]
        return f"{full}={value}: expected {wanted.lower()} (fix the override or the config file)"
    if text.startswith("Key ") and " not in " in text:
        return f"{full} is not an option here (fix the override or the config file)"
    return f"{full}: {text} (fix the override or the config file)"


@dataclasses.dataclass(frozen=True)
class Bounds:
    """The range of a function parameter that is a config option, written in its signature as
    `width: Annotated[int, Bounds(ge=1)] = 16` (model builders), checked by `check_kwargs`."""

    ge: Optional[float] = None
    gt: Optional[float] = None
    le: Optional[float] = None
    lt: Optional[float] = None

    def meta(self) -> dict[str, Any]:
        return {k: v for k, v in dataclasses.asdict(self).items() if v is not None}


#: the usual ranges, for signatures: a count of at least one, a dropout-like probability
AtLeastOne = typing.Annotated[int, Bounds(ge=1)]
Probability = typing.Annotated[float, Bounds(ge=0, lt=1)]


def check_kwargs(where: str, fn: Callable[..., Any], kwargs: dict[str, Any], skip: tuple[str, ...] = ()) -> None:
    """Check that config keys are keyword arguments of `fn`, with compatible simple types and
    within their declared `Bounds` (for sections whose schema is a function's signature, such as
    a model builder's)."""
    sig = inspect.signature(fn)
    try:
        hints = typing.get_type_hints(fn, include_extras=True)
    except Exception:  # pragma: no cover - unresolvable annotations just skip type checks
        hints = {}
    allowed = [p for p in sig.parameters if p not in skip and p != "self"]
    for key, value in kwargs.items():
        if key not in allowed:
            raise UserError(f"{where}.{key} is not an option here; options: {', '.join(allowed) or 'none'}")
        hint, bounds = hints.get(key), None
        if typing.get_origin(hint) is typing.Annotated:
            bounds = next((m for m in hint.__metadata__ if isinstance(m, Bounds)), None)
            hint = typing.get_args(hint)[0]
        base = {int: (int,), float: (int, float), bool: (bool,), str: (str,)}.get(hint)  # type: ignore[arg-type]
        if base and value is not None and (not isinstance(value, base) or (hint is not bool and isinstance(value, bool))):
            raise UserError(f"{where}.{key}={value!r}: expected {hint.__name__}")  # type: ignore[union-attr]
        problem = range_problem(value, bounds.meta()) if bounds is not None else None
        if problem:
            raise UserError(f"{where}.{key}={value!r} {problem}")


def signature_defaults(fn: Callable[..., Any], skip: tuple[str, ...] = ()) -> dict[str, Any]:
    """The keyword defaults of `fn` (its config section's defaults, for a ConfigStore node)."""
    return {name: p.default for name, p in inspect.signature(fn).parameters.items()
            if name not in skip and p.default is not inspect.Parameter.empty}


def to_container(node: Any) -> Any:
    """A resolved plain container of a config node (anything else unchanged)."""
    return OmegaConf.to_container(node, resolve=True) if isinstance(node, DictConfig) else node


def as_dict(obj: Any) -> Any:
    """A section (possibly nested) as plain data, for summaries, manifests and hashing."""
    if isinstance(obj, enum.Enum):
        return obj.value
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        return {f.name: as_dict(getattr(obj, f.name)) for f in dataclasses.fields(obj)}
    if isinstance(obj, (list, tuple)):
        return [as_dict(v) for v in obj]
    if isinstance(obj, dict):
        return {k: as_dict(v) for k, v in obj.items()}
    return obj
