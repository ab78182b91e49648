"""Hostile input ends in one line, not a traceback, an endless read or an allocation of its making:
long lines, edited checkpoints, odd files where data or checkpoints should be, a full disk."""

from __future__ import annotations

import errno
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file

from seqzoo.cli import main
from tests.conftest import write_sentiment_corpus

TINY_MODEL = {"encoder": "lstm", "encoder_args": {"hidden_size": 8}, "pooler": "mean", "dropout": 0.0}
TINY_TRAIN = {"epochs": 1, "batch_size": 16, "eval_batch_size": 32, "device": "cpu", "progress": False, "threads": 1}


def write_config(path: Path, data_dir: Path, **sections: dict) -> Path:
    values = {
        "task": "classification",
        "name": "tiny",
        "output_dir": str(path.parent / "runs"),
        "data": {"name": "toy", "data_dir": str(data_dir), "embedding_dim": 8},
        "model": TINY_MODEL,
        "train": TINY_TRAIN,
    }
    for key, value in sections.items():
        values[key] = {**values[key], **value} if isinstance(values.get(key), dict) else value
    path.write_text(json.dumps(values), encoding="utf-8")  # JSON is YAML
    return path


def one_line_error(capsys: pytest.CaptureFixture[str], argv: list[str], *expected: str) -> str:
    """Run ``seqzoo ARGV``: it must fail with exit status 2 and one ``seqzoo: error:`` line holding ``expected``."""
    capsys.readouterr()
    assert main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) >= 1 and err[-1].startswith("seqzoo: error:"), err
    assert "Traceback" not in "\n".join(err)
    for text in expected:
        assert text in err[-1], err[-1]
    return err[-1]


@pytest.fixture(scope="module")
def trained(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny trained classification run (its sub-run, holding best/)."""
    root = tmp_path_factory.mktemp("trained")
    data = write_sentiment_corpus(root / "data", sizes=(40, 12, 12))
    config = write_config(root / "tiny.yaml", data)
    torch.set_num_threads(1)
    assert main(["train", str(config), "--run-dir", str(root / "run")]) == 0
    return root / "run"


@pytest.fixture
def run_copy(trained: Path, tmp_path: Path) -> Path:
    """A copy of the trained run that a test may damage."""
    copy = tmp_path / "run"
    subprocess.run(["cp", "-r", str(trained), str(copy)], check=True)
    return copy


MEMORY_LIMIT = 4 << 30  # address space: the edited configs and the long line each ask for far more


def run_limited(argv: list[str], cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    """``seqzoo ARGV`` in a subprocess whose address space is capped at :data:`MEMORY_LIMIT`."""
    script = textwrap.dedent(
        f"""
        import resource, sys
        resource.setrlimit(resource.RLIMIT_AS, ({MEMORY_LIMIT}, {MEMORY_LIMIT}))
        from seqzoo.cli import main
        sys.exit(main(sys.argv[1:]))
        """
    )
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": "", "OMP_NUM_THREADS": "1"}
    root = str(Path(__file__).resolve().parents[1])
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [root, env.get("PYTHONPATH")]))
    return subprocess.run(
        [sys.executable, "-c", script, *argv], capture_output=True, text=True, env=env, cwd=cwd, timeout=120
    )


def edit_json(path: Path, edit) -> None:
    path.write_text(json.dumps(edit(json.loads(path.read_text()))), encoding="utf-8")


# A checkpoint's config is checked against its weights before its model is allocated.


@pytest.mark.parametrize(
    "edit",
    [
        lambda c: {**c, "model": {**c["model"], "encoder_args": {"hidden_size": 20000}}},
        lambda c: {**c, "model": {**c["model"], "mlp_hidden": [200000, 200000]}},
    ],
    ids=["hidden_size", "mlp_hidden"],
)
def test_edited_config_refused_before_allocation(run_copy, edit):
    edit_json(run_copy / "best" / "config.json", edit)
    result = run_limited(["predict", str(run_copy), "--input", os.devnull])
    assert result.returncode == 2, result.stderr
    assert result.stderr.strip().splitlines()[-1].startswith("seqzoo: error:")
    assert "config.json" in result.stderr and "do not fit" in result.stderr


# Malformed best/ files: one line naming the file.


def _without_embedding(best: Path) -> None:
    from safetensors.torch import load_file

    tensors = load_file(str(best / "model.safetensors"))
    del tensors["embedding.weight"]
    save_file(tensors, str(best / "model.safetensors"))


def _link(best: Path, name: str, target: str) -> None:
    (best / name).unlink()
    (best / name).symlink_to(target)


SECRET = "do-not-echo-this-secret"
DAMAGES = {
    "config-list": ("config.json", lambda b: (b / "config.json").write_text("[1, 2]")),
    "config-deep": ("config.json", lambda b: (b / "config.json").write_text("[" * 100_000 + "]" * 100_000)),
    "labels-ints": ("labels.json", lambda b: (b / "labels.json").write_text('{"labels": [0, 1]}')),
    "vocab-not-list": ("vocab.json", lambda b: edit_json(b / "vocab.json", lambda v: {**v, "tokens": "abc"})),
    "vocab-list": ("vocab.json", lambda b: (b / "vocab.json").write_text('["<pad>", "<unk>"]')),
    "vocab-duplicates": (
        "vocab.json",
        lambda b: edit_json(b / "vocab.json", lambda v: {**v, "tokens": [*v["tokens"][:-1], v["tokens"][2]]}),
    ),
    "no-embedding": ("model.safetensors", _without_embedding),
    "weights-device": ("model.safetensors", lambda b: _link(b, "model.safetensors", "/dev/zero")),
    "vocab-device": ("vocab.json", lambda b: _link(b, "vocab.json", "/dev/zero")),
    "tokenizer-link": ("tokenizer.json", lambda b: _link(b, "tokenizer.json", str(b.parent / "secret.json"))),
    "vocab-link": ("vocab.json", lambda b: _link(b, "vocab.json", str(b.parent / "secret.json"))),
}


@pytest.mark.parametrize("damage", DAMAGES, ids=list(DAMAGES))
def test_malformed_checkpoint_files(run_copy, capsys, damage):
    name, apply = DAMAGES[damage]
    secret = {"kind": SECRET, "tokens": [SECRET], "counts": [1]}
    (run_copy / "secret.json").write_text(json.dumps(secret))
    apply(run_copy / "best")
    line = one_line_error(capsys, ["predict", str(run_copy), "--input", os.devnull], name)
    assert SECRET not in line


def test_full_disk_during_a_checkpoint(tmp_path, capsys, monkeypatch):
    import seqzoo.training.checkpoint as checkpoint

    data = write_sentiment_corpus(tmp_path / "data", sizes=(40, 12, 12))
    config = write_config(tmp_path / "tiny.yaml", data, train={"epochs": 2})
    real_save, calls = checkpoint.save_file, []

    def save_until_full(tensors, path):  # the first epoch's checkpoints fit on the disk, the second's do not
        calls.append(path)
        if Path(path).parent.name == "last.tmp" and sum(Path(p).parent.name == "last.tmp" for p in calls) > 4:
            raise OSError(errno.ENOSPC)
        real_save(tensors, path)

    monkeypatch.setattr(checkpoint, "save_file", save_until_full)
    line = one_line_error(capsys, ["train", str(config), "--run-dir", str(tmp_path / "run")], "No space left")
    assert "last" in line
    assert not list((tmp_path / "run").glob("*.tmp"))
    state = json.loads((tmp_path / "run" / "last" / "train_state.json").read_text())
    assert state["loop"]["epoch"] == 1  # the first epoch's checkpoint, complete


# Memory stays bounded whatever the data: a line of a million tokens is cut, with a warning.


def test_a_million_token_line_is_cut_under_a_memory_limit(tmp_path):
    data = write_sentiment_corpus(tmp_path / "data", sizes=(40, 12, 12))
    with open(data / "toy.train", "a", encoding="utf-8") as handle:
        handle.write("pos\t" + "good " * 1_000_000 + "\n")  # 5 MB on one line
    config = write_config(tmp_path / "tiny.yaml", data)
    result = run_limited(["train", str(config), "--run-dir", str(tmp_path / "run")])
    assert result.returncode == 0, result.stderr[-2000:]
    assert "train: 1 text longer than data.max_len=1000 tokens cut to that length" in result.stderr
    assert "(the longest: 1000000 tokens" in result.stderr and "toy.train:41" in result.stderr


def test_a_tagged_sentence_beyond_max_len_is_named(tmp_path, capsys):
    """A tagged sentence is not cut (its gold tags would be): it stops the run, named by file and line."""
    for name in ("train.txt", "valid.txt", "test.txt"):
        (tmp_path / name).write_text("the\tDT\ncat\tNN\n\nsat\tVB\n\n", encoding="utf-8")
    with open(tmp_path / "train.txt", "a", encoding="utf-8") as handle:
        handle.write("buffalo\tNN\n" * 1001)  # a sentence from line 6 on
    config = tmp_path / "tag.yaml"
    data = {"data_dir": str(tmp_path), "scheme": "none", "embedding_dim": 8}
    model = {key: value for key, value in TINY_MODEL.items() if key != "pooler"}  # a tagger pools nothing
    values = {"task": "tagging", "data": data, "model": model, "train": TINY_TRAIN}
    config.write_text(json.dumps(values), encoding="utf-8")
    line = one_line_error(capsys, ["train", str(config), "--run-dir", str(tmp_path / "run")], "train.txt:6")
    assert "a sentence of 1001 tokens, more than data.max_len=1000" in line


# Decoding is bounded.


def test_predict_refuses_a_source_beyond_max_source_chars(tmp_path, capsys):
    words = "haus katze hund baum auto".split()
    for split in ("train", "dev", "test"):
        rows = [" ".join(words[i % 5 : i % 5 + 2]) for i in range(12)]
        (tmp_path / f"{split}.de").write_text("\n".join(rows) + "\n", encoding="utf-8")
        (tmp_path / f"{split}.en").write_text("\n".join(rows) + "\n", encoding="utf-8")
    config = tmp_path / "t.yaml"
    data = {"data_dir": str(tmp_path), "embedding_dim": 8, "beam_size": 1}
    model = {"encoder": "lstm", "encoder_args": {"hidden_size": 8}, "dropout": 0.0}
    values = {"task": "translation", "data": data, "model": model, "train": {**TINY_TRAIN, "batch_size": 6}}
    config.write_text(json.dumps(values), encoding="utf-8")
    assert main(["train", str(config), "--run-dir", str(tmp_path / "run")]) == 0
    source = tmp_path / "input.txt"
    source.write_text("haus\n\n" + "katze " * 100_000 + "\n", encoding="utf-8")  # 600k characters on line 3
    line = one_line_error(capsys, ["predict", str(tmp_path / "run"), "--input", str(source)], "input.txt:3")
    assert "600000 characters, more than data.max_source_chars=1000" in line
    (tmp_path / "dev.de").write_text("haus\n" * 11 + "x" * 1001 + "\n", encoding="utf-8")
    line = one_line_error(capsys, ["evaluate", str(tmp_path / "run"), "--split", "test"], "dev.de:12")
    assert "more than data.max_source_chars=1000" in line


def test_beam_search_output_is_capped():
    from seqzoo.heads.seq2seq import beam_search, build_seq2seq

    torch.manual_seed(0)
    model = build_seq2seq("lstm", vocab_size=9, embedding_dim=4, hidden_size=4, dropout=0.0, pad_id=0)
    src = torch.randint(4, 9, (2, 30))
    outputs = beam_search(model, src, torch.ones_like(src, dtype=torch.bool), 2, 3, beam_size=2, banned=[3])
    assert [len(o) for o in outputs] == [70, 70]  # <eos> banned: each runs to twice its source + 10
    capped = beam_search(model, src, torch.ones_like(src, dtype=torch.bool), 2, 3, 2, banned=[3], max_output=7)
    assert [len(o) for o in capped] == [7, 7]


# No silent surprises.


@pytest.fixture
def tiny_config(tmp_path: Path) -> Path:
    return write_config(tmp_path / "tiny.yaml", write_sentiment_corpus(tmp_path / "data", sizes=(40, 12, 12)))


@pytest.mark.parametrize(
    ("assignment", "key"),
    [
        ("data.name=../data/toy", "data.name"),
        ("name=../../evil", "name"),
        ("name=a/b", "name"),
        ("output_dir=$SEQZOO_SURELY_UNSET_VARIABLE/runs", "output_dir"),
    ],
)
def test_names_and_output_dir_are_checked(tiny_config, capsys, assignment, key):
    one_line_error(capsys, ["train", str(tiny_config), "--set", assignment], f"{key}:")
    assert not (tiny_config.parent / "runs").exists()
    assert not (tiny_config.parent.parent / "evil").exists()


def test_an_empty_config_file_is_an_error(tmp_path, capsys):
    (tmp_path / "empty.yaml").write_text("# nothing yet\n", encoding="utf-8")
    one_line_error(capsys, ["train", str(tmp_path / "empty.yaml")], "empty.yaml", "empty")


@pytest.mark.parametrize("kind", ["directory", "fifo"])
def test_a_split_that_is_no_regular_file_is_an_error(tiny_config, capsys, kind):
    """A directory at toy.test made the run cross-validate silently, as if there were no test split."""
    test = tiny_config.parent / "data" / "toy.test"
    test.unlink()
    test.mkdir() if kind == "directory" else os.mkfifo(test)
    one_line_error(capsys, ["train", str(tiny_config)], "toy.test", "not a regular file")


def test_a_tagging_split_that_is_a_fifo_is_named_not_read(tmp_path, capsys):
    for name in ("train.txt", "test.txt"):
        (tmp_path / name).write_text("the\tDT\ncat\tNN\n\n", encoding="utf-8")
    os.mkfifo(tmp_path / "valid.txt")  # opened for reading, it would wait for a writer forever
    config = tmp_path / "tag.yaml"
    model = {key: value for key, value in TINY_MODEL.items() if key != "pooler"}
    data = {"data_dir": str(tmp_path), "scheme": "none", "embedding_dim": 8}
    config.write_text(json.dumps({"task": "tagging", "data": data, "model": model, "train": TINY_TRAIN}))
    one_line_error(capsys, ["train", str(config), "--run-dir", str(tmp_path / "run")], "valid.txt", "a FIFO")


def test_a_run_that_fails_before_training_leaves_no_directory(tiny_config, capsys):
    (tiny_config.parent / "data" / "toy.dev").write_text("pos\tfine\nnew-label\tbad\n", encoding="utf-8")
    one_line_error(capsys, ["train", str(tiny_config)], "toy.dev:2", "unknown label")
    assert list((tiny_config.parent / "runs").iterdir()) == []
    run_dir = tiny_config.parent / "given"
    one_line_error(capsys, ["train", str(tiny_config), "--run-dir", str(run_dir)], "unknown label")
    assert not run_dir.exists()


def test_nan_weights(run_copy, capsys, caplog):
    from safetensors.torch import load_file

    path = run_copy / "best" / "model.safetensors"
    tensors = load_file(str(path))
    tensors["head.1.bias"] = torch.full_like(tensors["head.1.bias"], float("nan"))
    save_file(tensors, str(path))
    source = run_copy / "input.txt"
    source.write_text("a fine film\n", encoding="utf-8")
    one_line_error(capsys, ["predict", str(run_copy), "--input", str(source)], "NaN", "head.1.bias")
    assert main(["evaluate", str(run_copy)]) == 0
    assert "weights with NaN or infinite values (head.1.bias)" in caplog.text


def test_a_resumed_checkpoint_file_that_is_a_device(run_copy, capsys):
    _link(run_copy / "last", "train_state.json", "/dev/zero")  # read, it would never end
    one_line_error(capsys, ["train", "--resume", str(run_copy)], "train_state.json", "a device, not a regular file")


def test_a_multitask_task_name_is_a_file_name():
    from seqzoo.config import ConfigError, load_config

    with pytest.raises(ConfigError, match=r"data\.tasks\[0\]\.name: must be a file name without a path separator"):
        load_config(None, ["task=multitask", "data.tasks=[{name: ../secret}]"])


def test_evaluate_warns_once_about_a_cut_text(tmp_path, caplog):
    data = write_sentiment_corpus(tmp_path / "data", sizes=(40, 12, 12))
    with open(data / "toy.test", "a", encoding="utf-8") as handle:
        handle.write("neg\t" + "dull " * 1001 + "\n")
    config = write_config(tmp_path / "tiny.yaml", data)
    assert main(["train", str(config), "--run-dir", str(tmp_path / "run")]) == 0
    caplog.clear()
    assert main(["evaluate", str(tmp_path / "run")]) == 0
    cut = [r for r in caplog.records if "longer than data.max_len" in r.getMessage()]
    assert [r.getMessage().split(":")[0] for r in cut] == ["test"], cut  # once, though the model is built twice
