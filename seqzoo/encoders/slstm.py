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

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from seqzoo.encoders.base import Encoder, State, check_rate, register_encoder, takes_all_real_shortcut, zero_padding
from seqzoo.kernels._loader import kernel_serves
from seqzoo.kernels.slstm_global import global_combine, global_step, global_step_available, global_step_reference
from seqzoo.kernels.slstm_word import word_cells, word_cells_available, word_cells_reference, word_gates

__all__ = ["SLSTM", "VARIANTS", "SentenceStateCell", "WordLayout", "shift"]

VARIANTS = ("paper", "official")


def shift(x: Tensor, offset: int) -> Tensor:
    """``x`` (B, T, H) moved along time so that position i holds ``x[:, i − offset]`` (zeros where
    that falls outside the sequence): offset > 0 reads left neighbours, offset < 0 right ones."""
    time = x.shape[1]
    if offset >= 0:
        return F.pad(x, (0, 0, offset, 0))[:, :time]
    return F.pad(x, (0, 0, 0, -offset))[:, -offset:]


@dataclass(frozen=True)
class WordLayout:
    """The M real words of a padded batch laid out flat for :meth:`SentenceStateCell.run_compact`:
    deepest first (stable), so that the words updated at step l are the first ``updated[l]`` rows.

    ``order`` (M,): the index, in ``mask.nonzero()`` (row-major) order, of the word at each row;
    ``sentence`` (M,) its batch row and ``position`` (M,) its flat position b·T + t; ``updated`` n_l
    for l = 0 .. L − 1 (non-increasing); ``h_near`` (M, K) the rows of each word's neighbours for its
    window, at the offsets of :meth:`SentenceStateCell.gathered_window`, and ``c_near`` (M, 2w') those
    of its cells' neighbours, left then right (``paper``: w' = 1; ``official``: w' = w), M (one past the
    words, a zero row) at pads and outside the sentence; ``by_sentence`` (M,) the rows of sentence 0's
    words, then sentence 1's, ...; ``lengths`` (B,) the words per sentence; ``shape`` (B, T).
    """

    shape: tuple[int, int]
    order: Tensor
    sentence: Tensor
    position: Tensor
    updated: list[int]
    h_near: Tensor
    c_near: Tensor
    by_sentence: Tensor
    lengths: Tensor

    def rows(self, padded: Tensor) -> Tensor:
        """(B, T, ·) -> (M, ·): the words' rows in the layout's order."""
        return padded.reshape(self.shape[0] * self.shape[1], -1).index_select(0, self.position)

    def padded(self, rows: Tensor) -> Tensor:
        """(M, ·) in the layout's order -> (B, T, ·), zero at pads."""
        flat = rows.new_zeros(self.shape[0] * self.shape[1], rows.shape[-1]).index_copy_(0, self.position, rows)
        return flat.view(*self.shape, -1)


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
        over each sentence's real words, ``e_i = exp(σ(W_f g + U_f h_i + b_f))``. The global cell is the
        per-dimension softmax over (f̂_1..f̂_n, f̂_g) of the words' cells and its own
        (:func:`~seqzoo.kernels.slstm_global.global_combine`); an empty sentence keeps its own cell.
        """
        return global_combine(gates_g, self.mean_gates(h_mean), weighted, weights, c_g)

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
        cells they mix: their own, the neighbours', the global node's (and x's for ``official``)
        (:func:`~seqzoo.kernels.slstm_word.word_gates`)."""
        return word_gates(pre, c_self, c_left, c_right, c_global, x_cell if self.variant == "official" else None)

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
        :meth:`layout` and :meth:`run_compact`); ``gather=False`` computes every position and keeps the old state where
        a word is not updated: the same values, at the cost of all words. When every position is
        updated at every step (no pads, no depths) both compute all positions, with nothing to
        gather or keep.
        """
        every_word = updates is None and takes_all_real_shortcut(mask)  # nothing to gather or keep
        recording = torch.jit.is_tracing() or torch.compiler.is_compiling()  # a graph must not bake in the depths
        if gather and not every_word and not torch.is_grad_enabled() and not recording:
            depth = torch.full_like(mask, num_steps, dtype=torch.long)[mask] if updates is None else updates[mask]
            layout = self.layout(mask, depth, num_steps)
            h, c, g, c_g = state
            x_pre = layout.rows(x_pre) if x_pre.dim() == 3 else x_pre.index_select(0, layout.order)
            x_cell = layout.rows(x_cell) if x_cell is not None else None
            h, c, g, c_g = self.run_compact(x_pre, x_cell, (layout.rows(h), layout.rows(c), g, c_g), layout)
            return layout.padded(h), layout.padded(c), g, c_g
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

    def layout(self, mask: Tensor, depth: Tensor, num_steps: int) -> WordLayout:
        """The real words of ``mask`` (B, T) laid out for :meth:`run_compact`, given each word's number of
        updates ``depth`` (M,) in ``mask.nonzero()`` order (clamped to 0 .. ``num_steps``)."""
        batch, time = mask.shape
        depth = depth.clamp(0, num_steps)
        row, column = mask.nonzero().unbind(1)  # (M,) each: the real words' batch rows and positions
        order = torch.argsort(depth, descending=True, stable=True)  # deepest first
        sentence, column = row.index_select(0, order), column.index_select(0, order)  # (M,) each
        size = order.numel()
        # n_l, the words updated at step l (depth > l), for l = 0 .. num_steps − 1
        per_depth = torch.bincount(depth, minlength=num_steps + 1)  # (num_steps + 1,)
        updated = per_depth.flip(0).cumsum(0).flip(0)[1:].tolist()
        # the row of each position, its sentence padded by w on each side: M (a zero row) at pads and outside
        span = time + 2 * self.window
        slot = torch.full((batch * span,), size, dtype=torch.long, device=mask.device)
        at = sentence * span + column + self.window  # (M,) each word's place in ``slot``
        slot[at] = torch.arange(size, device=mask.device)

        def neighbours(offsets: list[int]) -> Tensor:  # (M, K) rows of each word's neighbours at offsets
            return slot[at.unsqueeze(1) + torch.tensor(offsets, device=mask.device)]

        left, right = list(range(-1, -self.window - 1, -1)), list(range(1, self.window + 1))
        if self.variant == "paper":  # ξ = [h_{i−w}; …; h_{i+w}]; cells c_{i−1}, c_{i+1}
            h_near, c_near = neighbours([*left[::-1], 0, *right]), neighbours([-1, 1])
        else:  # [h_i; Σ_k h_{i−k}; Σ_k h_{i+k}]; Σ_k c_{i−k}, Σ_k c_{i+k}
            h_near, c_near = neighbours([0, *left, *right]), neighbours(left + right)
        by_sentence = torch.empty_like(order).index_copy_(0, order, torch.arange(size, device=mask.device))
        return WordLayout(
            (batch, time), order, sentence, sentence * time + column, updated, h_near, c_near, by_sentence, mask.sum(1)
        )

    def run_compact(
        self,
        x_pre: Tensor,
        x_cell: Tensor | None,
        state: tuple[Tensor, Tensor, Tensor, Tensor],
        layout: WordLayout,
        start: tuple[Tensor, Tensor] | None = None,
    ) -> tuple[Tensor, Tensor, Tensor, Tensor]:
        """:meth:`run` with ``gather=True`` for inference (no autograd), on the real words laid out by
        :meth:`layout`: ``x_pre`` (M, G·H), ``x_cell`` (M, H) or None and the words' states h, c (M, H)
        are rows in the layout's order, g, c_g (B, H); returns the final (h, c) rows (new tensors) and
        (g, c_g). The words updated at step l are the first n_l rows: sliced, not gathered, and written
        back in place. Their neighbours are read through the layout's index lists (a zero row for pads
        and positions outside the sentence); the neighbours' and the words' own states are read before
        any is written, so the steps stay synchronous. The global node's step (its sums over every word
        and its gates) is one call of :func:`~seqzoo.kernels.slstm_global.global_step` (its reference where
        the kernel cannot serve); a step that updates no word updates the global node alone. Pads cost nothing.

        ``start = (m, W)``, m (M, r) in the layout's order and W (H, r), says that the initial states are
        ``h = c = m Wᵀ`` of rank r < H (the DA-GRN's h⁰ = c⁰ = W_3 m): the first step's window product
        ``W_rec·[W m_j; …]`` then runs as ``(W_rec (I ⊗ W))·[m_j; …]``, and ``U_f h`` as ``(U_f W) m``, in the
        r-dimensional space: the same values up to rounding, at r/H of the first step's largest product.
        """
        h, c, g, c_g = state
        size, hidden = h.shape
        h_rows = h.new_empty(size + 1, hidden)  # (M + 1, H): the words, deepest first, then a zero row
        c_rows = h.new_empty(size + 1, hidden)
        h_rows[:size], c_rows[:size] = h, c
        h_rows[size], c_rows[size] = 0, 0
        h_words, c_words = h_rows[:size], c_rows[:size]  # (M, H) views
        if start is None:
            forget_pre = self.word_forget(h_words)  # U_f h_i + b_f (M, H), refreshed where h changes
        else:
            m, start_weight = start  # h = c = m Wᵀ: (M, r), (H, r)
            m_rows = torch.cat([m, m.new_zeros(1, m.shape[1])])  # (M + 1, r), a zero row last as h_rows
            forget_pre = torch.addmm(self.word_forget.bias, m, (self.word_forget.weight @ start_weight).t())
            # W_rec's K blocks of H columns, each times W: (G·H, K·r), the window product on m's rows
            start_recurrent = (self.recurrent.weight.unflatten(1, (-1, hidden)) @ start_weight).flatten(1)
        fallback = "the S-LSTM global node falls back to its slower PyTorch step"
        global_node = global_step if kernel_serves(h, global_step_available, fallback) else global_step_reference
        fallback = "the S-LSTM word cells fall back to their slower PyTorch update"
        cells = word_cells if kernel_serves(h, word_cells_available, fallback) else word_cells_reference
        x_cell = x_cell if self.variant == "official" else None
        words = (layout.by_sentence, layout.lengths)  # each sentence's rows
        # [U_g; U_o] (2H, H) as the transpose of a contiguous (H, 2H), which the kernel reads; [b_g; b_o]
        mean_gates = (self.mean_gates.weight.t().contiguous().t(), self.mean_gates.bias)
        gates_t, global_t = self.global_gates.weight.t(), self.global_input.weight.t()  # the products' weights
        recurrent_t, forget_t, forget_b = self.recurrent.weight.t(), self.word_forget.weight.t(), self.word_forget.bias
        near_h, width = layout.h_near.flatten(), layout.h_near.shape[1]  # the first n·K: the window rows of n words
        c_near, sentence = layout.c_near, layout.sentence
        for step, n in enumerate(layout.updated):
            gates_g = torch.mm(g, gates_t)  # [W_g g; W_o g; W_f g] (B, 3H)
            new_g, new_c_g = global_node(gates_g, forget_pre, c_words, h_words, *words, c_g, *mean_gates, check=False)
            if n:
                if step or start is None:
                    near = h_rows.index_select(0, near_h[: n * width]).view(n, width, hidden)  # (n, K, H)
                    window, recurrent = self.gathered_window(near), recurrent_t
                else:  # the first step of a rank-r start: the window of m's rows
                    near = m_rows.index_select(0, near_h[: n * width]).view(n, width, -1)  # (n, K, r)
                    window, recurrent = self.gathered_window(near), start_recurrent.t()
                pre = torch.addmm(x_pre[:n], window, recurrent)  # W·window + U x + b (n, G·H)
                cell_x = x_cell[:n] if x_cell is not None else None
                global_pre = torch.mm(g, global_t)  # V g (B, G·H)
                h_new, c_new = cells(pre, global_pre, sentence[:n], c_rows, c_near[:n], c_g, cell_x, check=False)
                h_rows[:n], c_rows[:n] = h_new, c_new
                torch.addmm(forget_b, h_new, forget_t, out=forget_pre[:n])  # U_f h + b_f where h changed
            g, c_g = new_g, new_c_g
        return h_words, c_words, g, c_g

    def gathered_window(self, near: Tensor) -> Tensor:
        """The recurrent input (as :meth:`windows`) of n words from their neighbours' states gathered at the
        offsets of :meth:`layout` (``paper``: −w..w; ``official``: 0, −1..−w, 1..w), ``near`` (n, K, H):
        (n, K·H) or (n, 3H). Linear in the states (a state of rank r gives the window of its r-dim rows)."""
        if self.variant == "paper" or self.window == 1:  # the rows are laid out as the window already
            return near.flatten(1)
        w = self.window
        return torch.cat([near[:, 0], near[:, 1 : w + 1].sum(1), near[:, w + 1 :].sum(1)], dim=-1)


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
