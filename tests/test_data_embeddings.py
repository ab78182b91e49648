import gzip
from pathlib import Path

import pytest
import torch

from seqzoo.data import DataError, Vocab, load_vectors

FIXTURES = Path(__file__).parent / "fixtures" / "data"

# counts: the 5, Film 3, paris 1, zzz 1 (and "," is not in the vocabulary)
VOCAB = Vocab.build([["the"] * 5 + ["Film"] * 3 + ["paris", "zzz"]])


def test_vectors_rows_and_stats():
    weight, stats = load_vectors(FIXTURES / "vectors.txt", VOCAB)
    assert weight.shape == (len(VOCAB), 4) and weight.dtype == torch.float32
    assert torch.equal(weight[VOCAB.token_to_id("the")], torch.tensor([0.1, 0.2, 0.3, 0.4]))
    assert torch.equal(weight[VOCAB.token_to_id("Film")], torch.tensor([1.0, 2.0, 3.0, 4.0]))  # lower-case fallback
    assert torch.equal(weight[VOCAB.pad_id], torch.zeros(4))
    assert stats.vocab_size == 6 and stats.dim == 4 and stats.file_words == 5
    assert (stats.found, stats.found_lowercase, stats.oov) == (3, 1, 1)
    assert stats.oov_rate == pytest.approx(1 / 4)
    assert stats.oov_token_rate == pytest.approx(1 / 10)
    assert stats.top_oov == ("zzz",)


def test_no_lowercase_fallback_and_seeded_init():
    weight, stats = load_vectors(FIXTURES / "vectors.txt", VOCAB, lowercase_fallback=False, seed=7)
    assert stats.oov == 2 and stats.found_lowercase == 0
    again, _ = load_vectors(FIXTURES / "vectors.txt", VOCAB, lowercase_fallback=False, seed=7)
    other, _ = load_vectors(FIXTURES / "vectors.txt", VOCAB, lowercase_fallback=False, seed=8)
    film = VOCAB.token_to_id("Film")
    assert torch.equal(weight, again) and not torch.equal(weight[film], other[film])
    assert 0.0 < weight[film].abs().max() < 1.0  # N(0, 0.1^2) draw


def test_gz_and_word2vec_header(tmp_path):
    gz = tmp_path / "vectors.txt.gz"
    gz.write_bytes(gzip.compress((FIXTURES / "vectors.txt").read_bytes()))
    assert torch.equal(load_vectors(gz, VOCAB)[0], load_vectors(FIXTURES / "vectors.txt", VOCAB)[0])
    weight, stats = load_vectors(FIXTURES / "vectors_word2vec.txt", VOCAB)
    assert stats.file_words == 2 and stats.dim == 4
    assert torch.equal(weight[VOCAB.token_to_id("the")], torch.tensor([0.1, 0.2, 0.3, 0.4]))


def test_a_word_may_contain_spaces(tmp_path):
    """glove.840B.300d has words such as ". . ." and "at name@domain.com": the last dim fields are
    the values; extra fields that are all numbers are too many values, as before."""
    path = tmp_path / "spaced.txt"
    path.write_text("the 0.1 0.2 0.3\n. . . 1 2 3\nat name@domain.com 4 5 6\nparis 7 8 9\n")
    vocab = Vocab.build([["the", ". . .", "at name@domain.com", "paris"]])
    weight, stats = load_vectors(path, vocab)
    assert stats.dim == 3 and stats.file_words == 4 and stats.oov == 0
    assert torch.equal(weight[vocab.token_to_id(". . .")], torch.tensor([1.0, 2.0, 3.0]))
    assert torch.equal(weight[vocab.token_to_id("at name@domain.com")], torch.tensor([4.0, 5.0, 6.0]))
    assert torch.equal(weight[vocab.token_to_id("paris")], torch.tensor([7.0, 8.0, 9.0]))
    path.write_text("the 0.1 0.2 0.3\nparis 7 8 9 1e-3 -2\n")
    with pytest.raises(DataError, match=r"spaced\.txt:2: expected a word and 3 values, found 5 values"):
        load_vectors(path, vocab)


@pytest.mark.parametrize(
    ("name", "dim", "line", "message"),
    [
        ("vectors_bad_dim.txt", None, 3, "expected a word and 4 values, found 3 values"),
        ("vectors_non_numeric.txt", None, 2, "non-numeric vector value"),
        ("vectors.txt", 3, 1, "expected a word and 3 values, found 4 values"),
        ("vectors_word2vec.txt", 5, 1, "header declares dimension 4, expected 5"),
    ],
)
def test_malformed_vectors(name, dim, line, message):
    path = FIXTURES / name
    with pytest.raises(DataError) as info:
        load_vectors(path, VOCAB, dim=dim)
    assert str(info.value).startswith(f"{path}:{line}: {message}")


def test_blank_line_in_vectors(tmp_path):
    path = tmp_path / "v.txt"
    path.write_text("the 1 2\n\nfilm 3 4\n")
    with pytest.raises(DataError) as info:
        load_vectors(path, VOCAB)
    assert str(info.value) == f"{path}:2: expected a word followed by its vector values"


def test_header_count_mismatch_and_empty_file(tmp_path):
    path = tmp_path / "w2v.txt"
    path.write_text("3 2\na 1 2\n")
    with pytest.raises(DataError, match="header declares 3 vectors, the file has 1"):
        load_vectors(path, VOCAB)
    empty = FIXTURES / "empty.train"
    with pytest.raises(DataError) as info:
        load_vectors(empty, VOCAB)
    assert str(info.value) == f"{empty}: empty file: no vectors"


@pytest.mark.parametrize("value", ["nan", "inf", "-inf", "1e400", "1e39", "-4e38"])  # 1e39: finite in float64 only
def test_non_finite_vector_values_are_refused(tmp_path, value):
    """They used to reach the embedding and surface as a non-finite training loss."""
    path = tmp_path / "v.txt"
    path.write_text(f"the 1 2\nfilm 3 {value}\n")
    with pytest.raises(DataError, match=r"v\.txt:2: non-finite vector value for 'film'"):
        load_vectors(path, VOCAB)


def test_trailing_whitespace_passes_and_a_double_space_is_named(tmp_path):
    path = tmp_path / "v.txt"
    path.write_text("the 1 2 \t\nfilm 3  4\n")
    with pytest.raises(DataError, match=r"v\.txt:2: two spaces in a row: the values are separated by single spaces"):
        load_vectors(path, VOCAB)
    path.write_text("the 1 2 \t\nfilm 3 4\n")
    weight, stats = load_vectors(path, VOCAB)
    assert stats.dim == 2 and weight.shape[1] == 2


def test_first_vector_wins_most_frequent_oov_first_and_fallback_off_means_exact(tmp_path):
    """The first of duplicate vectors wins, top_oov lists the most frequent first, and
    lowercase_fallback=False looks words up exactly."""
    path = tmp_path / "v.txt"
    path.write_text("the 1 1\nthe 2 2\nfilm 3 3\n")
    vocab = Vocab.build([["the"] * 3 + ["Film"] * 2 + ["film"] + ["a"] * 5 + ["b"] * 4 + ["c"]])
    weight, stats = load_vectors(path, vocab)
    assert weight[vocab.token_to_id("the")].tolist() == [1.0, 1.0]
    assert stats.top_oov == ("a", "b", "c")
    weight, stats = load_vectors(path, vocab, lowercase_fallback=False)
    assert stats.found_lowercase == 0 and stats.found == 2 and "Film" in stats.top_oov


def test_oov_token_rate_excludes_unk_tokens(tmp_path):
    """The OOV token rate's denominator leaves out the tokens pruned to <unk>."""
    path = tmp_path / "v.txt"
    path.write_text("the 1 1\n")
    vocab = Vocab.build([["the"] * 3 + ["film"] + ["rare1", "rare2"]], min_freq=1, max_size=2)
    _, stats = load_vectors(path, vocab)
    assert vocab.counts[Vocab.UNK] == 2  # rare1 and rare2, pruned
    assert stats.oov_token_rate == pytest.approx(1 / 4)  # film of the, the, the, film


def test_a_word_with_a_number_among_its_words(tmp_path):
    """A word with a number among its words ("a 1 b") keeps its vector of the file's width."""
    path = tmp_path / "v.txt"
    path.write_text("the 0 1\na 1 b 2 3\n")
    vocab = Vocab.build([["the", "a 1 b"]])
    weight, stats = load_vectors(path, vocab)
    assert stats.oov == 0 and weight[vocab.token_to_id("a 1 b")].tolist() == [2.0, 3.0]
