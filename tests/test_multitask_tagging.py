"""Tagging sub-tasks of the multi-task recipe on tiny synthetic CoNLL corpora (an IOB2 NER-like task and a
POS-like task without chunks): the loss falls, meta and sp models train, evaluate, reload and predict
through the CLI, each task's CRF forbids its own scheme's transitions, a classification task mixes in,
exact resume after SIGKILL, and bad sub-task configs are named."""

import json
import random
from pathlib import Path

import pytest
import torch
from conftest import assert_same_runs, kill_resume_and_rerun, metric_records, predicted_rows, write_sentiment_corpus
from safetensors.torch import load_file

from seqzoo.cli import main
from seqzoo.config import ConfigError, load_config
from seqzoo.data.tags import allowed_transitions
from seqzoo.tasks.multitask import MultiTask
from seqzoo.training.optim import build_optimizer
from seqzoo.training.registry import get_task
from seqzoo.training.runner import load_task

pytestmark = pytest.mark.usefixtures("single_thread")

NAMES = "Smith Jones Brown Taylor Wilson Davies Evans Thomas".split()
PLACES = "Paris London Berlin Madrid Rome Vienna".split()
WORDS = {"DT": ["the", "a"], "JJ": ["big", "red", "old"], "NN": ["cat", "dog", "house", "car"], "VB": ["sees", "likes"]}


def _ner(rng: random.Random) -> list[tuple[str, str]]:
    """``O``-words around ``Mr NAME`` (PER) and ``in PLACE`` / ``in New PLACE`` (LOC), in IOB2."""
    pairs: list[tuple[str, str]] = []
    for _ in range(rng.randint(1, 2)):
        if rng.random() < 0.5:
            pairs += [("Mr", "O"), (rng.choice(NAMES), "B-PER")]
        else:
            pairs += [("in", "O")] + ([("New", "B-LOC"), (rng.choice(PLACES), "I-LOC")] if rng.random() < 0.5 else
                                      [(rng.choice(PLACES), "B-LOC")])  # fmt: skip
        pairs += [(w, "O") for w in rng.choices(["said", "was", "today", "the"], k=rng.randint(1, 2))]
    return pairs


def _pos(rng: random.Random) -> list[tuple[str, str]]:
    """``DT (JJ) NN VB DT NN`` sentences, tagged by word class (no chunks)."""
    tags = ["DT", *(["JJ"] if rng.random() < 0.5 else []), "NN", "VB", "DT", "NN"]
    return [(rng.choice(WORDS[tag]), tag) for tag in tags]


def _write(directory: Path, sentence, sizes: tuple[int, int, int], seed: int) -> Path:
    rng = random.Random(seed)
    directory.mkdir(parents=True, exist_ok=True)
    for name, n in zip(("train.txt", "valid.txt", "test.txt"), sizes, strict=True):
        lines = [line for _ in range(n) for line in [*(f"{t}\t{g}" for t, g in sentence(rng)), ""]]
        (directory / name).write_text("\n".join(lines) + "\n", encoding="utf-8")
    return directory


@pytest.fixture(scope="module")
def corpora(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("mtl_tagging")
    _write(root / "ner", _ner, (64, 16, 16), seed=0)
    _write(root / "pos", _pos, (48, 16, 16), seed=1)
    write_sentiment_corpus(root / "cls", "alpha", (48, 16, 16), seed=2)
    return root


TASKS = {
    "ner": "{{name: ner, kind: tagging, data_dir: {root}/ner, scheme: iob2, train_scheme: iobes}}",
    "chunk": "{{name: chunk, kind: tagging, data_dir: {root}/ner, scheme: iob2}}",
    "pos": "{{name: pos, kind: tagging, data_dir: {root}/pos, scheme: none}}",
    "alpha": "{{name: alpha, data_dir: {root}/cls}}",
}
CHARS = "char_encoder: cnn, char_embedding_dim: 4, char_hidden_size: 4, "


def _config(root: Path, tmp_path: Path, architecture="meta", tasks=("ner", "pos"), extra=()) -> Path:
    encoder, args = (
        ("meta_lstm", "{hidden_size: 6, meta_size: 4}") if architecture == "meta" else ("lstm", "{hidden_size: 6}")
    )
    chars = "" if "alpha" in tasks else CHARS
    text = f"""\
task: multitask
data:
  tasks: [{", ".join(TASKS[t].format(root=root) for t in tasks)}]
  architecture: {architecture}
  embedding_dim: 8
model: {{encoder: {encoder}, encoder_args: {args}, {chars}dropout: 0.1}}
optim: {{optimizer: adam, lr: 0.02}}
train: {{epochs: 1, batch_size: 8, patience: null, progress: false, log_every: null, device: cpu, threads: 1,
         checkpoint_every: 0}}
"""
    path = tmp_path / "mtl.yaml"
    path.write_text(text + "\n".join(extra))
    return path


def _task(root: Path, tmp_path: Path, architecture="meta", tasks=("ner", "pos"), overrides=()) -> MultiTask:
    config = load_config(_config(root, tmp_path, architecture, tasks), list(overrides))
    return get_task("multitask").build_tasks(config)[0][1]


def test_training_steps_decrease_the_loss(corpora, tmp_path):
    torch.manual_seed(0)
    task = _task(corpora, tmp_path, "meta", overrides=["model.dropout=0"])
    fixed = [("ner", list(range(16))), ("pos", list(range(16)))]

    def loss() -> float:
        with torch.no_grad():
            return sum(task.train_loss(batch).loss.item() for batch in fixed)

    before = loss()
    optimizer = build_optimizer(list(task.model.parameters()), task.config.optim)
    for _ in range(3):
        for batch in task.train_batches(0):
            optimizer.zero_grad()
            task.train_loss(batch).loss.backward()
            optimizer.step()
    assert loss() < 0.5 * before


@pytest.mark.parametrize("architecture", ["meta", "sp"])
def test_architecture_trains_evaluates_reloads_and_predicts_through_the_cli(corpora, tmp_path, capsys, architecture):
    config = _config(corpora, tmp_path, architecture)
    assert main(["train", str(config), "--run-dir", str(tmp_path / "run"), "--set", "train.epochs=3"]) == 0
    test = next(r for r in metric_records(tmp_path / "run") if r["event"] == "test")
    assert {"test_ner/f1", "test_ner/precision_PER", "test_ner/accuracy", "test_pos/accuracy"} <= set(test)
    assert "test_pos/f1" not in test  # tags without chunks: token accuracy alone
    assert test["test_score"] == pytest.approx((test["test_ner/f1"] + test["test_pos/accuracy"]) / 2)
    assert test["test_ner/f1"] > 0.5 and test["test_pos/accuracy"] > 0.8  # both tasks learned something
    best = tmp_path / "run" / "best"
    saved = json.loads((best / "tags.json").read_text())
    assert (
        saved["ner"]["scheme"] == "IOB2" and saved["ner"]["train_scheme"] == "IOBES" and "S-PER" in saved["ner"]["tags"]
    )
    assert saved["pos"] == {"tags": ["DT", "JJ", "NN", "VB"], "scheme": "none", "train_scheme": "none"}
    weights = load_file(best / "model.safetensors")
    assert any(k.startswith("shared.") for k in weights) and not any(".meta." in k for k in weights)  # once
    reloaded = load_task(tmp_path / "run")
    metrics = reloaded.evaluate("test")  # the best checkpoint reloads to the same test figures
    for key in ("score", "ner/f1", "pos/accuracy"):
        assert metrics[key] == pytest.approx(test[f"test_{key}"])

    texts = tmp_path / "texts.txt"
    texts.write_text("Mr Smith was in New Paris today\n\nthe big dog sees a cat\n")
    rows = predicted_rows(capsys, tmp_path / "run", texts, "--task", "ner")
    assert [r["line"] for r in rows] == [1, 3] and all(r["task"] == "ner" for r in rows)
    assert set(rows[0]) == {"line", "text", "task", "tokens", "tags", "confidences", "spans"}
    assert len(rows[0]["tags"]) == len(rows[0]["confidences"]) == 7
    assert all(0.0 < c <= 1.0 for c in rows[0]["confidences"])
    lines = ["Mr Smith was in New Paris today", "the big dog sees a cat"]
    alone = load_task(tmp_path / "run", with_data=False)  # the checkpoint alone: the same predictions
    assert [{k: v for k, v in r.items() if k not in ("line", "text")} for r in rows] == alone.predict(lines, task="ner")
    (pos,) = alone.predict(["the big dog sees a cat"], task="pos")
    assert "spans" not in pos and len(pos["tags"]) == 6 and set(pos["tags"]) <= {"DT", "JJ", "NN", "VB"}


def test_each_tagging_head_forbids_its_own_schemes_transitions(corpora, tmp_path):
    task = _task(corpora, tmp_path, "sp", tasks=("ner", "chunk", "pos"))
    schemes = {"ner": "IOBES", "chunk": "IOB2", "pos": None}
    for name, scheme in schemes.items():
        head = task.model.private[name]["head"]
        assert head.crf.constraints == scheme and head.tags == task.parts[name].tags
        if scheme is not None:
            between, start, end = allowed_transitions(scheme, head.tags)
            assert torch.equal(head.crf.allowed, torch.tensor(between))
            assert torch.equal(head.crf.allowed_start, torch.tensor(start))
            assert torch.equal(head.crf.allowed_end, torch.tensor(end))
        else:
            assert head.crf.allowed.all()
    assert "S-PER" in task.parts["ner"].tags and "S-PER" not in task.parts["chunk"].tags
    unconstrained = _task(corpora, tmp_path, "sp", overrides=["model.constraints=false"])
    assert unconstrained.model.private["ner"]["head"].crf.constraints is None


@pytest.mark.parametrize("architecture", ["fs", "asp"])
def test_classification_and_tagging_tasks_mix(corpora, tmp_path, architecture):
    from seqzoo.training.runner import run

    config = load_config(_config(corpora, tmp_path, architecture, tasks=("alpha", "ner")))
    summary = run(config, tmp_path / "run")["metrics"]
    assert 0.0 <= summary["test_alpha/accuracy"]["mean"] <= 1.0 and 0.0 <= summary["test_ner/f1"]["mean"] <= 1.0
    expected = (summary["test_alpha/accuracy"]["mean"] + summary["test_ner/f1"]["mean"]) / 2
    assert summary["test_score"]["mean"] == pytest.approx(expected)
    task = load_task(tmp_path / "run", with_data=False)
    assert task.predict(["a superb film"], task="alpha")[0]["label"] in {"neg", "pos"}
    assert task.predict(["Mr Smith"], task="ner")[0]["tokens"] == ["Mr", "Smith"]


@pytest.mark.parametrize(
    ("entry", "message"),
    [
        ("{name: ner, kind: tagger, data_dir: /x}", r"data\.tasks\[0\]\.kind: 'tagger' is not one of"),
        ("{name: ner, kind: tagging, scheme: iob2}", r"data\.tasks\[0\]\.data_dir: a tagging sub-task reads"),
        ("{name: alpha, scheme: none}", r"data\.tasks\[0\]\.scheme: only a tagging sub-task"),
        ("{name: pos, kind: tagging, data_dir: /x, scheme: none, train_scheme: iobes}", r"train_scheme"),
    ],
)
def test_bad_sub_task_config_is_one_clear_error(tmp_path, entry, message):
    path = tmp_path / "bad.yaml"
    path.write_text(f"task: multitask\ndata: {{tasks: [{entry}]}}\nmodel: {{encoder: meta_lstm}}\n")
    with pytest.raises(ConfigError, match=message):
        load_config(path)


def test_character_features_with_a_classification_task_are_refused(corpora, tmp_path):
    config = load_config(_config(corpora, tmp_path, "fs", tasks=("alpha", "ner")), ["model.char_encoder=cnn"])
    with pytest.raises(ConfigError, match=r"model\.char_encoder: .*classification sub-tasks \(alpha\)"):
        get_task("multitask").build_tasks(config)


def test_resume_after_sigkill_mid_epoch_reproduces_the_uninterrupted_run(corpora, tmp_path):
    settings = ["train.checkpoint_every=5", "train.log_every=3"]
    # 8 + 6 = 14 steps in the epoch, checkpoints every 5: step 13 is killed 2 steps after the checkpoint of step 10.
    state = kill_resume_and_rerun("multitask.MultiTask", _config(corpora, tmp_path, "meta"), settings, 13, tmp_path)
    assert (state["epoch"], state["step_in_epoch"]) == (0, 10)
    assert_same_runs(tmp_path / "killed", tmp_path / "clean")


@pytest.mark.parametrize("architecture", ["single", "fs", "asp"])
def test_other_architectures_step_and_evaluate_tagging_tasks(corpora, tmp_path, architecture):
    task = _task(corpora, tmp_path, architecture)
    for batch in task.train_batches(0)[:4]:
        step = task.train_loss(batch)
        step.loss.backward()
        assert torch.isfinite(step.loss) and (step.auxiliary > 0) == (architecture == "asp")
    metrics = task.evaluate("dev")
    assert metrics["score"] == pytest.approx((metrics["ner/f1"] + metrics["pos/accuracy"]) / 2)


def test_embedding_vocab_adds_the_pretrained_words_of_every_split(tmp_path):
    for split, words in (("train", "Mr Smith said"), ("valid", "in Zanzibar"), ("test", "Mr Quux")):
        tags = {"Smith": "B-PER", "Zanzibar": "B-LOC", "Quux": "B-PER"}
        lines = [f"{w}\t{tags.get(w, 'O')}" for w in words.split()]
        (tmp_path / f"{split}.txt").write_text("\n".join([*lines, ""]) + "\n")
    (tmp_path / "vectors.txt").write_text("".join(f"{w} {' '.join(['0.5'] * 8)}\n" for w in ("zanzibar", "said")))
    path = tmp_path / "mtl.yaml"
    path.write_text(
        f"task: multitask\ndata: {{tasks: [{{name: ner, kind: tagging, data_dir: {tmp_path}, unseen_tags: keep}}], "
        f"embeddings: {tmp_path}/vectors.txt, embedding_vocab: true}}\nmodel: {{encoder: meta_lstm}}\n"
    )
    task = get_task("multitask").build_tasks(load_config(path))[0][1]
    assert "zanzibar" in task.vocab and "quux" not in task.vocab and "smith" in task.vocab
    plain = get_task("multitask").build_tasks(load_config(path, ["data.embedding_vocab=false"]))[0][1]
    assert "zanzibar" not in plain.vocab
