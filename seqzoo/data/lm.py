"""Language-modelling data: token streams, parallel batching and truncated-BPTT windows.

What is counted (the denominators of perplexity and BPC, see TASKS.md):

* ``level="word"``: whitespace-separated tokens, plus one :data:`EOS` token per line, as in
  Mikolov's PTB setup (``lm/brown_word``: 965,692 train tokens incl. ``<eos>``; the files'
  own ``<unk>`` tokens map to the vocabulary's ``<unk>``).
* ``level="char"``: every character of the file, newlines included (``lm/brown_char``:
  4,722,727 train characters; ``lm/sotu_char``: one address per line, 9,901,987;
  single-line text8 works the same way).
"""

from __future__ import annotations

from collections.abc import Sequence
from os import PathLike
from typing import Literal

import torch

from seqzoo.data.errors import DataError
from seqzoo.data.io import open_text
from seqzoo.data.text import Vocab

__all__ = ["EOS", "batchify", "build_lm_vocab", "read_lm_tokens", "tbptt_batches"]

EOS = "<eos>"

Level = Literal["word", "char"]


def read_lm_tokens(path: str | PathLike[str], level: Level) -> list[str]:
    """The token stream of a text file (``.gz`` aware, strict UTF-8); see the module docstring.

    Word level: each line's whitespace-separated tokens followed by ``<eos>`` (a blank line
    contributes just ``<eos>``). Char level: every character, ``"\\n"`` included. An empty
    file raises :class:`DataError`.
    """
    if level not in ("word", "char"):
        raise ValueError(f"level must be 'word' or 'char', got {level!r}")
    tokens: list[str] = []
    with open_text(path) as lines:
        for line in lines:
            if level == "word":
                tokens.extend(line.split())
                tokens.append(EOS)
            else:
                tokens.extend(line)
    if not tokens:
        raise DataError("empty file: no tokens", path)
    return tokens


def build_lm_vocab(tokens: Sequence[str], level: Level, min_freq: int = 1, max_size: int | None = None) -> Vocab:
    """The vocabulary of a training stream: ``<eos>`` is a special at word level.

    Ids: ``<pad>`` 0 (never a target), ``<unk>`` 1, then (word level) ``<eos>`` 2, then the
    tokens by descending frequency. Tokens outside the vocabulary (rarer than ``min_freq``,
    beyond ``max_size``, or unseen in training) encode to ``<unk>``.
    """
    return Vocab.build([tokens], min_freq=min_freq, max_size=max_size, specials=(EOS,) if level == "word" else ())


def batchify(ids: torch.Tensor, batch_size: int) -> torch.Tensor:
    """Cut a (N,) id stream into ``batch_size`` contiguous parallel streams, (B, N // B).

    Row b holds ``ids[b * (N // B) : (b + 1) * (N // B)]``; the last ``N % B`` ids are dropped.
    """
    if ids.dim() != 1:
        raise ValueError(f"expected a 1-d id stream, got shape {tuple(ids.shape)}")
    if not 1 <= batch_size <= ids.numel():
        raise ValueError(f"batch_size must be in [1, {ids.numel()}], got {batch_size}")
    width = ids.numel() // batch_size
    return ids[: batch_size * width].view(batch_size, width)


def tbptt_batches(streams: torch.Tensor, bptt: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Consecutive (input, target) windows over (B, N) streams for truncated BPTT.

    Window i is ``x = streams[:, s : s + t]``, ``y = streams[:, s + 1 : s + 1 + t]`` with
    ``s = i * bptt`` and ``t = min(bptt, N - 1 - s)``: the last window may be shorter, and
    every position but the first of each stream is a target exactly once. The windows are
    views; carry the encoder state from one window to the next.
    """
    if streams.dim() != 2:
        raise ValueError(f"expected (batch, length) streams, got shape {tuple(streams.shape)}")
    if bptt < 1:
        raise ValueError(f"bptt must be >= 1, got {bptt}")
    n = streams.shape[1]
    return [
        (streams[:, s : s + min(bptt, n - 1 - s)], streams[:, s + 1 : s + 1 + min(bptt, n - 1 - s)])
        for s in range(0, n - 1, bptt)
    ]
