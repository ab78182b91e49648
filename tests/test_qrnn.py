"""QRNN encoder: contract in all configurations, zoneout (eq. 6), dropout, dense stacks, backends."""

from __future__ import annotations

import copy
import itertools
import warnings

import pytest
import torch
from numerics import EPS32, assert_all_close_to_float64, assert_close_to_float64

from seqzoo.encoders.base import build_encoder
from seqzoo.encoders.qrnn import QRNN, QRNNLayer
from seqzoo.testing import assert_contract

CONFIGS = list(itertools.product([False, True], [1, 2, 3], [False, True], [1, 2], ["f", "fo", "ifo"]))


@pytest.mark.parametrize(("bidirectional", "window", "dense", "num_layers", "pooling"), CONFIGS)
def test_contract(bidirectional, window, dense, num_layers, pooling):
    torch.manual_seed(0)
    encoder = QRNN(
        6,
        5,
        num_layers=num_layers,
        bidirectional=bidirectional,
        window=window,
        dense=dense,
        pooling=pooling,
        zoneout=0.2,
        dropout=0.3 if num_layers > 1 else 0.0,
    )
    assert encoder.causal == encoder.stateful == (not bidirectional)
    assert_contract(encoder)


def test_registered_with_per_layer_windows_and_dense_widths():
    encoder = build_encoder("qrnn", 7, hidden_size=4, num_layers=3, window=[4, 2, 2], dense=True, bidirectional=True)
    assert encoder.output_size == 8
    assert [d[0].linear.in_features for d in encoder.layers] == [4 * 7, 2 * (7 + 8), 2 * (7 + 16)]
    out, _ = encoder(torch.randn(2, 5, 7))
    assert out.shape == (2, 5, 8)


def _pool_f_by_hand(layer: QRNNLayer, x: torch.Tensor):
    """z, f of an f-pooling layer and the stepwise states h (B, T, H) from its forward pass."""
    gates = layer.linear(x).view(*x.shape[:2], 2, layer.hidden_size)
    h, _, _ = layer(x, torch.full((x.shape[0],), x.shape[1]))
    return torch.tanh(gates[:, :, 0]), torch.sigmoid(gates[:, :, 1]), h


def test_zoneout_training_copies_old_state_without_rescaling():
    torch.manual_seed(0)
    layer = QRNNLayer(6, 64, pooling="f", zoneout=0.4).train()
    x = torch.randn(8, 20, 6)
    with torch.no_grad():
        z, f, h = _pool_f_by_hand(layer, x)
    prev = torch.cat([torch.zeros_like(h[:, :1]), h[:, :-1]], 1)  # h_{t-1}, h_0 = 0
    copied = h == prev  # f = 1 and (1 - f) z = 0 exactly: the state is copied, not recomputed
    # eq. 3 with the raw, unscaled f, recomputed here: |h|, |z| <= 1, so a few roundings of size 1 apart
    updated = torch.isclose(h, f * prev + (1 - f) * z, atol=8 * EPS32, rtol=0)
    assert bool((copied | updated).all()), "every channel either keeps its state or takes the normal update"
    assert abs(copied.float().mean().item() - 0.4) < 0.03


def test_zoneout_evaluation_uses_the_expectation():
    torch.manual_seed(0)
    layer = QRNNLayer(6, 16, pooling="f", zoneout=0.25).eval()
    x = torch.randn(3, 10, 6)
    with torch.no_grad():
        z, f, h = _pool_f_by_hand(layer, x)
    expected = []
    for dtype in (torch.float32, torch.float64):  # the recurrence written out, and in float64 to bound rounding
        f_eval = 1 - (1 - 0.25) * (1 - f.to(dtype))
        c, states = torch.zeros(3, 16, dtype=dtype), []
        for t in range(10):
            c = f_eval[:, t] * c + (1 - f_eval[:, t]) * z[:, t].to(dtype)
            states.append(c)
        expected.append(torch.stack(states, 1))
    assert_close_to_float64(h, expected[1], expected[0])


def test_dropout_only_between_layers():
    torch.manual_seed(0)
    x = torch.randn(2, 6, 5)
    with pytest.warns(UserWarning, match="no effect with num_layers=1"):
        single = QRNN(5, 8, dropout=0.9)
    assert torch.equal(single.train()(x)[0], single.eval()(x)[0])
    stacked = QRNN(5, 8, num_layers=2, dropout=0.9)
    assert not torch.allclose(stacked.train()(x)[0], stacked.eval()(x)[0])


def test_bidirectional_rejects_state():
    encoder = QRNN(4, 3, bidirectional=True)
    _, state = encoder(torch.randn(2, 5, 4))
    with pytest.raises(ValueError, match="not stateful"):
        encoder(torch.randn(2, 5, 4), state=state)


def test_state_of_another_batch_or_layout_is_refused():
    encoder = QRNN(4, 3, num_layers=2, window=2)
    x = torch.randn(2, 5, 4)
    _, state = encoder(x)
    encoder(x, state=state)  # the state it returned fits
    other_batch = tuple((c[:1], tail[:1]) for c, tail in state)
    for bad in (state[:1], other_batch, ((*state[0], None), state[1]), 0, state[0][0], (state[0], 0)):
        with pytest.raises(ValueError, match="state must hold"):
            encoder(x, state=bad)


@pytest.mark.parametrize("bidirectional", [False, True])
def test_fast_path_matches_reference_through_the_encoder(monkeypatch, bidirectional):
    """Values and all gradients agree, with padding, carried state (k = 3) and zoneout in training."""
    torch.manual_seed(0)
    encoder = QRNN(5, 6, num_layers=2, window=3, pooling="ifo", zoneout=0.3, bidirectional=bidirectional).train()
    x = torch.randn(4, 7, 5, requires_grad=True)
    mask = torch.arange(7) < torch.tensor([7, 3, 0, 5]).unsqueeze(1)
    state = None
    if not bidirectional:
        with torch.no_grad():
            _, state = encoder(torch.randn(4, 4, 5))
    results = []
    exact = copy.deepcopy(encoder).double()  # its zoneout masks are drawn in float32 whatever its dtype
    x64, state64 = (
        x.detach().double().requires_grad_(),
        None if state is None else [[t.double() for t in s] for s in state],
    )
    for backend, model, inputs, carried in (
        ("auto", encoder, x, state),
        ("reference", encoder, x, state),
        ("reference", exact, x64, state64),
    ):
        monkeypatch.setenv("SEQZOO_QRNN_BACKEND", backend)
        torch.manual_seed(1)  # same zoneout masks
        out, final = model(inputs, mask, carried)
        loss = out.square().sum() + sum(c.square().sum() for c, _ in final)
        results.append([out, *torch.autograd.grad(loss, [inputs, *model.parameters()])])
    fast, reference, float64 = results
    assert_all_close_to_float64(fast, float64, reference)


@pytest.mark.parametrize("bidirectional", [False, True])
def test_cpu_autocast_projects_in_bfloat16_and_pools_in_float32(monkeypatch, bidirectional):
    """Under CPU autocast (``train.precision: bf16``) the convolution's matmul runs in bfloat16
    and the fused kernel takes the bfloat16 gates and pools them in float32 (no fallback warning):
    outputs, the carried state and all gradients stay near the float32 run's, and the state is float32."""
    import importlib

    qrnn_pool = importlib.import_module("seqzoo.kernels.qrnn_pool")
    pooled = []
    original = qrnn_pool.qrnn_pool_compiled
    monkeypatch.setattr(
        qrnn_pool, "qrnn_pool_compiled", lambda g, *a, **k: (pooled.append(g.dtype), original(g, *a, **k))[1]
    )
    torch.manual_seed(0)
    encoder = QRNN(6, 16, num_layers=2, window=2, pooling="fo", bidirectional=bidirectional).eval()
    x = torch.randn(4, 300, 6, requires_grad=True)
    mask = torch.arange(300) < torch.tensor([300, 170, 1, 33]).unsqueeze(1)
    results = []
    for enabled in (False, True):
        with warnings.catch_warnings():
            warnings.simplefilter("error")  # the fused kernel runs: no fallback to the reference
            with torch.autocast("cpu", dtype=torch.bfloat16, enabled=enabled):
                out, final = encoder(x, mask)
        assert out.dtype == torch.float32
        c_last = final[-1][0] if final is not None else out[:, 0]
        assert c_last.dtype == torch.float32
        grads = torch.autograd.grad(out.square().sum(), [x, *encoder.parameters()])
        results.append([out, c_last, *grads])
    assert pooled and set(pooled) == {torch.bfloat16}
    for a, b in zip(*results, strict=True):
        assert (a - b).norm() <= 2e-2 * a.norm(), f"relative error {((a - b).norm() / a.norm()).item():.3g}"
        assert (a - b).norm() > 0  # bfloat16 did run


@pytest.mark.parametrize("grad", ["no_grad", "frozen"])
def test_jit_trace_records_the_reference_pooling(grad):
    """torch.jit.trace cannot record the fused kernels (a ctypes call), so a traced QRNN pools with
    the reference and says so; the traced module then agrees with eager on new inputs."""
    torch.manual_seed(0)
    encoder = QRNN(4, 6, num_layers=2, window=2).eval()
    x, mask = torch.randn(3, 5, 4), torch.ones(3, 5, dtype=torch.bool)
    if grad == "frozen":
        encoder.requires_grad_(False)
    with torch.no_grad() if grad == "no_grad" else torch.enable_grad(), warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        traced = torch.jit.trace(encoder, (x, mask), check_trace=False)
    assert any("torch.jit.trace records PyTorch operations only" in str(w.message) for w in caught)
    new = torch.randn(3, 5, 4)
    with torch.no_grad():
        exact = copy.deepcopy(encoder).double()(new.double(), mask)[0]
        assert_close_to_float64(traced(new, mask)[0], exact, encoder(new, mask)[0])


def test_bidirectional_qrnn_outputs_forward_half_then_backward_half():
    """The forward direction fills the first H channels (of the
    outputs and of c), the backward direction the last H, each equal to a unidirectional QRNN with
    its weights (the backward one run on the row's real tokens reversed)."""
    torch.manual_seed(0)
    bi = QRNN(3, 4, bidirectional=True, pooling="fo").double().eval()
    fwd, bwd = QRNN(3, 4, pooling="fo").double().eval(), QRNN(3, 4, pooling="fo").double().eval()
    fwd.layers[0][0].load_state_dict(bi.layers[0][0].state_dict())
    bwd.layers[0][0].load_state_dict(bi.layers[0][1].state_dict())
    x = torch.randn(2, 5, 3, dtype=torch.float64)
    lengths = torch.tensor([5, 3])
    mask = torch.arange(5) < lengths.unsqueeze(1)
    with torch.no_grad():
        out, state = bi(x, mask)
        out_f, state_f = fwd(x, mask)
        torch.testing.assert_close(out[..., :4], out_f)
        torch.testing.assert_close(state[0][0][:, :4], state_f[0][0])
        for b, n in enumerate(lengths.tolist()):
            out_b, state_b = bwd(x[b : b + 1, :n].flip(1))
            torch.testing.assert_close(out[b, :n, 4:], out_b[0].flip(0))
            torch.testing.assert_close(state[0][0][b, 4:], state_b[0][0][0])
