"""Batched augmentation on the training device, with per-sample draws keyed by (seed, epoch, index).

The device pipeline (`data.pipelines.device`) holds a data set's images on the training device
and turns a batch of them into the model's input in a handful of tensor operations, whatever
the batch size: a zero-padded random crop with an offset of its own for every sample and a
horizontal flip (one gather), then the conversion to float and the normalisation. A data set says
which of these its batches get (`DeviceAugment`, from `DataSet.device_augment`).

Every random draw is a pure function of the sample's seed, `data.sampler.sample_seeds(seed,
epoch, index)` (what the torchvision pipeline seeds each sample's transform with), mixed with
splitmix64's finaliser in 64-bit integer arithmetic that CPUs and GPUs compute identically; so a
batch does not depend on the batches before it, and a resumed run reads exactly what the
uninterrupted one read. The crops are those of torchvision's `RandomCrop(size, padding)`
(offsets 0..2*pad), the flip that of `RandomHorizontalFlip` (probability 1/2); the draws
themselves differ from torchvision's, as they do between the other pipelines.
"""
from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Optional

import torch
import torch.nn.functional as F

_MASK64 = (1 << 64) - 1


def _signed(value: int) -> int:
    """A 64-bit word as the int64 that holds the same bits."""
    value &= _MASK64
    return value - (1 << 64) if value >= 1 << 63 else value


_GOLDEN = _signed(0x9E3779B97F4A7C15)
_M1, _M2 = _signed(0xBF58476D1CE4E5B9), _signed(0x94D049BB133111EB)
# one stream per draw, so that a sample's vertical and horizontal offsets and its flip are independent
SALT_ROW, SALT_COL, SALT_FLIP = 0x5EED01, 0x5EED02, 0x5EED03


def _shr(z: torch.Tensor, bits: int) -> torch.Tensor:
    """Logical right shift of int64 words (torch's >> is arithmetic: it copies the sign bit)."""
    return (z >> bits) & ((1 << (64 - bits)) - 1)


def mix64(z: torch.Tensor) -> torch.Tensor:
    """splitmix64's finaliser on int64 words (multiplication wraps as on uint64)."""
    z = (z ^ _shr(z, 30)) * _M1
    z = (z ^ _shr(z, 27)) * _M2
    return z ^ _shr(z, 31)


def draw(seeds: torch.Tensor, salt: int, n: int) -> torch.Tensor:
    """One integer in [0, n) per seed, from the stream `salt` (53 bits reduced modulo n: a bias
    below 1e-15 for the small n used here)."""
    bits = _shr(mix64(mix64(seeds ^ _signed(salt * 0x100000001B3)) + _GOLDEN), 11)
    return bits % n


@dataclass(frozen=True)
class DeviceAugment:
    """What the device pipeline does to a batch of one data set (its `device_augment`)."""

    size: int  # the random crop's side (without one, images keep their own, as torchvision's do)
    pad: int = 0  # >0: a random `size` crop of the image zero-padded by this much on each side
    flip: bool = False  # a horizontal flip with probability 1/2
    mean: Optional[tuple[float, ...]] = None  # uint8 pixels to (x / 255 - mean) / std; None: as stored
    std: Optional[tuple[float, ...]] = None

    @property
    def random(self) -> bool:
        return self.pad > 0 or self.flip

    def __call__(self, images: torch.Tensor, seeds: Optional[torch.Tensor]) -> torch.Tensor:
        """images: B x H x W x C (uint8, or float already normalised), on the device; seeds: the
        batch's `sample_seeds` (needed when `random`). Returns B x C x size x size in the usual
        contiguous layout, as every pipeline does (the trainer re-lays it for a channels_last
        model); for uint8 images the layout change rides on the conversion to float."""
        if self.random:
            images = crop_and_flip(images, seeds, self.size, self.pad, self.flip)
        nchw = images.movedim(-1, 1)  # (a 1-D signal's N x L x C: N x C x L)
        if self.mean is None:  # (clone: even a one-channel batch gets the usual strides)
            return nchw.clone(memory_format=torch.contiguous_format)
        # the same operations, in the same order, as torchvision's ToTensor and Normalize
        full, mean, std = _statistics(tuple(self.mean), tuple(self.std or ()), nchw.device)
        out = nchw.to(torch.float32, memory_format=torch.contiguous_format)
        return out.div_(full).sub_(mean).div_(std)


@functools.lru_cache(maxsize=None)
def _statistics(mean: tuple[float, ...], std: tuple[float, ...], device: torch.device,
                ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """255 (as a 0-d tensor), the normalisation's mean and std (C x 1 x 1) on `device`, made once
    per device.

    255 is a tensor on the device, not a Python number: CUDA divides by a host scalar as a
    multiplication by its reciprocal, which differs from the division in the last bit for some
    pixel values, so the GPU's batches were not the CPU's (tests/test_gpu.py::
    test_device_pipeline_on_the_gpu_equals_the_cpu failed on an H100); a device tensor is divided
    by, as on the CPU.

    Made per batch, `torch.tensor(list, device=cuda)` copied from pageable host memory, and that
    copy waits for everything queued on the GPU: the host stopped at every batch until the
    previous step had finished, so it could no longer launch ahead of the GPU. On an H100 that
    was 12.7% of ResNet-18's training time spent 'waiting for data' and 0.74 of the compute
    ceiling (bench/throughput.py, 2026-11-24)."""
    return (torch.tensor(255.0, dtype=torch.float32, device=device),
            torch.tensor(mean, dtype=torch.float32, device=device).view(-1, 1, 1),
            torch.tensor(std, dtype=torch.float32, device=device).view(-1, 1, 1))


def crop_offsets(seeds: torch.Tensor, side: int, size: int, pad: int,
                 flip: bool) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Per sample: (row offset, column offset) of the crop in the padded image, in
    0..side + 2*pad - size, and whether it is flipped."""
    span = side + 2 * pad - size + 1
    rows, cols = draw(seeds, SALT_ROW, span), draw(seeds, SALT_COL, span)
    flips = draw(seeds, SALT_FLIP, 2).bool() if flip else torch.zeros_like(seeds, dtype=torch.bool)
    return rows, cols, flips


def crop_and_flip(images: torch.Tensor, seeds: torch.Tensor, size: int, pad: int, flip: bool) -> torch.Tensor:
    """Each image's own random crop (and flip) in one gather: B x H x W x C -> B x size x size x C."""
    batch, side = images.shape[0], images.shape[1]
    rows, cols, flips = crop_offsets(seeds, side, size, pad, flip)
    padded = F.pad(images, (0, 0, pad, pad, pad, pad)) if pad else images
    step = torch.arange(size, device=images.device)
    row_index = rows[:, None] + step  # B x size
    col_index = cols[:, None] + torch.where(flips[:, None], size - 1 - step, step)
    which = torch.arange(batch, device=images.device)[:, None, None]
    return padded[which, row_index[:, :, None], col_index[:, None, :]]
