"""SemEval-2014 Task 4 aspect-term sentiment data (Pontiki et al. 2014), as the MZU paper uses it.

The official XML (plain or ``.gz``)::

    <sentences>
      <sentence id="813">
        <text>All the appetizers and salads were fabulous, the steak was mouth watering.</text>
        <aspectTerms>
          <aspectTerm term="appetizers" polarity="positive" from="8" to="18"/>
          ...
        </aspectTerms>
      </sentence>
    </sentences>

gives one :class:`AspectExample` per (sentence, aspect term); sentences without aspect terms
give none, other elements (``aspectCategories``) are ignored. Every ``text[from:to]`` must
equal ``term``. **DS** is every example; **HDS** (:func:`hard_subset`, after Xue & Li 2018 as
the MZU paper describes) keeps the sentences whose aspects carry at least two different
polarities, one copy of the sentence per aspect. SemEval ships train and test only;
:func:`hold_out_sentences` draws a dev set from train by whole sentences, so that no sentence
has aspects on both sides and HDS can be built on the held-out part too.
"""

from __future__ import annotations

import random
import xml.etree.ElementTree as ET
from collections.abc import Sequence
from dataclasses import dataclass
from itertools import groupby
from pathlib import Path
from xml.parsers import expat

from seqzoo.data.errors import DataError
from seqzoo.data.io import PathLike, read_bytes

__all__ = ["POLARITIES", "AspectExample", "hard_subset", "hold_out_sentences", "read_semeval2014"]

POLARITIES = ("positive", "negative", "neutral", "conflict")


@dataclass(frozen=True)
class AspectExample:
    """One aspect term of one sentence; ``text[start:end] == aspect``; ``index`` numbers the sentence in its file."""

    sentence_id: str
    index: int
    text: str
    aspect: str
    start: int
    end: int
    polarity: str


def read_semeval2014(path: PathLike) -> list[AspectExample]:
    """All (sentence, aspect term) examples of a SemEval-2014 Task 4 file, in file order (DS)."""
    path = Path(path)
    content = read_bytes(path)  # a missing file is a DataError naming it
    root, lines = _parse_xml(content, path)
    if root.tag != "sentences":
        raise DataError(f"root element must be <sentences>, got <{root.tag}>", path, lines[root])
    examples = []
    for index, sentence in enumerate(root.iter("sentence")):
        sid = sentence.get("id", f"#{index + 1}")

        def error(message: str, element: ET.Element = sentence, sid: str = sid) -> DataError:
            return DataError(f"sentence id={sid}: {message}", path, lines[element])

        text = sentence.findtext("text")
        if text is None:
            raise error("missing <text>")
        if not text.strip():
            raise error("empty <text>")
        for term in sentence.iterfind("aspectTerms/aspectTerm"):
            aspect, polarity = term.get("term"), term.get("polarity")
            try:
                start, end = int(term.get("from", "")), int(term.get("to", ""))
            except ValueError:
                raise error(f"aspect term {aspect!r}: 'from' and 'to' must be integers", term) from None
            if aspect is None or polarity not in POLARITIES:
                message = f"aspect term {aspect!r}: needs 'term' and a polarity in {POLARITIES}, got {polarity!r}"
                raise error(message, term)
            if not aspect.strip():  # no tokens: nothing to average into the aspect's embedding
                raise error(f"aspect term {aspect!r} is blank", term)
            if not 0 <= start < end <= len(text):  # (negative offsets would slice from the end)
                raise error(f"aspect term {aspect!r}: needs 0 <= from < to <= {len(text)}, got {start} and {end}", term)
            if text[start:end] != aspect:
                raise error(f"aspect term {aspect!r} does not match text[{start}:{end}] = {text[start:end]!r}", term)
            examples.append(AspectExample(sid, index, text, aspect, start, end, polarity))
    return examples


def hard_subset(examples: Sequence[AspectExample]) -> list[AspectExample]:
    """HDS: the examples of sentences whose aspects have at least two different polarities."""
    hard = []
    for _, group in groupby(examples, key=lambda e: e.index):
        aspects = list(group)
        if len({e.polarity for e in aspects}) > 1:
            hard.extend(aspects)
    return hard


def hold_out_sentences(
    examples: Sequence[AspectExample], fraction: float, seed: int
) -> tuple[list[AspectExample], list[AspectExample]]:
    """Split ``examples`` by sentence into (kept, held_out), e.g. (train, dev); both keep file order.

    The sentences (in file order) are shuffled with ``random.Random(seed)`` and the first
    ``floor(fraction * n + 0.5)`` of them, with all their aspects, are held out.
    """
    if not 0.0 < fraction < 1.0:
        raise ValueError(f"fraction must be in (0, 1), got {fraction}")
    sentences = list(dict.fromkeys(e.index for e in examples))
    random.Random(seed).shuffle(sentences)
    held = set(sentences[: int(fraction * len(sentences) + 0.5)])
    if not held:
        raise ValueError(f"{len(sentences)} sentences are too few to hold out {fraction:.0%}")
    return [e for e in examples if e.index not in held], [e for e in examples if e.index in held]


def _parse_xml(content: bytes, path: Path) -> tuple[ET.Element, dict[ET.Element, int]]:
    """The element tree of ``content`` and the 1-based line on which each element starts.

    Expat decodes the bytes as XML does: UTF-8 or UTF-16 (by its byte-order mark), or the
    encoding the ``<?xml ... encoding="..."?>`` declaration names. It runs without namespace
    processing (the SemEval-2014 files have none), so an ``xmlns`` declaration is read as a plain
    attribute.
    """
    builder = ET.TreeBuilder()
    parser = expat.ParserCreate()
    parser.buffer_text = True
    lines: dict[ET.Element, int] = {}

    def start(tag: str, attrs: dict[str, str]) -> None:
        lines[builder.start(tag, attrs)] = parser.CurrentLineNumber

    parser.StartElementHandler = start
    parser.EndElementHandler = builder.end
    parser.CharacterDataHandler = builder.data
    try:
        parser.Parse(content, True)
    except expat.ExpatError as err:
        line = content.split(b"\n")[err.lineno - 1] if err.lineno else b""
        undecodable = (
            err.code == expat.errors.codes[expat.errors.XML_ERROR_INVALID_TOKEN] and line[err.offset :][:1] >= b"\x80"
        )
        hint = " (a file that is not UTF-8 must declare its encoding: <?xml ... encoding=...?>)" if undecodable else ""
        raise DataError(f"malformed XML: {err}{hint}", path, err.lineno) from None
    return builder.close(), lines
