import pytest
import torch

from seqzoo import build_encoder
from seqzoo.dtgru import DeepTransitionGRU, LayerNormGRU
from seqzoo.testing import assert_contract

pytestmark = pytest.mark.usefixtures("single_thread")


@pytest.mark.parametrize("name", ["gru_ln", "dtgru"])
@pytest.mark.parametrize("bidirectional", [False, True])
def test_contract(name, bidirectional):
    torch.manual_seed(0)
    enc = build_encoder(name, 5, hidden_size=6, num_layers=2, bidirectional=bidirectional, dropout=0.3)
    assert enc.output_size == 6 * (2 if bidirectional else 1)
    assert_contract(enc)


def test_gru_ln_without_norm_equals_torch_gru():
    """With LN off, gru_ln is exactly a GRU: torch's update gate z is our 1 − u."""
    torch.manual_seed(0)
    ours = LayerNormGRU(4, 3, layer_norm=False)
    ref = torch.nn.GRU(4, 3, batch_first=True)
    cell = ours.cells[0].cells[0]
    size = 3
    w_ir, w_iz, w_in = ref.weight_ih_l0.chunk(3)
    w_hr, w_hz, w_hn = ref.weight_hh_l0.chunk(3)
    b_ir, b_iz, _ = ref.bias_ih_l0.chunk(3)
    b_hr, b_hz, b_hn = ref.bias_hh_l0.chunk(3)
    with torch.no_grad():
        cell.x_proj.weight.copy_(torch.cat([w_ir, -w_iz, w_in]))
        cell.h_proj.weight.copy_(torch.cat([w_hr, -w_hz, w_hn]))
        cell.gate_bias.copy_(torch.stack([b_ir + b_hr, -(b_iz + b_hz)]))
        cell.candidate_bias.copy_(b_hn)
        ref.bias_ih_l0[2 * size :].zero_()  # our candidate has no input bias
    x = torch.randn(2, 5, 4)
    h0 = torch.randn(1, 2, 3)
    torch.testing.assert_close(ours(x, state=h0)[0], ref(x, h0)[0])


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
