import gzip
from pathlib import Path

import pytest
import torch

from seqzoo.data import EOS, DataError, Vocab, batchify, build_lm_vocab, read_lm_tokens, tbptt_batches

FIXTURES = Path(__file__).parent / "fixtures" / "data"


def test_word_level_appends_eos_per_line():
    tokens = read_lm_tokens(FIXTURES / "lm.txt", "word")
    assert tokens == ["the", "cat", "sat", EOS, "on", "the", "mat", EOS]
    vocab = build_lm_vocab(tokens, "word")
    assert list(vocab)[:4] == [Vocab.PAD, Vocab.UNK, EOS, "the"] and len(vocab) == 8


def test_char_level_counts_every_character(tmp_path):
    text = (FIXTURES / "lm.txt").read_text()
    assert read_lm_tokens(FIXTURES / "lm.txt", "char") == list(text)
    gz = tmp_path / "text8.gz"
    gz.write_bytes(gzip.compress(b" anarchism originated as"))  # single line, no newline
    chars = read_lm_tokens(gz, "char")
    assert "".join(chars) == " anarchism originated as"
    assert EOS not in build_lm_vocab(chars, "char")


def test_empty_file_and_bad_level():
    with pytest.raises(DataError, match="empty file"):
        read_lm_tokens(FIXTURES / "empty.train", "word")
    with pytest.raises(ValueError, match="level"):
        read_lm_tokens(FIXTURES / "lm.txt", "byte")


def test_batchify_contiguous_streams():
    streams = batchify(torch.arange(23), 4)
    assert streams.shape == (4, 5)
    assert streams[1].tolist() == [5, 6, 7, 8, 9]
    with pytest.raises(ValueError):
        batchify(torch.arange(3), 4)


def test_tbptt_windows_shift_targets_by_one():
    streams = batchify(torch.arange(40), 2)  # (2, 20)
    windows = tbptt_batches(streams, bptt=6)
    assert [x.shape for x, _ in windows] == [(2, 6), (2, 6), (2, 6), (2, 1)]
    for x, y in windows:
        assert x.shape == y.shape and torch.equal(y, x + 1)
    targets = torch.cat([y for _, y in windows], dim=1)
    assert torch.equal(targets, streams[:, 1:])


def test_char_level_reads_crlf_and_cr_files_as_lf(tmp_path):
    """A Windows or old Mac copy of a corpus gives the same characters (no "\r" tokens)."""
    text = (FIXTURES / "lm.txt").read_text()
    for ending in ("\r\n", "\r"):
        path = tmp_path / "lm.txt"
        path.write_bytes(text.replace("\n", ending).encode())
        assert read_lm_tokens(path, "char") == list(text)
        assert read_lm_tokens(path, "word") == read_lm_tokens(FIXTURES / "lm.txt", "word")


def test_a_blank_line_contributes_an_eos_token(tmp_path):
    """Word level: a blank line is just <eos> (it still counts in the perplexity's denominator)."""
    path = tmp_path / "t.txt"
    path.write_text("a b\n\nc\n")
    assert read_lm_tokens(path, "word") == ["a", "b", EOS, EOS, "c", EOS]
