"""PNG plots of training curves and summaries (matplotlib, headless)."""

from __future__ import annotations

import io
import json
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
from matplotlib.ticker import MaxNLocator

from seqzoo.data.io import atomic_write_bytes

__all__ = ["plot_curves", "save_figure"]


def save_figure(fig: plt.Figure, path: Path) -> Path:
    """Write ``fig`` atomically to ``path`` (a temporary file of its own, so that two writers of one
    path cannot rename each other's half-written file into place) and close it."""
    path.parent.mkdir(parents=True, exist_ok=True)
    png = io.BytesIO()
    try:
        fig.savefig(png, dpi=120, bbox_inches="tight", format="png")
    finally:
        plt.close(fig)
    atomic_write_bytes(path, png.getvalue())
    return path


#: How a metric's name is written on a plot (others are capitalised).
_METRIC_NAMES = {"bpc": "BPC (bits per character)", "bleu": "BLEU", "chrf": "chrF"}


def plot_curves(metrics_path: Path, out_dir: Path, metric: str) -> list[Path]:
    """``loss.png`` (train loss every ``train.log_every`` steps, dev loss after each epoch) and
    ``{metric}.png`` (dev after each epoch, test of the best dev checkpoint as a star), against
    training steps. Runs whose records carry no step numbers (older ones) are drawn by epoch."""
    records = [json.loads(line) for line in metrics_path.read_text(encoding="utf-8").splitlines() if line.strip()]
    epochs = [r for r in records if r.get("event") == "epoch"]
    if not epochs:
        return []
    steps = [r for r in records if r.get("event") == "step"]
    test = next((r for r in records if r.get("event") == "test"), None)
    by_step = all("step" in r for r in epochs)
    key, xlabel = ("step", "training step") if by_step else ("epoch", "epoch")
    at = {r["epoch"]: r[key] for r in epochs}
    x = [r[key] for r in epochs]
    paths = []
    fig, ax = plt.subplots(figsize=(5.5, 3.5))
    train = steps if by_step and steps else epochs  # per log_every steps where recorded
    ax.plot(
        [r[key] for r in train], [r["train_loss"] - r.get("train_auxiliary", 0.0) for r in train], "-", label="train"
    )
    if "dev_loss" in epochs[0]:
        ax.plot(x, [r["dev_loss"] for r in epochs], "s-", label="dev (after each epoch)")
    ax.set(xlabel=xlabel, ylabel="loss", title="Loss")
    paths.append(_finish(fig, ax, out_dir / "loss.png"))
    fig, ax = plt.subplots(figsize=(5.5, 3.5))
    ax.plot(x, [r[f"dev_{metric}"] for r in epochs], "o-", label="dev (after each epoch)")
    if test is not None and f"test_{metric}" in test and test.get("best_epoch") in at:
        ax.plot([at[test["best_epoch"]]], [test[f"test_{metric}"]], "r*", markersize=12, label="test (best dev)")
    name = _METRIC_NAMES.get(metric, metric.capitalize())
    ax.set(xlabel=xlabel, ylabel=name, title=name)
    paths.append(_finish(fig, ax, out_dir / f"{metric}.png"))
    return paths


def _finish(fig: plt.Figure, ax: plt.Axes, path: Path) -> Path:
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))  # no epoch 1.25
    ax.grid(alpha=0.3)
    ax.legend()
    return save_figure(fig, path)
