"""Chunk tag schemes (IOB1, IOB2 = BIO, IOBES), conversion between them, chunk extraction and chunk-level scores.

Tags are ``O`` or ``PREFIX-TYPE``. IOB1 (Ramshaw & Marcus 1995, the CoNLL-2000/2003 files): ``I-X``
inside a chunk, ``B-X`` only on the first token of a chunk that directly follows another ``X`` chunk.
IOB2 (BIO): ``B-X`` on the first token of every chunk. IOBES: ``S-X`` a one-token chunk, ``B-X`` /
``I-X`` / ``E-X`` its first / inner / last tokens; BILOU (``U-X``, ``L-X``) is accepted on input
as another spelling of IOBES.

:func:`chunks` reads any of them as conlleval (Tjong Kim Sang, CoNLL-2000) does: a chunk starts at
``B``/``S``, or at ``I``/``E`` after ``O``, after the end of a chunk or after a chunk of another type,
and ends before the next start or ``O``. :func:`chunk_scores` are its precision, recall and F1
(micro and per type) and token accuracy; ``mode="strict"`` counts a predicted chunk only where its
tags form a well-formed chunk of the scheme (seqeval's strict mode).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

__all__ = [
    "SCHEMES",
    "ChunkScores",
    "TypeScores",
    "allowed_transitions",
    "check_scheme",
    "chunk_scores",
    "chunks",
    "convert",
    "map_unknown",
    "split_tag",
]

SCHEMES = ("IOB1", "IOB2", "IOBES")
_ALIASES = {"IOB1": "IOB1", "IOB2": "IOB2", "BIO": "IOB2", "IOBES": "IOBES", "BIOES": "IOBES", "BILOU": "IOBES"}
_PREFIXES = {"IOB1": "IB", "IOB2": "IB", "IOBES": "IBES"}
_BILOU = {"U": "S", "L": "E"}

Chunk = tuple[str, int, int]  # (type, first token, one past the last token)


def check_scheme(scheme: str) -> str:
    """The canonical name (IOB1, IOB2 or IOBES) of ``scheme``; BIO, BIOES and BILOU are accepted."""
    name = _ALIASES.get(scheme.upper())
    if name is None:
        raise ValueError(f"unknown tag scheme {scheme!r}; known: {', '.join(_ALIASES)}")
    return name


def split_tag(tag: str) -> tuple[str, str]:
    """``"B-PER"`` -> ``("B", "PER")``, ``"O"`` -> ``("O", "")``; ``U``/``L`` become ``S``/``E``.

    A tag without a prefix or a type (``"PER"``, ``"B-"``) is a ValueError.
    """
    if tag == "O":
        return "O", ""
    prefix, sep, kind = tag.partition("-")
    if not sep or not kind or len(prefix) != 1 or prefix not in "IBESUL":
        raise ValueError(f"tag {tag!r} is neither O nor PREFIX-TYPE with a prefix in I, B, E, S (U, L)")
    return _BILOU.get(prefix, prefix), kind


def _parse(tags: Sequence[str], scheme: str) -> list[tuple[str, str]]:
    allowed = _PREFIXES[scheme]
    parsed = [split_tag(tag) for tag in tags]
    for tag, (prefix, _) in zip(tags, parsed, strict=True):
        if prefix != "O" and prefix not in allowed:
            raise ValueError(f"tag {tag!r} does not belong to the {scheme} scheme")
    return parsed


def chunks(tags: Sequence[str]) -> list[Chunk]:
    """The chunks of one sentence's tags, by conlleval's rules (module docstring), in order.

    Any scheme's tags are read, invalid sequences included (``I-X`` after ``O`` starts a chunk).
    """
    found: list[Chunk] = []
    begin, prev_prefix, prev_kind = 0, "O", ""
    for i, (prefix, kind) in enumerate([*map(split_tag, tags), ("O", "")]):
        if _chunk_ends(prev_prefix, prefix, prev_kind != kind):
            found.append((prev_kind, begin, i))
        if _chunk_starts(prev_prefix, prefix, prev_kind != kind):
            begin = i
        prev_prefix, prev_kind = prefix, kind
    return found


def _chunk_ends(prev: str, cur: str, new_kind: bool) -> bool:
    """conlleval's endOfChunk: whether a chunk ends between a token tagged ``prev`` and one tagged ``cur``."""
    return prev in "ES" or (prev in "BI" and cur in "BSO") or (prev != "O" and new_kind)


def _chunk_starts(prev: str, cur: str, new_kind: bool) -> bool:
    """conlleval's startOfChunk: whether a chunk starts at a token tagged ``cur`` after one tagged ``prev``."""
    return cur in "BS" or (prev in "ESO" and cur in "IE") or (cur != "O" and new_kind)


# Strict chunk reading, as seqeval's strict mode: per scheme the (previous prefixes, current prefixes,
# type condition) pairs where a chunk starts, continues and is complete ("*": any prefix).
_Pattern = tuple[str, str, str]
_STRICT: dict[str, tuple[tuple[_Pattern, ...], tuple[_Pattern, ...], tuple[_Pattern, ...]]] = {
    "IOB1": (
        (("O", "I", "any"), ("I", "I", "diff"), ("B", "I", "any"), ("I", "B", "same"), ("B", "B", "same")),
        (("B", "I", "same"), ("I", "I", "same")),
        (
            ("I", "I", "diff"),
            ("I", "O", "any"),
            ("I", "B", "any"),
            ("B", "O", "any"),
            ("B", "I", "diff"),
            ("B", "B", "same"),
        ),
    ),
    "IOB2": (
        (("*", "B", "any"),),
        (("B", "I", "same"), ("I", "I", "same")),
        (
            ("I", "O", "any"),
            ("I", "I", "diff"),
            ("I", "B", "any"),
            ("B", "O", "any"),
            ("B", "I", "diff"),
            ("B", "B", "any"),
        ),
    ),
    "IOBES": (
        (("*", "B", "any"), ("*", "S", "any")),
        (("B", "I", "same"), ("B", "E", "same"), ("I", "I", "same"), ("I", "E", "same")),
        (("S", "*", "any"), ("E", "*", "any")),
    ),
}


def _matches(patterns: tuple[_Pattern, ...], prev: tuple[str, str], cur: tuple[str, str]) -> bool:
    return any(
        (before == "*" or prev[0] == before)
        and (now == "*" or cur[0] == now)
        and (kind == "any" or (kind == "same") == (prev[1] == cur[1]))
        for before, now, kind in patterns
    )


def _strict_chunks(tags: Sequence[str], scheme: str) -> list[Chunk]:
    """The chunks that are well formed in ``scheme`` (IOB2: ``B I*``, IOBES: ``B I* E`` or ``S``,
    IOB1: ``I+`` or ``B I*`` after a chunk of the same type), read exactly as seqeval's strict mode does."""
    starts, inside, ends = _STRICT[scheme]
    parsed = [*_parse(tags, scheme), ("O", "")]
    found: list[Chunk] = []
    i, prev = 0, ("O", "")
    while i < len(parsed):
        if _matches(starts, prev, parsed[i]):
            end = i + 1
            while _matches(inside, parsed[end - 1], parsed[end]):  # the final O is never inside
                end += 1
            if _matches(ends, parsed[end - 1], parsed[end]):
                found.append((parsed[i][1], i, end))
            i = end
        else:
            i += 1
        prev = parsed[i - 1]
    return found


def convert(tags: Sequence[str], source: str, target: str) -> list[str]:
    """One sentence's tags rewritten from scheme ``source`` into scheme ``target``.

    The chunks (read by :func:`chunks`) are kept; so a conversion of invalid input repairs it.
    """
    _parse(tags, check_scheme(source))
    target = check_scheme(target)
    out = ["O"] * len(tags)
    prev_end, prev_kind = -1, ""
    for kind, begin, end in chunks(tags):
        if target == "IOBES":
            out[begin : end - 1] = [f"I-{kind}"] * (end - begin - 1)
            out[begin] = f"{'S' if end - begin == 1 else 'B'}-{kind}"
            if end - begin > 1:
                out[end - 1] = f"E-{kind}"
        else:
            out[begin:end] = [f"I-{kind}"] * (end - begin)
            if target == "IOB2" or (prev_end == begin and prev_kind == kind):
                out[begin] = f"B-{kind}"
        prev_end, prev_kind = end, kind
    return out


def allowed_transitions(scheme: str, tags: Sequence[str]) -> tuple[list[list[bool]], list[bool], list[bool]]:
    """Which tag sequences ``scheme`` allows, for a CRF: ``(between, start, end)`` where
    ``between[i][j]`` says whether tag ``j`` may follow tag ``i``, ``start[j]`` whether a sentence may
    begin with ``j`` and ``end[i]`` whether it may end with ``i``.

    IOB2: ``I-X`` only after ``B-X`` or ``I-X``. IOB1: ``B-X`` only after ``B-X`` or ``I-X`` (never
    first). IOBES: after ``B-X``/``I-X`` only ``I-X``/``E-X``; after ``O``/``E``/``S`` only
    ``O``/``B``/``S``; a sentence begins with ``O``/``B``/``S`` and ends with ``O``/``E``/``S``.
    """
    scheme = check_scheme(scheme)
    parsed = _parse(tags, scheme)

    def follows(prev: tuple[str, str] | None, cur: tuple[str, str] | None) -> bool:  # None: sentence boundary
        if scheme == "IOBES":
            open_prev = prev is not None and prev[0] in "BI"
            continues = cur is not None and cur[0] in "IE"
            if open_prev:
                return continues and prev[1] == cur[1]
            return not continues
        if cur is None:
            return True
        inside = cur[0] == ("I" if scheme == "IOB2" else "B")
        return not inside or (prev is not None and prev[0] in "BI" and prev[1] == cur[1])

    between = [[follows(p, c) for c in parsed] for p in parsed]
    return between, [follows(None, c) for c in parsed], [follows(p, None) for p in parsed]


@dataclass(frozen=True)
class TypeScores:
    """Chunk counts and scores (percent-free fractions in [0, 1]) for one chunk type or all of them."""

    gold: int
    predicted: int
    correct: int

    @property
    def precision(self) -> float:
        return self.correct / self.predicted if self.predicted else 0.0

    @property
    def recall(self) -> float:
        return self.correct / self.gold if self.gold else 0.0

    @property
    def f1(self) -> float:
        p, r = self.precision, self.recall
        return 2 * p * r / (p + r) if p + r else 0.0


@dataclass(frozen=True)
class ChunkScores:
    """:func:`chunk_scores`' result: ``micro`` over all chunks, ``per_type`` by chunk type, token ``accuracy``."""

    micro: TypeScores
    per_type: dict[str, TypeScores]
    accuracy: float
    tokens: int


def chunk_scores(
    gold: Iterable[Sequence[str]],
    predicted: Iterable[Sequence[str]],
    mode: str = "conlleval",
    scheme: str | None = None,
) -> ChunkScores:
    """Chunk precision / recall / F1 (micro and per type) and token accuracy of ``predicted`` against
    ``gold``, both sentences of tags.

    ``mode="conlleval"`` reads chunks with :func:`chunks` (conlleval and seqeval's default mode);
    ``mode="strict"`` (with ``scheme``) keeps only well-formed chunks, as seqeval's strict mode does.
    A chunk is correct when the other side holds the same type over the same tokens.
    """
    if mode not in ("conlleval", "strict"):
        raise ValueError(f"mode is 'conlleval' or 'strict', got {mode!r}")
    if mode == "strict" and scheme is None:
        raise ValueError("mode='strict' needs the tag scheme (scheme='IOB2', ...)")
    strict_scheme = check_scheme(scheme) if mode == "strict" and scheme is not None else None
    gold_n, pred_n, correct_n = Counter[str](), Counter[str](), Counter[str]()
    tokens = matched = 0
    for number, (gold_tags, pred_tags) in enumerate(zip(gold, predicted, strict=True)):
        if len(gold_tags) != len(pred_tags):
            raise ValueError(f"sentence {number}: {len(gold_tags)} gold tags but {len(pred_tags)} predicted")
        if strict_scheme is None:
            gold_chunks, pred_chunks = set(chunks(gold_tags)), set(chunks(pred_tags))
        else:
            gold_chunks = set(_strict_chunks(gold_tags, strict_scheme))
            pred_chunks = set(_strict_chunks(pred_tags, strict_scheme))
        gold_n.update(kind for kind, _, _ in gold_chunks)
        pred_n.update(kind for kind, _, _ in pred_chunks)
        correct_n.update(kind for kind, _, _ in gold_chunks & pred_chunks)
        tokens += len(gold_tags)
        matched += sum(g == p for g, p in zip(gold_tags, pred_tags, strict=True))
    per_type = {
        kind: TypeScores(gold_n[kind], pred_n[kind], correct_n[kind]) for kind in sorted(gold_n.keys() | pred_n.keys())
    }
    micro = TypeScores(sum(gold_n.values()), sum(pred_n.values()), sum(correct_n.values()))
    return ChunkScores(micro, per_type, matched / tokens if tokens else 0.0, tokens)


def map_unknown(
    sentences: Iterable[Sequence[str]], known: Iterable[str], replacement: str = "O"
) -> tuple[list[list[str]], Counter[str]]:
    """Each sentence's tags with every tag outside ``known`` replaced by ``replacement`` (e.g. a test
    tag that training never saw), and how often each unknown tag occurred."""
    known = set(known)
    unknown: Counter[str] = Counter()
    mapped = []
    for tags in sentences:
        unknown.update(tag for tag in tags if tag not in known)
        mapped.append([tag if tag in known else replacement for tag in tags])
    return mapped, unknown
