"""The DA-GRN's inference kernels against their references: the LSTM recurrence over the real tokens
(:mod:`seqzoo.kernels.lstm_recurrence`), the S-LSTM global node's step (:mod:`seqzoo.kernels.slstm_global`) and
its word cells (:mod:`seqzoo.kernels.slstm_word`).

float64 to rounding (libm's exp and tanh, sums in the reference's order); float32 (the kernels' branch-free
exp) within the float32 error bound of tests/numerics.py; any number of threads; the encoders' fallbacks.
The kernels serve inference only (no autograd): the training paths are torch.nn.LSTM and PyTorch.
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
from seqzoo.kernels.slstm_global import global_step, global_step_available, global_step_reference
from seqzoo.kernels.slstm_word import word_cells, word_cells_available, word_cells_reference

UNAVAILABLE = lstm_recurrence_available() or global_step_available() or word_cells_available()
needs_kernels = pytest.mark.skipif(UNAVAILABLE is not None, reason=f"a DA-GRN kernel is not built: {UNAVAILABLE}")

LENGTHS = [7, 0, 1, 4, 40, 3]  # an empty row, a one-word row, one long enough for a chaotic recurrence to show


def lstm_inputs(hidden: int, directions: int, dtype=torch.float64, seed: int = 0, lengths=LENGTHS):
    gen = torch.Generator().manual_seed(seed)
    lengths = torch.tensor(lengths)
    gates = torch.randn(int(lengths.sum()), directions, 4 * hidden, generator=gen, dtype=dtype)
    weight = torch.randn(directions, 4 * hidden, hidden, generator=gen, dtype=dtype) / hidden**0.5
    return gates, weight, lengths


def step_inputs(hidden: int, dtype=torch.float64, seed: int = 0, lengths=LENGTHS):
    """gates_g, forget_pre, cell, h, rows, lengths, c_g, mean_weight, mean_bias (the order of global_step)."""
    gen = torch.Generator().manual_seed(seed)
    lengths = torch.tensor(lengths)
    words, batch = int(lengths.sum()), len(lengths)
    gates_g = torch.randn(batch, 3 * hidden, generator=gen, dtype=dtype)
    per_word = [torch.randn(words, hidden, generator=gen, dtype=dtype) * 2 for _ in range(3)]
    rows = torch.randperm(words, generator=gen)  # the words laid out in any order (deepest first in the S-LSTM)
    c_g = torch.randn(batch, hidden, generator=gen, dtype=dtype)
    mean_weight = torch.randn(2 * hidden, hidden, generator=gen, dtype=dtype) / hidden**0.5
    mean_bias = torch.randn(2 * hidden, generator=gen, dtype=dtype)
    return gates_g, *per_word, rows, lengths, c_g, mean_weight, mean_bias


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
@pytest.mark.parametrize("hidden", [1, 7, 16, 40, 120])  # widths below, at and past the 16-lane blocks
def test_global_step_kernel_equals_reference(hidden):
    inputs = step_inputs(hidden)
    ref64 = global_step_reference(*inputs)
    got = global_step(*inputs)
    for a, b in zip(got, ref64, strict=True):
        torch.testing.assert_close(a, b, rtol=0, atol=1e-12)
    c_g = inputs[6]
    torch.testing.assert_close(got[1][1], c_g[1], rtol=1e-15, atol=0)  # the empty sentence keeps its own cell
    inputs32 = [t.float() if t.is_floating_point() else t for t in inputs]
    twins = global_step_reference(*inputs32)
    for name, a, b, twin in zip(["g", "c_g"], global_step(*inputs32), ref64, twins, strict=True):
        assert_close_to_float64(a, b, twin, what=name)


def test_global_step_reference_is_the_cells_global_update():
    """The reference step is the padded S-LSTM's: its sums over the real words, then the cell's global_update."""
    gates_g, forget_pre, cell, h, rows, lengths, c_g, mean_weight, mean_bias = step_inputs(5)
    slstm_cell = slstm_module.SentenceStateCell(5, 5, 1, "official").double()
    with torch.no_grad():
        slstm_cell.mean_gates.weight.copy_(mean_weight)
        slstm_cell.mean_gates.bias.copy_(mean_bias)
    mask = torch.arange(int(lengths.max())) < lengths.unsqueeze(1)
    padded = [torch.zeros(*mask.shape, 5, dtype=torch.float64).masked_scatter_(mask.unsqueeze(-1), t[rows])
              for t in (forget_pre, cell, h)]  # fmt: skip
    e = torch.sigmoid(gates_g[:, None, 10:] + padded[0]).exp() * mask.unsqueeze(-1)
    h_mean = padded[2].sum(1) / lengths.clamp(min=1).unsqueeze(1)
    want = slstm_cell.global_update(gates_g, h_mean, (e * padded[1]).sum(1), e.sum(1), c_g)
    got = global_step_reference(gates_g, forget_pre, cell, h, rows, lengths, c_g, mean_weight, mean_bias)
    for a, b in zip(got, want, strict=True):
        torch.testing.assert_close(a, b, rtol=0, atol=1e-13)


@needs_kernels
def test_global_step_kernel_over_threads(monkeypatch):
    """Sentences over worker threads (725 words at H = 120: enough work for two), the one-thread step."""
    inputs = step_inputs(120, torch.float32, lengths=[60, 0, 1, 40, 20, 24] * 5)
    one = global_step(*inputs)
    monkeypatch.setattr(torch, "get_num_threads", lambda: 3)
    assert all(torch.equal(a, b) for a, b in zip(global_step(*inputs), one, strict=True))


def word_inputs(hidden: int, variant: str, side: int, dtype=torch.float64, seed: int = 0, words: int = 9):
    """pre, global_pre, sentence, cells, near, c_global, x_cell (the order of word_cells): ``words`` words of 3
    sentences, cells with a zero row last (the S-LSTM's rows for pads and outside the sentence)."""
    gen = torch.Generator().manual_seed(seed)
    groups, batch = (7, 3) if variant == "paper" else (6, 3)
    pre = torch.randn(words, groups * hidden, generator=gen, dtype=dtype) * 2
    global_pre = torch.randn(batch, groups * hidden, generator=gen, dtype=dtype)
    sentence = torch.randint(0, batch, (words,), generator=gen)
    cells = torch.cat([torch.randn(words + 4, hidden, generator=gen, dtype=dtype), torch.zeros(1, hidden, dtype=dtype)])
    near = torch.randint(0, words + 5, (words, 2 * side), generator=gen)
    c_global = torch.randn(batch, hidden, generator=gen, dtype=dtype)
    x_cell = None if variant == "paper" else torch.randn(words, hidden, generator=gen, dtype=dtype)
    return pre, global_pre, sentence, cells, near, c_global, x_cell


@needs_kernels
@pytest.mark.parametrize(("variant", "side"), [("paper", 1), ("official", 1), ("official", 2)])
@pytest.mark.parametrize("hidden", [1, 7, 16, 40])  # widths below, at and past the 16-lane blocks
def test_word_cells_kernel_equals_reference(hidden, variant, side):
    inputs = word_inputs(hidden, variant, side)
    ref64 = word_cells_reference(*inputs)
    for a, b in zip(word_cells(*inputs), ref64, strict=True):
        torch.testing.assert_close(a, b, rtol=0, atol=1e-12)
    inputs32 = [t.float() if t is not None and t.is_floating_point() else t for t in inputs]
    twins = word_cells_reference(*inputs32)
    for name, a, b, twin in zip(["h", "c"], word_cells(*inputs32), ref64, twins, strict=True):
        assert_close_to_float64(a, b, twin, what=name)


def test_word_cells_reference_is_the_cells_word_update():
    """The reference is the S-LSTM cell's word update (its training path) on the gathered neighbours."""
    for variant in ("paper", "official"):
        pre, global_pre, sentence, cells, near, c_global, x_cell = word_inputs(5, variant, 1)
        cell = slstm_module.SentenceStateCell(5, 5, 1, variant).double()
        c_left, c_right = cells[near[:, 0]], cells[near[:, 1]]
        want = cell.word_update(
            pre + global_pre[sentence], cells[: len(pre)], c_left, c_right, c_global[sentence], x_cell
        )
        got = word_cells_reference(pre, global_pre, sentence, cells, near, c_global, x_cell)
        for a, b in zip(got, want, strict=True):
            torch.testing.assert_close(a, b, rtol=0, atol=0)


@needs_kernels
def test_word_cells_kernel_over_threads(monkeypatch):
    """Words over worker threads (600 words at H = 120: enough work for several), the one-thread result."""
    inputs = word_inputs(120, "official", 1, torch.float32, words=600)
    one = word_cells(*inputs)
    monkeypatch.setattr(torch, "get_num_threads", lambda: 3)
    assert all(torch.equal(a, b) for a, b in zip(word_cells(*inputs), one, strict=True))


@needs_kernels
def test_kernels_refuse_bad_arguments():
    gates, weight, lengths = lstm_inputs(4, 2)
    with pytest.raises(ValueError, match="lengths must be"):
        lstm_recurrence(gates, weight, lengths + 1)
    with pytest.raises(ValueError, match="weight_hh must be"):
        lstm_recurrence(gates, weight[:1], lengths)
    gates_g, forget_pre, cell, h, rows, lengths, *node = step_inputs(4)
    with pytest.raises(ValueError, match="rows must index"):
        global_step(gates_g, forget_pre, cell, h, rows + 1, lengths, *node)
    with pytest.raises(ValueError, match="lengths must be"):
        global_step(gates_g, forget_pre, cell, h, rows, lengths.flip(0)[:-1], *node)
    with pytest.raises(ValueError, match="gates_g must be"):
        global_step(gates_g[:, :-1], forget_pre, cell, h, rows, lengths, *node)
    pre, global_pre, sentence, cells, near, c_global, x_cell = word_inputs(4, "official", 1)
    with pytest.raises(ValueError, match="near must index"):
        word_cells(pre, global_pre, sentence, cells, near + len(cells), c_global, x_cell)
    with pytest.raises(ValueError, match="pre and global_pre must be"):
        word_cells(pre, global_pre, sentence, cells, near, c_global, None)  # official gates without x_cell


def dagrn_batch():
    torch.manual_seed(0)
    model = DAGRN(6, 10, num_layers=3, depth_size=4, depth_mode="hard").double().eval()
    lengths = torch.tensor([5, 3, 0, 1, 4])
    mask = torch.arange(5) < lengths.unsqueeze(1)
    x = torch.randn(5, 5, 6, dtype=torch.float64) * mask.unsqueeze(-1)
    return model, x, mask


@needs_kernels
def test_dagrn_inference_bilstm_is_the_packed_one():
    """DA-GRN's inference Bi-LSTM (the kernel) against its module (packed torch.nn.LSTM), float64, an empty
    row included."""
    model, x, mask = dagrn_batch()
    with torch.no_grad():
        fast = model.sequential_rows(x, mask)  # (M, H) at the real words
        packed = model.sequential(x, mask)[0]
    torch.testing.assert_close(fast, packed[mask], rtol=0, atol=1e-13)


def test_dagrn_without_the_kernels_warns_and_gives_the_same_values(monkeypatch):
    model, x, mask = dagrn_batch()
    with torch.no_grad():
        want = model(x, mask)
    monkeypatch.setattr(dagrn_module, "lstm_recurrence_available", lambda: "cannot load _lstm_recurrence.so (test)")
    monkeypatch.setattr(slstm_module, "global_step_available", lambda: "cannot load _slstm_global.so (test)")
    monkeypatch.setattr(slstm_module, "word_cells_available", lambda: "cannot load _slstm_word.so (test)")
    with torch.no_grad(), pytest.warns(RuntimeWarning) as warned:
        got = model(x, mask)
    messages = " ".join(str(w.message) for w in warned)
    assert "packed torch.nn.LSTM: cannot load" in messages and "PyTorch step: cannot load" in messages
    assert "PyTorch update: cannot load" in messages
    torch.testing.assert_close(got[0], want[0], rtol=0, atol=1e-13)
    torch.testing.assert_close(got[1], want[1], rtol=0, atol=1e-13)
