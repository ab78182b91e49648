"""The ABSA recipe end to end: the shipped configs run unchanged on the XML fixtures."""

import json
import math
import re
from pathlib import Path

import pytest
import torch
from conftest import metric_records

from seqzoo.cli import main
from seqzoo.config import load_config
from seqzoo.data.absa import POLARITIES, AspectExample, hard_subset, hold_out_sentences, read_semeval2014
from seqzoo.data.errors import DataError
from seqzoo.tasks.absa import ABSATask, load_splits, make_batch
from seqzoo.training.runner import load_task

REPO = Path(__file__).resolve().parents[1]
FIXTURES = Path(__file__).parent / "fixtures" / "absa"
CONFIGS = sorted((REPO / "configs").glob("absa_*.yaml"))
TINY = [
    "model.encoder_args.hidden_size=8", "train.epochs=2", "train.seeds=[1,2]", "train.batch_size=8",
    "train.progress=false", "train.checkpoint_every=0",
]  # fmt: skip


pytestmark = pytest.mark.usefixtures("single_thread")


@pytest.fixture
def semeval(monkeypatch, tmp_path):
    """SEMEVAL_DIR -> the fixtures; a tiny GloVe file standing in for the real vectors."""
    monkeypatch.setenv("SEMEVAL_DIR", str(FIXTURES))
    glove = tmp_path / "glove.txt"
    glove.write_text("the 0.1 0.2 0.3 0.4\nfood 0.5 -0.1 0.0 0.2\nservice -0.3 0.1 0.2 0.0\n")
    return glove


def test_hold_out_keeps_sentences_whole():
    ds = read_semeval2014(FIXTURES / "Restaurants_Train.xml")
    train, dev = hold_out_sentences(ds, 0.3, seed=13)
    assert sorted(train + dev, key=ds.index) == ds
    assert not {e.index for e in train} & {e.index for e in dev}
    assert hold_out_sentences(ds, 0.3, seed=13) == (train, dev)
    assert hold_out_sentences(ds, 0.3, seed=14) != (train, dev)
    assert len({e.index for e in dev}) == round(0.3 * len({e.index for e in ds}))


@pytest.mark.parametrize("config", CONFIGS, ids=lambda p: p.stem)
def test_configs_load_and_read_the_fixtures(config, semeval):
    cfg = load_config(config)
    assert cfg.task == "absa" and cfg.data.train.startswith(str(FIXTURES))
    splits = load_splits(cfg.data)
    assert {len(s) > 0 for s in splits.values()} == {True}


def test_hds_applies_to_dev_and_test_only(semeval):
    cfg = load_config(CONFIGS[0], ["data.subset=hds"])
    ds, hds = load_splits(load_config(CONFIGS[0]).data), load_splits(cfg.data)
    assert hds["train"] == ds["train"]
    assert hds["dev"] == hard_subset(ds["dev"]) and hds["test"] == hard_subset(ds["test"])
    assert len(hds["test"]) < len(ds["test"])


def test_empty_subset_is_a_clear_error(semeval, tmp_path):
    easy = tmp_path / "easy.xml"  # a single aspect: no hard sentence
    easy.write_text(
        '<sentences><sentence id="1"><text>Great food.</text><aspectTerms>'
        '<aspectTerm term="food" polarity="positive" from="6" to="10"/></aspectTerms></sentence></sentences>'
    )
    cfg = load_config(CONFIGS[0], ["data.subset=hds", f"data.test={easy}"])
    with pytest.raises(DataError, match=r"easy\.xml: the test split has no HDS examples"):
        load_splits(cfg.data)


def test_too_few_train_sentences_for_a_dev_set_is_a_clear_error(semeval, tmp_path):
    one = tmp_path / "one.xml"
    one.write_text(
        '<sentences><sentence id="1"><text>Great food.</text><aspectTerms>'
        '<aspectTerm term="food" polarity="positive" from="6" to="10"/></aspectTerms></sentence></sentences>'
    )
    cfg = load_config(CONFIGS[0], [f"data.train={one}", "data.dev=null", "data.dev_fraction=0.1"])
    with pytest.raises(
        DataError, match=r"one\.xml: 1 sentences are too few to hold out 10% \(no data.dev file given\)"
    ):
        load_splits(cfg.data)


@pytest.mark.parametrize(("subset", "test_examples"), [("ds", 13), ("hds", 7)])
def test_train_two_seeds_then_evaluate(semeval, tmp_path, capsys, subset, test_examples):
    config = REPO / "configs" / "absa_restaurant_capmzu_dt.yaml"
    run_dir = tmp_path / "run"
    overrides = [*TINY, f"data.subset={subset}", f"data.embeddings={semeval}", "model.encoder_args.filter_size=8"]
    assert main(["train", str(config), "--run-dir", str(run_dir), *(a for o in overrides for a in ("--set", o))]) == 0
    out = capsys.readouterr().out
    assert re.search(r"test_accuracy: \d+\.\d\d% ± \d+\.\d\d% \(n=2\)", out)
    summary = json.loads((run_dir / "summary.json").read_text())
    assert sorted(summary["runs"]) == ["seed-1", "seed-2"]
    assert summary["metrics"]["test_examples"]["mean"] == test_examples
    accuracy = summary["metrics"]["test_accuracy"]
    assert 0 <= accuracy["mean"] <= 1 and accuracy["std"] >= 0

    assert main(["evaluate", str(run_dir)]) == 0
    lines = [json.loads(line) for line in capsys.readouterr().out.splitlines() if line.startswith("{")]
    assert len(lines) == 2
    for line in lines:  # the reloaded best checkpoints reproduce the recorded test accuracy
        seed = Path(line["run"]).name
        assert line["accuracy"] == pytest.approx(summary["runs"][seed]["test_accuracy"])
        assert line["examples"] == test_examples
    if subset == "ds":  # the hidden-state plot reads an ABSA run too (its data config has no max_len)
        check_predict(run_dir / "seed-1", tmp_path, capsys)
        out = tmp_path / "hidden.png"
        assert main(["plot-hidden", str(run_dir / "seed-1"), "--text", "the food was great", "--out", str(out)]) == 0
        assert out.read_bytes()[:4] == b"\x89PNG"


def test_absa_trains_in_bf16(semeval, tmp_path):
    """``train.precision: bf16`` on the capMZU+DT recipe: aspect embeddings, masked mean pooling
    and the bidirectional MZU under CPU autocast; evaluation in float32."""
    config = REPO / "configs" / "absa_restaurant_capmzu_dt.yaml"
    run_dir = tmp_path / "run"
    overrides = [*TINY, "train.seeds=[1]", f"data.embeddings={semeval}", "model.encoder_args.filter_size=8"]
    overrides.append("train.precision=bf16")
    assert main(["train", str(config), "--run-dir", str(run_dir), *(a for o in overrides for a in ("--set", o))]) == 0
    (metrics,) = run_dir.rglob("metrics.jsonl")
    records = metric_records(metrics.parent)
    assert all(math.isfinite(r["train_loss"]) for r in records if r["event"] == "epoch")
    assert 0 <= records[-1]["test_accuracy"] <= 1
    assert "mixed precision bf16" in (metrics.parent / "train.log").read_text()


def check_predict(run_dir, tmp_path, capsys):
    """`seqzoo predict` on an ABSA run reads ``sentence<TAB>aspect term`` lines and gives what the
    model gives on the same tokens; a line without the tab is an error naming the file's line."""
    sentence, aspects = "The food was great but the service was slow.", ["food", "service"]
    texts = tmp_path / "aspects.tsv"
    texts.write_text(f"{sentence}\t{aspects[0]}\n\n{sentence}\t{aspects[1]}\n")
    assert main(["predict", str(run_dir), "--input", str(texts)]) == 0
    rows = [json.loads(line) for line in capsys.readouterr().out.splitlines() if line.startswith("{")]
    assert [(row["line"], row["aspect"]) for row in rows] == [(1, aspects[0]), (3, aspects[1])]
    task = load_task(run_dir, with_data=False)
    spans = [(sentence.index(a), sentence.index(a) + len(a)) for a in aspects]
    examples = [AspectExample("s", 0, sentence, a, *span, "neutral") for a, span in zip(aspects, spans, strict=True)]
    batch = make_batch(examples, task.vocab, task.tokenizer)
    with torch.no_grad():
        probs = torch.softmax(task.model.eval()(batch.ids, batch.mask, batch.aspect_ids, batch.aspect_mask), -1)
    for row, expected in zip(rows, probs.tolist(), strict=True):
        assert list(row["probabilities"]) == list(POLARITIES)
        assert list(row["probabilities"].values()) == pytest.approx(expected, abs=1e-6)
        assert row["label"] == POLARITIES[max(range(len(expected)), key=expected.__getitem__)]

    for bad in (f"{sentence} without a tab", f"{sentence}\tfood\tservice", f"{sentence}\t "):
        texts.write_text(f"{sentence}\t{aspects[0]}\n\n{bad}\n")
        assert main(["predict", str(run_dir), "--input", str(texts)]) == 2
        assert f"{texts}:3: expected 'sentence<TAB>aspect term'" in capsys.readouterr().err
    texts.write_bytes(f"{sentence}\t{aspects[0]}\r\r{sentence} without a tab\r".encode())  # old Mac endings
    assert main(["predict", str(run_dir), "--input", str(texts)]) == 2
    assert f"{texts}:3: expected 'sentence<TAB>aspect term'" in capsys.readouterr().err


def test_dev_sentences_are_held_out_of_train(semeval):
    """Without data.dev, the dev sentences are removed from train (no selection on training data)."""
    cfg = load_config(CONFIGS[0])
    splits = load_splits(cfg.data)
    train_ids = {e.sentence_id for e in splits["train"]}
    dev_ids = {e.sentence_id for e in splits["dev"]}
    assert dev_ids and not train_ids & dev_ids
    assert len(splits["train"]) + len(splits["dev"]) == len(read_semeval2014(cfg.data.train))


def test_the_vocabulary_comes_from_train_only(semeval):
    """Words seen only in dev or test are <unk>, not vocabulary entries."""
    cfg = load_config(CONFIGS[0], [f"data.embeddings={semeval}"])
    splits = load_splits(cfg.data)
    task = ABSATask(cfg, splits)

    def words(name):
        return {w for e in splits[name] for w in task.tokenizer(e.text)}

    unseen = (words("dev") | words("test")) - words("train")
    assert unseen and not unseen & set(task.vocab)
