"""The HyperLSTM encoder (seqzoo/encoders/hyper_lstm.py, MODELS.md 3.3)."""

import pytest
import torch
from numerics import assert_encoder_gradcheck, perturbed

from seqzoo import build_encoder
from seqzoo.encoders.hyper_lstm import HyperLSTM
from seqzoo.testing import assert_contract

SIZES = {"hyper_size": 6, "signal_size": 3}


def layer_norm(v, gain, offset):
    """The reference's LN of a vector: (v - mean) / sqrt(var + 1e-3) * gain + offset."""
    mean = v.mean(-1, keepdim=True)
    return (v - mean) / ((v - mean).pow(2).mean(-1, keepdim=True) + 1e-3).sqrt() * gain + offset


def transcription(cell, x, state):
    """MODELS.md 3.3 read literally, gate by gate, one step at a time: x (B, T, d_x) -> outputs, state."""
    hidden, hyper, nz = cell.hidden_size, cell.hyper_size, cell.signal_size
    h, c, hh, hc = state
    gates = range(4)  # i, g, f, o
    outputs = []
    for x_t in x.unbind(1):
        hyper_in = torch.cat([x_t, h], dim=-1)  # x̂_t = [x_t; h_{t-1}]
        w_hyper = torch.cat([cell.hyper_weight_x, cell.hyper_weight_h[:, :hidden]], dim=-1)
        w_hyper_rec = cell.hyper_weight_h[:, hidden:]
        hy = []
        for y in gates:
            rows = slice(y * hyper, (y + 1) * hyper)
            pre = hyper_in @ w_hyper[rows].t() + hh @ w_hyper_rec[rows].t()
            hy.append(layer_norm(pre, cell.hyper_gain[y], cell.hyper_offset[y]))
        hc = torch.sigmoid(hy[2] + 1.0) * hc + torch.sigmoid(hy[0]) * torch.tanh(hy[1])
        hh = torch.sigmoid(hy[3]) * torch.tanh(layer_norm(hc, cell.hyper_cell_gain, cell.hyper_cell_offset))
        pres = []
        for y in gates:
            rows = slice(y * hidden, (y + 1) * hidden)
            sx, sh = slice(y * nz, (y + 1) * nz), slice((4 + y) * nz, (5 + y) * nz)
            z_x = hh @ cell.signal_weight[sx].t() + cell.signal_bias[sx]
            z_h = hh @ cell.signal_weight[sh].t() + cell.signal_bias[sh]
            z_b = hh @ cell.bias_signal_weight[y * nz : (y + 1) * nz].t()
            d_x = z_x @ cell.scale_weight[y]
            d_h = z_h @ cell.scale_weight[4 + y]
            b = z_b @ cell.bias_weight[y] + cell.bias[rows]
            pre = d_h * (h @ cell.weight_h[rows].t()) + d_x * (x_t @ cell.weight_x[rows].t()) + b
            pres.append(layer_norm(pre, cell.gain[y], cell.offset[y]))
        i, g, f, o = pres
        c = torch.sigmoid(f + 1.0) * c + torch.sigmoid(i) * torch.tanh(g)
        h = torch.sigmoid(o) * torch.tanh(layer_norm(c, cell.cell_gain, cell.cell_offset))
        outputs.append(h)
    return torch.stack(outputs, dim=1), (h, c, hh, hc)


def test_the_encoder_equals_a_per_step_transcription_of_the_equations_in_float64(single_thread):
    torch.manual_seed(0)
    encoder = perturbed(HyperLSTM(5, 7, **SIZES).double())
    cell = encoder.cells[0]
    x = torch.randn(3, 6, 5, dtype=torch.float64, requires_grad=True)
    state = tuple(torch.randn(3, size, dtype=torch.float64, requires_grad=True) for size in cell.state_sizes)
    results = []
    for run in (
        lambda: encoder(x, state=tuple(part.unsqueeze(0) for part in state)),
        lambda: transcription(cell, x, state),
    ):
        out, final = run()
        final = tuple(part.reshape(3, -1) for part in final)
        loss = (out * torch.linspace(-1, 1, 7, dtype=out.dtype)).pow(2).sum() + sum(p.sum() for p in final)
        results.append([out, *final, *torch.autograd.grad(loss, [x, *state, *encoder.parameters()])])
    for a, b in zip(*results, strict=True):
        torch.testing.assert_close(a, b, rtol=0, atol=1e-10)


def test_gradcheck_in_float64(single_thread):
    torch.manual_seed(1)
    assert_encoder_gradcheck(perturbed(HyperLSTM(3, 4, hyper_size=3, signal_size=2).double()))


def test_at_initialisation_every_scale_is_0_1_and_the_bias_modulation_is_zero():
    torch.manual_seed(2)
    cell = HyperLSTM(5, 7, **SIZES).cells[0]
    hyper_h = torch.randn(4, 6)  # any ĥ_t
    z = hyper_h @ cell.signal_weight.t() + cell.signal_bias  # z_x, z_h: (4, 8 N_z)
    scales = torch.einsum("bgz,gzh->bgh", z.unflatten(-1, (8, 3)), cell.scale_weight)
    torch.testing.assert_close(scales, torch.full_like(scales, 0.1), rtol=1e-6, atol=0)
    assert torch.equal(cell.bias_weight, torch.zeros_like(cell.bias_weight))
    assert 0 < cell.bias_signal_weight.std() < 0.02  # N(0, 0.01²)
    for block in cell.weight_h.unflatten(0, (4, 7)):  # orthogonal per gate
        torch.testing.assert_close(block @ block.t(), torch.eye(7), rtol=0, atol=1e-5)
    for block in cell.hyper_weight_h[:, 7:].unflatten(0, (4, 6)):
        torch.testing.assert_close(block @ block.t(), torch.eye(6), rtol=0, atol=1e-5)
    assert torch.equal(cell.bias, torch.zeros(28))


@pytest.mark.parametrize("kwargs", [{}, {"num_layers": 2}, {"num_layers": 2, "bidirectional": True}])
def test_hyper_lstm_meets_the_contract(single_thread, kwargs):
    torch.manual_seed(3)
    encoder = perturbed(HyperLSTM(5, 7, **SIZES, **kwargs))
    assert_contract(encoder.double(), atol=1e-10)  # the logic, to rounding
    assert_contract(encoder.float())  # atol: seqzoo.testing.rounding_tolerance


def test_state_and_registry():
    encoder = build_encoder("hyper_lstm", 5, hidden_size=7, num_layers=2, bidirectional=True, **SIZES)
    out, state = encoder(torch.randn(3, 6, 5))
    assert out.shape == (3, 6, 14)
    assert [tuple(s.shape) for s in state] == [(4, 3, 7), (4, 3, 7), (4, 3, 6), (4, 3, 6)]


def test_recurrent_dropout_drops_the_candidate_in_training_only():
    torch.manual_seed(4)
    encoder = HyperLSTM(5, 7, dropout=0.5, **SIZES)
    x = torch.randn(2, 4, 5)
    encoder.eval()
    assert torch.equal(encoder(x)[0], encoder(x)[0])
    encoder.train()
    assert not torch.equal(encoder(x)[0], encoder(x)[0])
