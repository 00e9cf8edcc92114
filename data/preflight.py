"""Checks that a configured data set is on disk, cheap enough for cli.py to run before launch."""
from __future__ import annotations

from data.config import DataConfig


def check_source_on_disk(cfg: DataConfig) -> None:
    """Raise `UserError` naming the path when the data set itself is missing (never downloads)."""
    if cfg.name in ("cifar10", "cifar100"):
        from data.cifar import cifar_dir

        cifar_dir(cfg.root, cfg.name)
    elif cfg.name == "imagenet":
        from data.imagenet import imagefolder_split

        imagefolder_split(cfg.root, "train")
        imagefolder_split(cfg.root, "val")


def check_data_on_disk(cfg: DataConfig) -> None:
    """Raise `UserError` when what the configured pipeline reads is missing: the prepared files
    (FFCV; DALI for CIFAR and digits), naming the command that writes them, or the data set."""
    from data.prepared import check_prepared, needs_preparation

    if needs_preparation(cfg):
        check_prepared(cfg)
    else:
        check_source_on_disk(cfg)
