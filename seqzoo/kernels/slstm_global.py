"""The S-LSTM global node's step (MODELS.md 2.1, "Global node"), for inference.

    g, c_g = global_step(gates_g, forget_pre, cell, h, rows, lengths, c_g, mean_weight, mean_bias)            # C
    g, c_g = global_step_reference(gates_g, forget_pre, cell, h, rows, lengths, c_g, mean_weight, mean_bias)  # PyTorch

    gates_g      (B, 3H) ``[W_g g; W_o g; W_f g]`` of each sentence's global node g
    forget_pre   (M, H) ``U_f h_i + b_f`` of each word; cell, h (M, H) its cell and hidden state (any order)
    rows         (M,) int64 the rows of sentence 0's words, then of sentence 1's, ...
    lengths      (B,) int64 words per sentence, summing to M
    c_g          (B, H) the global node's cell
    mean_weight  (2H, H), mean_bias (2H,): ``[U_g; U_o]`` and ``[b_g; b_o]``, read on the mean h̄ of the words
    g, c_g       (B, H) each: the node's new state

With ``e_i = exp(σ(W_f g + U_f h_i + b_f))``, the global cell is ``(Σ_i e_i ⊙ c_i + e_g ⊙ c_g) / (Σ_i e_i + e_g)``,
the per-dimension softmax over the words and the node (:func:`global_combine`). The kernel makes one pass
over the words where PyTorch takes about ten operations over all of them, each sentence's sums kept in a
scratch row, then the node's gates in the same call (about ten more small operations in PyTorch); it is the
part of a depth-adaptive S-LSTM step that reads every word whatever its depth. No autograd: the S-LSTM's
inference path (:meth:`~seqzoo.encoders.slstm.SentenceStateCell.run_compact`) calls it on the CPU when
:func:`global_step_available`, and says so when it cannot load.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

from seqzoo.kernels._loader import DTYPE_CODE, CompiledKernel

__all__ = ["global_combine", "global_step", "global_step_available", "global_step_reference"]

_ABI_VERSION = 2  # slstm_global_abi_version() of the C source this wrapper calls
_KERNEL = CompiledKernel("slstm_global", _ABI_VERSION, slstm_global_step="i ppppppppp ll pp i")


def global_step_available() -> str | None:
    """None when the kernel is loaded, else why it is not."""
    return _KERNEL.unavailable()


def global_combine(
    gates_g: Tensor, from_mean: Tensor, weighted: Tensor, weights: Tensor, c_g: Tensor
) -> tuple[Tensor, Tensor]:
    """The node's new (g, c_g) (B, H) from ``gates_g`` (B, 3H) (see the module docstring), ``from_mean`` (B, 2H)
    ``[U_g h̄ + b_g; U_o h̄ + b_o]``, and the sums over each sentence's words ``weighted`` = Σ_i e_i ⊙ c_i
    and ``weights`` = Σ_i e_i (B, H); an empty sentence keeps its own cell."""
    on_g, out_g, _ = gates_g.chunk(3, dim=-1)  # W_g g, W_o g (B, H) each
    on_mean, out_mean = from_mean.chunk(2, dim=-1)
    gate_g = torch.sigmoid(on_g + on_mean)  # f̂_g (B, H)
    gate_o = torch.sigmoid(out_g + out_mean)  # o (B, H)
    exp_g = gate_g.exp()  # the gates lie in (0, 1): exp needs no shift
    c_g = (weighted + exp_g * c_g) / (weights + exp_g)  # (B, H)
    return gate_o * torch.tanh(c_g), c_g


def _checked(gates_g: Tensor, per_word: list[Tensor], rows: Tensor, lengths: Tensor, c_g: Tensor) -> None:
    """A ValueError unless the shapes agree (see the module docstring) and rows index the M words."""
    batch, hidden = c_g.shape
    words = rows.numel()
    if tuple(gates_g.shape) != (batch, 3 * hidden):
        raise ValueError(f"gates_g must be ({batch}, {3 * hidden}) for c_g ({batch}, {hidden})")
    if any(tuple(t.shape) != (words, hidden) for t in per_word):
        raise ValueError(f"forget_pre, cell and h must be ({words}, {hidden}) for rows ({words},)")
    if tuple(lengths.shape) != (batch,) or int(lengths.sum()) != words or bool((lengths < 0).any()):
        raise ValueError(f"lengths must be ({batch},), non-negative, summing to M = {words}; got {lengths.tolist()}")
    if words and not 0 <= int(rows.min()) <= int(rows.max()) < words:
        raise ValueError(f"rows must index the {words} words")


def global_step_reference(
    gates_g: Tensor,
    forget_pre: Tensor,
    cell: Tensor,
    h: Tensor,
    rows: Tensor,
    lengths: Tensor,
    c_g: Tensor,
    mean_weight: Tensor,
    mean_bias: Tensor,
    check: bool = True,
) -> tuple[Tensor, Tensor]:
    """The node's new ``(g, c_g)``, each (B, H); see the module docstring. ``check=False`` skips the checks of
    the arguments (a caller that built them so, once per step)."""
    if check:
        _checked(gates_g, [forget_pre, cell, h], rows, lengths, c_g)
    hidden = c_g.shape[1]
    sentence = torch.repeat_interleave(torch.arange(len(lengths), device=rows.device), lengths)  # (M,) of rows[k]
    forget_g = gates_g[:, 2 * hidden :]  # W_f g
    e = torch.sigmoid(forget_g.index_select(0, sentence) + forget_pre.index_select(0, rows)).exp()  # (M, H)

    def total(t: Tensor) -> Tensor:  # (M, H) -> (B, H)
        return torch.zeros_like(c_g).index_add_(0, sentence, t)

    h_mean = total(h.index_select(0, rows)) / lengths.clamp(min=1).unsqueeze(1).to(c_g.dtype)
    weighted, weights = total(e * cell.index_select(0, rows)), total(e)
    return global_combine(gates_g, F.linear(h_mean, mean_weight, mean_bias), weighted, weights, c_g)


def global_step(
    gates_g: Tensor,
    forget_pre: Tensor,
    cell: Tensor,
    h: Tensor,
    rows: Tensor,
    lengths: Tensor,
    c_g: Tensor,
    mean_weight: Tensor,
    mean_bias: Tensor,
    check: bool = True,
) -> tuple[Tensor, Tensor]:
    """:func:`global_step_reference` by the C kernel: float32/float64 CPU tensors, no autograd. ``check=False``
    skips the checks of shapes, dtypes, layouts and indices (out-of-range rows would read outside the tensors):
    for a caller that built them so, of one dtype, contiguous (``mean_weight`` the transpose of a contiguous
    (H, 2H) tensor, which the kernel reads) and with int64 indices."""
    lib = _KERNEL.loaded()
    if c_g.dtype not in DTYPE_CODE or c_g.device.type != "cpu":
        raise TypeError(f"the S-LSTM global kernel takes float32/float64 CPU tensors, got {c_g.dtype}")
    inputs = [gates_g, forget_pre, cell, h, rows, lengths, c_g, mean_weight.t(), mean_bias]  # the kernel reads Uᵀ
    if check:
        _checked(gates_g, [forget_pre, cell, h], rows, lengths, c_g)
        inputs = [t.to(c_g.dtype if t.is_floating_point() else torch.int64).contiguous() for t in inputs]
    batch, hidden = c_g.shape
    g_new, c_g_new = torch.empty_like(inputs[6]), torch.empty_like(inputs[6])
    status = lib.slstm_global_step(
        DTYPE_CODE[c_g.dtype], *(t.data_ptr() for t in inputs), batch, hidden, g_new.data_ptr(), c_g_new.data_ptr(),
        torch.get_num_threads(),
    )  # fmt: skip
    if status != 0:
        raise RuntimeError("slstm_global_step: could not allocate memory or join a worker thread")
    return g_new, c_g_new
