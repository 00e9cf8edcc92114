"""MNIST-1D's generating procedure (Greydanus & Kobak, "Scaling down deep learning with MNIST-1D",
ICML 2024; arXiv 2011.14439), written here and checked bit for bit against the `mnist1d`
package's `make_dataset` (tests/test_mnist1d.py).

Each sample is one of ten 12-point digit templates, padded with 36-60 zeros, stretched to 72
points, scaled by up to +-20 %, circularly shifted by 0-47 points, its zero padding filled with
Gaussian-smoothed noise, iid noise added, sheared, and sampled down to 40 points; the whole set
is then shuffled and standardised with its own mean and standard deviation (train and test
together, as the procedure does). The first `n_train` samples train, the rest test.

Why not call the package: its `make_dataset` seeds and draws from numpy's *global* generator
(and Python's), which a rank's other code may rely on, and it transforms one sample at a time
(37 s for 70,000 samples here). This version draws the very same numbers in the very same order
from its own `numpy.random.RandomState(seed)` (the legacy generator `np.random.seed` reseeds, so
the streams are identical), one small loop, and then does the arithmetic on whole batches with
the same floating-point operations in the same order as numpy's `interp` (what the package's
`scipy.interpolate.interp1d` delegates to for 1-D data) and scipy's Gaussian filter, so the
result is identical to the last bit, in a fraction of the time. The package is only a test
dependency; nothing is downloaded (the package's `get_dataset` would fetch a pickle: never used).
"""
from __future__ import annotations

import time
from dataclasses import dataclass
from functools import lru_cache

import numpy as np

# The ten 12-point templates of the paper (digits 0-9), as published with its procedure.
TEMPLATES = np.asarray([
    [5, 6, 6.5, 6.75, 7, 7, 7, 7, 6.75, 6.5, 6, 5],
    [5, 3, 3, 3.4, 3.8, 4.2, 4.6, 5, 5.4, 5.8, 5, 5],
    [5, 6, 6.5, 6.5, 6, 5.25, 4.75, 4, 3.5, 3.5, 4, 5],
    [5, 6, 6.5, 6.5, 6, 5, 5, 6, 6.5, 6.5, 6, 5],
    [5, 4.4, 3.8, 3.2, 2.6, 2.6, 5, 5, 5, 5, 5, 5],
    [5, 3, 3, 3, 3, 5, 6, 6.5, 6.5, 6, 4.5, 5],
    [5, 4, 3.5, 3.25, 3, 3, 3, 3, 3.25, 3.5, 4, 5],
    [5, 7, 7, 6.6, 6.2, 5.8, 5.4, 5, 4.6, 4.2, 5, 5],
    [5, 4, 3.5, 3.5, 4, 5, 5, 4, 3.5, 3.5, 4, 5],
    [5, 4, 3.5, 3.5, 4, 5, 5, 5, 5, 4.7, 4.3, 5],
])
NUM_CLASSES = 10
EPS = 1e-8  # added to the template before padding, so the mask below finds it non-zero


@dataclass(frozen=True)
class Procedure:
    """The procedure's settings; the defaults are the paper's (its `get_dataset_args`)."""

    num_samples: int = 5000
    seed: int = 42
    template_len: int = 12
    padding: tuple[int, int] = (36, 60)
    scale_coeff: float = 0.4
    max_translation: int = 48
    corr_noise_scale: float = 0.25
    iid_noise_scale: float = 2e-2
    shear_scale: float = 0.75
    final_seq_length: int = 40

    @property
    def stretched(self) -> int:
        """Points after the first stretch (template plus the longest padding)."""
        return self.template_len + self.padding[1]


def templates() -> np.ndarray:
    """The templates whitened per digit, starting and ending at 0, divided by 6 (10 x 12)."""
    x = TEMPLATES.astype(np.float64)  # a copy: the arithmetic below is in place, as the procedure's
    x -= x.mean(1, keepdims=True)
    x /= x.std(1, keepdims=True)
    x -= x[:, :1]
    return x / 6.0


def interp_rows(y: np.ndarray, n_out: int) -> np.ndarray:
    """Each row of `y` (m x L, sampled at linspace(0, 1, L)) linearly interpolated at
    linspace(0, 1, n_out): numpy's `interp` on every row at once, with its very operations
    (slope (y[j+1] - y[j]) / (x[j+1] - x[j]), then slope * (x - x[j]) + y[j]; a point on a knot,
    and the last knot, take y[j] exactly)."""
    length = y.shape[1]
    xp, x = np.linspace(0, 1, length), np.linspace(0, 1, n_out)
    j = np.searchsorted(xp, x, side="right") - 1  # xp[j] <= x < xp[j + 1]
    jj = np.minimum(j, length - 2)
    slope = (y[:, jj + 1] - y[:, jj]) / (xp[jj + 1] - xp[jj])
    out = slope * (x - xp[jj]) + y[:, jj]
    on_knot = (j >= length - 1) | (xp[np.minimum(j, length - 1)] == x)
    out[:, on_knot] = y[:, j[on_knot]]
    return out


@dataclass(frozen=True)
class Draws:
    """Every random number of the procedure, drawn in the package's order (per sample: padding,
    scale, shift, correlated noise, iid noise, shear; then the shuffle)."""

    pad: np.ndarray  # zeros appended to each template
    scale: np.ndarray  # uniform [0, 1) draws of the scale
    shift: np.ndarray  # circular shift, 0 .. max_translation - 1
    corr: np.ndarray  # standard normal, n x stretched
    iid: np.ndarray  # standard normal, n x stretched
    shear: np.ndarray  # uniform [0, 1) draws of the shear
    shuffle: np.ndarray  # the permutation of the whole set


def draw(proc: Procedure, n: int) -> Draws:
    rs = np.random.RandomState(proc.seed)
    low, high = proc.padding
    width = proc.stretched
    pad, shift = np.empty(n, np.int64), np.empty(n, np.int64)
    scale, shear = np.empty(n), np.empty(n)
    corr, iid = np.empty((n, width)), np.empty((n, width))
    for i in range(n):
        pad[i] = low + int(rs.rand() * (high - low + 1))
        scale[i] = rs.rand()
        shift[i] = rs.choice(proc.max_translation)
        corr[i] = rs.randn(width)
        iid[i] = rs.randn(width)
        shear[i] = rs.rand()
    return Draws(pad, scale, shift, corr, iid, shear, rs.permutation(n))


def transform(x: np.ndarray, d: Draws, proc: Procedure) -> np.ndarray:
    """The procedure's transformation of templates `x` (n x template_len, eps added) by the draws
    `d` (the same n), on the whole batch; returns n x final_seq_length."""
    from scipy.ndimage import gaussian_filter1d  # here: SciPy costs every process that lists the data sets ~0.4 s

    n, width = len(x), proc.stretched
    stretched = np.empty((n, width))
    for extra in np.unique(d.pad):  # one stretch per padded length (at most 25 of them)
        rows = np.flatnonzero(d.pad == extra)
        padded = np.concatenate([x[rows], np.zeros((len(rows), extra))], axis=1)
        stretched[rows] = interp_rows(padded, width)
    stretched *= (1 + proc.scale_coeff * (d.scale - 0.5))[:, None]
    shifted = stretched[np.arange(n)[:, None], (np.arange(width)[None, :] - d.shift[:, None]) % width]
    mask = shifted != 0
    smooth = gaussian_filter1d(proc.corr_noise_scale * d.corr, 2, axis=1)
    noisy = mask * shifted + (1 - mask) * smooth
    noisy = noisy + proc.iid_noise_scale * d.iid
    coeff = proc.shear_scale * (d.shear - 0.5)
    sheared = noisy - coeff[:, None] * np.linspace(-0.5, 0.5, width)[None, :]
    return interp_rows(sheared, proc.final_seq_length)


def make(proc: Procedure) -> tuple[np.ndarray, np.ndarray]:
    """(signals N x final_seq_length float64, labels N int64) in the procedure's shuffled order,
    standardised; N = num_samples rounded down to a multiple of 10 (the procedure's samples per
    class times 10)."""
    per_class = proc.num_samples // NUM_CLASSES
    n = per_class * NUM_CLASSES
    labels = np.repeat(np.arange(NUM_CLASSES), per_class)
    d = draw(proc, n)
    xs = transform(templates()[labels] + EPS, d, proc)
    xs, ys = xs[d.shuffle], labels[d.shuffle]
    return (xs - xs.mean()) / xs.std(), ys.astype(np.int64)


@lru_cache(maxsize=2)
def generate(num_samples: int, seed: int) -> tuple[np.ndarray, np.ndarray, float]:
    """`make` with the paper's settings but these size and seed, kept in memory per process
    (each rank generates once); also returns the seconds it took."""
    start = time.perf_counter()
    x, y = make(Procedure(num_samples=num_samples, seed=seed))
    return x, y, time.perf_counter() - start
