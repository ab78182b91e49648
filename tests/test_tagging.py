"""The tagging recipe on a tiny synthetic CoNLL corpus (capitalised names after "Mr" are PER, ...): train,
evaluate and predict through the CLI, scores in the corpus's scheme, allowed-transition constraints, every
encoder end to end, exact resume after SIGKILL, and bad input named by file and line."""

import itertools
import json
import random
from pathlib import Path

import pytest
import torch
import yaml
from conftest import assert_same_runs, kill_resume_and_rerun, metric_records, predicted_rows

from seqzoo.cli import main
from seqzoo.config import config_from_dict
from seqzoo.data.tags import allowed_transitions, chunk_scores, chunks, convert
from seqzoo.tasks.tagging import TaggingTask, load_data
from seqzoo.training.runner import load_task

pytestmark = pytest.mark.usefixtures("single_thread")

NAMES = "Smith Jones Brown Taylor Wilson Davies Evans Thomas Johnson Roberts Walker Wright Green Hall Wood".split()
PLACES = "Paris London Berlin Madrid Rome Vienna Oslo Prague Dublin Lisbon".split()
FIRMS = "Acme Globex Initech Umbrella Hooli Vandelay".split()
FILLER = "the a said today that was of and yesterday report market new it".split()


def _sentence(rng: random.Random) -> tuple[list[str], list[str]]:
    tokens: list[str] = []
    tags: list[str] = []
    for _ in range(rng.randint(1, 3)):
        kind = rng.choice(["PER", "LOC", "ORG", "O"])
        if kind == "PER":
            tokens += [rng.choice(["Mr", "Mrs"]), rng.choice(NAMES)]
            tags += ["O", "B-PER"]
        elif kind == "LOC":
            tokens += ["in", rng.choice(PLACES)]
            tags += ["O", "B-LOC"]
        elif kind == "ORG":
            tokens += [rng.choice(FIRMS), "Corp"]
            tags += ["B-ORG", "I-ORG"]
        words = rng.choices(FILLER, k=rng.randint(1, 3))
        tokens += words
        tags += ["O"] * len(words)
    return tokens, tags


def write_corpus(directory: Path, sizes=(120, 30, 30), seed: int = 0) -> Path:
    """train.txt / valid.txt / test.txt in IOB2, TOKEN<TAB>TAG, a blank line after each sentence."""
    rng = random.Random(seed)
    directory.mkdir(parents=True, exist_ok=True)
    for name, n in zip(("train.txt", "valid.txt", "test.txt"), sizes, strict=True):
        lines = []
        for _ in range(n):
            tokens, tags = _sentence(rng)
            lines += [f"{t}\t{g}" for t, g in zip(tokens, tags, strict=True)] + [""]
        (directory / name).write_text("\n".join(lines) + "\n", encoding="utf-8")
    return directory


def _config(data_dir: Path, encoder="lstm", encoder_args=None, **sections) -> dict:
    config = {
        "task": "tagging",
        "name": "toy",
        "data": {"data_dir": str(data_dir), "scheme": "iob2", "train_scheme": "iobes", "embedding_dim": 12},
        "model": {
            "encoder": encoder,
            "encoder_args": encoder_args or {"hidden_size": 12, "bidirectional": True},
            "char_encoder": "cnn",
            "char_embedding_dim": 8,
            "char_hidden_size": 8,
            "dropout": 0.1,
        },
        "optim": {"optimizer": "adam", "lr": 0.02},
        "train": {"epochs": 4, "batch_size": 8, "patience": None, "progress": False, "seed": 1},
    }
    for section, values in sections.items():
        config[section] = {**config.get(section, {}), **values}
    return config


def _write_config(path: Path, config: dict) -> Path:
    path.write_text(yaml.safe_dump(config), encoding="utf-8")
    return path


@pytest.fixture(scope="module")
def trained(tmp_path_factory) -> Path:
    """A CRF tagger trained 4 epochs in IOBES on an IOB2 corpus, through ``seqzoo train``."""
    root = tmp_path_factory.mktemp("tagging")
    config = _write_config(root / "toy.yaml", _config(write_corpus(root / "data")))
    torch.set_num_threads(1)
    assert main(["train", str(config), "--run-dir", str(root / "run")]) == 0
    return root / "run"


def test_train_evaluate_predict_through_the_cli(trained, tmp_path, capsys):
    capsys.readouterr()
    assert main(["evaluate", str(trained)]) == 0
    record = json.loads(capsys.readouterr().out.splitlines()[0])
    # chance (a tag drawn per token) is far below; the cues are exact, so a few epochs learn them
    assert record["f1"] > 0.8, record
    assert {"accuracy", "precision", "recall", "loss"} <= record.keys()
    for kind in ("PER", "LOC", "ORG"):
        assert {f"f1_{kind}", f"precision_{kind}", f"recall_{kind}"} <= record.keys()
    texts = tmp_path / "in.txt"
    texts.write_text("Mr Wood said in Rome\n\nAcme Corp said it was new\n", encoding="utf-8")
    rows = predicted_rows(capsys, trained, texts)
    assert [row["line"] for row in rows] == [1, 3]
    for row in rows:
        assert row["tokens"] == row["text"].split()
        assert len(row["tags"]) == len(row["tokens"]) == len(row["confidences"])
        assert all(0.0 < c <= 1.0 + 1e-6 for c in row["confidences"])
        spans = [(s["type"], s["start"], s["end"]) for s in row["spans"]]
        assert spans == chunks(row["tags"])
        assert all(s["text"] == " ".join(row["tokens"][s["start"] : s["end"]]) for s in row["spans"])
    assert {"type": "ORG", "start": 0, "end": 2, "text": "Acme Corp"} in rows[1]["spans"]


def test_iobes_training_is_scored_as_iob2_scoring_of_the_converted_predictions(trained):
    task = load_task(trained)
    predicted = task.predicted_tags("test")  # IOBES: the model's own scheme
    assert any(tag.startswith(("S-", "E-")) for tags in predicted for tag in tags)
    gold = [e.gold for e in task.encoded["test"]]  # IOB2: the corpus's
    direct = chunk_scores(gold, [convert(tags, "IOBES", "IOB2") for tags in predicted])
    metrics = task.evaluate("test")
    assert metrics["f1"] == direct.micro.f1 and metrics["accuracy"] == direct.accuracy
    for kind, scores in direct.per_type.items():
        assert metrics[f"f1_{kind}"] == scores.f1
    # chunks do not depend on the scheme they are written in
    in_iobes = chunk_scores([convert(tags, "IOB2", "IOBES") for tags in gold], predicted)
    assert in_iobes.micro == direct.micro


def _is_valid(tags: list[str], scheme: str, names: list[str]) -> bool:
    between, start, end = allowed_transitions(scheme, names)
    index = [names.index(t) for t in tags]
    return start[index[0]] and end[index[-1]] and all(between[a][b] for a, b in itertools.pairwise(index))


@pytest.mark.parametrize("decoder", ["crf", "softmax"])
def test_constraints_on_never_predict_an_invalid_sequence(tmp_path, decoder):
    """Scores rigged towards forbidden tags (I-/E- everywhere): decoded with constraints, every sentence is
    valid IOBES; without them the same scores decode invalid sequences (so the check can fail)."""
    data_dir = write_corpus(tmp_path / "data", sizes=(30, 20, 20))
    torch.manual_seed(0)
    invalid = 0
    for constraints in (True, False):
        config = config_from_dict(_config(data_dir, model={"decoder": decoder, "constraints": constraints}))
        task = TaggingTask(config, load_data(config.data).splits)
        head = task.model.head
        with torch.no_grad():
            bias = torch.tensor([3.0 if t[0] in "IE" else 0.0 for t in task.tags])
            head.linear.bias.copy_(bias)
            if head.crf is not None:
                head.crf.transitions.normal_(0.0, 2.0)
        for tags in task.predicted_tags("test"):
            ok = _is_valid(tags, "IOBES", task.tags)
            assert ok or not constraints, tags
            invalid += not ok
    assert invalid > 0


@pytest.mark.parametrize(
    "encoder, encoder_args",
    [
        ("lstm", {"hidden_size": 8, "bidirectional": True}),
        ("qrnn", {"hidden_size": 8, "bidirectional": True, "window": 2, "causal": False}),
        ("mzu", {"hidden_size": 8, "bidirectional": True, "num_zones": 2, "filter_size": 8}),
        ("slstm", {"hidden_size": 8, "num_steps": 2}),
        ("meta_lstm", {"hidden_size": 8, "bidirectional": True, "meta_size": 4}),
    ],
)
def test_any_encoder_trains_an_epoch_end_to_end(tmp_path, encoder, encoder_args):
    data_dir = write_corpus(tmp_path / "data", sizes=(24, 8, 8))
    config = _write_config(
        tmp_path / "c.yaml", _config(data_dir, encoder, encoder_args, train={"epochs": 1}, model={"decoder": "crf"})
    )
    assert main(["train", str(config), "--run-dir", str(tmp_path / "run")]) == 0
    test = [r for r in metric_records(tmp_path / "run") if r["event"] == "test"]
    assert len(test) == 1 and 0.0 <= test[0]["test_f1"] <= 1.0


def test_softmax_decoder_trains_and_reports_its_probabilities(tmp_path, capsys):
    data_dir = write_corpus(tmp_path / "data", sizes=(120, 30, 30))
    config = _config(data_dir, model={"decoder": "softmax", "constraints": False}, data={"train_scheme": None})
    assert main(["train", str(_write_config(tmp_path / "c.yaml", config)), "--run-dir", str(tmp_path / "run")]) == 0
    task = load_task(tmp_path / "run")
    assert task.model.head.crf is None
    assert task.evaluate("test")["f1"] > 0.8
    (row,) = task.predict(["Mrs Hall said"])
    # without constraints the softmax decodes each token's most probable tag: its probability is at least 1/K
    assert all(c >= 1 / len(task.tags) for c in row["confidences"])


def test_resume_after_sigkill_mid_epoch_reproduces_the_uninterrupted_run(tmp_path):
    data_dir = write_corpus(tmp_path / "data", sizes=(80, 16, 16))
    config = _config(data_dir, train={"epochs": 2, "checkpoint_every": 4, "threads": 1}, model={"dropout": 0.3})
    path = _write_config(tmp_path / "c.yaml", config)
    # 80 sentences / batch 8 = 10 steps per epoch, checkpoints every 4 steps: step 15 is mid-epoch 2,
    # 3 steps after the checkpoint at its step 2
    state = kill_resume_and_rerun("tagging.TaggingTask", path, [], 15, tmp_path)
    assert (state["epoch"], state["step_in_epoch"]) == (1, 2)
    assert_same_runs(tmp_path / "killed", tmp_path / "clean")


@pytest.mark.parametrize(
    "split, line, bad, message",
    [
        ("train.txt", 3, "Smith B-PER extra", "3 columns, but the file's first token line has 2"),
        ("train.txt", 2, "Smith\t", "1 columns, but the file's first token line has 2"),
        ("valid.txt", 2, "Smith\tB-TITLE", "tag 'B-TITLE' does not occur in the training data"),
        ("test.txt", 1, "Mr\tX-PER", "tag 'X-PER' is neither O nor PREFIX-TYPE"),
    ],
    ids=["columns", "empty-tag", "unseen-tag", "bad-tag"],
)
def test_bad_input_names_the_file_and_line(tmp_path, capsys, split, line, bad, message):
    data_dir = write_corpus(tmp_path / "data", sizes=(10, 4, 4))
    path = data_dir / split
    lines = path.read_text().splitlines()
    lines[line - 1] = bad
    path.write_text("\n".join(lines) + "\n")
    config = _write_config(tmp_path / "c.yaml", _config(data_dir, train={"epochs": 1}))
    assert main(["train", str(config), "--run-dir", str(tmp_path / "run")]) != 0
    err = capsys.readouterr().err
    assert f"{path}:{line}: " in err and message in err, err


def test_unseen_tags_kept_are_scored_as_errors(tmp_path, caplog):
    data_dir = write_corpus(tmp_path / "data", sizes=(30, 10, 10))
    path = data_dir / "test.txt"
    lines = path.read_text().splitlines()
    lines[0] = lines[0].split("\t")[0] + "\tB-TITLE"
    path.write_text("\n".join(lines) + "\n")
    config = config_from_dict(_config(data_dir, data={"unseen_tags": "keep"}))
    with caplog.at_level("WARNING", logger="seqzoo"):
        task = TaggingTask(config, load_data(config.data).splits, sources=load_data(config.data).sources)
    assert f"{path}: 1 gold tags do not occur in the training data, first 'B-TITLE' at line 1" in caplog.text
    assert "TITLE" not in {t.partition("-")[2] for t in task.tags}
    metrics = task.evaluate("test")
    assert metrics["recall_TITLE"] == 0.0 and metrics["accuracy"] < 1.0
