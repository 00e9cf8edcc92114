"""ImageNet (ILSVRC-2012), or any classification set in the ImageFolder layout:
root/train/<class>/*.JPEG and root/val/<class>/* (the validation images sorted into class
folders, as torchvision's ImageNet scripts leave them).

Training: RandomResizedCrop (area 8-100 %, aspect 3/4-4/3) + horizontal flip; evaluation:
resize the shorter side to `data.eval_resize`, centre crop `data.image_size` (Goyal et al.'s
recipe, which the papers reproduced here train with).
"""
from __future__ import annotations

from typing import Any, Optional

from data.config import DataConfig
from data.samples.imagefolder import ImageFolderSamples, imagefolder_split
from data.sets import register_dataset
from data.sets.base import NO_DRAWS, DataSet, Finish, KeyedDraws, Transform

SCALE, RATIO = (0.08, 1.0), (3 / 4, 4 / 3)  # RandomResizedCrop's area share and aspect ranges


class ImageNet(DataSet):
    name = "imagenet"
    in_channels, image_size, num_classes = 3, 224, 1000
    form = ImageFolderSamples
    mean, std = (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)
    config = {"root": "${paths.data_root}/imagenet", "image_size": 224, "eval_resize": 256,
              "num_workers": 8, "eval_batch_size": 256,
              "val_fraction": None, "val_per_class": 10}  # 10 images per class: 10,000 of the training set

    def check_on_disk(self, cfg: DataConfig) -> None:
        imagefolder_split(cfg.root, "train")
        imagefolder_split(cfg.root, "val")

    def samples(self, cfg: DataConfig, split: str) -> ImageFolderSamples:
        return ImageFolderSamples.read(cfg.root, split)

    def sizes(self, cfg: DataConfig) -> tuple[int, int]:
        """(crop size, evaluation resize): 224 and 256 unless set; the resize keeps 256/224."""
        size = cfg.image_size or self.image_size
        return size, cfg.eval_resize or round(size * 256 / 224)

    # ---- per pipeline ------------------------------------------------------------------------
    def torchvision_transforms(self, cfg: DataConfig) -> tuple[Transform, Transform]:
        from torchvision import transforms as T

        size, resize = self.sizes(cfg)
        norm = [T.ToTensor(), T.Normalize(self.mean, self.std)]
        evals = T.Compose([T.Resize(resize), T.CenterCrop(size), *norm])
        if not cfg.augment:
            return evals, evals
        return T.Compose([T.RandomResizedCrop(size, SCALE, RATIO), T.RandomHorizontalFlip(), *norm]), evals

    def ffcv_image_ops(self, cfg: DataConfig, train: bool, epoch_key: Any) -> tuple[list[Any], Finish]:
        from ffcv.fields.rgb_image import CenterCropRGBImageDecoder

        from data.ffcv_augment import Normalise, SeededFlip, SeededRandomResizedCropDecoder

        size, resize = self.sizes(cfg)
        if train and cfg.augment:
            ops = [SeededRandomResizedCropDecoder((size, size), epoch_key, SCALE, RATIO), SeededFlip(epoch_key)]
        else:  # FFCV's centre crop takes the share of the shorter side that resize + crop keeps
            ops = [CenterCropRGBImageDecoder((size, size), ratio=size / resize)]
        return ops, Normalise(self.mean, self.std)

    def dali_draws(self, cfg: DataConfig, train: bool) -> Optional[KeyedDraws]:
        """Training crops draw from DALI's own generator inside the decoder (a region decode:
        only the crop is decoded), so a training pipeline is built per epoch; evaluation draws
        nothing."""
        return None if train and cfg.augment else NO_DRAWS

    def dali_images(self, cfg: DataConfig, encoded: Any, train: bool, decoder: str,
                    draws: Optional[dict[str, Any]] = None) -> Any:
        from nvidia.dali import fn, types

        size, resize = self.sizes(cfg)
        norm = self.dali_normalisation()
        if train and cfg.augment:
            images = fn.decoders.image_random_crop(encoded, device=decoder, output_type=types.RGB,
                                                   random_area=list(SCALE), random_aspect_ratio=list(RATIO),
                                                   num_attempts=10)
            images = fn.resize(images, size=(size, size))
            return fn.crop_mirror_normalize(images, mirror=fn.random.coin_flip(), **norm)
        images = fn.decoders.image(encoded, device=decoder, output_type=types.RGB)
        images = fn.resize(images, resize_shorter=resize)
        return fn.crop_mirror_normalize(images, crop=(size, size), **norm)


IMAGENET = register_dataset(ImageNet())
