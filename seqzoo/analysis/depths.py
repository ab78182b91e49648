"""Predicted depths of a trained DA-GRN classifier (the DA-GRN paper's depth analyses).

Yang Liu, Fandong Meng, Jie Zhou, Yufeng Chen, Jinan Xu. "Depth-Adaptive Graph Recurrent Network
for Text Classification". arXiv 2003.00166, 2020 (MODELS.md 2.3–2.4). The encoder
(:class:`seqzoo.encoders.dagrn.DAGRN`) gives each word i a number of S-LSTM updates d_i, its depth
(eqs. 8–14; :attr:`DAGRN.last_depths`). Read from a trained run with dropout off (Gumbel-Max then
picks the noise-free argmax, so the depths are deterministic):

* :func:`sentence_depths`: the depth of each word of one text, as the paper's per-sentence figure;
* :func:`split_depths`: the depth histogram over every real word of a split, with the split's
  accuracy at the predicted depths and, on the same weights, at full depth (every word updated
  L times: the ``full_depth`` ablation).

:func:`depth_figure` draws both, the sentence as bars over its words and the histogram below.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import torch
from matplotlib.figure import Figure
from torch import Tensor, nn

from seqzoo.training.plots import save_figure

__all__ = ["DepthHistogram", "SentenceDepths", "depth_figure", "plot_depths", "sentence_depths", "split_depths"]


@dataclass
class SentenceDepths:
    """``depths[i]``: the number of S-LSTM updates of ``tokens[i]`` (0..L)."""

    tokens: list[str]
    depths: list[int]


@dataclass
class DepthHistogram:
    """``counts[d]``: the real words of ``split`` given d updates, d = 0..``num_layers``; the split's
    ``accuracy`` at those depths and ``full_depth_accuracy`` with every word updated L times."""

    split: str
    num_layers: int
    counts: list[int]
    accuracy: float
    full_depth_accuracy: float

    @property
    def mean(self) -> float:
        """Mean updates per real word."""
        return sum(d * n for d, n in enumerate(self.counts)) / max(1, sum(self.counts))


def _depth_encoder(task) -> nn.Module:
    """The task's DA-GRN encoder (anything with ``last_depths``, ``full_depth`` and ``num_layers``)."""
    encoder = getattr(getattr(task, "model", None), "encoder", None)
    if encoder is None or not all(hasattr(encoder, n) for n in ("last_depths", "full_depth", "num_layers")):
        raise ValueError(f"{type(encoder).__name__} predicts no depths: plot-depths reads DA-GRN (dagrn) runs")
    if not hasattr(task, "predict") or not hasattr(task, "tokenizer"):
        raise ValueError(f"{type(task).__name__}: plot-depths reads text classification runs")
    return encoder


@contextmanager
def _collected_depths(encoder: nn.Module) -> Iterator[list[Tensor]]:
    """The depths of the real words of every encoder forward inside the block, one 1-D tensor each."""
    collected: list[Tensor] = []

    def hook(module: nn.Module, args: tuple, kwargs: dict, output: object) -> None:
        mask = args[1] if len(args) > 1 else kwargs.get("mask")  # (B, T) True at real words
        depths = module.last_depths  # (B, T)
        collected.append((depths if mask is None else depths[mask]).flatten().cpu())

    handle = encoder.register_forward_hook(hook, with_kwargs=True)
    try:
        yield collected
    finally:
        handle.remove()


@torch.no_grad()
def sentence_depths(task, text: str) -> SentenceDepths:
    """The depth of each word of ``text`` under a trained classification task (``load_task``): the
    words as the task tokenises them (cut at ``data.max_len``, as in training)."""
    encoder = _depth_encoder(task)
    tokens = task.tokenizer(text)
    limit = getattr(task.config.data, "max_len", None)
    tokens = tokens[:limit] if limit else tokens
    if not tokens:
        raise ValueError("the text has no tokens")
    with _collected_depths(encoder) as collected:
        task.predict([text])  # dropout off
    return SentenceDepths(tokens, collected[0].tolist())


@torch.no_grad()
def split_depths(task, split: str = "test") -> DepthHistogram:
    """The depth histogram of every real word of ``split`` (a task loaded with its data), and the
    split's accuracy at the predicted depths and at full depth, on the same weights."""
    encoder = _depth_encoder(task)
    if split not in getattr(task, "encoded", {}):
        raise ValueError(f"the task has no {split!r} split (load it with its data)")
    adaptive = encoder.full_depth
    try:
        encoder.full_depth = False
        with _collected_depths(encoder) as collected:
            accuracy = task.evaluate(split)["accuracy"]
        encoder.full_depth = True
        full = task.evaluate(split)["accuracy"]
    finally:
        encoder.full_depth = adaptive
    counts = torch.bincount(torch.cat(collected), minlength=encoder.num_layers + 1)  # (L + 1,)
    return DepthHistogram(split, encoder.num_layers, counts.tolist(), accuracy, full)


def depth_figure(sentence: SentenceDepths, histogram: DepthHistogram | None = None) -> Figure:
    """The sentence's depths as bars over its words; below, the split's depth histogram (share of words)."""
    steps = len(sentence.tokens)
    fig = Figure(figsize=(min(24.0, max(6.0, 0.45 * steps)), 6.5 if histogram else 3.5))
    axes = fig.subplots(2 if histogram else 1, 1, squeeze=False)[:, 0]
    top = float(histogram.num_layers) if histogram else float(max(sentence.depths, default=1))
    ax = axes[0]
    ax.bar(range(steps), sentence.depths, color="tab:blue")
    ax.set_xticks(range(steps), sentence.tokens, rotation=60, ha="right", fontsize=8)
    ax.set_ylim(0, top + 0.5)
    ax.set_ylabel("updates (depth)")
    ax.set_title("predicted depth of each word", fontsize=9)
    if histogram:
        total = max(1, sum(histogram.counts))
        ax = axes[1]
        ax.bar(range(len(histogram.counts)), [100 * n / total for n in histogram.counts], color="tab:gray")
        ax.set_xticks(range(len(histogram.counts)))
        ax.set_xlabel("updates (depth)")
        ax.set_ylabel("% of words")
        ax.set_title(
            f"{histogram.split}: {total} words, mean depth {histogram.mean:.2f} of {histogram.num_layers}; "
            f"accuracy {100 * histogram.accuracy:.2f} (full depth {100 * histogram.full_depth_accuracy:.2f})",
            fontsize=9,
        )
    fig.tight_layout()
    return fig


def plot_depths(
    task, text: str, path: str | Path, split: str | None = "test"
) -> tuple[Path, SentenceDepths, DepthHistogram | None]:
    """Write :func:`depth_figure` of ``text`` (and of ``split``, unless None) under ``task`` to the PNG ``path``."""
    sentence = sentence_depths(task, text)
    histogram = split_depths(task, split) if split else None
    return save_figure(depth_figure(sentence, histogram), Path(path)), sentence, histogram
