"""Hidden-state heat maps of a trained text model (the QRNN paper's Figure 3).

A document is encoded by a trained run's model (dropout off, read from a zero state) and the
encoder's output, the last layer's hidden states, is drawn as a (channels x time) heat map with
the tokens along the time axis. Long hidden sizes can be cut to the ``channels`` units whose value
varies most over the document. Works for any encoder; for a QRNN the outputs are ``h_t = o_t * c_t``.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path

import torch
from matplotlib.figure import Figure
from torch import Tensor

from seqzoo.data.batching import pad_batch
from seqzoo.data.chars import encode_chars, pad_chars
from seqzoo.encoders.base import module_mode
from seqzoo.training.devices import model_device
from seqzoo.training.plots import save_figure

log = logging.getLogger("seqzoo")

__all__ = ["HiddenStates", "hidden_state_figure", "hidden_states", "plot_hidden_states"]


@dataclass
class HiddenStates:
    """``values`` (T, N): the encoder outputs at the document's tokens for output units ``channels``."""

    tokens: list[str]
    channels: list[int]
    values: Tensor


@torch.no_grad()
def hidden_states(task, text: str, channels: int | None = None) -> HiddenStates:
    """Encode ``text`` with a trained task (``seqzoo.training.runner.load_task``) and keep its hidden states.

    The task must tokenise like the classification recipe (``tokenizer``, ``vocab``, ``config.data.max_len``)
    and its model embed then encode (``model.embedding``, ``model.encoder``). ``channels`` keeps the
    units with the largest variance over time, in unit order; None keeps all.
    """
    model = task.model
    if not all(hasattr(task, name) for name in ("tokenizer", "vocab")) or not hasattr(model, "encoder"):
        raise ValueError(
            f"{type(task).__name__} has no document tokenizer: plot-hidden reads classification and ABSA runs"
        )
    tokens = task.tokenizer(text)
    limit = getattr(task.config.data, "max_len", None)
    if limit and len(tokens) > limit:
        log.warning(
            "the document has %d tokens; shown: the first %d (data.max_len, as in training)", len(tokens), limit
        )
        tokens = tokens[:limit]
    if not tokens:
        raise ValueError("the document has no tokens")
    ids, mask = pad_batch([task.vocab.encode(tokens)])
    device = model_device(model)
    chars = getattr(task, "chars", None)  # the model reads character features too
    inputs = [ids.to(device)]
    if chars is not None:
        inputs.append(pad_chars([encode_chars(tokens, chars)], ids.shape[1]).to(device))  # (1, T, C)
    with module_mode(model, training=False):
        outputs, _ = model.encoder(model.embedding(*inputs), mask.to(device))  # (1, T, D)
    states = outputs[0].cpu()
    keep = torch.arange(states.shape[1])
    if channels is not None:
        if channels < 1:
            raise ValueError(f"channels must be >= 1, got {channels}")
        keep = states.var(0, correction=0).topk(min(channels, states.shape[1])).indices.sort().values
    return HiddenStates(tokens, keep.tolist(), states[:, keep])


def hidden_state_figure(states: HiddenStates, title: str = "") -> Figure:
    """Units down, tokens across, on a diverging scale symmetric around 0. Up to 64 units each get a
    labelled row; more get thin unlabelled rows (256 units: a 10-inch-high map, not a 30-inch strip)."""
    steps, units = states.values.shape
    per_unit = 0.12 if units <= 64 else 0.033
    fig = Figure(figsize=(min(40.0, max(6.0, 0.25 * steps)), min(30.0, max(3.0, per_unit * units + 1.5))))
    ax = fig.subplots()
    limit = float(states.values.abs().max()) or 1.0
    image = ax.imshow(
        states.values.T.numpy(), cmap="RdBu_r", vmin=-limit, vmax=limit, aspect="auto", interpolation="nearest"
    )
    every = max(1, steps // 160)  # at most ~160 readable token labels
    ax.set_xticks(range(0, steps, every), states.tokens[::every], rotation=90, fontsize=7)
    if units <= 64:
        ax.set_yticks(range(units), [str(c) for c in states.channels], fontsize=6)
    ax.set_ylabel("hidden unit")
    ax.set_title(title or f"last-layer hidden states ({units} units)", fontsize=9)
    fig.colorbar(image, ax=ax, fraction=0.02, pad=0.01)
    fig.tight_layout()
    return fig


def plot_hidden_states(task, text: str, path: str | Path, channels: int | None = None) -> tuple[Path, HiddenStates]:
    """Write the heat map of ``text``'s hidden states under ``task`` to the PNG ``path``."""
    states = hidden_states(task, text, channels)
    return save_figure(hidden_state_figure(states), Path(path)), states
