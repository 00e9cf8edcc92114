"""Load data files stored as python pickles without letting them run code.

A pickle may name any importable callable and have it called while loading (`os.system`
included), so a data set file from an untrusted copy could run anything on every rank. The
data sets stored this way (CIFAR's python version) hold only dicts, lists, bytes, str, ints and
numpy arrays; `load_restricted` lets a file name only the globals those need and refuses any
other before it is called.
"""
from __future__ import annotations

import codecs
import pickle
from pathlib import Path
from typing import Any

import numpy as np

from core.errors import UserError

try:
    from numpy._core import multiarray, numeric  # numpy 2
except ImportError:  # pragma: no cover - numpy 1.x
    from numpy.core import multiarray, numeric  # type: ignore[no-redef]

_MULTIARRAY = ("numpy.core.multiarray", "numpy._core.multiarray")  # numpy 1.x and 2.x spellings
_NUMERIC = ("numpy.core.numeric", "numpy._core.numeric")

#: (module, name) -> the object; the only globals a numpy-and-builtins pickle needs
ALLOWED: dict[tuple[str, str], Any] = {
    ("numpy", "ndarray"): np.ndarray,
    ("numpy", "dtype"): np.dtype,
    **{(m, "_reconstruct"): multiarray._reconstruct for m in _MULTIARRAY},  # arrays
    **{(m, "scalar"): multiarray.scalar for m in _MULTIARRAY},  # numpy ints in label lists
    **{(m, "_frombuffer"): numeric._frombuffer for m in _NUMERIC},  # arrays, protocol 5
    # how Python 3 writes bytes under protocol 2 (a pure function of a str and a codec name)
    ("_codecs", "encode"): codecs.encode,
}


class RefusedGlobal(pickle.UnpicklingError):
    """The file names a callable that a data file has no reason to hold."""


class _RestrictedUnpickler(pickle.Unpickler):
    def find_class(self, module: str, name: str) -> Any:
        try:
            return ALLOWED[(module, name)]
        except KeyError:
            raise RefusedGlobal(f"{module}.{name}") from None


def load_restricted(path: Path, what: str, fix: str) -> Any:
    """The unpickled content of `path` (python-2 strings as bytes); a `UserError` naming the file,
    what it should be and `fix` when it is not a pickle or names anything outside `ALLOWED`."""
    try:
        with open(path, "rb") as fh:
            return _RestrictedUnpickler(fh, encoding="bytes").load()
    except RefusedGlobal as err:
        raise UserError(f"{path} is not {what}: it asks to call {err}, which such a file never holds "
                        f"(refused, nothing was run); {fix}") from None
    except (pickle.UnpicklingError, EOFError, ValueError, TypeError, AttributeError, IndexError) as err:
        raise UserError(f"{path} is not {what} ({err!r}); {fix}") from None
