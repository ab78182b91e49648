"""The multi-task recipe: every architecture trains and evaluates per task, shared parameters are one
tensor saved once, task sampling is seeded and proportional, ASP-MTL's gradient reversal and
orthogonality loss, a transfer stage keeps the frozen meta cells, exact resume after SIGKILL, and
``seqzoo predict --task``."""

import json
from collections import Counter

import pytest
import torch
from conftest import assert_same_runs, kill_resume_and_rerun, metric_records, predicted_rows, write_sentiment_corpus
from safetensors.torch import load_file

from seqzoo.cli import main
from seqzoo.config import ConfigError, load_config
from seqzoo.tasks.multitask import grad_reverse, orthogonality_loss
from seqzoo.training.registry import get_task
from seqzoo.training.runner import load_task, run

CONFIG = """\
task: multitask
data:
  data_dir: {data}
  tasks: [{{name: alpha}}, {{name: beta, weight: 0.5}}, {{name: gamma, max_train: 40}}]
  architecture: {architecture}
  embedding_dim: 8
model: {{encoder: {encoder}, encoder_args: {args}, pooler: last, dropout: 0.1}}
train: {{epochs: 2, batch_size: 8, patience: null, progress: false, log_every: null, device: cpu, threads: 1,
         checkpoint_every: 0}}
"""
LSTM_ARGS = "{hidden_size: 6, bidirectional: true}"
META_ARGS = "{hidden_size: 6, meta_size: 4, bidirectional: true}"


@pytest.fixture(scope="module")
def corpora(tmp_path_factory):
    """Three small sentiment tasks with different texts (seeds) and sizes."""
    directory = tmp_path_factory.mktemp("mtl")
    for seed, (name, sizes) in enumerate([("alpha", (64, 16, 16)), ("beta", (32, 16, 16)), ("gamma", (96, 16, 16))]):
        write_sentiment_corpus(directory, name, sizes, seed=seed)
    return directory


def _config(corpora, tmp_path, architecture="meta", extra="", name="mtl.yaml"):
    encoder, args = ("meta_lstm", META_ARGS) if architecture == "meta" else ("lstm", LSTM_ARGS)
    path = tmp_path / name
    path.write_text(CONFIG.format(data=corpora, architecture=architecture, encoder=encoder, args=args) + extra)
    return path


def _task(corpora, tmp_path, architecture="meta", overrides=()):
    config = load_config(_config(corpora, tmp_path, architecture), list(overrides))
    return get_task("multitask").build_tasks(config)[0][1]


@pytest.mark.parametrize("architecture", ["single", "fs", "sp", "asp", "meta"])
def test_each_architecture_trains_and_evaluates_per_task(corpora, tmp_path, architecture, single_thread):
    config = load_config(_config(corpora, tmp_path, architecture), ["train.epochs=1"])
    summary = run(config, tmp_path / "run")
    metrics = summary["metrics"]
    for name in ("alpha", "beta", "gamma"):
        assert 0.0 <= metrics[f"test_{name}/accuracy"]["mean"] <= 1.0
    macro = sum(metrics[f"test_{name}/accuracy"]["mean"] for name in ("alpha", "beta", "gamma")) / 3
    assert metrics["test_accuracy"]["mean"] == pytest.approx(macro)
    epochs = [r for r in metric_records(tmp_path / "run") if r["event"] == "epoch"]
    assert len(epochs) == 1 and "dev_beta/accuracy" in epochs[0]
    assert ("train_auxiliary" in epochs[0]) == (architecture == "asp")  # λ L_adv + γ L_diff, reported apart
    reloaded = load_task(tmp_path / "run")  # the best checkpoint reloads to the same test figures
    assert reloaded.evaluate("test")["accuracy"] == pytest.approx(metrics["test_accuracy"]["mean"])


@pytest.mark.parametrize("architecture", ["fs", "meta"])
def test_shared_parameters_are_one_tensor_and_saved_once(corpora, tmp_path, architecture):
    task = _task(corpora, tmp_path, architecture)
    model = task.model
    if architecture == "meta":
        cells = [model.private[name]["branch"].encoder.cells for name in ("alpha", "beta", "gamma")]
        for layer in range(len(cells[0])):
            pointers = {c[layer].meta.weight_x.data_ptr() for c in cells}
            assert len(pointers) == 1 and pointers == {model.shared[layer].weight_x.data_ptr()}
            assert len({c[layer].basic.P.data_ptr() for c in cells}) == 3  # P, Q, B are each task's own
    state = model.state_dict()
    names = [n for n, _ in model.named_parameters(remove_duplicate=False)]
    assert len(state) == len({id(p) for p in model.parameters()})  # each tensor once (no persistent buffers)
    assert all(not n.startswith("private.") or ".meta." not in n for n in state)
    assert (len(names) > len(state)) == (architecture == "meta")  # fs: the one shared encoder has one name anyway
    assert any(k.startswith("shared.") for k in state) and any(k.startswith("embedding.") for k in state)
    summary = run(load_config(_config(corpora, tmp_path, architecture), ["train.epochs=1"]), tmp_path / "r")
    saved = load_file(tmp_path / "r" / "best" / "model.safetensors")
    assert set(saved) == set(state)
    reloaded = load_task(tmp_path / "r")  # the one saved copy fills every name the shared tensors have
    assert reloaded.evaluate("test")["accuracy"] == pytest.approx(summary["metrics"]["test_accuracy"]["mean"])
    if architecture == "meta":
        encoders = [reloaded.model.private[name]["branch"].encoder for name in ("alpha", "beta")]
        assert encoders[0].cells[0].meta is encoders[1].cells[0].meta is reloaded.model.shared[0]


def test_task_sampling_is_seeded_and_proportional(corpora, tmp_path):
    task = _task(corpora, tmp_path, "fs", ["data.steps_per_epoch=3000"])
    first = task.train_batches(0)
    assert first == task.train_batches(0) and first != task.train_batches(1)  # a function of (seed, epoch)
    counts = Counter(name for name, _ in first)
    sizes = {"alpha": 64, "beta": 32, "gamma": 40}  # gamma's train capped at max_train 40
    for name, size in sizes.items():
        expected = 3000 * size / sum(sizes.values())
        assert abs(counts[name] - expected) < 4 * expected**0.5  # within 4 binomial standard deviations
    seen = Counter(i for name, batch in first if name == "beta" for i in batch)  # every pass covers the task once
    assert set(seen) == set(range(32)) and max(seen.values()) - min(seen.values()) <= 1
    uniform = _task(corpora, tmp_path, "fs", ["data.steps_per_epoch=3000", "data.sampling=uniform"])
    counts = Counter(name for name, _ in uniform.train_batches(0))
    assert all(abs(counts[name] - 1000) < 4 * (3000 * 1 / 3 * 2 / 3) ** 0.5 for name in sizes)
    other = _task(corpora, tmp_path, "fs", ["data.steps_per_epoch=3000", "train.seed=2"])
    assert other.train_batches(0) != first
    default = _task(corpora, tmp_path, "fs")
    assert len(default.train_batches(0)) == 8 + 4 + 5  # the tasks' batches together


def test_gradient_reversal_flips_the_discriminators_gradient_into_the_shared_encoder():
    torch.manual_seed(0)
    features = torch.randn(5, 4, dtype=torch.float64, requires_grad=True)
    discriminator = torch.nn.Linear(4, 3).double()
    target = torch.tensor([0, 1, 2, 1, 0])
    plain = torch.autograd.grad(torch.nn.functional.cross_entropy(discriminator(features), target), features)[0]
    reversed_loss = torch.nn.functional.cross_entropy(discriminator(grad_reverse(features)), target)
    assert torch.equal(grad_reverse(features), features)  # the identity forward
    weight_grad, flipped = torch.autograd.grad(reversed_loss, [discriminator.weight, features])
    assert torch.equal(flipped, -plain)
    plain_weight = torch.autograd.grad(
        torch.nn.functional.cross_entropy(discriminator(features), target), discriminator.weight
    )
    assert torch.equal(weight_grad, plain_weight[0])  # the discriminator itself learns as usual


def test_asp_step_reverses_the_adversarial_gradient_in_the_shared_encoder(corpora, tmp_path):
    """Through the model: the shared encoder gets −(the gradient of λ·L_adv), the discriminator +."""
    task = _task(corpora, tmp_path, "asp", ["data.orthogonality_weight=0", "model.dropout=0"])
    model = task.model.double()
    ids, mask, labels = task._batch("beta", "train", list(range(8)))
    shared = model.encode("beta", ids, mask).shared  # (B, S)
    target = torch.full_like(labels, model.task_names.index("beta"))
    params = [p for p in model.shared.parameters()]
    adversarial = torch.nn.functional.cross_entropy(model.discriminator(grad_reverse(shared)), target)
    reversed_grads = torch.autograd.grad(adversarial, params, retain_graph=True)
    plain = torch.autograd.grad(torch.nn.functional.cross_entropy(model.discriminator(shared), target), params)
    assert all(torch.allclose(r, -p, rtol=0, atol=1e-12) for r, p in zip(reversed_grads, plain, strict=True))
    assert any(p.abs().sum() > 0 for p in plain)


def test_orthogonality_loss_is_the_squared_frobenius_norm_of_shared_t_private():
    torch.manual_seed(0)
    shared, private = torch.randn(6, 4, dtype=torch.float64), torch.randn(6, 3, dtype=torch.float64)
    expected = sum(
        sum(shared[n, i] * private[n, j] for n in range(6)) ** 2 for i in range(4) for j in range(3)
    )  # Σ_ij (Σ_n S_ni H_nj)²
    assert orthogonality_loss(shared, private).item() == pytest.approx(float(expected), rel=1e-12)
    assert orthogonality_loss(shared, torch.zeros(6, 3, dtype=torch.float64)).item() == 0.0


TRANSFER = """\
stages:
  - name: shared
    data: {active: [alpha, beta]}
  - name: transfer
    init_from: shared
    freeze: [shared., embedding.]
    data: {active: [gamma]}
  - name: finetune_beta
    init_from: shared
    data: {active: [beta]}
    optim: {lr: 0.0005}
"""


def test_transfer_stage_keeps_the_frozen_meta_cells_and_fine_tuning_starts_from_the_joint_model(
    corpora, tmp_path, single_thread
):
    config = load_config(_config(corpora, tmp_path, "meta", TRANSFER), ["train.epochs=1"])
    summary = run(config, tmp_path / "t")
    assert set(summary["stages"]["shared"]["metrics"]) >= {"test_alpha/accuracy", "test_beta/accuracy"}
    assert "test_gamma/accuracy" in summary["stages"]["transfer"]["metrics"]
    joint = load_file(tmp_path / "t" / "shared" / "best" / "model.safetensors")
    transfer = load_file(tmp_path / "t" / "transfer" / "best" / "model.safetensors")
    frozen = [k for k in joint if k.startswith(("shared.", "embedding."))]
    assert frozen and all(torch.equal(joint[k], transfer[k]) for k in frozen)  # bit-identical
    assert not any(k.startswith(("private.alpha", "private.beta")) for k in transfer)  # only gamma's own parts
    report = json.loads((tmp_path / "t" / "transfer" / "init_from.json").read_text())
    assert set(report["loaded"]) == set(frozen) and all(k.startswith("private.gamma.") for k in report["not_loaded"])
    tuned = load_file(tmp_path / "t" / "finetune_beta" / "best" / "model.safetensors")
    assert set(tuned) == {k for k in joint if not k.startswith("private.alpha.")}
    assert not torch.equal(tuned["shared.0.weight_x"], joint["shared.0.weight_x"])  # fine-tuning moves everything


def test_config_errors_name_the_key(corpora, tmp_path):
    with pytest.raises(ConfigError, match="active"):
        load_config(_config(corpora, tmp_path, "fs"), ["data.active=[delta]"])
    with pytest.raises(ConfigError, match=r"adversarial_weight.*no effect"):
        load_config(_config(corpora, tmp_path, "fs"), ["data.adversarial_weight=0.1"])
    with pytest.raises(ConfigError, match=r"model:.*meta_lstm"):
        _task(corpora, tmp_path, "fs", ["data.architecture=meta"])


def test_resume_after_sigkill_mid_epoch_reproduces_the_uninterrupted_run(corpora, tmp_path, single_thread):
    settings = ["train.epochs=1", "train.checkpoint_every=5", "train.log_every=3"]
    # 17 steps in the epoch, checkpoints every 5 steps: step 13 is killed 2 steps after the checkpoint of step 10.
    state = kill_resume_and_rerun("multitask.MultiTask", _config(corpora, tmp_path, "meta"), settings, 13, tmp_path)
    assert (state["epoch"], state["step_in_epoch"]) == (0, 10)
    assert_same_runs(tmp_path / "killed", tmp_path / "clean")


def test_predict_names_the_task(corpora, tmp_path, capsys, single_thread):
    run(load_config(_config(corpora, tmp_path, "sp"), ["train.epochs=1"]), tmp_path / "p")
    texts = tmp_path / "texts.txt"
    texts.write_text("a superb film\n\nawful\n")
    rows = predicted_rows(capsys, tmp_path / "p", texts, "--task", "beta")
    assert [r["line"] for r in rows] == [1, 3] and all(r["task"] == "beta" for r in rows)
    assert set(rows[0]["probabilities"]) == {"neg", "pos"}
    task = load_task(tmp_path / "p", with_data=False)
    expected = task.predict(["a superb film", "awful"], task="beta")  # the same batch: the same figures
    assert [{k: r[k] for k in ("label", "probabilities", "task")} for r in rows] == expected
    assert main(["predict", str(tmp_path / "p"), "--input", str(texts)]) == 2  # which task's labels?
    assert "--task" in capsys.readouterr().err
