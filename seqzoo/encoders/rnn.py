"""Baseline encoders the papers compare against: LSTM, GRU (torch/cuDNN kernels) and a Transformer.

LSTM: Hochreiter & Schmidhuber (1997); GRU: Cho et al. (2014); Transformer encoder:
Vaswani et al. (2017). All follow the :mod:`seqzoo.encoders.base` contract; pad positions never reach
the state or the backward direction. A padded batch is packed, except on CPU in training when at
least half of it is real tokens: there it runs unpacked, a layer and a direction at a time,
because torch's packed RNN backward is slow on CPU (pytorch#149194; fwd+bwd 1.1-4.9x the unpacked
time at 16x50x128 and 32x200x256 with lengths in [T/2, T], ``benchmarks/padded_rnn.py``).
Pads follow the real tokens (a reverse direction reads each row's real tokens reversed). The GRU
runs over the whole padded batch and reads each row's state from its outputs; the LSTM, whose c is
not in its outputs, runs in time segments that end where rows end (``_lstm_by_length``). Without
autograd, or with mostly padding (under half real tokens; ``_run_unpacked``), the packed run is
taken.
"""

from __future__ import annotations

import math
from collections import Counter

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.nn.utils.rnn import pack_padded_sequence, pad_packed_sequence

from seqzoo.encoders.base import (
    Encoder,
    State,
    check_layer_dropout,
    check_rate,
    check_state_dtype,
    describe_state,
    lengths_from_mask,
    register_encoder,
    reverse_padded,
    takes_all_real_shortcut,
    zero_padding,
)

__all__ = ["GRU", "LSTM", "TransformerEncoder", "sinusoidal_positions"]


class _TorchRNN(Encoder):
    """Shared wrapper around ``nn.LSTM`` / ``nn.GRU`` (batch first; padded batches see the module docstring)."""

    rnn_class: type[nn.RNNBase]
    repr_fields = ("num_layers",)

    def __init__(
        self,
        input_size: int,
        hidden_size: int,
        num_layers: int = 1,
        dropout: float = 0.0,
        bidirectional: bool = False,
        bias: bool = True,
    ) -> None:
        super().__init__(input_size, hidden_size, bidirectional=bidirectional)
        check_layer_dropout(dropout, num_layers)
        self.num_layers = num_layers
        self.rnn = self.rnn_class(
            input_size,
            hidden_size,
            num_layers=num_layers,
            bias=bias,
            batch_first=True,
            dropout=dropout if num_layers > 1 else 0.0,
            bidirectional=bidirectional,
        )

    def forward(self, x: Tensor, mask: Tensor | None = None, state: State = None) -> tuple[Tensor, State]:
        mask = self.check_input(x, mask)
        state = tuple(state) if isinstance(state, list) else state  # [h, c] as the other encoders take it
        self._check_state(state, x)
        if takes_all_real_shortcut(mask):
            out, final = self.rnn(x, state)
            # Under CPU autocast torch's LSTM kernel returns bfloat16, the padded paths (and every
            # other encoder) the weights' dtype: return that here too (an exact widening), so the
            # dtype does not depend on the mask. (Under CUDA autocast both paths run cuDNN in half.)
            dtype = self.rnn.weight_ih_l0.dtype
            if x.device.type == "cpu" and out.dtype != dtype:
                out = out.to(dtype)
                final = tuple(t.to(dtype) for t in final) if isinstance(final, tuple) else final.to(dtype)
            return out, final
        lengths = lengths_from_mask(mask)
        x = zero_padding(x, mask, all_real=False)  # the unpacked run and an empty row's one packed step read pads
        tracing = torch.jit.is_tracing()  # a trace records the packed path, which serves every mask
        if not tracing and self._run_unpacked(x, lengths, state):
            out, final = self._unpacked(x, lengths, state)
        else:  # rows without any real token are run for one (zeroed) step, then restored below
            packed = pack_padded_sequence(x, lengths.clamp(min=1).cpu(), batch_first=True, enforce_sorted=False)
            out, final = self.rnn(packed, state)
            out, _ = pad_packed_sequence(out, batch_first=True, total_length=x.shape[1])
        out = out * mask.unsqueeze(-1).to(out.dtype)
        empty = lengths == 0
        if tracing or bool(empty.any()):
            final = _keep_initial(final, state, empty)
        return out, final

    def _check_state(self, state: State, x: Tensor) -> None:
        """A carried state must be this batch's and this stack's: h (GRU) or (h, c) (LSTM), each
        (num_layers * directions, B, hidden_size), in the weights' dtype."""
        if state is None:
            return
        shape = (self.num_layers * (2 if self.bidirectional else 1), x.shape[0], self.hidden_size)
        lstm = isinstance(self.rnn, nn.LSTM)
        if lstm:
            parts = state if isinstance(state, tuple) and len(state) == 2 else None
        else:
            parts = (state,)
        if parts is None or not all(isinstance(t, Tensor) and tuple(t.shape) == shape for t in parts):
            expected = f"(h, c), each of shape {shape}" if lstm else f"a tensor of shape {shape}"
            raise ValueError(f"state must be {expected}, got {describe_state(state)}")
        check_state_dtype(parts, self.rnn.weight_ih_l0, x.device.type)

    def _run_unpacked(self, x: Tensor, lengths: Tensor, state: State) -> bool:
        """Whether a padded batch runs unpacked: on CPU, when autograd will run backward through the
        RNN, and when at least half of the batch's B x T positions are real tokens. Below that the
        GRU's unpacked run, which steps through the pads, was the slower one from a quarter to a
        half real; the LSTM's computes no pad but runs a segment per distinct length, and lost to
        packing at B=32, T=50 with 16-32 % real (0.7-1.0x)."""
        states = state if isinstance(state, tuple) else () if state is None else (state,)
        needs_grad = torch.is_grad_enabled() and any(t.requires_grad for t in (x, *self.parameters(), *states))
        return x.device.type == "cpu" and needs_grad and 2 * int(lengths.sum()) >= x.shape[0] * x.shape[1]

    # Run eagerly under torch.compile, as dynamo runs nn.LSTM / nn.GRU themselves: inductor's
    # lowering of a bare torch.lstm fails ("expected Tensor() for op mkldnn_rnn_layer") when the
    # input does not require grad (torch 2.13).
    @torch.compiler.disable
    def _unpacked(self, x: Tensor, lengths: Tensor, state: State) -> tuple[Tensor, State]:
        """The padded batch without packing, one layer and direction at a time (as torch's CPU
        kernel runs them), with torch's dropout between layers. A reverse direction runs over each
        row's real tokens reversed (``reverse_padded``), so in every run the pads come after the
        real tokens and the outputs there are exact. Empty rows are restored by the caller."""
        rnn, lstm = self.rnn, isinstance(self.rnn, nn.LSTM)
        directions = 2 if self.bidirectional else 1
        if state is None:
            zeros = x.new_zeros(self.num_layers * directions, x.shape[0], self.hidden_size)
            state = (zeros, zeros) if lstm else zeros
        h0, c0 = state if lstm else (state, None)
        layer_input, h_finals, c_finals = x, [], []
        for layer in range(self.num_layers):
            if layer:
                layer_input = F.dropout(layer_input, rnn.dropout, rnn.training)
            outputs = []
            for direction in range(directions):
                k = layer * directions + direction
                names = [f"{n}_l{layer}{'_reverse' if direction else ''}" for n in _RNN_PARAMETERS]
                params = [getattr(rnn, n) for n in names if hasattr(rnn, n)]  # weights, then biases if any
                inputs = reverse_padded(layer_input, lengths, time_dim=1) if direction else layer_input
                out, h, c = _one_direction(inputs, lengths, params, h0[k], None if c0 is None else c0[k])
                outputs.append(reverse_padded(out, lengths, time_dim=1) if direction else out)
                h_finals.append(h)
                c_finals.append(c)
            layer_input = torch.cat(outputs, -1) if directions == 2 else outputs[0]
        h_final = torch.stack(h_finals)  # (layers * directions, B, H)
        return layer_input, ((h_final, torch.stack(c_finals)) if lstm else h_final)


_RNN_PARAMETERS = ("weight_ih", "weight_hh", "bias_ih", "bias_hh")


def _one_direction(
    x: Tensor, lengths: Tensor, params: list[Tensor], h0: Tensor, c0: Tensor | None
) -> tuple[Tensor, Tensor, Tensor | None]:
    """One LSTM (``c0`` given) or GRU layer over padded x (B, T, D) whose pads follow the real
    tokens: outputs (B, T, H), exact at real tokens, and the state (B, H) after each row's last
    real token (meaningless for empty rows, which the caller restores). The GRU runs once over
    the whole batch and reads h from its outputs; the LSTM's c is not in its outputs, so the LSTM
    runs by length (``_lstm_by_length``)."""
    bias = len(params) == 4
    if c0 is not None:
        return _lstm_by_length(x, lengths, params, h0, c0, bias)
    out = torch.gru(x, h0.unsqueeze(0), params, bias, 1, 0.0, False, False, True)[0]
    return out, out[torch.arange(x.shape[0]), (lengths - 1).clamp(min=0)], None


def _lstm_by_length(
    x: Tensor, lengths: Tensor, params: list[Tensor], h0: Tensor, c0: Tensor, bias: bool
) -> tuple[Tensor, Tensor, Tensor]:
    """The LSTM over padded x (B, T, D) in time segments that end where rows end: rows sorted by
    length (longest first), segment [s, e) runs ``torch.lstm`` on the rows longer than s from the
    state the previous segment left, and the rows of length e read their (h, c) at its end. No pad
    is computed. Outputs (B, T, H), zero at pads; h, c (B, H)."""
    batch, time = x.shape[:2]
    order = torch.argsort(lengths, descending=True, stable=True)
    rows_of_length = Counter(lengths.tolist())
    running = batch - rows_of_length.pop(0, 0)  # the non-empty rows: a prefix of the sorted ones
    x, h0, c0 = x[order], h0[order], c0[order]
    h, c, start = h0, c0, 0
    outputs, finals = [], [(h0[running:], c0[running:])]  # empty rows' placeholders (the caller restores them)
    for end in sorted(rows_of_length):
        state = (h[:running].unsqueeze(0), c[:running].unsqueeze(0))
        out, h, c = torch.lstm(x[:running, start:end], state, params, bias, 1, 0.0, False, False, True)
        h, c = h[0], c[0]
        outputs.append(F.pad(out, (0, 0, 0, 0, 0, batch - running)))
        running -= rows_of_length[end]  # the rows of length end are the last running ones
        finals.append((h[running:], c[running:]))
        start = end
    outputs.append(x.new_zeros(batch, time - start, h0.shape[-1]))
    restore = torch.argsort(order)
    h_last, c_last = (torch.cat([final[i] for final in finals[::-1]])[restore] for i in (0, 1))
    return torch.cat(outputs, 1)[restore], h_last, c_last


def _keep_initial(final: State, initial: State, rows: Tensor) -> State:
    """Give ``rows`` (B,) bool their initial state back (zeros when ``initial`` is None)."""
    if isinstance(final, tuple):
        inits = initial if initial is not None else (None,) * len(final)
        return tuple(_keep_initial(f, i, rows) for f, i in zip(final, inits, strict=True))
    init = torch.zeros_like(final) if initial is None else initial
    return torch.where(rows.view(1, -1, 1), init, final)


@register_encoder("lstm")
class LSTM(_TorchRNN):
    """LSTM encoder; state is ``(h, c)``, each (num_layers * directions, B, hidden_size)."""

    rnn_class = nn.LSTM


@register_encoder("gru")
class GRU(_TorchRNN):
    """GRU encoder; state is ``h``, (num_layers * directions, B, hidden_size)."""

    rnn_class = nn.GRU


def sinusoidal_positions(length: int, dim: int, device: torch.device | None = None) -> Tensor:
    """Sinusoidal position encodings (Vaswani et al. 2017, section 3.5), (length, dim)."""
    position = torch.arange(length, device=device, dtype=torch.float32).unsqueeze(1)
    freq = torch.exp(torch.arange(0, dim, 2, device=device, dtype=torch.float32) * (-math.log(10000.0) / dim))
    table = torch.zeros(length, dim, device=device)
    table[:, 0::2] = torch.sin(position * freq)
    table[:, 1::2] = torch.cos(position * freq)[:, : dim // 2]
    return table


@register_encoder("transformer")
class TransformerEncoder(Encoder):
    """Transformer encoder (torch built-ins) with sinusoidal positions; optional causal masking.

    ``hidden_size`` is d_model; the input is projected to it when ``input_size`` differs.
    Not stateful: ``state`` must be None and the returned state is None. It attends both ways
    unless ``causal``, so ``bidirectional`` (accepted for configs written for RNNs) must be False.
    """

    stateful = False

    repr_fields = ("causal",)

    def __init__(
        self,
        input_size: int,
        hidden_size: int = 256,
        num_layers: int = 2,
        nhead: int = 4,
        dim_feedforward: int | None = None,
        dropout: float = 0.1,
        causal: bool = False,
        norm_first: bool = True,
        bidirectional: bool = False,
    ) -> None:
        if bidirectional:
            raise ValueError(
                "the Transformer has no bidirectional option: it attends both ways unless causal=True, with "
                "outputs of hidden_size; set bidirectional to false"
            )
        super().__init__(input_size, hidden_size)
        check_rate("dropout", dropout)
        if dim_feedforward is not None and dim_feedforward < 1:
            raise ValueError(f"dim_feedforward must be >= 1 (None: 4 * hidden_size), got {dim_feedforward}")
        if num_layers < 1 or nhead < 1 or hidden_size % nhead:
            raise ValueError(
                f"need num_layers >= 1 and nhead dividing hidden_size {hidden_size}, got {num_layers} and {nhead}"
            )
        self.causal = causal
        self.proj = nn.Linear(input_size, hidden_size) if input_size != hidden_size else nn.Identity()
        layer = nn.TransformerEncoderLayer(
            hidden_size,
            nhead,
            4 * hidden_size if dim_feedforward is None else dim_feedforward,
            dropout,
            batch_first=True,
            norm_first=norm_first,
        )
        self.layers = nn.TransformerEncoder(layer, num_layers, enable_nested_tensor=False)
        self.dropout = nn.Dropout(dropout)

    def forward(self, x: Tensor, mask: Tensor | None = None, state: State = None) -> tuple[Tensor, State]:
        if state is not None:
            raise ValueError("TransformerEncoder is not stateful; pass state=None")
        mask = self.check_input(x, mask)
        time = x.shape[1]
        h = self.proj(zero_padding(x, mask)) * math.sqrt(self.hidden_size)  # attention reads pads at weight 0
        h = h + sinusoidal_positions(time, self.hidden_size, x.device).to(h.dtype)
        attn_mask = None
        if self.causal:
            attn_mask = torch.ones(time, time, dtype=torch.bool, device=x.device).triu(1)  # True = blocked
        key_padding = ~mask
        key_padding[:, 0] &= mask.any(1)  # a row without tokens attends to its first pad, not to nothing (NaN)
        out = self.layers(self.dropout(h), mask=attn_mask, src_key_padding_mask=key_padding, is_causal=self.causal)
        return out.masked_fill(~mask.unsqueeze(-1), 0.0), None
