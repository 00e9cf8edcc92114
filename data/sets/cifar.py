"""CIFAR-10 and CIFAR-100 (Krizhevsky 2009) in the python-pickle layout of the CIFAR site.

Read directly rather than through `torchvision.datasets.CIFAR10`, which insists on the official
files' MD5 sums, so the test-generated small sets in the same format load too; the batches are
unpickled by `data.samples.safe_pickle`, which refuses anything but the dicts, lists and numpy
arrays the format holds, so a tampered file cannot run code. Training augmentation is the
standard one (He et al. 2016): a 4-pixel zero-padded random crop and a horizontal flip.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional

import numpy as np
import torch

from core.errors import UserError
from data.config import DataConfig
from data.samples.arrays import ArraySamples
from data.samples.safe_pickle import load_restricted
from data.device_augment import DeviceAugment, crop_offsets
from data.sets import register_dataset
from data.sets.base import NO_DRAWS, DataSet, Finish, KeyedDraws, Transform

PAD = 4  # pixels of zero padding before the random crop


@dataclass(frozen=True)
class Cifar(DataSet):
    name: str
    num_classes: int
    folder: str  # under data.root, as the python-version archive extracts
    train_files: tuple[str, ...]
    test_files: tuple[str, ...]
    label_key: bytes
    mean: tuple[float, ...]
    std: tuple[float, ...]

    in_channels, image_size = 3, 32
    form = ArraySamples

    @property
    def config(self) -> dict[str, Any]:  # type: ignore[override]
        return {"root": f"${{paths.data_root}}/{self.name}", "num_workers": 2, "eval_batch_size": 512}
    # validation: the schema's data.val_fraction=0.1, i.e. 5,000 of the 50,000 (500 a class)

    def num_train_samples(self, cfg: DataConfig) -> Optional[int]:
        return 50_000  # the official sets' size (a smaller copy is checked when it is read)

    def plan_labels(self, cfg: DataConfig) -> Optional[np.ndarray]:
        """The official training set's class sizes (50,000 images in equal classes), without
        reading its 150 MB; a smaller copy's own sizes are checked when the ranks read it."""
        return np.repeat(np.arange(self.num_classes, dtype=np.int64), 50_000 // self.num_classes)

    # ---- on disk -----------------------------------------------------------------------------
    def directory(self, root: str) -> Path:
        path = Path(root) / self.folder
        expected = self.train_files + self.test_files
        missing = [f for f in expected if not (path / f).is_file()]
        if missing:
            raise UserError(
                f"data.root={root}: no {self.name} data at {path} (missing {', '.join(missing)}); put the "
                f"extracted python-version archive there ({self.folder}/ with {', '.join(expected)})")
        return path

    def check_on_disk(self, cfg: DataConfig) -> None:
        self.directory(cfg.root)

    def load(self, root: str, train: bool) -> tuple[np.ndarray, np.ndarray]:
        """(images uint8 N x 32 x 32 x 3, labels int64 N) of the training or the test files."""
        path = self.directory(root)
        fix = "re-extract the python-version archive"
        images, labels = [], []
        for fname in self.train_files if train else self.test_files:
            batch = load_restricted(path / fname, "a CIFAR batch file", fix)
            try:
                images.append(np.asarray(batch[b"data"], dtype=np.uint8).reshape(-1, 3, 32, 32))
                labels.append(np.asarray(batch[self.label_key], dtype=np.int64))
            except (KeyError, TypeError, ValueError) as err:
                raise UserError(f"{path / fname} is not a CIFAR batch file ({err!r}); {fix}") from None
        return np.concatenate(images).transpose(0, 2, 3, 1).copy(), np.concatenate(labels)

    def samples(self, cfg: DataConfig, split: str) -> ArraySamples:
        return ArraySamples(*self.load(cfg.root, split == "train"))

    # ---- per pipeline ------------------------------------------------------------------------
    def torchvision_transforms(self, cfg: DataConfig) -> tuple[Transform, Transform]:
        """Padded random crop + flip for training; normalisation for both (uint8 HWC arrays in)."""
        from torchvision import transforms as T

        to_tensor = T.Compose([T.ToTensor(), T.Normalize(self.mean, self.std)])
        if not cfg.augment:
            return to_tensor, to_tensor
        size = cfg.image_size or self.image_size
        train = T.Compose([T.ToPILImage(), T.RandomCrop(size, padding=PAD), T.RandomHorizontalFlip(), to_tensor])
        return train, to_tensor

    def device_augment(self, cfg: DataConfig, train: bool) -> DeviceAugment:
        """The torchvision transforms' work, batched on the device: padded crop + flip, normalise."""
        size = cfg.image_size or self.image_size
        if train and cfg.augment:
            return DeviceAugment(size=size, pad=PAD, flip=True, mean=self.mean, std=self.std)
        return DeviceAugment(size=size, mean=self.mean, std=self.std)

    def ffcv_image_ops(self, cfg: DataConfig, train: bool, epoch_key: Any) -> tuple[list[Any], Finish]:
        from ffcv.fields.rgb_image import SimpleRGBImageDecoder

        from data.ffcv_augment import Normalise, SeededFlip, SeededPaddedCrop

        ops: list[Any] = [SimpleRGBImageDecoder()]
        if train and cfg.augment:
            ops += [SeededPaddedCrop(PAD, epoch_key), SeededFlip(epoch_key)]
        return ops, Normalise(self.mean, self.std)

    def dali_draws(self, cfg: DataConfig, train: bool) -> Optional[KeyedDraws]:
        """The device pipeline's crop offsets and flips (`crop_offsets`), as crop_mirror_normalize's
        relative crop positions: DALI and the device pipeline crop a sample alike."""
        if not (train and cfg.augment):
            return NO_DRAWS
        size = cfg.image_size or self.image_size
        span = 32 + 2 * PAD - size

        def make(seeds: np.ndarray) -> dict[str, np.ndarray]:
            rows, cols, flips = crop_offsets(torch.from_numpy(seeds), 32, size, PAD, True)
            return {"crop_y": (rows.numpy() / max(span, 1)).astype(np.float32),
                    "crop_x": (cols.numpy() / max(span, 1)).astype(np.float32),
                    "mirror": flips.numpy().astype(np.int32)}

        return KeyedDraws({"crop_y": np.float32, "crop_x": np.float32, "mirror": np.int32}, make)

    def dali_images(self, cfg: DataConfig, encoded: Any, train: bool, decoder: str,
                    draws: Optional[dict[str, Any]] = None) -> Any:
        from nvidia.dali import fn, types

        norm = self.dali_normalisation()
        images = fn.decoders.image(encoded, device=decoder, output_type=types.RGB)
        if not (train and cfg.augment):
            return fn.crop_mirror_normalize(images, **norm)
        size = cfg.image_size or self.image_size  # torchvision's RandomCrop(size, padding) + flip
        side = size + 2 * PAD
        padded = fn.crop(images, crop=(side, side), out_of_bounds_policy="pad", fill_values=0)
        if draws is None:  # DALI's own generators (a pipeline per epoch)
            offsets = [k / (2 * PAD) for k in range(2 * PAD + 1)]  # integer pixel offsets 0..2*PAD
            draws = {"crop_x": fn.random.uniform(values=offsets), "crop_y": fn.random.uniform(values=offsets),
                     "mirror": fn.random.coin_flip()}
        return fn.crop_mirror_normalize(padded, crop=(size, size), crop_pos_x=draws["crop_x"],
                                        crop_pos_y=draws["crop_y"], mirror=draws["mirror"], **norm)


CIFAR10 = register_dataset(Cifar(
    name="cifar10", num_classes=10, folder="cifar-10-batches-py",
    train_files=tuple(f"data_batch_{i}" for i in range(1, 6)), test_files=("test_batch",), label_key=b"labels",
    mean=(0.4914, 0.4822, 0.4465), std=(0.2470, 0.2435, 0.2616)))
CIFAR100 = register_dataset(Cifar(
    name="cifar100", num_classes=100, folder="cifar-100-python", train_files=("train",), test_files=("test",),
    label_key=b"fine_labels", mean=(0.5071, 0.4865, 0.4409), std=(0.2673, 0.2564, 0.2762)))
