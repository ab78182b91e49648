"""The task registry: a task defined outside the library (here, in this module) trains, evaluates and
predicts through the CLI like a built-in one; registration conflicts and unknown names are refused."""

import json
import random
import textwrap
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import seqzoo
from seqzoo.cli import main
from seqzoo.config import ConfigError, RunConfig, load_config, require_ranges
from seqzoo.encoders.base import build_encoder, module_mode
from seqzoo.tasks.common import restore
from seqzoo.training.registry import available_tasks, get_task, register_task
from seqzoo.training.task import StepLoss


@dataclass
class MajorityDataConfig:
    """Random 0/1 strings, labelled by whether ones outnumber zeros (odd lengths: never a tie)."""

    examples: int = 96
    length: int = 7

    def __post_init__(self) -> None:
        require_ranges(self, positive=("examples", "length"))


class MajorityModel(nn.Module):
    def __init__(self, config: RunConfig) -> None:
        super().__init__()
        self.embedding = nn.Embedding(2, 4)
        self.encoder = build_encoder(config.model.encoder, input_size=4, **config.model.encoder_args)
        self.output = nn.Linear(self.encoder.output_size, 2)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        outputs, _ = self.encoder(self.embedding(ids))  # (B, T, H)
        return self.output(outputs.mean(1))  # (B, 2)


class MajorityTask:
    metric = "accuracy"
    higher_is_better = True

    def __init__(self, config: RunConfig, with_data: bool = True) -> None:
        self.config = config
        self.model = MajorityModel(config)
        rng = random.Random(config.train.seed)
        data: MajorityDataConfig = config.data
        self.splits = {}
        for split in ("train", "dev", "test") if with_data else ():
            rows = [[rng.randint(0, 1) for _ in range(data.length)] for _ in range(data.examples)]
            self.splits[split] = torch.tensor(rows), torch.tensor([int(sum(r) > len(r) / 2) for r in rows])

    def train_batches(self, epoch: int) -> list[torch.Tensor]:
        order = torch.randperm(self.config.data.examples, generator=torch.Generator().manual_seed(epoch))
        return list(order.split(self.config.train.batch_size))

    def train_loss(self, batch: torch.Tensor) -> StepLoss:
        ids, labels = (t[batch] for t in self.splits["train"])
        return StepLoss(F.cross_entropy(self.model(ids), labels), ids.numel(), len(batch))

    @torch.no_grad()
    def evaluate(self, split: str) -> dict[str, float]:
        ids, labels = self.splits[split]
        with module_mode(self.model, training=False):
            logits = self.model(ids)
        return {"accuracy": float((logits.argmax(-1) == labels).float().mean())}

    @torch.no_grad()
    def predict(self, texts: list[str]) -> list[dict[str, str]]:
        with module_mode(self.model, training=False):
            logits = self.model(torch.tensor([[int(c) for c in text] for text in texts]))
        return [{"label": "ones" if row.argmax() else "zeros"} for row in logits]

    def documents(self) -> dict:
        return {}


def _load_trained(config: RunConfig, best: Path, with_data: bool = True) -> MajorityTask:
    return restore(best, lambda checkpoint: MajorityTask(config, with_data))


register_task(
    "majority",
    data_config=MajorityDataConfig,
    model_keys={"encoder", "encoder_args"},
    build_tasks=lambda config: [("", MajorityTask(config))],
    load_trained=_load_trained,
)

CONFIG = """\
task: majority
data: {examples: 96, length: 7}
model: {encoder: gru, encoder_args: {hidden_size: 8}}
optim: {lr: 0.03}
train: {epochs: 12, batch_size: 16, patience: null, progress: false, log_every: null, device: cpu, threads: 1}
"""


def test_a_task_registered_outside_the_library_trains_evaluates_and_predicts(tmp_path, capsys, single_thread):
    config = tmp_path / "majority.yaml"
    config.write_text(CONFIG)
    run_dir = tmp_path / "run"
    assert main(["train", str(config), "--run-dir", str(run_dir)]) == 0
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["metrics"]["test_accuracy"]["mean"] > 0.85  # learnt to count, not chance (about 0.5)
    capsys.readouterr()
    assert main(["evaluate", str(run_dir), "--split", "dev"]) == 0
    assert json.loads(capsys.readouterr().out.splitlines()[0])["accuracy"] > 0.85
    texts = tmp_path / "texts.txt"
    texts.write_text("1111011\n0001000\n")
    assert main(["predict", str(run_dir), "--input", str(texts)]) == 0
    assert [json.loads(line)["label"] for line in capsys.readouterr().out.splitlines()] == ["ones", "zeros"]
    assert main(["sample", str(run_dir)]) == 2  # a capability the task does not register
    assert "a majority run cannot generate text (its task has no 'sample')" in capsys.readouterr().err


def test_the_task_s_data_config_and_model_keys_are_the_registered_ones(tmp_path):
    config = tmp_path / "majority.yaml"
    config.write_text(CONFIG)
    assert isinstance(load_config(config).data, MajorityDataConfig)
    with pytest.raises(ConfigError, match=r"data\.length: must be > 0"):
        load_config(config, ["data.length=0"])
    with pytest.raises(
        ConfigError, match=r"model\.pooler would have no effect \(the majority recipe does not use it\)"
    ):
        load_config(config, ["model.pooler=max"])
    with pytest.raises(ConfigError, match=r"task: 'nope' is not one of .*'majority'"):
        load_config(config, ["task=nope"])


def test_a_name_taken_by_another_module_is_refused_and_builtins_are_listed():
    assert {"classification", "lm", "absa", "translation", "majority"} <= set(available_tasks())
    with pytest.raises(ValueError, match=r"task 'lm' is already registered by seqzoo\.tasks\.lm"):
        register_task(
            "lm", data_config=MajorityDataConfig, model_keys=set(), build_tasks=lambda c: [], load_trained=_load_trained
        )
    assert get_task("lm").data_config.__name__ == "LMDataConfig"
    with pytest.raises(KeyError, match="'nope' is not one of"):
        get_task("nope")


def test_seqzoo_import_registers_a_task_module_from_the_current_directory(tmp_path, monkeypatch, capsys):
    """``seqzoo --import MODULE train``: the module's task (here one re-registering this file's task
    under another name) trains and is found again by evaluate, given the same --import."""
    (tmp_path / "my_task.py").write_text(
        textwrap.dedent(
            """
            import test_registry as t
            from seqzoo.training.registry import register_task

            register_task("my_majority", data_config=t.MajorityDataConfig, model_keys={"encoder", "encoder_args"},
                          build_tasks=lambda config: [("", t.MajorityTask(config))], load_trained=t._load_trained)
            """
        )
    )
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(Path(__file__).parent))
    config = tmp_path / "c.yaml"
    config.write_text(CONFIG.replace("task: majority", "task: my_majority").replace("epochs: 12", "epochs: 1"))
    assert main(["train", str(config), "--run-dir", "run"]) == 2  # not imported: unknown
    assert "task: 'my_majority' is not one of" in capsys.readouterr().err
    assert main(["--import", "my_task", "train", str(config), "--run-dir", "run"]) == 0
    assert main(["--import", "my_task", "evaluate", "run"]) == 0
    assert "accuracy" in json.loads(capsys.readouterr().out.splitlines()[-2])


def test_seqzoo_load_of_a_multi_seed_run_refuses_to_guess_and_takes_seed(tmp_path, single_thread):
    config = tmp_path / "majority.yaml"
    config.write_text(CONFIG.replace("epochs: 12", "epochs: 1").replace("device: cpu", "device: cpu, seeds: [1, 2]"))
    run_dir = tmp_path / "run"
    assert main(["train", str(config), "--run-dir", str(run_dir)]) == 0
    with pytest.raises(ValueError, match=r"it holds several: pass seed= .*seed-1, seed-2"):
        seqzoo.load(run_dir)
    with pytest.raises(ValueError, match="none matches"):
        seqzoo.load(run_dir, seed=3)
    trained = seqzoo.load(run_dir, seed=2)
    assert trained.path == run_dir / "seed-2" and trained.config.train.seed == 2
    assert trained.encoder is trained.model.encoder and len(trained.predict(["1110111"])) == 1
    assert trained.evaluate("test") == pytest.approx(seqzoo.load(run_dir / "seed-2").evaluate("test"))
    with pytest.raises(TypeError, match="a majority model does not sample"):
        trained.sample()
