"""CIFAR's python-pickle batches are loaded without letting a file run code.

A pickle can name any importable callable and have it called while loading; a tampered CIFAR
batch would then run on every rank. `data.samples.safe_pickle` admits only the globals the format
needs (numpy's array and scalar reconstruction, dtypes, protocol 2's bytes), so a crafted batch
whose `__reduce__` calls `os.system` is refused, in one line naming the file, before the call
happens; batches in the real format (as the CIFAR site's Python 2 pickles name numpy, and as
Python 3 writes them under protocols 2, 4 and 5) load to the same arrays.
"""
from __future__ import annotations

import os
import pickle
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from core.errors import UserError
from data import DATASETS
from tests.support.datagen import cifar_label, sample_image, write_cifar

CIFAR10 = DATASETS.get("cifar10")


class RunsAShellCommand:
    """Unpickling this calls os.system(command): what a tampered data file would do."""

    def __init__(self, command: str) -> None:
        self.command = command

    def __reduce__(self) -> tuple[Any, tuple[str]]:
        return os.system, (self.command,)


def _batch(ids: range, label_key: bytes = b"labels") -> dict[bytes, Any]:
    data = np.stack([sample_image(i, 32, 32).transpose(2, 0, 1).reshape(-1) for i in ids])
    return {b"batch_label": b"training batch 1 of 5", label_key: [cifar_label(i, 10) for i in ids],
            b"data": data, b"filenames": [b"img_%05d.png" % i for i in ids]}


def _replace_first_train_file(root: Path, payload: bytes) -> Path:
    path = root / CIFAR10.folder / CIFAR10.train_files[0]
    path.write_bytes(payload)
    return path


@pytest.mark.parametrize("protocol", [0, 2, pickle.DEFAULT_PROTOCOL])
def test_a_batch_that_would_run_a_command_is_refused_and_does_not_run(tmp_path: Path, protocol: int) -> None:
    write_cifar(tmp_path, "cifar10", 20, 5)
    marker = tmp_path / "pwned"
    batch = _batch(range(4))
    batch[b"labels"] = RunsAShellCommand(f"touch {marker}")
    path = _replace_first_train_file(tmp_path, pickle.dumps(batch, protocol=protocol))
    with pytest.raises(UserError) as err:
        CIFAR10.load(str(tmp_path), train=True)
    message = str(err.value)
    assert "\n" not in message and str(path) in message and "is not a CIFAR batch file" in message
    assert "os.system" in message or "posix.system" in message
    assert not marker.exists(), "the crafted pickle ran its command"


@pytest.mark.parametrize("global_name", [b"builtins\neval", b"numpy\nload", b"subprocess\ncheck_call"])
def test_any_other_global_is_refused(tmp_path: Path, global_name: bytes) -> None:
    write_cifar(tmp_path, "cifar10", 20, 5)
    # protocol 0 by hand: GLOBAL module\nname\n, an argument tuple, REDUCE
    path = _replace_first_train_file(tmp_path, b"c" + global_name + b"\n(S'1+1'\ntR.")
    with pytest.raises(UserError, match="refused, nothing was run") as err:
        CIFAR10.load(str(tmp_path), train=True)
    assert str(path) in str(err.value)


def test_a_file_that_is_no_pickle_names_the_file(tmp_path: Path) -> None:
    write_cifar(tmp_path, "cifar10", 20, 5)
    path = _replace_first_train_file(tmp_path, b"not a pickle")
    with pytest.raises(UserError) as err:
        CIFAR10.load(str(tmp_path), train=True)
    assert str(path) in str(err.value) and "is not a CIFAR batch file" in str(err.value)


def _as_numpy_1_wrote_it(payload: bytes) -> bytes:
    """Protocol 0-2 name globals as text: the official files (numpy 1.x) say numpy.core."""
    return payload.replace(b"numpy._core.multiarray", b"numpy.core.multiarray")


@pytest.mark.parametrize("protocol,rewrite", [(2, _as_numpy_1_wrote_it), (2, None), (4, None), (5, None)])
def test_real_format_batches_load(tmp_path: Path, protocol: int, rewrite: Any) -> None:
    write_cifar(tmp_path, "cifar10", 20, 5)
    batch = _batch(range(4))
    batch[b"labels"] = [np.int64(v) for v in batch[b"labels"]]  # numpy scalars, as some writers leave them
    payload = pickle.dumps(batch, protocol=protocol)
    _replace_first_train_file(tmp_path, rewrite(payload) if rewrite else payload)
    images, labels = CIFAR10.load(str(tmp_path), train=True)
    # the first file now holds identities 0..3; the other four files hold datagen's 4..19
    assert images.shape == (20, 32, 32, 3) and images.dtype == np.uint8
    assert np.array_equal(images[:4], np.stack([sample_image(i, 32, 32) for i in range(4)]))
    assert labels.tolist() == [cifar_label(i, 10) for i in range(4)] + [cifar_label(i, 10) for i in range(4, 20)]


def test_cifar100_layout_loads(tmp_path: Path) -> None:
    write_cifar(tmp_path, "cifar100", 12, 4)
    cifar100 = DATASETS.get("cifar100")
    images, labels = cifar100.load(str(tmp_path), train=False)
    assert images.shape == (4, 32, 32, 3)
    assert labels.tolist() == [cifar_label(i, 100) for i in range(12, 16)]
