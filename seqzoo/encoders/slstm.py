"""Sentence-State LSTM (S-LSTM) encoder.

Yue Zhang, Qi Liu, Linfeng Song. "Sentence-State LSTM for Text Representation". ACL 2018.
Specification: ``MODELS.md`` 2.1 (the paper's equations, ``variant="paper"``, the default by
Decision 3) and 2.2 (the authors' released code, ``variant="official"``). Importing this module
registers the encoder ``"slstm"``.

Every word node i and one global (sentence) node g are updated synchronously for ``num_steps``
recurrent steps, each step reading only the states of the step before. All words are updated
at once: one matmul per gate group and step over the gathered rows of the words being updated
(:meth:`SentenceStateCell.run`), which the depth-adaptive encoder (:mod:`seqzoo.encoders.dagrn`)
uses to update only the words still active; at inference the real words are laid out once,
deepest first, and each step updates a prefix of them in place
(:meth:`SentenceStateCell.run_compact`).

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
from seqzoo.kernels._loader import kernel_serves
from seqzoo.kernels.slstm_global import global_sums, global_sums_available, global_sums_reference

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

    def project_input(self, x: Tensor, mask: Tensor) -> Tensor:
        """``U x + b`` of the input x (B, T, D), :meth:`run`'s ``x_pre``: (B, T, G·H), or without
        autograd on a padded batch only at the real words, (M, G·H) in the order of ``mask.nonzero()``."""
        if torch.is_grad_enabled() or takes_all_real_shortcut(mask):
            return self.input(x)
        return self.input(x[mask])  # (M, G·H)

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
        self, gates_g: Tensor, h_mean: Tensor, weighted: Tensor, weights: Tensor, c_g: Tensor
    ) -> tuple[Tensor, Tensor]:
        """The global node's step (MODELS.md 2.1 "Global node") from the previous states: new (g, c_g), (B, H) each.

        ``gates_g`` (B, 3H) is ``[W_g g; W_o g; W_f g]`` (:attr:`global_gates` of g), ``h_mean`` (B, H) the
        mean h̄ of the word states; ``weighted`` and ``weights`` (B, H) are ``Σ_i e_i ⊙ c_i`` and ``Σ_i e_i``
        over each sentence's real words, ``e_i = exp(σ(W_f g + U_f h_i + b_f))``
        (:mod:`seqzoo.kernels.slstm_global`). The global cell is the per-dimension softmax over
        (f̂_1..f̂_n, f̂_g) of the words' cells and its own; an empty sentence keeps its own cell.
        """
        on_g, out_g, _ = gates_g.chunk(3, dim=-1)  # W_g g, W_o g (B, H) each
        on_mean, out_mean = self.mean_gates(h_mean).chunk(2, dim=-1)  # U_g h̄ + b_g, U_o h̄ + b_o
        gate_g = torch.sigmoid(on_g + on_mean)  # f̂_g (B, H)
        gate_o = torch.sigmoid(out_g + out_mean)  # o (B, H)
        exp_g = gate_g.exp()  # the gates lie in (0, 1): exp needs no shift
        c_g = (weighted + exp_g * c_g) / (weights + exp_g)  # (B, H)
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

        ``x_pre`` is ``U x + b``, (B, T, G·H) or at the real words only (M, G·H) in the order of
        ``mask.nonzero()`` (:meth:`project_input`); ``x_cell`` (B, T, H) the x gated into the cell
        (``official``, else None). ``updates`` (B, T) int: word (b, t) is updated at steps
        ``0 .. updates − 1`` and then keeps its state (copy rule); None updates every real word at
        every step. The global node is updated at every step. ``gather=True`` computes only the
        words being updated (their rows gathered, updated, scattered back; without autograd by
        :meth:`run_compact`); ``gather=False`` computes every position and keeps the old state where
        a word is not updated: the same values, at the cost of all words. When every position is
        updated at every step (no pads, no depths) both compute all positions, with nothing to
        gather or keep.
        """
        every_word = updates is None and takes_all_real_shortcut(mask)  # nothing to gather or keep
        recording = torch.jit.is_tracing() or torch.compiler.is_compiling()  # a graph must not bake in the depths
        if gather and not every_word and not torch.is_grad_enabled() and not recording:
            return self.run_compact(x_pre, x_cell, mask, state, num_steps, updates)
        if x_pre.dim() == 2:  # the real words' rows: spread over the padded batch
            x_pre = x_pre.new_zeros(*mask.shape, x_pre.shape[-1]).masked_scatter_(mask.unsqueeze(-1), x_pre)
        h, c, g, c_g = state
        batch, time, hidden = h.shape
        dense = every_word or not gather
        forget_pre = self.word_forget(h)  # U_f h_i + b_f (B, T, H), refreshed only where h changes
        count = mask.sum(1, keepdim=True).clamp(min=1).to(h.dtype)  # (B, 1) real words, for h̄
        real = mask.unsqueeze(-1).to(h.dtype)  # (B, T, 1)
        if dense:  # every position, the same at every step
            sentence = torch.arange(batch * time, device=h.device) // time  # (B·T,) batch row of each position
        for step in range(num_steps):
            active = mask if updates is None else mask & (updates > step)  # (B, T)
            gates_g = self.global_gates(g)  # (B, 3H)
            exp_words = torch.sigmoid(gates_g[:, None, 2 * hidden :] + forget_pre).exp() * real  # e_i, 0 at pads
            weighted, weights = (exp_words * c).sum(1), exp_words.sum(1)  # (B, H) each
            new_g, new_c_g = self.global_update(gates_g, h.sum(1) / count, weighted, weights, c_g)
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

    def run_compact(
        self,
        x_pre: Tensor,
        x_cell: Tensor | None,
        mask: Tensor,
        state: tuple[Tensor, Tensor, Tensor, Tensor],
        num_steps: int,
        updates: Tensor | None = None,
    ) -> tuple[Tensor, Tensor, Tensor, Tensor]:
        """:meth:`run` with ``gather=True`` for inference (no autograd: it writes its states in place),
        its cost following the updates. The M real words are laid out once, flat and deepest first,
        so the words updated at step l are the first n_l rows: sliced, not gathered, and written back
        in place. Their neighbours are read through index lists built once (a zero row for pads and
        positions outside the sentence); the neighbours' and the words' own states are read before
        any is written, so the steps stay synchronous. The global node's sums over every word are one
        call of :func:`~seqzoo.kernels.slstm_global.global_sums` per step (its reference where the
        kernel cannot serve); a step that updates no word updates the global node alone. Pads cost nothing.
        """
        h, c, g, c_g = state
        batch, time, hidden = h.shape
        depth = torch.full_like(mask, num_steps, dtype=torch.long) if updates is None else updates.clamp(0, num_steps)
        row, column = mask.nonzero().unbind(1)  # (M,) each: the real words' batch rows and positions
        word_depth = depth[row, column]  # (M,)
        order = torch.argsort(word_depth, descending=True, stable=True)  # deepest first
        sentence, column = row.index_select(0, order), column.index_select(0, order)  # (M,) each
        position = sentence * time + column  # (M,) flat positions b·T + t
        size = position.numel()
        # n_l, the words updated at step l (depth > l), for l = 0 .. num_steps − 1
        per_depth = torch.bincount(word_depth, minlength=num_steps + 1)  # (num_steps + 1,)
        updated = per_depth.flip(0).cumsum(0).flip(0)[1:].tolist()
        # the row of each position, its sentence padded by w on each side: M (a zero row) at pads and outside
        span = time + 2 * self.window
        slot = torch.full((batch * span,), size, dtype=torch.long, device=h.device)
        at = sentence * span + column + self.window  # (M,) each word's place in ``slot``
        slot[at] = torch.arange(size, device=h.device)

        def neighbours(offsets: list[int]) -> Tensor:  # (M, K) rows of each word's neighbours at offsets
            return slot[at.unsqueeze(1) + torch.tensor(offsets, device=h.device)]

        left, right = list(range(-1, -self.window - 1, -1)), list(range(1, self.window + 1))
        if self.variant == "paper":  # ξ = [h_{i−w}; …; h_{i+w}]; cells c_{i−1}, c_{i+1}
            h_near, c_near = neighbours([*left[::-1], 0, *right]), neighbours([-1, 1])
        else:  # [h_i; Σ_k h_{i−k}; Σ_k h_{i+k}]; Σ_k c_{i−k}, Σ_k c_{i+k}
            h_near, c_near = neighbours([0, *left, *right]), neighbours(left + right)
        h_rows = h.new_zeros(size + 1, hidden)  # (M + 1, H): the words, deepest first, then a zero row
        c_rows = h.new_zeros(size + 1, hidden)
        h_rows[:size] = h.reshape(batch * time, hidden).index_select(0, position)
        c_rows[:size] = c.reshape(batch * time, hidden).index_select(0, position)
        h_words, c_words = h_rows[:size], c_rows[:size]  # (M, H) views
        forget_pre = self.word_forget(h_words)  # U_f h_i + b_f (M, H), refreshed where h changes
        if x_pre.dim() == 3:
            x_pre = x_pre.reshape(batch * time, -1).index_select(0, position)  # (M, G·H)
        else:  # given at the real words in row-major order
            x_pre = x_pre.index_select(0, order)  # (M, G·H)
        if x_cell is not None:
            x_cell = x_cell.reshape(batch * time, hidden).index_select(0, position)  # (M, H)
        count = mask.sum(1, keepdim=True).clamp(min=1).to(h.dtype)  # (B, 1)
        fallback = "the S-LSTM global node falls back to its slower PyTorch sums"
        sums = global_sums if kernel_serves(h, global_sums_available, fallback) else global_sums_reference
        by_sentence = torch.empty_like(order).index_copy_(0, order, torch.arange(size, device=h.device))  # (M,)
        lengths = mask.sum(1)  # (B,): the rows of sentence b's words are by_sentence's next lengths[b]
        for n in updated:
            gates_g = self.global_gates(g)  # (B, 3H)
            forget_g = gates_g[:, 2 * hidden :]  # W_f g (B, H)
            weighted, weights, h_sum = sums(forget_g, forget_pre, c_words, h_words, by_sentence, lengths, check=False)
            new_g, new_c_g = self.global_update(gates_g, h_sum / count, weighted, weights, c_g)
            if n:
                near_h = h_rows.index_select(0, h_near[:n].flatten()).view(n, -1, hidden)  # (n, K, H)
                near_c = c_rows.index_select(0, c_near[:n].flatten()).view(n, -1, hidden)  # (n, K', H)
                window, c_left, c_right = self.gathered_window(near_h, near_c)
                rows = sentence[:n]  # (n,)
                pre = torch.addmm(x_pre[:n], window, self.recurrent.weight.t())  # W·window + U x + b (n, G·H)
                pre += self.global_input(g).index_select(0, rows)  # + V g
                cell_x = x_cell[:n] if x_cell is not None else None
                h_new, c_new = self.word_update(pre, c_words[:n], c_left, c_right, c_g.index_select(0, rows), cell_x)
                h_rows[:n], c_rows[:n] = h_new, c_new
                forget_pre[:n] = self.word_forget(h_new)
            g, c_g = new_g, new_c_g
        h = h.new_zeros(batch * time, hidden).index_copy_(0, position, h_words).view(batch, time, hidden)
        c = c.new_zeros(batch * time, hidden).index_copy_(0, position, c_words).view(batch, time, hidden)
        return h, c, g, c_g

    def gathered_window(self, near_h: Tensor, near_c: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """The recurrent input and the neighbours' cells (as :meth:`windows`) of n words from their
        gathered neighbours: ``near_h`` (n, K, H) at the offsets of :meth:`run_compact` (``paper``:
        −w..w; ``official``: 0, −1..−w, 1..w) and ``near_c`` (n, K', H) (``paper``: −1, 1;
        ``official``: −1..−w, 1..w)."""
        if self.variant == "paper" or self.window == 1:  # the rows are laid out as the window already
            return near_h.flatten(1), near_c[:, 0], near_c[:, 1]
        w = self.window
        window = torch.cat([near_h[:, 0], near_h[:, 1 : w + 1].sum(1), near_h[:, w + 1 :].sum(1)], dim=-1)
        return window, near_c[:, :w].sum(1), near_c[:, w:].sum(1)


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
            x_pre, x_cell = self.cell.project_input(h, mask), c
        else:
            h = c = x.new_zeros(*x.shape[:2], hidden)
            g = c_g = x.new_zeros(batch, hidden)
            x_pre, x_cell = self.cell.project_input(F.dropout(x, self.dropout, self.training), mask), None
        h, _, g, c_g = self.cell.run(x_pre, x_cell, mask, (h, c, g, c_g), self.num_steps)
        out = F.dropout(h, self.dropout, self.training)  # (B, T, H), zero at pads (never updated)
        return out, (g, c_g)
