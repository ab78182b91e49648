"""The per-step loop of RecurrentCellEncoder cells (seqzoo/recurrent.py)."""

import copy
import warnings

import pytest
import torch
from conftest import needs_cxx, no_eager_fallback
from numerics import assert_all_close_to_float64, assert_close_to_float64
from torch._dynamo.utils import counters

from seqzoo import build_encoder
from seqzoo.encoders import recurrent


def backward_node_names(output: torch.Tensor) -> set[str]:
    """Names of every autograd node that ``output`` depends on."""
    seen, names, stack = set(), set(), [output.grad_fn]
    while stack:
        node = stack.pop()
        if node is None or node in seen:
            continue
        seen.add(node)
        names.add(type(node).__name__)
        stack.extend(parent for parent, _ in node.next_functions)
    return names


@pytest.mark.parametrize(
    ("name", "kwargs"),
    [
        ("mzu", {"composition": "cap", "transition_depth": 1, "share_transition": True}),
        ("mzu", {"composition": "sat", "num_layers": 2, "bidirectional": True}),
        ("dtgru", {}),
        ("gru_ln", {"bidirectional": True}),
    ],
)
def test_steps_slice_the_hoisted_projection_without_indexing(name, kwargs):
    # A loop that reads step t of the hoisted (T, B, ·) inputs as inputs[t] puts a
    # SelectBackward per step in the graph, and each writes a full (T, B, ·) zero tensor in
    # the backward pass: O(T²) memory traffic (it was half the MZU+DT's training step).
    # The loop's one unbind(0) gives one backward node for all steps.
    x = torch.randn(3, 6, 5, requires_grad=True)
    mask = torch.arange(6) < torch.tensor([6, 4, 1]).unsqueeze(1)
    out, _ = build_encoder(name, input_size=5, hidden_size=8, **kwargs)(x, mask)
    names = backward_node_names(out)
    assert "SelectBackward0" not in names
    assert "UnbindBackward0" in names


def run_with_gradients(encoder, x, mask):
    """Outputs, final state, auxiliary loss and every parameter gradient of one forward + backward."""
    out, state = encoder(x, mask)
    aux = encoder.auxiliary_loss() if hasattr(encoder, "auxiliary_loss") else None
    loss = out.pow(2).sum() + state.sum() + (aux if aux is not None else 0.0)
    loss.backward()
    return [out, state, *([aux] if aux is not None else []), *(p.grad for p in encoder.parameters())]


def padded_batch():
    """x (3, 6, 5) and a mask of lengths 6, 4, 1."""
    return torch.randn(3, 6, 5), torch.arange(6) < torch.tensor([6, 4, 1]).unsqueeze(1)


def eager_and_compiled(name, **kwargs):
    """The same encoder (same weights) without and with ``compile_step``."""
    torch.manual_seed(0)
    eager = build_encoder(name, input_size=5, hidden_size=8, **kwargs)
    compiled = build_encoder(name, input_size=5, hidden_size=8, compile_step=True, **kwargs)
    compiled.load_state_dict(eager.state_dict())
    return eager, compiled


CELLS = [
    (
        "mzu",
        {
            "composition": "cap",
            "transition_depth": 1,
            "share_transition": True,
            "disagreement": 0.5,
            "num_layers": 2,
        },
    ),
    ("dtgru", {"num_layers": 2}),
]


@needs_cxx
@pytest.mark.parametrize(("name", "kwargs"), CELLS)
def test_compiled_step_equals_the_eager_step(name, kwargs):
    eager, compiled = eager_and_compiled(name, bidirectional=True, **kwargs)
    x, mask = padded_batch()
    exact = run_with_gradients(copy.deepcopy(eager).double(), x.double(), mask)  # the same function in float64
    with no_eager_fallback():
        got = run_with_gradients(compiled, x, mask)
    expected = run_with_gradients(eager, x, mask)
    assert len(got) == len(expected)
    assert_all_close_to_float64(got, exact, expected)  # off by no more than eager float32 is, up to a factor


@needs_cxx
@pytest.mark.parametrize(("name", "kwargs"), CELLS)
def test_every_layer_and_direction_of_a_stack_runs_one_compiled_graph(name, kwargs):
    # The cells of a stack differ only in their weights, which reach the step as tensors. A layer
    # whose weights had other strides compiled a graph of its own: the MZU's h part of the zone
    # generation was a slice of [W_x | W_h], whose row stride grows with the layer's input width.
    torch._dynamo.reset()
    counters.clear()
    _, compiled = eager_and_compiled(name, bidirectional=True, **kwargs)
    with no_eager_fallback():
        run_with_gradients(compiled, *padded_batch())
    assert counters["stats"]["unique_graphs"] == 1


@needs_cxx
def test_compiled_dropout_repeats_from_the_seed():
    runs = []
    for _ in range(2):
        torch.manual_seed(5)
        encoder = build_encoder("gru_ln", input_size=5, hidden_size=8, dropout=0.3, compile_step=True)
        x = torch.randn(3, 6, 5)
        with no_eager_fallback():
            outputs = torch.stack([encoder(x)[0] for _ in range(2)])  # two forwards: two sets of masks
        outputs.sum().backward()
        runs.append([outputs.detach(), *(p.grad for p in encoder.parameters())])
    assert not torch.equal(runs[0][0][0], runs[0][0][1])  # dropout is on and draws new masks
    for a, b in zip(*runs, strict=True):
        torch.testing.assert_close(a, b, rtol=0, atol=0)


@needs_cxx
def test_a_compiled_step_serves_many_batch_sizes_without_hitting_the_graph_limit(caplog):
    eager, compiled = eager_and_compiled("gru_ln")
    exact = copy.deepcopy(eager).double()
    with torch.no_grad(), no_eager_fallback(), caplog.at_level("WARNING", logger="torch._dynamo"):
        for batch in range(1, 11):  # past Dynamo's 8 graphs if every size compiled its own
            x = torch.randn(batch, 4, 5)
            assert_close_to_float64(compiled(x)[0], exact(x.double())[0], eager(x)[0])
    assert "recompile_limit" not in caplog.text


def test_a_failed_compile_falls_back_to_the_eager_step_with_a_warning(monkeypatch):
    def broken_compile(fn, **kwargs):
        def fail(*args):
            raise RuntimeError("no C++ compiler\nmore detail")

        return fail

    monkeypatch.setattr(recurrent, "_compile_failure", None)
    monkeypatch.setattr(torch, "compile", broken_compile)
    eager, compiled = eager_and_compiled("gru_ln")
    x, mask = padded_batch()
    with pytest.warns(
        RuntimeWarning, match=r"compile_step: .*RuntimeError: no C\+\+ compiler\); running it eagerly"
    ) as record:
        got = run_with_gradients(compiled, x, mask)
    assert [w.filename for w in record] == [__file__]  # the user's line, not seqzoo's or torch's
    for a, b in zip(got, run_with_gradients(eager, x, mask), strict=True):
        torch.testing.assert_close(a, b, rtol=0, atol=0)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # warned once: later forwards stay eager quietly
        compiled(x, mask)
