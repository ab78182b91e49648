"""HyperLSTM: a small layer-normalised LSTM that rescales, at every step, a main LSTM's weights.

Ha, Dai, Le, "HyperNetworks", ICLR 2017 (MODELS.md 3.3, checked against the author's reference
``hardmaru/supercell`` ``HyperLSTMCell``); the Meta-LSTM paper's comparison model.

Per step t, gates y ∈ {i, g(=j), f, o}:

* the hyper cell, an LN-LSTM of ``hyper_size`` N̂ units, reads ``x̂_t = [x_t; h_{t-1}]`` and gives
  its fresh ``ĥ_t``;
* signals of ``signal_size`` N_z: ``z_x^y = W_ĥx^y ĥ_t + b_ĥx^y``, ``z_h^y = W_ĥh^y ĥ_t + b_ĥh^y``,
  ``z_b^y = W_ĥb^y ĥ_t``; modulations ``d_x^y = W_xz^y z_x^y``, ``d_h^y = W_hz^y z_h^y``,
  ``b^y = W_bz^y z_b^y + b_0^y``;
* ``y_t = LN_y(d_h^y ⊙ (W_h^y h_{t-1}) + d_x^y ⊙ (W_x^y x_t) + b^y)``, each gate normalised
  apart with its own gain and offset (ε = 1e-3);
* ``c_t = σ(f + 1) ⊙ c_{t-1} + σ(i) ⊙ dropout(tanh(g))``, ``h_t = σ(o) ⊙ tanh(LN(c_t))``.

Initialisation as the reference: ``W_ĥx, W_ĥh`` = 0 with bias 1 (every z is 1), ``W_xz, W_hz`` =
0.1 / N_z (every scale d is 0.1 at init), ``W_ĥb`` ~ N(0, 0.01²), ``W_bz`` = 0; ``W_x`` uniform
(Glorot, TF's default), ``W_h`` orthogonal per gate block, main bias 0; the hyper cell likewise
(Glorot over its ``[x; h] → 4N̂`` matrix, orthogonal recurrent blocks, no bias before its LN).
State per layer and direction: ``(h, c, ĥ, ĉ)``. Importing this module registers ``hyper_lstm``.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from seqzoo.encoders.base import check_rate, register_encoder
from seqzoo.encoders.recurrent import RecurrentCellEncoder, TupleStepFn

__all__ = ["HyperLSTM", "HyperLSTMCell"]

LN_EPS = 1e-3  # the reference's layer norm: (x - mean) / sqrt(var + 1e-3)


def _glorot(weights: tuple[Tensor, ...], fan_in: int, fan_out: int) -> None:
    """Glorot-uniform over the matrix whose column blocks are ``weights``."""
    bound = math.sqrt(6.0 / (fan_in + fan_out))
    for weight in weights:
        nn.init.uniform_(weight, -bound, bound)


def _orthogonal_blocks(weight: Tensor) -> None:
    """Each of the 4 gate blocks of ``weight`` (4N, N) orthogonal."""
    for block in weight.unflatten(0, (4, -1)):
        nn.init.orthogonal_(block)


class HyperLSTMCell(nn.Module):
    """One layer and direction of the HyperLSTM (module docstring). State ``(h, c, ĥ, ĉ)``; output ``h``.

    Hyper cell: ``hyper_weight_x`` (4N̂, d_x) and ``hyper_weight_h`` (4N̂, N_h + N̂) (columns for
    ``[h; ĥ]``), LN ``hyper_gain``/``hyper_offset`` (4, N̂) per gate and ``hyper_cell_gain``/
    ``hyper_cell_offset`` (N̂,) on ĉ. Signals: ``signal_weight`` (8 N_z, N̂) and ``signal_bias``
    (8 N_z) give z_x then z_h (gate-major), ``bias_signal_weight`` (4 N_z, N̂) gives z_b.
    Modulations: ``scale_weight`` (8, N_z, N_h) holds W_xz^y then W_hz^y, ``bias_weight``
    (4, N_z, N_h) W_bz^y. Main LSTM: ``weight_x`` (4N_h, d_x), ``weight_h`` (4N_h, N_h), ``bias``
    (4N_h), LN ``gain``/``offset`` (4, N_h) and ``cell_gain``/``cell_offset`` (N_h,).
    """

    forget_bias = 1.0

    def __init__(
        self, input_size: int, hidden_size: int, hyper_size: int = 128, signal_size: int = 16, dropout: float = 0.0
    ) -> None:
        super().__init__()
        self.input_size, self.hidden_size = input_size, hidden_size
        self.hyper_size, self.signal_size = hyper_size, signal_size
        self.state_sizes = (hidden_size, hidden_size, hyper_size, hyper_size)
        self.hyper_weight_x = nn.Parameter(torch.empty(4 * hyper_size, input_size))
        self.hyper_weight_h = nn.Parameter(torch.empty(4 * hyper_size, hidden_size + hyper_size))
        self.hyper_gain = nn.Parameter(torch.empty(4, hyper_size))
        self.hyper_offset = nn.Parameter(torch.empty(4, hyper_size))
        self.hyper_cell_gain = nn.Parameter(torch.empty(hyper_size))
        self.hyper_cell_offset = nn.Parameter(torch.empty(hyper_size))
        self.signal_weight = nn.Parameter(torch.empty(8 * signal_size, hyper_size))
        self.signal_bias = nn.Parameter(torch.empty(8 * signal_size))
        self.bias_signal_weight = nn.Parameter(torch.empty(4 * signal_size, hyper_size))
        self.scale_weight = nn.Parameter(torch.empty(8, signal_size, hidden_size))
        self.bias_weight = nn.Parameter(torch.empty(4, signal_size, hidden_size))
        self.weight_x = nn.Parameter(torch.empty(4 * hidden_size, input_size))
        self.weight_h = nn.Parameter(torch.empty(4 * hidden_size, hidden_size))
        self.bias = nn.Parameter(torch.empty(4 * hidden_size))
        self.gain = nn.Parameter(torch.empty(4, hidden_size))
        self.offset = nn.Parameter(torch.empty(4, hidden_size))
        self.cell_gain = nn.Parameter(torch.empty(hidden_size))
        self.cell_offset = nn.Parameter(torch.empty(hidden_size))
        self.dropout = nn.Dropout(check_rate("dropout", dropout))
        self.reset_parameters()

    def reset_parameters(self) -> None:
        hidden, hyper = self.hidden_size, self.hyper_size
        with torch.no_grad():
            _glorot((self.hyper_weight_x, self.hyper_weight_h[:, :hidden]), self.input_size + hidden, 4 * hyper)
            _orthogonal_blocks(self.hyper_weight_h[:, hidden:])
            _glorot((self.weight_x,), self.input_size, 4 * hidden)
            _orthogonal_blocks(self.weight_h)
        for gain in (self.hyper_gain, self.hyper_cell_gain, self.gain, self.cell_gain):
            nn.init.ones_(gain)
        for zero in (self.hyper_offset, self.hyper_cell_offset, self.offset, self.cell_offset, self.bias):
            nn.init.zeros_(zero)
        nn.init.zeros_(self.signal_weight)  # z_x = z_h = 1 at init
        nn.init.ones_(self.signal_bias)
        nn.init.normal_(self.bias_signal_weight, std=0.01)
        nn.init.constant_(self.scale_weight, 0.1 / self.signal_size)  # every d = 0.1 at init
        nn.init.zeros_(self.bias_weight)

    def extra_repr(self) -> str:
        return f"{self.input_size}, {self.hidden_size}, hyper_size={self.hyper_size}, signal_size={self.signal_size}"

    def output(self, state: tuple[Tensor, ...]) -> Tensor:
        """The main LSTM's ``h`` (B, H)."""
        return state[0]

    def prepare(self, x: Tensor) -> tuple[Tensor, TupleStepFn]:
        """Hoist the x blocks of the hyper cell's and the main cell's projections for all steps:
        x (T, B, d_x) -> (T, B, 4N̂ + 4N_h), one matmul."""
        hyper, hidden, signal = self.hyper_size, self.hidden_size, self.signal_size
        split = [4 * hyper, 4 * hidden]
        # z_x, z_h then z_b: (12 N_z, N̂) with bias (12 N_z), z_b's bias fixed at 0
        signal_weight = torch.cat([self.signal_weight, self.bias_signal_weight])
        signal_bias = torch.cat([self.signal_bias, self.signal_bias.new_zeros(4 * signal)])
        modulation = torch.cat([self.scale_weight, self.bias_weight])  # (12, N_z, N_h)
        main_bias = self.bias.view(4, 1, hidden)
        gain, offset = self.gain.unsqueeze(1), self.offset.unsqueeze(1)  # (4, 1, N_h)

        def step(x_part: Tensor, state: tuple[Tensor, ...]) -> tuple[tuple[Tensor, ...], None]:
            h, c, hyper_h, hyper_c = state
            hyper_x, main_x = x_part.split(split, dim=-1)
            # hyper LN-LSTM on [x_t; h_{t-1}]
            pre = torch.addmm(hyper_x, torch.cat([h, hyper_h], dim=-1), self.hyper_weight_h.t()).unflatten(-1, (4, -1))
            pre = F.layer_norm(pre, (hyper,), eps=LN_EPS) * self.hyper_gain + self.hyper_offset  # (B, 4, N̂)
            hi, hg, hf, ho = pre.unbind(1)
            hyper_c = torch.sigmoid(hf + self.forget_bias) * hyper_c + torch.sigmoid(hi) * torch.tanh(hg)
            cell = F.layer_norm(hyper_c, (hyper,), eps=LN_EPS) * self.hyper_cell_gain + self.hyper_cell_offset
            hyper_h = torch.sigmoid(ho) * torch.tanh(cell)  # ĥ_t (B, N̂)
            # signals z (12, B, N_z) and modulations d_x, d_h, b (each (4, B, N_h)) from the fresh ĥ_t
            z = torch.addmm(signal_bias, hyper_h, signal_weight.t()).unflatten(-1, (12, -1)).transpose(0, 1)
            d_x, d_h, b = torch.bmm(z, modulation).unflatten(0, (3, 4)).unbind(0)
            main_h = (h @ self.weight_h.t()).unflatten(-1, (4, -1)).transpose(0, 1)  # W_h^y h_{t-1}: (4, B, N_h)
            main_xt = main_x.unflatten(-1, (4, -1)).transpose(0, 1)  # W_x^y x_t: (4, B, N_h)
            pre = d_h * main_h + d_x * main_xt + b + main_bias
            i, g, f, o = (F.layer_norm(pre, (hidden,), eps=LN_EPS) * gain + offset).unbind(0)
            c = torch.sigmoid(f + self.forget_bias) * c + torch.sigmoid(i) * self.dropout(torch.tanh(g))
            h = torch.sigmoid(o) * torch.tanh(
                F.layer_norm(c, (hidden,), eps=LN_EPS) * self.cell_gain + self.cell_offset
            )
            return (h, c, hyper_h, hyper_c), None

        weight = torch.cat([self.hyper_weight_x, self.weight_x])  # (4N̂ + 4N_h, d_x)
        return F.linear(x, weight), step


@register_encoder("hyper_lstm")
class HyperLSTM(RecurrentCellEncoder):
    """HyperLSTM encoder (MODELS.md 3.3): stacked, optionally bidirectional, stateful.

    ``hidden_size`` N_h, ``hyper_size`` N̂ (128, the paper's default), ``signal_size`` N_z (16,
    the reference code's default). ``dropout``: recurrent dropout on the main cell's candidate
    ``tanh(g)`` (the reference's option). ``compile_step``: the time loop's step through
    ``torch.compile`` (:mod:`seqzoo.encoders.recurrent`).

    State: ``(h, c, ĥ, ĉ)``, each (num_layers * directions, B, ·) (h, c of size hidden_size,
    ĥ, ĉ of size hyper_size).
    """

    repr_fields = ("num_layers", "hyper_size", "signal_size")

    def __init__(
        self,
        input_size: int,
        hidden_size: int,
        num_layers: int = 1,
        dropout: float = 0.0,
        bidirectional: bool = False,
        hyper_size: int = 128,
        signal_size: int = 16,
        compile_step: bool = False,
    ) -> None:
        def make_cell(size: int) -> HyperLSTMCell:
            return HyperLSTMCell(size, hidden_size, hyper_size, signal_size, dropout)

        super().__init__(input_size, hidden_size, make_cell, num_layers, bidirectional, compile_step)
        self.hyper_size, self.signal_size = hyper_size, signal_size
