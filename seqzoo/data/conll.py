"""CoNLL column files: one token per line, columns separated by whitespace (or by one tab each), a
blank line after each sentence (CoNLL-2000 chunking, CoNLL-2003 NER, POS files in the same form).

The token and tag columns are chosen by index (by default the first and the last). ``-DOCSTART-``
lines (document separators) are skipped. Every token line must have as many columns as the file's
first token line, and neither the token nor the tag may be empty; any problem is a
:class:`~seqzoo.data.errors.DataError` naming the file and line.
"""

from __future__ import annotations

from dataclasses import dataclass

from seqzoo.data.errors import DataError
from seqzoo.data.io import PathLike, open_text

__all__ = ["DOCSTART", "TaggedSentence", "read_conll"]

DOCSTART = "-DOCSTART-"


@dataclass(frozen=True)
class TaggedSentence:
    """One sentence: its tokens and their tags (as many), and the file line of its first token."""

    tokens: tuple[str, ...]
    tags: tuple[str, ...]
    line: int


def read_conll(
    path: PathLike, token_column: int = 0, tag_column: int = -1, separator: str | None = None
) -> list[TaggedSentence]:
    """The sentences of a CoNLL column file (``.gz`` aware, strict UTF-8), in file order.

    ``separator=None`` splits a line at runs of whitespace; ``separator="\\t"`` at each tab (so a
    token may hold spaces, and an empty column is an error). Columns are indexed from 0; negative
    indices count from the end. A file without any sentence is an error.
    """
    sentences: list[TaggedSentence] = []
    tokens: list[str] = []
    tags: list[str] = []
    first_line = 0
    columns = 0  # of the first token line
    with open_text(path) as lines:
        for line in lines:
            text = line.rstrip("\n")  # LineReader ends every line in "\n" ("\r\n", "\r" included)
            if not text.strip():
                if tokens:
                    sentences.append(TaggedSentence(tuple(tokens), tuple(tags), first_line))
                    tokens, tags = [], []
                continue
            fields = text.split(separator) if separator is not None else text.split()
            if fields[0].strip() == DOCSTART:
                continue
            if not columns:
                columns = len(fields)
                for name, index in (("token", token_column), ("tag", tag_column)):
                    if not -columns <= index < columns:
                        raise lines.error(f"{name} column {index} does not exist: the file has {columns} columns")
            elif len(fields) != columns:
                raise lines.error(f"{len(fields)} columns, but the file's first token line has {columns}")
            token, tag = fields[token_column].strip(), fields[tag_column].strip()
            if not token:
                raise lines.error(f"empty token (column {token_column})")
            if not tag:
                raise lines.error(f"empty tag (column {tag_column})")
            if not tokens:
                first_line = lines.line
            tokens.append(token)
            tags.append(tag)
    if tokens:
        sentences.append(TaggedSentence(tuple(tokens), tuple(tags), first_line))
    if not sentences:
        raise DataError("no sentences: the file holds no token lines", path)
    return sentences
