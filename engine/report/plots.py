"""Plots of a run from its metrics.jsonl: training loss and accuracy, test accuracy, LR and
any plugin series the records carry (e.g. QSR's sync period H)."""
from __future__ import annotations

from pathlib import Path
from typing import Any


def plot_run(records: list[dict[str, Any]], out: Path, title: str) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    train = [r for r in records if r.get("kind") == "train"]
    evals = [r for r in records if r.get("kind") == "eval"]
    fig, (ax_loss, ax_acc) = plt.subplots(1, 2, figsize=(10, 4))
    if train:
        steps = [r["step"] for r in train]
        ax_loss.plot(steps, [r["loss"] for r in train], label="train loss")
        ax_acc.plot(steps, [r["acc"] for r in train], label="train acc", alpha=0.6)
    if evals:
        steps = [r["step"] for r in evals]
        ax_loss.plot(steps, [r["test_loss"] for r in evals], "o-", label="test loss")
        ax_acc.plot(steps, [r["test_acc"] for r in evals], "o-", label="test acc")
        if "val_acc" in evals[0]:
            ax_loss.plot(steps, [r["val_loss"] for r in evals], "s--", label="validation loss")
            ax_acc.plot(steps, [r["val_acc"] for r in evals], "s--", label="validation acc")
    ax_loss.set_xlabel("step")
    ax_loss.set_ylabel("loss")
    ax_loss.legend()
    ax_acc.set_xlabel("step")
    ax_acc.set_ylabel("accuracy")
    ax_acc.set_ylim(0, 1)
    ax_acc.legend()
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
