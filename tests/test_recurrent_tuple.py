"""RecurrentCellEncoder with cells whose state is a tuple of tensors (seqzoo/encoders/recurrent.py).

The cell here is a plain LSTM written as a tuple-state cell, so ``torch.nn.LSTM`` (on packed
sequences for padded batches) is an independent oracle for the loop, the padding rule, the
reverse direction and the stacking.
"""

import pytest
import torch
from conftest import needs_cxx
from numerics import assert_compiled_matches_eager
from torch import nn
from torch.nn.utils.rnn import pack_padded_sequence, pad_packed_sequence

from seqzoo.encoders.base import detach_state
from seqzoo.encoders.recurrent import RecurrentCellEncoder
from seqzoo.testing import assert_contract, assert_stateful_chunks


class LSTMCell(nn.Module):
    """nn.LSTM's cell (gate order i, f, g, o) on the state ``(h, c)``, with an output ``h``."""

    def __init__(self, input_size: int, hidden_size: int) -> None:
        super().__init__()
        self.hidden_size = hidden_size
        self.state_sizes = (hidden_size, hidden_size)
        self.weight_ih = nn.Parameter(torch.randn(4 * hidden_size, input_size) * 0.5)
        self.weight_hh = nn.Parameter(torch.randn(4 * hidden_size, hidden_size) * 0.5)
        self.bias = nn.Parameter(torch.randn(4 * hidden_size) * 0.5)

    def output(self, state):
        return state[0]

    def prepare(self, x):
        def step(x_part, state):
            h, c = state
            i, f, g, o = torch.addmm(x_part, h, self.weight_hh.t()).chunk(4, dim=-1)
            c = torch.sigmoid(f) * c + torch.sigmoid(i) * torch.tanh(g)
            return (torch.sigmoid(o) * torch.tanh(c), c), None

        return torch.nn.functional.linear(x, self.weight_ih, self.bias), step


def tuple_lstm(input_size=5, hidden_size=4, compile_step=False, **kwargs):
    return RecurrentCellEncoder(
        input_size, hidden_size, lambda size: LSTMCell(size, hidden_size), compile_step=compile_step, **kwargs
    )


def torch_lstm_like(encoder: RecurrentCellEncoder) -> nn.LSTM:
    """An nn.LSTM with ``encoder``'s weights (its bias as bias_ih, bias_hh zero)."""
    lstm = nn.LSTM(
        encoder.input_size,
        encoder.hidden_size,
        num_layers=encoder.num_layers,
        bidirectional=encoder.bidirectional,
        batch_first=True,
    ).to(next(encoder.parameters()).dtype)
    with torch.no_grad():
        for k, cell in enumerate(encoder.cells):
            suffix = f"l{k // encoder.num_directions}" + ("_reverse" if k % encoder.num_directions else "")
            getattr(lstm, f"weight_ih_{suffix}").copy_(cell.weight_ih)
            getattr(lstm, f"weight_hh_{suffix}").copy_(cell.weight_hh)
            getattr(lstm, f"bias_ih_{suffix}").copy_(cell.bias)
            getattr(lstm, f"bias_hh_{suffix}").zero_()
    return lstm


@pytest.mark.parametrize(("num_layers", "bidirectional"), [(1, False), (2, False), (2, True)])
def test_a_tuple_state_lstm_cell_equals_torch_lstm_on_a_padded_batch(single_thread, num_layers, bidirectional):
    torch.manual_seed(0)
    encoder = tuple_lstm(num_layers=num_layers, bidirectional=bidirectional).double()
    lstm = torch_lstm_like(encoder)
    lengths = torch.tensor([6, 4, 1])
    x = torch.randn(3, 6, 5, dtype=torch.float64)
    mask = torch.arange(6) < lengths.unsqueeze(1)
    count = num_layers * (2 if bidirectional else 1)
    h0, c0 = torch.randn(count, 3, 4, dtype=torch.float64), torch.randn(count, 3, 4, dtype=torch.float64)
    out, (h, c) = encoder(x, mask, state=(h0, c0))
    packed = pack_padded_sequence(x, lengths, batch_first=True, enforce_sorted=False)
    expected, (h_ref, c_ref) = lstm(packed, (h0, c0))
    expected = pad_packed_sequence(expected, batch_first=True, total_length=6)[0]
    for got, want in ((out, expected), (h, h_ref), (c, c_ref)):
        torch.testing.assert_close(got, want, rtol=0, atol=1e-12)


def test_the_state_is_a_tuple_of_stacked_parts_and_the_output_is_the_cells_output():
    encoder = tuple_lstm(num_layers=2, bidirectional=True)
    out, state = encoder(torch.randn(3, 6, 5))
    assert isinstance(state, tuple) and [tuple(s.shape) for s in state] == [(4, 3, 4), (4, 3, 4)]
    assert encoder.state_sizes == (4, 4)
    torch.testing.assert_close(out[:, -1, :4], state[0][2], rtol=0, atol=0)  # top layer forward h_T
    torch.testing.assert_close(out[:, 0, 4:], state[0][3], rtol=0, atol=0)  # top layer reverse h at t = 0


def test_a_row_keeps_every_state_part_unchanged_through_its_pads():
    torch.manual_seed(1)
    encoder = tuple_lstm()
    state = (torch.randn(1, 2, 4), torch.randn(1, 2, 4))
    mask = torch.tensor([[True, True, False], [False, False, False]])
    out, final = encoder(torch.randn(2, 3, 5), mask, state=state)
    for before, after in zip(state, final, strict=True):
        assert torch.equal(after[:, 1], before[:, 1])  # an all-pad row: its state passes through
    assert torch.equal(out[1], torch.zeros_like(out[1])) and torch.equal(out[0, 2], torch.zeros(4))


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
@pytest.mark.parametrize(("num_layers", "bidirectional"), [(1, False), (2, False), (2, True)])
def test_tuple_state_encoders_meet_the_contract(single_thread, dtype, num_layers, bidirectional):
    torch.manual_seed(2)
    encoder = tuple_lstm(num_layers=num_layers, bidirectional=bidirectional).to(dtype)
    # float64: the logic, to rounding; float32: seqzoo.testing.rounding_tolerance, derived from float64
    assert_contract(encoder, atol=1e-10 if dtype == torch.float64 else None)


def test_chunks_carry_every_state_part_detached():
    torch.manual_seed(3)
    encoder = tuple_lstm(num_layers=2).double()
    assert_stateful_chunks(encoder, atol=1e-12)
    _, state = encoder(torch.randn(2, 4, 5, dtype=torch.float64))
    detached = detach_state(state)
    assert isinstance(detached, tuple) and all(not part.requires_grad for part in detached)
    assert all(part.requires_grad for part in state)


@pytest.mark.parametrize(
    ("state", "error", "message"),
    [
        (
            torch.zeros(2, 3, 4),
            ValueError,
            r"a tuple of 2 tensors of shape \(\(2, 3, 4\), \(2, 3, 4\)\), got \(2, 3, 4\)",
        ),
        ((torch.zeros(2, 3, 4),), ValueError, "a tuple of 2 tensors"),
        ((torch.zeros(2, 3, 4), torch.zeros(2, 2, 4)), ValueError, r"got \(\(2, 3, 4\), \(2, 2, 4\)\)"),
        ([torch.zeros(2, 3, 4), torch.zeros(2, 3, 4)], ValueError, "a tuple of 2 tensors"),
        ((torch.zeros(2, 3, 4), torch.zeros(2, 3, 4, dtype=torch.float64)), TypeError, "state is torch.float64"),
    ],
)
def test_a_wrong_tuple_state_is_refused_naming_the_expected_shapes(state, error, message):
    with pytest.raises(error, match=message):
        tuple_lstm(num_layers=2)(torch.randn(3, 6, 5), state=state)


@needs_cxx
def test_a_compiled_tuple_step_equals_the_eager_step():
    torch.manual_seed(4)
    eager = tuple_lstm(num_layers=2, bidirectional=True)
    compiled = tuple_lstm(num_layers=2, bidirectional=True, compile_step=True)
    compiled.load_state_dict(eager.state_dict())
    mask = torch.arange(6) < torch.tensor([6, 4, 1]).unsqueeze(1)
    assert_compiled_matches_eager(eager, compiled, torch.randn(3, 6, 5), mask)
