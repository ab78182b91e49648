"""Pre-trained word vectors in the GloVe text format."""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass
from os import PathLike

import torch

from seqzoo.data.errors import DataError
from seqzoo.data.io import open_text
from seqzoo.data.text import Vocab

__all__ = ["EmbeddingStats", "load_vectors", "with_pretrained_words"]


@dataclass(frozen=True)
class EmbeddingStats:
    """Coverage of a vocabulary by a vector file.

    Rates are over the *regular* vocabulary entries (specials such as ``<pad>``/``<unk>``
    excluded); the token-weighted rate weights each entry by ``vocab.counts``, i.e. it is the
    share of (non-``<unk>``) training tokens whose word got no pre-trained vector.
    """

    vocab_size: int
    dim: int
    file_words: int  # vectors in the file
    found: int  # regular entries with a pre-trained vector (exact or lower-cased)
    found_lowercase: int  # ... of which via the lower-case fallback
    oov: int  # regular entries without one (randomly initialised)
    oov_rate: float
    oov_token_rate: float
    top_oov: tuple[str, ...]  # the most frequent OOV entries (up to 20), for inspection


def load_vectors(
    path: str | PathLike[str],
    vocab: Vocab,
    dim: int | None = None,
    lowercase_fallback: bool = True,
    *,
    init_std: float = 0.1,
    seed: int = 0,
) -> tuple[torch.Tensor, EmbeddingStats]:
    """An embedding matrix (``len(vocab)``, dim) for ``vocab`` from a GloVe text file (``.gz`` aware).

    Format: one ``word v1 ... vd`` per line, fields separated by single spaces (a trailing
    space is tolerated); an optional word2vec header ``N D`` on the first line is checked
    and skipped. ``dim`` is inferred from the first vector when None. A word may contain
    spaces (the cased 300d GloVe, ``glove.840B.300d``, the QRNN paper's, has a few, such as
    ``. . .``): the last ``dim`` fields of a line are its values, and the fields before them its
    word, unless the extra fields are all numbers (then the line has too many values).

    Row of a vocabulary entry: its vector; else, with ``lowercase_fallback``, the vector of
    its lower-cased form; else a draw from N(0, ``init_std``²) from a ``torch.Generator``
    seeded with ``seed`` (independent of the global RNG). Special entries are always drawn
    at random, except ``<pad>``, whose row is zero. If a word occurs twice in the file, the
    first vector wins.

    Validation: every line must have exactly ``dim`` values (checked cheaply on all lines);
    the values themselves are parsed, and must be numbers, only for the lines whose word is
    needed. Either error raises :class:`DataError` with the file and line.
    """
    wanted = set(list(vocab)[len(vocab.specials) :])
    if lowercase_fallback:
        wanted |= {token.lower() for token in wanted}
    vectors: dict[str, list[float]] = {}
    header: tuple[int, int] | None = None
    with open_text(path) as lines:
        for line in lines:
            word, _, values = line.rstrip().partition(" ")
            n_values = values.count(" ") + 1 if values else 0
            if lines.line == 1 and n_values == 1 and word.isdigit() and values.isdigit():
                header = (int(word), int(values))
                if dim is not None and dim != header[1]:
                    raise lines.error(f"header declares dimension {header[1]}, expected {dim}")
                dim = header[1]
                continue
            if not word or not values:
                raise lines.error("expected a word followed by its vector values")
            if "  " in values:
                raise lines.error("two spaces in a row: the values are separated by single spaces")
            if dim is None:
                dim = n_values
            if n_values > dim:  # a word with spaces, or too many values
                fields = values.split(" ")
                extra = fields[: n_values - dim]
                if all(map(_is_number, extra)):
                    raise lines.error(f"expected a word and {dim} values, found {n_values} values")
                word, values = " ".join([word, *extra]), " ".join(fields[n_values - dim :])
            elif n_values < dim:
                raise lines.error(f"expected a word and {dim} values, found {n_values} values")
            if word in wanted and word not in vectors:
                try:
                    vectors[word] = [float(v) for v in values.split(" ")]
                except ValueError as err:
                    raise lines.error(f"non-numeric vector value ({err})") from None
                if not all(math.isfinite(v) and abs(v) <= _FLOAT32_MAX for v in vectors[word]):
                    raise lines.error(f"non-finite vector value for {word!r} (in float32, as the embedding holds it)")
        file_words = lines.line - (header is not None)
    if dim is None:
        raise DataError("empty file: no vectors", path)
    if header is not None and header[0] != file_words:
        raise DataError(f"header declares {header[0]} vectors, the file has {file_words}", path, 1)
    return _assemble(vocab, vectors, dim, file_words, lowercase_fallback, init_std, seed)


_FLOAT32_MAX = float(torch.finfo(torch.float32).max)


def _is_number(text: str) -> bool:
    try:
        float(text)
    except ValueError:
        return False
    return True


def _assemble(
    vocab: Vocab,
    vectors: dict[str, list[float]],
    dim: int,
    file_words: int,
    lowercase_fallback: bool,
    init_std: float,
    seed: int,
) -> tuple[torch.Tensor, EmbeddingStats]:
    """The embedding matrix and coverage statistics from the vectors found for ``vocab``."""
    weight = torch.randn(len(vocab), dim, generator=torch.Generator().manual_seed(seed)) * init_std
    weight[vocab.pad_id] = 0.0
    n_special = len(vocab.specials)
    regular = list(vocab)[n_special:]
    rows, ids, oov, via_lower = [], [], [], 0
    for i, token in enumerate(regular, start=n_special):
        vector = vectors.get(token)
        if vector is None and lowercase_fallback and token.lower() in vectors:
            vector = vectors[token.lower()]
            via_lower += 1
        if vector is None:
            oov.append(token)
        else:
            rows.append(vector)
            ids.append(i)
    if rows:
        weight[ids] = torch.tensor(rows, dtype=weight.dtype)
    total = sum(vocab.counts[t] for t in regular)
    oov_tokens = sum(vocab.counts[t] for t in oov)
    stats = EmbeddingStats(
        vocab_size=len(vocab),
        dim=dim,
        file_words=file_words,
        found=len(regular) - len(oov),
        found_lowercase=via_lower,
        oov=len(oov),
        oov_rate=len(oov) / len(regular) if regular else 0.0,
        oov_token_rate=oov_tokens / total if total else 0.0,
        top_oov=tuple(sorted(oov, key=lambda t: (-vocab.counts[t], t))[:20]),
    )
    return weight, stats


def with_pretrained_words(vocab: Vocab, words: Iterable[str], embeddings: str) -> Vocab:
    """``vocab`` plus those of ``words`` it lacks that have a vector (or whose lowercase form has one) in the
    ``embeddings`` file, sorted: the words of every split that the pretrained table knows."""
    with open_text(embeddings) as lines:
        pretrained = {line.split(" ", 1)[0] for line in lines}
    extra = sorted(w for w in set(words) if w not in vocab and (w in pretrained or w.lower() in pretrained))
    return Vocab([*vocab, *extra], vocab.counts)
