"""Densely-connected stacks of any single-layer encoder.

"Dense convolution" (Huang et al., 2017) as the QRNN paper applies it to recurrent stacks
(Bradbury et al., ICLR 2017, section 2.1; MODELS.md 1.5): layer l reads the concatenation of the
stack's input and every earlier layer's output, ``X^l = [x; H^1; ...; H^{l-1}]``, so its input
width is ``n + (l - 1) * m`` (m = a layer's output width); only the last layer's output is the
encoding. Ordinary dropout is applied to each layer's output before it is passed on (not after
the last layer). ``dense_lstm`` / ``dense_gru`` are the same-size baselines for the dense QRNN.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor, nn

from seqzoo.encoders.base import Encoder, State, build_encoder, check_layer_dropout, register_encoder

__all__ = ["DenseGRU", "DenseLSTM", "DenseStack"]


class DenseStack(Encoder):
    """Dense stack of ``num_layers`` single-layer encoders built by name from the registry.

    ``layer_kwargs`` go to every layer (e.g. ``bidirectional=True``). The state is a tuple with
    one entry per layer in that layer's own format; the stack is causal / stateful when all
    its layers are. Input (B, T, input_size); output (B, T, last layer's output size).
    """

    def __init__(
        self,
        layer: str,
        input_size: int,
        hidden_size: int,
        num_layers: int = 2,
        dropout: float = 0.0,
        **layer_kwargs: Any,
    ) -> None:
        super().__init__(input_size, hidden_size, bidirectional=bool(layer_kwargs.get("bidirectional", False)))
        if num_layers < 1:
            raise ValueError(f"num_layers must be >= 1, got {num_layers}")
        layers: list[Encoder] = []
        width = input_size
        for _ in range(num_layers):
            layers.append(build_encoder(layer, width, hidden_size=hidden_size, **layer_kwargs))
            width += layers[-1].output_size
        self.layers = nn.ModuleList(layers)
        self.dropout = nn.Dropout(check_layer_dropout(dropout, num_layers))
        self.causal = all(layer.causal for layer in layers)
        self.stateful = all(layer.stateful for layer in layers)

    @property
    def output_size(self) -> int:
        return self.layers[-1].output_size

    def forward(self, x: Tensor, mask: Tensor | None = None, state: State = None) -> tuple[Tensor, State]:
        mask = self.check_input(x, mask)
        states = state if state is not None else (None,) * len(self.layers)
        if not isinstance(states, (tuple, list)) or len(states) != len(self.layers):
            got = f"{len(states)} entries" if isinstance(states, (tuple, list)) else type(states).__name__
            raise ValueError(f"state must be a tuple with one entry per layer ({len(self.layers)}), got {got}")
        inputs, finals = x, []  # inputs: (B, T, n + sum of earlier output sizes)
        for i, (layer, layer_state) in enumerate(zip(self.layers, states, strict=True)):
            h, final = layer(inputs, mask, layer_state)  # (B, T, m)
            finals.append(final)
            if i < len(self.layers) - 1:
                inputs = torch.cat([inputs, self.dropout(h)], -1)
        return h, tuple(finals)

    def auxiliary_loss(self) -> Tensor | None:
        """The sum of the layers' regularisers from the last forward pass (None if no layer has one)."""
        losses = [loss for layer in self.layers if (loss := layer.auxiliary_loss()) is not None]
        return torch.stack(losses).sum() if losses else None


@register_encoder("dense_lstm")
class DenseLSTM(DenseStack):
    """Densely-connected LSTM stack (the IMDb baseline of the QRNN paper)."""

    def __init__(
        self, input_size: int, hidden_size: int, num_layers: int = 2, dropout: float = 0.0, bidirectional: bool = False
    ) -> None:
        super().__init__("lstm", input_size, hidden_size, num_layers, dropout, bidirectional=bidirectional)


@register_encoder("dense_gru")
class DenseGRU(DenseStack):
    """Densely-connected GRU stack."""

    def __init__(
        self, input_size: int, hidden_size: int, num_layers: int = 2, dropout: float = 0.0, bidirectional: bool = False
    ) -> None:
        super().__init__("gru", input_size, hidden_size, num_layers, dropout, bidirectional=bidirectional)
