"""Where a pipeline's prepared files live, and whether they are there and fit the config.

FFCV reads `.beton` files and DALI reads one file per sample (unless the data set's form is one
DALI reads in place: ImageFolder); `python -m data.prepare` writes both, with a `prepared.json`
manifest naming what they hold (the data set, the pipeline and the data set's
`prepared_identity`), so that a run pointed at files of another data set or another digits
split stops with one line instead of training on the wrong data.
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from core.errors import UserError
from data.config import DataConfig, Pipeline
from data.sets import DATASETS

MANIFEST = "prepared.json"


def needs_preparation(cfg: DataConfig) -> bool:
    if cfg.pipeline == Pipeline.ffcv:
        return True
    return cfg.pipeline == Pipeline.dali and not DATASETS.get(cfg.name).form.dali_reads_in_place


def prepared_dir(cfg: DataConfig) -> Path:
    section = {"ffcv": cfg.ffcv, "dali": cfg.dali}[cfg.pipeline]
    if section.dir:
        return Path(section.dir)
    if not cfg.root:
        raise UserError(f"data.{cfg.pipeline}.dir is not set for data.name={cfg.name}; set it "
                        f"(or data.root) to where `python -m data.prepare` should write")
    return Path(cfg.root) / cfg.pipeline


def expected_files(cfg: DataConfig) -> list[Path]:
    folder = prepared_dir(cfg)
    if cfg.pipeline == "ffcv":
        return [folder / "train.beton", folder / "val.beton", folder / MANIFEST]
    return [folder / "train", folder / "val", folder / MANIFEST]


def identity(cfg: DataConfig) -> dict[str, Any]:
    """What the prepared files' content depends on (the manifest must match it)."""
    return {"name": cfg.name, "pipeline": str(cfg.pipeline), **DATASETS.get(cfg.name).prepared_identity(cfg)}


def prepare_command(cfg: DataConfig, force: bool = False) -> str:
    return (f"python -m data.prepare data={cfg.name} data.pipeline={cfg.pipeline}"
            + (" force=true" if force else "") + " (plus this run's paths.* and data.* overrides)")


def check_prepared(cfg: DataConfig) -> None:
    """Raise `UserError` (one line, naming the command to run) unless the files are ready."""
    if not needs_preparation(cfg):
        return
    missing = [p for p in expected_files(cfg) if not p.exists()]
    if missing:
        raise UserError(f"data.pipeline={cfg.pipeline}: {missing[0]} does not exist; write it with: "
                        f"{prepare_command(cfg)}")
    manifest = json.loads((prepared_dir(cfg) / MANIFEST).read_text())
    want = identity(cfg)
    got = {k: manifest.get(k) for k in want}
    if got != want:
        raise UserError(f"data.pipeline={cfg.pipeline}: {prepared_dir(cfg)} holds {got}, not {want}; "
                        f"rewrite it with: {prepare_command(cfg, force=True)}")


def write_manifest(cfg: DataConfig, folder: Path, **facts: Any) -> None:
    (folder / MANIFEST).write_text(json.dumps({**identity(cfg), **facts}, indent=1, sort_keys=True) + "\n")
