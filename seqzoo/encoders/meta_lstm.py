"""Meta-LSTM: a small LSTM that generates, at every step, the weights of a basic LSTM.

Chen, Qiu, Liu, Huang, "Meta Multi-Task Learning for Sequence Modeling", AAAI 2018
(MODELS.md 3.1-3.2, checked against the official ``LittleChenCc/Meta_LSTM`` ``MetaLSTMCell``).

Per step t, with ``u_t = [x_t; h_{t-1}]`` (the basic LSTM's previous output):

* the Meta-LSTM, a TF ``BasicLSTMCell`` (gate order i, j, f, o; forget bias 1), reads
  ``[x_t; h_{t-1}]`` with its own recurrence ``ĥ_{t-1}`` and gives ``ĥ_t`` (eq. 19);
* the meta vector is ``z_t = W_z ĥ_t`` (the paper, ``meta_vector="projected"``, the default)
  or ``z_t = ĥ_t`` (the official code, ``meta_vector="hidden"``) (Decision 5);
* the basic LSTM's weights are ``W_γ(z_t) = P_γᵀ diag(z_t) Q_γ`` and its bias ``B z_t``
  (the low-rank factorisation), so its gate pre-activations are computed as
  ``P_γᵀ (z_t ⊙ (Q_γ u_t)) + (B z_t)_γ`` without ever forming a (B, 4h, d_x + h) weight;
  the official code's materialising form is :func:`materialized_reference`;
* ``c_t = σ(f) ⊙ c_{t-1} + σ(i) ⊙ tanh(j)``, ``h_t = σ(o) ⊙ tanh(c_t)`` (no forget bias).

State per layer and direction: ``(h, c, ĥ, ĉ)``. Initialisation as the official cell: the meta
LSTM's weight Glorot-uniform over its whole ``(d_x + h + m) → 4m`` matrix, bias 0; ``P`` and ``Q``
uniform unit scaling U(±√(3/d_z)); ``B`` (and ``W_z``) Glorot-uniform, no bias.

Multi-task use (MODELS.md 3.2): each cell's ``meta`` submodule (the Meta-LSTM and ``W_z``) is
what tasks share, its ``basic`` submodule (``P``, ``Q``, ``B``) is task-specific. Build a task's
encoder with ``shared_meta=other.meta_cells`` to reuse another encoder's meta cells; parameters
named ``cells.K.meta.*`` are then the shared ones, ``cells.K.basic.*`` the private ones.
Importing this module registers the ``meta_lstm`` encoder.
"""

from __future__ import annotations

import math
from typing import Literal

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from seqzoo.encoders.base import check_rate, register_encoder
from seqzoo.encoders.recurrent import RecurrentCellEncoder, TupleStepFn

__all__ = ["BasicWeights", "MetaCell", "MetaLSTM", "MetaLSTMCell", "materialized_reference"]

MetaVector = Literal["projected", "hidden"]


class MetaCell(nn.Module):
    """The Meta-LSTM of one layer and direction and its meta vector (MODELS.md 3.1).

    ``basic_size`` is the h of the basic LSTM whose output it reads. ``weight_x`` (4m, d_x) and
    ``weight_h`` (4m, h + m) are the two column blocks of the TF
    cell's one matrix over ``[x_t; h_{t-1}; ĥ_{t-1}]`` (kept apart so the x block can be
    hoisted out of the time loop); ``z_weight`` (d_z, m) is ``W_z``, None when ``z = ĥ``.
    """

    forget_bias = 1.0  # TF BasicLSTMCell's default, added to the f gate's pre-activation

    def __init__(
        self,
        input_size: int,
        basic_size: int,
        meta_size: int = 40,
        z_size: int | None = None,
        meta_vector: MetaVector = "projected",
    ) -> None:
        super().__init__()
        if meta_vector not in ("projected", "hidden"):
            raise ValueError(f"meta_vector must be 'projected' (z = W_z ĥ) or 'hidden' (z = ĥ), got {meta_vector!r}")
        if meta_vector == "hidden" and z_size not in (None, meta_size):
            raise ValueError(f"with meta_vector='hidden' z = ĥ, so z_size is meta_size ({meta_size}), got {z_size}")
        self.input_size, self.basic_size, self.meta_size = input_size, basic_size, meta_size
        self.z_size = meta_size if z_size is None else z_size
        self.weight_x = nn.Parameter(torch.empty(4 * meta_size, input_size))
        self.weight_h = nn.Parameter(torch.empty(4 * meta_size, basic_size + meta_size))  # [h; ĥ] columns
        self.bias = nn.Parameter(torch.empty(4 * meta_size))
        self.z_weight = nn.Parameter(torch.empty(self.z_size, meta_size)) if meta_vector == "projected" else None
        offset = torch.zeros(4, meta_size)
        offset[2] = self.forget_bias  # gate order i, j, f, o
        self.register_buffer("forget_offset", offset.flatten(), persistent=False)
        self.reset_parameters()

    def reset_parameters(self) -> None:
        fan_in, fan_out = self.input_size + self.basic_size + self.meta_size, 4 * self.meta_size
        bound = math.sqrt(6.0 / (fan_in + fan_out))  # Glorot over the whole [x; h; ĥ] -> 4m matrix
        nn.init.uniform_(self.weight_x, -bound, bound)
        nn.init.uniform_(self.weight_h, -bound, bound)
        nn.init.zeros_(self.bias)
        if self.z_weight is not None:
            nn.init.xavier_uniform_(self.z_weight)

    def extra_repr(self) -> str:
        vector = "projected" if self.z_weight is not None else "hidden"
        sizes = f"basic_size={self.basic_size}, meta_size={self.meta_size}, z_size={self.z_size}"
        return f"{self.input_size}, {sizes}, {vector}"

    def step(self, x_part: Tensor, h: Tensor, meta_h: Tensor, meta_c: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """One step from ``x_part`` = W_x x_t + b + the forget offset (B, 4m), ``h_{t-1}`` (B, h) and
        ``ĥ_{t-1}``, ``ĉ_{t-1}`` (B, m): returns ``ĥ_t``, ``ĉ_t`` (B, m) and ``z_t`` (B, d_z)."""
        pre = torch.addmm(x_part, torch.cat([h, meta_h], dim=-1), self.weight_h.t())  # (B, 4m)
        i, j, f, o = pre.chunk(4, dim=-1)
        meta_c = torch.sigmoid(f) * meta_c + torch.sigmoid(i) * torch.tanh(j)
        meta_h = torch.sigmoid(o) * torch.tanh(meta_c)  # (B, m)
        z = meta_h if self.z_weight is None else meta_h @ self.z_weight.t()  # (B, d_z)
        return meta_h, meta_c, z


class BasicWeights(nn.Module):
    """A basic LSTM's weight generator (task-specific in multi-task use): ``P``, ``Q``, ``B``.

    ``P`` (4, d_z, h) holds ``P_γ`` per gate (order i, j, f, o); ``q_x`` (4 d_z, d_x) and
    ``q_h`` (4 d_z, h) are the x and h column blocks of the stacked ``Q_γ`` (d_z, d_x + h);
    ``B`` (4h, d_z) gives the bias ``B z_t``.
    """

    def __init__(self, input_size: int, hidden_size: int, z_size: int) -> None:
        super().__init__()
        self.input_size, self.hidden_size, self.z_size = input_size, hidden_size, z_size
        self.P = nn.Parameter(torch.empty(4, z_size, hidden_size))
        self.q_x = nn.Parameter(torch.empty(4 * z_size, input_size))
        self.q_h = nn.Parameter(torch.empty(4 * z_size, hidden_size))
        self.B = nn.Parameter(torch.empty(4 * hidden_size, z_size))
        self.reset_parameters()

    def reset_parameters(self) -> None:
        bound = math.sqrt(3.0 / self.z_size)  # TF uniform_unit_scaling on a (d_z, ·) matrix
        for weight in (self.P, self.q_x, self.q_h):
            nn.init.uniform_(weight, -bound, bound)
        nn.init.xavier_uniform_(self.B)

    def extra_repr(self) -> str:
        return f"{self.input_size}, {self.hidden_size}, z_size={self.z_size}"

    def full_q(self) -> Tensor:
        """``Q_γ`` for each gate as (4, d_z, d_x + h)."""
        size = self.z_size
        return torch.cat([self.q_x.view(4, size, -1), self.q_h.view(4, size, -1)], dim=-1)


class MetaLSTMCell(nn.Module):
    """One layer and direction: a :class:`MetaCell` (``meta``) driving a basic LSTM (``basic``).

    State ``(h, c, ĥ, ĉ)``; output ``h``. ``dropout``: on the basic LSTM's candidate ``tanh(j)``
    (as the MZU and GRU encoders' candidate dropout; the paper uses none). ``meta``: an existing
    :class:`MetaCell` to share, else a new one.
    """

    def __init__(
        self,
        input_size: int,
        hidden_size: int,
        meta_size: int = 40,
        z_size: int | None = None,
        meta_vector: MetaVector = "projected",
        dropout: float = 0.0,
        meta: MetaCell | None = None,
    ) -> None:
        super().__init__()
        if meta is None:
            meta = MetaCell(input_size, hidden_size, meta_size, z_size, meta_vector)
        elif (meta.input_size, meta.basic_size) != (input_size, hidden_size):
            raise ValueError(
                f"a shared MetaCell reads inputs of {meta.input_size} and a basic LSTM of {meta.basic_size} "
                f"units; this layer has {input_size} and {hidden_size}"
            )
        self.hidden_size = hidden_size
        self.meta = meta
        self.basic = BasicWeights(input_size, hidden_size, meta.z_size)
        self.dropout = nn.Dropout(check_rate("dropout", dropout))
        self.state_sizes = (hidden_size, hidden_size, meta.meta_size, meta.meta_size)

    def output(self, state: tuple[Tensor, ...]) -> Tensor:
        """The basic LSTM's ``h`` (B, H)."""
        return state[0]

    def prepare(self, x: Tensor) -> tuple[Tensor, TupleStepFn]:
        """Hoist the x blocks of the meta cell's input and of ``Q_γ u_t`` for all steps: x (T, B, d_x)
        -> (T, B, 4m + 4 d_z), one matmul."""
        meta, basic = self.meta, self.basic
        split = [4 * meta.meta_size, 4 * meta.z_size]
        weight = torch.cat([meta.weight_x, basic.q_x])  # (4m + 4 d_z, d_x)
        bias = torch.cat([meta.bias + meta.forget_offset, meta.bias.new_zeros(split[1])])
        size = self.hidden_size

        def step(x_part: Tensor, state: tuple[Tensor, ...]) -> tuple[tuple[Tensor, ...], None]:
            h, c, meta_h, meta_c = state
            meta_x, q_x = x_part.split(split, dim=-1)
            meta_h, meta_c, z = meta.step(meta_x, h, meta_h, meta_c)  # eq. 19
            q = torch.addmm(q_x, h, basic.q_h.t()).unflatten(-1, (4, -1))  # Q_γ u_t: (B, 4, d_z)
            bias_z = (z @ basic.B.t()).unflatten(-1, (4, size)).transpose(0, 1)  # B z_t: (4, B, H)
            scaled = (q * z.unsqueeze(1)).transpose(0, 1)  # z_t ⊙ Q_γ u_t: (4, B, d_z)
            i, j, f, o = torch.baddbmm(bias_z, scaled, basic.P).unbind(0)  # P_γᵀ(·) + (B z_t)_γ: (B, H) each
            c = torch.sigmoid(f) * c + torch.sigmoid(i) * self.dropout(torch.tanh(j))
            h = torch.sigmoid(o) * torch.tanh(c)
            return (h, c, meta_h, meta_c), None

        return F.linear(x, weight, bias), step


def materialized_reference(
    cell: MetaLSTMCell, x: Tensor, state: tuple[Tensor, ...] | None = None
) -> tuple[Tensor, tuple[Tensor, ...]]:
    """The official code's form of one cell, for tests and benchmarks: at every step the full
    weight ``W(z_t)`` (B, 4h, d_x + h) is built from ``P_γᵀ diag(z_t) Q_γ`` and multiplied by ``u_t``.

    ``x`` (B, T, d_x), no padding; ``state`` ``(h, c, ĥ, ĉ)`` each (B, ·), None for zeros. Without
    dropout. Returns the outputs (B, T, H) and the final state.
    """
    meta, basic = cell.meta, cell.basic
    batch = x.shape[0]
    if state is None:
        state = tuple(x.new_zeros(batch, size) for size in cell.state_sizes)
    h, c, meta_h, meta_c = state
    meta_weight = torch.cat([meta.weight_x, meta.weight_h], dim=-1)  # W_m over [x; h; ĥ]
    q_full = basic.full_q()  # (4, d_z, d_x + H)
    outputs = []
    for x_t in x.unbind(1):
        pre = torch.cat([x_t, h, meta_h], dim=-1) @ meta_weight.t() + meta.bias
        mi, mj, mf, mo = pre.chunk(4, dim=-1)
        meta_c = torch.sigmoid(mf + meta.forget_bias) * meta_c + torch.sigmoid(mi) * torch.tanh(mj)
        meta_h = torch.sigmoid(mo) * torch.tanh(meta_c)
        z = meta_h if meta.z_weight is None else meta_h @ meta.z_weight.t()  # (B, d_z)
        diag_p = z[:, None, :, None] * basic.P  # diag(z_t) P_γ: (B, 4, d_z, H)
        weight = (diag_p.transpose(-1, -2) @ q_full).reshape(batch, 4 * cell.hidden_size, -1)  # (B, 4H, d_x + H)
        u = torch.cat([x_t, h], dim=-1)  # (B, d_x + H)
        gates = (weight @ u.unsqueeze(-1)).squeeze(-1) + z @ basic.B.t()  # (B, 4H)
        i, j, f, o = gates.chunk(4, dim=-1)
        c = torch.sigmoid(f) * c + torch.sigmoid(i) * torch.tanh(j)
        h = torch.sigmoid(o) * torch.tanh(c)
        outputs.append(h)
    return torch.stack(outputs, dim=1), (h, c, meta_h, meta_c)


@register_encoder("meta_lstm")
class MetaLSTM(RecurrentCellEncoder):
    """Meta-LSTM encoder (MODELS.md 3.1): stacked, optionally bidirectional, stateful.

    ``hidden_size`` is the basic LSTM's h, ``meta_size`` the Meta-LSTM's m, ``z_size`` the meta
    vector's d_z (default m; fixed to m when ``meta_vector="hidden"``). ``dropout``: candidate
    dropout in the basic LSTM. ``shared_meta``: the meta cells of another Meta-LSTM encoder
    (its :attr:`meta_cells`), one per layer and direction, to share them (multi-task use).
    ``compile_step``: the time loop's step through ``torch.compile`` (:mod:`seqzoo.encoders.recurrent`).

    State: ``(h, c, ĥ, ĉ)``, each (num_layers * directions, B, ·) (h and c of size hidden_size,
    ĥ and ĉ of size meta_size).
    """

    repr_fields = ("num_layers", "meta_size")

    def __init__(
        self,
        input_size: int,
        hidden_size: int,
        num_layers: int = 1,
        dropout: float = 0.0,
        bidirectional: bool = False,
        meta_size: int = 40,
        z_size: int | None = None,
        meta_vector: MetaVector = "projected",
        shared_meta: nn.ModuleList | None = None,
        compile_step: bool = False,
    ) -> None:
        count = num_layers * (2 if bidirectional else 1)
        if shared_meta is not None and len(shared_meta) != count:
            raise ValueError(
                f"shared_meta needs one MetaCell per layer and direction ({count}), got {len(shared_meta)}"
            )
        built: list[MetaLSTMCell] = []

        def make_cell(size: int) -> MetaLSTMCell:
            meta = None if shared_meta is None else shared_meta[len(built)]
            built.append(MetaLSTMCell(size, hidden_size, meta_size, z_size, meta_vector, dropout, meta))
            return built[-1]

        super().__init__(input_size, hidden_size, make_cell, num_layers, bidirectional, compile_step)
        self.meta_size = self.cells[0].meta.meta_size

    @property
    def meta_cells(self) -> nn.ModuleList:
        """The cells' :class:`MetaCell` modules, layer-major (pass as another encoder's ``shared_meta``)."""
        return nn.ModuleList(cell.meta for cell in self.cells)
