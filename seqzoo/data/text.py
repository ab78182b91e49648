"""Tokenisation and vocabularies."""

from __future__ import annotations

import logging
import re
from collections import Counter
from collections.abc import Iterable, Iterator, Mapping, Sequence
from os import PathLike
from typing import Any, ClassVar

from seqzoo.data.errors import DataError
from seqzoo.data.io import read_json, write_json

__all__ = ["Tokenizer", "Vocab", "warn_outside_vocabulary"]

log = logging.getLogger("seqzoo")

_APOSTROPHE = "['\u2019]"  # ASCII and typographic apostrophe
_TOKEN_RE = re.compile(
    rf"""
    \w+(?=n{_APOSTROPHE}t\b)                # "do" of "don't", "ca" of "can't" (PTB)
    | n{_APOSTROPHE}t\b                      # the negation clitic "n't"
    | ``|''                                  # PTB/Brown quotes
    | {_APOSTROPHE}(?:s|re|ve|ll|d|m)\b      # clitics "'s 're 've 'll 'd 'm"
    | \d+(?:[.,:]\d+)+                       # numbers and times: 3.14 1,000 10:30
    | \w+(?:-\w+)*                           # words, hyphenated compounds kept whole
    | \.\.\.+                                # ellipsis
    | [^\w\s]                                # any other symbol, one per token
    """,
    re.VERBOSE | re.IGNORECASE,
)
_HYPHEN_RE = re.compile(r"(-)")


class Tokenizer:
    """Rule-based word tokeniser in the spirit of the Penn Treebank conventions.

    Splits on whitespace and punctuation; every punctuation mark is its own token except
    ``...``; hyphenated compounds (``over-all``) and numbers (``3.14``, ``1,000``) stay whole.
    English clitics are split off as in the PTB: ``don't`` -> ``do n't``, ``can't`` ->
    ``ca n't``, ``it's`` -> ``it 's``, ``we'll`` -> ``we 'll`` (ASCII or typographic apostrophe,
    kept as written). The PTB/Brown quote tokens (two backquotes, two single quotes) stay
    whole. Unicode letters and digits count as word characters. With ``lowercase=True`` the
    tokens are lower-cased (as GloVe's vocabulary is). With ``split_hyphens=True`` compounds
    are split at their hyphens (``well-acted`` -> ``well - acted``), which lets pretrained
    vectors cover them: most GloVe misses on movie reviews are such compounds.

    >>> Tokenizer()("Don't panic, it's 3.5 km!")
    ['Do', "n't", 'panic', ',', 'it', "'s", '3.5', 'km', '!']
    """

    KIND: ClassVar[str] = "seqzoo.ptb-regex"

    def __init__(self, lowercase: bool = False, split_hyphens: bool = False) -> None:
        self.lowercase = bool(lowercase)
        self.split_hyphens = bool(split_hyphens)

    def __call__(self, text: str) -> list[str]:
        tokens = _TOKEN_RE.findall(text)
        if self.split_hyphens:
            tokens = [part for tok in tokens for part in _HYPHEN_RE.split(tok) if part]
        return [t.lower() for t in tokens] if self.lowercase else tokens

    def __repr__(self) -> str:
        return f"Tokenizer(lowercase={self.lowercase}, split_hyphens={self.split_hyphens})"

    def to_dict(self) -> dict[str, Any]:
        return {"kind": self.KIND, "lowercase": self.lowercase, "split_hyphens": self.split_hyphens}

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> Tokenizer:
        if d.get("kind") != cls.KIND or not isinstance(d.get("lowercase"), bool):
            raise ValueError(f"not a {cls.KIND} tokenizer description: {dict(d)!r}")
        return cls(lowercase=d["lowercase"], split_hyphens=bool(d.get("split_hyphens", False)))


class Vocab:
    """Bijection between tokens and ids, with ``<pad>`` = 0 and ``<unk>`` = 1.

    Further special tokens (e.g. ``<eos>``) follow at ids 2, 3, ...; then regular tokens.
    Unknown tokens encode to the ``<unk>`` id. :attr:`counts` holds the training frequency of
    every entry (for ``<unk>``: the occurrences of all tokens mapped to it).
    """

    PAD: ClassVar[str] = "<pad>"
    UNK: ClassVar[str] = "<unk>"
    pad_id: ClassVar[int] = 0
    unk_id: ClassVar[int] = 1

    def __init__(
        self, tokens: Sequence[str], counts: Mapping[str, int] | None = None, specials: Sequence[str] = ()
    ) -> None:
        """Build from tokens in id order; ``tokens`` must start with PAD, UNK, then ``specials``."""
        tokens = list(tokens)
        specials = (self.PAD, self.UNK, *specials)
        if tuple(tokens[: len(specials)]) != specials:
            raise ValueError(f"a vocabulary must start with {list(specials)}, got {tokens[: len(specials)]}")
        self._itos = tokens
        self._stoi = {t: i for i, t in enumerate(tokens)}
        if len(self._stoi) != len(tokens):
            dupes = sorted(t for t, c in Counter(tokens).items() if c > 1)
            raise ValueError(f"duplicate vocabulary entries: {dupes[:10]}")
        self.specials: tuple[str, ...] = specials
        self.counts: dict[str, int] = {t: int((counts or {}).get(t, 0)) for t in tokens}

    @classmethod
    def build(
        cls,
        token_lists: Iterable[Sequence[str]],
        min_freq: int = 1,
        max_size: int | None = None,
        specials: Sequence[str] = (),
    ) -> Vocab:
        """Count tokens and keep those seen at least ``min_freq`` times.

        Regular tokens are ordered by frequency (descending), ties by the token string, so
        the result does not depend on the input order. ``max_size`` caps the number of
        *regular* tokens (specials come on top). Tokens equal to a special are counted for
        that special.
        """
        if min_freq < 1:
            raise ValueError(f"min_freq must be >= 1, got {min_freq}")
        if max_size is not None and max_size < 0:
            raise ValueError(f"max_size must be >= 0 or None, got {max_size}")
        freq: Counter[str] = Counter()
        for tokens in token_lists:
            freq.update(tokens)
        reserved = {cls.PAD, cls.UNK, *specials}
        regular = [t for t, c in freq.items() if c >= min_freq and t not in reserved]
        regular.sort(key=lambda t: (-freq[t], t))
        kept = regular[:max_size] if max_size is not None else regular
        counts = {t: freq[t] for t in (*reserved, *kept)}
        kept_set = set(kept)
        counts[cls.UNK] = sum(c for t, c in freq.items() if t not in kept_set and t not in reserved) + freq[cls.UNK]
        return cls([cls.PAD, cls.UNK, *specials, *kept], counts, specials)

    def __len__(self) -> int:
        return len(self._itos)

    def __contains__(self, token: object) -> bool:
        return token in self._stoi

    def __iter__(self) -> Iterator[str]:
        return iter(self._itos)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Vocab) and self.to_dict() == other.to_dict()

    def __repr__(self) -> str:
        return f"Vocab(size={len(self)}, specials={list(self.specials)})"

    def token_to_id(self, token: str) -> int:
        """The id of ``token``, or :attr:`unk_id` if it is not in the vocabulary."""
        return self._stoi.get(token, self.unk_id)

    def id_to_token(self, i: int) -> str:
        if not 0 <= i < len(self._itos):
            raise IndexError(f"token id {i} out of range for a vocabulary of size {len(self)}")
        return self._itos[i]

    def encode(self, tokens: Iterable[str]) -> list[int]:
        get, unk = self._stoi.get, self.unk_id
        return [get(t, unk) for t in tokens]

    def decode(self, ids: Iterable[int]) -> list[str]:
        return [self.id_to_token(int(i)) for i in ids]

    def to_dict(self) -> dict[str, Any]:
        return {
            "tokens": list(self._itos),
            "counts": [self.counts[t] for t in self._itos],
            "specials": list(self.specials[2:]),
        }

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> Vocab:
        tokens, counts, specials = d.get("tokens"), d.get("counts"), d.get("specials", [])
        if not (isinstance(tokens, list) and all(isinstance(t, str) for t in tokens)):
            raise ValueError("vocabulary 'tokens' must be a list of strings")
        if not (isinstance(counts, list) and len(counts) == len(tokens) and all(isinstance(c, int) for c in counts)):
            raise ValueError("vocabulary 'counts' must be a list of integers, one per token")
        if not (isinstance(specials, list) and all(isinstance(t, str) for t in specials)):
            raise ValueError("vocabulary 'specials' must be a list of strings")
        return cls(tokens, dict(zip(tokens, counts, strict=True)), specials)

    def save(self, path: str | PathLike[str]) -> None:
        """Write the vocabulary as JSON, atomically."""
        write_json(path, self.to_dict())

    @classmethod
    def load(cls, path: str | PathLike[str]) -> Vocab:
        """Read a vocabulary written by :meth:`save`; a malformed file raises :class:`DataError`."""
        obj = read_json(path)
        if not isinstance(obj, dict):
            raise DataError("a vocabulary file must hold a JSON object", path)
        try:
            return cls.from_dict(obj)
        except ValueError as err:
            raise DataError(str(err), path) from None


def warn_outside_vocabulary(tokens: Iterable[str], vocab: Vocab, what: str) -> None:
    """Warn, naming them, about ``tokens`` that ``vocab`` reads as ``<unk>`` (``what``: e.g. "prime tokens")."""
    unknown = sorted({token for token in tokens if token not in vocab})
    if unknown:
        log.warning("%s outside the vocabulary, read as <unk>: %s", what, " ".join(map(repr, unknown)))
