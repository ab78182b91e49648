"""The per-step loop of RecurrentCellEncoder cells (seqzoo/recurrent.py)."""

import pytest
import torch

from seqzoo import build_encoder


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
