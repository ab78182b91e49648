"""Tag schemes, conversion, chunk extraction and chunk scores, against seqeval (which reproduces conlleval)."""

import itertools
import random
import warnings

import pytest

from seqzoo.data.conll import read_conll
from seqzoo.data.tags import (
    allowed_transitions,
    check_scheme,
    chunk_scores,
    chunks,
    convert,
    map_unknown,
    split_tag,
)

PREFIXES = {"IOB1": "IB", "IOB2": "IB", "IOBES": "IBES"}


def _random_sentences(scheme: str, count: int, seed: int, types: str = "AB") -> list[list[str]]:
    """Random tag sequences of a scheme's tags, invalid transitions included."""
    rng = random.Random(seed)
    tags = ["O"] + [f"{p}-{t}" for p in PREFIXES[scheme] for t in types]
    return [[rng.choice(tags) for _ in range(rng.randint(1, 9))] for _ in range(count)]


@pytest.fixture
def seqeval():
    seqeval = pytest.importorskip("seqeval.metrics", reason="seqeval is not installed (pip install 'seqzoo[dev]')")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # seqeval's "seems not to be NE tag", zero-division warnings
        yield seqeval


def seqeval_scheme(name):
    """seqeval's class for a scheme (for strict mode)."""
    from seqeval import scheme

    return getattr(scheme, name)


def _assert_same_scores(seqeval, gold, pred, **kwargs):
    ours = chunk_scores(gold, pred, **{k: v for k, v in kwargs.items() if k != "seqeval_scheme"})
    extra = {"mode": "strict", "scheme": kwargs["seqeval_scheme"]} if "seqeval_scheme" in kwargs else {}
    assert ours.micro.f1 == pytest.approx(seqeval.f1_score(gold, pred, **extra), abs=1e-12)
    assert ours.micro.precision == pytest.approx(seqeval.precision_score(gold, pred, **extra), abs=1e-12)
    assert ours.micro.recall == pytest.approx(seqeval.recall_score(gold, pred, **extra), abs=1e-12)
    report = seqeval.classification_report(gold, pred, output_dict=True, zero_division=0, **extra)
    for kind, scores in ours.per_type.items():
        if scores.gold:  # seqeval reports the types that occur in the gold tags
            assert scores.f1 == pytest.approx(report[kind]["f1-score"], abs=1e-12)
            assert scores.gold == report[kind]["support"]
    return ours


@pytest.mark.parametrize("scheme", ["IOB1", "IOB2", "IOBES"])
def test_conlleval_chunks_and_scores_equal_seqeval(seqeval, scheme):
    from seqeval.metrics.sequence_labeling import get_entities

    gold = _random_sentences(scheme, 3000, seed=1)
    pred = _random_sentences(scheme, 3000, seed=2)
    pred = [p[: len(g)] + ["O"] * (len(g) - len(p)) for g, p in zip(gold, pred, strict=True)]
    for sentence in gold[:1000]:
        assert [(kind, b, e - 1) for kind, b, e in chunks(sentence)] == get_entities(sentence)
    ours = _assert_same_scores(seqeval, gold, pred)
    assert ours.accuracy == pytest.approx(seqeval.accuracy_score(gold, pred), abs=1e-12)


@pytest.mark.parametrize("scheme", ["IOB1", "IOB2", "IOBES"])
def test_strict_mode_equals_seqeval_strict(seqeval, scheme):
    gold = _random_sentences(scheme, 3000, seed=3)
    pred = [
        p[: len(g)] + ["O"] * (len(g) - len(p)) for g, p in zip(gold, _random_sentences(scheme, 3000, 4), strict=True)
    ]
    ours = _assert_same_scores(seqeval, gold, pred, mode="strict", scheme=scheme, seqeval_scheme=seqeval_scheme(scheme))
    assert ours.micro.f1 != chunk_scores(gold, pred).micro.f1  # random tags: strict reading differs


def test_real_gold_against_perturbed_predictions(seqeval, shared_data):
    sentences = read_conll(shared_data / "tagging" / "conll2003_ner" / "test.txt")
    gold = [list(s.tags) for s in sentences]
    assert chunk_scores(gold, gold).micro.gold == 5648  # entities in the test split (the data README)
    rng = random.Random(0)
    names = sorted({t for s in gold for t in s})
    pred = [[rng.choice(names) if rng.random() < 0.1 else t for t in s] for s in gold]
    ours = _assert_same_scores(seqeval, gold, pred)
    assert 0.5 < ours.micro.f1 < 0.95
    _assert_same_scores(seqeval, gold, pred, mode="strict", scheme="IOB2", seqeval_scheme=seqeval_scheme("IOB2"))


def test_round_trips_keep_chunks():
    for sentence in _random_sentences("IOBES", 2000, seed=5, types="ABC"):
        for source in ("IOB1", "IOB2", "IOBES"):
            valid = convert(sentence, "IOBES", source)  # repaired into a valid sequence of `source`
            assert chunks(valid) == chunks(sentence)
            for target in ("IOB1", "IOB2", "IOBES"):
                there = convert(valid, source, target)
                assert chunks(there) == chunks(valid)
                assert convert(there, target, source) == valid
    assert convert(["B-A", "I-A", "B-A", "O", "B-B"], "BIO", "IOB1") == ["I-A", "I-A", "B-A", "O", "I-B"]
    assert convert(["I-A", "I-A", "B-A", "O", "I-B"], "IOB1", "BILOU") == ["B-A", "E-A", "S-A", "O", "S-B"]
    assert split_tag("U-PER") == ("S", "PER") and split_tag("L-PER") == ("E", "PER")


@pytest.mark.parametrize("scheme", ["IOB1", "IOB2", "IOBES"])
def test_allowed_transitions_accept_exactly_the_valid_sequences(scheme):
    """A sequence is valid in a scheme exactly when converting it into that scheme leaves it unchanged."""
    names = ["O"] + [f"{p}-{t}" for p in PREFIXES[scheme] for t in "AB"]
    between, start, end = allowed_transitions(scheme, names)
    for length in (1, 2, 3):
        for path in itertools.product(range(len(names)), repeat=length):
            allowed = start[path[0]] and end[path[-1]] and all(between[a][b] for a, b in itertools.pairwise(path))
            tags = [names[i] for i in path]
            assert allowed == (convert(tags, scheme, scheme) == tags), tags


def test_scheme_and_tag_errors():
    assert check_scheme("bio") == "IOB2" and check_scheme("BILOU") == "IOBES"
    with pytest.raises(ValueError, match="unknown tag scheme"):
        check_scheme("IOE2")
    for bad in ("PER", "B-", "X-PER", "BB-PER"):
        with pytest.raises(ValueError, match="neither O nor"):
            split_tag(bad)
    with pytest.raises(ValueError, match="does not belong to the IOB2"):
        allowed_transitions("IOB2", ["O", "S-A"])
    with pytest.raises(ValueError, match="needs the tag scheme"):
        chunk_scores([["O"]], [["O"]], mode="strict")
    with pytest.raises(ValueError, match="2 gold tags but 1"):
        chunk_scores([["O", "O"]], [["O"]])


def test_scores_by_hand():
    gold = [["B-PER", "I-PER", "O", "B-LOC"], ["B-ORG"]]
    pred = [["B-PER", "I-PER", "O", "B-ORG"], ["O"]]
    scores = chunk_scores(gold, pred)
    assert (scores.micro.gold, scores.micro.predicted, scores.micro.correct) == (3, 2, 1)
    assert scores.micro.precision == 0.5 and scores.micro.recall == pytest.approx(1 / 3)
    assert scores.per_type["PER"].f1 == 1.0 and scores.per_type["LOC"].f1 == 0.0
    assert scores.accuracy == pytest.approx(3 / 5) and scores.tokens == 5


def test_map_unknown_counts_and_replaces():
    mapped, unknown = map_unknown([["B-PER", "I-PRT"], ["I-PRT", "B-X", "O"]], ["O", "B-PER"])
    assert mapped == [["B-PER", "O"], ["O", "O", "O"]]
    assert unknown == {"I-PRT": 2, "B-X": 1}
