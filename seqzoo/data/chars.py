"""Character ids of words, for the character features of :class:`seqzoo.embedders.TokenEmbedder`.

The character vocabulary is a :class:`~seqzoo.data.text.Vocab` over single characters
(``<pad>`` = 0, ``<unk>`` = 1), saved beside the word vocabulary as ``chars.json``. A batch of
token lists becomes a (B, T, C) id tensor, 0 at pad words and at the pad characters after each
word; words are cut to their first ``max_chars`` characters.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

import torch

from seqzoo.data.text import Vocab

__all__ = ["MAX_WORD_CHARS", "build_char_vocab", "encode_chars", "pad_chars"]

#: Characters kept of a word (its first ones): longer words are rare and add nothing to a char feature.
MAX_WORD_CHARS = 30

#: One text as character ids: a list of words, each a list of char ids (possibly empty).
CharIds = list[list[int]]


def build_char_vocab(token_lists: Iterable[Sequence[str]], min_freq: int = 1) -> Vocab:
    """The characters of the training tokens seen at least ``min_freq`` times, most frequent first."""
    return Vocab.build(((char for token in tokens for char in token) for tokens in token_lists), min_freq=min_freq)


def encode_chars(tokens: Sequence[str], vocab: Vocab, max_chars: int = MAX_WORD_CHARS) -> CharIds:
    """Each token's first ``max_chars`` characters as ids (unknown characters: ``<unk>``)."""
    if max_chars < 1:
        raise ValueError(f"max_chars must be >= 1, got {max_chars}")
    return [vocab.encode(token[:max_chars]) for token in tokens]


def pad_chars(texts: Sequence[CharIds], num_words: int | None = None) -> torch.Tensor:
    """Char ids of a batch of texts as one (B, T, C) int64 tensor, right-padded with 0 in both T and C.

    T is ``num_words`` (the word batch's length, which a text may not exceed), or else the longest
    text; C is the longest word (at least 1, so a batch of char-less words still has a char axis).
    """
    if not texts:
        raise ValueError("cannot pad an empty batch")
    longest = max(len(words) for words in texts)
    if num_words is None:
        num_words = longest
    elif longest > num_words:
        raise ValueError(f"a text has {longest} words, more than the batch's {num_words}")
    chars = max(1, max((len(word) for words in texts for word in words), default=0))
    pad_word = [0] * chars
    padded = [
        [[*word, *pad_word[len(word) :]] for word in words] + [pad_word] * (num_words - len(words)) for words in texts
    ]
    return torch.tensor(padded, dtype=torch.long).view(len(texts), num_words, chars)  # (B, T, C)
