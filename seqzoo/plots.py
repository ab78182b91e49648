"""PNG plots of training curves and summaries (matplotlib, headless)."""

from __future__ import annotations

import json
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt

__all__ = ["plot_curves", "save_figure"]


def save_figure(fig: plt.Figure, path: Path) -> Path:
    """Write ``fig`` atomically to ``path`` and close it."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    fig.savefig(tmp, dpi=120, bbox_inches="tight", format="png")
    plt.close(fig)
    tmp.replace(path)
    return path


def plot_curves(metrics_path: Path, out_dir: Path, metric: str) -> list[Path]:
    """``loss.png`` (train loss, dev loss) and ``{metric}.png`` (dev, and test as a marker) per epoch."""
    records = [json.loads(line) for line in metrics_path.read_text(encoding="utf-8").splitlines() if line.strip()]
    epochs = [r for r in records if r.get("event") == "epoch"]
    if not epochs:
        return []
    test = next((r for r in records if r.get("event") == "test"), None)
    x = [r["epoch"] for r in epochs]
    paths = []
    fig, ax = plt.subplots(figsize=(5, 3.5))
    ax.plot(x, [r["train_loss"] - r.get("train_auxiliary", 0.0) for r in epochs], "o-", label="train")
    if "dev_loss" in epochs[0]:
        ax.plot(x, [r["dev_loss"] for r in epochs], "s-", label="dev")
    ax.set(xlabel="epoch", ylabel="loss", title="Loss")
    ax.grid(alpha=0.3)
    ax.legend()
    paths.append(save_figure(fig, out_dir / "loss.png"))
    fig, ax = plt.subplots(figsize=(5, 3.5))
    ax.plot(x, [r[f"dev_{metric}"] for r in epochs], "o-", label="dev")
    if test is not None and f"test_{metric}" in test:
        ax.plot([test["best_epoch"]], [test[f"test_{metric}"]], "r*", markersize=12, label="test (best dev)")
    ax.set(xlabel="epoch", ylabel=metric, title=metric.capitalize())
    ax.grid(alpha=0.3)
    ax.legend()
    paths.append(save_figure(fig, out_dir / f"{metric}.png"))
    return paths
