"""The log partition function of a linear-chain CRF and its gradient by the compiled C kernel (``crf_forward.c``).

    log_z, saved = log_partition_compiled(emissions, lengths, start, trans, end)
    grads = log_partition_backward_compiled(emissions, lengths, start, trans, end, saved, grad)

    emissions (B, T, K) float32 or float64, CPU; lengths (B,) int64 real tokens per row (right-padded)
    start, end (K,); trans (K, K), trans[i, j] scores tag i followed by tag j
    log_z     (B,) log Z of every row (0 for a row without a real token)
    saved     the scaled forward variables (a_t (B, T, K), n_t (B, T)) the backward reads
    grad      (B,) the incoming gradient of log_z
    grads     d(sum_b grad[b] log Z_b) / d(emissions (B, T, K), start (K,), trans (K, K), end (K,))

Each is one C call for the whole batch (rows over threads when the batch is large enough to pay for them):
the scaled forward-backward algorithm in exp space, one vector-matrix product per row and step. Either
returns None where exp space would lose precision (scores tens of nats apart in float32); the caller then
takes the log-space reference, ``log_partition_reference`` in :mod:`seqzoo.heads.crf`, which picks this
kernel for CPU tensors (up to its ``_COMPILED_MAX_TAGS`` tags) when :func:`compiled_partition_available`
and says so when it cannot.
"""

from __future__ import annotations

import torch
from torch import Tensor

from seqzoo.kernels._loader import DTYPE_CODE, CompiledKernel
from seqzoo.kernels.crf_viterbi import checked_inputs

__all__ = ["compiled_partition_available", "log_partition_backward_compiled", "log_partition_compiled"]

_ABI_VERSION = 1  # crf_forward_abi_version() of the C source this wrapper calls
_LOST_PRECISION = 2  # the kernels' status where a normaliser fell under sqrt(tiny)
_KERNEL = CompiledKernel(
    "crf_forward", _ABI_VERSION, crf_forward="i ppppp lll ppp i", crf_backward="i ppppp lll ppppppp i"
)


def compiled_partition_available() -> str | None:
    """None when the kernel is loaded, else why it is not."""
    return _KERNEL.unavailable()


def _succeeded(status: int, name: str) -> bool:
    """True on success, False where precision was lost; raises where memory or threads were lacking."""
    if status not in (0, _LOST_PRECISION):
        raise RuntimeError(f"{name}: could not start worker threads or allocate scratch memory")
    return status == 0


def log_partition_compiled(
    emissions: Tensor, lengths: Tensor, start: Tensor, trans: Tensor, end: Tensor
) -> tuple[Tensor, tuple[Tensor, Tensor]] | None:
    """log Z (B,) and the forward variables for the backward, or None (precision); see the module docstring."""
    lib = _KERNEL.loaded()
    inputs = checked_inputs("the compiled CRF forward", emissions, lengths, start, trans, end)
    batch, time, tags = emissions.shape
    log_z = inputs[0].new_empty(batch)
    alpha = inputs[0].new_empty(batch, time, tags)  # (B, T, K) a_t, written at real steps only
    norm = inputs[0].new_empty(batch, time)  # (B, T) n_t
    status = lib.crf_forward(
        DTYPE_CODE[emissions.dtype], *(x.data_ptr() for x in inputs), batch, time, tags,
        log_z.data_ptr(), alpha.data_ptr(), norm.data_ptr(), torch.get_num_threads(),
    )  # fmt: skip
    return (log_z, (alpha, norm)) if _succeeded(status, "crf_forward") else None


def log_partition_backward_compiled(
    emissions: Tensor,
    lengths: Tensor,
    start: Tensor,
    trans: Tensor,
    end: Tensor,
    saved: tuple[Tensor, Tensor],
    grad: Tensor,
) -> tuple[Tensor, Tensor, Tensor, Tensor] | None:
    """The gradients of sum_b grad[b] log Z_b w.r.t. emissions, start, trans, end, or None (precision)."""
    lib = _KERNEL.loaded()
    inputs = checked_inputs("the compiled CRF backward", emissions, lengths, start, trans, end)
    batch, time, tags = emissions.shape
    alpha, norm = saved
    if alpha.shape != emissions.shape or norm.shape != (batch, time) or grad.shape != (batch,):
        raise ValueError("saved must be log_partition_compiled's for these emissions and grad (B,)")
    grad = grad.to(emissions.dtype).contiguous()
    grads = (inputs[0].new_empty(batch, time, tags), *(x.new_empty(x.shape) for x in inputs[2:]))
    status = lib.crf_backward(
        DTYPE_CODE[emissions.dtype], *(x.data_ptr() for x in inputs), batch, time, tags,
        alpha.data_ptr(), norm.data_ptr(), grad.data_ptr(), *(g.data_ptr() for g in grads), torch.get_num_threads(),
    )  # fmt: skip
    return grads if _succeeded(status, "crf_backward") else None
