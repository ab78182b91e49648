"""The CoNLL column reader: columns, sentences, -DOCSTART-, and errors located by file:line."""

import gzip

import pytest

from seqzoo.data.conll import TaggedSentence, read_conll
from seqzoo.data.errors import DataError

FOUR_COLUMNS = """-DOCSTART- -X- -X- O

EU NNP B-NP B-ORG
rejects VBZ B-VP O
German JJ B-NP B-MISC

-DOCSTART- -X- -X- O


Peter NNP B-NP B-PER
Blackburn NNP I-NP I-PER
"""


def test_reads_sentences_columns_and_lines(tmp_path):
    path = tmp_path / "eng.txt"
    path.write_text(FOUR_COLUMNS, encoding="utf-8")
    sentences = read_conll(path)
    assert sentences == [
        TaggedSentence(("EU", "rejects", "German"), ("B-ORG", "O", "B-MISC"), 3),
        TaggedSentence(("Peter", "Blackburn"), ("B-PER", "I-PER"), 10),
    ]
    chunks = read_conll(path, tag_column=2)
    assert chunks[0].tags == ("B-NP", "B-VP", "B-NP")
    gz = tmp_path / "eng.txt.gz"
    gz.write_bytes(gzip.compress(FOUR_COLUMNS.replace("\n", "\r\n").encode()))
    assert read_conll(gz) == sentences


def test_tab_separated_tokens_may_hold_spaces(tmp_path):
    path = tmp_path / "t.tsv"
    path.write_text("New York\tB-LOC\nis\tO\n\n", encoding="utf-8")
    assert read_conll(path, separator="\t") == [TaggedSentence(("New York", "is"), ("B-LOC", "O"), 1)]


@pytest.mark.parametrize(
    ("text", "kwargs", "line", "message"),
    [
        ("a DT O\nb NN O\n\nc NN\n", {}, 4, "2 columns, but the file's first token line has 3"),
        ("a\tO\n\tO\n", {"separator": "\t"}, 2, "empty token"),
        ("a\tO\nb\t \n", {"separator": "\t"}, 2, "empty tag"),
        ("a O\nb O\n", {"tag_column": 2}, 1, "tag column 2 does not exist"),
    ],
)
def test_errors_name_file_and_line(tmp_path, text, kwargs, line, message):
    path = tmp_path / "bad.txt"
    path.write_text(text, encoding="utf-8")
    with pytest.raises(DataError, match=message) as err:
        read_conll(path, **kwargs)
    assert err.value.line == line and str(err.value).startswith(f"{path}:{line}: ")


def test_invalid_utf8_and_empty_files(tmp_path):
    path = tmp_path / "latin1.txt"
    path.write_bytes("a O\n\nCaf\xe9 B-LOC\n".encode("latin-1"))
    with pytest.raises(DataError, match="invalid UTF-8") as err:
        read_conll(path)
    assert str(err.value).startswith(f"{path}:3: ")
    empty = tmp_path / "empty.txt"
    empty.write_text("-DOCSTART- O\n\n\n", encoding="utf-8")
    with pytest.raises(DataError, match="no sentences"):
        read_conll(empty)


def test_real_corpora(shared_data):
    test = read_conll(shared_data / "tagging" / "conll2003_ner" / "test.txt")
    assert len(test) == 3453 and sum(len(s.tokens) for s in test) == 46435  # the data README's counts
    chunk = read_conll(shared_data / "tagging" / "conll2003_chunk" / "test.txt")
    assert [s.tokens for s in chunk] == [s.tokens for s in test]
    assert len({t for s in read_conll(shared_data / "tagging" / "brown_pos" / "valid.txt") for t in s.tags}) > 100
