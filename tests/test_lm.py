"""Language-modelling recipe: streams, stateful evaluation, metrics, training, exact resume, sampling."""

import dataclasses
import json
import math
import random
import re
import shutil
import types
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from conftest import metric_records

from seqzoo.cli import main
from seqzoo.config import ConfigError, config_from_dict
from seqzoo.data.errors import DataError
from seqzoo.data.lm import batchify, tbptt_batches
from seqzoo.tasks.lm import LMTask, loss_by_length_bucket, plot_length_buckets, read_splits, sample
from seqzoo.training.checkpoint import join_tensors, split_tensors
from seqzoo.training.runner import load_task, run

SUBJECTS = ["the cat", "a dog", "the old bird", "my friend"]
VERBS = ["sat on", "ran to", "looked at", "slept under"]
OBJECTS = ["the mat", "a tree", "the red house", "the river"]


def write_corpus(directory: Path, sizes=(160, 30, 30), seed: int = 0) -> Path:
    """A small learnable corpus: ``subject verb object .`` lines in {train,valid,test}.txt."""
    rng = random.Random(seed)
    directory.mkdir(parents=True, exist_ok=True)
    for stem, n in zip(("train", "valid", "test"), sizes, strict=True):
        lines = [f"{rng.choice(SUBJECTS)} {rng.choice(VERBS)} {rng.choice(OBJECTS)} ." for _ in range(n)]
        (directory / f"{stem}.txt").write_text("\n".join(lines) + "\n", encoding="utf-8")
    return directory


def make_config(data_dir: Path, tmp_path: Path, level: str = "word", **sections):
    values = {
        "task": "lm",
        "name": "toy_lm",
        "output_dir": str(tmp_path / "runs"),
        "data": {
            "data_dir": str(data_dir),
            "level": level,
            "batch_size": 4,
            "eval_batch_size": 3,
            "bptt": 8,
            "embedding_dim": 16,
        },
        "model": {
            "encoder": "lstm",
            "encoder_args": {"hidden_size": 16},
            "dropout": 0.1,
            "embedding_dropout": 0.1,
            "tie_weights": True,
        },
        "optim": {"optimizer": "adam", "lr": 0.01, "clip_norm": 1.0},
        "train": {"epochs": 2, "patience": None, "checkpoint_every": 10, "seed": 5, "progress": False},
    }
    for section, updates in sections.items():
        values[section] = {**values[section], **updates}
    return config_from_dict(values)


@pytest.fixture
def corpus(tmp_path: Path) -> Path:
    return write_corpus(tmp_path / "corpus")


def test_streams_and_targets_line_up(corpus, tmp_path):
    task = LMTask(make_config(corpus, tmp_path), read_splits(make_config(corpus, tmp_path).data))
    first_line = (corpus / "train.txt").read_text().splitlines()[0].split()
    assert task.vocab.decode(task.ids["train"][: len(first_line) + 1].tolist()) == [*first_line, "<eos>"]
    streams = batchify(task.ids["train"], 4)
    windows = [task._chunks[i] for i in task.train_batches(0)]
    assert task.train_batches(0) == task.train_batches(3) == list(range(len(windows)))
    assert torch.equal(torch.cat([x for x, _ in windows], 1), streams[:, :-1])
    assert torch.equal(torch.cat([y for _, y in windows], 1), streams[:, 1:])
    assert all(x.shape[1] <= 8 for x, _ in windows)


def test_evaluation_with_carried_state_equals_one_pass(corpus, tmp_path):
    config = make_config(corpus, tmp_path, data={"eval_batch_size": 1, "bptt": 5}, model={"tie_weights": False})
    task = LMTask(config, read_splits(config.data))
    ids = task.ids["dev"]
    with torch.no_grad():
        task.model.eval()
        logits, _ = task.model(ids[None, :-1])
        expected = F.cross_entropy(logits[0], ids[1:]).item()
    task.model.train()
    result = task.evaluate("dev")
    assert result["tokens"] == ids.numel() - 1
    assert result["loss"] == pytest.approx(expected, rel=1e-5)
    assert task.model.training  # evaluation restores the mode


@pytest.mark.parametrize("encoder", ["lstm", "qrnn"])
@pytest.mark.parametrize("dropped", [0, 1, 2])
def test_every_token_but_the_first_is_a_target(corpus, tmp_path, encoder, dropped):
    """Row b of the evaluation streams is read from the zero state and goes on with the first token of
    row b + 1; the last row with the N mod B tokens that batchify drops. So every token but the
    split's first is predicted once, with the same context as reading that stretch alone."""
    args = {"hidden_size": 16} if encoder == "lstm" else {"hidden_size": 16, "window": 2}
    config = make_config(
        corpus, tmp_path, data={"eval_batch_size": 3, "bptt": 5}, model={"encoder": encoder, "encoder_args": args}
    )
    task = LMTask(config, read_splits(config.data))
    ids = task.ids["dev"]
    ids = task.ids["dev"] = ids[: 3 * (ids.numel() // 3) + dropped]
    width = ids.numel() // 3
    stretches = [ids[: width + 1], ids[width : 2 * width + 1], ids[2 * width :]]  # row b + what follows it
    task.model.eval()
    with torch.no_grad():
        expected = [F.cross_entropy(task.model(s[None, :-1])[0][0], s[1:], reduction="none") for s in stretches]
    nll = task.token_nll("dev")
    assert math.isnan(nll[0]) and not torch.isnan(nll[1:]).any()
    assert torch.allclose(nll[1:], torch.cat(expected).double(), atol=1e-5)
    result = task.evaluate("dev")
    assert result["tokens"] == ids.numel() - 1 and result["loss"] == pytest.approx(nll[1:].mean().item())


def test_metric_formulas_on_a_uniform_model(corpus, tmp_path):
    for level, metric in (("word", "ppl"), ("char", "bpc")):
        config = make_config(corpus, tmp_path, level=level)
        task = LMTask(config, read_splits(config.data))
        with torch.no_grad():
            task.model.embedding.weight.zero_()
            task.model.output_bias.zero_()
        result = task.evaluate("test")
        size = len(task.vocab)
        n = task.ids["test"].numel()
        assert task.metric == metric
        assert result["loss"] == pytest.approx(math.log(size))
        assert result["tokens"] == n - 1  # every token but the first
        assert result[metric] == pytest.approx(size if metric == "ppl" else math.log2(size))
    text = (corpus / "test.txt").read_text()
    assert n == len(text)  # char level counts every character, newlines included


def test_training_lowers_the_loss_and_tied_weights_checkpoint(corpus, tmp_path):
    config = make_config(corpus, tmp_path, train={"epochs": 3})
    run(config, tmp_path / "r")
    records = metric_records(tmp_path / "r")
    dev = [r["dev_loss"] for r in records if r["event"] == "epoch"]
    vocab_size = len(json.loads((tmp_path / "r/best/vocab.json").read_text())["tokens"])
    assert dev[-1] < dev[0] < math.log(vocab_size)
    assert records[-1]["test_ppl"] == pytest.approx(math.exp(records[-1]["test_loss"]))
    test = records[-1]
    log_line = f"test loss {test['test_loss']:.4f}, ppl {test['test_ppl']:.4f}, tokens {test['test_tokens']}"
    assert log_line + "\n" in (tmp_path / "r/train.log").read_text()  # a count prints as a count
    task = load_task(tmp_path / "r")
    assert task.model.output_weight is None  # tied: the embedding is the output layer
    assert task.evaluate("test")["ppl"] == pytest.approx(records[-1]["test_ppl"])


def test_non_causal_encoder_is_refused(corpus, tmp_path):
    config = make_config(
        corpus, tmp_path, model={"encoder_args": {"hidden_size": 8, "bidirectional": True}, "tie_weights": False}
    )
    with pytest.raises(ValueError, match="not causal and stateful"):
        LMTask(config, read_splits(config.data))


def test_embedding_init_sets_the_range_of_the_input_embedding(corpus, tmp_path):
    splits = read_splits(make_config(corpus, tmp_path).data)
    for scale in (0.1, 1.0):
        config = make_config(corpus, tmp_path, model={"embedding_init": scale, "tie_weights": False})
        torch.manual_seed(0)
        weight = LMTask(config, splits).model.embedding.weight
        assert weight.abs().max() <= scale
        assert weight.std().item() == pytest.approx(scale / math.sqrt(3), rel=0.25)  # U(-a, a)
    with pytest.raises(ConfigError, match=r"model\.embedding_init: must be > 0"):
        make_config(corpus, tmp_path, model={"embedding_init": 0.0})


class _Killed(Exception):
    pass


@pytest.mark.parametrize(("encoder", "precision"), [("lstm", "fp32"), ("lstm", "bf16"), ("qrnn", "bf16")])
def test_resume_mid_epoch_reproduces_uninterrupted_run(corpus, tmp_path, monkeypatch, encoder, precision):
    """Also in mixed precision, whose carried state crosses the checkpoint in its own dtype."""
    import seqzoo.encoders.qrnn  # noqa: F401  (registers "qrnn")

    model = {"encoder": encoder, "encoder_args": {"hidden_size": 16, **({"window": 2} if encoder == "qrnn" else {})}}
    config = make_config(corpus, tmp_path, level="char", data={"bptt": 20}, model=model, train={"precision": precision})
    clean = run(config, tmp_path / "clean")
    steps_per_epoch = len(LMTask(config, read_splits(config.data)).train_batches(0))
    original, calls = LMTask.train_loss, []

    def dying(self, batch):
        calls.append(batch)
        if len(calls) == steps_per_epoch + 15:  # mid epoch 2, 5 steps after a checkpoint
            raise _Killed
        return original(self, batch)

    monkeypatch.setattr(LMTask, "train_loss", dying)
    with pytest.raises(_Killed):
        run(config, tmp_path / "killed")
    monkeypatch.setattr(LMTask, "train_loss", original)
    saved = json.loads((tmp_path / "killed/last/train_state.json").read_text())
    assert saved["loop"]["epoch"] == 1 and 5 <= saved["loop"]["step_in_epoch"] <= 14
    assert saved["extra"]["state"] is not None  # the carried (h, c) is part of the checkpoint
    resumed = run(config, tmp_path / "killed", resume=True)
    assert resumed == clean
    assert metric_records(tmp_path / "killed") == metric_records(tmp_path / "clean")
    raw = [json.loads(line) for line in (tmp_path / "killed/metrics.jsonl").read_text().splitlines()]
    assert [r.get("resumed_at_step") for r in raw] == [None, saved["loop"]["step_in_epoch"], None]  # epoch 2's timing


@pytest.mark.parametrize("encoder", ["lstm", "gru", "qrnn"])
def test_carried_state_survives_the_checkpoint_format(corpus, tmp_path, encoder):
    import seqzoo.encoders.qrnn  # noqa: F401  (registers "qrnn")

    config = make_config(
        corpus,
        tmp_path,
        model={"encoder": encoder, "encoder_args": {"hidden_size": 16}, "dropout": 0.0, "embedding_dropout": 0.0},
    )
    tasks = [LMTask(config, read_splits(config.data)) for _ in range(2)]
    tasks[1].model.load_state_dict(tasks[0].model.state_dict())
    tasks[0].train_loss(0)
    tasks[0].train_loss(1)
    skeleton, tensors = split_tensors(tasks[0].extra_state())
    tasks[1].load_extra_state(join_tensors(json.loads(json.dumps(skeleton)), tensors))
    assert torch.equal(tasks[0].train_loss(2)[0], tasks[1].train_loss(2)[0])


def test_loss_by_length_bucket_and_plot(corpus, tmp_path):
    config = make_config(corpus, tmp_path, level="char")
    task = LMTask(config, read_splits(config.data))
    buckets = loss_by_length_bucket(task, "dev", [20, 25])
    lines = (corpus / "valid.txt").read_text().splitlines()
    lengths = [len(line) for line in lines]
    assert sum(b["lines"] for b in buckets) == len(lines)
    assert [b["lines"] for b in buckets] == [
        n
        for n in (sum(x < 20 for x in lengths), sum(20 <= x < 25 for x in lengths), sum(x >= 25 for x in lengths))
        if n
    ]
    overall = task.evaluate("dev")
    assert sum(b["tokens"] for b in buckets) == overall["tokens"]
    assert sum(b["loss"] * b["tokens"] for b in buckets) / overall["tokens"] == pytest.approx(overall["loss"])
    assert all(b["bpc"] == pytest.approx(b["loss"] / math.log(2)) for b in buckets)
    path = plot_length_buckets({"lstm": buckets}, tmp_path / "plots/bpc_by_length.png", "bpc")
    assert path.read_bytes()[:4] == b"\x89PNG"


def test_length_plot_orders_the_buckets_of_all_runs_by_length(tmp_path, monkeypatch):
    """Runs with different empty buckets were drawn on a categorical axis in order of appearance
    (the second run's 0-19 after the first's 40+)."""
    figures = []
    monkeypatch.setattr("seqzoo.tasks.lm.save_figure", lambda fig, path: figures.append(fig) or path)

    def bucket(low, high, bpc):
        return {"min_length": low, "max_length": high, "bpc": bpc}

    series = {"a": [bucket(20, 40, 2.0), bucket(40, None, 2.1)], "b": [bucket(0, 20, 1.5), bucket(20, 40, 1.9)]}
    plot_length_buckets(series, tmp_path / "x.png", "bpc")
    ax = figures[0].axes[0]
    assert [tick.get_text() for tick in ax.get_xticklabels()] == ["0-19", "20-39", "40+"]
    assert [list(line.get_xdata()) for line in ax.get_lines()] == [[1, 2], [0, 1]]


@pytest.mark.parametrize("precision", ["fp32", "bf16"])
def test_early_training_probe_trains_as_seqzoo_train_does(corpus, tmp_path, capsys, precision):
    """seqzoo bench early_training_probe claims seqzoo train's steps: its mean training cross-entropy
    over the first steps equals the train_loss of the trainer's step record (same seed, batches,
    optimiser, precision); it seeded from train.seed where a config lists train.seeds."""
    import yaml

    from seqzoo.config import config_to_dict

    config = make_config(corpus, tmp_path, train={"log_every": 5, "seeds": [7, 8], "seed": 1, "epochs": 1})
    config.train.precision = precision
    path = tmp_path / "probe.yaml"
    values = config_to_dict(config)
    values["train"].pop("seed", None)
    path.write_text(yaml.safe_dump(values))
    assert main(["bench", "early_training_probe", str(path), "--steps", "5", "--every", "5"]) == 0
    probe_bits = float(re.search(r"step 5: train CE ([0-9.]+) bits", capsys.readouterr().out).group(1))
    config.train.seeds, config.train.seed = [], 7  # the first seed's run alone
    run(config, tmp_path / "r")
    record = next(r for r in metric_records(tmp_path / "r") if r["event"] == "step" and r["step"] == 5)
    assert probe_bits == pytest.approx(record["train_loss"] / math.log(2), abs=1e-3)


def test_plot_lengths_cli(corpus, tmp_path, capsys):
    config = make_config(corpus, tmp_path, level="char", train={"epochs": 1})
    run(config, tmp_path / "r")
    task = load_task(tmp_path / "r")
    out = tmp_path / "lengths.png"
    command = ["plot-lengths", str(tmp_path / "r"), "--split", "dev", "--out", str(out)]
    assert main([*command, "--boundaries", "25,20"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert [json.loads(line)["bpc"] for line in lines[:-1]] == [
        pytest.approx(b["bpc"]) for b in loss_by_length_bucket(task, "dev", [20, 25])
    ]
    assert lines[-1] == str(out) and out.read_bytes()[:4] == b"\x89PNG"
    assert main(["plot-lengths", str(tmp_path / "r"), "--boundaries", "a,b", "--out", str(out)]) == 2
    assert main(["plot-lengths", str(tmp_path / "r"), "--boundaries=-5,20", "--out", str(out)]) == 2
    assert "line lengths >= 1" in capsys.readouterr().err
    shutil.copytree(tmp_path / "r", tmp_path / "other" / "r")  # one legend label for two runs: the first was dropped
    assert main(["plot-lengths", str(tmp_path / "r"), str(tmp_path / "other" / "r"), "--out", str(out)]) == 2
    assert "two run directories are named 'r'" in capsys.readouterr().err


def test_sample_function_and_cli(corpus, tmp_path, capsys):
    config = make_config(corpus, tmp_path, train={"epochs": 1})
    run(config, tmp_path / "r")
    task = load_task(tmp_path / "r", with_data=False)
    grad_modes = []  # the carried state would chain every step's graph to the last
    hook = task.model.register_forward_hook(lambda *_: grad_modes.append(torch.is_grad_enabled()))
    text = sample(task, length=12, prime="the cat", seed=3)
    hook.remove()
    assert grad_modes and not any(grad_modes)
    assert text.startswith("the cat ") and sample(task, length=12, prime="the cat", seed=3) == text
    assert main(["sample", str(tmp_path / "r"), "--length", "12", "--prime", "the cat", "--seed", "3"]) == 0
    assert capsys.readouterr().out == text + "\n"
    for bad in (0, float("nan"), float("inf")):
        with pytest.raises(ValueError, match="temperature must be a finite number > 0"):
            sample(task, temperature=bad)
    assert main(["sample", str(tmp_path / "r"), "--temperature", "0"]) == 2
    assert main(["sample", str(tmp_path / "r"), "--top-p", "0"]) == 2
    greedy = sample(task, length=12, prime="the cat", seed=3, temperature=1e-4)  # argmax at every step
    assert sample(task, length=12, prime="the cat", seed=5, top_p=1e-6) == greedy
    assert sample(task, length=12, prime="the cat", seed=5, temperature=1e-40) == greedy  # logits / T overflowed
    assert main(["sample", str(tmp_path / "r"), "--length", "12", "--prime", "the cat", "--top-p", "1e-6"]) == 0
    assert capsys.readouterr().out == greedy + "\n"
    assert main(["sample", str(tmp_path / "r"), "--length", "0", "--prime", "the cat"]) == 0
    assert capsys.readouterr().out == "the cat\n"
    assert main(["predict", str(tmp_path / "r")]) == 2  # a language model has nothing to classify
    assert "serves classification, aspect sentiment and translation runs" in capsys.readouterr().err


def test_perplexity_of_a_diverged_model_is_inf_not_an_overflow(corpus, tmp_path):
    config = make_config(corpus, tmp_path)
    task = LMTask(config, read_splits(config.data))
    assert task.metric_from_loss(math.log(80.0)) == pytest.approx(80.0)
    assert task.metric_from_loss(710.0) == math.inf  # math.exp raised OverflowError and the run died


def test_missing_split_file_is_a_clear_error(corpus, tmp_path):
    (corpus / "valid.txt").unlink()
    config = make_config(corpus, tmp_path)
    with pytest.raises(DataError, match=r"no valid\.txt or valid\.txt\.gz"):
        read_splits(config.data)


def test_a_split_too_short_for_its_streams_is_refused_before_training(corpus, tmp_path):
    (corpus / "test.txt").write_text("the cat .\n")  # 4 tokens with <eos>; eval_batch_size 3 needs 6
    config = make_config(corpus, tmp_path)
    message = r"test\.txt: 4 tokens are too few for data\.eval_batch_size=3 streams: the test split needs at least 6"
    with pytest.raises(DataError, match=message):
        run(config, tmp_path / "r")
    assert not (tmp_path / "r" / "metrics.jsonl").exists()  # refused before any training
    (corpus / "test.txt").write_text("the cat sat .\nthe dog .\n")  # 8 tokens: enough
    (corpus / "train.txt").write_text("the cat .\n")  # batch_size 4 needs 8
    with pytest.raises(DataError, match=r"train\.txt: 4 tokens are too few for data\.batch_size=4 streams"):
        read_splits(config.data)


@pytest.mark.slow
def test_brown_char_smoke(shared_data, tmp_path):
    config = make_config(
        shared_data / "lm/brown_char",
        tmp_path,
        level="char",
        data={"batch_size": 16, "eval_batch_size": 200, "bptt": 50},
        model={"encoder": "gru", "encoder_args": {"hidden_size": 64}, "tie_weights": False},
    )
    torch.manual_seed(0)
    task = LMTask(config, read_splits(config.data))
    assert len(task.vocab) == 85 + 2  # the README's 85 symbols, plus <pad> and <unk>
    optimizer = torch.optim.Adam(task.model.parameters(), lr=0.01)
    losses = []
    for step in task.train_batches(0)[:40]:
        loss, tokens = task.train_loss(step)[:2]
        assert tokens == 16 * 50
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    assert sum(losses[-5:]) / 5 < sum(losses[:5]) / 5 - 0.5
    dev = task.evaluate("dev")
    assert dev["bpc"] < 5.0 < math.log2(len(task.vocab))


def test_the_regulariser_is_reported_apart_from_the_training_loss(corpus, tmp_path):
    """train_loss is the objective (cross-entropy plus the MZU's -lambda*D); train_auxiliary is the
    regulariser's part of it, so train - auxiliary compares with the dev loss. An older run's loop
    state (no aux_sum) still resumes."""
    args = {"hidden_size": 8, "num_zones": 2, "disagreement": 1.0}
    model = {"encoder": "mzu", "encoder_args": args, "tie_weights": False}
    config = make_config(corpus, tmp_path, model=model, train={"epochs": 1, "checkpoint_every": 5})
    run(config, tmp_path / "mzu")
    epoch = metric_records(tmp_path / "mzu")[0]
    assert 0 < epoch["train_auxiliary"] < epoch["train_loss"]  # -lambda*D_zone, D_zone in [-1, 0]
    assert "(regulariser +" in (tmp_path / "mzu/train.log").read_text()
    state_path = tmp_path / "mzu/last/train_state.json"
    state = json.loads(state_path.read_text())
    del state["loop"]["aux_sum"]
    state_path.write_text(json.dumps(state))
    more = dataclasses.replace(config, train=dataclasses.replace(config.train, epochs=2))
    run(more, tmp_path / "mzu", resume=True)
    assert [r["event"] for r in metric_records(tmp_path / "mzu")] == ["epoch", "epoch", "test"]
    args["disagreement"] = 0.0
    run(make_config(corpus, tmp_path, model=model, train={"epochs": 1}), tmp_path / "plain")
    assert "train_auxiliary" not in metric_records(tmp_path / "plain")[0]


def test_tokens_outside_the_training_vocabulary_are_counted_in_a_warning(corpus, tmp_path, caplog):
    """Dev/test tokens that training never saw are scored as <unk>: the log says how many (at char
    level they raise the BPC: <unk> is never a training target). Splits without any: no warning."""
    for level in ("char", "word"):
        caplog.clear()
        LMTask(make_config(corpus, tmp_path, level=level), read_splits(make_config(corpus, tmp_path, level=level).data))
        assert not [r for r in caplog.records if "training vocabulary" in r.getMessage()]
    test = corpus / "test.txt"
    test.write_text(test.read_text(encoding="utf-8") + "the zebra sat on the quilt .\n", encoding="utf-8")
    for level, (count, distinct) in (("char", (2, 2)), ("word", (2, 2))):  # z and q; zebra and quilt
        caplog.clear()
        config = make_config(corpus, tmp_path, level=level)
        LMTask(config, read_splits(config.data))
        [message] = [r.getMessage() for r in caplog.records if "training vocabulary" in r.getMessage()]
        assert message.startswith(f"test: {count} of its ")
        assert f"; {distinct} distinct) are not in the training vocabulary" in message
        assert ("they raise the BPC" in message) is (level == "char")


@pytest.fixture
def lm_task(corpus, tmp_path):
    """An untrained word LM on the corpus, in training mode without dropout (deterministic)."""
    config = make_config(corpus, tmp_path, model={"dropout": 0.0, "embedding_dropout": 0.0})
    torch.manual_seed(0)
    task = LMTask(config, read_splits(config.data))
    task.model.train()
    return task


def _train_windows(task):
    """The (input, target) windows of the training stream, as the task cuts them."""
    return tbptt_batches(batchify(task.ids["train"], task.config.data.batch_size), task.config.data.bptt)


def test_lm_training_carries_the_state_from_window_to_window(lm_task):
    """Window 1 is read with window 0's final state (TBPTT), i.e. as one pass over both windows."""
    windows = _train_windows(lm_task)
    (x0, _), (x1, y1) = windows[0], windows[1]
    with torch.no_grad():
        lm_task.train_loss(0)
        carried = lm_task.train_loss(1).loss.item()
        logits, _ = lm_task.model(torch.cat([x0, x1], 1))
        one_pass = F.cross_entropy(logits[:, x0.shape[1] :].reshape(-1, logits.shape[-1]), y1.reshape(-1)).item()
    assert carried == pytest.approx(one_pass, rel=1e-5)


def test_lm_training_state_is_reset_at_the_first_window_of_an_epoch(lm_task):
    """The first window of every epoch is read from the zero state, not from the last window's."""
    with torch.no_grad():
        first = lm_task.train_loss(0).loss.item()
        for batch in lm_task.train_batches(0)[1:]:
            lm_task.train_loss(batch)
        again = lm_task.train_loss(lm_task.train_batches(1)[0]).loss.item()
    assert again == pytest.approx(first, rel=1e-6)


def test_lm_step_loss_counts_target_tokens(lm_task):
    """Each window's loss is a mean over its target tokens, and counts them (the epoch's
    train_loss is then per token; the last window is shorter)."""
    windows = _train_windows(lm_task)
    assert windows[-1][1].numel() != windows[0][1].numel()  # the fixture has a short last window
    with torch.no_grad():
        counts = [lm_task.train_loss(b).count for b in lm_task.train_batches(0)]
    assert counts == [y.numel() for _, y in windows]


def test_length_buckets_name_their_half_open_range(monkeypatch):
    """Buckets are half-open, [min_length, max_length)."""
    text = "ab\nabcde\nabcdefgh\n"  # lines of 2, 5 and 8 characters
    ids = torch.tensor([1 if c == "\n" else 2 for c in text])
    task = types.SimpleNamespace(
        _split_ids=lambda split: ids, token_nll=lambda split: torch.ones(len(ids), dtype=torch.float64),
        line_end_id=1, metric="bpc", metric_from_loss=lambda loss: loss,
    )  # fmt: skip
    buckets = loss_by_length_bucket(task, "dev", [5, 8])
    assert [(b["min_length"], b["max_length"], b["lines"], b["tokens"]) for b in buckets] == [
        (0, 5, 1, 3),
        (5, 8, 1, 6),
        (8, None, 1, 9),
    ]
