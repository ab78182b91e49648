import pytest
import torch

from seqzoo import build_encoder
from seqzoo.poolers import build_pooler
from seqzoo.testing import assert_contract, assert_padding_invariant


@pytest.mark.parametrize("name", ["lstm", "gru"])
@pytest.mark.parametrize("bidirectional", [False, True])
@pytest.mark.parametrize("num_layers", [1, 2])
def test_rnn_contract(name, bidirectional, num_layers):
    torch.manual_seed(0)
    enc = build_encoder(name, 6, hidden_size=5, num_layers=num_layers, bidirectional=bidirectional)
    assert enc.output_size == 5 * (2 if bidirectional else 1)
    assert_contract(enc)


@pytest.mark.parametrize("causal", [False, True])
def test_transformer_contract(causal):
    torch.manual_seed(0)
    enc = build_encoder("transformer", 6, hidden_size=8, num_layers=2, nhead=2, causal=causal)
    assert_contract(enc)
    with pytest.raises(ValueError, match="not stateful"):
        enc(torch.randn(1, 2, 6), state=torch.zeros(1))


def test_bidirectional_backward_direction_ignores_padding():
    """The backward direction must start at the last *real* token, not at the pad."""
    torch.manual_seed(0)
    enc = build_encoder("lstm", 4, hidden_size=3, bidirectional=True).eval()
    x = torch.randn(1, 6, 4)
    garbage = x.clone()
    garbage[:, 4:] = 100.0
    mask = torch.tensor([[True] * 4 + [False] * 2])
    a, _ = enc(x, mask)
    b, _ = enc(garbage, mask)
    assert torch.equal(a, b)


def test_contract_check_catches_leaking_encoder():
    """The invariant checks must fail on an encoder that lets pads into its state."""
    torch.manual_seed(0)
    enc = build_encoder("lstm", 4, hidden_size=3)
    leaky_forward = type(enc).forward

    def leaky(x, mask=None, state=None):
        return leaky_forward(enc, x, None, state)  # ignores the mask

    enc.forward = leaky
    with pytest.raises(AssertionError):
        assert_padding_invariant(enc.eval(), [5, 2])


def test_mask_validation_messages():
    enc = build_encoder("gru", 3, hidden_size=2)
    x = torch.randn(2, 4, 3)
    with pytest.raises(TypeError, match="bool"):
        enc(x, torch.ones(2, 4))
    with pytest.raises(ValueError, match="right-padded"):
        enc(x, torch.tensor([[False, True, True, True]] * 2))
    with pytest.raises(KeyError, match="unknown encoder"):
        build_encoder("nope", 3, hidden_size=2)


@pytest.mark.parametrize("name", ["last", "mean", "max", "meanmax", "attention"])
def test_poolers_ignore_padding(name):
    torch.manual_seed(0)
    pool = build_pooler(name, 6, bidirectional=True)
    out = torch.randn(2, 5, 6)
    mask = torch.tensor([[True] * 3 + [False] * 2, [True] * 5])
    noisy = out.clone()
    noisy[0, 3:] = 1e3
    a, b = pool(out, mask), pool(noisy, mask)
    assert a.shape == (2, pool.output_size)
    torch.testing.assert_close(a, b)
    alone = pool(out[:1, :3], mask[:1, :3])
    torch.testing.assert_close(a[:1], alone)
