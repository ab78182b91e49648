"""Sentence-State LSTM (S-LSTM) encoder.

Yue Zhang, Qi Liu, Linfeng Song. "Sentence-State LSTM for Text Representation". ACL 2018.
Specification: ``MODELS.md`` 2.1 (the paper's equations, ``variant="paper"``, the default by
Decision 3) and 2.2 (the authors' released code, ``variant="official"``). Importing this module
registers the encoder ``"slstm"``.

Every word node i and one global (sentence) node g are updated synchronously for ``num_steps``
recurrent steps, each step reading only the states of the step before. All words are updated
at once: one matmul per gate group and step over the gathered rows of the words being updated
(:meth:`SentenceStateCell.run`), which the depth-adaptive encoder (:mod:`seqzoo.encoders.dagrn`)
uses to update only the words still active.

Conventions (MODELS.md 2.1–2.2):

* Softmaxes are per dimension, over the sigmoid gate values: the five word gates sum to one in
  each coordinate; the global cell's gates over the real words and the global node likewise.
  Padded words are masked out of the global softmax, of the mean ``h̄`` and of every window
  (their states are zero and never updated).
* ``paper``: window ``ξ_i = [h_{i−w}; …; h_{i+w}]`` (concatenated, zeros outside the row),
  gates i, l, r, f, s, o and candidate u; the cell reads the immediate neighbours' cells
  ``c_{i±1}``. Initial word and global states are zero [I]; dropout on the input x and the
  output h.
* ``official``: no candidate; the neighbours' states are *summed* over the window, the input x
  is gated into the cell (so ``input_size == hidden_size``), ``h⁰ = c⁰ = x`` with independent
  dropout masks (the gates read the h-copy, the cell the c-copy), dropout on the output h.
  The code's global initial state, a mean over the padded length, is a masked mean here.
* Weights: ``official`` N(0, 0.1) as the released code; ``paper`` Xavier-uniform [I].

State: the final global node ``(g, c_g)``, each (B, H); :meth:`SLSTM.global_state` gives g.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from seqzoo.encoders.base import Encoder, State, check_rate, register_encoder, takes_all_real_shortcut, zero_padding

__all__ = ["SLSTM", "VARIANTS", "SentenceStateCell", "shift"]

VARIANTS = ("paper", "official")


def shift(x: Tensor, offset: int) -> Tensor:
    """``x`` (B, T, H) moved along time so that position i holds ``x[:, i − offset]`` (zeros where
    that falls outside the sequence): offset > 0 reads left neighbours, offset < 0 right ones."""
    time = x.shape[1]
    if offset >= 0:
        return F.pad(x, (0, 0, offset, 0))[:, :time]
    return F.pad(x, (0, 0, 0, -offset))[:, -offset:]


class SentenceStateCell(nn.Module):
    """The weights of one S-LSTM step (shared by all steps) and the recurrence over the steps.

    Word node (``G`` gate groups: 7 for ``paper`` — i, l, r, f, s, o, u — and 6 for ``official``
    — f1, f2, f3, f4, i, o): pre-activations ``W·window + U·x + V·g + b`` with ``recurrent`` W
    ((2w+1)H or 3H -> G·H), ``input`` U (+ b, applied once per forward, outside the steps)
    and ``global_input`` V. Global node: ``global_gates`` (W_g, W_o, W_f on g), ``mean_gates``
    (U_g, U_o on h̄, + b_g, b_o) and ``word_forget`` (U_f on each h_i, + b_f).
    """

    def __init__(self, input_size: int, hidden_size: int, window: int, variant: str) -> None:
        super().__init__()
        if variant not in VARIANTS:
            raise ValueError(f"variant must be one of {VARIANTS}, got {variant!r}")
        if window < 1:
            raise ValueError(f"window must be >= 1, got {window}")
        if variant == "official" and input_size != hidden_size:
            raise ValueError(f"variant 'official' gates x into the cell: input_size {input_size} != hidden_size")
        self.hidden_size, self.window, self.variant = hidden_size, window, variant
        gates = 7 if variant == "paper" else 6
        window_size = (2 * window + 1 if variant == "paper" else 3) * hidden_size
        self.recurrent = nn.Linear(window_size, gates * hidden_size, bias=False)
        self.input = nn.Linear(input_size, gates * hidden_size)
        self.global_input = nn.Linear(hidden_size, gates * hidden_size, bias=False)
        self.global_gates = nn.Linear(hidden_size, 3 * hidden_size, bias=False)
        self.mean_gates = nn.Linear(hidden_size, 2 * hidden_size)
        self.word_forget = nn.Linear(hidden_size, hidden_size)
        for name, param in self.named_parameters():
            if variant == "official":
                nn.init.normal_(param, 0.0, 0.1)  # MODELS.md 2.2.5
            elif name.endswith("weight"):
                nn.init.xavier_uniform_(param)
            else:
                nn.init.zeros_(param)

    def extra_repr(self) -> str:
        return f"variant={self.variant!r}, window={self.window}"

    def windows(self, h: Tensor, c: Tensor, rows: Tensor | None = None) -> tuple[Tensor, Tensor, Tensor]:
        """The recurrent input and the neighbours' cells of the words at flat positions ``rows``
        (N,) (b·T + t), or of every position (N = B·T) when None; (N, ·) each.

        ``paper``: ξ = [h_{i−w}; …; h_{i+w}] (N, (2w+1)H), left cell c_{i−1}, right c_{i+1}.
        ``official``: [h_i; Σ_k h_{i−k}; Σ_k h_{i+k}] (N, 3H), Σ_k c_{i−k}, Σ_k c_{i+k}.
        Neighbours outside the sequence are zero; pads hold zero states.
        """
        batch, time, hidden = h.shape
        if rows is None:  # shifted copies of the whole batch

            def near(x: Tensor, offset: int) -> Tensor:
                return shift(x, -offset).reshape(batch * time, hidden)

        else:  # only the rows' neighbours
            position = rows % time  # (N,)

            def near(x: Tensor, offset: int) -> Tensor:
                inside = ((position + offset >= 0) & (position + offset < time)).unsqueeze(-1)  # (N, 1)
                index = (rows + offset).clamp(0, batch * time - 1)
                return x.reshape(batch * time, hidden).index_select(0, index) * inside

        offsets = range(1, self.window + 1)
        if self.variant == "paper":
            xi = torch.cat([near(h, k) for k in range(-self.window, self.window + 1)], dim=-1)
            return xi, near(c, -1), near(c, 1)
        left_h, right_h = sum(near(h, -k) for k in offsets), sum(near(h, k) for k in offsets)
        left_c, right_c = sum(near(c, -k) for k in offsets), sum(near(c, k) for k in offsets)
        return torch.cat([near(h, 0), left_h, right_h], dim=-1), left_c, right_c

    def global_update(
        self, h: Tensor, c: Tensor, g: Tensor, c_g: Tensor, forget_pre: Tensor, mask: Tensor, count: Tensor
    ) -> tuple[Tensor, Tensor]:
        """The global node's step (MODELS.md 2.1 "Global node") from the previous states.

        ``forget_pre`` (B, T, H) is ``U_f h_i + b_f`` of the current word states (cached by
        :meth:`run`, so frozen words are not recomputed); h and c are zero at pads. ``count`` (B, 1)
        is the number of real words per row, at least 1 (an empty row keeps g's own cell).
        """
        mean = h.sum(1) / count.to(h.dtype)  # h̄ over the real words (B, H)
        on_g, out_g, forget_g = self.global_gates(g).chunk(3, dim=-1)  # W_g g, W_o g, W_f g (B, H) each
        on_mean, out_mean = self.mean_gates(mean).chunk(2, dim=-1)  # U_g h̄ + b_g, U_o h̄ + b_o
        gate_g = torch.sigmoid(on_g + on_mean)  # f̂_g (B, H)
        gate_o = torch.sigmoid(out_g + out_mean)  # o (B, H)
        # softmax over (f̂_1..f̂_n, f̂_g) per dimension; the gates lie in (0, 1), so exp needs no shift
        exp_words = torch.sigmoid(forget_g.unsqueeze(1) + forget_pre).exp() * mask.unsqueeze(-1)  # (B, T, H), 0 at pads
        exp_g = gate_g.exp()  # (B, H)
        c_g = ((exp_words * c).sum(1) + exp_g * c_g) / (exp_words.sum(1) + exp_g)  # (B, H)
        return gate_o * torch.tanh(c_g), c_g

    def word_update(
        self,
        pre: Tensor,
        c_self: Tensor,
        c_left: Tensor,
        c_right: Tensor,
        c_global: Tensor,
        x_cell: Tensor | None,
    ) -> tuple[Tensor, Tensor]:
        """New (h, c) of N words (N, H) from their gate pre-activations ``pre`` (N, G·H) and the
        cells they mix: their own, the neighbours', the global node's (and x's for ``official``)."""
        gates = pre.unflatten(-1, (-1, self.hidden_size))  # (N, G, H)
        weights = torch.softmax(torch.sigmoid(gates[:, :5]), dim=1)  # (N, 5, H)
        if self.variant == "paper":
            i, left, right, forget, glob = weights.unbind(1)  # i, l, r, f, s
            candidate = torch.tanh(gates[:, 6])  # u
            c = left * c_left + forget * c_self + right * c_right + glob * c_global + i * candidate
        else:
            left, right, inner, glob, i = weights.unbind(1)  # f1, f2, f3, f4, i
            c = left * c_left + right * c_right + inner * x_cell + glob * c_global + i * c_self
        return torch.sigmoid(gates[:, 5]) * torch.tanh(c), c  # h = o ⊙ tanh(c)

    def run(
        self,
        x_pre: Tensor,
        x_cell: Tensor | None,
        mask: Tensor,
        state: tuple[Tensor, Tensor, Tensor, Tensor],
        num_steps: int,
        updates: Tensor | None = None,
        gather: bool = True,
    ) -> tuple[Tensor, Tensor, Tensor, Tensor]:
        """``num_steps`` synchronous steps from ``state = (h, c, g, c_g)`` ((B, T, H) twice, zero
        at pads, then (B, H) twice); returns the final four.

        ``x_pre`` (B, T, G·H) is ``U x + b``; ``x_cell`` (B, T, H) the x gated into the cell
        (``official``, else None). ``updates`` (B, T) int: word (b, t) is updated at steps
        ``0 .. updates − 1`` and then keeps its state (copy rule); None updates every real word at
        every step. The global node is updated at every step. ``gather=True`` computes only the
        words being updated (their rows gathered, updated, scattered back); ``gather=False``
        computes every position and keeps the old state where a word is not updated: the same
        values, at the cost of all words. When every position is updated at every step (no pads,
        no depths) both compute all positions, with nothing to gather or keep.
        """
        h, c, g, c_g = state
        batch, time, hidden = h.shape
        every_word = updates is None and takes_all_real_shortcut(mask)  # nothing to gather or keep
        dense = every_word or not gather
        in_place = not dense and not torch.is_grad_enabled()  # scatter into the states (inference)
        if in_place:
            h, c = h.clone(), c.clone()  # the caller's tensors stay as they were
        forget_pre = self.word_forget(h)  # U_f h_i + b_f (B, T, H), refreshed only where h changes
        count = mask.sum(1, keepdim=True).clamp(min=1)  # (B, 1) real words, for h̄
        if dense:  # every position, the same at every step
            sentence = torch.arange(batch * time, device=h.device) // time  # (B·T,) batch row of each position
        for step in range(num_steps):
            active = mask if updates is None else mask & (updates > step)  # (B, T)
            new_g, new_c_g = self.global_update(h, c, g, c_g, forget_pre, mask, count)
            rows = None if dense else active.flatten().nonzero().squeeze(1)  # (N,) flat indices b·T + t
            window, c_left, c_right = self.windows(h, c, rows)  # (N, ·)
            if not dense:
                sentence = rows // time  # (N,) batch row of each word

            def take(t: Tensor, rows: Tensor | None = rows) -> Tensor:
                flat = t.reshape(batch * time, -1)  # (B·T, ·)
                return flat if rows is None else flat.index_select(0, rows)  # (N, ·)

            pre = self.recurrent(window) + take(x_pre) + self.global_input(g)[sentence]  # (N, G·H)
            cell_x = take(x_cell) if x_cell is not None else None
            h_rows, c_rows = self.word_update(pre, take(c), c_left, c_right, c_g[sentence], cell_x)
            forget_rows = self.word_forget(h_rows)
            if every_word:
                h, c = h_rows.view(batch, time, hidden), c_rows.view(batch, time, hidden)
                forget_pre = forget_rows.view(batch, time, hidden)
            elif in_place:
                for state, new in ((h, h_rows), (c, c_rows), (forget_pre, forget_rows)):
                    state.view(batch * time, hidden).index_copy_(0, rows, new)
            elif not dense:
                h = h.reshape(batch * time, hidden).index_copy(0, rows, h_rows).view(batch, time, hidden)
                c = c.reshape(batch * time, hidden).index_copy(0, rows, c_rows).view(batch, time, hidden)
                forget_pre = forget_pre.reshape(batch * time, hidden).index_copy(0, rows, forget_rows)
                forget_pre = forget_pre.view(batch, time, hidden)
            else:
                keep = active.unsqueeze(-1)  # (B, T, 1)
                h = torch.where(keep, h_rows.view(batch, time, hidden), h)
                c = torch.where(keep, c_rows.view(batch, time, hidden), c)
                forget_pre = torch.where(keep, forget_rows.view(batch, time, hidden), forget_pre)
            g, c_g = new_g, new_c_g
        return h, c, g, c_g


@register_encoder("slstm")
class SLSTM(Encoder):
    """S-LSTM encoder (see the module docstring): a whole-sequence encoder, outputs (B, T, H) zero
    at pads, final state the global node ``(g, c_g)``.

    ``num_steps`` recurrent steps with window ``window`` (w neighbours each side); ``variant``
    ``"paper"`` or ``"official"``; ``dropout`` on the input embedding(s) and on the output h.
    """

    causal = False
    stateful = False
    repr_fields = ("num_steps", "window", "variant", "dropout")

    def __init__(
        self,
        input_size: int,
        hidden_size: int,
        num_steps: int = 7,
        window: int = 1,
        variant: str = "paper",
        dropout: float = 0.0,
    ) -> None:
        super().__init__(input_size, hidden_size)
        if num_steps < 1:
            raise ValueError(f"num_steps must be >= 1, got {num_steps}")
        self.num_steps, self.window, self.variant = num_steps, window, variant
        self.dropout = check_rate("dropout", dropout)
        self.cell = SentenceStateCell(input_size, hidden_size, window, variant)

    @property
    def global_size(self) -> int:
        return self.hidden_size

    def global_state(self, state: State) -> Tensor:
        """The sentence vector g (B, H) of a final state ``(g, c_g)``."""
        return state[0]

    def forward(self, x: Tensor, mask: Tensor | None = None, state: State = None) -> tuple[Tensor, State]:
        mask = self.check_input(x, mask)
        if state is not None:
            raise ValueError("SLSTM is not stateful (a whole-sequence encoder); pass state=None")
        x = zero_padding(x, mask)  # (B, T, D)
        batch, hidden = x.shape[0], self.hidden_size
        if self.variant == "official":  # MODELS.md 2.2.3: h⁰ = c⁰ = x, independent dropout masks
            h = F.dropout(x, self.dropout, self.training)
            c = F.dropout(x, self.dropout, self.training)
            count = mask.sum(1, keepdim=True).clamp(min=1).to(x.dtype)
            g, c_g = h.sum(1) / count, c.sum(1) / count  # masked means (the code's is over the padded length)
            x_pre, x_cell = self.cell.input(h), c
        else:
            h = c = x.new_zeros(*x.shape[:2], hidden)
            g = c_g = x.new_zeros(batch, hidden)
            x_pre, x_cell = self.cell.input(F.dropout(x, self.dropout, self.training)), None
        h, _, g, c_g = self.cell.run(x_pre, x_cell, mask, (h, c, g, c_g), self.num_steps)
        out = F.dropout(h, self.dropout, self.training)  # (B, T, H), zero at pads (never updated)
        return out, (g, c_g)
