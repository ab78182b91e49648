"""The classification recipe: cross-validated runs (evaluating a fold uses that fold's own splits),
the per-epoch shuffle, max_len, the dev hold-out and the evaluation's averages."""

import json
import shutil
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from conftest import metric_records, write_sentiment_corpus

from seqzoo.cli import main
from seqzoo.config import RunConfig, config_from_dict, load_config
from seqzoo.data.errors import DataError
from seqzoo.training.runner import load_task, run

pytestmark = pytest.mark.usefixtures("single_thread")


def _kfold_config(tmp_path: Path) -> RunConfig:
    """A 2-fold run on a corpus with train and dev but no test split (one epoch, tiny model, dropout)."""
    data_dir = write_sentiment_corpus(tmp_path / "data", sizes=(40, 10, 1))
    (data_dir / "toy.test").unlink()
    return config_from_dict(
        {
            "name": "toy",
            "data": {"name": "toy", "data_dir": str(data_dir), "embedding_dim": 8, "min_freq": 1, "folds": 2},
            "model": {"encoder": "gru", "encoder_args": {"hidden_size": 8}, "dropout": 0.5},
            "train": {"epochs": 1, "batch_size": 8, "patience": None, "seed": 3, "progress": False},
        }
    )


def _kfold_run(tmp_path: Path) -> Path:
    run(_kfold_config(tmp_path), tmp_path / "kf")
    return tmp_path / "kf"


def test_a_resume_that_skips_finished_folds_trains_the_next_as_an_uninterrupted_run(tmp_path):
    """Interrupted in fold 2 before its first checkpoint: fold 2's draws must not depend on fold 1
    having trained in the same process (they did: one seed for all the folds in turn)."""
    run_dir = _kfold_run(tmp_path)
    resumed = tmp_path / "resumed"
    shutil.copytree(run_dir, resumed)
    shutil.rmtree(resumed / "fold-2")
    (resumed / "summary.json").unlink()
    run(_kfold_config(tmp_path), resumed, resume=True)
    for fold in ("fold-1", "fold-2"):
        whole, again = metric_records(run_dir / fold), metric_records(resumed / fold)
        assert [r.get("train_loss") for r in again] == [r.get("train_loss") for r in whole]
        assert _test_record(resumed / fold)["test_loss"] == _test_record(run_dir / fold)["test_loss"]


def _test_record(sub_run: Path) -> dict:
    return next(r for r in metric_records(sub_run) if r["event"] == "test")


def test_evaluating_a_fold_uses_its_own_held_out_fold(tmp_path, capsys):
    run_dir = _kfold_run(tmp_path)
    for fold in ("fold-1", "fold-2"):
        task = load_task(run_dir / fold)
        sizes = {name: len(split.labels) for name, split in task.splits.items()}
        assert sizes == {"train": 20, "dev": 10, "test": 20}  # train = the other fold, not all 40
        assert task.evaluate("test")["accuracy"] == _test_record(run_dir / fold)["test_accuracy"]
    assert main(["evaluate", str(run_dir)]) == 0
    out = capsys.readouterr().out.splitlines()
    assert [json.loads(line)["accuracy"] for line in out[:2]] == [
        _test_record(run_dir / f"fold-{f}")["test_accuracy"] for f in (1, 2)
    ]
    assert main(["evaluate", str(run_dir), "--split", "train"]) == 0


def test_a_fold_that_cannot_be_rebuilt_is_a_data_error(tmp_path, capsys):
    run_dir = _kfold_run(tmp_path)
    shutil.copytree(run_dir / "fold-1", tmp_path / "renamed")
    with pytest.raises(DataError, match=r"renamed: .*but this is not one of its fold directories \(fold-1 .. fold-2\)"):
        load_task(tmp_path / "renamed")
    train = tmp_path / "data" / "toy.train"
    train.write_text(train.read_text().replace("film", "picture"))  # the data changed since training
    assert main(["evaluate", str(run_dir / "fold-2")]) == 2
    assert "fold-2 rebuilt from this data does not give the vocabulary" in capsys.readouterr().err


def _classification_task(tmp_path: Path, *overrides: str, dev_file: bool = True, test_line: str = ""):
    """A classifier on a fresh toy corpus in ``tmp_path`` (``test_line``: one more test example)."""
    from seqzoo.tasks.classification import build_tasks

    write_sentiment_corpus(tmp_path, sizes=(60, 10, 10))
    if not dev_file:
        (tmp_path / "toy.dev").unlink()
    if test_line:
        with open(tmp_path / "toy.test", "a") as f:
            f.write(test_line + "\n")
    vectors = any(o.startswith("data.embeddings=") for o in overrides)  # then they set the size
    config = load_config(
        None,
        [
            "data.name=toy", f"data.data_dir={tmp_path}", *([] if vectors else ["data.embedding_dim=8"]),
            "model.encoder_args={hidden_size: 4, bidirectional: true}", "train.batch_size=4", "train.device=cpu",
            *overrides,
        ],
    )  # fmt: skip
    ((_, task),) = build_tasks(config)
    return task


def test_each_epoch_has_its_own_seeded_shuffle(tmp_path):
    """The batch order is shuffled, differs between epochs, and is a function of (seed, epoch)."""
    from seqzoo.data.batching import bucket_batches

    task = _classification_task(tmp_path)
    lengths = [len(s) for s in task.splits["train"].ids]
    assert task.train_batches(0) != bucket_batches(lengths, 4, shuffle=False)  # shuffled
    assert task.train_batches(0) != task.train_batches(1)  # reshuffled every epoch
    assert task.train_batches(1) == _classification_task(tmp_path).train_batches(1)  # reproducible


def test_max_len_keeps_the_first_max_len_tokens(tmp_path):
    """Data.max_len truncates to exactly max_len tokens (training and plot-hidden alike)."""
    from seqzoo.analysis.hidden import hidden_states

    task = _classification_task(tmp_path, "data.max_len=3")
    lengths = [len(s) for s in task.splits["train"].ids]
    assert max(lengths) == 3
    states = hidden_states(task, "good film plot actor scene")
    assert states.tokens == ["good", "film", "plot"] and states.values.shape[0] == 3


def test_max_train_keeps_the_first_training_examples(tmp_path):
    """data.max_train cuts the training split to its first examples, in file order (the vocabulary is
    built from those alone); dev and test stay whole."""
    whole, capped = _classification_task(tmp_path), _classification_task(tmp_path, "data.max_train=7")

    def texts(task, split: str) -> list[list[str]]:
        return [task.vocab.decode(ids) for ids in task.splits[split].ids]

    assert texts(capped, "train") == texts(whole, "train")[:7]
    assert capped.splits["train"].labels == whole.splits["train"].labels[:7]
    assert len(capped.vocab) < len(whole.vocab)
    assert [len(capped.splits[s].ids) for s in ("dev", "test")] == [len(whole.splits[s].ids) for s in ("dev", "test")]


def test_the_dev_hold_out_follows_the_run_seed(tmp_path):
    """Without a dev file, each seed holds out its own dev set (load_data(cfg, train.seed))."""
    held = []
    for seed in (1, 2):
        task = _classification_task(tmp_path, f"train.seed={seed}", dev_file=False)
        held.append(sorted(map(tuple, task.splits["dev"].ids)))
    assert held[0] != held[1]


def test_accuracy_and_loss_average_over_examples_not_batches():
    """Batches of unequal size: the loss is the mean over all examples."""
    from seqzoo.tasks.common import accuracy_and_loss

    torch.manual_seed(0)
    logits, labels = torch.randn(7, 3), torch.tensor([0, 1, 2, 0, 1, 2, 0])
    batches = [(logits[:5], labels[:5]), (logits[5:], labels[5:])]
    result = accuracy_and_loss(torch.nn.Identity(), iter(batches))
    assert result["loss"] == pytest.approx(F.cross_entropy(logits, labels).item(), rel=1e-6)
    assert result["accuracy"] == pytest.approx((logits.argmax(-1) == labels).float().mean().item())


def test_embedding_vocab_gives_a_word_unseen_in_training_its_pretrained_vector(tmp_path):
    """With ``data.embedding_vocab`` a test word that training never saw but the vector file knows joins the
    vocabulary with its vector (not ``<unk>``); a word the file lacks stays ``<unk>``; without it, both do."""
    vectors = tmp_path / "vectors.txt"
    vectors.write_text("".join(f"{w} {' '.join([str(0.25 * i)] * 8)}\n" for i, w in enumerate(("a", "dazzling"), 1)))
    settings = (f"data.embeddings={vectors}", "data.min_freq=1")
    new = "pos\tdazzling unheardof"
    task = _classification_task(tmp_path / "on", *settings, "data.embedding_vocab=true", test_line=new)
    plain = _classification_task(tmp_path / "off", *settings, test_line=new)
    assert "dazzling" in task.vocab and "unheardof" not in task.vocab and "dazzling" not in plain.vocab
    assert list(task.vocab)[: len(plain.vocab)] == list(plain.vocab)  # the training words keep their ids
    dazzling = task.vocab.token_to_id("dazzling")
    assert torch.equal(task.model.embedding.weight[dazzling].detach(), torch.full((8,), 0.5))
    assert task.splits["test"].ids[-1] == [dazzling, task.vocab.unk_id]
    assert plain.splits["test"].ids[-1] == [plain.vocab.unk_id] * 2


def test_a_fold_trained_with_embedding_vocab_is_rebuilt(tmp_path):
    """Cross-validated with ``data.embedding_vocab``: evaluating a fold rebuilds the vocabulary it trained with,
    which holds a word of its held-out fold through the vector file alone."""
    config = _kfold_config(tmp_path)
    with open(tmp_path / "data" / "toy.train", "a") as f:
        f.write("pos\tzzz\n")
    vectors = tmp_path / "vectors.txt"
    vectors.write_text("".join(f"{w} {' '.join(['0.5'] * 8)}\n" for w in ("film", "zzz")))
    config.data.embeddings, config.data.embedding_vocab = str(vectors), True
    run(config, tmp_path / "kf")
    counts = []
    for fold in ("fold-1", "fold-2"):
        task = load_task(tmp_path / "kf" / fold)
        assert task.evaluate("test")["accuracy"] == _test_record(tmp_path / "kf" / fold)["test_accuracy"]
        counts.append(task.vocab.counts["zzz"])
    assert sorted(counts) == [0, 1]  # in the fold that holds it out, zzz is known through its vector alone
