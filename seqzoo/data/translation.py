"""Parallel text for translation: ``{split}.{src}`` / ``{split}.{tgt}``, line i translating line i.

Character level (the QRNN paper's setting): a sentence is the sequence of its characters, the
line terminator excluded; source and target share one vocabulary (``<pad>``, ``<unk>``,
:data:`BOS`, :data:`EOS`, then the characters of both training sides by frequency).
"""

from __future__ import annotations

from collections.abc import Iterable
from os import PathLike
from pathlib import Path

from seqzoo.data.errors import DataError
from seqzoo.data.io import open_text, require_file
from seqzoo.data.text import Vocab

__all__ = ["BOS", "EOS", "build_char_vocab", "find_parallel", "read_lines", "read_parallel"]

BOS, EOS = "<bos>", "<eos>"


def read_lines(path: str | PathLike[str]) -> list[str]:
    """The lines of a text file without terminators (``.gz`` aware, strict UTF-8); an empty
    (or whitespace-only) line raises :class:`DataError` naming the file and line."""
    out = []
    with open_text(path) as lines:
        for line in lines:
            text = line.rstrip("\r\n")
            if not text.strip():
                raise lines.error("empty line: every line must hold a sentence")
            out.append(text)
    if not out:
        raise DataError("empty file: no lines", path)
    return out


def read_parallel(source: str | PathLike[str], target: str | PathLike[str]) -> list[tuple[str, str]]:
    """Sentence pairs from two line-aligned files; unequal line counts raise :class:`DataError`
    at the first line one file lacks."""
    sources, targets = read_lines(source), read_lines(target)
    if len(sources) != len(targets):
        short, n = (source, len(sources)) if len(sources) < len(targets) else (target, len(targets))
        raise DataError(f"has {n} lines but its parallel file has {max(len(sources), len(targets))}", short, n + 1)
    return list(zip(sources, targets, strict=True))


def find_parallel(data_dir: str | PathLike[str], split: str, source: str, target: str) -> tuple[Path, Path]:
    """``{data_dir}/{split}.{source}`` and ``.{target}`` (each optionally ``.gz``)."""
    return require_file(data_dir, f"{split}.{source}"), require_file(data_dir, f"{split}.{target}")


def build_char_vocab(texts: Iterable[str], min_freq: int = 1) -> Vocab:
    """One character vocabulary for all ``texts`` (both sides of the training pairs)."""
    return Vocab.build(texts, min_freq=min_freq, specials=(BOS, EOS))
