"""Baseline encoders the papers compare against: LSTM, GRU (torch/cuDNN kernels) and a Transformer.

LSTM: Hochreiter & Schmidhuber (1997); GRU: Cho et al. (2014); Transformer encoder:
Vaswani et al. (2017). All follow the :mod:`seqzoo.base` contract; padding is handled by
packing, so pad positions never reach the state or the backward direction. A padded batch of a
single-layer unidirectional LSTM/GRU on CPU runs unpacked instead: torch's packed RNN backward is
5-7x slower there (pytorch#149194), and since pads follow the real tokens only the state needs
reading back (see ``_TorchRNN._unpacked``).
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.nn.utils.rnn import pack_padded_sequence, pad_packed_sequence

from seqzoo.base import Encoder, State, check_rate, lengths_from_mask, register_encoder
from seqzoo.kernels import qrnn_pool

__all__ = ["GRU", "LSTM", "TransformerEncoder", "sinusoidal_positions"]


class _TorchRNN(Encoder):
    """Shared wrapper around ``nn.LSTM`` / ``nn.GRU`` (batch first, packed when padded)."""

    rnn_class: type[nn.RNNBase]

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
        check_rate("dropout", dropout)
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
        if bool(mask.all()):
            return self.rnn(x, state)
        lengths = lengths_from_mask(mask)
        if self.num_layers == 1 and not self.bidirectional and x.device.type == "cpu":
            out, final = self._unpacked(x, lengths, state)
        else:  # rows without any real token are run for one (zeroed) step, then restored below
            packed = pack_padded_sequence(x, lengths.clamp(min=1).cpu(), batch_first=True, enforce_sorted=False)
            out, final = self.rnn(packed, state)
            out, _ = pad_packed_sequence(out, batch_first=True, total_length=x.shape[1])
        out = out * mask.unsqueeze(-1).to(out.dtype)
        empty = lengths == 0
        if bool(empty.any()):
            final = _keep_initial(final, state, empty)
        return out, final

    def _unpacked(self, x: Tensor, lengths: Tensor, state: State) -> tuple[Tensor, State]:
        """One layer, one direction, over the padded batch without packing. Pads come after each
        row's real tokens, so the outputs there are exact; the state after the last real token is
        read back: h from the outputs, and the LSTM's c by running its cell recurrence
        ``c_t = f_t c_{t-1} + i_t g_t`` (elementwise: the QRNN's ifo-pooling) over the gates
        recomputed in one matmul from x_t and h_{t-1}. Empty rows are restored by the caller."""
        batch, time, _ = x.shape
        out, _ = self.rnn(x, state)  # (B, T, H); pads are masked by the caller
        h_last = out[torch.arange(batch), (lengths - 1).clamp(min=0)].unsqueeze(0)  # (1, B, H)
        if not isinstance(self.rnn, nn.LSTM):
            return out, h_last
        h0, c0 = state if state is not None else (out.new_zeros(1, batch, self.hidden_size), None)
        h_prev = torch.cat([h0[0].unsqueeze(1), out[:, :-1]], 1)  # h_{t-1} (B, T, H)
        rnn, order = self.rnn, [2, 1, 3, 0]  # torch's gate rows i, f, g, o -> the pooling's z, f, o, i

        def pool_rows(t: Tensor | None) -> Tensor | None:
            return None if t is None else t.view(4, self.hidden_size, *t.shape[1:])[order].flatten(0, 1)

        gates = F.linear(x, pool_rows(rnn.weight_ih_l0), pool_rows(getattr(rnn, "bias_ih_l0", None)))
        gates = gates + F.linear(h_prev, pool_rows(rnn.weight_hh_l0), pool_rows(getattr(rnn, "bias_hh_l0", None)))
        _, c_last = qrnn_pool(gates.view(batch, time, 4, -1), lengths, None if c0 is None else c0[0], pooling="ifo")
        return out, (h_last, c_last.unsqueeze(0))


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
        self.causal = causal
        self.proj = nn.Linear(input_size, hidden_size) if input_size != hidden_size else nn.Identity()
        layer = nn.TransformerEncoderLayer(
            hidden_size,
            nhead,
            dim_feedforward or 4 * hidden_size,
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
        h = self.proj(x) * math.sqrt(self.hidden_size)
        h = h + sinusoidal_positions(time, self.hidden_size, x.device).to(h.dtype)
        attn_mask = None
        if self.causal:
            attn_mask = torch.ones(time, time, dtype=torch.bool, device=x.device).triu(1)  # True = blocked
        key_padding = ~mask
        key_padding[:, 0] &= mask.any(1)  # a row without tokens attends to its first pad, not to nothing (NaN)
        out = self.layers(self.dropout(h), mask=attn_mask, src_key_padding_mask=key_padding, is_causal=self.causal)
        return out.masked_fill(~mask.unsqueeze(-1), 0.0), None
