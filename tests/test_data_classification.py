import gzip
import shutil
from collections import Counter
from pathlib import Path

import pytest

from seqzoo.data import (
    ClassificationData,
    DataError,
    LabelSet,
    bundled_corpus_dir,
    find_split,
    holdout_split,
    kfold_splits,
    read_labeled,
)

FIXTURES = Path(__file__).parent / "fixtures" / "data"


def test_read_labeled():
    examples = read_labeled(FIXTURES / "tiny.train")
    assert len(examples) == 10
    first = examples[0]
    assert (first.label, first.text, first.line, first.path) == (
        "pos",
        "a lovely , warm film .",
        1,
        str(FIXTURES / "tiny.train"),
    )
    assert examples[-1].line == 10


@pytest.mark.parametrize(
    ("name", "line", "message"),
    [
        ("missing_tab.train", 3, "missing tab"),
        ("empty_text.train", 2, "empty text"),
        ("empty_label.train", 2, "empty label"),
        ("blank_line.train", 2, "blank line: expected LABEL<TAB>TEXT"),
    ],
)
def test_malformed_lines_name_file_and_line(name, line, message):
    path = FIXTURES / name
    with pytest.raises(DataError) as info:
        read_labeled(path)
    assert str(info.value).startswith(f"{path}:{line}: {message}")


def test_empty_file():
    path = FIXTURES / "empty.train"
    with pytest.raises(DataError) as info:
        read_labeled(path)
    assert str(info.value) == f"{path}: empty file: no examples"


def test_invalid_utf8(tmp_path):
    path = tmp_path / "bad.train.gz"
    path.write_bytes(gzip.compress(b"pos\tgood\nneg\tcaf\xe9 latin-1\n"))
    with pytest.raises(DataError) as info:
        read_labeled(path)
    assert str(info.value).startswith(f"{path}:2: invalid UTF-8")


def test_gz_reads_the_same(tmp_path):
    gz = tmp_path / "tiny.train.gz"
    gz.write_bytes(gzip.compress((FIXTURES / "tiny.train").read_bytes()))
    plain = read_labeled(FIXTURES / "tiny.train")
    assert [(e.label, e.text, e.line) for e in read_labeled(gz)] == [(e.label, e.text, e.line) for e in plain]


def test_label_set():
    labels = LabelSet(["pos", "neg", "pos"])
    assert labels.labels == ("neg", "pos") and len(labels) == 2 and "pos" in labels
    assert labels.encode("pos") == 1 and labels.decode(0) == "neg"
    assert LabelSet.from_dict(labels.to_dict()) == labels
    with pytest.raises(DataError) as info:
        labels.encode("neutral", "x.test", 7)
    assert str(info.value) == "x.test:7: unknown label 'neutral' (known: neg, pos)"


def test_unknown_label_at_test_time(tmp_path):
    shutil.copy(FIXTURES / "tiny.train", tmp_path / "t.train")
    shutil.copy(FIXTURES / "unknown_label.test", tmp_path / "t.test")
    with pytest.raises(DataError) as info:
        ClassificationData.from_dir(tmp_path, "t")
    assert str(info.value).startswith(f"{tmp_path / 't.test'}:2: unknown label 'neutral'")


def test_find_split(tmp_path):
    (tmp_path / "a.train.gz").write_bytes(gzip.compress(b"pos\tx\n"))
    assert find_split(tmp_path, "a", "train") == tmp_path / "a.train.gz"
    assert find_split(tmp_path, "a", "test") is None
    (tmp_path / "a.train").write_text("pos\tx\n")
    with pytest.raises(DataError, match=r"both a\.train and a\.train\.gz"):
        find_split(tmp_path, "a", "train")


def test_from_dir_with_all_splits():
    data = ClassificationData.from_dir(FIXTURES, "tiny")
    assert (len(data.train), len(data.dev), len(data.test)) == (10, 2, 2)
    assert data.labels.labels == ("neg", "pos") and data.task == "tiny"
    assert data.sources["dev"] == str(FIXTURES / "tiny.dev")


def test_missing_dev_is_held_out_stratified_and_seeded(tmp_path):
    shutil.copy(FIXTURES / "tiny.train", tmp_path / "t.train")
    data = ClassificationData.from_dir(tmp_path, "t", dev_fraction=0.2, seed=1)
    assert Counter(e.label for e in data.dev) == {"neg": 1, "pos": 1}
    assert len(data.train) == 8 and data.test is None
    assert {e.line for e in data.train} | {e.line for e in data.dev} == set(range(1, 11))
    again = ClassificationData.from_dir(tmp_path, "t", dev_fraction=0.2, seed=1)
    assert again.dev == data.dev
    assert "held out" in data.sources["dev"]


def test_a_train_set_too_small_to_hold_out_dev_is_a_data_error(tmp_path):
    (tmp_path / "few.train").write_text("pos\tgood\nneg\tbad\npos\tfine\nneg\tdull\n")
    with pytest.raises(DataError, match=r"few\.train: no dev file and 4 examples are too few to hold out 10%"):
        ClassificationData.from_dir(tmp_path, "few")


def test_more_folds_than_examples_is_a_data_error(tmp_path):
    shutil.copy(FIXTURES / "tiny.train", tmp_path / "t.train")
    shutil.copy(FIXTURES / "tiny.dev", tmp_path / "t.dev")
    with pytest.raises(DataError, match=r"t\.train: 10 training examples cannot make 11 folds"):
        ClassificationData.from_dir(tmp_path, "t").folds(k=11)


def test_holdout_split_rounds_per_label():
    examples = read_labeled(FIXTURES / "tiny.train")
    kept, held = holdout_split(examples, 0.1, seed=0)  # round(0.5) = 1 per label
    assert len(held) == 2 and len(kept) == 8
    with pytest.raises(ValueError, match="too few"):
        holdout_split(examples[:2], 0.1, seed=0)


def test_kfold_splits_partition():
    splits = kfold_splits(11, 3, seed=0)
    tests = [i for _, test in splits for i in test]
    assert sorted(tests) == list(range(11))
    assert sorted(len(test) for _, test in splits) == [3, 4, 4]
    for train, test in splits:
        assert sorted(train + test) == list(range(11))
    assert kfold_splits(11, 3, seed=0) == splits != kfold_splits(11, 3, seed=1)


def test_kfold_splits_stratified():
    labels = ["a"] * 10 + ["b"] * 5
    for _, test in kfold_splits(15, 5, seed=3, labels=labels):
        assert Counter(labels[i] for i in test) == {"a": 2, "b": 1}


def test_folds_for_task_without_test(tmp_path):
    shutil.copy(FIXTURES / "tiny.train", tmp_path / "t.train")
    shutil.copy(FIXTURES / "tiny.dev", tmp_path / "t.dev")
    data = ClassificationData.from_dir(tmp_path, "t")
    folds = data.folds(k=5, seed=0)
    assert sorted(e.line for fold in folds for e in fold.test) == list(range(1, 11))
    assert all(fold.dev == data.dev and len(fold.train) == 8 for fold in folds)
    with pytest.raises(ValueError, match="has a test split"):
        ClassificationData.from_dir(FIXTURES, "tiny").folds()


def test_bundled_corpus():
    data = ClassificationData.from_dir(bundled_corpus_dir(), "movie_snippets")
    assert (len(data.train), len(data.dev), len(data.test)) == (8450, 1059, 1057)
    assert (bundled_corpus_dir() / "LICENSE").is_file()


def test_a_missing_task_names_the_directory_and_an_unset_variable(tmp_path):
    with pytest.raises(DataError, match=f"^{tmp_path}: no mr.train or mr.train.gz$"):
        ClassificationData.from_dir(tmp_path, "mr")
    with pytest.raises(
        DataError, match=r"^\$UNSET_DIR/x: no mr.train or mr.train.gz \(an environment variable in the data"
    ):
        ClassificationData.from_dir("$UNSET_DIR/x", "mr")


def test_a_second_tab_is_refused(tmp_path):
    """A file with more columns (the raw VADER layout: id, score, text) gave label '1' and a text
    holding a tab; the Fudan format has one tab per line."""
    path = tmp_path / "x.train"
    path.write_text("pos\tgood film\n1\t2.27\tgood film\n")
    with pytest.raises(DataError, match=r"x\.train:2: a second tab: expected LABEL<TAB>TEXT"):
        read_labeled(path)


def test_a_header_line_is_refused_not_made_a_class(tmp_path):
    """A file starting with a header ('label<TAB>text') made a class 'label' of one example."""
    (tmp_path / "t.train").write_text("label\ttext\npos\tgood film\nneg\tbad film\npos\tfine\n")
    with pytest.raises(DataError) as info:
        ClassificationData.from_dir(tmp_path, "t")
    assert str(info.value).startswith(f"{tmp_path / 't.train'}:1: label 'label' occurs only here")
    assert "a header line?" in str(info.value)
    # in a dev or test file the header's label is unknown: the error says so at line 1
    (tmp_path / "t.train").write_text("pos\tgood film\nneg\tbad film\n")
    (tmp_path / "t.test").write_text("label\ttext\npos\tok\n")
    with pytest.raises(DataError, match=r"t\.test:1: unknown label 'label' \(a header line\? the files have none\)"):
        ClassificationData.from_dir(tmp_path, "t")


def test_a_rare_first_label_that_other_splits_share_is_not_a_header(tmp_path):
    (tmp_path / "t.train").write_text("neutral\tso so\npos\tgood film\nneg\tbad film\n")
    (tmp_path / "t.dev").write_text("neutral\tmeh\npos\tfine\n")
    data = ClassificationData.from_dir(tmp_path, "t")
    assert list(data.labels) == ["neg", "neutral", "pos"]
