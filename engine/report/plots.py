"""Plots of a run from its metrics.jsonl: the task's metrics against step (training, validation,
test), LR and any plugin series the records carry (e.g. QSR's sync period H)."""
from __future__ import annotations

from pathlib import Path
from typing import Any, Sequence


LABELS = {"loss": "loss (nats)", "acc": "accuracy", "bpc": "bits per character", "ppl": "perplexity",
          "top5": "top-5 accuracy"}


def plot_run(records: list[dict[str, Any]], out: Path, title: str, panels: Sequence[str] = ("loss", "acc")) -> Path:
    """One panel per metric of the task (`Task.plotted`: classification's loss and accuracy, a
    language model's loss, bits per character and next-character accuracy) against step:
    training (where the training log has it), validation and test."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    train = [r for r in records if r.get("kind") == "train"]
    evals = [r for r in records if r.get("kind") == "eval"]
    fig, axes = plt.subplots(1, len(panels), figsize=(5 * len(panels), 4), squeeze=False)
    for ax, name in zip(axes[0], panels):
        word = "acc" if name == "acc" else name
        if train and name in train[0]:
            ax.plot([r["step"] for r in train], [r[name] for r in train], label=f"train {word}",
                    alpha=0.6 if name == "acc" else 1.0)
        for prefix, style, label in (("test", "o-", "test"), ("val", "s--", "validation")):
            key = f"{prefix}_{name}"
            rows = [r for r in evals if r.get(key) is not None]
            if rows:
                ax.plot([r["step"] for r in rows], [r[key] for r in rows], style, label=f"{label} {word}")
        ax.set_xlabel("step")
        ax.set_ylabel(LABELS.get(name, name))
        if name in ("acc", "top5"):
            ax.set_ylim(0, 1)
        ax.legend()
    fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(out, dpi=100)
    plt.close(fig)
    return out


def plot_series(records: list[dict[str, Any]], keys: list[str], out: Path, title: str) -> Path:
    """One panel per key against step (used for lr and H, staleness, ...)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(len(keys), 1, figsize=(8, 2.5 * len(keys)), sharex=True, squeeze=False)
    for ax, key in zip(axes[:, 0], keys):
        rows = [r for r in records if key in r and r[key] is not None]
        ax.plot([r["step"] for r in rows], [r[key] for r in rows], drawstyle="steps-post")
        ax.set_ylabel(key)
    axes[-1, 0].set_xlabel("step")
    fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(out, dpi=100)
    plt.close(fig)
    return out
