"""Depth-Adaptive Graph Recurrent Network (DA-GRN): an S-LSTM whose words stop at their own depth.

Yang Liu, Fandong Meng, Jie Zhou, Yufeng Chen, Jinan Xu. "Depth-Adaptive Graph Recurrent Network
for Text Classification". arXiv 2003.00166, 2020. Specification: ``MODELS.md`` 2.3 (the pipeline
of the released ``model.py``) and 2.4 (the depth mechanism, eqs. 6–14), Decision 4. Importing
this module registers the encoder ``"dagrn"``.

Pipeline over token features e (B, T, D) (GloVe + char-CNN, built outside the encoder):

1. sequential module: a Bi-LSTM (``build_encoder("lstm", bidirectional=True)``, H/2 each way),
   output dropout per direction and again on the concatenation (the code's two dropouts), s (B, T, H);
2. inner vector ``m = dropout(tanh(W_1 s + b_1))`` (B, T, d_e) (eq. 6);
3. depth distribution ``p = softmax(m Eᵀ)`` over L depths, its output matrix tied to the trainable
   depth embedding E (L, d_e), no bias (eqs. 6–7);
4. depth selection j ∈ {0..L−1} (eqs. 8–11): ``hard`` argmax p; ``soft`` ⌊Σ_j j·p_j⌋ (the code's
   mode); ``gumbel`` argmax(log p + γ) with Gumbel noise γ in training (noise-free, i.e. ``hard``, at
   evaluation). The choice is not differentiable (Decision 4); ``straight_through=True`` (gumbel
   only, off by default) mixes the embedding with the straight-through Gumbel-softmax
   ``y = softmax((log p + γ)/τ)`` (one-hot forward, soft backward), an extension;
5. word i receives ``d_i = j_i + depth_offset`` updates (``depth_offset=1``: d_i ∈ {1..L} as
   Decision 4 states; 0: the code's {0..L−1}); depth embedding ``δ_i = E[j_i] + PE(d_i)``
   (trainable + sinusoidal, eq. 12) concatenated to the token features, ``x_i = [e_i; δ_i]`` (eq. 13);
6. initial word state ``h⁰ = c⁰ = W_3 m`` (no bias); global node ``g⁰ = c_g⁰`` = mean of x over the
   real words (the code's mean runs over the padded length);
7. L S-LSTM steps (:class:`~seqzoo.encoders.slstm.SentenceStateCell`, ``variant="official"`` as the
   code, or ``"paper"``): the global node is updated at every step, word i only at steps
   ``0 .. d_i − 1``, after which its state is copied upward (eq. 14). Frozen words cost no
   compute: each step gathers the active words, updates them and scatters them back (Decision 4);
   their neighbours read the frozen states. At inference (:meth:`DAGRN.forward_compact`) the whole
   pipeline runs at the real words only, laid out deepest first once after the depths are chosen,
   so a step updates a prefix of them in place, and a step with no active word updates the global
   node only; the first step runs in the d_e-dimensional space of h⁰ (``run_compact``'s ``start``);
   on the CPU the Bi-LSTM's recurrence, the global node's step and the word cells are C kernels
   (:meth:`DAGRN.sequential_rows`, :mod:`seqzoo.kernels.slstm_global`, :mod:`seqzoo.kernels.slstm_word`);
8. output dropout on h. All dropouts stop at evaluation (the code's hard-coded ones did not).

Gradients (MODELS.md 2.3): without straight-through the depth softmax gets none; E learns only
through δ, and W_1, b_1 and the Bi-LSTM only through h⁰ = W_3 m. ``full_depth=True`` updates every
word L times with the same weights and inputs (the ablation). :attr:`DAGRN.last_depths` holds the
last forward's d (B, T), 0 at pads. There is no auxiliary loss.

State: the final global node ``(g, c_g)``, each (B, H); :meth:`DAGRN.global_state` gives g.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from seqzoo.encoders.base import (
    Encoder,
    State,
    build_encoder,
    check_rate,
    register_encoder,
    zero_padding,
)
from seqzoo.encoders.rnn import sinusoidal_positions
from seqzoo.encoders.slstm import SentenceStateCell
from seqzoo.kernels._loader import kernel_serves
from seqzoo.kernels.lstm_recurrence import lstm_recurrence, lstm_recurrence_available

__all__ = ["DAGRN", "DEPTH_MODES"]

DEPTH_MODES = ("hard", "soft", "gumbel")


@register_encoder("dagrn")
class DAGRN(Encoder):
    """DA-GRN encoder (see the module docstring): token features (B, T, D) -> (B, T, H), zero at pads.

    ``num_layers`` L S-LSTM steps; ``depth_size`` d_e; ``window`` the S-LSTM window;
    ``dropout`` the Bi-LSTM and output dropout (the code's ``rnn_keep_prob``); ``inner_dropout``
    the dropout on m (the code's 0.1). The S-LSTM input ``[e; δ]`` must be H wide (it starts the
    global node): ``input_size + depth_size == hidden_size`` (350 + 50 = 400 in the paper).
    """

    causal = False
    stateful = False
    repr_fields = ("num_layers", "depth_size", "window", "depth_mode", "depth_offset", "full_depth", "variant")
    #: Whether training also gathers the active words (True) or computes all and keeps the frozen ones.
    gather_in_training = True

    def __init__(
        self,
        input_size: int,
        hidden_size: int = 400,
        num_layers: int = 9,
        depth_size: int = 50,
        window: int = 1,
        depth_mode: str = "gumbel",
        temperature: float = 0.001,
        straight_through: bool = False,
        depth_offset: int = 1,
        full_depth: bool = False,
        variant: str = "official",
        dropout: float = 0.0,
        inner_dropout: float = 0.1,
    ) -> None:
        super().__init__(input_size, hidden_size)
        if depth_mode not in DEPTH_MODES:
            raise ValueError(f"depth_mode must be one of {DEPTH_MODES}, got {depth_mode!r}")
        if straight_through and depth_mode != "gumbel":
            raise ValueError("straight_through needs depth_mode='gumbel' (the Gumbel-softmax)")
        if depth_offset not in (0, 1):
            raise ValueError(f"depth_offset must be 0 (the code's depths 0..L-1) or 1 (1..L), got {depth_offset}")
        if num_layers < 1 or depth_size < 1 or temperature <= 0:
            got = f"{num_layers}, {depth_size}, {temperature}"
            raise ValueError(f"need num_layers >= 1, depth_size >= 1, temperature > 0; got {got}")
        if hidden_size % 2:
            raise ValueError(f"hidden_size must be even (a Bi-LSTM of hidden_size/2 each way), got {hidden_size}")
        if input_size + depth_size != hidden_size:
            raise ValueError(
                f"the S-LSTM input [e; δ] starts the global node: input_size + depth_size = {input_size + depth_size} "
                f"must equal hidden_size {hidden_size}"
            )
        self.num_layers, self.depth_size, self.window = num_layers, depth_size, window
        self.depth_mode, self.temperature, self.straight_through = depth_mode, temperature, straight_through
        self.depth_offset, self.full_depth, self.variant = depth_offset, full_depth, variant
        self.dropout = check_rate("dropout", dropout)
        self.inner_dropout = check_rate("inner_dropout", inner_dropout)
        self.sequential = build_encoder("lstm", input_size, hidden_size=hidden_size // 2, bidirectional=True)
        self.inner = nn.Linear(hidden_size, depth_size)  # W_1, b_1
        self.depth_embedding = nn.Parameter(torch.empty(num_layers, depth_size))  # E, also W_2
        self.restore = nn.Linear(depth_size, hidden_size, bias=False)  # W_3
        for weight in (self.inner.weight, self.depth_embedding, self.restore.weight):
            nn.init.xavier_uniform_(weight)
        nn.init.zeros_(self.inner.bias)
        positions = sinusoidal_positions(num_layers + 1, depth_size)[depth_offset : depth_offset + num_layers]
        self.register_buffer("depth_positions", positions, persistent=False)  # PE(j + offset) (L, d_e)
        self.cell = SentenceStateCell(input_size + depth_size, hidden_size, window, variant)
        self.last_depths: Tensor | None = None

    @property
    def global_size(self) -> int:
        return self.hidden_size

    def global_state(self, state: State) -> Tensor:
        """The sentence vector g (B, H) of a final state ``(g, c_g)``."""
        return state[0]

    def depth_logits(self, inner: Tensor) -> Tensor:
        """Depth logits ``m Eᵀ`` (B, T, L) of inner vectors m (B, T, d_e): W_2 tied to E (eq. 6)."""
        return inner @ self.depth_embedding.t()

    def select_depths(self, logits: Tensor) -> tuple[Tensor, Tensor | None]:
        """Selected depth index j (B, T) long in 0..L−1 (eqs. 8–11), and the straight-through
        one-hot weights (B, T, L) when they carry a gradient (else None)."""
        if self.depth_mode == "hard" or (self.depth_mode == "gumbel" and not self.training):
            return logits.argmax(-1), None  # eq. 8 (the softmax keeps the order); Gumbel-Max without noise
        log_p = torch.log_softmax(logits, dim=-1)  # eq. 7
        if self.depth_mode == "soft":  # eq. 9
            levels = torch.arange(self.num_layers, device=logits.device, dtype=log_p.dtype)
            index = (log_p.exp() * levels).sum(-1).floor().long().clamp(0, self.num_layers - 1)
            return index, None
        perturbed = log_p - torch.empty_like(log_p).exponential_().log()  # log p + γ, γ ~ Gumbel(0, 1) (eq. 10)
        index = perturbed.argmax(-1)
        if not self.straight_through:
            return index, None
        soft = torch.softmax(perturbed / self.temperature, dim=-1)  # eq. 11
        hard = F.one_hot(index, self.num_layers).to(soft.dtype)
        return index, hard - soft.detach() + soft  # one-hot forward, soft backward

    def sequential_rows(self, x: Tensor, mask: Tensor, rows: Tensor | None = None) -> Tensor:
        """The Bi-LSTM's outputs s (M, H) at the real words in ``mask.nonzero()`` order, over x (B, T, D)
        (eq. 5; its pads are not read), for inference; ``rows`` is ``x[mask]`` where the caller has it.

        On the CPU the input projection of both directions is one product at the real words and the
        recurrence one call of :func:`~seqzoo.kernels.lstm_recurrence.lstm_recurrence` (no step over a
        pad, no dispatch per step). Off the CPU, or where the kernel cannot load (said once),
        :attr:`sequential` as it is (packed)."""
        fallback = "DA-GRN's Bi-LSTM falls back to the packed torch.nn.LSTM"
        if not kernel_serves(x, lstm_recurrence_available, fallback):
            return self.sequential(x, mask)[0][mask]
        weights = self.sequential.rnn.all_weights  # per direction: W_ih, W_hh, b_ih, b_hh
        w_ih, bias = torch.cat([w[0] for w in weights]), torch.cat([w[2] + w[3] for w in weights])
        rows = x[mask] if rows is None else rows  # (M, D)
        gates = F.linear(rows, w_ih, bias).view(-1, 2, 2 * self.hidden_size)  # (M, 2, 4·H/2)
        return lstm_recurrence(gates, torch.stack([w[1] for w in weights]), mask.sum(1)).flatten(1)  # (M, H)

    def depths(self, s: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """From the Bi-LSTM's outputs s (..., H): the inner vectors m (..., d_e) (eq. 6), the selected depth
        index j (...) (eqs. 7–11) and the depth embedding δ (..., d_e) (eq. 12)."""
        # the code drops each direction's outputs, then the concatenation again
        s = F.dropout(F.dropout(s, self.dropout, self.training), self.dropout, self.training)
        inner = F.dropout(torch.tanh(self.inner(s)), self.inner_dropout, self.training)  # m, eq. 6
        index, mixing = self.select_depths(self.depth_logits(inner))
        table = self.depth_embedding + self.depth_positions  # E[j] + PE(j + offset) (L, d_e), eq. 12
        return inner, index, table[index] if mixing is None else mixing @ table

    def forward(self, x: Tensor, mask: Tensor | None = None, state: State = None) -> tuple[Tensor, State]:
        mask = self.check_input(x, mask)
        if state is not None:
            raise ValueError("DAGRN is not stateful (a whole-sequence encoder); pass state=None")
        recording = torch.jit.is_tracing() or torch.compiler.is_compiling()  # a graph must not bake in the lengths
        gather = self.gather_in_training or not self.training
        if gather and not torch.is_grad_enabled() and not recording:
            return self.forward_compact(x, mask)  # reads the real words only: pads need no zeroing
        x = zero_padding(x, mask)  # (B, T, D)
        real = mask.unsqueeze(-1)  # (B, T, 1)
        inner, index, depth = self.depths(self.sequential(x, mask)[0])  # (B, T, ·)
        updates = (index + self.depth_offset).masked_fill(~mask, 0)  # d (B, T)
        self.last_depths = updates.detach()
        words = torch.cat([x, depth], dim=-1) * real  # x_i = [e_i; δ_i] (B, T, H), eq. 13
        start = self.restore(inner) * real  # h⁰ = c⁰ = W_3 m (B, T, H)
        count = mask.sum(1, keepdim=True).clamp(min=1).to(x.dtype)
        glob = words.sum(1) / count  # g⁰ = c_g⁰ (B, H), a masked mean
        x_cell = words if self.variant == "official" else None
        h, _, g, c_g = self.cell.run(
            self.cell.project_input(words, mask),
            x_cell,
            mask,
            (start, start, glob, glob),
            self.num_layers,
            updates=None if self.full_depth else updates,
            gather=gather,
        )  # eq. 14
        return F.dropout(h, self.dropout, self.training), (g, c_g)

    def forward_compact(self, x: Tensor, mask: Tensor) -> tuple[Tensor, State]:
        """:meth:`forward` without autograd, at the real words only: the Bi-LSTM, the depth predictor, the
        input projection and the S-LSTM stack see (M, ·) rows, laid out once, deepest first
        (:meth:`SentenceStateCell.layout`, :meth:`SentenceStateCell.run_compact`); h is spread over the
        padded batch at the end."""
        x_rows = x[mask]  # (M, D) in mask.nonzero() order
        inner, index, depth = self.depths(self.sequential_rows(x, mask, x_rows))  # (M, d_e), (M,), (M, d_e)
        updates = index + self.depth_offset  # d (M,)
        self.last_depths = torch.zeros_like(mask, dtype=torch.long).masked_scatter_(mask, updates)
        steps = self.num_layers
        layout = self.cell.layout(mask, torch.full_like(updates, steps) if self.full_depth else updates, steps)
        words = torch.cat([x_rows, depth], dim=-1).index_select(0, layout.order)  # x_i = [e_i; δ_i] (M, H), eq. 13
        inner = inner.index_select(0, layout.order)  # m (M, d_e)
        start = self.restore(inner)  # h⁰ = c⁰ = W_3 m (M, H)
        count = layout.lengths.clamp(min=1).unsqueeze(1).to(x.dtype)  # (B, 1)
        glob = words.new_zeros(len(count), self.hidden_size).index_add_(0, layout.sentence, words) / count  # g⁰ = c_g⁰
        x_cell = words if self.variant == "official" else None
        state, low_rank = (start, start, glob, glob), (inner, self.restore.weight)  # h⁰ of rank d_e
        h, _, g, c_g = self.cell.run_compact(self.cell.input(words), x_cell, state, layout, low_rank)
        return F.dropout(layout.padded(h), self.dropout, self.training), (g, c_g)
