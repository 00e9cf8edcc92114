#!/usr/bin/env python
"""Write the files the FFCV and DALI pipelines read, from the on-disk data set.

    python -m data.prepare data=cifar10 data.pipeline=ffcv          # <root>/ffcv/{train,val}.beton
    python -m data.prepare data=imagenet data.pipeline=ffcv data.ffcv.max_resolution=256
    python -m data.prepare data=digits data.pipeline=dali           # one file per sample
    python -m data.prepare ... force=true                           # overwrite what is there

It composes the parts of cli.py's tree that say what to write (conf/prepare.yaml: the
`data=NAME` option, `paths` and conf/local, so `data.*` overrides and this machine's data root
apply; models, algorithms and the runner's schema live on higher floors and are not needed) and
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
from hydra.core.config_store import ConfigStore
from omegaconf import DictConfig, OmegaConf

from core.errors import UserError, report_user_errors
from data import load_data_config, register_configs
from data.config import DataConfig, PathsConfig, Pipeline
from data.prepared_files import MANIFEST, expected_files, needs_preparation, prepared_dir, write_manifest
from data.sets import DATASETS
from data.sets.base import DataSet


# ---- FFCV ------------------------------------------------------------------------------------
def _write_betons(jobs: list[tuple[DataSet, DataConfig, str]], workers: int) -> None:
    """Runs in a spawned process (see the module docstring)."""
    # FFCV's writer starts its workers with the default start method, which in a spawned process
    # is spawn: every worker would re-import torch and FFCV. Here (a fresh process, no loader
    # threads) forking is what FFCV expects, and safe.
    mp.set_start_method("fork", force=True)
    from ffcv.fields import IntField
    from ffcv.writer import DatasetWriter

    for dataset, cfg, folder in jobs:
        for split in ("train", "val"):
            samples = dataset.samples(cfg, split)
            path = os.path.join(folder, f"{split}.beton")
            print(f"data.prepare: {len(samples)} {split} samples -> {path}", flush=True)
            fields = {"image": samples.ffcv_field(cfg.ffcv), "label": IntField()}
            writer = DatasetWriter(path + ".partial", fields, num_workers=workers)
            writer.from_indexed_dataset(samples.ffcv_rows(), chunksize=100)
            os.replace(path + ".partial", path)


def write_ffcv(jobs: list[tuple[DataConfig, Path]], workers: int, timeout: Optional[float] = None) -> None:
    """Write the .beton files of several (config, folder) jobs in one spawned process."""
    # the data set objects travel along, so the writer needs no registry lookup of its own
    args = [(DATASETS.get(c.name), c, str(f)) for c, f in jobs]
    proc = mp.get_context("spawn").Process(target=_write_betons, args=(args, workers))
    proc.start()
    proc.join(timeout)
    if proc.is_alive():
        proc.kill()
        raise RuntimeError(f"writing .beton files took more than {timeout} s; killed")
    if proc.exitcode != 0:
        raise RuntimeError(f"writing .beton files failed (exit code {proc.exitcode}, see above)")


# ---- DALI ------------------------------------------------------------------------------------
def write_dali(cfg: DataConfig, folder: Path) -> None:
    """One file per sample (the form's: lossless PNG for images in memory, .npy for tensors)
    under folder/<split>/<class>/, and folder/<split>.txt listing them with labels in index order."""
    from tqdm import tqdm

    dataset = DATASETS.get(cfg.name)
    for split in ("train", "val"):
        samples = dataset.samples(cfg, split)
        tmp = folder / f"{split}.partial"
        shutil.rmtree(tmp, ignore_errors=True)
        lines = []
        for i in tqdm(range(len(samples)), desc=f"{split} -> {folder}", unit="img", file=sys.stdout):
            label = samples.item(i)[1]
            rel = Path(split) / f"{label:03d}" / f"{i:06d}{samples.dali_suffix}"
            (tmp / rel.parent.name).mkdir(parents=True, exist_ok=True)
            samples.write_dali_file(i, tmp / rel.parent.name / rel.name)
            lines.append(f"{rel} {label}\n")
        shutil.rmtree(folder / split, ignore_errors=True)
        os.replace(tmp, folder / split)
        (folder / f"{split}.txt").write_text("".join(lines))


# ---- entry point -----------------------------------------------------------------------------
def _writer_settings(cfg: DataConfig) -> dict[str, Any]:
    """Recorded in the manifest, for the reader of a benchmark or a paper table."""
    settings = DATASETS.get(cfg.name).form.ffcv_settings(cfg.ffcv) if cfg.pipeline == Pipeline.ffcv else {}
    return {"written_with": settings} if settings else {}


def prepare(cfgs: Sequence[DataConfig], force: bool = False, workers: Optional[int] = None,
            timeout: Optional[float] = None) -> list[Path]:
    """Write the files each config's pipeline reads (all FFCV ones in one spawned writer);
    returns the folders written."""
    todo = []
    for cfg in cfgs:
        if not needs_preparation(cfg):
            what = "the data set's files where they lie" if cfg.pipeline == Pipeline.dali else "the data set as it is"
            print(f"data.prepare: data.pipeline={cfg.pipeline} reads {what}; nothing to write")
            continue
        DATASETS.get(cfg.name).check_on_disk(cfg)
        present = [p for p in expected_files(cfg) if p.exists()]
        if present and not force:
            raise UserError(f"{present[0]} exists; pass force=true to overwrite it")
        todo.append((cfg, prepared_dir(cfg)))
    for cfg, folder in todo:
        folder.mkdir(parents=True, exist_ok=True)
        (folder / MANIFEST).unlink(missing_ok=True)  # written last: the files are complete only with it
    ffcv_jobs = [(c, f) for c, f in todo if c.pipeline == Pipeline.ffcv]
    if ffcv_jobs:
        write_ffcv(ffcv_jobs, workers or os.cpu_count() or 1, timeout)
    for cfg, folder in todo:
        if cfg.pipeline == Pipeline.dali:
            write_dali(cfg, folder)
        write_manifest(cfg, folder, **_writer_settings(cfg))
        print(f"data.prepare: wrote {folder}")
    return [f for _, f in todo]


def register_prepare_configs() -> None:
    """conf/prepare.yaml's schema (`paths`, typed; other sections of conf/local pass untouched)
    and the `data=NAME` options."""
    ConfigStore.instance().store(name="_prepare_schema", node={"paths": PathsConfig})
    register_configs()


@hydra.main(version_base="1.3", config_path="../conf", config_name="prepare")
def main(cfg: DictConfig) -> None:
    with report_user_errors("data.prepare"):
        OmegaConf.resolve(cfg)
        prepare([load_data_config(cfg.data)], force=bool(cfg.force), workers=cfg.workers)


if __name__ == "__main__":
    register_prepare_configs()
    main()
