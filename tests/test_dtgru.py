import pytest
import torch

from seqzoo import build_encoder
from seqzoo.encoders.dtgru import DeepTransitionGRU, LayerNormGRU
from seqzoo.testing import assert_contract

pytestmark = pytest.mark.usefixtures("single_thread")


@pytest.mark.parametrize("name", ["gru_ln", "dtgru"])
@pytest.mark.parametrize("bidirectional", [False, True])
def test_contract(name, bidirectional):
    torch.manual_seed(0)
    enc = build_encoder(name, 5, hidden_size=6, num_layers=2, bidirectional=bidirectional, dropout=0.3)
    assert enc.output_size == 6 * (2 if bidirectional else 1)
    assert_contract(enc)


def _gru_ln_from_torch(ours: LayerNormGRU, ref: torch.nn.GRU) -> None:
    """Copy torch's GRU weights into a layer_norm=False gru_ln (torch's update gate z is our 1 − u),
    and zero ``ref``'s candidate input bias in place (our candidate has none)."""
    with torch.no_grad():
        for k, suffix in enumerate(["", "_reverse"][: len(ours.cells)]):
            cell = ours.cells[k].cells[0]
            w_ir, w_iz, w_in = getattr(ref, f"weight_ih_l0{suffix}").chunk(3)
            w_hr, w_hz, w_hn = getattr(ref, f"weight_hh_l0{suffix}").chunk(3)
            b_ih, b_hh = getattr(ref, f"bias_ih_l0{suffix}"), getattr(ref, f"bias_hh_l0{suffix}")
            b_ir, b_iz, b_in = b_ih.chunk(3)
            b_hr, b_hz, b_hn = b_hh.chunk(3)
            cell.x_proj.weight.copy_(torch.cat([w_ir, -w_iz, w_in]))
            cell.h_proj.weight.copy_(torch.cat([w_hr, -w_hz, w_hn]))
            cell.gate_bias.copy_(torch.stack([b_ir + b_hr, -(b_iz + b_hz)]))
            cell.candidate_bias.copy_(b_hn)
            b_in.zero_()  # our candidate has no input bias


def test_gru_ln_without_norm_equals_torch_gru():
    """With LN off, gru_ln is exactly a GRU: torch's update gate z is our 1 − u."""
    torch.manual_seed(0)
    ours = LayerNormGRU(4, 3, layer_norm=False).double()  # float64: the formulas, not float32's rounding
    ref = torch.nn.GRU(4, 3, batch_first=True).double()
    _gru_ln_from_torch(ours, ref)
    x = torch.randn(2, 5, 4, dtype=torch.float64)
    h0 = torch.randn(1, 2, 3, dtype=torch.float64)
    torch.testing.assert_close(ours(x, state=h0)[0], ref(x, h0)[0])


def test_bidirectional_recurrent_encoder_equals_torch_bidirectional_gru_on_a_padded_batch():
    """The backward direction of RecurrentCellEncoder (the MZU, gru_ln and dtgru) in time order:
    a bidirectional gru_ln without LN is torch's bidirectional GRU, outputs and state."""
    torch.manual_seed(0)
    ours = LayerNormGRU(4, 3, bidirectional=True, layer_norm=False).double()
    ref = torch.nn.GRU(4, 3, batch_first=True, bidirectional=True).double()
    _gru_ln_from_torch(ours, ref)
    x = torch.randn(2, 5, 4, dtype=torch.float64)
    lengths = torch.tensor([5, 3])
    mask = torch.arange(5) < lengths.unsqueeze(1)
    with torch.no_grad():
        out, state = ours(x, mask)
        packed = torch.nn.utils.rnn.pack_padded_sequence(x, lengths, batch_first=True, enforce_sorted=False)
        ref_out, ref_h = ref(packed)
        ref_out, _ = torch.nn.utils.rnn.pad_packed_sequence(ref_out, batch_first=True, total_length=5)
    torch.testing.assert_close(out, ref_out)
    torch.testing.assert_close(state, ref_h)


def test_dtgru_structure():
    enc = DeepTransitionGRU(4, 6, transition_depth=3)
    cell = enc.cells[0]
    assert len(cell.cells) == 4
    assert cell.cells[0].linear_gate and cell.cells[0].x_proj.out_features == 5 * 6  # r, u, l | W_xh | H
    assert all(c.x_proj is None and not c.linear_gate for c in cell.cells[1:])
    assert LayerNormGRU(4, 6).cells[0].cells[0].gate_gain.shape == (2, 6)
    assert LayerNormGRU(4, 6, layer_norm=False).cells[0].cells[0].gate_gain is None


def test_candidate_dropout_only_in_training():
    torch.manual_seed(0)
    enc = DeepTransitionGRU(3, 8, dropout=0.5)
    x = torch.randn(2, 4, 3)
    assert not torch.equal(enc(x)[0], enc(x)[0])
    enc.eval()
    assert torch.equal(enc(x)[0], enc(x)[0])


def _ln(v: torch.Tensor) -> torch.Tensor:
    mean = v.mean(-1, keepdim=True)
    var = (v - mean).pow(2).mean(-1, keepdim=True)
    return (v - mean) / torch.sqrt(var + 1e-6)


def test_dtgru_step_follows_the_dtmt_equations():
    """One step of dtgru (L-GRU + one T-GRU, LN on, random gains and biases) against MODELS.md 4.7
    written out by hand: LN on every gate, and the linear transformation gate's l ⊙ Hx outside the tanh."""
    torch.manual_seed(0)
    size = 3
    enc = DeepTransitionGRU(4, size, transition_depth=1).double().eval()
    with torch.no_grad():
        for p in enc.parameters():
            p.copy_(torch.randn_like(p))
    x = torch.randn(2, 1, 4, dtype=torch.float64)
    h0 = torch.randn(1, 2, size, dtype=torch.float64)
    with torch.no_grad():
        out, _ = enc(x, state=h0)
    l_gru, t_gru = enc.cells[0].cells
    wx = l_gru.x_proj.weight.split(size)  # W_xr, W_xu, W_xl, W_xh, H
    wh = l_gru.h_proj.weight.split(size)  # W_hr, W_hu, W_hl, W_hh
    xt, h = x[:, 0], h0[0]

    def gate(j, cell, x_term):  # σ(LN(W_x x + W_h h) · gain + offset), LN without affine, ε = 1e-6
        pre = h @ cell.h_proj.weight.split(size)[j].t()
        if x_term is not None:
            pre = pre + x_term
        return torch.sigmoid(_ln(pre) * cell.gate_gain[j] + cell.gate_bias[j])

    with torch.no_grad():
        r, u, l_gate = (gate(j, l_gru, xt @ wx[j].t()) for j in range(3))
        cand = torch.tanh(xt @ wx[3].t() + r * (h @ wh[3].t() + l_gru.candidate_bias)) + l_gate * (xt @ wx[4].t())
        h = (1 - u) * h + u * cand
        r, u = gate(0, t_gru, None), gate(1, t_gru, None)
        cand = torch.tanh(r * (h @ t_gru.h_proj.weight.split(size)[2].t() + t_gru.candidate_bias))
        h = (1 - u) * h + u * cand
    torch.testing.assert_close(out[:, 0], h)
