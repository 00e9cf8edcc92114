"""Every path inside a run directory, in one place.

A run directory is shared by the launching process, every rank (on every node, over shared
storage) and the tools that read results (tables, tests). Its layout:

    config.yaml            the composed, resolved config
    metrics.jsonl          one line per log step and per evaluation
    summary.json           the run's results; its presence means "finished"
    stopped.json           why a run stopped early with a checkpoint (removed when it continues)
    curves.png, <algo>_schedule.png
    stop_request           a file that asks every node's launcher to checkpoint and stop
    run.lock               held by the one run that owns the directory
    run.log                the output of a run started as a job by another command (a table's row)
    wandb_id.txt, wandb/   Weights & Biases (offline) files
    logs/rank_<r>.log      each rank's log; .pid ("pid host") while it runs; .error when it failed;
                           .progress ("step time", rewritten every few seconds while it runs);
                           .exit (its exit code, once it has ended)
    logs/launch.json       how the job was launched (multi-node handshakes)
    logs/faults.jsonl      the run's fault log: attempts, failures, injected kills and stalls, resumes
    logs/attempt_<k>/      a failed attempt's rank files and metrics, moved there before a restart
    logs/deepspeed_env     the environment exported to pdsh-started nodes
    checkpoints/step_<8 digits>/rank_<r>.pt, manifest.json
    checkpoints/best.json
    spread/step_<8 digits>.json  a checkpoint's workers read by `python -m engine.worker_spread`
    ledger/rank_<r>/part_*.npz   the time ledger (`report.ledger=true`; engine/report/ledger.py)
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Optional


@dataclass(frozen=True)
class RunDir:
    root: Path

    @classmethod
    def of(cls, where: "RunDir | str | Path") -> "RunDir":
        """A run directory given as one or as its path."""
        return where if isinstance(where, RunDir) else cls(Path(where))

    # ---- results -----------------------------------------------------------------------------
    @property
    def config(self) -> Path:
        return self.root / "config.yaml"

    @property
    def metrics(self) -> Path:
        return self.root / "metrics.jsonl"

    @property
    def summary(self) -> Path:
        return self.root / "summary.json"

    @property
    def stopped(self) -> Path:
        return self.root / "stopped.json"

    @property
    def curves(self) -> Path:
        return self.root / "curves.png"

    def schedule_plot(self, algo: str) -> Path:
        return self.root / f"{algo}_schedule.png"

    @property
    def stop_request(self) -> Path:
        return self.root / "stop_request"

    @property
    def ledger(self) -> Path:
        return self.root / "ledger"

    def spread_record(self, step: int) -> Path:
        return self.root / "spread" / f"step_{step:08d}.json"

    @property
    def lock(self) -> Path:
        return self.root / "run.lock"

    @property
    def job_log(self) -> Path:
        return self.root / "run.log"

    @property
    def wandb_id(self) -> Path:
        return self.root / "wandb_id.txt"

    @property
    def hydra_subdir(self) -> Path:
        return self.root / ".hydra"

    # ---- logs --------------------------------------------------------------------------------
    @property
    def logs(self) -> Path:
        return self.root / "logs"

    def rank_log(self, rank: int) -> Path:
        return self.logs / f"rank_{rank}.log"

    def rank_pid(self, rank: int) -> Path:
        return self.logs / f"rank_{rank}.pid"

    def rank_error(self, rank: int) -> Path:
        return self.logs / f"rank_{rank}.error"

    def rank_progress(self, rank: int) -> Path:
        return self.logs / f"rank_{rank}.progress"

    def rank_exit(self, rank: int) -> Path:
        return self.logs / f"rank_{rank}.exit"

    def rank_files(self, kind: str) -> dict[int, Path]:
        """rank -> path of every `logs/rank_<r>.<kind>` file present (kind: pid, error, ...)."""
        found = {}
        for path in self.logs.glob(f"rank_*.{kind}"):
            rank = rank_of(path)
            if rank is not None:
                found[rank] = path
        return found

    @property
    def faults_log(self) -> Path:
        return self.logs / "faults.jsonl"

    def attempt_logs(self, attempt: int) -> Path:
        return self.logs / f"attempt_{attempt}"

    @property
    def launch_record(self) -> Path:
        return self.logs / "launch.json"

    @property
    def deepspeed_env(self) -> Path:
        return self.logs / "deepspeed_env"

    # ---- checkpoints -------------------------------------------------------------------------
    @property
    def checkpoints(self) -> Path:
        return self.root / "checkpoints"

    def step_dir(self, step: int) -> Path:
        return self.checkpoints / f"step_{step:08d}"

    @property
    def best(self) -> Path:
        return self.checkpoints / "best.json"


def rank_of(path: Path) -> Optional[int]:
    """The rank in a `rank_<r>.<kind>` file name (None for anything else)."""
    stem = path.name.split(".", 1)[0]
    prefix, _, number = stem.partition("_")
    return int(number) if prefix == "rank" and number.isdigit() else None


def step_of(path: Path) -> Optional[int]:
    """The step of a `step_<n>` checkpoint directory (None for anything else)."""
    prefix, _, number = path.name.partition("_")
    return int(number) if prefix == "step" and number.isdigit() else None


#: Set in the ranks' environment by a supervising cli.py: the ranks then leave their one-line
#: errors in `logs/rank_<r>.error` for it to print once, instead of printing them themselves (a
#: rank that printed could be killed by the launcher before its line came out).
SUPERVISED_ENV = "SYNCOPT_SUPERVISED"
#: how a rank's error file marks a user error (bad input), as opposed to a failure
USER_ERROR_PREFIX = "user error: "

#: File names inside one checkpoint directory (see engine/checkpoint).
MANIFEST = "manifest.json"


def rank_file(step_dir: Path, rank: int) -> Path:
    return step_dir / f"rank_{rank}.pt"
