import gzip
import json
import os

import pytest

from seqzoo.data import DataError, atomic_write_bytes, atomic_write_text, open_text, read_json, read_text, write_json
from seqzoo.data.io import read_bytes


def test_data_error_formats():
    assert str(DataError("bad", "a/b.txt", 3)) == "a/b.txt:3: bad"
    assert str(DataError("bad", "a/b.txt")) == "a/b.txt: bad"
    assert str(DataError("bad")) == "bad"
    err = DataError("bad", "f", 2)
    assert isinstance(err, ValueError) and (err.path, err.line, err.message) == ("f", 2, "bad")


@pytest.mark.parametrize("compress", [False, True])
def test_open_text_lines_and_numbers(tmp_path, compress):
    data = "héllo\nworld\nno newline".encode()
    path = tmp_path / ("f.txt.gz" if compress else "f.txt")
    path.write_bytes(gzip.compress(data) if compress else data)
    with open_text(path) as lines:
        got = [(lines.line, line) for line in lines]
    assert got == [(1, "héllo\n"), (2, "world\n"), (3, "no newline")]
    assert read_text(path) == data.decode()


@pytest.mark.parametrize("compress", [False, True])
def test_invalid_utf8_names_file_and_line(tmp_path, compress):
    data = b"ok\nstill ok\nbad \xff byte\nok\n"
    path = tmp_path / ("bad.txt.gz" if compress else "bad.txt")
    path.write_bytes(gzip.compress(data) if compress else data)
    with pytest.raises(DataError) as info:
        read_text(path)
    assert str(info.value).startswith(f"{path}:3: invalid UTF-8")


def test_corrupt_gzip_is_a_data_error(tmp_path):
    path = tmp_path / "trunc.txt.gz"
    path.write_bytes(gzip.compress(b"line\n" * 1000)[:-20])
    with pytest.raises(DataError, match="corrupt or truncated gzip"):
        read_text(path)
    no_trailer = tmp_path / "no_trailer.txt.gz"  # every line is there; only the checksum is missing
    no_trailer.write_bytes(gzip.compress(b"".join(b"line %d\n" % i for i in range(1000)))[:-8])
    with pytest.raises(DataError) as info:
        read_text(no_trailer)
    assert str(info.value).startswith(f"{no_trailer}: corrupt or truncated gzip data after line 1000 (")
    not_gzip = tmp_path / "plain.txt.gz"
    not_gzip.write_text("plain text\n")
    for read in (read_text, read_bytes):
        with pytest.raises(DataError) as info:
            read(not_gzip)
        assert str(info.value).startswith(f"{not_gzip}: corrupt or truncated gzip data (")


def test_error_before_first_line_has_no_line_number(tmp_path):
    path = tmp_path / "e.txt"
    path.write_text("")
    with open_text(path) as lines:
        assert list(lines) == []
        assert str(lines.error("empty")) == f"{path}: empty"


def test_atomic_write_creates_and_replaces_keeping_mode(tmp_path):
    path = tmp_path / "out.txt"
    atomic_write_text(path, "one\n")
    assert path.read_text() == "one\n"
    os.chmod(path, 0o600)
    atomic_write_bytes(path, b"two\n")
    assert path.read_bytes() == b"two\n"
    assert path.stat().st_mode & 0o777 == 0o600
    assert [p.name for p in tmp_path.iterdir()] == ["out.txt"]


def test_write_json_failing_serialisation_leaves_old_file(tmp_path):
    path = tmp_path / "state.json"
    write_json(path, {"a": 1, "text": "é"})
    with pytest.raises(TypeError):
        write_json(path, {"a": object()})
    assert read_json(path) == {"a": 1, "text": "é"}
    assert [p.name for p in tmp_path.iterdir()] == ["state.json"]


def test_write_json_gz_is_compressed_as_read_json_reads_it(tmp_path):
    path = tmp_path / "state.json.gz"
    write_json(path, {"a": [1, 2], "text": "é"})
    assert json.loads(gzip.decompress(path.read_bytes())) == {"a": [1, 2], "text": "é"}
    assert read_json(path) == {"a": [1, 2], "text": "é"}


def test_atomic_write_through_a_symlink_keeps_the_link(tmp_path):
    (tmp_path / "real").mkdir()
    target = tmp_path / "real" / "summary.json"
    link = tmp_path / "summary.json"
    link.symlink_to(target)
    write_json(link, {"n": 1})
    assert link.is_symlink() and read_json(target) == {"n": 1}
    assert sorted(p.name for p in (tmp_path / "real").iterdir()) == ["summary.json"]


def test_atomic_write_failing_midway_leaves_old_file_and_no_temp(tmp_path, monkeypatch):
    path = tmp_path / "model.bin"
    atomic_write_bytes(path, b"old")

    def broken_fsync(fd):
        raise OSError("disk full")

    monkeypatch.setattr(os, "fsync", broken_fsync)
    with pytest.raises(OSError, match="disk full"):
        atomic_write_bytes(path, b"new but never completed")
    assert path.read_bytes() == b"old"
    assert [p.name for p in tmp_path.iterdir()] == ["model.bin"]


def test_read_json_reports_line(tmp_path):
    path = tmp_path / "bad.json"
    path.write_text('{\n  "a": 1,\n  "b": ,\n}\n')
    with pytest.raises(DataError) as info:
        read_json(path)
    assert str(info.value).startswith(f"{path}:3: invalid JSON")
    gz = tmp_path / "good.json.gz"
    gz.write_bytes(gzip.compress(json.dumps([1, 2]).encode()))
    assert read_json(gz) == [1, 2]


BOM = b"\xef\xbb\xbf"


@pytest.mark.parametrize("compress", [False, True])
def test_a_byte_order_mark_at_the_start_is_not_text(tmp_path, compress):
    path = tmp_path / ("f.txt.gz" if compress else "f.txt")
    data = BOM + b"pos\tgood\n"
    path.write_bytes(gzip.compress(data) if compress else data)
    with open_text(path) as lines:
        assert list(lines) == ["pos\tgood\n"]
    data += BOM + b"neg\tbad\n"  # a second file appended with cat
    path.write_bytes(gzip.compress(data) if compress else data)
    with pytest.raises(
        DataError, match=r"f\.txt(\.gz)?:2: byte-order mark inside the file \(files joined with cat\?\)"
    ):
        read_text(path)
    (tmp_path / "j.json").write_bytes(BOM + b'{"a": 1}')
    assert read_json(tmp_path / "j.json") == {"a": 1}


def test_every_reader_ignores_a_byte_order_mark(tmp_path):
    from seqzoo.data import Vocab, load_vectors, read_labeled, read_lm_tokens
    from seqzoo.data.translation import read_lines

    def write(name: str, text: str):
        path = tmp_path / name
        path.write_bytes(BOM + text.encode())
        return path

    assert [e.label for e in read_labeled(write("t.train", "neg\tbad\npos\tgood\n"))] == ["neg", "pos"]
    assert read_lm_tokens(write("lm.txt", "the cat\n"), "word") == ["the", "cat", "<eos>"]
    assert read_lm_tokens(tmp_path / "lm.txt", "char") == list("the cat\n")
    _, stats = load_vectors(write("v.txt", "the 0.1 0.2\ncat 0.3 0.4\n"), Vocab.build([["the", "cat"]]))
    assert stats.found == 2 and stats.oov == 0
    assert read_lines(write("s.en", "Hello .\n")) == ["Hello ."]


@pytest.mark.parametrize("compress", [False, True])
def test_crlf_and_lone_cr_end_lines_as_newline_does(tmp_path, compress):
    """Old Mac files (lone CR) were read as one line by every reader; CRLF left "\\r" in the text
    of character-level readers. Both now end lines and come out as "\\n", with the right numbers."""
    path = tmp_path / ("f.txt.gz" if compress else "f.txt")
    for ending in ("\n", "\r\n", "\r"):
        data = ending.join(["one", "two", "", "four"]).encode() + ending.encode() + b"five"
        path.write_bytes(gzip.compress(data) if compress else data)
        with open_text(path) as lines:
            got = [(lines.line, line) for line in lines]
        assert got == [(1, "one\n"), (2, "two\n"), (3, "\n"), (4, "four\n"), (5, "five")], ending
    data = b"a\rb\xff\rc\n"
    path.write_bytes(gzip.compress(data) if compress else data)
    with pytest.raises(DataError, match=r"f\.txt(\.gz)?:1: invalid UTF-8 at byte 4 of the line"):
        read_text(path)  # (a raw line with lone CRs is decoded at once: its first line is named)


@pytest.mark.parametrize(
    ("data", "message"),
    [
        (
            "pos\tgood\nneg\tbad".encode("utf-16-le"),
            r":1: NUL character at column 2 \(UTF-16 text\? save the file as UTF-8\)",
        ),
        (
            "pos\tgood\n".encode("utf-16"),
            r":1: invalid UTF-8 at byte 1 of the line .*: a UTF-16 file\? save it as UTF-8",
        ),
        (gzip.compress(b"pos\tgood\n"), r":1: invalid UTF-8 at byte 2 of the line .*: gzip data; name the file \*\.gz"),
        (b"pos\tgood\nneg\tb\x00ad\n", r":2: NUL character at column 6"),
    ],
    ids=["utf16-no-bom", "utf16", "gzip-without-gz", "nul"],
)
def test_text_that_is_not_utf8_says_what_it_looks_like(tmp_path, data, message):
    path = tmp_path / "f.txt"
    path.write_bytes(data)
    with pytest.raises(DataError, match=message):
        read_text(path)


def test_a_file_that_cannot_be_opened_is_a_data_error(tmp_path):
    with pytest.raises(DataError, match=r"missing\.txt: cannot read: No such file or directory$"):
        read_text(tmp_path / "missing.txt")
    with pytest.raises(DataError, match=r": cannot read: Is a directory$"):
        read_text(tmp_path)


def test_read_lines_keeps_trailing_spaces_of_a_sentence(tmp_path):
    """Only the line ending is stripped: trailing spaces and tabs are characters of a char-level model."""
    from seqzoo.data.translation import read_lines

    path = tmp_path / "train.en"
    path.write_bytes(b"a b \r\nc\t\n")
    assert read_lines(path) == ["a b ", "c\t"]
