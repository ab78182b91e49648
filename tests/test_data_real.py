"""Integration checks on the real corpora (a directory laid out like shared/data).

Run with ``SEQZOO_DATA=/path/to/data pytest tests/test_data_real.py``; skipped without it
(the ``shared_data`` fixture of conftest.py). Expected numbers are those of the data README.
"""

from collections import Counter

import pytest

from seqzoo.data import (
    EOS,
    ClassificationData,
    Tokenizer,
    Vocab,
    build_lm_vocab,
    load_vectors,
    read_lm_tokens,
)

pytestmark = pytest.mark.slow

# task: {split: {label: count}}
LABEL_COUNTS = {
    "imdb": {
        "train": {"neg": 19756, "pos": 19905},
        "dev": {"neg": 2469, "pos": 2488},
        "test": {"neg": 2469, "pos": 2488},
    },
    "mr": {"train": {"neg": 1600, "pos": 1600}, "dev": {"neg": 200, "pos": 200}, "test": {"neg": 200, "pos": 200}},
    "pl_docs": {"train": {"neg": 598, "pos": 600}, "dev": {"neg": 75, "pos": 75}, "test": {"neg": 75, "pos": 75}},
    "amazon_snippets": {
        "train": {"neg": 1181, "pos": 1691},
        "dev": {"neg": 148, "pos": 211},
        "test": {"neg": 148, "pos": 211},
    },
    "nyt_snippets": {
        "train": {"neg": 2160, "pos": 1742},
        "dev": {"neg": 270, "pos": 218},
        "test": {"neg": 270, "pos": 218},
    },
    "movie_snippets": {
        "train": {"neg": 4252, "pos": 4198},
        "dev": {"neg": 536, "pos": 523},
        "test": {"neg": 537, "pos": 520},
    },
    "uncertainty": {
        "train": {"certain": 1169, "uncertain": 1195},
        "dev": {"certain": 146, "uncertain": 150},
        "test": {"certain": 146, "uncertain": 150},
    },
    "drug": {
        "train": {"neg": 145, "neu": 49, "pos": 346},
        "dev": {"neg": 16, "neu": 5, "pos": 38},
        "test": {"neg": 95, "neu": 36, "pos": 248},
    },
}


@pytest.mark.parametrize("task", sorted(LABEL_COUNTS))
def test_classification_splits_match_readme(shared_data, task):
    data = ClassificationData.from_dir(shared_data / "classification", task)
    for split, expected in LABEL_COUNTS[task].items():
        assert Counter(ex.label for ex in getattr(data, split)) == expected, split


def test_glove_covers_mr_vocabulary(shared_data):
    data = ClassificationData.from_dir(shared_data / "classification", "mr")
    tokenize = Tokenizer(lowercase=True)
    vocab = Vocab.build(tokenize(ex.text) for ex in data.train)
    weight, stats = load_vectors(shared_data / "embeddings" / "glove.6B.50d.top100k.txt.gz", vocab)
    assert weight.shape == (len(vocab), 50) and stats.file_words == 100_000
    assert 0.05 < stats.oov_rate < 0.2  # rare names and hyphenated compounds are missing
    assert stats.oov_token_rate < 0.04
    assert "the" not in stats.top_oov and weight[vocab.pad_id].abs().sum() == 0


def test_brown_word_counts(shared_data):
    root = shared_data / "lm" / "brown_word"
    train = read_lm_tokens(root / "train.txt", "word")
    assert len(train) == 965_692 and train.count(EOS) == 45_594
    vocab = build_lm_vocab(train, "word")
    assert len(vocab) == 3 + 10_000  # <pad> <unk> <eos> + the 10k words
    valid = vocab.encode(read_lm_tokens(root / "valid.txt", "word"))
    assert len(valid) == 126_670 and valid.count(vocab.unk_id) == 10_903


@pytest.mark.parametrize(
    ("corpus", "split", "chars", "alphabet"),
    [("brown_char", "train.txt", 4_722_727, 84), ("sotu_char", "train.txt.gz", 9_901_987, 89)],
)
def test_char_corpora_counts(shared_data, corpus, split, chars, alphabet):
    tokens = read_lm_tokens(shared_data / "lm" / corpus / split, "char")
    assert len(tokens) == chars
    assert len(build_lm_vocab(tokens, "char")) == 2 + alphabet + 1  # <pad> <unk>, the symbols, newline
