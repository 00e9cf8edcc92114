"""The embedded default: scikit-learn's bundled digits set (1,797 real 8x8 handwritten digits).

It ships inside scikit-learn, so the default run needs no download and no data path. The
train/test split is a seeded permutation (`data.split_seed`), identical on every rank.
"""
from __future__ import annotations

import math
from functools import lru_cache

import torch

NUM_SAMPLES = 1797


def split_sizes(test_fraction: float) -> tuple[int, int]:
    n_test = math.ceil(NUM_SAMPLES * test_fraction)
    return NUM_SAMPLES - n_test, n_test


@lru_cache(maxsize=4)
def load_digits_split(test_fraction: float, split_seed: int) -> tuple[torch.Tensor, ...]:
    """(x_train, y_train, x_test, y_test); images normalised with the training set's statistics."""
    import numpy as np
    from sklearn.datasets import load_digits

    bunch = load_digits()
    x = torch.from_numpy(np.asarray(bunch.data, dtype=np.float32)).reshape(-1, 1, 8, 8) / 16.0
    y = torch.from_numpy(np.asarray(bunch.target, dtype=np.int64))
    perm = torch.randperm(len(x), generator=torch.Generator().manual_seed(split_seed))
    n_train, _ = split_sizes(test_fraction)
    train, test = perm[:n_train], perm[n_train:]
    mean, std = x[train].mean(), x[train].std()
    x = (x - mean) / std
    return x[train].contiguous(), y[train].contiguous(), x[test].contiguous(), y[test].contiguous()
