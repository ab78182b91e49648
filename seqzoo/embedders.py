"""Token embedder shared by the recipes: a word table, optional pretrained vectors, optional char features.

Word ids (B, T) (0 = pad) become word vectors (B, T, E) from an ``nn.Embedding`` that may start from
pretrained vectors (GloVe text, read by :func:`seqzoo.data.embeddings.load_vectors`) and may be
frozen. With character features, each word's character ids (B, T, C) (0 = pad, see
:mod:`seqzoo.data.chars`) give a feature (B, T, F) concatenated to the word vector:

* ``"cnn"``: char embeddings -> Conv1d with ``hidden_size`` filters of width ``kernel_size`` -> max
  over the word's characters (Ma & Hovy 2016, "End-to-end Sequence Labeling via Bi-directional
  LSTM-CNNs-CRF", sec. 2.1; the DA-GRN of Liu et al. 2020 uses 50 filters of width 3);
* ``"lstm"``: a character BiLSTM, its final forward and backward states concatenated (Lample et
  al. 2016, "Neural Architectures for Named Entity Recognition", sec. 4.1), each direction
  ``hidden_size / 2`` wide.

A word without characters (and every pad word) gets a zero char feature; pad characters change
nothing for the real ones, so a padded batch embeds each word as it would alone.
"""

from __future__ import annotations

from typing import Literal

import torch
from torch import Tensor, nn

__all__ = ["CHAR_ENCODERS", "CHAR_KEYS", "CharCNN", "CharLSTM", "TokenEmbedder"]

CHAR_ENCODERS = ("none", "cnn", "lstm")
#: The ``model`` config keys of the character features, read by every recipe that embeds with a TokenEmbedder.
CHAR_KEYS = frozenset({"char_encoder", "char_embedding_dim", "char_hidden_size", "char_kernel_size"})


class CharCNN(nn.Module):
    """Char ids (N, C) -> (N, hidden_size): embed, convolve (width ``kernel_size``), max over real chars."""

    def __init__(self, num_chars: int, embedding_dim: int, hidden_size: int, kernel_size: int = 3) -> None:
        super().__init__()
        if min(num_chars, embedding_dim, hidden_size, kernel_size) < 1:
            raise ValueError(
                f"num_chars, embedding_dim, hidden_size and kernel_size must be positive, "
                f"got {num_chars}, {embedding_dim}, {hidden_size}, {kernel_size}"
            )
        self.embedding = nn.Embedding(num_chars, embedding_dim, padding_idx=0)
        self.conv = nn.Conv1d(embedding_dim, hidden_size, kernel_size)
        self.output_size = hidden_size

    def forward(self, chars: Tensor) -> Tensor:
        real = chars.ne(0)  # (N, C)
        x = self.embedding(chars).masked_fill(~real.unsqueeze(-1), 0.0).transpose(1, 2)  # (N, E, C)
        width = self.conv.kernel_size[0]
        # "same" padding with zeros, as the pad chars are: a real char's window reads the same either way
        x = nn.functional.pad(x, ((width - 1) // 2, width // 2))  # (N, E, C + width - 1)
        features = self.conv(x).masked_fill(~real.unsqueeze(1), float("-inf")).amax(-1)  # (N, F)
        return torch.where(real.any(-1, keepdim=True), features, torch.zeros_like(features))


class CharLSTM(nn.Module):
    """Char ids (N, C) -> (N, hidden_size): a BiLSTM over the real chars, [final forward; final backward]."""

    def __init__(self, num_chars: int, embedding_dim: int, hidden_size: int) -> None:
        super().__init__()
        if min(num_chars, embedding_dim, hidden_size) < 1 or hidden_size % 2:
            raise ValueError(
                f"num_chars and embedding_dim must be positive and hidden_size positive and even (both directions' "
                f"final states), got {num_chars}, {embedding_dim}, {hidden_size}"
            )
        self.embedding = nn.Embedding(num_chars, embedding_dim, padding_idx=0)
        self.lstm = nn.LSTM(embedding_dim, hidden_size // 2, batch_first=True, bidirectional=True)
        self.output_size = hidden_size

    def forward(self, chars: Tensor) -> Tensor:
        lengths = chars.ne(0).sum(-1)  # (N,); chars are right-padded
        words = lengths.nonzero().squeeze(-1)  # the words with characters, (N',)
        if len(words) == 0:
            return self.embedding.weight.new_zeros(chars.shape[0], self.output_size)
        packed = nn.utils.rnn.pack_padded_sequence(
            self.embedding(chars[words]), lengths[words].cpu(), batch_first=True, enforce_sorted=False
        )
        _, (h_n, _) = self.lstm(packed)  # (2, N', F/2): forward, backward
        final = torch.cat([h_n[0], h_n[1]], dim=-1)  # (N', F)
        return final.new_zeros(chars.shape[0], self.output_size).index_copy(0, words, final)  # (N, F)


class TokenEmbedder(nn.Module):
    """Word ids (B, T) [+ char ids (B, T, C)] -> (B, T, output_size): [word vector; char feature].

    The word table is :attr:`weight` (vocab_size, embedding_dim), named and initialised as
    ``nn.Embedding``'s (N(0, 1), a zero ``<pad>`` row), so a model that swaps its ``nn.Embedding``
    for a TokenEmbedder keeps its parameter names. ``vectors``: the table's initial values instead;
    ``freeze`` keeps the table fixed. ``char_encoder`` ``"none"`` takes no char ids; ``"cnn"`` and
    ``"lstm"`` need ``num_chars`` (the char vocabulary's size); their weights are under ``chars``.
    """

    def __init__(
        self,
        vocab_size: int,
        embedding_dim: int,
        *,
        vectors: Tensor | None = None,
        freeze: bool = False,
        char_encoder: Literal["none", "cnn", "lstm"] = "none",
        num_chars: int = 0,
        char_embedding_dim: int = 25,
        char_hidden_size: int = 50,
        char_kernel_size: int = 3,
    ) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.empty(vocab_size, embedding_dim), requires_grad=not freeze)
        if vectors is not None and tuple(vectors.shape) != (vocab_size, embedding_dim):
            raise ValueError(f"vectors of shape {tuple(vectors.shape)}, expected {(vocab_size, embedding_dim)}")
        with torch.no_grad():  # drawn even under vectors, so that the random draws after it do not depend on them
            nn.init.normal_(self.weight)
            self.weight[0].zero_()
            if vectors is not None:
                self.weight.copy_(vectors)
        self.chars: CharCNN | CharLSTM | None
        if char_encoder == "none":
            self.chars = None
        elif char_encoder == "cnn":
            self.chars = CharCNN(num_chars, char_embedding_dim, char_hidden_size, char_kernel_size)
        elif char_encoder == "lstm":
            self.chars = CharLSTM(num_chars, char_embedding_dim, char_hidden_size)
        else:
            raise ValueError(f"unknown char_encoder {char_encoder!r}; choose one of {', '.join(CHAR_ENCODERS)}")
        self.char_encoder = char_encoder

    @property
    def embedding_dim(self) -> int:
        """The word vectors' size."""
        return self.weight.shape[1]

    @property
    def output_size(self) -> int:
        return self.embedding_dim + (0 if self.chars is None else self.chars.output_size)

    def words(self, ids: Tensor) -> Tensor:
        """The word vectors alone, (B, T, embedding_dim)."""
        return nn.functional.embedding(ids, self.weight, padding_idx=0)

    def forward(self, ids: Tensor, chars: Tensor | None = None) -> Tensor:
        words = self.words(ids)  # (B, T, E)
        if self.chars is None:
            if chars is not None:
                raise ValueError("this embedder has no character features (char_encoder 'none'): pass no char ids")
            return words
        if chars is None or chars.dim() != 3 or chars.shape[:2] != ids.shape:
            got = None if chars is None else tuple(chars.shape)
            raise ValueError(f"char ids must be (B, T, C) with (B, T) = {tuple(ids.shape)}, got {got}")
        features = self.chars(chars.reshape(-1, chars.shape[-1]))  # (B*T, F)
        return torch.cat([words, features.view(*ids.shape, -1).to(words.dtype)], dim=-1)  # (B, T, E + F)

    def extra_repr(self) -> str:
        return f"{self.weight.shape[0]}, {self.embedding_dim}, char_encoder={self.char_encoder!r}"
