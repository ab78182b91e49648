"""Linear-chain conditional random field over an encoder's per-token scores.

Lafferty, McCallum & Pereira (2001), "Conditional Random Fields: Probabilistic Models for
Segmenting and Labeling Sequence Data"; the neural form (emissions from a BiLSTM, learned tag
transitions) of Lample et al. (2016), "Neural Architectures for Named Entity Recognition", and
Huang, Xu & Yu (2015), "Bidirectional LSTM-CRF Models for Sequence Tagging".

A tag path y_0..y_{L-1} of a sentence of length L scores (Lample et al. eq. 1, with start and end)

    s(y) = start[y_0] + sum_t e_t[y_t] + sum_{t>=1} A[y_{t-1}, y_t] + end[y_{L-1}]

and p(y | x) = exp(s(y)) / Z with Z = sum_y' exp(s(y')) (eq. 2). Rows are right-padded (mask
True = real token). A row without a real token has the empty path: log-likelihood 0, log Z 0,
decoded as all -1 and zero marginals.

Three paths compute log Z: :func:`log_partition_reference`, the per-step ``logsumexp`` forward
algorithm through autograd (the oracle), and two fast paths, each a scaled forward-backward in exp
space whose gradient is the exact closed form (marginals for the emissions, pair marginals for A).
On the CPU (float32/float64) with up to :data:`_COMPILED_MAX_TAGS` tags that is one call of a C
kernel per batch for the forward and one for the backward (:mod:`seqzoo.kernels.crf_forward`: per row
a vector-matrix product with exp(A) per step, rows over threads), which also serves
:meth:`CRF.marginals`: with few tags it saves the per-step dispatch of batched operations. With more
tags, on other devices and where the kernel cannot load, :class:`_Lattice`: one batched product per
step, rows sorted by length so each step touches only the rows still running; with hundreds of tags
its BLAS products, which read exp(A) once for all rows, cost less than the kernel's per-row ones.
Where the exp-space recursion would lose precision (a step's mass under sqrt(tiny), possible only with
scores more than ~40 nats apart in float32) both fall back to the reference, as does a backward with
``create_graph=True`` (a differentiable gradient).

Viterbi decoding (:func:`viterbi`; :func:`viterbi_reference` is its oracle) runs on the CPU in one
call of a C kernel (:mod:`seqzoo.kernels.crf_viterbi`: per row, the max-plus recursion and the
backtrace, rows over threads). :func:`viterbi_batched`, the path for other devices, is a max-plus
step per position in batched tensor operations and a backtrace by gather over the stacked argmax
tensor; with many tags a step first tries the best-scoring few previous tags and checks a bound that
proves the result exact, else it takes the full K x K step.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from torch import Tensor, nn

from seqzoo.data.tags import allowed_transitions
from seqzoo.encoders.base import check_mask
from seqzoo.kernels._loader import kernel_serves
from seqzoo.kernels.crf_forward import (
    compiled_partition_available,
    log_partition_backward_compiled,
    log_partition_compiled,
)
from seqzoo.kernels.crf_viterbi import compiled_viterbi_available, viterbi_compiled

__all__ = [
    "CRF",
    "DISALLOWED",
    "REDUCTIONS",
    "log_partition",
    "log_partition_reference",
    "path_score",
    "viterbi",
    "viterbi_batched",
    "viterbi_kbest",
    "viterbi_reference",
]

REDUCTIONS = ("none", "sum", "mean", "token_mean")
DISALLOWED = -10000.0  # score of a transition a tag scheme forbids: finite, so gradients stay finite
_PRUNE_CANDIDATES = 6  # from 4 times as many tags on, Viterbi tries the best 6 previous tags first
_COMPILED_MAX_TAGS = 128  # log Z by the C kernel up to this many tags, by _Lattice above (module docstring)


class CRF(nn.Module):
    """A linear-chain CRF over ``num_tags`` tags (pytorch-crf's parameter names and reductions).

    ``constraints``: a tag scheme (``"IOB1"``, ``"IOB2"``/``"BIO"``, ``"IOBES"``/``"BILOU"``) and
    ``tags``, the tag names by index: transitions the scheme forbids (``I-X`` after ``O`` in IOB2,
    ...) then score :data:`DISALLOWED` in training and decoding alike, whatever the learned values.
    """

    def __init__(self, num_tags: int, constraints: str | None = None, tags: Sequence[str] | None = None) -> None:
        super().__init__()
        if num_tags < 1:
            raise ValueError(f"num_tags must be >= 1, got {num_tags}")
        self.num_tags = num_tags
        self.constraints = constraints
        self.start_transitions = nn.Parameter(torch.empty(num_tags))
        self.end_transitions = nn.Parameter(torch.empty(num_tags))
        self.transitions = nn.Parameter(torch.empty(num_tags, num_tags))  # [from, to]
        between = torch.ones(num_tags, num_tags, dtype=torch.bool)
        start = end = torch.ones(num_tags, dtype=torch.bool)
        if constraints is not None:
            if tags is None or len(tags) != num_tags:
                raise ValueError(f"constraints={constraints!r} needs the names of the {num_tags} tags (tags=...)")
            allowed = allowed_transitions(constraints, tags)
            between, start, end = (torch.tensor(a, dtype=torch.bool) for a in allowed)
        elif tags is not None:
            raise ValueError("tags are only read with constraints=<scheme>")
        self.register_buffer("allowed", between, persistent=False)
        self.register_buffer("allowed_start", start, persistent=False)
        self.register_buffer("allowed_end", end, persistent=False)
        self.reset_parameters()

    def reset_parameters(self) -> None:
        for p in (self.start_transitions, self.end_transitions, self.transitions):
            nn.init.uniform_(p, -0.1, 0.1)

    def extra_repr(self) -> str:
        return f"num_tags={self.num_tags}" + (f", constraints={self.constraints!r}" if self.constraints else "")

    def scores(self, dtype: torch.dtype) -> tuple[Tensor, Tensor, Tensor]:
        """(start (K,), transitions (K, K), end (K,)) in ``dtype``, with the forbidden ones at :data:`DISALLOWED`."""
        start, trans, end = (p.to(dtype) for p in (self.start_transitions, self.transitions, self.end_transitions))
        if self.constraints is None:
            return start, trans, end
        return (
            start.masked_fill(~self.allowed_start, DISALLOWED),
            trans.masked_fill(~self.allowed, DISALLOWED),
            end.masked_fill(~self.allowed_end, DISALLOWED),
        )

    def _inputs(self, emissions: Tensor, mask: Tensor | None) -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor]:
        """Checked float (at least float32, autocast off) emissions, mask and the three score tensors."""
        mask = check_mask(emissions, mask)
        if emissions.shape[-1] != self.num_tags:
            raise ValueError(f"emissions have {emissions.shape[-1]} tags, the CRF has {self.num_tags}")
        dtype = torch.promote_types(emissions.dtype, torch.float32)
        emissions = emissions.to(dtype).masked_fill(~mask.unsqueeze(2), 0.0)  # pads may hold anything, NaN too
        return (emissions, mask, *self.scores(dtype))

    def forward(self, emissions: Tensor, tags: Tensor, mask: Tensor | None = None, reduction: str = "none") -> Tensor:
        """log p(tags | emissions): emissions (B, T, K), tags (B, T) int (pads: any value), mask (B, T)
        -> (B,) for ``reduction="none"``, else its sum, mean over rows or mean over real tokens
        (``"token_mean"``). Computed in float32 (or float64) even under autocast."""
        if reduction not in REDUCTIONS:
            raise ValueError(f"reduction must be one of {', '.join(REDUCTIONS)}, got {reduction!r}")
        if tags.shape != emissions.shape[:2]:
            raise ValueError(f"tags shape {tuple(tags.shape)} does not match emissions {tuple(emissions.shape[:2])}")
        with torch.autocast(emissions.device.type, enabled=False):
            emissions, mask, start, trans, end = self._inputs(emissions, mask)
            llh = path_score(emissions, tags, mask, start, trans, end) - log_partition(
                emissions, mask, start, trans, end
            )  # (B,)
        if reduction == "sum":
            return llh.sum()
        if reduction == "mean":
            return llh.mean()
        if reduction == "token_mean":
            return llh.sum() / mask.sum().clamp(min=1)
        return llh

    def log_partition(self, emissions: Tensor, mask: Tensor | None = None) -> Tensor:
        """log Z (B,) of every row (float32 or float64, even under autocast)."""
        with torch.autocast(emissions.device.type, enabled=False):
            return log_partition(*self._inputs(emissions, mask))

    @torch.no_grad()
    def decode(self, emissions: Tensor, mask: Tensor | None = None) -> Tensor:
        """The best tag paths by Viterbi: (B, T) int64, -1 at pads."""
        with torch.autocast(emissions.device.type, enabled=False):
            return viterbi(*self._inputs(emissions, mask))[0]

    @torch.no_grad()
    def decode_kbest(self, emissions: Tensor, mask: Tensor | None = None, k: int = 2) -> tuple[Tensor, Tensor]:
        """The ``k`` best paths per row, best first: paths (B, k, T) int64 (-1 at pads) and their scores
        s(y) (B, k). A row with fewer than ``k`` paths fills the rest with -1 paths of score -inf."""
        if k < 1:
            raise ValueError(f"k must be >= 1, got {k}")
        with torch.autocast(emissions.device.type, enabled=False):
            return viterbi_kbest(*self._inputs(emissions, mask), k)

    @torch.no_grad()
    def marginals(self, emissions: Tensor, mask: Tensor | None = None) -> Tensor:
        """p(y_t = j | x) (B, T, K) by forward-backward: sums to 1 at real positions, 0 at pads."""
        with torch.autocast(emissions.device.type, enabled=False):
            emissions, mask, start, trans, end = self._inputs(emissions, mask)
            probs = _fast_marginals(emissions, mask, start, trans, end)
            if probs is not None:
                return probs
            with torch.enable_grad():
                leaf = emissions.detach().requires_grad_(True)
                (grad,) = torch.autograd.grad(log_partition_reference(leaf, mask, start, trans, end).sum(), leaf)
            return grad  # d log Z / d e_t[j] = p(y_t = j | x)


def path_score(emissions: Tensor, tags: Tensor, mask: Tensor, start: Tensor, trans: Tensor, end: Tensor) -> Tensor:
    """s(y) (B,) of the given paths (rows without a real token: 0)."""
    tags = tags.masked_fill(~mask, 0).long()  # (B, T), pads may hold anything (-1, ignore indices)
    lengths = mask.sum(1)  # (B,)
    real = mask.to(emissions.dtype)
    score = (emissions.gather(2, tags.unsqueeze(2)).squeeze(2) * real).sum(1)  # sum_t e_t[y_t]
    pairs = tags[:, :-1] * trans.shape[1] + tags[:, 1:]  # (B, T-1) flat index of A[y_{t-1}, y_t]
    score = score + (trans.reshape(-1).gather(0, pairs.reshape(-1)).view_as(pairs) * real[:, 1:]).sum(1)
    last = tags.gather(1, (lengths - 1).clamp(min=0).unsqueeze(1)).squeeze(1)  # (B,)
    ends = start.gather(0, tags[:, 0]) + end.gather(0, last)  # (B,)
    return torch.where(lengths > 0, score + ends, 0.0)


def log_partition_reference(emissions: Tensor, mask: Tensor, start: Tensor, trans: Tensor, end: Tensor) -> Tensor:
    """log Z (B,) by the forward algorithm, alpha_t[j] = logsumexp_i(alpha_{t-1}[i] + A[i, j]) + e_t[j]."""
    alpha = start + emissions[:, 0]  # (B, K)
    for t in range(1, emissions.shape[1]):
        step = torch.logsumexp(alpha.unsqueeze(2) + trans, dim=1) + emissions[:, t]  # (B, K)
        alpha = torch.where(mask[:, t : t + 1], step, alpha)
    return torch.where(mask[:, 0], torch.logsumexp(alpha + end, dim=1), 0.0)


def viterbi_reference(emissions: Tensor, mask: Tensor, start: Tensor, trans: Tensor, end: Tensor) -> Tensor:
    """The best paths (B, T) (-1 at pads) by the plain max-plus recursion and a per-row backtrace."""
    batch, seq_len, _ = emissions.shape
    paths = torch.full((batch, seq_len), -1, dtype=torch.long)
    for b in range(batch):
        length = int(mask[b].sum())
        if length == 0:
            continue
        delta, back = start + emissions[b, 0], []
        for t in range(1, length):
            delta, arg = (delta.unsqueeze(1) + trans).max(0)
            delta = delta + emissions[b, t]
            back.append(arg)
        best = [int((delta + end).argmax())]
        for arg in reversed(back):
            best.append(int(arg[best[-1]]))
        paths[b, :length] = torch.tensor(best[::-1])
    return paths.to(emissions.device)


def _use_compiled(emissions: Tensor) -> bool:
    """Whether log Z of these emissions takes the C kernel (up to :data:`_COMPILED_MAX_TAGS` tags)."""
    fallback = "the CRF log partition falls back to the slower PyTorch forward-backward"
    small = emissions.shape[2] <= _COMPILED_MAX_TAGS
    return small and kernel_serves(emissions, compiled_partition_available, fallback)


def log_partition(emissions: Tensor, mask: Tensor, start: Tensor, trans: Tensor, end: Tensor) -> Tensor:
    """log Z (B,): a scaled exp-space forward with its closed-form gradient (the C kernel on the CPU up to
    :data:`_COMPILED_MAX_TAGS` tags, else :class:`_Lattice`), or the reference where precision would be lost."""
    if _use_compiled(emissions):
        return _CompiledLogPartition.apply(emissions, start, trans, end, mask)
    lattice = _Lattice.build(emissions.detach(), mask, start.detach(), trans.detach(), end.detach())
    if lattice is None:
        return log_partition_reference(emissions, mask, start, trans, end)
    return _LogPartition.apply(emissions, start, trans, end, lattice)


def _reference_gradients(inputs: Sequence[Tensor], mask: Tensor, grad: Tensor, needs: Sequence[bool]) -> tuple:
    """d(grad . log Z) / d(emissions, start, trans, end) by differentiating :func:`log_partition_reference`
    (None where ``needs`` says no gradient is wanted). Under ``create_graph=True`` (grad mode on in the
    backward) ``inputs`` are the graph's saved tensors and the gradients are differentiable in turn."""
    create_graph = torch.is_grad_enabled()
    with torch.enable_grad():
        leaves = [x if create_graph else x.detach().requires_grad_(need) for x, need in zip(inputs, needs, strict=True)]
        log_z = log_partition_reference(leaves[0], mask, *leaves[1:])
        wanted = [x for x, need in zip(leaves, needs, strict=True) if need]
        got = iter(torch.autograd.grad(log_z, wanted, grad, create_graph=create_graph))
    return tuple(next(got) if need else None for need in needs)


class _CompiledLogPartition(torch.autograd.Function):
    """log Z by the C kernel's forward, its gradient by the kernel's backward (marginals and pair marginals);
    the reference where exp space would lose precision, and under ``create_graph=True``."""

    @staticmethod
    def forward(ctx: Any, emissions: Tensor, start: Tensor, trans: Tensor, end: Tensor, mask: Tensor) -> Tensor:
        ctx.save_for_backward(emissions, start, trans, end)
        ctx.mask, ctx.lengths = mask, mask.sum(1)  # (B,)
        result = log_partition_compiled(emissions, ctx.lengths, start, trans, end)
        if result is None:
            ctx.saved = None
            return log_partition_reference(emissions, mask, start, trans, end)
        log_z, ctx.saved = result
        return log_z

    @staticmethod
    def backward(ctx: Any, grad: Tensor) -> tuple[Tensor | None, ...]:
        inputs = ctx.saved_tensors
        grads = None
        if ctx.saved is not None and not torch.is_grad_enabled():
            detached = [x.detach() for x in inputs]
            grads = log_partition_backward_compiled(detached[0], ctx.lengths, *detached[1:], ctx.saved, grad)
        if grads is None:
            grads = _reference_gradients(inputs, ctx.mask, grad, ctx.needs_input_grad[:4])
        return (*grads, None)


class _LogPartition(torch.autograd.Function):
    """log Z with the gradient of forward-backward: dlogZ/de_t[j] = p_t(j), dlogZ/dA[i,j] = sum_t p_t(i, j)."""

    @staticmethod
    def forward(ctx: Any, emissions: Tensor, start: Tensor, trans: Tensor, end: Tensor, lattice: _Lattice) -> Tensor:
        ctx.lattice = lattice
        ctx.save_for_backward(emissions, start, trans, end)
        return lattice.log_z

    @staticmethod
    def backward(ctx: Any, grad: Tensor) -> tuple[Tensor | None, ...]:
        grads = None if torch.is_grad_enabled() else ctx.lattice.gradients(grad)
        if grads is None:  # lost precision, or create_graph=True: differentiate the reference
            grads = _reference_gradients(ctx.saved_tensors, ctx.lattice.mask, grad, ctx.needs_input_grad[:4])
        return (*grads, None)


def _fast_marginals(emissions: Tensor, mask: Tensor, start: Tensor, trans: Tensor, end: Tensor) -> Tensor | None:
    """p(y_t = j | x) (B, T, K), 0 at pads, by the fast path :func:`log_partition` takes (its gradient with
    respect to the emissions), or None where exp space would lose precision."""
    if _use_compiled(emissions):
        lengths = mask.sum(1)  # (B,)
        result = log_partition_compiled(emissions, lengths, start, trans, end)
        if result is None:
            return None
        ones = torch.ones_like(result[0])  # (B,): the gradient of log Z w.r.t. the emissions is p_t
        grads = log_partition_backward_compiled(emissions, lengths, start, trans, end, result[1], ones)
        return None if grads is None else grads[0]
    lattice = _Lattice.build(emissions, mask, start, trans, end)
    return None if lattice is None else lattice.marginals()


def _by_length(mask: Tensor) -> tuple[Tensor, Tensor, Tensor, list[int]]:
    """Rows sorted by length, longest first: the order (B,), its inverse (B,), the sorted lengths (B,)
    and, per time step t, how many rows are still running (a prefix of the sorted rows).

    Rows move with index_select, never with advanced indexing (which may wake the thread team
    however small the tensor, see :func:`_max_last`)."""
    lengths = mask.sum(1)  # (B,)
    order = torch.argsort(lengths, descending=True, stable=True)
    inverse = torch.empty_like(order).scatter_(0, order, torch.arange(len(order), device=order.device))
    lengths = lengths.index_select(0, order)
    running = (lengths.unsqueeze(0) > torch.arange(mask.shape[1], device=mask.device).unsqueeze(1)).sum(1)  # (T,)
    return order, inverse, lengths, running.tolist()


def _prefix(steps: Sequence[Tensor] | Tensor, t: int, rows: int, batch: int) -> Tensor:
    """Step ``t`` of a time-first buffer limited to its first ``rows`` rows (the rows still running)."""
    step = steps[t]
    return step if rows == batch else step[:rows]


_SMALL_PRODUCT = 32768  # ATen's grain size: element-wise work under it runs on one thread


def _vec_mat(x: Tensor, matrix_t: Tensor, out: Tensor, scratch: Tensor | None) -> None:
    """out = x @ M for x (rows, K) and ``matrix_t`` = M^T, contiguous (K, K).

    With a (B, K, K) ``scratch`` (batches under :data:`_SMALL_PRODUCT` elements) the product is an
    element-wise product and a sum over the innermost dimension, which run on one thread: torch.mm
    may wake a BLAS thread team even for a tiny product, which costs far more than the product on a
    loaded machine. Without one, torch.mm.
    """
    if scratch is None:
        torch.mm(x, matrix_t.t(), out=out)
        return
    products = scratch[: x.shape[0]]
    torch.mul(x.unsqueeze(1), matrix_t, out=products)  # (rows, K, K): [b, j, i] = x[b, i] M[i, j]
    torch.sum(products, 2, out=out)


class _Lattice:
    """The scaled forward pass of one batch (rows sorted by length, time first), kept for the backward.

    alpha_t = scale_t * a_t with a_t summing to 1: a_t = (a_{t-1} @ exp(A - maxA)) * w_t / n_t with
    w_t = exp(e_t - max_j e_t[j]) and n_t the sum that normalises it, so log Z adds up the log n_t.
    """

    def __init__(self, emissions: Tensor, mask: Tensor, start: Tensor, trans: Tensor, end: Tensor) -> None:
        self.mask = mask
        self.order, self.inverse, self.lengths, self.running = _by_length(mask)
        seq_len, batch, tags = emissions.shape[1], emissions.shape[0], emissions.shape[2]
        e = emissions.transpose(0, 1).index_select(1, self.order)  # (T, B, K)
        e_max = e.amax(2, keepdim=True)  # (T, B, 1)
        self.w = torch.exp(e - e_max)  # (T, B, K)
        trans_max = trans.max()
        self.exp_trans = torch.exp(trans - trans_max)  # (K, K)
        self.exp_trans_t = self.exp_trans.t().contiguous()
        self.scratch = e.new_empty(batch, tags, tags) if batch * tags * tags < _SMALL_PRODUCT else None
        self.alpha = a = torch.zeros(seq_len, batch, tags, dtype=e.dtype, device=e.device)  # a_t, 0 at pads
        self.norm = n = torch.ones(seq_len, batch, 1, dtype=e.dtype, device=e.device)  # n_t, 1 at pads
        start_max = start.max()
        a0, n0 = _prefix(a, 0, self.running[0], batch), _prefix(n, 0, self.running[0], batch)
        torch.mul(_prefix(self.w, 0, self.running[0], batch), torch.exp(start - start_max), out=a0)
        torch.sum(a0, 1, keepdim=True, out=n0)
        a0.div_(n0)
        steps_a, steps_w, steps_n = a.unbind(0), self.w.unbind(0), n.unbind(0)
        for t in range(1, seq_len):
            rows = self.running[t]
            if rows == 0:
                break
            cur, norm = _prefix(steps_a, t, rows, batch), _prefix(steps_n, t, rows, batch)
            _vec_mat(_prefix(steps_a, t - 1, rows, batch), self.exp_trans_t, cur, self.scratch)  # (rows, K)
            cur.mul_(_prefix(steps_w, t, rows, batch))
            torch.sum(cur, 1, keepdim=True, out=norm)
            cur.div_(norm)
        end_max = end.max()
        self.exp_end = torch.exp(end - end_max)  # (K,)
        has_tokens = self.lengths > 0
        last = (self.lengths - 1).clamp(min=0)
        self.last = last.view(1, batch, 1).expand(1, batch, tags)  # gathers step L-1 of each row
        self.final = a.gather(0, self.last).squeeze(0) @ self.exp_end  # (B,) sum_j a_{L-1}[j] exp(end_j)
        real = (torch.arange(seq_len, device=e.device).unsqueeze(1) < self.lengths).unsqueeze(2)  # (T, B, 1)
        self.real = real
        log_z = ((torch.log(n) + e_max) * real).sum((0, 2))  # (B,)
        log_z = log_z + (self.lengths - 1).clamp(min=0) * trans_max + start_max + end_max + torch.log(self.final)
        log_z = torch.where(has_tokens, log_z, 0.0)
        self.log_z = log_z.index_select(0, self.inverse)  # back in the batch's order
        tiny = torch.finfo(e.dtype).tiny ** 0.5
        self.precise = bool(
            ((n >= tiny) & (self.final >= tiny).view(1, batch, 1) | ~has_tokens.view(1, batch, 1)).all()
        )

    @classmethod
    def build(cls, emissions: Tensor, mask: Tensor, start: Tensor, trans: Tensor, end: Tensor) -> _Lattice | None:
        """The lattice of a batch, or None where the exp-space recursion would be imprecise."""
        with torch.no_grad():
            lattice = cls(emissions, mask, start, trans, end)
        return lattice if lattice.precise else None

    def _backward(self) -> tuple[Tensor, Tensor, Tensor] | None:
        """(marginals (T, B, K), r_t = w_t * b_t (T, B, K), S_t (T, B, 1)) in sorted order, or None
        where precision would be lost. b_t is beta_t normalised to sum 1; p_t = a_t * b_t / S_t."""
        seq_len, batch, _ = self.w.shape
        beta = torch.zeros_like(self.alpha)  # (T, B, K)
        beta.scatter_(
            0, self.last, self.exp_end.expand(1, batch, -1)
        )  # b_{L-1} = exp(end) (rows without tokens: unread)
        r = torch.zeros_like(self.alpha)
        sums = torch.ones_like(self.norm)  # (T, B, 1)
        steps_w, steps_beta, steps_r, steps_sums = self.w.unbind(0), beta.unbind(0), r.unbind(0), sums.unbind(0)
        for t in range(seq_len - 1, 0, -1):
            rows = self.running[t]
            if rows == 0:
                continue
            r_t, prev = _prefix(steps_r, t, rows, batch), _prefix(steps_beta, t - 1, rows, batch)
            torch.mul(_prefix(steps_w, t, rows, batch), _prefix(steps_beta, t, rows, batch), out=r_t)
            _vec_mat(r_t, self.exp_trans, prev, self.scratch)  # sum_j E[i, j] r_t[j]
            total = _prefix(steps_sums, t - 1, rows, batch)
            torch.sum(prev, 1, keepdim=True, out=total)
            prev.div_(total)
        probs = self.alpha * beta  # (T, B, K)
        s = probs.sum(2, keepdim=True).masked_fill(~self.real, 1.0)  # (T, B, 1)
        tiny = torch.finfo(probs.dtype).tiny ** 0.5
        if not bool(((sums >= tiny) & (s >= tiny)).all()):
            return None
        return probs.div_(s), r, s

    def _unsort(self, x: Tensor) -> Tensor:
        """(T, B, ...) in sorted order -> (B, T, ...) in the batch's order."""
        return x.index_select(1, self.inverse).transpose(0, 1)

    def marginals(self) -> Tensor | None:
        result = self._backward()
        return None if result is None else self._unsort(result[0]).contiguous()

    def gradients(self, grad: Tensor) -> tuple[Tensor, Tensor, Tensor, Tensor] | None:
        """d(sum_b grad_b log Z_b) / d(emissions, start, transitions, end), or None (precision)."""
        result = self._backward()
        if result is None:
            return None
        probs, r, s = result
        g = grad.index_select(0, self.order).view(1, -1, 1)  # (1, B, 1) sorted
        grad_emissions = self._unsort(probs * g)  # (B, T, K)
        grad_start = (probs[0] * g[0]).sum(0)  # (K,)
        grad_end = (probs.gather(0, self.last).squeeze(0) * g[0]).sum(0)  # (K,)
        # pair marginals sum_t p_t(i, j) = sum_t a_{t-1}[i] E[i, j] r_t[j] / (n_t S_t)
        weight = (r[1:] * (g / (self.norm[1:] * s[1:]))).reshape(-1, r.shape[2])  # ((T-1) B, K)
        pairs = self.alpha[:-1].reshape(-1, r.shape[2]).t() @ weight  # (K, K)
        return grad_emissions, grad_start, pairs * self.exp_trans, grad_end


def _max_last(x: Tensor) -> tuple[Tensor, Tensor]:
    """The max over the innermost dimension and the first index holding it, from ``amax`` and an
    equality test: torch.max and torch.argmax with a dimension may wake the thread team however
    small the tensor, which stalls a loaded machine; ``amax`` and element-wise work under the grain
    size run on one thread."""
    size = x.shape[-1]
    values = x.amax(-1, keepdim=True)
    reverse = torch.arange(size, 0, -1, dtype=x.dtype, device=x.device)  # size - index
    first = ((x == values) * reverse).amax(-1)  # size - the first index of the max
    return values.squeeze(-1), size - first.long()


def _max_plus(delta: Tensor, trans_t: Tensor, col_max: Tensor, out: tuple[Tensor, Tensor], scratch: Tensor) -> None:
    """max_i and argmax_i of delta[b, i] + A[i, j], written into ``out`` ((rows, K) each), from
    ``trans_t`` = A^T (contiguous), ``col_max`` = max_i A[i, j] and a (rows, K, K) ``scratch``; every
    reduction runs over the innermost dimension (:func:`_max_last`).

    With many tags (4 m <= K), first only the best m = ``_PRUNE_CANDIDATES`` previous tags: their
    best is exact where it is at least the m-th best delta + max_i A[i, j], a bound on every other
    tag's score; the rows where that fails take all K.
    """
    rows, tags = delta.shape
    m = _PRUNE_CANDIDATES
    if 4 * m > tags:
        torch.add(delta.unsqueeze(1), trans_t, out=scratch)  # (rows, K, K): [b, j, i] = delta[b, i] + A[i, j]
        best, arg = _max_last(scratch)  # (rows, K)
        out[0].copy_(best)
        out[1].copy_(arg)
        return
    top, index = delta.topk(m, dim=1)  # (rows, m), descending
    cand = torch.index_select(trans_t, 1, index.view(-1)).view(tags, rows, m) + top  # (K, rows, m)
    best, arg = _max_last(cand)  # (K, rows)
    out[0].copy_(best.t())
    torch.gather(index, 1, arg.t(), out=out[1])
    exact = (out[0] >= top[:, -1:] + col_max).all(1)  # (rows,)
    if not bool(exact.all()):
        redo = (~exact).nonzero().squeeze(1)  # the rows that need every previous tag
        best, arg = _max_last(delta.index_select(0, redo).unsqueeze(1) + trans_t)  # over (n, K, K)
        out[0].index_copy_(0, redo, best)
        out[1].index_copy_(0, redo, arg)


def viterbi(emissions: Tensor, mask: Tensor, start: Tensor, trans: Tensor, end: Tensor) -> tuple[Tensor, Tensor]:
    """Best paths (B, T) (-1 at pads) and their scores (B,) (rows without a real token: 0): the compiled
    kernel (:mod:`seqzoo.kernels.crf_viterbi`) for float32/float64 CPU tensors, else :func:`viterbi_batched`
    (with a warning when the kernel should have run but cannot load)."""
    if kernel_serves(emissions, compiled_viterbi_available, "CRF decoding falls back to the slower PyTorch Viterbi"):
        lengths = mask.sum(1)  # (B,)
        return viterbi_compiled(emissions.detach(), lengths, start.detach(), trans.detach(), end.detach())
    return viterbi_batched(emissions, mask, start, trans, end)


def viterbi_batched(
    emissions: Tensor, mask: Tensor, start: Tensor, trans: Tensor, end: Tensor
) -> tuple[Tensor, Tensor]:
    """:func:`viterbi` in batched PyTorch operations (any device): a max-plus step over the rows still
    running per position, and a backtrace by gather."""
    order, inverse, lengths, running = _by_length(mask)
    batch, seq_len, tags = emissions.shape
    e = emissions.transpose(0, 1).index_select(1, order)  # (T, B, K)
    back = torch.zeros(seq_len, batch, tags, dtype=torch.long, device=e.device)  # argmax_i per step
    delta = start + e[0]  # (B, K)
    best = torch.empty_like(delta)
    scratch = e.new_empty(batch, tags, tags)
    col_max, trans_t = trans.amax(0), trans.t().contiguous()  # (K,), (K, K)
    steps_e, steps_back = e.unbind(0), back.unbind(0)
    views_for = 0  # the rows the views below cover
    for t in range(1, seq_len):
        rows = running[t]
        if rows == 0:
            break
        if rows != views_for:
            delta_r, best_r, scratch_r, views_for = delta[:rows], best[:rows], scratch[:rows], rows
        _max_plus(delta_r, trans_t, col_max, (best_r, _prefix(steps_back, t, rows, batch)), scratch_r)
        torch.add(best_r, _prefix(steps_e, t, rows, batch), out=delta_r)
    score, last = _max_last(delta + end)  # (B,)
    paths = torch.zeros(seq_len, batch, 1, dtype=torch.long, device=e.device)  # rows not yet started: tag 0
    steps_path = paths.unbind(0)
    finished = [*running[1:], 0]  # rows [finished[t], running[t]) end at t
    for t in range(seq_len - 1, -1, -1):
        if finished[t] < running[t]:  # each row's backtrace starts at its last token
            steps_path[t][finished[t] : running[t], 0] = last[finished[t] : running[t]]
        if t > 0:
            torch.gather(steps_back[t], 1, steps_path[t], out=steps_path[t - 1])
    paths = paths.squeeze(2).masked_fill_(torch.arange(seq_len, device=e.device).unsqueeze(1) >= lengths, -1)
    return paths.index_select(1, inverse).t().contiguous(), torch.where(lengths > 0, score, 0.0).index_select(
        0, inverse
    )


def viterbi_kbest(
    emissions: Tensor, mask: Tensor, start: Tensor, trans: Tensor, end: Tensor, k: int
) -> tuple[Tensor, Tensor]:
    """The k best paths (B, k, T) (-1 at pads and for missing paths) and scores (B, k), best first.

    delta[b, j, r] is the r-th best score of a path ending in tag j; a step ranks the K k
    (previous tag, rank) pairs of every tag, keeps the k best and remembers their flat index i k + r.
    """
    batch, seq_len, tags = emissions.shape
    device = emissions.device
    delta = emissions.new_full((batch, tags, k), float("-inf"))  # (B, K, k); -inf: no such path
    delta[:, :, 0] = start + emissions[:, 0]
    trans_rep = trans.t().repeat_interleave(k, dim=1)  # (K, K k): [j, i k + r] = A[i, j]
    identity = torch.arange(tags, device=device).unsqueeze(1) * k + torch.arange(k, device=device)  # (K, k)
    back = []
    for t in range(1, seq_len):
        cand = delta.view(batch, 1, tags * k) + trans_rep  # (B, K, K k)
        best, arg = cand.topk(k, dim=2)  # (B, K, k), over the innermost dimension
        running = mask[:, t].view(batch, 1, 1)
        delta = torch.where(running, best + emissions[:, t].unsqueeze(2), delta)  # (B, K, k)
        back.append(torch.where(running, arg, identity).view(batch, tags * k))  # pads keep (tag, rank)
    scores, flat = (delta + end.view(1, tags, 1)).reshape(batch, tags * k).topk(k, dim=1)  # (B, k)
    tag, rank = flat // k, flat % k  # (B, k)
    paths = torch.empty(batch, k, seq_len, dtype=torch.long, device=device)
    for t in range(seq_len - 1, -1, -1):
        paths[:, :, t] = tag
        if t > 0:
            flat = back[t - 1].gather(1, tag * k + rank)  # (B, k): the previous (tag, rank)
            tag, rank = flat // k, flat % k
    missing = scores == float("-inf")
    paths.masked_fill_(~mask.unsqueeze(1) | missing.unsqueeze(2), -1)
    empty = torch.full_like(scores[0], float("-inf"))
    empty[0] = 0.0  # a row without a real token has one path, the empty one, of score 0
    return paths, torch.where(mask[:, :1], scores, empty)
