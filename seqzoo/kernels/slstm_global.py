"""The sums over words that the S-LSTM global node's update reads (MODELS.md 2.1, "Global node"), for inference.

    weighted, weights, h_sum = global_sums(forget_g, forget_pre, cell, h, rows, lengths)             # C kernel
    weighted, weights, h_sum = global_sums_reference(forget_g, forget_pre, cell, h, rows, lengths)   # PyTorch

    forget_g    (B, H) ``W_f g`` of each sentence's global node
    forget_pre  (M, H) ``U_f h_i + b_f`` of each word; cell, h (M, H) its cell and hidden state (any order)
    rows        (M,) int64 the rows of sentence 0's words, then of sentence 1's, ...
    lengths     (B,) int64 words per sentence, summing to M
    weighted    (B, H) ``Σ_i e_i ⊙ c_i`` over each sentence's words, with ``e_i = exp(σ(W_f g + U_f h_i + b_f))``
    weights     (B, H) ``Σ_i e_i``; h_sum (B, H) ``Σ_i h_i`` (for the mean h̄)

The global cell is then ``(weighted + e_g ⊙ c_g) / (weights + e_g)``: the per-dimension softmax over the
words and the global node (:meth:`~seqzoo.encoders.slstm.SentenceStateCell.global_update`). The kernel
makes one pass over the words where PyTorch takes about ten operations over all of them, each sentence's
sums in registers (words given sentence by sentence, so that no sum is stored and reloaded); it is the part
of a depth-adaptive S-LSTM step that reads every word whatever its depth. No autograd: the S-LSTM's
inference path (:meth:`~seqzoo.encoders.slstm.SentenceStateCell.run_compact`) calls it on the CPU when
:func:`global_sums_available`, and says so when it cannot load.
"""

from __future__ import annotations

import torch
from torch import Tensor

from seqzoo.kernels._loader import DTYPE_CODE, CompiledKernel

__all__ = ["global_sums", "global_sums_available", "global_sums_reference"]

_ABI_VERSION = 1  # slstm_global_abi_version() of the C source this wrapper calls
_KERNEL = CompiledKernel("slstm_global", _ABI_VERSION, slstm_global_sums="i pppppp ll ppp i")


def global_sums_available() -> str | None:
    """None when the kernel is loaded, else why it is not."""
    return _KERNEL.unavailable()


def _checked(forget_g: Tensor, forget_pre: Tensor, cell: Tensor, h: Tensor, rows: Tensor, lengths: Tensor) -> None:
    """A ValueError unless the shapes agree (see the module docstring) and rows index the M words."""
    batch, hidden = forget_g.shape
    words = rows.numel()
    if any(tuple(t.shape) != (words, hidden) for t in (forget_pre, cell, h)):
        raise ValueError(f"forget_pre, cell and h must be ({words}, {hidden}) for rows ({words},)")
    if tuple(lengths.shape) != (batch,) or int(lengths.sum()) != words or bool((lengths < 0).any()):
        raise ValueError(f"lengths must be ({batch},), non-negative, summing to M = {words}; got {lengths.tolist()}")
    if words and not 0 <= int(rows.min()) <= int(rows.max()) < words:
        raise ValueError(f"rows must index the {words} words")


def global_sums_reference(
    forget_g: Tensor, forget_pre: Tensor, cell: Tensor, h: Tensor, rows: Tensor, lengths: Tensor, check: bool = True
) -> tuple[Tensor, Tensor, Tensor]:
    """``(Σ e_i c_i, Σ e_i, Σ h_i)`` per sentence, each (B, H); see the module docstring. ``check=False``
    skips the checks of the arguments (a caller that built them so, once per step)."""
    if check:
        _checked(forget_g, forget_pre, cell, h, rows, lengths)
    sentence = torch.repeat_interleave(torch.arange(len(lengths), device=rows.device), lengths)  # (M,) of rows[k]
    e = torch.sigmoid(forget_g.index_select(0, sentence) + forget_pre.index_select(0, rows)).exp()  # (M, H)

    def total(t: Tensor) -> Tensor:  # (M, H) -> (B, H)
        return torch.zeros_like(forget_g).index_add_(0, sentence, t)

    return total(e * cell.index_select(0, rows)), total(e), total(h.index_select(0, rows))


def global_sums(
    forget_g: Tensor, forget_pre: Tensor, cell: Tensor, h: Tensor, rows: Tensor, lengths: Tensor, check: bool = True
) -> tuple[Tensor, Tensor, Tensor]:
    """:func:`global_sums_reference` by the C kernel: float32/float64 CPU tensors, no autograd. ``check=False``
    skips the checks of shapes and indices (out-of-range rows would read outside the tensors): for a caller
    that built them so."""
    lib = _KERNEL.loaded()
    if forget_g.dtype not in DTYPE_CODE or forget_g.device.type != "cpu":
        raise TypeError(f"the S-LSTM global kernel takes float32/float64 CPU tensors, got {forget_g.dtype}")
    if check:
        _checked(forget_g, forget_pre, cell, h, rows, lengths)
    inputs = [t.detach().to(forget_g.dtype).contiguous() for t in (forget_g, forget_pre, cell, h)]
    rows, lengths = rows.to(torch.int64).contiguous(), lengths.to(torch.int64).contiguous()
    sums = [torch.empty_like(inputs[0]) for _ in range(3)]
    status = lib.slstm_global_sums(
        DTYPE_CODE[forget_g.dtype], *(t.data_ptr() for t in inputs), rows.data_ptr(), lengths.data_ptr(),
        len(lengths), forget_g.shape[1], *(t.data_ptr() for t in sums), torch.get_num_threads(),
    )  # fmt: skip
    if status != 0:
        raise RuntimeError("slstm_global_sums: could not allocate memory or join a worker thread")
    return sums[0], sums[1], sums[2]
