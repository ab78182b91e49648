"""The Meta-LSTM encoder (seqzoo/encoders/meta_lstm.py, MODELS.md 3.1-3.2)."""

import math

import pytest
import torch
from conftest import needs_cxx
from numerics import assert_compiled_matches_eager, assert_encoder_gradcheck, perturbed
from torch._dynamo.utils import counters

from seqzoo import build_encoder
from seqzoo.encoders.meta_lstm import MetaLSTM, materialized_reference
from seqzoo.testing import assert_contract

SIZES = {"meta_size": 4, "z_size": 3}


def values_and_gradients(run, encoder, x, state):
    """Outputs, final state and the gradients of a loss through both w.r.t. x, the state and every parameter."""
    out, final = run(x, state)
    loss = (out * torch.linspace(-1, 1, out.shape[-1], dtype=out.dtype)).pow(2).sum() + sum(p.sum() for p in final)
    grads = torch.autograd.grad(loss, [x, *state, *encoder.parameters()])
    return [out, *final, *grads]


@pytest.mark.parametrize("kwargs", [SIZES, {"meta_size": 4, "meta_vector": "hidden"}])
def test_the_low_rank_product_equals_the_materialised_weights_in_float64(single_thread, kwargs):
    torch.manual_seed(0)
    encoder = perturbed(MetaLSTM(5, 7, **kwargs).double())
    cell = encoder.cells[0]
    x = torch.randn(3, 6, 5, dtype=torch.float64, requires_grad=True)
    state = tuple(torch.randn(3, size, dtype=torch.float64, requires_grad=True) for size in cell.state_sizes)

    def fast(x, state):
        out, final = encoder(x, state=tuple(part.unsqueeze(0) for part in state))
        return out, tuple(part[0] for part in final)

    got = values_and_gradients(fast, encoder, x, state)
    expected = values_and_gradients(lambda x, s: materialized_reference(cell, x, s), encoder, x, state)
    for a, b in zip(got, expected, strict=True):
        torch.testing.assert_close(a, b, rtol=0, atol=1e-10)


def test_gradcheck_in_float64(single_thread):
    torch.manual_seed(1)
    assert_encoder_gradcheck(perturbed(MetaLSTM(3, 4, meta_size=2, z_size=2).double()))


@pytest.mark.parametrize(
    "kwargs",
    [
        {},
        {"num_layers": 2},
        {"num_layers": 2, "bidirectional": True},
        {"meta_vector": "hidden", "z_size": None, "num_layers": 2},
    ],
)
def test_meta_lstm_meets_the_contract(single_thread, kwargs):
    torch.manual_seed(2)
    encoder = perturbed(MetaLSTM(5, 7, **{**SIZES, **kwargs}))
    assert_contract(encoder.double(), atol=1e-10)  # the logic, to rounding
    assert_contract(encoder.float())  # atol: seqzoo.testing.rounding_tolerance


def test_state_holds_h_c_and_the_meta_cells_h_c_per_layer_and_direction():
    encoder = build_encoder("meta_lstm", 5, hidden_size=7, num_layers=2, bidirectional=True, meta_size=4)
    out, state = encoder(torch.randn(3, 6, 5))
    assert out.shape == (3, 6, 14)
    assert [tuple(s.shape) for s in state] == [(4, 3, 7), (4, 3, 7), (4, 3, 4), (4, 3, 4)]


def test_initialisation_follows_the_official_cell():
    torch.manual_seed(3)
    encoder = MetaLSTM(200, 100, meta_size=40, z_size=30)
    cell = encoder.cells[0]
    meta, basic = cell.meta, cell.basic
    bound = math.sqrt(3 / 30)  # uniform unit scaling over d_z rows
    for weight in (basic.P, basic.q_x, basic.q_h):
        assert 0.98 * bound < weight.abs().max() <= bound
    glorot = math.sqrt(6 / (200 + 100 + 40 + 160))  # one matrix over [x; h; ĥ] -> 4m
    for weight in (meta.weight_x, meta.weight_h):
        assert 0.98 * glorot < weight.abs().max() <= glorot
    assert 0.98 * math.sqrt(6 / (400 + 30)) < basic.B.abs().max() <= math.sqrt(6 / (400 + 30))
    assert torch.equal(meta.bias, torch.zeros(160))
    # the forget bias of 1 enters the meta cell's f gate only: zero input and state give σ(1) there
    x_part = encoder.cells[0].prepare(torch.zeros(1, 1, 200))[0][0, :, :160]
    assert torch.equal(x_part.view(4, 40), torch.tensor([0.0, 0.0, 1.0, 0.0]).repeat_interleave(40).view(4, 40))


def test_tasks_share_the_meta_cells_and_own_p_q_b():
    torch.manual_seed(4)
    first = MetaLSTM(5, 7, num_layers=2, **SIZES)
    second = build_encoder("meta_lstm", 5, hidden_size=7, num_layers=2, shared_meta=first.meta_cells, **SIZES)
    for a, b in zip(first.cells, second.cells, strict=True):
        assert a.meta is b.meta and a.basic is not b.basic
    shared = {n for n, _ in second.named_parameters() if n.split(".")[2] == "meta"}
    private = {n for n, _ in second.named_parameters() if n.split(".")[2] == "basic"}
    assert shared | private == {n for n, _ in second.named_parameters()}
    assert {n.split(".")[-1] for n in private} == {"P", "q_x", "q_h", "B"}
    first_params = {id(p) for p in first.parameters()}
    assert {id(p) for n, p in second.named_parameters() if n in shared} <= first_params
    assert not {id(p) for n, p in second.named_parameters() if n in private} & first_params
    # the second task's loss trains the shared Meta-LSTM and its own P, Q, B, not the first task's
    second(torch.randn(2, 4, 5))[0].sum().backward()
    assert first.cells[0].meta.weight_h.grad is not None and first.cells[0].basic.P.grad is None
    # freezing the shared part by name leaves a task's own weights trainable
    for name, p in second.named_parameters():
        p.requires_grad_(name not in shared)
    assert all(not p.requires_grad for p in first.cells[1].meta.parameters())


def test_a_shared_meta_cell_must_fit_the_layers():
    first = MetaLSTM(5, 7, **SIZES)
    with pytest.raises(ValueError, match="one MetaCell per layer and direction"):
        MetaLSTM(5, 7, num_layers=2, shared_meta=first.meta_cells, **SIZES)
    with pytest.raises(ValueError, match="a basic LSTM of 7 units; this layer has 5 and 8"):
        MetaLSTM(5, 8, shared_meta=first.meta_cells, **SIZES)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"meta_vector": "official"}, "meta_vector must be"),
        ({"meta_vector": "hidden", "meta_size": 4, "z_size": 3}, "z_size is meta_size"),
    ],
)
def test_invalid_meta_vector_options_are_refused(kwargs, message):
    with pytest.raises(ValueError, match=message):
        build_encoder("meta_lstm", 5, hidden_size=7, **kwargs)


@needs_cxx
def test_compiled_steps_equal_eager_ones_with_one_graph_for_every_layer_and_direction():
    torch._dynamo.reset()
    counters.clear()
    torch.manual_seed(5)
    eager = MetaLSTM(5, 8, num_layers=2, bidirectional=True, **SIZES)
    compiled = MetaLSTM(5, 8, num_layers=2, bidirectional=True, compile_step=True, **SIZES)
    compiled.load_state_dict(eager.state_dict())
    mask = torch.arange(6) < torch.tensor([6, 4, 1]).unsqueeze(1)
    assert_compiled_matches_eager(eager, compiled, torch.randn(3, 6, 5), mask)
    assert counters["stats"]["unique_graphs"] == 1
