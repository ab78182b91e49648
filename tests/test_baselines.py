import copy
import itertools
import math
import re
import warnings

import pytest
import torch
from conftest import needs_cxx
from numerics import EPS32, assert_all_close_to_float64, assert_close_to_float64
from torch.nn.utils.rnn import pack_padded_sequence, pad_packed_sequence
from torch.utils._pytree import tree_leaves

from seqzoo import build_encoder
from seqzoo.encoders.base import Encoder, detach_state, lengths_from_mask, register_encoder, reverse_padded
from seqzoo.encoders.rnn import TransformerEncoder, sinusoidal_positions
from seqzoo.heads.poolers import LastPooler, build_pooler
from seqzoo.testing import assert_contract


@pytest.mark.parametrize("name", ["lstm", "gru"])
@pytest.mark.parametrize("bidirectional", [False, True])
@pytest.mark.parametrize("num_layers", [1, 2])
def test_rnn_contract(name, bidirectional, num_layers):
    torch.manual_seed(0)
    enc = build_encoder(name, 6, hidden_size=5, num_layers=num_layers, bidirectional=bidirectional)
    assert enc.output_size == 5 * (2 if bidirectional else 1)
    assert_contract(enc)


@pytest.mark.parametrize("name", ["lstm", "gru"])
@pytest.mark.parametrize("with_state", [False, True])
@pytest.mark.parametrize(("num_layers", "bidirectional"), [(1, False), (1, True), (2, False), (2, True)])
@pytest.mark.parametrize("lengths", [[3, 9, 0, 7], [8, 3, 0, 8]], ids=["distinct", "repeated-short-of-T"])
def test_unpacked_padded_batch_equals_torch_packing(monkeypatch, name, with_state, num_layers, bidirectional, lengths):
    """A padded batch of an LSTM/GRU runs unpacked on CPU (torch's packed backward is several times
    slower); outputs, final states and all gradients equal a packed run, an empty row keeps its
    initial state. The dropout between layers is 0 in eval mode. Lengths that repeat and a batch
    padded past its longest row exercise the LSTM's run by length (``_lstm_by_length``)."""
    torch.manual_seed(0)
    dropout = 0.5 if num_layers > 1 else 0.0
    enc = build_encoder(name, 5, hidden_size=7, num_layers=num_layers, bidirectional=bidirectional, dropout=dropout)
    enc = enc.double().eval()
    x = torch.randn(4, 9, 5, dtype=torch.float64, requires_grad=True)
    lengths = torch.tensor(lengths)  # over half real: the unpacked path
    mask = torch.arange(9) < lengths.unsqueeze(1)
    shape = (num_layers * (2 if bidirectional else 1), 4, 7)
    h0, c0 = (torch.randn(shape, dtype=torch.float64, requires_grad=True) for _ in range(2))
    state = ((h0, c0) if name == "lstm" else h0) if with_state else None

    def run(unpacked: bool) -> list[torch.Tensor]:
        if unpacked:
            with monkeypatch.context() as patch:  # the packed path is not taken
                patch.setattr("seqzoo.encoders.rnn.pack_padded_sequence", None)
                out, final = enc(x, mask, state)
        else:
            packed = pack_padded_sequence(x, lengths.clamp(min=1), batch_first=True, enforce_sorted=False)
            out, final = enc.rnn(packed, state)
            out = pad_packed_sequence(out, batch_first=True, total_length=9)[0] * mask.unsqueeze(-1)
            assert out.shape[-1] == enc.output_size
        finals = list(final) if isinstance(final, tuple) else [final]
        if not unpacked:  # torch ran the empty row for one step; the contract keeps its initial state
            inits = [h0, c0] if with_state else [torch.zeros_like(f) for f in finals]
            finals = [torch.cat([f[:, :2], i[:, 2:3], f[:, 3:]], 1) for f, i in zip(finals, inits, strict=False)]
        weights = [
            torch.randn(t.shape, generator=torch.Generator().manual_seed(3), dtype=t.dtype) for t in [out, *finals]
        ]
        loss = sum((t * w).sum() for t, w in zip([out, *finals], weights, strict=True))
        leaves = [x, *enc.parameters(), *([h0, c0] if with_state else [])]
        grads = torch.autograd.grad(loss, leaves, allow_unused=True)
        return [out, *finals, *(g if g is not None else torch.zeros(()) for g in grads)]

    for a, b in zip(run(True), run(False), strict=True):
        torch.testing.assert_close(a, b, rtol=0, atol=1e-12)


@pytest.mark.parametrize("name", ["lstm", "gru"])
def test_unpacked_dropout_between_layers_in_training(monkeypatch, name):
    """In training the unpacked path drops the second layer's input like torch does: at rate 1 the
    second layer sees zeros, so both paths agree exactly (lower rates draw different masks)."""
    torch.manual_seed(0)
    enc = build_encoder(name, 5, hidden_size=7, num_layers=2, bidirectional=True).double().train()  # float64:
    enc.rnn.dropout = 1.0  # the two paths' kernels round differently, far below float64's default tolerance
    x, lengths = torch.randn(3, 6, 5, dtype=torch.float64), torch.tensor([6, 2, 4])
    mask = torch.arange(6) < lengths.unsqueeze(1)
    with monkeypatch.context() as patch:
        patch.setattr("seqzoo.encoders.rnn.pack_padded_sequence", None)
        out = enc(x, mask)[0]
    packed = pack_padded_sequence(x, lengths, batch_first=True, enforce_sorted=False)
    expected = pad_packed_sequence(enc.rnn(packed)[0], batch_first=True, total_length=6)[0]
    torch.testing.assert_close(out, expected * mask.unsqueeze(-1))


@pytest.mark.parametrize("name", ["lstm", "gru"])
def test_unpacked_ignores_non_finite_pads(name):
    """Pad positions may hold anything (NaN included): outputs there stay zero, gradients finite."""
    torch.manual_seed(0)
    enc = build_encoder(name, 5, hidden_size=7, num_layers=2, bidirectional=True).double()
    lengths = torch.tensor([6, 2, 5])
    mask = torch.arange(6) < lengths.unsqueeze(1)
    clean = torch.randn(3, 6, 5, dtype=torch.float64).masked_fill(~mask.unsqueeze(-1), 0.0)
    results = []
    for pad in (0.0, float("nan")):
        x = clean.masked_fill(~mask.unsqueeze(-1), pad).requires_grad_()
        out, _ = enc(x, mask)
        out.sum().backward()
        grads = [p.grad.clone() for p in enc.parameters()]
        enc.zero_grad()
        results.append([out, x.grad.masked_fill(~mask.unsqueeze(-1), 0.0), *grads])
    for a, b in zip(*results, strict=True):
        torch.testing.assert_close(a, b, rtol=0, atol=0)


def test_unpacked_only_where_it_pays():
    """Unpacked on CPU when backward runs through the RNN and at least half the positions are real."""
    enc = build_encoder("gru", 3, hidden_size=4)
    x = torch.randn(4, 10, 3)
    half, third = torch.tensor([10, 10, 0, 0]), torch.tensor([10, 1, 1, 1])
    assert enc._run_unpacked(x, half, None) and not enc._run_unpacked(x, third, None)
    with torch.no_grad():
        assert not enc._run_unpacked(x, half, None)
    enc.requires_grad_(False)
    assert not enc._run_unpacked(x, half, None)  # nothing to differentiate
    assert enc._run_unpacked(x.requires_grad_(), half, None)


def test_unpacked_checks_the_state_shape():
    enc = build_encoder("lstm", 3, hidden_size=4, num_layers=2)
    x, mask = torch.randn(2, 5, 3), torch.arange(5) < torch.tensor([[3], [5]])
    with pytest.raises(ValueError, match=r"state must be \(h, c\), each of shape \(2, 2, 4\), got \(\(1, 2, 4\)"):
        enc(x, mask, (torch.zeros(1, 2, 4), torch.zeros(1, 2, 4)))
    enc.double()
    message = r"input is torch\.float32 but its weights are torch\.float64"
    for grad in (True, False):  # the unpacked and the packed path
        with torch.set_grad_enabled(grad), pytest.raises(TypeError, match=message):
            enc(x, mask)


def test_reverse_padded_flips_real_tokens_only():
    x = torch.tensor([[4, 5, 6], [7, 8, 0]])
    lengths = torch.tensor([3, 2])
    torch.testing.assert_close(reverse_padded(x, lengths, time_dim=1), torch.tensor([[6, 5, 4], [8, 7, 0]]))
    torch.testing.assert_close(reverse_padded(x.t(), lengths, time_dim=0), torch.tensor([[6, 5, 4], [8, 7, 0]]).t())
    torch.testing.assert_close(reverse_padded(reverse_padded(x, lengths, time_dim=1), lengths, time_dim=1), x)
    with pytest.raises(ValueError, match="time_dim"):
        reverse_padded(x, lengths, time_dim=2)


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


def test_mask_validation_messages():
    enc = build_encoder("gru", 3, hidden_size=2)
    x = torch.randn(2, 4, 3)
    with pytest.raises(TypeError, match="bool"):
        enc(x, torch.ones(2, 4))
    with pytest.raises(TypeError, match=r"mask must be a bool tensor .*, got list"):
        enc(x, [[True] * 4] * 2)
    with pytest.raises(ValueError, match="right-padded"):
        enc(x, torch.tensor([[False, True, True, True]] * 2))
    with pytest.raises(ValueError, match=r"mask is on meta but the input on cpu: move it \(mask.to\(x.device\)\)"):
        enc(x, torch.ones(2, 4, dtype=torch.bool, device="meta"))  # (as a CPU mask with CUDA input)
    with pytest.raises(ValueError, match="unknown encoder"):
        build_encoder("nope", 3, hidden_size=2)


ALL_ENCODERS = {
    "lstm": {},
    "gru": {},
    "transformer": {"nhead": 2},
    "qrnn": {"window": 2},
    "mzu": {"num_zones": 2},
    "dtgru": {},
    "gru_ln": {},
    "dense_lstm": {"num_layers": 2},
}


@pytest.mark.parametrize("name", ALL_ENCODERS)
def test_input_of_the_wrong_size_or_empty_is_refused(name):
    enc = build_encoder(name, 6, hidden_size=4, **ALL_ENCODERS[name])
    with pytest.raises(ValueError, match="expects 6 input features"):
        enc(torch.randn(2, 5, 3))
    for shape in ((2, 0, 6), (0, 5, 6)):
        with pytest.raises(ValueError, match="empty"):
            enc(torch.randn(shape))
    for rate in (1.0, -0.1):  # a one-layer LSTM does not use its dropout, but still checks it
        with pytest.raises(ValueError, match=r"dropout must be in \[0, 1\)"):
            build_encoder(name, 6, hidden_size=4, dropout=rate, **ALL_ENCODERS[name])


def _to_double(state):
    """A (nested) state with every tensor in float64."""
    if isinstance(state, torch.Tensor):
        return state.double()
    return type(state)(_to_double(s) for s in state)


@pytest.mark.parametrize("name", ALL_ENCODERS)
def test_input_of_another_dtype_than_the_weights_is_refused(name):
    """One message for every encoder (the LSTM/GRU had torch's RNN message, the others a matmul's),
    which says how to mend it; under autocast lower-precision input is what autocast makes, so it runs."""
    enc = build_encoder(name, 6, hidden_size=4, **ALL_ENCODERS[name])
    cls = type(enc).__name__
    message = f"{cls} input is torch.float64 but its weights are torch.float32: convert the input"
    with pytest.raises(TypeError, match=re.escape(message)):
        enc(torch.randn(2, 5, 6, dtype=torch.float64))
    with pytest.raises(TypeError, match=re.escape(f"{cls} input must be floating point (embed token ids first)")):
        enc(torch.randint(0, 5, (2, 5, 6)))
    _, state = enc(torch.randn(2, 5, 6))
    if state is not None:  # the LSTM/GRU and QRNN once failed inside torch ("get_mkldnn_dtype", "mat1 and mat2")
        with pytest.raises(
            TypeError, match=re.escape("state is torch.float64 but the encoder's weights are torch.float32")
        ):
            enc(torch.randn(2, 5, 6), None, _to_double(state))
    assert enc.double()(torch.randn(2, 5, 6, dtype=torch.float64))[0].dtype == torch.float64


@pytest.mark.parametrize("name", ["mzu", "dtgru", "gru_ln"])
def test_seqzoos_time_loop_wants_its_state_in_the_weights_dtype_also_under_autocast(name):
    """Unlike the LSTM/GRU/QRNN (check_state_dtype accepts any dtype under autocast), the cells' steps
    mix the state with float32 results, which a bfloat16 state fails inside torch (torch.lerp)."""
    enc = build_encoder(name, 6, hidden_size=4, **ALL_ENCODERS[name])
    x = torch.randn(2, 5, 6)
    _, state = enc(x)
    with torch.autocast("cpu", dtype=torch.bfloat16), pytest.raises(TypeError, match=r"state is torch\.bfloat16"):
        enc(x, None, state.bfloat16())


@pytest.mark.parametrize(
    ("name", "bidirectional"),
    [(name, bi) for name in ALL_ENCODERS for bi in (False, True) if not (bi and name == "transformer")],
)
def test_bfloat16_input_under_cpu_autocast(name, bidirectional, single_thread):
    """Input that is already bfloat16 (the output of a layer before the encoder, under autocast) runs
    forward and backward, padded, close to the float32 run. The DT-GRU and GRU+LN used to fail:
    their zero state took the input's dtype, and the float32 candidate could not be mixed with it."""
    torch.manual_seed(0)
    enc = build_encoder(name, 6, hidden_size=4, bidirectional=bidirectional, **ALL_ENCODERS[name]).eval()
    x = torch.randn(3, 5, 6)
    mask = torch.arange(5) < torch.tensor([5, 3, 1]).unsqueeze(1)
    expected, _ = enc(x, mask)
    half = x.bfloat16().requires_grad_()
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out, _ = enc(half, mask)
    out.float().square().sum().backward()
    assert torch.isfinite(half.grad).all() and (out[~mask] == 0).all()
    torch.testing.assert_close(out.float(), expected, atol=0.05, rtol=0.05)


@pytest.mark.parametrize("name", list(ALL_ENCODERS))
def test_dtype_under_cpu_autocast_does_not_depend_on_the_mask(name, single_thread):
    """Under bfloat16 autocast the LSTM returned bfloat16 outputs and state on all-real batches (torch's
    kernel) but float32 on padded ones (now float32 for both, as the other recurrent encoders)."""

    def dtypes(tree) -> set[torch.dtype]:
        if isinstance(tree, torch.Tensor):
            return {tree.dtype}
        return set().union(*map(dtypes, tree)) if isinstance(tree, (tuple, list)) else set()

    enc = build_encoder(name, 6, hidden_size=4, **ALL_ENCODERS[name])
    x = torch.randn(2, 5, 6)
    seen = []
    for mask in (torch.ones(2, 5, dtype=torch.bool), torch.arange(5) < torch.tensor([[5], [3]])):
        with torch.autocast("cpu", dtype=torch.bfloat16):
            seen.append(dtypes(enc(x, mask)))
    assert len(seen[0]) == 1 and seen[0] == seen[1]
    if name != "transformer":  # its last operation may be autocast's (a linear layer), as in torch's own
        assert seen[0] == {torch.float32}


def test_argument_types_are_checked_before_anything_is_built():
    """A value of the wrong type is refused by name (torch's LSTM took ``bidirectional=1`` and failed
    at the first forward); an int is a float, a bool is no int."""
    for kwargs, message in (
        ({"bidirectional": 1}, "encoder 'gru': bidirectional must be bool, got 1"),
        ({"hidden_size": True}, "encoder 'gru': hidden_size must be int, got True"),
        ({"dropout": "0.1"}, "encoder 'gru': dropout must be float, got '0.1'"),
    ):
        with pytest.raises(ValueError, match=re.escape(message)):
            build_encoder("gru", 4, **{"hidden_size": 8, **kwargs})
    with pytest.raises(ValueError, match=re.escape("window must be int or a list of int, got '2'")):
        build_encoder("qrnn", 4, hidden_size=8, window="2")
    with pytest.raises(ValueError, match=re.escape("filter_size must be int or None, got 2.0")):
        build_encoder("mzu", 4, hidden_size=8, filter_size=2.0)
    assert build_encoder("qrnn", 4, hidden_size=8, window=[2], dropout=0).output_size == 8


@pytest.mark.parametrize("name", [name for name in ALL_ENCODERS if name != "transformer"])
@pytest.mark.parametrize("lengths", [[5, 5], [5, 3]], ids=["all-real", "padded"])
def test_a_state_of_another_batch_or_layout_is_refused(name, lengths):
    """The contract's promise: seqzoo's ValueError naming the expected shape, on both the all-real
    shortcut and the padded path (torch's LSTM/GRU once answered with their own RuntimeError)."""
    enc = build_encoder(name, 6, hidden_size=4, **ALL_ENCODERS[name])
    _, state = enc(torch.randn(3, 5, 6))
    x, mask = torch.randn(2, 5, 6), torch.arange(5) < torch.tensor(lengths).unsqueeze(1)
    with pytest.raises(ValueError, match="state must"):
        enc(x, mask, state)
    flat = state[0] if isinstance(state, tuple) and name != "lstm" else state
    wrong_layout = (flat, flat) if isinstance(flat, torch.Tensor) else flat[0]
    with pytest.raises(ValueError, match="state must"):
        enc(x, mask, wrong_layout)


@pytest.mark.parametrize("name", ["lstm", "dense_lstm"])
def test_an_lstm_state_may_be_a_list(name):
    """[h, c] is taken as (h, c), as the other encoders take lists (it used to be refused with an
    error that printed the right shapes)."""
    enc = build_encoder(name, 6, hidden_size=4, **ALL_ENCODERS[name]).eval()
    x, mask = torch.randn(2, 5, 6), torch.arange(5) < torch.tensor([5, 3]).unsqueeze(1)
    _, state = enc(x, mask)
    listed = list(state) if name == "lstm" else [list(layer) for layer in state]
    torch.testing.assert_close(enc(x, mask, listed), enc(x, mask, state), rtol=0, atol=0)  # the same computation
    bidirectional = build_encoder("lstm", 6, hidden_size=4, bidirectional=True)
    with pytest.raises(ValueError, match=r"each of shape \(2, 2, 4\), got \(\(1, 2, 4\), \(1, 2, 4\)\)"):
        bidirectional(x, mask, listed if name == "lstm" else listed[0])


@needs_cxx
@pytest.mark.parametrize("name", ["lstm", "gru", "qrnn"])
def test_torch_compile_equals_eager_on_a_padded_batch(name, single_thread):
    """``torch.compile(model)`` works on the padded training path (the LSTM's bare torch.lstm
    once crashed inductor when the input did not require grad, as an embedding's output from a
    frozen table does not), with eager values and parameter gradients."""
    torch._dynamo.reset()
    torch.manual_seed(0)
    enc = build_encoder(name, 6, hidden_size=4, **ALL_ENCODERS[name])
    x, mask = torch.randn(3, 5, 6), torch.tensor([[True] * 5, [True] * 3 + [False] * 2, [True] * 4 + [False]])
    results = []
    exact = copy.deepcopy(enc).double()  # the same function in float64 bounds float32's rounding
    for model, inputs, params in ((enc, x, enc), (torch.compile(enc), x, enc), (exact, x.double(), exact)):
        out, _ = model(inputs, mask)
        results.append([out, *torch.autograd.grad(out.square().sum(), list(params.parameters()))])
    eager, compiled, exact_results = results
    assert_all_close_to_float64(compiled, exact_results, eager)


@pytest.mark.parametrize(
    ("name", "kwargs"),
    [
        ("gru_ln", {}),
        ("dtgru", {}),
        ("mzu", {"composition": "sat", "transition_depth": 1}),
        ("transformer", {"nhead": 2}),
    ],
)
def test_torch_compile_captures_one_graph_that_checks_the_mask_itself(name, kwargs, single_thread):
    """While torch.compile traces, the mask checks read no value on the host (a data-dependent
    branch broke every forward into three graphs): these encoders compile with ``fullgraph=True``,
    agree with eager on padded and unpadded batches, and the graph still refuses a left-padded mask."""
    torch._dynamo.reset()
    torch.manual_seed(0)
    enc = build_encoder(name, 6, hidden_size=4, **kwargs).eval()
    compiled = torch.compile(enc, backend="aot_eager", fullgraph=True)
    x = torch.randn(3, 5, 6)
    padded = torch.arange(5) < torch.tensor([5, 3, 1]).unsqueeze(1)
    exact = copy.deepcopy(enc).double()
    for mask in (padded, torch.ones(3, 5, dtype=torch.bool)):
        assert_close_to_float64(compiled(x, mask)[0], exact(x.double(), mask)[0], enc(x, mask)[0])
    with pytest.raises(RuntimeError, match="mask must be right-padded"):
        compiled(x, padded.flip(1))


@pytest.mark.parametrize("name", sorted(set(ALL_ENCODERS) - {"transformer"}))
def test_bidirectional_encoders_are_not_stateful(name):
    """Their backward direction reads the chunk's future, so chunks cannot continue a sequence."""
    enc = build_encoder(name, 6, hidden_size=4, bidirectional=True, **ALL_ENCODERS[name])
    assert not enc.stateful and not enc.causal


def test_transformer_sizes_are_checked():
    """torch's layer answered a head count that does not divide the width with a bare AssertionError."""
    for kwargs in ({"nhead": 3}, {"num_layers": 0}):
        with pytest.raises(ValueError, match=r"need num_layers >= 1 and nhead dividing hidden_size 8"):
            build_encoder("transformer", 6, hidden_size=8, **kwargs)
    with pytest.raises(ValueError, match=r"dim_feedforward must be >= 1 \(None: 4 \* hidden_size\), got 0"):
        build_encoder("transformer", 6, hidden_size=8, nhead=2, dim_feedforward=0)  # 0 once meant 4 * hidden_size


def test_transformer_takes_bidirectional_false_and_runs_in_bfloat16():
    enc = build_encoder("transformer", 6, hidden_size=8, nhead=2, bidirectional=False).to(torch.bfloat16)
    out, _ = enc(torch.randn(2, 3, 6, dtype=torch.bfloat16))
    assert out.dtype == torch.bfloat16
    with pytest.raises(ValueError, match="no bidirectional option"):
        build_encoder("transformer", 6, hidden_size=8, nhead=2, bidirectional=True)


@pytest.mark.parametrize("name", ["last", "mean", "max", "meanmax", "attention"])
def test_poolers_ignore_padding(name):
    torch.manual_seed(0)
    pool = build_pooler(name, 6, bidirectional=True).double()  # float64: a row alone rounds unlike in the batch
    out = torch.randn(2, 5, 6, dtype=torch.float64)
    mask = torch.tensor([[True] * 3 + [False] * 2, [True] * 5])
    noisy = out.clone()
    noisy[0, 3:] = 1e3
    a, b = pool(out, mask), pool(noisy, mask)
    assert a.shape == (2, pool.output_size)
    torch.testing.assert_close(a, b)
    alone = pool(out[:1, :3], mask[:1, :3])
    torch.testing.assert_close(a[:1], alone)
    empty = torch.tensor([[False] * 5, [True] * 5])  # a row without tokens pools to zeros (it was t = 0's values)
    assert pool(noisy, empty)[0].eq(0).all()


@pytest.mark.parametrize("name", ["last", "mean", "max", "meanmax", "attention"])
def test_poolers_check_their_inputs_as_the_encoders_do(name):
    pool = build_pooler(name, 6, bidirectional=True)
    out, mask = torch.randn(2, 5, 6), torch.tensor([[True] * 3 + [False] * 2, [True] * 5])
    torch.testing.assert_close(pool(out), pool(out, torch.ones(2, 5, dtype=torch.bool)))  # None: all real
    with pytest.raises(
        TypeError, match=r"mask must be a bool tensor \(True = real token\), got torch\.(int64|float32)"
    ):
        pool(out, mask.long() if name != "max" else mask.float())
    with pytest.raises(ValueError, match=r"mask shape \(2, 4\) does not match input \(batch, time\) = \(2, 5\)"):
        pool(out, mask[:, :-1])
    with pytest.raises(ValueError, match="right-padded"):
        pool(out, mask.flip(1))
    with pytest.raises(ValueError, match="pooler input has 4 features, its input_size is 6"):
        pool(out[..., :4], mask)


def test_a_bidirectional_last_pooler_needs_an_even_size():
    with pytest.raises(ValueError, match="even size, got input_size 15"):
        build_pooler("last", 15, bidirectional=True)
    assert "bidirectional=True" in repr(build_pooler("last", 16, bidirectional=True))


TRACEABLE = {
    "lstm": {},
    "lstm_bi": {"bidirectional": True},
    "gru": {"num_layers": 2},
    "qrnn": {"window": 2},
    "qrnn_bi": {"window": 2, "bidirectional": True},
    "mzu": {"num_zones": 2},
    "dtgru": {},
    "gru_ln": {},
    "dense_lstm": {"num_layers": 2},
}


@pytest.mark.parametrize("grad", [True, False], ids=["grad", "no_grad"])
@pytest.mark.parametrize("name", TRACEABLE)
def test_a_jit_trace_serves_every_mask(name, grad):
    """Under torch.jit.trace the encoders record their general padded path, so a trace made on an
    all-real example (or under autograd, where the LSTM would run unpacked per length) gives the
    eager outputs and states for any mask (it used to freeze the example's path: padding ignored)."""
    torch.manual_seed(0)
    kwargs = dict(TRACEABLE[name])
    bidirectional = kwargs.pop("bidirectional", False)
    enc = build_encoder(name.removesuffix("_bi"), 6, hidden_size=4, bidirectional=bidirectional, **kwargs).eval()
    x = torch.randn(3, 5, 6)
    with torch.enable_grad() if grad else torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("ignore")  # torch's TracerWarnings and the deprecation of trace itself
        traced = torch.jit.trace(enc, (x, torch.ones(3, 5, dtype=torch.bool)), check_trace=False)
    exact = copy.deepcopy(enc).double()
    for lengths in ([5, 3, 1], [2, 5, 4], [5, 5, 5]):
        other, mask = torch.randn(3, 5, 6), torch.arange(5) < torch.tensor(lengths).unsqueeze(1)
        with torch.no_grad():
            got, want, twin = traced(other, mask), exact(other.double(), mask), enc(other, mask)
        assert_all_close_to_float64(tree_leaves(got), tree_leaves(want), tree_leaves(twin))


def test_repr_shows_the_hyperparameters():
    for name, kwargs in ALL_ENCODERS.items():
        both = name != "transformer"  # which attends both ways unless causal, with no bidirectional option
        first = repr(build_encoder(name, 6, hidden_size=4, bidirectional=both, **kwargs)).splitlines()[1].strip()
        assert first.startswith("6, 4, ") and first.endswith(f"bidirectional={both}"), (name, first)
    mzu = repr(build_encoder("mzu", 6, hidden_size=8, composition="cap", transition_depth=1, disagreement=0.5))
    for part in ("disagreement=0.5", "transition_depth=1, share_transition=False", "composition='cap', num_zones=4"):
        assert part in mzu, part
    assert "num_layers=2, dense=True" in repr(build_encoder("qrnn", 6, hidden_size=4, num_layers=2, dense=True))
    assert "layer_norm=True, linear_gate=False" in repr(build_encoder("gru_ln", 6, hidden_size=4))


@pytest.mark.parametrize("name", ["lstm", "gru", "qrnn", "dense_lstm"])
def test_dropout_between_layers_of_a_single_layer_warns(name):
    """As torch.nn.LSTM warns (seqzoo passes it 0 with one layer, which hid torch's warning)."""
    with pytest.warns(UserWarning, match=r"dropout=0\.3 has no effect with num_layers=1") as record:
        build_encoder(name, 6, hidden_size=4, num_layers=1, dropout=0.3)
    assert [w.filename for w in record] == [__file__]  # the user's line, not seqzoo's
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        build_encoder(name, 6, hidden_size=4, num_layers=2, dropout=0.3)
        build_encoder(name, 6, hidden_size=4, num_layers=1)


def test_sinusoidal_positions_follow_vaswani():
    """Vaswani et al.: PE(p, 2i) = sin(p / 10000^(2i/d)), PE(p, 2i+1) = cos(...), odd d included."""
    for dim in (6, 7):
        table = sinusoidal_positions(5, dim)
        for p, i in itertools.product(range(5), range(dim)):
            angle = p / 10000 ** (2 * (i // 2) / dim)
            expected = math.sin(angle) if i % 2 == 0 else math.cos(angle)
            # a float32 table: the angle's relative error is a few eps times ln(10000) (about 9)
            assert table[p, i].item() == pytest.approx(expected, abs=32 * EPS32 * max(1.0, angle))


def test_transformer_scales_its_projected_input_by_sqrt_d_model():
    """The layers read proj(x)·√d + positions (Vaswani et al., 3.4–3.5)."""
    torch.manual_seed(0)
    enc = TransformerEncoder(3, hidden_size=8, num_layers=1, nhead=2, dropout=0.0).eval()
    seen = []
    enc.layers.register_forward_pre_hook(lambda module, args: seen.append(args[0]))
    x = torch.randn(2, 4, 3)
    with torch.no_grad():
        enc(x)
        expected = enc.proj(x) * math.sqrt(8) + sinusoidal_positions(4, 8)
    torch.testing.assert_close(seen[0], expected)


def test_bidirectional_last_pooler_takes_the_backward_half_at_t0():
    """The backward half is taken at t = 0, where that direction has read the whole row, the
    forward half at the row's last real token."""
    pool = LastPooler(4, bidirectional=True)
    out = torch.arange(2 * 5 * 4, dtype=torch.float64).view(2, 5, 4)
    lengths = torch.tensor([5, 3])
    mask = torch.arange(5) < lengths.unsqueeze(1)
    expected = torch.stack([torch.cat([out[b, n - 1, :2], out[b, 0, 2:]]) for b, n in enumerate(lengths.tolist())])
    torch.testing.assert_close(pool(out, mask), expected)


def test_detach_state_keeps_the_structure_and_detaches_every_tensor():
    """The state's containers keep their types (a list stays a list)."""
    a = torch.ones(2, requires_grad=True) * 2
    state = [(a, a), {"h": a}, None]
    out = detach_state(state)
    assert type(out) is list and type(out[0]) is tuple and type(out[1]) is dict and out[2] is None
    assert not out[0][0].requires_grad and not out[1]["h"].requires_grad and torch.equal(out[0][1], a)


def test_lengths_from_mask_are_int64():
    """(B,) int64, as documented and as pack_padded_sequence wants on the CPU."""
    lengths = lengths_from_mask(torch.tensor([[True, True, False], [True, False, False]]))
    assert lengths.dtype == torch.int64 and lengths.tolist() == [2, 1]


def test_a_name_taken_by_another_encoder_is_refused(monkeypatch):
    """A second class cannot silently replace a registered encoder."""
    before = type(build_encoder("lstm", 3, hidden_size=2))

    class Other(Encoder):
        pass

    from seqzoo.encoders import base

    monkeypatch.setitem(base._REGISTRY, "lstm", before)  # restored even where the refusal is missing
    with pytest.raises(ValueError, match="already registered"):
        register_encoder("lstm")(Other)
    assert type(build_encoder("lstm", 3, hidden_size=2)) is before
    assert register_encoder("lstm")(before) is before  # re-registering the same class is fine
