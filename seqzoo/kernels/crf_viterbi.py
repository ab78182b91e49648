"""Viterbi decoding of a linear-chain CRF by the compiled C kernel (``crf_viterbi.c``).

    paths, scores = viterbi_compiled(emissions, lengths, start, trans, end)

    emissions (B, T, K) float32 or float64, CPU; lengths (B,) int64 real tokens per row (right-padded)
    start, end (K,); trans (K, K), trans[i, j] scores tag i followed by tag j
    paths     (B, T) int64, the best path of every row, -1 at pads
    scores    (B,) its score s(y) (0 for a row without a real token)

One C call decodes the whole batch (rows split over threads when the batch is large enough to pay
for them), so a decode costs no per-step operator dispatch; the reference and the batched PyTorch
path (the GPU's) are in :mod:`seqzoo.heads.crf`, which picks this kernel for CPU tensors when
:func:`compiled_viterbi_available` and says so when it cannot.
"""

from __future__ import annotations

import torch
from torch import Tensor

from seqzoo.kernels._loader import DTYPE_CODE, CompiledKernel

__all__ = ["checked_inputs", "compiled_viterbi_available", "viterbi_compiled"]

_ABI_VERSION = 1  # crf_viterbi_abi_version() of the C source this wrapper calls
_KERNEL = CompiledKernel("crf_viterbi", _ABI_VERSION, crf_viterbi="i ppppp lll pp i")


def compiled_viterbi_available() -> str | None:
    """None when the kernel is loaded, else why it is not."""
    return _KERNEL.unavailable()


def checked_inputs(
    kernel: str, emissions: Tensor, lengths: Tensor, start: Tensor, trans: Tensor, end: Tensor
) -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor]:
    """The CRF kernels' inputs, checked and contiguous: emissions (B, T, K) float32/float64 on the CPU, lengths
    (B,) int64 in [0, T], start (K,), trans (K, K), end (K,) in the emissions' dtype."""
    batch, time, tags = emissions.shape
    dtype = emissions.dtype
    if dtype not in DTYPE_CODE or emissions.device.type != "cpu":
        raise TypeError(f"{kernel} takes float32/float64 CPU tensors, got {dtype} on {emissions.device}")
    if tuple(lengths.shape) != (batch,) or not bool(((lengths >= 0) & (lengths <= time)).all()):
        raise ValueError(f"lengths must be ({batch},) with values in [0, {time}], got {lengths.tolist()}")
    scores = [x.to(dtype).contiguous() for x in (start, trans, end)]
    if [tuple(x.shape) for x in scores] != [(tags,), (tags, tags), (tags,)]:
        raise ValueError(f"start, trans, end must be ({tags},), ({tags}, {tags}), ({tags},)")
    return (emissions.contiguous(), lengths.to(torch.int64).contiguous(), *scores)


def viterbi_compiled(
    emissions: Tensor, lengths: Tensor, start: Tensor, trans: Tensor, end: Tensor
) -> tuple[Tensor, Tensor]:
    """Best paths (B, T) (-1 at pads) and their scores (B,); see the module docstring."""
    lib = _KERNEL.loaded()
    inputs = checked_inputs("the compiled Viterbi", emissions, lengths, start, trans, end)
    batch, time, tags = emissions.shape
    paths = torch.empty(batch, time, dtype=torch.int64)
    scores = emissions.new_empty(batch)
    status = lib.crf_viterbi(
        DTYPE_CODE[emissions.dtype], *(x.data_ptr() for x in inputs), batch, time, tags,
        paths.data_ptr(), scores.data_ptr(), torch.get_num_threads(),
    )  # fmt: skip
    if status != 0:
        raise RuntimeError("crf_viterbi: could not start worker threads or allocate scratch memory")
    return paths, scores
