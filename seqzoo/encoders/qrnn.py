"""Quasi-Recurrent Neural Network encoder.

Bradbury, Merity, Xiong, Socher. "Quasi-Recurrent Neural Networks". ICLR 2017.

A layer is a causal convolution of width k over time, the matmul of an ``nn.Linear`` over the window
``[x_{t-k+1}, ..., x_t]`` (eqs. 1-2), followed by elementwise f-, fo- or ifo-pooling (eqs. 3-5),
both through :func:`seqzoo.kernels.qrnn_layer` (fused C / Triton kernels with a PyTorch reference). Conventions
(MODELS.md, Decision 1): ``f`` multiplies the OLD state; zoneout (eq. 6) sets ``f = 1`` on a
random subset of channels during training without rescaling and uses the expectation
``f = 1 - (1 - p)(1 - f)`` at evaluation. With ifo-pooling it also sets ``i = 0`` on those channels
(``i (1 - p)`` at evaluation): the paper defines zoneout as keeping "the previous pooling state",
which eq. 6 alone achieves only for f- and fo-pooling. Densely-connected stacks follow MODELS.md 1.5.

State (unidirectional): one ``(c, x_tail)`` pair per layer, ``c`` (B, H) the pooling cell state
and ``x_tail`` (B, k - 1, n) the layer's last k - 1 real inputs, so a sequence fed chunk by
chunk gives the same result as fed whole for any k. Bidirectional encoders return the same
format (``c`` (B, 2H): forward then backward direction) but cannot be continued.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor, nn

from seqzoo.encoders.base import (
    Encoder,
    State,
    check_layer_dropout,
    check_rate,
    check_state_dtype,
    describe_state,
    lengths_from_mask,
    register_encoder,
    zero_padding,
)
from seqzoo.kernels import POOLINGS, qrnn_layer

__all__ = ["QRNN", "QRNNLayer"]


def last_inputs(padded: Tensor, lengths: Tensor, window: int) -> Tensor:
    """The last k - 1 real inputs of each row of a causal ``padded`` (B, k - 1 + T, n), whose first
    k - 1 frames are the carried tail (earlier chunks' inputs where the row is short) -> (B, k - 1, n)."""
    index = lengths.view(-1, 1) + torch.arange(window - 1, device=padded.device)  # (B, k-1) into padded
    return padded.gather(1, index.unsqueeze(-1).expand(-1, -1, padded.shape[-1]))


class QRNNLayer(nn.Module):
    """One direction of one QRNN layer: masked convolution + pooling, through :func:`~seqzoo.kernels.qrnn_layer`.

    ``reverse=True`` makes the backward direction: each row is read from its last real token to
    its first, and the window looks ahead, ``[x_t, ..., x_{t+k-1}]`` (zeros past the row's end).
    ``causal=False`` centres the window instead, ``[x_{t-⌊(k-1)/2⌋}, ..., x_{t+⌈(k-1)/2⌉}]`` with
    zeros outside the row (the QRNN translation encoder, MODELS.md 1.7); it cannot carry inputs
    across calls.
    """

    def __init__(
        self,
        input_size: int,
        hidden_size: int,
        window: int = 1,
        pooling: str = "fo",
        zoneout: float = 0.0,
        bias: bool = True,
        reverse: bool = False,
        causal: bool = True,
    ) -> None:
        super().__init__()
        if pooling not in POOLINGS:
            raise ValueError(f"pooling must be one of {sorted(POOLINGS)}, got {pooling!r}")
        if window < 1:
            raise ValueError(f"window must be >= 1, got {window}")
        check_rate("zoneout", zoneout)
        self.input_size, self.hidden_size, self.window = input_size, hidden_size, window
        self.pooling, self.zoneout, self.reverse, self.causal = pooling, zoneout, reverse, causal
        # W_z, W_f, W_o (, W_i) of all k taps as one matrix; output chunks in the order z, f, o, i.
        self.linear = nn.Linear(window * input_size, POOLINGS[pooling] * hidden_size, bias=bias)

    def forward(
        self, x: Tensor, lengths: Tensor, c0: Tensor | None = None, x_tail: Tensor | None = None
    ) -> tuple[Tensor, Tensor, Tensor]:
        """x (B, T, n), lengths (B,) -> h (B, T, H) zero at pads, c_last (B, H), new x_tail (B, k-1, n)."""
        batch, time, _ = x.shape
        if x_tail is None:
            x_tail = x.new_zeros(batch, self.window - 1, self.input_size)
        padded = self.padded_input(x, lengths, x_tail)
        keep, keep_prob = None, 1.0
        if self.zoneout > 0:  # eq. 6
            if self.training:
                keep = torch.rand(batch, time, self.hidden_size, device=x.device) >= self.zoneout
            else:
                keep_prob = 1.0 - self.zoneout
        h, c_last = qrnn_layer(
            padded,
            self.linear.weight,
            self.linear.bias,
            lengths,
            c0,
            pooling=self.pooling,
            keep=keep,
            keep_prob=keep_prob,
            reverse=self.reverse,
        )
        carries = self.window > 1 and self.causal and not self.reverse
        return h, c_last, last_inputs(padded, lengths, self.window) if carries else x_tail

    def padded_input(self, x: Tensor, lengths: Tensor, x_tail: Tensor) -> Tensor:
        """x (B, T, n) padded to (B, T + k - 1, n) so that the convolution's window t is ``[:, t : t + k]``."""
        batch, time, _ = x.shape
        k = self.window
        if k == 1:
            return x
        if self.causal and not self.reverse:  # masked convolution [x_{t-k+1}, ..., x_t]; first frames: previous chunk
            return torch.cat([x_tail, x], 1)
        # the window reaches `ahead` frames past t; frames past a row's end are zeros, as for the row alone
        ahead = k - 1 if self.causal else k // 2
        real = torch.arange(time, device=x.device) < lengths.unsqueeze(1)
        zeros = [x.new_zeros(batch, size, self.input_size) for size in (k - 1 - ahead, ahead)]
        return torch.cat([zeros[0], x.masked_fill(~real.unsqueeze(-1), 0.0), zeros[1]], 1)

    def extra_repr(self) -> str:
        return (
            f"{self.input_size}, {self.hidden_size}, window={self.window}, pooling={self.pooling!r}, "
            f"zoneout={self.zoneout}, reverse={self.reverse}, causal={self.causal}"
        )


@register_encoder("qrnn")
class QRNN(Encoder):
    """Stacked (optionally bidirectional, densely-connected) QRNN encoder.

    Args follow ``torch.nn.LSTM`` where they overlap. ``window`` is the filter width k (one int
    or one per layer); ``pooling`` is ``"f"``, ``"fo"`` or ``"ifo"``; ``zoneout`` is p of eq. 6;
    ``dropout`` applies between layers (not after the last); ``dense=True`` feeds layer l the
    concatenation ``[x; H^1; ...; H^{l-1}]`` and returns the last layer's output; ``causal=False``
    centres every window (:class:`QRNNLayer`), which makes the encoder non-causal and stateless.
    Input (B, T, input_size); output (B, T, hidden_size * directions).
    """

    repr_fields = ("num_layers", "dense", "causal")

    def __init__(
        self,
        input_size: int,
        hidden_size: int,
        num_layers: int = 1,
        dropout: float = 0.0,
        bidirectional: bool = False,
        window: int | Sequence[int] = 1,
        pooling: str = "fo",
        zoneout: float = 0.0,
        dense: bool = False,
        bias: bool = True,
        causal: bool = True,
    ) -> None:
        super().__init__(input_size, hidden_size, bidirectional=bidirectional)
        windows = [window] * num_layers if isinstance(window, int) else list(window)
        if num_layers < 1 or len(windows) != num_layers:
            raise ValueError(f"need num_layers >= 1 and one window per layer, got {num_layers} and {windows}")
        self.causal = self.causal and causal
        self.stateful = self.causal
        self.num_layers, self.dense = num_layers, dense
        self.dropout = nn.Dropout(check_layer_dropout(dropout, num_layers))
        directions = (False, True) if bidirectional else (False,)
        out = self.output_size
        sizes = [input_size + i * out if dense else (input_size if i == 0 else out) for i in range(num_layers)]
        self.layers = nn.ModuleList(  # layers[l][d]: layer l, direction d (forward, then backward)
            nn.ModuleList(
                QRNNLayer(n, hidden_size, k, pooling, zoneout, bias, reverse, causal) for reverse in directions
            )
            for n, k in zip(sizes, windows, strict=True)
        )

    def forward(self, x: Tensor, mask: Tensor | None = None, state: State = None) -> tuple[Tensor, State]:
        mask = self.check_input(x, mask)
        if state is not None and not self.stateful:
            raise ValueError("a bidirectional or non-causal QRNN is not stateful; pass state=None")
        if state is not None:
            self._check_state(state, x)
        lengths = lengths_from_mask(mask)
        states = state if state is not None else [(None, None)] * self.num_layers
        inputs, finals = zero_padding(x, mask), []  # inputs: (B, T, n_l), zero at pads
        for i, (directions, (c0, x_tail)) in enumerate(zip(self.layers, states, strict=True)):
            h, c, tail = directions[0](inputs, lengths, c0, x_tail)  # (B, T, H), (B, H), (B, k-1, n_l)
            if self.bidirectional:
                h_back, c_back, _ = directions[1](inputs, lengths)
                h, c = torch.cat([h, h_back], -1), torch.cat([c, c_back], -1)  # (B, T, 2H), (B, 2H)
            finals.append((c, tail))
            if i < self.num_layers - 1:
                h = self.dropout(h)
                inputs = torch.cat([inputs, h], -1) if self.dense else h
        return h, tuple(finals)

    def _check_state(self, state: State, x: Tensor) -> None:
        """``state`` must be what :meth:`forward` returns: per layer, c (B, H) and x_tail (B, k - 1, n_l)
        (either may be None), in the weights' dtype."""
        batch = x.shape[0]
        expected = [((batch, self.hidden_size), (batch, d[0].window - 1, d[0].input_size)) for d in self.layers]

        def fits(pair: object, shapes: tuple[tuple[int, ...], ...]) -> bool:
            return (
                isinstance(pair, (tuple, list))
                and len(pair) == 2
                and all(
                    t is None or (isinstance(t, Tensor) and tuple(t.shape) == e)
                    for t, e in zip(pair, shapes, strict=True)
                )
            )

        if not isinstance(state, (tuple, list)) or len(state) != len(expected) or not all(map(fits, state, expected)):
            raise ValueError(f"state must hold per layer (c, x_tail) of shapes {expected}, got {describe_state(state)}")
        check_state_dtype([t for pair in state for t in pair], self.layers[0][0].linear.weight, x.device.type)
