"""The DA-GRN's inference kernels against their references: the LSTM recurrence over the real tokens
(:mod:`seqzoo.kernels.lstm_recurrence`) and the S-LSTM global node's sums (:mod:`seqzoo.kernels.slstm_global`).

float64 to rounding (libm's exp and tanh, sums in the reference's order); float32 (the kernels' branch-free
exp) within the float32 error bound of tests/numerics.py; any number of threads; the encoders' fallbacks.
Both kernels serve inference only (no autograd): the training paths are torch.nn.LSTM and PyTorch.
"""

from __future__ import annotations

import pytest
import torch
from numerics import assert_close_to_float64
from torch import nn

import seqzoo.encoders.dagrn as dagrn_module
import seqzoo.encoders.slstm as slstm_module
from seqzoo.encoders.dagrn import DAGRN
from seqzoo.kernels.lstm_recurrence import lstm_recurrence, lstm_recurrence_available, lstm_recurrence_reference
from seqzoo.kernels.slstm_global import global_sums, global_sums_available, global_sums_reference

needs_kernels = pytest.mark.skipif(
    lstm_recurrence_available() is not None or global_sums_available() is not None,
    reason=f"a DA-GRN kernel is not built: {lstm_recurrence_available() or global_sums_available()}",
)

LENGTHS = [7, 0, 1, 4, 40, 3]  # an empty row, a one-word row, one long enough for a chaotic recurrence to show


def lstm_inputs(hidden: int, directions: int, dtype=torch.float64, seed: int = 0, lengths=LENGTHS):
    gen = torch.Generator().manual_seed(seed)
    lengths = torch.tensor(lengths)
    gates = torch.randn(int(lengths.sum()), directions, 4 * hidden, generator=gen, dtype=dtype)
    weight = torch.randn(directions, 4 * hidden, hidden, generator=gen, dtype=dtype) / hidden**0.5
    return gates, weight, lengths


def sums_inputs(hidden: int, dtype=torch.float64, seed: int = 0, lengths=LENGTHS):
    gen = torch.Generator().manual_seed(seed)
    lengths = torch.tensor(lengths)
    words = int(lengths.sum())
    forget_g = torch.randn(len(lengths), hidden, generator=gen, dtype=dtype)
    per_word = [torch.randn(words, hidden, generator=gen, dtype=dtype) * 2 for _ in range(3)]
    rows = torch.randperm(words, generator=gen)  # the words laid out in any order (deepest first in the S-LSTM)
    return forget_g, *per_word, rows, lengths


def test_lstm_reference_is_torch_lstm():
    """The reference recurrence is torch.nn.LSTM's (gate order i, f, g, o; the reverse direction reads each
    row backwards from its last word), against the packed bidirectional LSTM in float64."""
    torch.manual_seed(0)
    lstm = nn.LSTM(3, 5, bidirectional=True, batch_first=True).double()
    lengths = torch.tensor([4, 1, 6])
    mask = torch.arange(6) < lengths.unsqueeze(1)
    x = torch.randn(3, 6, 3, dtype=torch.float64)
    packed = nn.utils.rnn.pack_padded_sequence(x, lengths, batch_first=True, enforce_sorted=False)
    want = nn.utils.rnn.pad_packed_sequence(lstm(packed)[0], batch_first=True)[0][mask]  # (M, 2H)
    weights = lstm.all_weights
    w_ih, bias = torch.cat([w[0] for w in weights]), torch.cat([w[2] + w[3] for w in weights])
    gates = nn.functional.linear(x[mask], w_ih, bias).view(-1, 2, 20)
    with torch.no_grad():
        got = lstm_recurrence_reference(gates, torch.stack([w[1] for w in weights]), lengths)
    torch.testing.assert_close(got.flatten(1), want, rtol=0, atol=1e-14)


@needs_kernels
@pytest.mark.parametrize("directions", [1, 2])
@pytest.mark.parametrize("hidden", [1, 5, 16, 60])  # widths 4H below, at and past the 16-lane blocks
def test_lstm_kernel_equals_reference(hidden, directions):
    gates, weight, lengths = lstm_inputs(hidden, directions)
    ref64 = lstm_recurrence_reference(gates, weight, lengths)
    torch.testing.assert_close(lstm_recurrence(gates, weight, lengths), ref64, rtol=0, atol=1e-12)
    twin = lstm_recurrence_reference(gates.float(), weight.float(), lengths)
    assert_close_to_float64(lstm_recurrence(gates.float(), weight.float(), lengths), ref64, twin, what="float32")


@needs_kernels
def test_lstm_kernel_over_threads(monkeypatch):
    """Rows over worker threads: each row and direction is computed whole by one thread, so the result
    is the one-thread result, bit for bit. (32 rows of up to 40 words at H = 60: enough work for the kernel
    to start its threads.)"""
    gates, weight, lengths = lstm_inputs(60, 2, torch.float32, lengths=[7, 0, 1, 4, 40, 3, 25, 12] * 4)
    one = lstm_recurrence(gates, weight, lengths)
    monkeypatch.setattr(torch, "get_num_threads", lambda: 3)
    assert torch.equal(lstm_recurrence(gates, weight, lengths), one)


@needs_kernels
@pytest.mark.parametrize("hidden", [1, 7, 16, 120])
def test_global_sums_kernel_equals_reference(hidden):
    inputs = sums_inputs(hidden)
    ref64 = global_sums_reference(*inputs)
    got = global_sums(*inputs)
    for a, b in zip(got, ref64, strict=True):
        torch.testing.assert_close(a, b, rtol=0, atol=1e-12)
    assert all((t[1] == 0).all() for t in got)  # the empty sentence
    inputs32 = [t.float() if t.is_floating_point() else t for t in inputs]
    twins = global_sums_reference(*inputs32)
    for name, a, b, twin in zip(["weighted", "weights", "h_sum"], global_sums(*inputs32), ref64, twins, strict=True):
        assert_close_to_float64(a, b, twin, what=name)


@needs_kernels
def test_global_sums_kernel_over_threads(monkeypatch):
    """Sentences over worker threads (725 words at H = 120: enough work for two), the one-thread sums."""
    inputs = sums_inputs(120, torch.float32, lengths=[60, 0, 1, 40, 20, 24] * 5)
    one = global_sums(*inputs)
    monkeypatch.setattr(torch, "get_num_threads", lambda: 3)
    assert all(torch.equal(a, b) for a, b in zip(global_sums(*inputs), one, strict=True))


@needs_kernels
def test_kernels_refuse_bad_arguments():
    gates, weight, lengths = lstm_inputs(4, 2)
    with pytest.raises(ValueError, match="lengths must be"):
        lstm_recurrence(gates, weight, lengths + 1)
    with pytest.raises(ValueError, match="weight_hh must be"):
        lstm_recurrence(gates, weight[:1], lengths)
    forget_g, forget_pre, cell, h, rows, lengths = sums_inputs(4)
    with pytest.raises(ValueError, match="rows must index"):
        global_sums(forget_g, forget_pre, cell, h, rows + 1, lengths)
    with pytest.raises(ValueError, match="lengths must be"):
        global_sums(forget_g, forget_pre, cell, h, rows, lengths.flip(0)[:-1])


def dagrn_batch():
    torch.manual_seed(0)
    model = DAGRN(6, 10, num_layers=3, depth_size=4, depth_mode="hard").double().eval()
    lengths = torch.tensor([5, 3, 0, 1, 4])
    mask = torch.arange(5) < lengths.unsqueeze(1)
    x = torch.randn(5, 5, 6, dtype=torch.float64) * mask.unsqueeze(-1)
    return model, x, mask


@needs_kernels
def test_dagrn_inference_bilstm_is_the_packed_one():
    """DA-GRN's inference Bi-LSTM (the kernel) against its module (packed torch.nn.LSTM), float64, zero at
    pads, an empty row included."""
    model, x, mask = dagrn_batch()
    with torch.no_grad():
        fast = model.sequential_features(x, mask)
        packed = model.sequential(x, mask)[0]
    torch.testing.assert_close(fast, packed, rtol=0, atol=1e-13)
    assert (fast[~mask] == 0).all()


def test_dagrn_without_the_kernels_warns_and_gives_the_same_values(monkeypatch):
    model, x, mask = dagrn_batch()
    with torch.no_grad():
        want = model(x, mask)
    monkeypatch.setattr(dagrn_module, "lstm_recurrence_available", lambda: "cannot load _lstm_recurrence.so (test)")
    monkeypatch.setattr(slstm_module, "global_sums_available", lambda: "cannot load _slstm_global.so (test)")
    with torch.no_grad(), pytest.warns(RuntimeWarning) as warned:
        got = model(x, mask)
    messages = " ".join(str(w.message) for w in warned)
    assert "packed torch.nn.LSTM: cannot load" in messages and "PyTorch sums: cannot load" in messages
    torch.testing.assert_close(got[0], want[0], rtol=0, atol=1e-13)
    torch.testing.assert_close(got[1], want[1], rtol=0, atol=1e-13)
