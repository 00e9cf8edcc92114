"""FFCV operations whose randomness is a pure function of (seed, epoch, sample index).

FFCV's own random augmentations draw from numba's per-thread generators, so what a sample gets
depends on which loader thread decoded it, and a resumed run cannot reproduce it. These
replacements draw from a counter-based generator keyed by the sample index and an epoch key
that the loader writes into an `EpochKey` cell before each epoch; so a batch read after a resume
equals the batch the uninterrupted run read, whatever the thread count or scheduling.

The crop follows torchvision's `RandomResizedCrop.get_params` (ten tries of area and log-aspect
draws, then the centre-crop fallback); `SeededPaddedCrop` is `RandomCrop(size, padding)`
with zero fill; `SeededFlip` flips with probability 1/2. `Normalise` is the step after the
loader, on the batch's device. Data sets build their FFCV pipelines from these
(`DataSet.ffcv_image_ops`).
"""
from __future__ import annotations

from dataclasses import replace
from typing import Callable, Optional

import numba
import numpy as np
import torch
from ffcv.fields.rgb_image import IMAGE_MODES, ResizedCropRGBImageDecoder
from ffcv.libffcv import imdecode, resize_crop
from ffcv.pipeline.allocation_query import AllocationQuery
from ffcv.pipeline.compiler import Compiler
from ffcv.pipeline.operation import Operation
from ffcv.pipeline.state import State
from numba import types
from numba.core import cgutils
from numba.extending import intrinsic

_GOLDEN = np.uint64(0x9E3779B97F4A7C15)
_M1, _M2 = np.uint64(0xBF58476D1CE4E5B9), np.uint64(0x94D049BB133111EB)
_S30, _S27, _S31, _S11 = np.uint64(30), np.uint64(27), np.uint64(31), np.uint64(11)
# one stream per operation, so that the crop and the flip of a sample are independent
SALT_CROP, SALT_FLIP, SALT_PAD = np.uint64(0x51), np.uint64(0xF1), np.uint64(0x9A)


@numba.njit(cache=True)
def mix64(z: np.uint64) -> np.uint64:
    """splitmix64's finaliser: a bijection of 64-bit words that scrambles every bit."""
    z = (z ^ (z >> _S30)) * _M1
    z = (z ^ (z >> _S27)) * _M2
    return z ^ (z >> _S31)


@numba.njit(cache=True)
def sample_key(epoch_key: np.uint64, index: np.uint64, salt: np.uint64) -> np.uint64:
    return mix64(mix64(epoch_key ^ mix64(index + _GOLDEN)) ^ salt)


@numba.njit(cache=True)
def uniform(key: np.uint64, k: int) -> float:
    """The k-th uniform in [0, 1) of the stream `key` (53 random bits)."""
    return float(mix64(key + np.uint64(k + 1) * _GOLDEN) >> _S11) * (1.0 / 9007199254740992.0)


@intrinsic
def _pointer(typingctx, address):  # noqa: ANN001 - numba intrinsic signature
    """An integer address as a void pointer, so jitted code can read a cell that Python
    changes after compilation (numba freezes global and closure arrays as constants)."""
    sig = types.voidptr(types.intp)

    def codegen(context, builder, signature, args):  # noqa: ANN001
        return builder.inttoptr(args[0], cgutils.voidptr_t)

    return sig, codegen


class EpochKey:
    """A 64-bit cell shared by the loader (writes it before an epoch) and the jitted ops."""

    def __init__(self) -> None:
        self._cell = np.zeros(1, dtype=np.uint64)

    def set(self, key: int) -> None:
        self._cell[0] = np.uint64(key % 2**64)

    def reader(self) -> Callable[[], np.uint64]:
        address = self._cell.ctypes.data  # valid while this EpochKey lives (the ops hold it)

        @numba.njit
        def read() -> np.uint64:
            return numba.carray(_pointer(address), (1,), np.uint64)[0]

        return read


@numba.njit(cache=True)
def torchvision_rrc_window(key: np.uint64, height: int, width: int, scale: np.ndarray,
                           log_ratio: np.ndarray) -> tuple[int, int, int, int]:
    """(top, left, crop height, crop width) as torchvision's RandomResizedCrop.get_params."""
    area = height * width
    for attempt in range(10):
        target = area * (scale[0] + (scale[1] - scale[0]) * uniform(key, 4 * attempt))
        aspect = np.exp(log_ratio[0] + (log_ratio[1] - log_ratio[0]) * uniform(key, 4 * attempt + 1))
        w = int(np.round(np.sqrt(target * aspect)))
        h = int(np.round(np.sqrt(target / aspect)))
        if 0 < w <= width and 0 < h <= height:
            top = int(uniform(key, 4 * attempt + 2) * (height - h + 1))
            left = int(uniform(key, 4 * attempt + 3) * (width - w + 1))
            return top, left, h, w
    in_ratio = width / height
    lo, hi = np.exp(log_ratio[0]), np.exp(log_ratio[1])
    if in_ratio < lo:
        w, h = width, int(np.round(width / lo))
    elif in_ratio > hi:
        h, w = height, int(np.round(height * hi))
    else:
        w, h = width, height
    return (height - h) // 2, (width - w) // 2, h, w


class SeededRandomResizedCropDecoder(ResizedCropRGBImageDecoder):
    """Decode + RandomResizedCrop to `output_size`, the crop drawn from the sample's own stream."""

    def __init__(self, output_size: tuple[int, int], epoch_key: EpochKey,
                 scale: tuple[float, float] = (0.08, 1.0), ratio: tuple[float, float] = (3 / 4, 4 / 3)) -> None:
        super().__init__(output_size)
        self.epoch_key, self.scale, self.ratio = epoch_key, scale, ratio

    @property
    def get_crop_generator(self) -> Callable:  # required by the base class; unused here
        return torchvision_rrc_window

    def generate_code(self) -> Callable:
        jpg = IMAGE_MODES["jpg"]
        mem_read, my_range = self.memory_read, Compiler.get_iterator()
        imdecode_c, resize_crop_c = Compiler.compile(imdecode), Compiler.compile(resize_crop)
        read_key = self.epoch_key.reader()
        scale = np.array(self.scale, dtype=np.float64)
        log_ratio = np.log(np.array(self.ratio, dtype=np.float64))

        def decode(batch_indices, my_storage, metadata, storage_state):  # noqa: ANN001
            destination, temp_storage = my_storage
            epoch_key = read_key()
            for dst_ix in my_range(len(batch_indices)):
                source_ix = batch_indices[dst_ix]
                field = metadata[source_ix]
                image_data = mem_read(field["data_ptr"], storage_state)
                height, width = np.uint32(field["height"]), np.uint32(field["width"])
                if field["mode"] == jpg:
                    temp_buffer = temp_storage[dst_ix]
                    imdecode_c(image_data, temp_buffer, height, width, height, width, 0, 0, 1, 1, False, False)
                    temp_buffer = temp_buffer.reshape(-1)[:3 * height * width].reshape(height, width, 3)
                else:
                    temp_buffer = image_data.reshape(height, width, 3)
                key = sample_key(epoch_key, np.uint64(source_ix), SALT_CROP)
                top, left, h, w = torchvision_rrc_window(key, int(height), int(width), scale, log_ratio)
                resize_crop_c(temp_buffer, top, top + h, left, left + w, destination[dst_ix])
            return destination[:len(batch_indices)]

        decode.is_parallel = True
        return decode


class SeededFlip(Operation):
    """Horizontal flip of HWC uint8 images with probability 1/2, per sample's stream."""

    def __init__(self, epoch_key: EpochKey) -> None:
        super().__init__()
        self.epoch_key = epoch_key

    def generate_code(self) -> Callable:
        my_range, read_key = Compiler.get_iterator(), self.epoch_key.reader()

        def flip(images, dst, indices):  # noqa: ANN001
            epoch_key = read_key()
            n, h, w, c = images.shape
            for i in my_range(n):
                mirror = uniform(sample_key(epoch_key, np.uint64(indices[i]), SALT_FLIP), 0) < 0.5
                for r in range(h):  # explicit loops: array assignment compiles far slower
                    for col in range(w):
                        src = w - 1 - col if mirror else col
                        for ch in range(c):
                            dst[i, r, col, ch] = images[i, r, src, ch]
            return dst[:n]

        flip.is_parallel = True
        flip.with_indices = True
        return flip

    def declare_state_and_memory(self, previous_state: State) -> tuple[State, Optional[AllocationQuery]]:
        return replace(previous_state, jit_mode=True), AllocationQuery(previous_state.shape, previous_state.dtype)


class SeededPaddedCrop(Operation):
    """torchvision's RandomCrop(size, padding): zero-pad every side, then crop `size` at a
    uniformly drawn integer offset (per sample's stream)."""

    def __init__(self, padding: int, epoch_key: EpochKey) -> None:
        super().__init__()
        self.padding, self.epoch_key = padding, epoch_key

    def generate_code(self) -> Callable:
        my_range, read_key, pad = Compiler.get_iterator(), self.epoch_key.reader(), self.padding

        def padded_crop(images, dst, indices):  # noqa: ANN001
            epoch_key = read_key()
            n, h, w, c = images.shape
            for i in my_range(n):
                key = sample_key(epoch_key, np.uint64(indices[i]), SALT_PAD)
                top = int(uniform(key, 0) * (2 * pad + 1)) - pad  # the crop's offset in the image
                left = int(uniform(key, 1) * (2 * pad + 1)) - pad
                for r in range(h):
                    for col in range(w):
                        sr, sc = r + top, col + left
                        inside = 0 <= sr < h and 0 <= sc < w
                        for ch in range(c):
                            dst[i, r, col, ch] = images[i, sr, sc, ch] if inside else 0
            return dst[:n]

        padded_crop.is_parallel = True
        padded_crop.with_indices = True
        return padded_crop

    def declare_state_and_memory(self, previous_state: State) -> tuple[State, Optional[AllocationQuery]]:
        return replace(previous_state, jit_mode=True), AllocationQuery(previous_state.shape, previous_state.dtype)


class Normalise:
    """uint8 NHWC -> float NCHW, normalised on the batch's device, with the operations (and so
    the rounding) of torchvision's ToTensor + Normalize."""

    def __init__(self, mean: tuple[float, ...], std: tuple[float, ...]) -> None:
        self.mean = torch.tensor(mean, dtype=torch.float32).view(-1, 1, 1)
        self.std = torch.tensor(std, dtype=torch.float32).view(-1, 1, 1)

    def __call__(self, images: torch.Tensor) -> torch.Tensor:
        if self.mean.device != images.device:
            self.mean, self.std = self.mean.to(images.device), self.std.to(images.device)
        x = images.permute(0, 3, 1, 2).contiguous().float().div(255)
        return x.sub_(self.mean).div_(self.std)
