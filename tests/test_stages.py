"""Staged runs: pretrain on one corpus, fine-tune on another from the pretrained weights with the encoder
frozen, each stage in its own sub-directory; an interrupted stage resumes with ``--resume``."""

import json

import pytest
import torch
from conftest import assert_config_refused, metric_records, write_sentiment_corpus
from safetensors.torch import load_file

import seqzoo
from seqzoo.cli import main
from seqzoo.config import load_config
from seqzoo.training.trainer import Trainer

BASE = """\
task: classification
data: {{data_dir: {a}, name: toy, embedding_dim: 8}}
model: {{encoder: gru, encoder_args: {{hidden_size: 8}}}}
train: {{epochs: 2, batch_size: 16, patience: null, progress: false, log_every: null, device: cpu, threads: 1,
         checkpoint_every: 0}}
"""
STAGES = """\
stages:
  - name: pretrain
  - name: finetune
    init_from: pretrain
    freeze: [encoder.]
    data: {{data_dir: {b}}}
    optim: {{lr: 0.003}}
    train: {{epochs: 3}}
"""


@pytest.fixture
def staged_config(tmp_path):
    a = write_sentiment_corpus(tmp_path / "a", sizes=(96, 24, 24), seed=0)
    b = write_sentiment_corpus(tmp_path / "b", sizes=(64, 24, 24), seed=1)
    path = tmp_path / "staged.yaml"
    path.write_text((BASE + STAGES).format(a=a, b=b))
    return path


def _weights(run_dir, stage):
    return load_file(run_dir / stage / "best" / "model.safetensors")


def test_fine_tuning_keeps_the_frozen_encoder_and_resumes_after_an_interruption(
    staged_config, tmp_path, monkeypatch, capsys, single_thread
):
    clean = tmp_path / "clean"
    assert main(["train", str(staged_config), "--run-dir", str(clean)]) == 0
    summary = json.loads((clean / "summary.json").read_text())
    assert list(summary["stages"]) == ["pretrain", "finetune"]
    assert summary["metrics"] == summary["stages"]["finetune"]["metrics"]  # the run's result is its last stage's
    for stage in ("pretrain", "finetune"):
        assert [r["event"] for r in metric_records(clean / stage)][-1] == "test"
    pretrained, tuned = _weights(clean, "pretrain"), _weights(clean, "finetune")
    encoder = [name for name in pretrained if name.startswith("encoder.")]
    assert encoder and all(torch.equal(pretrained[name], tuned[name]) for name in encoder)  # bit-identical
    assert not torch.equal(pretrained["head.1.weight"], tuned["head.1.weight"])  # the rest trained on
    report = json.loads((clean / "finetune" / "init_from.json").read_text())
    assert set(report["loaded"]) == set(pretrained) and report["not_loaded"] == report["unused"] == []
    assert sorted(report["frozen"]) == sorted(encoder) and report["from"] == str(clean / "pretrain" / "best")
    assert not (clean / "pretrain" / "init_from.json").exists()  # a stage without init_from or freeze
    tuned_model = seqzoo.load(clean)
    assert tuned_model.path == clean / "finetune"  # a staged run's model is its last stage's
    assert seqzoo.load(clean, stage="pretrain").path == clean / "pretrain"
    capsys.readouterr()
    (tmp_path / "texts.txt").write_text("a superb film\n")
    assert main(["predict", str(clean), "--input", str(tmp_path / "texts.txt")]) == 0  # the last stage's model
    assert json.loads(capsys.readouterr().out) == {
        "line": 1,
        "text": "a superb film",
        **tuned_model.predict(["a superb film"])[0],
    }
    assert main(["train", "--resume", str(clean / "finetune")]) == 2  # the run resumes it, not the stage alone
    assert f"is one stage of the run {clean}: resume that (--resume {clean})" in capsys.readouterr().err

    save_last = Trainer._save_last

    def interrupted(self):  # the finetune stage stops right after its first epoch's checkpoint
        save_last(self)
        if self.run_dir.name == "finetune":
            raise KeyboardInterrupt

    killed = tmp_path / "killed"
    monkeypatch.setattr(Trainer, "_save_last", interrupted)
    assert main(["train", str(staged_config), "--run-dir", str(killed)]) == 130
    monkeypatch.setattr(Trainer, "_save_last", save_last)
    assert not (killed / "summary.json").exists() and (killed / "finetune" / "last").exists()
    pretrain_records = (killed / "pretrain" / "metrics.jsonl").read_text()
    assert main(["train", "--resume", str(killed)]) == 0
    assert (killed / "pretrain" / "metrics.jsonl").read_text() == pretrain_records  # finished: not trained again
    assert metric_records(killed / "finetune") == metric_records(clean / "finetune")
    resumed = _weights(killed, "finetune")
    assert all(torch.equal(resumed[name], tuned[name]) for name in tuned)
    assert json.loads((killed / "summary.json").read_text())["stages"].keys() == summary["stages"].keys()


def test_a_freeze_matching_no_parameter_is_refused(staged_config, tmp_path, capsys):
    text = staged_config.read_text().replace("    init_from: pretrain\n", "").replace("[encoder.]", "[decoder.]")
    staged_config.write_text(text.replace("epochs: 2", "epochs: 1"))
    assert main(["train", str(staged_config), "--run-dir", str(tmp_path / "r")]) == 2
    assert "stage finetune: freeze ['decoder.'] matches no parameter of the model" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("stages", "message"),
    [
        ("[{name: a}, {name: a}]", r"stages\[1\]\.name: two stages are named 'a'"),
        ("[{name: a, init_from: b}, {name: b}]", r"stages\[0\]\.init_from: 'b' is not an earlier stage"),
        ("[{name: seed-1}]", r"stages\[0\]\.name: 'seed-1' is no stage directory name"),
        ("[{name: a, output_dir: x}]", r"unknown key stages\[0\]\.output_dir"),
        ("[{name: a, train: {epochs: 0}}]", r"stages\[0\] \(a\): train\.epochs: must be > 0"),
        ("[{name: a, freeze: encoder.}]", r"stages\[0\]\.freeze: expected a list"),
        ("[{nome: a}]", r"stages\[0\]: expected a mapping with a name"),
        ("[{name: a, task: lm, model: {pooler: max}}]", r"stages\[0\] \(a\): model\.pooler would have no effect"),
    ],
)
def test_bad_stages_are_config_errors_naming_the_stage(tmp_path, stages, message):
    assert_config_refused(tmp_path / "c.yaml", f"stages: {stages}\n", message)


def test_a_stage_of_another_task_starts_from_that_task_s_data_defaults(tmp_path):
    from seqzoo.config import config_to_dict, stage_config

    path = tmp_path / "c.yaml"
    path.write_text(
        "data: {name: toy}\nstages: [{name: a}, {name: b, task: lm, data: {data_dir: x}, model: {tie_weights: true}}]\n"
    )
    config = load_config(path)
    first, second = (stage_config(config, stage) for stage in config.stages)
    assert first.data.name == "toy" and second.task == "lm" and second.data.data_dir == "x"
    assert load_config(path).stages == config.stages
    assert config_to_dict(config)["stages"][1] == {
        "name": "b",
        "task": "lm",
        "data": {"data_dir": "x"},
        "model": {"tie_weights": True},
    }
