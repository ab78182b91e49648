"""Densely-connected stacks of single-layer encoders."""

from __future__ import annotations

import copy

import pytest
import torch
import torch.nn.functional as F
from numerics import assert_close_to_float64

import seqzoo.encoders.mzu
import seqzoo.encoders.qrnn  # noqa: F401  (registers "qrnn")
from seqzoo.encoders.base import build_encoder
from seqzoo.encoders.dense import DenseStack
from seqzoo.testing import assert_contract


@pytest.mark.parametrize("name", ["dense_lstm", "dense_gru"])
@pytest.mark.parametrize("bidirectional", [False, True])
def test_dense_baselines_contract(name, bidirectional):
    torch.manual_seed(0)
    encoder = build_encoder(name, 6, hidden_size=4, num_layers=3, dropout=0.3, bidirectional=bidirectional)
    assert encoder.causal == (not bidirectional)
    assert encoder.output_size == 4 * (2 if bidirectional else 1)
    assert_contract(encoder)


def test_layer_widths_grow_by_each_output():
    encoder = build_encoder("dense_lstm", 10, hidden_size=8, num_layers=4)
    assert [layer.input_size for layer in encoder.layers] == [10, 18, 26, 34]


def test_dense_qrnn_stack_equals_the_qrnn_dense_option():
    torch.manual_seed(0)
    stack = DenseStack("qrnn", 5, 4, num_layers=3, window=2)
    qrnn = build_encoder("qrnn", 5, hidden_size=4, num_layers=3, window=2, dense=True)
    for mine, theirs in zip(stack.layers, qrnn.layers, strict=True):
        theirs.load_state_dict(mine.layers[0].state_dict())
    x, mask = torch.randn(3, 6, 5), torch.arange(6) < torch.tensor([6, 2, 4]).unsqueeze(1)
    exact = copy.deepcopy(qrnn).double()(x.double(), mask)[0]  # bounds float32's rounding
    assert_close_to_float64(stack(x, mask)[0], exact, qrnn(x, mask)[0])
    assert_contract(stack)


def test_a_dense_stack_adds_up_its_layers_regularisers():
    torch.manual_seed(0)
    stack = DenseStack("mzu", 6, 8, num_layers=2, num_zones=2, disagreement=0.5)
    x, mask = torch.randn(3, 5, 6), torch.arange(5) < torch.tensor([5, 2, 4]).unsqueeze(1)
    stack(x, mask)
    each = [layer.auxiliary_loss() for layer in stack.layers]
    assert all(loss is not None for loss in each)
    assert torch.allclose(stack.auxiliary_loss(), each[0] + each[1])
    assert build_encoder("dense_lstm", 6, hidden_size=4).auxiliary_loss() is None


def test_dense_stack_applies_dropout_between_layers_only():
    """Dropout between layers only: in training the stack equals layer 2 run on
    [x; dropout(layer 1(x))] with the same draws."""
    torch.manual_seed(0)
    stack = DenseStack("lstm", 3, 4, num_layers=2, dropout=0.5).double().train()
    x = torch.randn(2, 5, 3, dtype=torch.float64)
    with torch.no_grad():
        torch.manual_seed(1)
        out, _ = stack(x)
        torch.manual_seed(1)
        h1, _ = stack.layers[0](x)
        dropped = F.dropout(h1, 0.5, training=True)
        h2, _ = stack.layers[1](torch.cat([x, dropped], -1))
    assert not torch.equal(dropped, h1)
    torch.testing.assert_close(out, h2)
