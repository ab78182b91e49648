"""Zone relevance of a character-level language model (the MZU paper's Figure 3).

For a text ``c_1 … c_T`` read from a zero state (dropout off), the relevance of an earlier
character ``s`` to character ``t`` (``s < t``) is the cosine between the candidate ``h̃_t``
computed while reading ``c_t`` and the hidden state ``h_s`` after reading ``c_s``
(Figure 3(a) for the GRU, 3(b) for the capMZU). With deep transition each step has one
candidate per depth; ``depth`` picks it (default 0: the cell that reads ``c_t``, the step's
transformation of its input). The top layer of a stacked encoder is used. MZU, GRU (``gru_ln``)
and DT-GRU encoders are supported.

**Per block of units** (our stand-in for Figure 3(c), whose "zone-specific relevance" the paper
does not define; MZU only): block ``k`` of an ``H``-vector is its slice ``[k·H/N, (k+1)·H/N)``, N
the candidate's M-function's zones, and its relevance is the cosine between those slices of ``h̃_t``
and ``h_s``. ``h̃`` and ``h`` are outputs of the M-function's final linear map, which mixes every
zone into every unit, so a block is a fixed group of hidden units, not a zone: the panel is
labelled so. A GRU, or an MZU whose candidate is not an M-function (``regular_trans``), has one
block: the whole state.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

import matplotlib
import torch
import torch.nn.functional as F
from matplotlib.figure import Figure
from torch import Tensor

from seqzoo.data.text import warn_outside_vocabulary
from seqzoo.encoders.base import module_mode
from seqzoo.encoders.dtgru import DeepTransitionGRU
from seqzoo.encoders.mzu import MZU, MFunction
from seqzoo.training.devices import model_device
from seqzoo.training.plots import save_figure

__all__ = ["ZoneRelevance", "plot_zone_relevance", "relevance_matrix", "zone_relevance"]


@dataclass
class ZoneRelevance:
    """``chars`` (T), ``overall`` (T, T) and ``zones`` (N, T, T).

    Entry ``[..., t, s]`` is the relevance of character ``s`` to character ``t`` (NaN for ``s ≥ t``).
    """

    chars: list[str]
    overall: Tensor
    zones: Tensor


def relevance_matrix(candidates: Tensor, states: Tensor, num_zones: int = 1) -> Tensor:
    """Cosines ``[k, t, s] = cos(zone k of candidates[t], zone k of states[s])`` for ``s < t``, else NaN.

    ``candidates`` and ``states`` (T, H); ``num_zones`` N divides H -> (N, T, T).
    """
    steps = candidates.shape[0]
    cand = F.normalize(candidates.unflatten(-1, (num_zones, -1)), dim=-1).transpose(0, 1)  # (N, T, d_z)
    state = F.normalize(states.unflatten(-1, (num_zones, -1)), dim=-1).transpose(0, 1)
    cosines = cand @ state.transpose(-1, -2)
    earlier = torch.ones(steps, steps, dtype=torch.bool).tril(-1)
    return cosines.masked_fill(~earlier, torch.nan)


@torch.no_grad()
def zone_relevance(task, text: str, depth: int = 0) -> ZoneRelevance:
    """Relevances for ``text`` under a trained char-level LM task with an MZU, GRU or DT-GRU encoder."""
    encoder = task.model.encoder
    if not isinstance(encoder, (MZU, DeepTransitionGRU)):
        raise ValueError(f"zone relevance needs an MZU, GRU (gru_ln) or DT-GRU encoder, got {type(encoder).__name__}")
    if task.level != "char":
        raise ValueError(f"zone relevance reads characters; this model is {task.level}-level")
    if len(text) < 2:
        raise ValueError("the text needs at least two characters")
    warn_outside_vocabulary(list(text), task.vocab, "characters")
    ids = torch.tensor([task.vocab.encode(list(text))], device=model_device(task.model))
    with module_mode(task.model, training=False):
        candidates, states = (t.cpu() for t in encoder.trace(task.model.embedding(ids)))
    if not 0 <= depth < candidates.shape[2]:
        raise ValueError(f"depth must be in [0, {candidates.shape[2] - 1}], got {depth}")
    cand, state = candidates[0, :, depth], states[0]
    zones = 1  # a GRU, or an MZU whose candidate is no M-function
    if isinstance(encoder, MZU) and isinstance(candidate := encoder.cells[-1].transitions[0].candidate, MFunction):
        zones = candidate.num_zones
    return ZoneRelevance(list(text), relevance_matrix(cand, state)[0], relevance_matrix(cand, state, zones))


def plot_zone_relevance(
    relevance: ZoneRelevance | Mapping[str, ZoneRelevance], path: str | Path, last: int = 5
) -> Path:
    """PNG in the style of Figure 3: for each model, the relevance of every earlier character to
    each of the ``last`` characters (Figure 3(a, b)); then, for each MZU, per block of hidden units
    for the final character (our stand-in for Figure 3(c), module docstring). Pass one relevance,
    or several of the same text by model name (e.g. ``{"GRU": ..., "capMZU": ...}``). Grayscale
    from each panel's lowest (black) to highest (white) cosine, as the colour bars show; blue = no
    earlier character."""
    if last < 1:
        raise ValueError(f"last must be >= 1, got {last}")
    models = dict(relevance) if isinstance(relevance, Mapping) else {"": relevance}
    if not models:
        raise ValueError("no relevance to plot")
    texts = {"".join(r.chars) for r in models.values()}
    if len(texts) > 1:
        raise ValueError(f"the models must read the same text, got {sorted(texts)}")
    chars = ["_" if c == " " else "\\n" if c == "\n" else c for c in next(iter(models.values())).chars]
    steps = len(chars)
    rows = list(range(max(1, steps - last), steps))
    prefixes = {name: f"{name}: " if name else "" for name in models}
    panels = [  # (values, y labels, title): every model's relevances, then the blocks of those with blocks
        (rel.overall[rows], [chars[t] for t in rows], f"{prefixes[name]}relevance to each of the last characters")
        for name, rel in models.items()
    ]
    for name, rel in models.items():
        zones = rel.zones.shape[0]
        if zones > 1:  # an MZU's (a GRU's one block would repeat its relevance panel's last row)
            labels = [f"block {k + 1}" for k in range(zones)]
            title = f"{prefixes[name]}per block of 1/{zones} of the hidden units (not zones), for {chars[-1]!r}"
            panels.append((rel.zones[:, -1], labels, title))
    heights = [len(labels) for _, labels, _ in panels]
    fig = Figure(figsize=(max(6.0, 0.22 * steps), 1.0 + 0.3 * sum(heights) + 0.6 * len(panels)))
    axes = fig.subplots(len(panels), 1, gridspec_kw={"height_ratios": heights}, squeeze=False)[:, 0]
    for ax, (values, labels, title) in zip(axes, panels, strict=True):
        known = values[~values.isnan()]
        cmap = matplotlib.colormaps["gray"].with_extremes(bad="tab:blue")  # NaN: no earlier character
        image = ax.imshow(values.numpy(), cmap=cmap, vmin=float(known.min()), vmax=float(known.max()), aspect="auto")
        ax.set_xticks(range(steps), chars, fontsize=7)
        ax.set_yticks(range(len(labels)), labels, fontsize=8)
        ax.set_title(title, fontsize=9)
        fig.colorbar(image, ax=ax, fraction=0.02, pad=0.01)
    fig.tight_layout()
    return save_figure(fig, Path(path))
