#!/usr/bin/env python
"""Write the files the FFCV and DALI pipelines read, from the on-disk data set.

    python -m data.prepare data=cifar10 data.pipeline=ffcv          # <root>/ffcv/{train,val}.beton
    python -m data.prepare data=imagenet data.pipeline=ffcv data.ffcv.max_resolution=256
    python -m data.prepare data=digits data.pipeline=dali           # one file per sample
    python -m data.prepare ... force=true                           # overwrite what is there

It composes the same conf/ tree as cli.py (so `data.*` overrides and conf/local apply) and
writes where the run will read (`data.ffcv.dir`, `data.dali.dir`), with progress bars. Existing
files are never overwritten unless `force=true`; a file is written under a temporary name and
renamed when complete, so an interrupted write leaves nothing that looks ready.

FFCV's writer forks worker processes, which hangs if FFCV loader threads already exist in the
process; so every `.beton` is written in a freshly spawned process.
"""
from __future__ import annotations

import multiprocessing as mp
import os
import shutil
import sys
from pathlib import Path
from typing import Any, Optional, Sequence

import hydra
import numpy as np
from omegaconf import DictConfig

from data.config import DataConfig
from data.imagenet import imagefolder_files
from data.prepared import MANIFEST, expected_files, needs_preparation, prepared_dir, write_manifest
from core.errors import UserError, report_user_errors


def split_samples(cfg: DataConfig, split: str) -> tuple[Sequence[Any], Sequence[int]]:
    """(images, labels) of a split in the data set's index order (the torchvision pipeline's):
    float32 1x8x8 tensors (digits), uint8 32x32x3 arrays (CIFAR), file paths (ImageFolder)."""
    if cfg.name == "digits":
        from data.digits import load_digits_split

        x_tr, y_tr, x_te, y_te = load_digits_split(cfg.test_fraction, cfg.split_seed)
        x, y = (x_tr, y_tr) if split == "train" else (x_te, y_te)
        return x.numpy(), y.tolist()
    if cfg.name in ("cifar10", "cifar100"):
        from data.cifar import load_cifar

        x, y = load_cifar(cfg.root, cfg.name, split == "train")
        return x, y.tolist()
    files, labels = imagefolder_files(cfg.root, split)
    return files, labels


# ---- FFCV ------------------------------------------------------------------------------------
class _ImageFolderRGB:
    """ImageFolder samples as (RGB PIL image, label) for FFCV's writer."""

    def __init__(self, files: list[str], labels: list[int]) -> None:
        self.files, self.labels = files, labels

    def __len__(self) -> int:
        return len(self.files)

    def __getitem__(self, i: int) -> tuple[Any, int]:
        from PIL import Image

        with Image.open(self.files[i]) as img:
            return img.convert("RGB"), self.labels[i]


def _write_betons(jobs: list[tuple[DataConfig, str]], workers: int) -> None:
    """Runs in a spawned process (see the module docstring)."""
    # FFCV's writer starts its workers with the default start method, which in a spawned process
    # is spawn: every worker would re-import torch and FFCV. Here (a fresh process, no loader
    # threads) forking is what FFCV expects, and safe.
    mp.set_start_method("fork", force=True)
    from ffcv.fields import IntField, NDArrayField, RGBImageField
    from ffcv.writer import DatasetWriter

    for cfg, folder in jobs:
        for split in ("train", "val"):
            images, labels = split_samples(cfg, split)
            if cfg.name == "digits":
                image_field: Any = NDArrayField(dtype=np.dtype("float32"), shape=tuple(images.shape[1:]))
                dataset: Any = list(zip(images, labels))
            elif cfg.name in ("cifar10", "cifar100"):
                image_field, dataset = RGBImageField(write_mode="raw"), list(zip(images, labels))
            else:
                f = cfg.ffcv
                image_field = RGBImageField(write_mode="proportion", max_resolution=f.max_resolution,
                                            jpeg_quality=f.jpeg_quality,
                                            compress_probability=f.compress_probability)
                dataset = _ImageFolderRGB(images, labels)
            path = os.path.join(folder, f"{split}.beton")
            print(f"data.prepare: {len(dataset)} {split} samples -> {path}", flush=True)
            writer = DatasetWriter(path + ".partial", {"image": image_field, "label": IntField()},
                                   num_workers=workers)
            writer.from_indexed_dataset(dataset, chunksize=100)
            os.replace(path + ".partial", path)


def write_ffcv(jobs: list[tuple[DataConfig, Path]], workers: int, timeout: Optional[float] = None) -> None:
    """Write the .beton files of several (config, folder) jobs in one spawned process."""
    proc = mp.get_context("spawn").Process(target=_write_betons,
                                            args=([(c, str(f)) for c, f in jobs], workers))
    proc.start()
    proc.join(timeout)
    if proc.is_alive():
        proc.kill()
        raise RuntimeError(f"writing .beton files took more than {timeout} s; killed")
    if proc.exitcode != 0:
        raise RuntimeError(f"writing .beton files failed (exit code {proc.exitcode}, see above)")


# ---- DALI ------------------------------------------------------------------------------------
def write_dali(cfg: DataConfig, folder: Path) -> None:
    """One file per sample (CIFAR: PNG, lossless; digits: .npy of the normalised tensor) under
    folder/<split>/<class>/, and folder/<split>.txt listing them with labels in index order."""
    from PIL import Image
    from tqdm import tqdm

    for split in ("train", "val"):
        images, labels = split_samples(cfg, split)
        tmp = folder / f"{split}.partial"
        shutil.rmtree(tmp, ignore_errors=True)
        lines = []
        for i, (image, label) in enumerate(tqdm(list(zip(images, labels)), desc=f"{split} -> {folder}",
                                                 unit="img", file=sys.stdout)):
            rel = Path(split) / f"{label:03d}" / (f"{i:06d}.npy" if cfg.name == "digits" else f"{i:06d}.png")
            (tmp / rel.parent.name).mkdir(parents=True, exist_ok=True)
            if cfg.name == "digits":
                np.save(tmp / rel.parent.name / rel.name, np.ascontiguousarray(image, dtype=np.float32))
            else:
                Image.fromarray(image).save(tmp / rel.parent.name / rel.name)
            lines.append(f"{rel} {label}\n")
        shutil.rmtree(folder / split, ignore_errors=True)
        os.replace(tmp, folder / split)
        (folder / f"{split}.txt").write_text("".join(lines))


# ---- entry point -----------------------------------------------------------------------------
def _writer_settings(cfg: DataConfig) -> dict[str, Any]:
    """Recorded in the manifest, for the reader of a benchmark or a paper table."""
    if cfg.pipeline == "ffcv" and cfg.name == "imagenet":
        f = cfg.ffcv
        return {"written_with": {"max_resolution": f.max_resolution, "jpeg_quality": f.jpeg_quality,
                                 "compress_probability": f.compress_probability}}
    return {}


def prepare(cfgs: Sequence[DataConfig], force: bool = False, workers: Optional[int] = None,
            timeout: Optional[float] = None) -> list[Path]:
    """Write the files each config's pipeline reads (all FFCV ones in one spawned writer);
    returns the folders written."""
    from data.preflight import check_source_on_disk

    todo = []
    for cfg in cfgs:
        if not needs_preparation(cfg):
            what = "the ImageFolder under data.root" if cfg.pipeline == "dali" else "the data set as it is"
            print(f"data.prepare: data.pipeline={cfg.pipeline} reads {what}; nothing to write")
            continue
        check_source_on_disk(cfg)
        present = [p for p in expected_files(cfg) if p.exists()]
        if present and not force:
            raise UserError(f"{present[0]} exists; pass force=true to overwrite it")
        todo.append((cfg, prepared_dir(cfg)))
    for cfg, folder in todo:
        folder.mkdir(parents=True, exist_ok=True)
        (folder / MANIFEST).unlink(missing_ok=True)  # written last: the files are complete only with it
    ffcv_jobs = [(c, f) for c, f in todo if c.pipeline == "ffcv"]
    if ffcv_jobs:
        write_ffcv(ffcv_jobs, workers or os.cpu_count() or 1, timeout)
    for cfg, folder in todo:
        if cfg.pipeline == "dali":
            write_dali(cfg, folder)
        write_manifest(cfg, folder, **_writer_settings(cfg))
        print(f"data.prepare: wrote {folder}")
    return [f for _, f in todo]


@hydra.main(version_base="1.3", config_path="../conf", config_name="prepare")
def main(cfg: DictConfig) -> None:
    from omegaconf import OmegaConf

    from data import load_data_config

    with report_user_errors("data.prepare"):
        OmegaConf.resolve(cfg)
        prepare([load_data_config(cfg.data)], force=bool(cfg.force), workers=cfg.workers)


if __name__ == "__main__":
    main()
