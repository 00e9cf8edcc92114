"""Where a run's numbers go: `metrics.jsonl` always, Weights & Biases when `logger=wandb`.

Only the reporting rank (the first training rank) writes. wandb is imported lazily, runs in the
configured mode (offline works without a network; `wandb sync` uploads later), keeps its run id
in the run directory so that a resumed run continues the same wandb run, and has no built-in
entity or project beyond the config's.
"""
from __future__ import annotations

import enum
import json
import math
import os
import secrets
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional

from core.rundir import RunDir
from core.schema import Section, option


class LoggerName(enum.StrEnum):
    none = "none"  # metrics.jsonl and summary.json only
    wandb = "wandb"  # Weights & Biases besides; offline needs no network (`wandb sync` later)


class WandbMode(enum.StrEnum):
    online = "online"
    offline = "offline"
    disabled = "disabled"


@dataclass
class LoggerConfig(Section):
    name: LoggerName = LoggerName.none
    project: str = "syncopt"
    entity: Optional[str] = None  # never a built-in one: the config's, or wandb's own default
    tags: list[str] = option(factory=list)
    group: Optional[str] = None
    mode: WandbMode = WandbMode.offline


def _clean(value: Any) -> Any:
    if isinstance(value, float) and (math.isnan(value) or math.isinf(value)):
        return None
    return value


class MetricsLog:
    """Append-only JSON lines; on resume, lines from steps after the checkpoint are dropped so
    the file reads as one uninterrupted run."""

    def __init__(self, path: Path, resume_step: Optional[int]) -> None:
        self.path = path
        if resume_step is None:
            if path.exists():
                path.unlink()
        elif path.exists():
            kept = [ln for ln in path.read_text().splitlines() if _kept_on_resume(ln, resume_step)]
            path.write_text("".join(ln + "\n" for ln in kept))
        self._fh = open(path, "a", buffering=1)

    def write(self, record: dict[str, Any]) -> None:
        self._fh.write(json.dumps({k: _clean(v) for k, v in record.items()}) + "\n")

    def close(self) -> None:
        self._fh.close()


def _kept_on_resume(line: str, resume_step: int) -> bool:
    """A line of the log to keep when resuming at `resume_step`: a record up to that step. A line
    cut short by a kill of its writer, or that is no record (edited by hand), is dropped rather
    than taken for one, so that the resumed run's log reads back."""
    try:
        record = json.loads(line)
    except ValueError:
        return False
    step = record.get("step", 0) if isinstance(record, dict) else None
    return isinstance(step, (int, float)) and not isinstance(step, bool) and step <= resume_step


def read_metrics(path: Path) -> list[dict[str, Any]]:
    if not path.exists():
        return []
    return [json.loads(ln) for ln in path.read_text().splitlines() if ln.strip()]


class WandbLogger:
    def __init__(self, cfg: LoggerConfig, run_dir: RunDir, config: dict[str, Any], name: str) -> None:
        import wandb  # a heavy optional dependency, imported only when logger=wandb

        id_file = run_dir.wandb_id
        run_id = id_file.read_text().strip() if id_file.exists() else secrets.token_hex(4)
        id_file.write_text(run_id)
        os.environ.setdefault("WANDB_SILENT", "true")
        self._run = wandb.init(project=cfg.project, entity=cfg.entity, tags=list(cfg.tags) or None,
                               group=cfg.group, mode=str(cfg.mode), dir=str(run_dir.root), id=run_id,
                               resume="allow", config=config, name=name)

    def log(self, record: dict[str, Any], step: int) -> None:
        self._run.log({k: v for k, v in record.items() if isinstance(v, (int, float))}, step=step)

    def summary(self, summary: dict[str, Any]) -> None:
        for key, value in summary.items():
            if isinstance(value, (int, float, str)):
                self._run.summary[key] = value

    def close(self) -> None:
        self._run.finish()


class Reporter:
    """Fans a record out to the metrics file and, if configured, wandb."""

    def __init__(self, run_dir: RunDir, cfg: LoggerConfig, config: dict[str, Any], resume_step: Optional[int]) -> None:
        self.metrics = MetricsLog(run_dir.metrics, resume_step)
        self.wandb = WandbLogger(cfg, run_dir, config, run_dir.root.name) if cfg.name == LoggerName.wandb else None

    def log(self, record: dict[str, Any]) -> None:
        self.metrics.write(record)
        if self.wandb:
            self.wandb.log(record, step=int(record["step"]))

    def finish(self, summary: dict[str, Any]) -> None:
        if self.wandb:
            self.wandb.summary(summary)

    def close(self) -> None:
        self.metrics.close()
        if self.wandb:
            self.wandb.close()
