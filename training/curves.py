"""Learning-curve plot of a run: training loss and train / validation error per epoch."""

from __future__ import annotations

import io
from pathlib import Path

from .atomic import write_atomic

__all__ = ["plot_curves"]


def plot_curves(history: list[dict], path: Path, title: str = "") -> None:
    import matplotlib

    matplotlib.use("Agg")  # no display here, and never one under torchrun
    import matplotlib.pyplot as plt

    epochs = [row["epoch"] for row in history]
    fig, (loss_ax, err_ax) = plt.subplots(1, 2, figsize=(9, 3.4))
    loss_ax.plot(epochs, [row["train_loss"] for row in history], marker=".", label="train (running, dropout on)")
    loss_ax.plot(epochs, [row["valid_nll"] for row in history], marker=".", label="validation")
    loss_ax.set(xlabel="epoch", ylabel="cross-entropy", yscale="log")
    err_ax.plot(epochs, [100 * row["train_error"] for row in history], marker=".", label="train (running, dropout on)")
    err_ax.plot(epochs, [100 * row["valid_error"] for row in history], marker=".", label="validation")
    err_ax.set(xlabel="epoch", ylabel="error (%)")
    for ax in (loss_ax, err_ax):
        ax.grid(alpha=0.3)
        ax.legend()
    fig.suptitle(title)
    fig.tight_layout()
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", dpi=110)
    plt.close(fig)
    write_atomic(path, buffer.getvalue())
