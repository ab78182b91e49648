"""The encoder API as nn.RNN users expect it, over every registered encoder (new ones included)."""

from __future__ import annotations

import pytest
import torch

from seqzoo import available_encoders, build_encoder
from seqzoo.encoders.base import Encoder


def _flat(state: object) -> list[torch.Tensor]:
    if state is None:
        return []
    if isinstance(state, torch.Tensor):
        return [state]
    if isinstance(state, dict):
        return [t for key in sorted(state) for t in _flat(state[key])]
    return [t for part in state for t in _flat(part)]


#: Arguments of encoders whose sizes are tied (DA-GRN: input_size + depth_size = hidden_size); others get hidden_size 8.
SMALL = {"dagrn": {"hidden_size": 8, "depth_size": 3}}


def _small(name: str, bidirectional: bool) -> Encoder:
    kwargs = {**SMALL.get(name, {"hidden_size": 8}), **({"bidirectional": True} if bidirectional else {})}
    try:  # bidirectional named only when asked for: some encoders have no such argument
        return build_encoder(name, 5, **kwargs).eval()
    except ValueError as err:
        if bidirectional and "bidirectional" in str(err):
            pytest.skip(f"{name} has no bidirectional form: {err}")
        raise


@pytest.mark.parametrize("bidirectional", [False, True])
@pytest.mark.parametrize("name", available_encoders())
def test_no_mask_means_every_position_is_real(name, bidirectional):
    """``encoder(x)`` and ``encoder(x, None)`` equal ``encoder(x, all-True mask)``: outputs and final state,
    exactly (an all-real mask changes no value)."""
    torch.manual_seed(0)
    encoder = _small(name, bidirectional)
    x = torch.randn(3, 6, 5)  # (B, T, D)
    with torch.no_grad():
        runs = [encoder(x), encoder(x, None), encoder(x, torch.ones(3, 6, dtype=torch.bool))]
    (out, state), *others = runs
    assert out.shape == (3, 6, encoder.output_size)
    for other_out, other_state in others:
        assert torch.equal(out, other_out)
        assert all(torch.equal(a, b) for a, b in zip(_flat(state), _flat(other_state), strict=True))
