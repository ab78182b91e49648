"""End-to-end training: the recipe, run directory, NaN handling and exact resume after SIGKILL."""

import io
import itertools
import json
import math
import os
import re
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch
from conftest import killed_run_state, killing_cli, metric_records, without_gpu

from seqzoo.cli import main
from seqzoo.config import load_config
from seqzoo.training.runner import format_summary, run
from seqzoo.training.stats import summarize
from seqzoo.training.task import StepLoss
from seqzoo.training.trainer import Trainer, TrainingError

REPO = Path(__file__).resolve().parents[1]


def _config_yaml(data_dir: Path, tmp_path: Path, **extra: str) -> Path:
    text = textwrap.dedent(f"""\
        name: toy
        output_dir: {tmp_path / "runs"}
        data: {{name: toy, data_dir: {data_dir}, embedding_dim: 16}}
        model: {{encoder: lstm, encoder_args: {{hidden_size: 12, bidirectional: true}}, pooler: mean, dropout: 0.2}}
        optim: {{optimizer: adam, lr: 0.01}}
        train: {{epochs: 3, batch_size: 8, patience: null, checkpoint_every: 10, seed: 3, progress: false}}
        """)
    for key, value in extra.items():
        text += f"{key}: {value}\n"
    path = tmp_path / "toy.yaml"
    path.write_text(text)
    return path


def test_evaluate_summarises_each_run_below_a_folder_apart(toy_corpus, tmp_path, capsys):
    """A folder of runs (one of two seeds) gets one summary per run, not one mean over them all."""
    config = _config_yaml(toy_corpus, tmp_path)
    parent = tmp_path / "runs"
    short = ["--set", "train.epochs=1"]
    assert main(["train", str(config), "--run-dir", str(parent / "a"), *short]) == 0
    assert main(["train", str(config), "--run-dir", str(parent / "b"), *short, "--set", "train.seeds=[1,2]"]) == 0
    capsys.readouterr()
    assert main(["evaluate", str(parent)]) == 0
    lines = capsys.readouterr().out.splitlines()
    evaluated = {json.loads(line)["run"]: json.loads(line)["accuracy"] for line in lines if line.startswith("{")}
    assert sorted(evaluated) == [str(parent / "a"), str(parent / "b" / "seed-1"), str(parent / "b" / "seed-2")]
    b = [evaluated[str(parent / "b" / f"seed-{seed}")] for seed in (1, 2)]
    summaries = [line for line in lines if not line.startswith("{")]
    assert summaries[0] == f"{parent / 'a'}:"
    assert summaries[1] == f"  test_accuracy: {100 * evaluated[str(parent / 'a')]:.2f}% (n=1)"
    assert summaries[3] == f"{parent / 'b'}:"
    assert summaries[4].startswith(f"  test_accuracy: {50 * sum(b):.2f}% ± ") and summaries[4].endswith("(n=2)")


def test_train_evaluate_predict_cli(toy_corpus, tmp_path, capsys, monkeypatch):
    config = _config_yaml(toy_corpus, tmp_path)
    assert main(["train", str(config), "--run-dir", str(tmp_path / "r"), "--set", "train.epochs=4"]) == 0
    run_dir = tmp_path / "r"
    records = metric_records(run_dir)
    assert [r["event"] for r in records] == ["epoch"] * 4 + ["test"]
    assert records[-1]["test_accuracy"] >= 0.8  # the toy task is learnable
    for name in (
        "config.yaml",
        "train.log",
        "summary.json",
        "plots/loss.png",
        "plots/accuracy.png",
        "best/model.safetensors",
        "best/config.json",
        "best/vocab.json",
        "best/labels.json",
        "last/model.safetensors",
        "last/optimizer.safetensors",
    ):
        assert (run_dir / name).exists(), name
    assert not list(run_dir.rglob("*.pt")) and not list(run_dir.rglob("*.pkl"))
    out = capsys.readouterr().out
    accuracy = f"test_accuracy: {100 * records[-1]['test_accuracy']:.2f}% (n=1)"  # one run: no "± 0.00"
    assert [line for line in out.splitlines() if line.startswith("test_accuracy")] == [accuracy]
    assert main(["evaluate", str(run_dir)]) == 0
    out = capsys.readouterr().out
    evaluated = json.loads(out.splitlines()[0])
    assert evaluated["accuracy"] == pytest.approx(records[-1]["test_accuracy"])
    texts = tmp_path / "texts.txt"
    texts.write_text("a superb lovely film\n\n  \nawful boring plot\n")
    assert main(["predict", str(run_dir), "--input", str(texts)]) == 0
    preds = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert [(p["line"], p["label"]) for p in preds] == [(1, "pos"), (4, "neg")]  # blank lines: no record
    preds = [{**p, "line": n} for n, p in enumerate(preds, 1)]  # the inputs below have no blank line
    assert sum(preds[0]["probabilities"].values()) == pytest.approx(1.0)
    for ending in ("\r\n", "\r"):  # Windows and old Mac line endings end lines too
        texts.write_bytes(f"a superb lovely film{ending}awful boring plot{ending}".encode())
        assert main(["predict", str(run_dir), "--input", str(texts)]) == 0
        assert [json.loads(line) for line in capsys.readouterr().out.splitlines()] == preds
    for data, expected in ((b"a superb lovely film\nawful boring plot\n", 0), (b"a superb film\nawful \xff plot\n", 2)):
        monkeypatch.setattr("sys.stdin", io.TextIOWrapper(io.BytesIO(data)))  # `... | seqzoo predict RUN`
        assert main(["predict", str(run_dir)]) == expected
        captured = capsys.readouterr()
        if expected == 0:
            assert [json.loads(line) for line in captured.out.splitlines()] == preds
        else:  # as strict as a file: the line is named, nothing is predicted
            assert "<stdin>:2: invalid UTF-8" in captured.err and not captured.out


def test_multi_seed_summary_reports_mean_and_std(toy_corpus, tmp_path):
    config = load_config(_config_yaml(toy_corpus, tmp_path), ["train.seeds=[1,2]", "train.epochs=1"])
    summary = run(config, tmp_path / "seeds")
    # A finished multi-seed run resumes to the same summary without training again.
    assert main(["train", "--resume", str(tmp_path / "seeds")]) == 0
    assert json.loads((tmp_path / "seeds/summary.json").read_text()) == json.loads(json.dumps(summary))
    acc = summary["metrics"]["test_accuracy"]
    values = [summary["runs"][f"seed-{s}"]["test_accuracy"] for s in (1, 2)]
    assert acc["n"] == 2 and acc["mean"] == pytest.approx(sum(values) / 2)
    assert acc["std"] == pytest.approx(abs(values[0] - values[1]) / 2**0.5)
    # A seed of a multi-seed run is the run that seed gives alone, so both kinds of rows can be pooled.
    run(load_config(_config_yaml(toy_corpus, tmp_path), ["train.seed=2", "train.epochs=1"]), tmp_path / "alone")
    assert metric_records(tmp_path / "seeds/seed-2") == metric_records(tmp_path / "alone")


def test_summary_lines_show_each_metric_at_its_resolution():
    runs = {"seed-1": {"test_accuracy": 0.9052, "test_bpc": 2.2541, "test_tokens": 623500}}
    runs["seed-2"] = {"test_accuracy": 0.9004, "test_bpc": 2.2593, "test_tokens": 623500}
    assert format_summary(summarize(runs)) == [
        "test_accuracy: 90.28% ± 0.34% (n=2)",
        "test_bpc: 2.257 ± 0.004 (n=2)",
        "test_tokens: 623500 ± 0 (n=2)",
    ]
    folds = {"seed-1/fold-1": {"test_examples": 10}, "seed-1/fold-2": {"test_examples": 9}}
    assert format_summary(summarize(folds)) == ["test_examples: 9.500 (n=1)"]  # a fold mean, not "10"


def test_summary_shows_chunk_scores_per_type_as_a_table():
    runs = {
        f"seed-{i}": {
            "test_f1": f1,
            "test_f1_PER": per,
            "test_precision_PER": per,
            "test_recall_PER": per,
            "test_f1_ORG": org,
            "test_precision": f1,
            "test_recall": f1,
        }
        for i, (f1, per, org) in enumerate([(0.9, 0.95, 0.85), (0.8, 0.85, 0.75)], start=1)
    }
    lines = format_summary(summarize(runs))
    assert lines[:3] == [
        "test_f1: 85.00% ± 7.07% (n=2)",
        "test_precision: 85.00% ± 7.07% (n=2)",
        "test_recall: 85.00% ± 7.07% (n=2)",
    ]
    assert lines[3].split() == ["test", "per", "type", "(%,", "n=2):", "precision", "recall", "f1"]
    assert lines[4].split() == ["ORG", "-", "-", "80.00", "±", "7.07"]
    assert lines[5].split() == ["PER", *["90.00", "±", "7.07"] * 3]
    assert lines[6].split() == ["(micro,", "all", "types)", *["85.00", "±", "7.07"] * 3]
    assert len(lines) == 7


def test_step_budget_stops_mid_epoch_after_evaluating(toy_corpus, tmp_path):
    config = load_config(_config_yaml(toy_corpus, tmp_path), ["train.max_steps=45", "train.epochs=5"])
    run(config, tmp_path / "budget")
    records = metric_records(tmp_path / "budget")
    assert [r["event"] for r in records] == ["epoch", "epoch", "test"]  # 30 steps per epoch: stops in epoch 2
    state = json.loads((tmp_path / "budget/last/train_state.json").read_text())["loop"]
    assert state["global_step"] == 45


def test_without_a_progress_bar_the_log_reports_every_log_every_steps(toy_corpus, tmp_path):
    def progress_lines(run_dir: Path) -> list[str]:
        lines = (run_dir / "train.log").read_text().splitlines()
        return [line.split(" ", 2)[2] for line in lines if ", step " in line]  # drop the timestamp

    config = load_config(_config_yaml(toy_corpus, tmp_path), ["train.epochs=2", "train.log_every=12"])
    run(config, tmp_path / "logged")
    lines = progress_lines(tmp_path / "logged")  # 30 steps per epoch: steps 12 and 24 of each
    assert [line.split(":")[0] for line in lines] == [
        "epoch 1, step 12/30",
        "epoch 1, step 24/30",
        "epoch 2, step 12/30",
        "epoch 2, step 24/30",
    ]
    assert all("train loss" in line and "tokens/s" in line for line in lines)
    config = load_config(_config_yaml(toy_corpus, tmp_path), ["train.epochs=1", "train.log_every=null"])
    run(config, tmp_path / "quiet")
    assert progress_lines(tmp_path / "quiet") == []


def test_kfold_when_no_test_split(toy_corpus, tmp_path):
    (toy_corpus / "toy.test").unlink()
    config = load_config(_config_yaml(toy_corpus, tmp_path), ["train.epochs=1", "data.folds=3"])
    summary = run(config, tmp_path / "folds")
    assert sorted(summary["runs"]) == ["fold-1", "fold-2", "fold-3"]
    accuracies = [summary["runs"][f"fold-{k}"]["test_accuracy"] for k in (1, 2, 3)]
    # one seed: one value, the mean over its folds (folds of one seed are no independent samples)
    assert summary["metrics"]["test_accuracy"] == {"mean": pytest.approx(sum(accuracies) / 3), "std": None, "n": 1}


def test_seeds_not_folds_are_the_samples_of_the_spread():
    from seqzoo.training.stats import per_seed

    runs = {f"seed-{s}/fold-{k}": {"test_accuracy": 0.1 * s + 0.01 * k} for s in (1, 2) for k in (1, 2, 3)}
    assert per_seed(runs) == {
        "seed-1": {"test_accuracy": pytest.approx(0.12)},
        "seed-2": {"test_accuracy": pytest.approx(0.22)},
    }
    uneven = {"fold-1": {"a": 1, "b": 2, "note": None}, "fold-2": {"a": 2}}  # e.g. a hand-edited summary
    assert per_seed(uneven) == {".": {"a": 1.5, "b": 2}}
    stats = summarize(runs)["metrics"]["test_accuracy"]
    assert stats["n"] == 2 and stats["mean"] == pytest.approx(0.17) and stats["std"] == pytest.approx(0.1 / 2**0.5)


def test_nan_loss_stops_with_message_and_keeps_checkpoint(toy_corpus, tmp_path, monkeypatch):
    from seqzoo.tasks.classification import ClassificationTask

    original, calls, poison_at = ClassificationTask.train_loss, [], [45]

    def poisoned(self, batch):
        step = original(self, batch)
        calls.append(1)
        return step._replace(loss=step.loss * float("nan")) if len(calls) == poison_at[0] else step

    monkeypatch.setattr(ClassificationTask, "train_loss", poisoned)
    config = load_config(_config_yaml(toy_corpus, tmp_path))
    with pytest.raises(TrainingError, match=r"non-finite loss \(nan\) at epoch 2, batch 15.*last good checkpoint"):
        run(config, tmp_path / "nan")
    last_line = (tmp_path / "nan/train.log").read_text().splitlines()[-1]  # the log says why the run stopped
    assert "stopped: TrainingError: non-finite loss (nan) at epoch 2, batch 15; stopping." in last_line
    state = json.loads((tmp_path / "nan/last/train_state.json").read_text())["loop"]
    assert state["global_step"] == 40  # the checkpoint before the NaN survives
    assert (tmp_path / "nan/best/model.safetensors").exists()
    calls.clear()  # a NaN before the first checkpoint: the message must not point to one
    poison_at[0] = 5
    with pytest.raises(TrainingError, match=r"batch 5; stopping\. No checkpoint was written before it\."):
        run(config, tmp_path / "early")


_KILLER = killing_cli("classification.ClassificationTask")


def test_predict_and_evaluate_give_the_model_its_mode_back(toy_corpus, tmp_path):
    """predict() left a classifier in eval mode (dropout off for any training after it)."""
    from seqzoo.encoders.base import module_mode
    from seqzoo.training.runner import load_task

    run(load_config(_config_yaml(toy_corpus, tmp_path), ["train.epochs=1"]), tmp_path / "r")
    task = load_task(tmp_path / "r")
    task.model.train()
    task.predict(["a superb film"])
    task.evaluate("dev")
    assert task.model.training
    with pytest.raises(RuntimeError), module_mode(task.model, training=False):  # also when the block raises
        raise RuntimeError
    assert all(module.training for module in task.model.modules())


@pytest.mark.parametrize(
    "schedule",
    [[], ["optim.schedule=linear", "optim.warmup_steps=15"], ["train.precision=bf16"]],
    ids=["const", "linear", "bf16"],
)
def test_resume_after_sigkill_reproduces_uninterrupted_run(toy_corpus, tmp_path, schedule):
    config = _config_yaml(toy_corpus, tmp_path)
    env = without_gpu({**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1"})
    base = [sys.executable, "-c", _KILLER, "train", "--set", "train.threads=1"]  # + CONFIG or --resume RUN
    base += [arg for override in ["train.log_every=4", *schedule] for arg in ("--set", override)]
    # 240 examples / batch 8 = 30 batches per epoch; checkpoints every 10 steps.
    # Step 47 is mid-epoch 2, 7 steps after the last checkpoint: that work is lost and redone.
    # The checkpoint (step 10 of epoch 2) falls inside a window of the step records (every 4 steps).
    killed = [*base, str(config), "--run-dir", str(tmp_path / "killed")]
    state = killed_run_state(killed, {**env, "KILL_AT": "47"}, tmp_path / "killed")
    assert (state["epoch"], state["step_in_epoch"]) == (1, 10)
    resumed = subprocess.run(
        [*base, "--resume", str(tmp_path / "killed")], env={**env, "KILL_AT": "0"}, capture_output=True, text=True
    )
    assert resumed.returncode == 0, resumed.stderr
    clean = subprocess.run(
        [*base, str(config), "--run-dir", str(tmp_path / "clean")],
        env={**env, "KILL_AT": "0"},
        capture_output=True,
        text=True,
    )
    assert clean.returncode == 0, clean.stderr
    assert metric_records(tmp_path / "killed") == metric_records(tmp_path / "clean")
    events = [r["event"] for r in metric_records(tmp_path / "clean")]
    assert events == (["step"] * 7 + ["epoch"]) * 3 + ["test"]
    for name in ("best/model.safetensors", "last/model.safetensors"):
        from safetensors.torch import load_file

        a, b = load_file(tmp_path / "killed" / name), load_file(tmp_path / "clean" / name)
        assert all(torch.equal(a[k], b[k]) for k in a), name


def test_resume_after_sigkill_at_the_step_that_spent_the_budget(toy_corpus, tmp_path):
    """The checkpoint of the budget's last step is saved before that epoch's dev evaluation; a run
    killed in between must evaluate the epoch when resumed (it used to find no best/ and fail)."""
    config = _config_yaml(toy_corpus, tmp_path)
    env = without_gpu({**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1"})
    base = [sys.executable, "-c", _KILLER, "train", "--set", "train.threads=1"]  # + CONFIG or --resume RUN
    base += ["--set", "train.max_steps=40"]  # 30 steps per epoch, checkpoints every 10: one at step 40
    killed = [*base, str(config), "--run-dir", str(tmp_path / "killed")]
    # evaluations: epoch 1's dev, then the cut epoch 2's dev
    state = killed_run_state(killed, {**env, "KILL_AT_EVALUATION": "2"}, tmp_path / "killed")
    assert (state["epoch"], state["step_in_epoch"], state["global_step"]) == (1, 10, 40)
    for run_dir, args in ((tmp_path / "killed", ["--resume"]), (tmp_path / "clean", [str(config), "--run-dir"])):
        done = subprocess.run([*base, *args, str(run_dir)], env=env, capture_output=True, text=True)
        assert done.returncode == 0, done.stderr
    assert [r["event"] for r in metric_records(tmp_path / "killed")] == ["epoch", "epoch", "test"]
    assert metric_records(tmp_path / "killed") == metric_records(tmp_path / "clean")


def test_resume_with_a_larger_step_budget_needs_epochs_left(toy_corpus, tmp_path, caplog):
    """An epoch the budget cut short counts as done: a larger budget alone trains nothing and says why."""
    config = str(_config_yaml(toy_corpus, tmp_path))
    run_dir = tmp_path / "r"
    assert (
        main(["train", config, "--run-dir", str(run_dir), "--set", "train.epochs=1", "--set", "train.max_steps=20"])
        == 0
    )
    before = (run_dir / "metrics.jsonl").read_text()
    with caplog.at_level("INFO", logger="seqzoo"):
        assert main(["train", "--resume", str(run_dir), "--set", "train.max_steps=40"]) == 0
    assert (run_dir / "metrics.jsonl").read_text() == before
    assert "all epochs are done (1 of train.epochs 1)" in caplog.text
    assert main(["train", "--resume", str(run_dir), "--set", "train.max_steps=40", "--set", "train.epochs=2"]) == 0
    assert [r["event"] for r in metric_records(run_dir)] == ["epoch", "epoch", "test"]
    state = json.loads((run_dir / "last/train_state.json").read_text())["loop"]
    assert (state["epoch"], state["global_step"]) == (2, 40)


def test_resume_refuses_changes_to_what_the_checkpoints_were_trained_with(toy_corpus, tmp_path, capsys):
    config = str(_config_yaml(toy_corpus, tmp_path))
    run_dir = tmp_path / "r"
    assert main(["train", config, "--run-dir", str(run_dir), "--set", "train.epochs=1"]) == 0
    stored = (run_dir / "config.yaml").read_text()
    capsys.readouterr()
    assert main(["train", "--resume", str(run_dir), "--set", "model.encoder_args.hidden_size=32"]) == 2
    assert "--resume cannot change model.encoder_args.hidden_size (12 -> 32)" in capsys.readouterr().err
    # the optimiser's settings live in its restored state: they were kept silently, or (another optimiser) crashed
    for key, value in (("optim.lr", "0.5"), ("optim.weight_decay", "0.1"), ("optim.optimizer", "sgd")):
        assert main(["train", "--resume", str(run_dir), "--set", "train.epochs=2", "--set", f"{key}={value}"]) == 2
        assert f"{key} (" in capsys.readouterr().err.split("--resume cannot change ")[1]
    assert (run_dir / "config.yaml").read_text() == stored  # the run can still be resumed as it was
    assert main(["train", config, "--run-dir", str(run_dir)]) == 2  # a new run may not mix into it
    assert "holds a trained run" in capsys.readouterr().err
    for seeds in ("[3,4]", "[4]"):  # the run trained seed 3 alone, in its root directory
        assert main(["train", "--resume", str(run_dir), "--set", f"train.seeds={seeds}"]) == 2
        assert "can only add seeds to a run of several" in capsys.readouterr().err
    data = tmp_path / "moved"
    shutil.copytree(toy_corpus, data)
    shutil.rmtree(toy_corpus)
    assert main(["train", "--resume", str(run_dir), "--set", f"data.data_dir={data}"]) == 0  # the data may move
    assert main(["evaluate", str(run_dir)]) == 0  # and the trained model follows it


def test_a_run_that_failed_before_training_can_start_again(toy_corpus, tmp_path):
    config = str(_config_yaml(toy_corpus, tmp_path))
    run_dir = tmp_path / "r"
    assert main(["train", config, "--run-dir", str(run_dir), "--set", f"data.data_dir={tmp_path / 'typo'}"]) == 2
    assert not run_dir.exists()  # a run that failed before it trained leaves no directory behind
    assert main(["train", config, "--run-dir", str(run_dir), "--set", "train.epochs=1"]) == 0


def test_a_metrics_line_cut_short_is_no_record(tmp_path):
    from seqzoo.data.errors import DataError
    from seqzoo.training.runner import completed_test_record

    path = tmp_path / "metrics.jsonl"
    path.write_text('{"event": "epoch"}\n{"event": "te')  # SIGKILL while writing the test record
    assert completed_test_record(tmp_path) is None
    path.write_text('{"event": "ep\n{"event": "test"}\n')
    with pytest.raises(DataError, match=r"metrics.jsonl:1: invalid JSON"):
        completed_test_record(tmp_path)


def test_model_arguments_the_encoder_refuses_are_config_errors(toy_corpus, tmp_path, capsys, monkeypatch):
    config = str(_config_yaml(toy_corpus, tmp_path))
    for number, (override, message) in enumerate(
        (
            ("model.encoder=nope", "model: unknown encoder 'nope'"),
            ("model.encoder_args.bogus=1", "model: encoder 'lstm' takes no argument bogus (it takes hidden_size, "),
            ("model.encoder_args.num_layers=0", "model: num_layers must be"),
            ("model.encoder=transformer", "model: the Transformer has no bidirectional option"),
            ("model.encoder_args.hidden_size=abc", "model: encoder 'lstm': hidden_size must be int, got 'abc'"),
            ("model.encoder_args.hidden_size=2.5", "model: encoder 'lstm': hidden_size must be int, got 2.5"),
            ("model.encoder_args.bidirectional=1", "model: encoder 'lstm': bidirectional must be bool, got 1"),
            ("model.encoder_args.input_size=5", "model: encoder_args may not set input_size (the recipe sets it to "),
            ("model.encoder_args.name=x", "model: encoder 'lstm' takes no argument name"),
        )
    ):
        assert main(["train", config, "--run-dir", str(tmp_path / str(number)), "--set", override]) == 2
        assert message in capsys.readouterr().err

    def buggy_pooler(*args, **kwargs):
        raise KeyError("a bug")

    monkeypatch.setattr("seqzoo.tasks.classification.build_pooler", buggy_pooler)
    with pytest.raises(KeyError, match="a bug"):  # a bug keeps its traceback: it is no config error
        main(["train", config, "--run-dir", str(tmp_path / "bug")])


def test_resume_with_a_larger_epoch_budget_trains_on(toy_corpus, tmp_path, capsys):
    """`--resume RUN --set train.epochs=N` extends a finished run; it used to print the old summary."""
    config = str(_config_yaml(toy_corpus, tmp_path))  # 3 epochs
    short, clean = tmp_path / "short", tmp_path / "clean"
    assert main(["train", config, "--run-dir", str(short), "--set", "train.epochs=1"]) == 0
    assert [r["event"] for r in metric_records(short)] == ["epoch", "test"]
    for extra in ([config], ["--run-dir", str(clean)]):  # a resumed run keeps its own config and directory
        assert main(["train", *extra, "--resume", str(short), "--set", "train.epochs=3"]) == 2
        assert "with its stored config.yaml" in capsys.readouterr().err
    assert main(["train", "--resume", str(short), "--set", "train.epochs=3"]) == 0
    assert main(["train", config, "--run-dir", str(clean)]) == 0
    assert [r["event"] for r in metric_records(short)] == ["epoch"] * 3 + ["test"]
    assert metric_records(short) == metric_records(clean)
    # Resuming it again under the budget it has reached trains nothing.
    before = (short / "metrics.jsonl").read_text()
    assert main(["train", "--resume", str(short)]) == 0
    assert (short / "metrics.jsonl").read_text() == before


def test_resume_with_early_stopping_relaxed_trains_on(toy_corpus, tmp_path, monkeypatch):
    """An early-stopped run resumed with ``train.patience=null`` goes on as if it had never stopped."""
    from seqzoo.tasks.classification import ClassificationTask

    original = ClassificationTask.evaluate

    def flat_dev(self, split):  # dev accuracy never improves after epoch 1
        metrics = original(self, split)
        return metrics | {"accuracy": 0.5} if split == "dev" else metrics

    monkeypatch.setattr(ClassificationTask, "evaluate", flat_dev)
    config = str(_config_yaml(toy_corpus, tmp_path))  # 3 epochs, patience null
    stopped, clean = tmp_path / "stopped", tmp_path / "clean"
    assert main(["train", config, "--run-dir", str(stopped), "--set", "train.patience=1"]) == 0  # stops after 2
    assert [r["event"] for r in metric_records(stopped)] == ["epoch", "epoch", "test"]
    before = (stopped / "metrics.jsonl").read_text()
    assert main(["train", "--resume", str(stopped)]) == 0  # the same rule still stops it
    assert (stopped / "metrics.jsonl").read_text() == before
    path = stopped / "last/train_state.json"  # runs written before stopping followed the config had a flag
    doc = json.loads(path.read_text())
    path.write_text(json.dumps(doc | {"loop": doc["loop"] | {"done": True}}))
    assert main(["train", "--resume", str(stopped), "--set", "train.patience=null"]) == 0
    assert main(["train", config, "--run-dir", str(clean)]) == 0
    assert [r["event"] for r in metric_records(stopped)] == ["epoch"] * 3 + ["test"]
    assert metric_records(stopped) == metric_records(clean)


def test_resume_after_losing_the_tail_of_metrics_keeps_whole_records_and_pads_nothing(toy_corpus, tmp_path, caplog):
    """metrics.jsonl shorter than the checkpoint recorded (its tail lost in a crash): truncate() padded
    it with NUL bytes up to the recorded size, and every later read of the run failed."""
    config = str(_config_yaml(toy_corpus, tmp_path))
    run_dir = tmp_path / "r"
    assert main(["train", config, "--run-dir", str(run_dir), "--set", "train.epochs=2"]) == 0
    path = run_dir / "metrics.jsonl"
    lines = path.read_text().splitlines(keepends=True)
    path.write_text("".join(lines[:-2]) + lines[-2][:20])  # the test record and half the last epoch's are lost
    assert main(["train", "--resume", str(run_dir), "--set", "train.epochs=3"]) == 0
    assert "is shorter than its checkpoint recorded" in caplog.text
    assert b"\0" not in path.read_bytes()
    assert [r["event"] for r in metric_records(run_dir)] == ["epoch", "epoch", "test"]  # epoch 2's record is gone


def test_resume_rejects_loop_state_of_another_version(toy_corpus, tmp_path):
    config = load_config(_config_yaml(toy_corpus, tmp_path), ["train.epochs=1"])
    run(config, tmp_path / "r")
    path = tmp_path / "r/last/train_state.json"
    doc = json.loads(path.read_text())
    doc["loop"]["loss_tokens"] = doc["loop"].pop("loss_count")  # the key's name before it was renamed
    path.write_text(json.dumps(doc))
    (tmp_path / "r/metrics.jsonl").write_text("")  # not finished, so resume trains
    with pytest.raises(
        TrainingError,
        match=r"train_state.json: loop state from another seqzoo version "
        r"\(missing \['loss_count'\], unknown \['loss_tokens'\]\)",
    ):
        run(config, tmp_path / "r", resume=True)


@pytest.mark.parametrize("damage", ["empty_state", "loop_not_object", "missing_tensor", "no_torch_rng"])
def test_resume_from_a_damaged_checkpoint_names_the_file(toy_corpus, tmp_path, capsys, damage):
    """A hand-edited or damaged last/ checkpoint was a raw KeyError; now the CLI names the file."""
    from safetensors.torch import load_file, save_file

    config = load_config(_config_yaml(toy_corpus, tmp_path), ["train.epochs=1"])
    run(config, tmp_path / "r")
    last = tmp_path / "r/last"
    (tmp_path / "r/metrics.jsonl").write_text("")  # not finished, so resume reads the checkpoint
    state = last / "train_state.json"
    if damage == "empty_state":
        state.write_text("{}")
        expected = r"train_state.json: not a seqzoo training state \(missing \['loop', 'optimizer'"
    elif damage == "loop_not_object":
        state.write_text(json.dumps(json.loads(state.read_text()) | {"loop": []}))
        expected = r"train_state.json: not a seqzoo training state \('loop' is not an object\)"
    elif damage == "missing_tensor":
        tensors = load_file(str(last / "optimizer.safetensors"))
        tensors.pop(sorted(tensors)[0])
        save_file(tensors, str(last / "optimizer.safetensors"))
        expected = r"optimizer.safetensors: no tensor '.+' that train_state.json refers to"
    else:
        save_file({"other": torch.zeros(1)}, str(last / "rng.safetensors"))
        expected = r"rng.safetensors: no 'torch' generator state in it"
    assert main(["train", "--resume", str(tmp_path / "r")]) == 2
    assert re.search(expected, capsys.readouterr().err)


class _ScriptedDev:
    """A task whose dev metric (lower is better) follows a script, one value per epoch."""

    metric, higher_is_better = "ppl", False

    def __init__(self, dev: list[float]) -> None:
        self.model, self.dev = torch.nn.Linear(2, 1), iter(dev)

    def train_batches(self, epoch: int) -> list[int]:
        return [0, 1]

    def train_loss(self, batch: int) -> StepLoss:
        return StepLoss(self.model(torch.ones(1, 2)).square().mean(), 1, 1)

    def evaluate(self, split: str) -> dict[str, float]:
        return {"ppl": next(self.dev) if split == "dev" else 1.0}

    def documents(self) -> dict:
        return {}


def _fit(tmp_path: Path, dev: list[float], *overrides: str) -> list[dict]:
    """Train a _ScriptedDev for one epoch per dev value; its epoch records."""
    base = ["train.progress=false", "train.checkpoint_every=0", "train.log_every=null", "optim.lr=0.1"]
    config = load_config(None, [*base, f"train.epochs={len(dev)}", *overrides])
    Trainer(config, _ScriptedDev(dev), tmp_path / "r").fit()
    return [r for r in metric_records(tmp_path / "r") if r["event"] == "epoch"]


def test_a_nan_dev_metric_is_beaten_by_any_number(tmp_path):
    """A NaN dev metric in epoch 1 became the best for good (every comparison with NaN is False):
    best/ stayed at epoch 1 and patience counted every later epoch as bad."""
    records = _fit(tmp_path, [math.nan, 300.0, 200.0, 100.0], "train.patience=2")
    assert [r["epoch"] for r in records] == [1, 2, 3, 4]  # no early stop after epoch 3
    assert metric_records(tmp_path / "r")[-1]["best_epoch"] == 4


def test_evaluate_run_trained_with_pretrained_vectors_of_another_size(toy_corpus, tmp_path, capsys):
    """The model's embedding size comes from the vector file, and reloading must follow it."""
    from conftest import NEGATIVE, NEUTRAL, POSITIVE

    vectors = tmp_path / "vec.txt"
    vectors.write_text("".join(f"{w} " + " ".join(["0.1"] * 6) + "\n" for w in POSITIVE + NEGATIVE + NEUTRAL))
    config = _config_yaml(toy_corpus, tmp_path)
    args = ["--set", f"data.embeddings={vectors}", "--set", "train.epochs=1"]
    assert main(["train", str(config), "--run-dir", str(tmp_path / "v"), *args]) == 0
    capsys.readouterr()
    assert main(["evaluate", str(tmp_path / "v")]) == 0
    evaluated = json.loads(capsys.readouterr().out.splitlines()[0])
    assert evaluated["accuracy"] == metric_records(tmp_path / "v")[-1]["test_accuracy"]


def test_update_returns_the_gradient_norm_before_clipping():
    from seqzoo.training.optim import update

    torch.manual_seed(0)
    model = torch.nn.Linear(4, 3)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.0)  # lr 0: weights stay, grads remain
    x = torch.randn(5, 4)
    norm = update(model, optimizer, (100 * model(x)).pow(2).sum(), clip_norm=1.0)
    model.zero_grad()
    (100 * model(x)).pow(2).sum().backward()
    expected = torch.cat([p.grad.flatten() for p in model.parameters()]).norm()
    assert norm == pytest.approx(expected.item(), rel=1e-5) and norm > 1.0
    assert update(model, optimizer, model(x).sum(), clip_norm=None) is None


def test_scheduled_lr_warms_up_then_decays_to_min_lr():
    from seqzoo.config import OptimConfig
    from seqzoo.training.optim import scheduled_lr

    def lrs(total: int = 14, **kwargs) -> list[float]:
        cfg = OptimConfig(lr=1.0, **kwargs)
        return [scheduled_lr(cfg, cfg.lr, step, total) for step in range(total)]

    # Warm-up over 4 steps, then linear decay over the other 10 towards min_lr (reached at step 14).
    linear = lrs(schedule="linear", warmup_steps=4, min_lr=0.1)
    assert linear[:5] == pytest.approx([0.25, 0.5, 0.75, 1.0, 1.0])
    assert linear[4:] == pytest.approx([0.1 + 0.9 * (10 - k) / 10 for k in range(10)])
    cosine = lrs(schedule="cosine")
    assert cosine == pytest.approx([0.5 * (1 + math.cos(math.pi * k / 14)) for k in range(14)])
    assert cosine[7] == pytest.approx(0.5) and all(a > b for a, b in itertools.pairwise(cosine))
    # Epoch schedules keep the epoch's rate at every step; the warm-up applies to them too.
    assert lrs(schedule="plateau") == [1.0] * 14
    assert lrs(schedule="exponential", warmup_steps=2)[:3] == [0.5, 1.0, 1.0]


@pytest.mark.parametrize(
    ("overrides", "total"),
    [
        (["optim.schedule=linear", "optim.warmup_steps=5"], 60),  # 2 epochs of 30 steps
        (["optim.schedule=cosine", "train.max_steps=45"], 45),  # the step budget ends the run first
        (["optim.schedule=exponential", "optim.warmup_steps=5"], 60),
    ],
)
def test_trainer_sets_the_scheduled_lr_at_every_step(toy_corpus, tmp_path, monkeypatch, overrides, total):
    from seqzoo.training import trainer as training
    from seqzoo.training.optim import scheduled_lr

    used, original = [], training.update
    monkeypatch.setattr(
        training, "update", lambda model, opt, *a: used.append(opt.param_groups[0]["lr"]) or original(model, opt, *a)
    )
    config = load_config(_config_yaml(toy_corpus, tmp_path), ["train.epochs=2", *overrides])
    run(config, tmp_path / "scheduled")
    cfg = config.optim
    epoch_lr = [cfg.lr * (cfg.decay if cfg.schedule == "exponential" and step >= 30 else 1) for step in range(total)]
    assert used == pytest.approx([scheduled_lr(cfg, epoch_lr[s], s, total) for s in range(total)])
    if cfg.schedule == "exponential":
        assert used[-1] == pytest.approx(cfg.lr * cfg.decay)
    else:  # the step schedules end near min_lr (0)
        assert used[-1] < 0.05 * cfg.lr
    assert used[0] == pytest.approx(cfg.lr / cfg.warmup_steps if cfg.warmup_steps else cfg.lr)
    epochs = [r for r in metric_records(tmp_path / "scheduled") if r["event"] == "epoch"]
    assert [r["lr"] for r in epochs] == pytest.approx([used[29], used[-1]])


PLUGIN = """
import torch
from seqzoo import Encoder, register_encoder


@register_encoder("toy_plugin_linear")
class ToyLinear(Encoder):
    def __init__(self, input_size: int, hidden_size: int) -> None:
        super().__init__(input_size, hidden_size)
        self.linear = torch.nn.Linear(input_size, hidden_size)

    def forward(self, x, mask=None, state=None):
        mask = self.check_input(x, mask)
        return torch.tanh(self.linear(x)) * mask.unsqueeze(-1), None
"""


def test_an_encoder_of_your_own_through_the_command_line(toy_corpus, tmp_path, capsys, monkeypatch):
    """`seqzoo --import MODULE` makes a user's registered encoder usable by every command: a run
    trained with it can be evaluated and served; without the import the error says how."""
    (tmp_path / "toy_plugin_module.py").write_text(PLUGIN)
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr("sys.path", [p for p in sys.path if p not in ("", str(tmp_path))])
    config, run_dir = str(_config_yaml(toy_corpus, tmp_path)), str(tmp_path / "own")
    overrides = ["--set", "model.encoder=toy_plugin_linear", "--set", "model.encoder_args={hidden_size: 6}"]
    assert main(["train", config, "--run-dir", run_dir, "--set", "train.epochs=1", *overrides]) == 2
    assert "unknown encoder 'toy_plugin_linear'" in (err := capsys.readouterr().err) and "--import MODULE" in err
    plugin = ["--import", "toy_plugin_module", "--threads", str(torch.get_num_threads())]
    assert main([*plugin, "train", config, "--run-dir", run_dir, "--set", "train.epochs=1", *overrides]) == 0
    assert main([*plugin, "evaluate", run_dir]) == 0
    monkeypatch.setattr("sys.stdin", io.TextIOWrapper(io.BytesIO(b"a superb lovely film\n")))
    capsys.readouterr()
    assert main([*plugin, "predict", run_dir]) == 0
    assert json.loads(capsys.readouterr().out)["label"] in ("pos", "neg")
    assert main(["--import", "no_such_module_here", "evaluate", run_dir]) == 2
    assert "--import no_such_module_here: No module named" in capsys.readouterr().err
    assert main(["--threads", "0", "evaluate", run_dir]) == 2


def test_a_run_whose_data_moved_is_evaluated_where_the_data_lies_now(toy_corpus, tmp_path, capsys):
    config, run_dir = str(_config_yaml(toy_corpus, tmp_path)), tmp_path / "moved"
    assert main(["train", config, "--run-dir", str(run_dir), "--set", "train.epochs=1"]) == 0
    trained = next(r for r in metric_records(run_dir) if r["event"] == "test")["test_accuracy"]
    shutil.move(toy_corpus, tmp_path / "elsewhere")
    capsys.readouterr()
    assert main(["evaluate", str(run_dir)]) == 2
    assert str(toy_corpus) in capsys.readouterr().err  # the old place is named
    assert main(["evaluate", str(run_dir), "--set", f"data.data_dir={tmp_path / 'elsewhere'}"]) == 0
    assert json.loads(capsys.readouterr().out.splitlines()[0])["accuracy"] == pytest.approx(trained)
    assert main(["evaluate", str(run_dir), "--set", "model.dropout=0.0"]) == 2  # not a data path
    assert "a trained run can only be pointed at its data" in capsys.readouterr().err


def test_a_checkpoint_whose_config_was_edited_is_a_clear_error(toy_corpus, tmp_path, capsys):
    config, run_dir = str(_config_yaml(toy_corpus, tmp_path)), tmp_path / "edited"
    assert main(["train", config, "--run-dir", str(run_dir), "--set", "train.epochs=1"]) == 0
    stored = run_dir / "best/config.json"
    values = json.loads(stored.read_text())
    values["model"]["encoder_args"]["hidden_size"] = 14  # trained with 12
    stored.write_text(json.dumps(values))
    capsys.readouterr()
    assert main(["evaluate", str(run_dir)]) == 2
    err = capsys.readouterr().err
    assert "best/config.json: describes a model whose weights do not fit model.safetensors (encoder." in err


def test_train_device_is_checked_and_a_missing_gpu_is_a_clear_error(toy_corpus, tmp_path, capsys):
    from seqzoo.config import ConfigError, TrainConfig
    from seqzoo.training.devices import resolve_device

    for bad in ("gpu", "cuda:", "CPU", "mps"):
        with pytest.raises(ConfigError, match="device: must be auto, cpu, cuda or cuda:N"):
            TrainConfig(device=bad)
    assert resolve_device("cpu") == torch.device("cpu")
    assert resolve_device("auto").type == ("cuda" if torch.cuda.is_available() else "cpu")
    config = _config_yaml(toy_corpus, tmp_path)
    run_dir = tmp_path / "r"
    cpu = ["--set", "train.device=cpu", "--set", "train.epochs=1"]
    assert main(["train", str(config), "--run-dir", str(run_dir), *cpu]) == 0
    assert "training on cpu" in (run_dir / "train.log").read_text()
    capsys.readouterr()
    assert main(["evaluate", str(run_dir), "--set", "train.device=cpu"]) == 0  # a device may be named on reloading
    if torch.cuda.is_available():
        return
    assert main(["evaluate", str(run_dir), "--set", "train.device=cuda:0"]) == 2
    err = capsys.readouterr().err
    assert "train.device is 'cuda:0' but torch sees 0 CUDA device(s) here; run with --set train.device=cpu" in err
    assert main(["train", str(config), "--run-dir", str(tmp_path / "gpu"), "--set", "train.device=cuda"]) == 2


def test_the_console_log_follows_stderr_from_call_to_call(toy_corpus, tmp_path):
    """`main` called twice in one process with stderr redirected in between (pytest, notebooks,
    contextlib.redirect_stderr) logs to the stderr of each call; it kept writing to the first
    call's stream, and failed ("--- Logging error ---") once that stream was closed."""
    import contextlib

    config = _config_yaml(toy_corpus, tmp_path)
    streams = []
    for name in ("first", "second"):
        with contextlib.redirect_stderr(io.StringIO()) as stream:
            assert main(["train", str(config), "--run-dir", str(tmp_path / name), "--set", "train.epochs=1"]) == 0
        streams.append(stream.getvalue())
        stream.close()
    for name, text in zip(("first", "second"), streams, strict=True):
        assert f"-> {tmp_path / name}" in text and "test accuracy" in text
        assert "Logging error" not in text


def test_epoch_time_leaves_out_checkpoint_writes(toy_corpus, tmp_path, monkeypatch):
    """An epoch's ``seconds`` and ``tokens_per_s`` count its training steps; the checkpoint
    writes within it (every ``train.checkpoint_every`` steps) are ``checkpoint_seconds``. A clock
    that jumps 100 s in each mid-epoch write tells the two apart."""
    import time

    jumps, real_clock, save = [0.0], time.perf_counter, Trainer._save_last

    def slow_save(self):
        save(self)
        jumps[0] += 100.0

    monkeypatch.setattr(time, "perf_counter", lambda: real_clock() + jumps[0])
    monkeypatch.setattr(Trainer, "_save_last", slow_save)
    config = _config_yaml(toy_corpus, tmp_path)  # 30 batches per epoch, checkpoint_every 10
    assert main(["train", str(config), "--run-dir", str(tmp_path / "r"), "--set", "train.epochs=1"]) == 0
    epoch = json.loads((tmp_path / "r/metrics.jsonl").read_text().splitlines()[0])
    assert epoch["checkpoint_seconds"] >= 300  # three writes, at steps 10, 20 and 30
    assert epoch["seconds"] < 100 and epoch["tokens_per_s"] > 0


def test_train_precision_is_checked_and_fp16_needs_a_gpu(toy_corpus, tmp_path, capsys):
    from seqzoo.config import ConfigError
    from seqzoo.training.devices import check_precision

    config = _config_yaml(toy_corpus, tmp_path)
    with pytest.raises(ConfigError, match=r"train\.precision: 'fp64' is not one of 'fp32', 'bf16', 'fp16'"):
        load_config(config, ["train.precision=fp64"])
    assert check_precision("fp32", torch.device("cpu")) is None
    assert check_precision("bf16", torch.device("cpu")) == torch.bfloat16
    with pytest.raises(ConfigError, match=r"train\.precision fp16 needs a GPU, not cpu; on the CPU use bf16"):
        check_precision("fp16", torch.device("cpu"))
    assert main(["train", str(config), "--run-dir", str(tmp_path / "r"), "--set", "train.precision=fp16"]) == 2
    assert "train.precision fp16 needs a GPU" in capsys.readouterr().err


def test_bf16_training_steps_run_under_autocast_and_evaluation_in_float32(toy_corpus, tmp_path, monkeypatch):
    """``train.precision: bf16`` puts each training step's forward pass under CPU autocast (the
    LSTM's matmuls run in bfloat16) and leaves evaluation in float32; the run learns the toy task
    about as well as in float32."""
    from seqzoo.tasks.classification import ClassificationTask

    seen: dict[str, set] = {"train_loss": set(), "evaluate": set()}
    for name in seen:
        original = getattr(ClassificationTask, name)

        def spy(self, *args, _name=name, _original=original):
            on = torch.is_autocast_enabled("cpu")
            seen[_name].add(torch.get_autocast_dtype("cpu") if on else None)
            return _original(self, *args)

        monkeypatch.setattr(ClassificationTask, name, spy)
    config = _config_yaml(toy_corpus, tmp_path)
    for precision in ("fp32", "bf16"):
        args = ["--set", f"train.precision={precision}", "--set", "train.epochs=4"]
        assert main(["train", str(config), "--run-dir", str(tmp_path / precision), *args]) == 0
    assert seen == {"train_loss": {None, torch.bfloat16}, "evaluate": {None}}
    assert "training on cpu, mixed precision bf16 (autocast)" in (tmp_path / "bf16/train.log").read_text()
    fp32, bf16 = metric_records(tmp_path / "fp32"), metric_records(tmp_path / "bf16")
    assert fp32[-1]["test_accuracy"] > 0.9 and bf16[-1]["test_accuracy"] > 0.9
    assert bf16[3]["train_loss"] != fp32[3]["train_loss"]  # bfloat16 did run
    assert bf16[3]["train_loss"] == pytest.approx(fp32[3]["train_loss"], abs=0.05)


def test_update_with_a_grad_scaler_clips_the_unscaled_gradients_and_skips_overflows():
    from seqzoo.training.optim import update

    torch.manual_seed(0)
    x = torch.randn(5, 4)
    plain = torch.nn.Linear(4, 3)
    scaled = torch.nn.Linear(4, 3)
    scaled.load_state_dict(plain.state_dict())
    scaler = torch.amp.GradScaler("cpu", init_scale=2.0**12)
    optimizers = [torch.optim.SGD(m.parameters(), lr=0.1) for m in (plain, scaled)]
    norm = update(plain, optimizers[0], (10 * plain(x)).pow(2).sum(), clip_norm=1.0)
    scaled_norm = update(scaled, optimizers[1], (10 * scaled(x)).pow(2).sum(), clip_norm=1.0, scaler=scaler)
    assert scaled_norm == pytest.approx(norm, rel=1e-6) and norm > 1.0  # the norm of the unscaled gradients
    for a, b in zip(plain.parameters(), scaled.parameters(), strict=True):
        torch.testing.assert_close(a, b)
    before = [p.detach().clone() for p in scaled.parameters()]
    update(scaled, optimizers[1], scaled(x).sum() * float("inf"), clip_norm=1.0, scaler=scaler)
    assert all(torch.equal(a, b) for a, b in zip(before, scaled.parameters(), strict=True))  # step skipped
    assert scaler.get_scale() == 2.0**11  # and the scale halved


def test_fp16_loss_scale_is_checkpointed_and_restored_on_resume(toy_corpus, tmp_path, monkeypatch):
    """The fp16 loss scale is part of ``last/``; a resumed run goes on from it, not from a fresh
    scale. fp16 is GPU-only, so on the CPU the precision check is lifted for a GRU (oneDNN has
    float16 GRUs on the CPU, not LSTMs); the GPU test runs it unpatched."""
    from seqzoo.training import trainer as training
    from seqzoo.training.devices import PRECISIONS

    monkeypatch.setattr(training, "check_precision", lambda precision, device: PRECISIONS[precision])
    loaded = []
    original = torch.amp.GradScaler.load_state_dict
    monkeypatch.setattr(torch.amp.GradScaler, "load_state_dict", lambda self, s: (loaded.append(s), original(self, s)))
    config = _config_yaml(toy_corpus, tmp_path)
    run_dir = tmp_path / "r"
    args = ["--set", "train.precision=fp16", "--set", "model.encoder=gru", "--set", "train.epochs=1"]
    assert main(["train", str(config), "--run-dir", str(run_dir), *args]) == 0
    doc = json.loads((run_dir / "last/train_state.json").read_text())
    assert (
        doc["grad_scaler"]["scale"] == 65536.0 and doc["grad_scaler"]["_growth_tracker"] == 30
    )  # 30 steps, no overflow
    doc["grad_scaler"]["scale"] = 1024.0
    (run_dir / "last/train_state.json").write_text(json.dumps(doc))
    assert main(["train", "--resume", str(run_dir), "--set", "train.epochs=2"]) == 0
    assert [s["scale"] for s in loaded] == [1024.0]
    assert json.loads((run_dir / "last/train_state.json").read_text())["grad_scaler"]["scale"] == 1024.0


def test_clipping_bounds_the_update_that_the_optimiser_applies():
    """Clip_grad_norm_ must actually rescale the gradients the step uses (not only report the norm)."""
    from seqzoo.training.optim import update

    torch.manual_seed(0)
    model = torch.nn.Linear(4, 3)
    before = [p.detach().clone() for p in model.parameters()]
    optimizer = torch.optim.SGD(model.parameters(), lr=1.0)
    norm = update(model, optimizer, (100 * model(torch.randn(5, 4))).pow(2).sum(), clip_norm=0.5)
    step = torch.cat([(b - p.detach()).flatten() for b, p in zip(before, model.parameters(), strict=True)])
    assert norm > 0.5
    assert step.norm().item() == pytest.approx(0.5, rel=1e-4)  # SGD, lr 1: the step is the clipped gradient


def test_plateau_schedule_decays_only_after_an_epoch_without_improvement(tmp_path):
    """Plateau decays after a bad epoch (epoch 3), not after the improving ones."""
    records = _fit(tmp_path, [3.0, 2.0, 2.5, 1.0], "optim.schedule=plateau", "optim.decay=0.5")
    assert [r["lr"] for r in records] == pytest.approx([0.1, 0.1, 0.1, 0.05])


def test_step_after_runs_the_first_decay_start_epochs_at_the_full_rate(tmp_path):
    """With decay_start 2, epochs 1-2 run at lr, epoch 3 at lr*decay, epoch 4 at lr*decay²."""
    overrides = ("optim.schedule=step_after", "optim.decay_start=2", "optim.decay=0.5")
    records = _fit(tmp_path, [4.0, 3.0, 2.0, 1.0], *overrides)
    assert [r["lr"] for r in records] == pytest.approx([0.1, 0.1, 0.05, 0.025])


def test_epoch_decay_stops_at_min_lr(tmp_path):
    """An epoch schedule never takes the rate below optim.min_lr."""
    overrides = ("optim.schedule=exponential", "optim.decay=0.5", "optim.min_lr=0.03")
    records = _fit(tmp_path, [4.0, 3.0, 2.0, 1.0], *overrides)
    assert [r["lr"] for r in records] == pytest.approx([0.1, 0.05, 0.03, 0.03])


def test_an_improvement_resets_the_early_stopping_count(tmp_path):
    """Patience counts epochs *in a row* without a gain: bad, gain, bad, bad stops after epoch 5."""
    records = _fit(tmp_path, [1.0, 2.0, 0.5, 0.6, 0.7, 0.8], "train.patience=2")
    assert [r["epoch"] for r in records] == [1, 2, 3, 4, 5]
    assert metric_records(tmp_path / "r")[-1]["best_epoch"] == 3


def test_per_seed_averages_each_metric_over_the_runs_that_have_it():
    """A metric missing from one fold is averaged over the folds that report it."""
    from seqzoo.training.stats import per_seed

    runs = {"fold-1": {"a": 1.0, "b": 2.0}, "fold-2": {"a": 2.0, "b": 4.0}, "fold-3": {"a": 3.0}}
    assert per_seed(runs) == {".": {"a": pytest.approx(2.0), "b": pytest.approx(3.0)}}


def test_global_threads_option_sets_torch_threads(monkeypatch, tmp_path, capsys):
    """``seqzoo --threads N`` sets torch's thread count for the command."""
    threads = torch.get_num_threads()
    want = 3 if threads != 3 else 2
    seen = []
    monkeypatch.setattr("seqzoo.cli._compare", lambda args: seen.append(torch.get_num_threads()) or 0)
    try:
        assert main(["--threads", str(want), "compare", "a", "b"]) == 0
    finally:
        torch.set_num_threads(threads)
    assert seen == [want]


def test_a_file_system_without_locks_trains_unguarded_with_a_warning(toy_corpus, tmp_path, monkeypatch, caplog):
    """Where flock fails for want of a lock service (ENOLCK on some network mounts), training goes on
    and the log says that the directory is not guarded."""
    import errno
    import fcntl

    def no_locks(handle, operation):
        raise OSError(errno.ENOLCK, os.strerror(errno.ENOLCK))

    monkeypatch.setattr(fcntl, "flock", no_locks)
    config = _config_yaml(toy_corpus, tmp_path)
    assert main(["train", str(config), "--run-dir", str(tmp_path / "r"), "--set", "train.epochs=1"]) == 0
    assert f"{tmp_path / 'r'}: cannot lock (No locks available)" in caplog.text
    assert metric_records(tmp_path / "r")[-1]["event"] == "test"


def test_new_run_dir_claims_the_first_free_number(tmp_path):
    """A run of a taken name goes to the first free NAME-N, and claims it by creating it, so that runs
    started at the same time (a job array) each get their own directory before any has trained."""
    from seqzoo.training.rundir import new_run_dir

    runs = tmp_path / "runs"
    assert new_run_dir(str(runs), "toy") == runs / "toy"
    (runs / "toy-2").write_text("a file takes the name too")
    assert new_run_dir(str(runs), "toy") == runs / "toy-3"
    assert new_run_dir(str(runs), "toy") == runs / "toy-4"
    assert (runs / "toy").is_dir() and (runs / "toy-3").is_dir() and (runs / "toy-4").is_dir()


def _hold_run_lock(run_dir: Path) -> subprocess.Popen:
    """Another process that holds ``run_dir``'s training lock until it is killed."""
    code = (
        "import time\nfrom pathlib import Path\nfrom seqzoo.training.rundir import run_lock\n"
        f"with run_lock(Path({str(run_dir)!r})):\n    print('locked', flush=True)\n    time.sleep(120)"
    )
    holder = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    assert holder.stdout.readline() == "locked\n"
    return holder


def test_a_run_directory_in_use_is_refused_until_its_holder_ends(toy_corpus, tmp_path, capsys, caplog):
    """A second training in a directory that another process is training in stops before it writes
    there (exit 2, naming the directory and the holder's pid), a new run or a resume alike, while
    readers work and warn; once the holder is gone, even killed, the directory is free."""
    config = _config_yaml(toy_corpus, tmp_path)
    run_dir = tmp_path / "r"
    run_dir.mkdir()
    train = ["train", str(config), "--run-dir", str(run_dir), "--set", "train.epochs=1"]
    holder = _hold_run_lock(run_dir)
    try:
        assert main(train) == 2
        assert f"{run_dir} is in use by another seqzoo process (pid {holder.pid})" in capsys.readouterr().err
        assert [p.name for p in run_dir.iterdir()] == [".seqzoo.lock"]
    finally:
        holder.kill()
        holder.wait()
    assert main(train) == 0
    assert metric_records(run_dir)[-1]["event"] == "test"
    capsys.readouterr()
    holder = _hold_run_lock(run_dir)
    try:  # a trained run being trained on: "in use", not advice to resume it
        for argv in (train, ["train", "--resume", str(run_dir), "--set", "train.epochs=2"]):
            assert main(argv) == 2
            assert f"{run_dir} is in use by another seqzoo process (pid {holder.pid})" in capsys.readouterr().err
        caplog.clear()  # readers work meanwhile, and say that what they read is not final
        assert main(["evaluate", str(run_dir)]) == 0
        assert main(["compare", str(run_dir), str(run_dir)]) == 0
        warning = f"{run_dir} is being trained (pid {holder.pid}): what is read of it is its latest checkpoint so far"
        assert caplog.text.count(warning) == 2
    finally:
        holder.kill()
        holder.wait()
    assert [r["event"] for r in metric_records(run_dir)] == ["epoch", "test"]
    caplog.clear()
    assert main(["evaluate", str(run_dir)]) == 0
    assert "is being trained" not in caplog.text
    assert sorted(p.name for p in run_dir.iterdir() if p.name.startswith(".")) == [".seqzoo.lock"]


def test_training_in_one_seed_of_a_run_is_refused(toy_corpus, tmp_path, capsys):
    """A seed's sub-directory holds a config.yaml of its own, but its run trains it (and locks only
    the run's directory): ``--resume RUN/seed-N``, also through a symbolic link, and a new run with
    ``--run-dir RUN/seed-N`` are refused; a user's own folder that is named so and sits beside a
    config.yaml, but in no run, is not."""
    config = _config_yaml(toy_corpus, tmp_path)
    run_dir = tmp_path / "r"
    one_epoch = ["--set", "train.epochs=1"]
    assert main(["train", str(config), "--run-dir", str(run_dir), *one_epoch, "--set", "train.seeds=[1,2]"]) == 0
    capsys.readouterr()
    alias = tmp_path / "alias"
    alias.symlink_to(run_dir / "seed-1")
    resume = f"resume that (--resume {run_dir})"
    for named, argv, advice in (
        (run_dir / "seed-1", ["train", "--resume", str(run_dir / "seed-1")], resume),
        (alias, ["train", "--resume", str(alias)], resume),
        (run_dir / "seed-3", ["train", str(config), "--run-dir", str(run_dir / "seed-3"), *one_epoch], "train in a"),
    ):
        assert main(argv) == 2
        assert f"{named} is one seed or fold of the run {run_dir}: {advice}" in capsys.readouterr().err
    assert not (run_dir / "seed-3").exists()
    own = tmp_path / "project"
    own.mkdir()
    (own / "config.yaml").write_text(config.read_text())
    assert main(["train", str(config), "--run-dir", str(own / "seed-3"), *one_epoch]) == 0
    assert main(["train", "--resume", str(own / "seed-3"), "--set", "train.epochs=2"]) == 0
    assert [r["event"] for r in metric_records(own / "seed-3")] == ["epoch", "epoch", "test"]


def test_a_readers_momentary_lock_does_not_refuse_a_training(tmp_path):
    """``training_pid`` (every reader) takes a shared lock for a moment; a training that starts in that
    moment waits it out instead of reporting the run in use."""
    import fcntl
    import threading

    from seqzoo.training.rundir import LOCK_NAME, run_lock

    reader = open(tmp_path / LOCK_NAME, "a+")
    fcntl.flock(reader, fcntl.LOCK_SH)
    threading.Timer(0.3, reader.close).start()
    with run_lock(tmp_path):
        assert (tmp_path / LOCK_NAME).read_text() == f"{os.getpid()}\n"


def test_find_runs_is_not_thrown_by_a_checkpoint_swapped_meanwhile(tmp_path):
    """``seqzoo evaluate`` / ``predict`` look for runs while a training swaps its checkpoints (``best/``,
    ``last/`` through ``.tmp`` and ``.old`` directories that come and go): the scan neither fails nor
    misses the run."""
    import threading

    from seqzoo.training.checkpoint import save_checkpoint_dir
    from seqzoo.training.runner import find_runs

    run_dir = tmp_path / "r"
    tensors = {"model": {"w": torch.zeros(4)}}
    save_checkpoint_dir(run_dir / "best", tensors, {"config.json": {}})
    stop = threading.Event()

    def swap():
        while not stop.is_set():
            for name in ("best", "last"):
                save_checkpoint_dir(run_dir / name, tensors, {"config.json": {}})

    swapper = threading.Thread(target=swap)
    swapper.start()
    try:
        for _ in range(2000):
            assert find_runs(tmp_path) == [run_dir]
    finally:
        stop.set()
        swapper.join()


@pytest.mark.parametrize("how", ["moved", "replaced", "link replaced"])
def test_a_training_whose_directory_is_moved_stops_before_writing(toy_corpus, tmp_path, monkeypatch, capsys, how):
    """A run directory moved (or removed) under a live training, and maybe re-created by another run,
    also where the training reached it through a symbolic link that is now a directory: the
    training stops at its next write instead of writing into what is there now, and the moved
    directory can be resumed where it went."""
    config = _config_yaml(toy_corpus, tmp_path)
    run_dir, moved = tmp_path / "r", tmp_path / "r-moved"
    if how == "link replaced":
        moved.mkdir()
        run_dir.symlink_to(moved)
    replaced = how != "moved"
    original = Trainer._step_schedule

    def move_after_first_epoch(self, epoch, improved):
        if epoch == 0:
            if how == "link replaced":
                run_dir.unlink()
            else:
                run_dir.rename(moved)
            if replaced:  # another run now trains at the old path, with a lock file of its own
                run_dir.mkdir()
                (run_dir / ".seqzoo.lock").write_text("")
        return original(self, epoch, improved)

    monkeypatch.setattr(Trainer, "_step_schedule", move_after_first_epoch)
    assert main(["train", str(config), "--run-dir", str(run_dir)]) == 2
    what = "was replaced (another run is there now)" if replaced else "was moved or removed"
    assert f"{run_dir} {what} while this process trained in it" in capsys.readouterr().err
    assert [p.name for p in run_dir.iterdir()] == [".seqzoo.lock"] if replaced else not run_dir.exists()
    monkeypatch.setattr(Trainer, "_step_schedule", original)
    assert main(["train", "--resume", str(moved)]) == 0
    assert [r["event"] for r in metric_records(moved)] == ["epoch"] * 3 + ["test"]


def test_a_multi_seed_training_whose_directory_is_replaced_stops_between_seeds(
    toy_corpus, tmp_path, monkeypatch, capsys
):
    """Replaced after seed 1 has finished: seed 2 does not start in the other run's directory."""
    config = _config_yaml(toy_corpus, tmp_path)
    run_dir = tmp_path / "r"
    original = Trainer._finish

    def replace_after_seed_1(self):
        result = original(self)
        if self.run_dir.name == "seed-1":
            run_dir.rename(tmp_path / "r-moved")
            run_dir.mkdir()
            (run_dir / ".seqzoo.lock").write_text("")
        return result

    monkeypatch.setattr(Trainer, "_finish", replace_after_seed_1)
    argv = ["train", str(config), "--run-dir", str(run_dir), "--set", "train.epochs=1", "--set", "train.seeds=[1,2]"]
    assert main(argv) == 2
    assert (
        f"{run_dir} was replaced (another run is there now) while this process trained in it" in capsys.readouterr().err
    )
    assert [p.name for p in run_dir.iterdir()] == [".seqzoo.lock"]
