"""The MZU paper's baselines: a GRU with layer norm and candidate dropout, and the deep-transition GRU.

GRU: Cho et al. (2014), written with the gate convention of DTMT (``u`` weights the *new*
candidate). Deep-transition GRU: Meng & Zhang, "DTMT: A Novel Deep Transition Architecture
for Neural Machine Translation", AAAI 2019 (MODELS.md 4.7, read from the official
``DTMTCell``): per step one L-GRU, which consumes ``x_t``, then ``K`` T-GRUs, which see only
the state. Layer norm (gain 1, offset 0 at init, ε = 1e-6) is on the gate pre-activations
only; dropout is on every candidate. The MZU paper trains both "with the same settings" as its
MZUs (LN, candidate dropout).

``"dtgru"`` defaults to ``transition_depth=1`` T-GRU (DTMT hard-codes 4): it is the baseline of
MZU+DT, whose depth the MZU paper sets to one t-MZU per step by default (MODELS.md 4.3; the
``mzu`` encoder itself defaults to the plain MZU, Decision 7), so the two share the transition depth.
``"gru_ln"`` is the plain GRU cell (no linear transformation gate, no transitions).
Importing this module registers both encoders.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from seqzoo.encoders.base import check_rate, register_encoder
from seqzoo.encoders.recurrent import RecurrentCellEncoder, StepFn

__all__ = ["DeepTransitionGRU", "DeepTransitionGRUCell", "GRUCell", "LayerNormGRU"]


class GRUCell(nn.Module):
    """GRU / DTMT L-GRU / T-GRU cell on (B, H) states.

    ``r = σ(LN(W_xr x + W_hr h))``, ``u = σ(LN(W_xu x + W_hu h))``,
    ``h̃ = tanh(W_xh x + r ⊙ (W_hh h + b_h))`` (``+ l ⊙ (H x)`` with ``l = σ(LN(W_xl x + W_hl h))``
    when ``linear_gate``: the L-GRU), ``h̃ ← dropout(h̃)``, ``h_t = (1 − u) ⊙ h + u ⊙ h̃``.
    ``input_size = 0`` gives a T-GRU (no x terms). Without LN the gates get a plain bias.
    """

    def __init__(
        self,
        input_size: int,
        hidden_size: int,
        layer_norm: bool = True,
        dropout: float = 0.0,
        linear_gate: bool = False,
    ) -> None:
        super().__init__()
        if linear_gate and input_size == 0:
            raise ValueError("the linear transformation gate needs an input (input_size > 0)")
        self.hidden_size = hidden_size
        self.num_gates = 3 if linear_gate else 2  # r, u[, l]
        self.linear_gate = linear_gate
        x_width = (self.num_gates + 1 + int(linear_gate)) * hidden_size  # gates | W_xh | H
        self.x_proj = nn.Linear(input_size, x_width, bias=False) if input_size else None
        self.h_proj = nn.Linear(hidden_size, (self.num_gates + 1) * hidden_size, bias=False)  # gates | W_hh
        self.candidate_bias = nn.Parameter(torch.zeros(hidden_size))  # b_h
        self.gate_bias = nn.Parameter(torch.zeros(self.num_gates, hidden_size))  # LN offset, or the gate bias
        self.gate_gain = nn.Parameter(torch.ones(self.num_gates, hidden_size)) if layer_norm else None
        self.dropout = nn.Dropout(check_rate("dropout", dropout))

    def extra_repr(self) -> str:
        return f"{self.hidden_size}, layer_norm={self.gate_gain is not None}, linear_gate={self.linear_gate}"

    def forward(self, x_part: Tensor | None, h: Tensor) -> Tensor:
        """``x_part = x_proj(x)`` (B, x_width) or None for a T-GRU; ``h`` (B, H) -> ``h_t`` (B, H)."""
        candidate, u = self.candidate_and_gate(x_part, h)
        return torch.lerp(h, self.dropout(candidate), u)

    def candidate_and_gate(self, x_part: Tensor | None, h: Tensor) -> tuple[Tensor, Tensor]:
        """The candidate ``h̃`` before dropout and the update gate ``u``, each (B, H)."""
        size, gates = self.hidden_size, self.num_gates
        h_gates, h_cand = self.h_proj(h).split([gates * size, size], dim=-1)
        pre = h_gates.unflatten(-1, (gates, size))
        if x_part is not None:
            pre = pre + x_part[:, : gates * size].unflatten(-1, (gates, size))
        if self.gate_gain is not None:
            pre = F.layer_norm(pre, (size,), eps=1e-6) * self.gate_gain
        r, u, *linear = torch.sigmoid(pre + self.gate_bias).unbind(-2)
        candidate = r * (h_cand + self.candidate_bias)
        if x_part is not None:
            candidate = candidate + x_part[:, gates * size : (gates + 1) * size]
        candidate = torch.tanh(candidate)
        if self.linear_gate:
            candidate = candidate + linear[0] * x_part[:, (gates + 1) * size :]
        return candidate, u


class DeepTransitionGRUCell(nn.Module):
    """One step: a GRU (L-GRU when ``linear_gate``) then ``transition_depth`` T-GRUs."""

    def __init__(
        self,
        input_size: int,
        hidden_size: int,
        transition_depth: int = 1,
        linear_gate: bool = True,
        layer_norm: bool = True,
        dropout: float = 0.0,
    ) -> None:
        super().__init__()
        if transition_depth < 0:
            raise ValueError(f"transition_depth must be >= 0, got {transition_depth}")
        self.hidden_size = hidden_size
        self.cells = nn.ModuleList(
            [GRUCell(input_size, hidden_size, layer_norm, dropout, linear_gate)]
            + [GRUCell(0, hidden_size, layer_norm, dropout) for _ in range(transition_depth)]
        )

    def prepare(self, x: Tensor) -> tuple[Tensor, StepFn]:
        """The first cell's input projections for all steps at once: x (T, B, D)."""

        def step(x_part: Tensor, h: Tensor) -> tuple[Tensor, None]:
            h = self.cells[0](x_part, h)
            for cell in self.cells[1:]:
                h = cell(None, h)
            return h, None

        return self.cells[0].x_proj(x), step

    def trace(self, x: Tensor, h: Tensor) -> tuple[Tensor, Tensor]:
        """Run ``x`` (T, B, D) from ``h`` (B, H) and keep the internals, for analysis (MZU paper Figure 3).

        Returns the candidate ``h̃`` of every cell (T, K + 1, B, H) (depth 0: the GRU that reads
        ``x_t``; then the T-GRUs; in training, after dropout) and the state after each step
        (T, B, H), as :meth:`MZUCell.trace <seqzoo.encoders.mzu.MZUCell.trace>` does.
        """
        candidates, states = [], []
        for x_part in self.cells[0].x_proj(x):
            per_depth = []
            for depth, cell in enumerate(self.cells):
                candidate, u = cell.candidate_and_gate(x_part if depth == 0 else None, h)
                candidate = cell.dropout(candidate)
                h = torch.lerp(h, candidate, u)
                per_depth.append(candidate)
            candidates.append(torch.stack(per_depth))
            states.append(h)
        return torch.stack(candidates), torch.stack(states)


@register_encoder("dtgru")
class DeepTransitionGRU(RecurrentCellEncoder):
    """Deep-transition GRU (DTMT): L-GRU + ``transition_depth`` T-GRUs per step (MODELS.md 4.7).

    State ``h`` (num_layers * directions, B, H). ``dropout`` is the candidate dropout;
    ``linear_gate=False`` drops the L-GRU's linear transformation gate (a plain GRU first).
    ``compile_step``: the time loop's step through ``torch.compile`` (:mod:`seqzoo.encoders.recurrent`).
    """

    def __init__(
        self,
        input_size: int,
        hidden_size: int,
        num_layers: int = 1,
        dropout: float = 0.0,
        bidirectional: bool = False,
        transition_depth: int = 1,
        linear_gate: bool = True,
        layer_norm: bool = True,
        compile_step: bool = False,
    ) -> None:
        def make_cell(size: int) -> DeepTransitionGRUCell:
            return DeepTransitionGRUCell(size, hidden_size, transition_depth, linear_gate, layer_norm, dropout)

        super().__init__(input_size, hidden_size, make_cell, num_layers, bidirectional, compile_step)


@register_encoder("gru_ln")
class LayerNormGRU(DeepTransitionGRU):
    """GRU with optional LN on the gate pre-activations and candidate dropout (the MZU paper's GRU).

    A :class:`DeepTransitionGRU` without transitions and without the linear transformation gate.
    State ``h`` (num_layers * directions, B, H). ``dropout`` is the candidate dropout.
    """

    def __init__(
        self,
        input_size: int,
        hidden_size: int,
        num_layers: int = 1,
        dropout: float = 0.0,
        bidirectional: bool = False,
        layer_norm: bool = True,
        compile_step: bool = False,
    ) -> None:
        super().__init__(
            input_size,
            hidden_size,
            num_layers,
            dropout,
            bidirectional,
            transition_depth=0,
            linear_gate=False,
            layer_norm=layer_norm,
            compile_step=compile_step,
        )
