"""The GPU paths: every encoder and the Triton pooling kernel on CUDA against the CPU, and
training, resuming, evaluating and sampling with ``train.device: cuda``.

Skipped without a CUDA device (CI has none); run them where one exists with
``pytest -m gpu``. Each check compares a CUDA run with the same module's CPU run on the same
values (cuDNN's LSTM/GRU and cuBLAS round differently from the CPU, so the tolerances are a few
float32 ulps of the outputs' scale), and runs the encoder contract (padding, batch and chunking
invariance) on the GPU itself.
"""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest
import torch
from conftest import metric_records

from seqzoo import build_encoder
from seqzoo.cli import main
from seqzoo.kernels.qrnn_pool import POOLINGS, pool_backend, qrnn_pool, qrnn_pool_reference
from seqzoo.testing import assert_contract

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")]

#: (name, constructor arguments): every registered encoder, both directions where it has two.
ENCODERS = [
    ("lstm", {"num_layers": 2}),
    ("lstm", {"num_layers": 2, "bidirectional": True}),
    ("gru", {"num_layers": 2, "bidirectional": True}),
    ("dense_lstm", {"num_layers": 2, "bidirectional": True}),
    ("dense_gru", {"num_layers": 2}),
    ("gru_ln", {"bidirectional": True}),
    ("dtgru", {"transition_depth": 2, "bidirectional": True}),
    ("mzu", {"composition": "cap", "num_zones": 4, "transition_depth": 1}),
    ("mzu", {"composition": "sat", "num_zones": 2, "bidirectional": True}),
    ("mzu", {"composition": "gcn", "num_zones": 4}),
    ("qrnn", {"num_layers": 2, "window": 2}),
    ("qrnn", {"num_layers": 2, "window": 2, "pooling": "ifo", "bidirectional": True}),
    ("qrnn", {"num_layers": 2, "pooling": "f", "dense": True}),
    ("transformer", {"num_layers": 2, "nhead": 2, "dropout": 0.0}),
    ("transformer", {"num_layers": 2, "nhead": 2, "dropout": 0.0, "causal": True}),
]


def _id(case: tuple[str, dict]) -> str:
    name, args = case
    return "-".join([name, *(f"{k}={v}" for k, v in args.items())])


def _encoder(name: str, args: dict) -> torch.nn.Module:
    torch.manual_seed(0)
    return build_encoder(name, 6, hidden_size=8, **args)


def _run(encoder, x, mask, device):
    """Outputs and the gradients of the input and every parameter, on ``device``."""
    encoder = encoder.to(device)
    x = x.detach().to(device).requires_grad_(True)
    out, _ = encoder(x, mask.to(device))
    weights = torch.linspace(-1, 1, out.numel(), dtype=out.dtype, device=device).view_as(out)
    grads = torch.autograd.grad((out * weights).sum(), [x, *encoder.parameters()], allow_unused=True)
    return [out.cpu()] + [torch.zeros(1) if g is None else g.cpu() for g in grads]


@pytest.fixture
def full_float32():
    """No TF32: cuDNN's RNNs use it by default on Ampere and later GPUs (errors near 1e-3), which
    would hide real differences from the CPU."""
    flags = torch.backends.cudnn.allow_tf32, torch.backends.cuda.matmul.allow_tf32
    torch.backends.cudnn.allow_tf32 = torch.backends.cuda.matmul.allow_tf32 = False
    yield
    torch.backends.cudnn.allow_tf32, torch.backends.cuda.matmul.allow_tf32 = flags


@pytest.mark.parametrize("case", ENCODERS, ids=_id)
def test_encoder_on_cuda_equals_cpu_and_keeps_the_contract(case, full_float32):
    name, args = case
    # Training mode (cuDNN has no RNN backward in eval mode); no dropout or zoneout is configured,
    # so both devices compute one function.
    cpu = _encoder(name, args)
    gpu = copy.deepcopy(cpu)
    gen = torch.Generator().manual_seed(1)
    x = torch.randn(5, 11, 6, generator=gen)
    mask = torch.arange(11) < torch.tensor([11, 4, 7, 1, 9]).unsqueeze(1)
    on_cpu, on_gpu = _run(cpu, x, mask, "cpu"), _run(gpu, x, mask, "cuda")
    names = ["outputs", "d_input", *[n for n, _ in cpu.named_parameters()]]
    for what, a, b in zip(names, on_cpu, on_gpu, strict=True):
        scale = a.abs().max().item() or 1.0
        assert torch.allclose(a, b, atol=2e-5 * scale, rtol=1e-4), f"{what}: max diff {(a - b).abs().max():.3g}"
    assert_contract(gpu, atol=1e-4)


@pytest.mark.parametrize("pooling", list(POOLINGS))
@pytest.mark.parametrize("zoneout", ["none", "train", "eval"])
@pytest.mark.parametrize("reverse", [False, True])
def test_triton_kernel_on_cuda_matches_the_reference(pooling, zoneout, reverse):
    assert pool_backend("cuda") == "triton"
    gen = torch.Generator().manual_seed(0)
    batch, time, hidden = 4, 37, 300  # a hidden size over one Triton block, a length over one chunk
    gates = torch.randn(batch, time, POOLINGS[pooling], hidden, generator=gen).cuda().requires_grad_(True)
    c0 = torch.randn(batch, hidden, generator=gen).cuda().requires_grad_(True)
    lengths = torch.tensor([time, time // 2, 0, 1]).cuda()
    keep = (torch.rand(batch, time, hidden, generator=gen) >= 0.3).cuda() if zoneout == "train" else None
    kwargs = {"pooling": pooling, "keep": keep, "keep_prob": 0.7 if zoneout == "eval" else 1.0, "reverse": reverse}
    grad_h = torch.randn(batch, time, hidden, generator=gen).cuda()
    grad_c = torch.randn(batch, hidden, generator=gen).cuda()
    results = []
    for fn in (qrnn_pool, qrnn_pool_reference):
        h, c = fn(gates, lengths, c0, **kwargs)
        results.append((h, c, *torch.autograd.grad((h, c), (gates, c0), (grad_h, grad_c))))
    for what, a, b in zip(("h", "c_last", "d_gates", "d_c0"), *results, strict=True):
        assert torch.allclose(a, b, atol=1e-5, rtol=1e-5), f"{what}: max diff {(a - b).abs().max():.3g}"
    h = results[0][0]
    assert not h[1, time // 2 :].any() and not h[2].any(), "outputs at pads must be zero"


@pytest.mark.parametrize("pooling", list(POOLINGS))
def test_triton_kernel_float64_gradcheck_on_cuda(pooling):
    gen = torch.Generator().manual_seed(2)
    gates = torch.randn(3, 5, POOLINGS[pooling], 4, generator=gen, dtype=torch.float64).cuda().requires_grad_(True)
    c0 = torch.randn(3, 4, generator=gen, dtype=torch.float64).cuda().requires_grad_(True)
    lengths = torch.tensor([5, 2, 0]).cuda()
    keep = (torch.rand(3, 5, 4, generator=gen) >= 0.3).cuda()
    for reverse in (False, True):

        def pool(g, c, reverse=reverse):
            return qrnn_pool(g, lengths, c, pooling=pooling, keep=keep, reverse=reverse)

        assert torch.autograd.gradcheck(pool, (gates, c0))


def _autocast_run(encoder, x, mask, dtype, enabled=True):
    """``encoder``'s outputs and the float32 gradients of ``out.float().square().sum()`` with respect
    to ``x`` and every parameter (zeros for an unused one), under autocast in ``dtype`` or not."""
    x = x.detach().requires_grad_(True)
    with torch.autocast(x.device.type, dtype=dtype, enabled=enabled):
        out, _ = encoder(x, mask)
    grads = torch.autograd.grad(out.float().square().sum(), [x, *encoder.parameters()], allow_unused=True)
    return out, [torch.zeros(1, device=x.device) if g is None else g.float() for g in grads]


def _assert_near(expected, got, rtol, atol=0.0):
    assert torch.isfinite(got).all()
    error = (expected - got).norm()
    assert error <= rtol * expected.norm() + atol, f"relative error {(error / expected.norm()).item():.3g}"


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_qrnn_under_autocast_on_cuda_follows_float32(dtype):
    """Mixed precision: the projection runs in half precision, the Triton kernel widens the gates
    to float32 and stores half outputs; outputs and gradients stay near the float32 run's."""
    encoder = _encoder("qrnn", {"num_layers": 2, "window": 2, "bidirectional": True}).cuda()
    gen = torch.Generator().manual_seed(3)
    x = torch.randn(4, 40, 6, generator=gen).cuda()
    mask = (torch.arange(40) < torch.tensor([40, 17, 1, 33]).unsqueeze(1)).cuda()
    expected, expected_grads = _autocast_run(encoder, x, mask, dtype, enabled=False)
    out, grads = _autocast_run(encoder, x, mask, dtype)
    assert expected.dtype == torch.float32 and out.dtype == dtype
    for a, b in zip([expected, *expected_grads], [out.float(), *grads], strict=True):
        _assert_near(a, b, 2e-2)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=["bf16", "fp16"])
@pytest.mark.parametrize("case", ENCODERS, ids=_id)
def test_every_encoder_under_cuda_autocast_follows_float32(case, dtype, full_float32):
    """Half-precision input (what a layer before the encoder gives under autocast), padded, forward
    and backward on CUDA: finite, zero at the pads and near the float32 run on the same (rounded)
    input. On the CPU this once crashed the DT-GRU and GRU+LN in bfloat16. The MZU's
    gradients are not compared: at such sizes they are ill-conditioned (on the CPU, rounding the
    input alone to bfloat16 moved some of them by up to 98 % in float32 arithmetic); test_mzu
    checks its autocast run exactly, on CUDA too."""
    name, args = case
    encoder = _encoder(name, args).cuda()
    gen = torch.Generator().manual_seed(4)
    x = torch.randn(4, 24, 6, generator=gen).to(dtype).cuda()
    mask = (torch.arange(24) < torch.tensor([24, 9, 1, 17]).unsqueeze(1)).cuda()
    expected, expected_grads = _autocast_run(encoder, x.float(), mask, dtype, enabled=False)
    out, grads = _autocast_run(encoder, x, mask, dtype)
    assert not out[~mask].any(), "outputs at pads must be zero"
    _assert_near(expected, out.float(), 3e-2)
    for a, b in zip(expected_grads, grads, strict=True):
        assert torch.isfinite(b).all()
        if name != "mzu":
            _assert_near(a, b, 5e-2, atol=1e-6)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=["bf16", "fp16"])
@pytest.mark.parametrize("name", ["lstm", "gru"])
def test_lstm_gru_dtype_under_cuda_autocast_does_not_depend_on_the_mask(name, dtype):
    """Under CUDA autocast cuDNN runs both the all-real and the packed (padded) path in half
    precision, so the CPU's widening of the all-real path to float32 must stay off here."""
    encoder = _encoder(name, {"num_layers": 2}).cuda()
    x = torch.randn(3, 7, 6, device="cuda")
    dtypes = set()
    for lengths in ([7, 7, 7], [7, 4, 2]):
        mask = (torch.arange(7) < torch.tensor(lengths).unsqueeze(1)).cuda()
        with torch.autocast("cuda", dtype=dtype):
            out, _ = encoder(x, mask)
        dtypes.add(out.dtype)
    assert dtypes == {dtype}


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=["bf16", "fp16"])
def test_qrnn_reference_pooling_under_cuda_autocast_follows_the_triton_kernel(dtype, monkeypatch):
    """Without Triton (``SEQZOO_QRNN_BACKEND=reference``, as on a CUDA machine where it cannot
    load) the reference pools the half-precision gates in their own type: still near the Triton
    kernel, which widens them to float32."""
    encoder = _encoder("qrnn", {"num_layers": 2, "window": 2, "zoneout": 0.2, "bidirectional": True}).cuda().eval()
    gen = torch.Generator().manual_seed(5)
    x = torch.randn(4, 40, 6, generator=gen).cuda()
    mask = (torch.arange(40) < torch.tensor([40, 17, 1, 33]).unsqueeze(1)).cuda()
    monkeypatch.setenv("SEQZOO_QRNN_BACKEND", "auto")
    triton, triton_grads = _autocast_run(encoder, x, mask, dtype)
    monkeypatch.setenv("SEQZOO_QRNN_BACKEND", "reference")
    reference, reference_grads = _autocast_run(encoder, x, mask, dtype)
    for a, b in zip([triton.float(), *triton_grads], [reference.float(), *reference_grads], strict=True):
        _assert_near(a, b, 2e-2)


def _classifier_config(data_dir: Path, tmp_path: Path) -> Path:
    """The toy sentiment task with a QRNN that uses every Triton path (zoneout masks, both
    directions, a carried convolution window) and dropout that draws from the GPU's generator."""
    path = tmp_path / "toy.yaml"
    path.write_text(
        f"""
name: toy
data: {{name: toy, data_dir: {data_dir}, embedding_dim: 16}}
model:
  encoder: qrnn
  encoder_args: {{hidden_size: 12, num_layers: 2, window: 2, zoneout: 0.1, bidirectional: true, dropout: 0.2}}
  pooler: mean
  dropout: 0.2
optim: {{optimizer: adam, lr: 0.01}}
train: {{epochs: 3, batch_size: 8, patience: null, checkpoint_every: 10, seed: 3, progress: false}}
""",
        encoding="utf-8",
    )
    return path


def test_a_run_trained_on_cuda_evaluates_alike_on_the_cpu(toy_corpus, tmp_path, capsys):
    config = _classifier_config(toy_corpus, tmp_path)
    run_dir = tmp_path / "run"
    assert main(["train", str(config), "--run-dir", str(run_dir), "--set", "train.device=cuda"]) == 0
    assert "training on cuda" in (run_dir / "train.log").read_text()
    test = metric_records(run_dir)[-1]
    assert test["test_accuracy"] >= 0.8  # the toy task is learnable
    capsys.readouterr()
    for device in ("cuda", "cpu"):
        assert main(["evaluate", str(run_dir), "--set", f"train.device={device}"]) == 0
        metrics = json.loads(capsys.readouterr().out.splitlines()[0])
        assert metrics["accuracy"] == pytest.approx(test["test_accuracy"], abs=1 / 60)  # a borderline example
        assert metrics["loss"] == pytest.approx(test["test_loss"], rel=1e-4)


@pytest.mark.parametrize("precision", ["fp32", "bf16", "fp16"])
def test_resuming_on_cuda_restores_the_gpu_generator(toy_corpus, tmp_path, precision):
    """A run stopped after epoch 1 and resumed for epoch 2 matches a run of 2 epochs: the dropout
    and zoneout masks of epoch 2 come from the GPU generator's saved state, not a fresh seed; in
    mixed precision too (fp16: the loss scale comes back from ``last/``)."""
    config = _classifier_config(toy_corpus, tmp_path)
    device = ["--set", "train.device=cuda", "--set", f"train.precision={precision}"]
    assert main(["train", str(config), "--run-dir", str(tmp_path / "whole"), "--set", "train.epochs=2", *device]) == 0
    assert main(["train", str(config), "--run-dir", str(tmp_path / "cut"), "--set", "train.epochs=1", *device]) == 0
    assert main(["train", "--resume", str(tmp_path / "cut"), "--set", "train.epochs=2", *device]) == 0
    whole, cut = metric_records(tmp_path / "whole"), metric_records(tmp_path / "cut")
    assert [r["event"] for r in cut] == ["epoch", "epoch", "test"]
    assert whole[-1]["test_loss"] < whole[0]["train_loss"]  # it learned, in half precision too
    scaler = json.loads((tmp_path / "cut/last/train_state.json").read_text())["grad_scaler"]
    assert (scaler is not None) == (precision == "fp16")
    for a, b in zip(whole, cut, strict=True):
        for key, value in a.items():
            assert b[key] == (pytest.approx(value, rel=1e-5) if isinstance(value, float) else value), key


def _lm_config(tmp_path: Path) -> Path:
    """A char LM on a repeated line, with a QRNN whose carried state crosses the TBPTT windows."""
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    line = "the cat sat on the mat . a dog ran to the river .\n"
    for stem, repeats in (("train", 60), ("valid", 12), ("test", 12)):
        (corpus / f"{stem}.txt").write_text(line * repeats, encoding="utf-8")
    config = tmp_path / "lm.yaml"
    config.write_text(
        f"""
name: toy_lm
task: lm
data: {{data_dir: {corpus}, level: char, batch_size: 4, eval_batch_size: 3, bptt: 20, embedding_dim: 16}}
model: {{encoder: qrnn, encoder_args: {{hidden_size: 32, num_layers: 2, window: 2, zoneout: 0.1}}, dropout: 0.1}}
optim: {{optimizer: adam, lr: 0.01}}
train: {{epochs: 2, patience: null, progress: false, checkpoint_every: 10, device: cuda}}
""",
        encoding="utf-8",
    )
    return config


def test_a_language_model_trains_evaluates_and_samples_on_cuda(tmp_path, capsys):
    config = _lm_config(tmp_path)
    run_dir = tmp_path / "run"
    assert main(["train", str(config), "--run-dir", str(run_dir)]) == 0
    test = metric_records(run_dir)[-1]
    assert test["test_bpc"] < 2.5  # learning: a uniform guess over the 20 symbols is 4.4 bits
    capsys.readouterr()
    assert main(["evaluate", str(run_dir), "--set", "train.device=cpu"]) == 0
    assert json.loads(capsys.readouterr().out.splitlines()[0])["bpc"] == pytest.approx(test["test_bpc"], rel=1e-4)
    assert main(["sample", str(run_dir), "--length", "30", "--prime", "the "]) == 0
    assert capsys.readouterr().out.startswith("the ")


class _Killed(Exception):
    pass


def test_a_language_model_resumed_mid_epoch_on_cuda_goes_on_from_its_carried_state(tmp_path, monkeypatch):
    """The carried (c, window) state saved mid-epoch comes back on the GPU (it is stored on the
    CPU), and the resumed run matches the uninterrupted one."""
    from seqzoo.tasks.lm import LMTask

    config = _lm_config(tmp_path)
    assert main(["train", str(config), "--run-dir", str(tmp_path / "clean")]) == 0
    original, calls = LMTask.train_loss, []

    def dying(self, batch):
        calls.append(batch)
        if len(calls) == 15:  # 5 steps after the checkpoint at step 10, mid epoch 1
            raise _Killed
        return original(self, batch)

    monkeypatch.setattr(LMTask, "train_loss", dying)
    with pytest.raises(_Killed):
        main(["train", str(config), "--run-dir", str(tmp_path / "killed")])
    monkeypatch.setattr(LMTask, "train_loss", original)
    saved = json.loads((tmp_path / "killed/last/train_state.json").read_text())
    assert saved["loop"]["step_in_epoch"] == 10 and saved["extra"]["state"] is not None
    assert main(["train", "--resume", str(tmp_path / "killed")]) == 0
    clean, resumed = metric_records(tmp_path / "clean"), metric_records(tmp_path / "killed")
    for a, b in zip(clean, resumed, strict=True):
        for key, value in a.items():
            assert b[key] == (pytest.approx(value, rel=1e-5) if isinstance(value, float) else value), key
