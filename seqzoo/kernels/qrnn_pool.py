"""QRNN pooling (Bradbury et al., ICLR 2017, eqs. 3-6): a PyTorch reference and fused fast paths.

All paths share one signature and one convention (the paper's: ``f`` multiplies the OLD state)::

    h, c_last = qrnn_pool(gates, lengths, c0, pooling="fo", keep=None, keep_prob=1.0, reverse=False)

    gates     (B, T, G, H) pre-activations in the order z, f, o, i; G = POOLINGS[pooling]
    lengths   (B,) int64 real tokens per row (right-padded); pads leave the state unchanged
    c0        (B, H) initial cell state, or None for zeros
    keep      (B, T, H) bool zoneout keep mask (training; False = zoned out, f = 1), or None
    keep_prob scale of 1 - f: 1.0, or 1 - p at evaluation (the expectation of the mask)
    reverse   run each row from its last real token back to its first (backward direction)
    h         (B, T, H) pooled outputs, zero at pads
    c_last    (B, H) cell state after the last real step (c0 for empty rows)

Backends: ``"compiled"`` (C kernel built at install time, loaded with ctypes; float32/float64 on
CPU), ``"triton"`` (CUDA tensors) and ``"reference"``. Both fast paths fuse the activations,
zoneout and the recurrence in one pass forward and one reverse-time pass backward. When a fast
path cannot run, :func:`qrnn_pool` warns and uses the reference; setting the environment variable
``SEQZOO_QRNN_BACKEND=reference`` selects the reference on purpose.
"""

from __future__ import annotations

import ctypes
import functools
import os
import sysconfig
import warnings
from pathlib import Path

import torch
from torch import Tensor

__all__ = ["POOLINGS", "pool_backend", "qrnn_pool", "qrnn_pool_compiled", "qrnn_pool_reference"]

#: Number of gate blocks per pooling type: z, f (, o (, i)).
POOLINGS = {"f": 2, "fo": 3, "ifo": 4}
_POOL_CODE = {"f": 0, "fo": 1, "ifo": 2}
_DTYPE_CODE = {torch.float32: 0, torch.float64: 1}


def qrnn_pool_reference(
    gates: Tensor,
    lengths: Tensor,
    c0: Tensor | None = None,
    *,
    pooling: str = "fo",
    keep: Tensor | None = None,
    keep_prob: float = 1.0,
    reverse: bool = False,
) -> tuple[Tensor, Tensor]:
    """Plain PyTorch pooling (see the module docstring for the signature); autograd does the backward."""
    batch, time, _, hidden = gates.shape
    z = torch.tanh(gates[:, :, 0])  # (B, T, H), eq. 1
    leak = (1 - torch.sigmoid(gates[:, :, 1])) * keep_prob  # 1 - f, (B, T, H)
    if keep is not None:
        leak = leak * keep  # eq. 6: zoned-out channels get f = 1 (no rescaling)
    decay = 1 - leak  # f after zoneout
    new = torch.sigmoid(gates[:, :, 3]) * z if pooling == "ifo" else leak * z  # eq. 5 / eqs. 3-4
    real = (torch.arange(time, device=gates.device) < lengths.unsqueeze(1)).unsqueeze(-1)  # (B, T, 1)
    if not bool(real.all()):
        decay = decay.masked_fill(~real, 1.0)  # pads keep the state
        new = new.masked_fill(~real, 0.0)
    c = gates.new_zeros(batch, hidden) if c0 is None else c0
    steps = list(zip(decay.unbind(1), new.unbind(1), strict=True))  # unbind: O(T) backward, unlike c[t]
    cells = []
    for decay_t, new_t in reversed(steps) if reverse else steps:
        c = torch.addcmul(new_t, decay_t, c)  # c_t = f_t * c_{t-1} + (1 - f_t) * z_t  (or + i_t * z_t)
        cells.append(c)
    if reverse:
        cells.reverse()
    h = torch.stack(cells, 1)  # (B, T, H)
    if pooling != "f":
        h = torch.sigmoid(gates[:, :, 2]) * h  # h_t = o_t * c_t
    return h.masked_fill(~real, 0.0), c


@functools.cache
def _compiled_library() -> ctypes.CDLL | str:
    """The compiled kernel, or the reason it is unavailable."""
    path = Path(__file__).with_name("_qrnn_pool" + sysconfig.get_config_var("EXT_SUFFIX"))
    try:
        lib = ctypes.CDLL(str(path))
    except OSError as err:
        return f"cannot load {path.name} ({err}); reinstall seqzoo with a C compiler to build it"
    ptr, i64, c_int, c_double = ctypes.c_void_p, ctypes.c_int64, ctypes.c_int, ctypes.c_double
    common = [c_int, ptr, ptr, ptr, ptr, c_double, i64, i64, i64, c_int, c_int]
    lib.qrnn_pool_forward.argtypes = [*common, ptr, ptr, ptr, c_int]
    lib.qrnn_pool_backward.argtypes = [*common, ptr, ptr, ptr, ptr, ptr, c_int]
    lib.qrnn_pool_forward.restype = lib.qrnn_pool_backward.restype = c_int
    return lib


def _ptr(t: Tensor | None) -> int | None:
    return None if t is None else t.data_ptr()


def _kernel_args(gates: Tensor, lengths: Tensor, c0: Tensor | None, keep: Tensor | None, keep_prob: float,
                 pooling: str, reverse: bool) -> tuple:
    """The arguments the forward and backward C functions share."""
    batch, time, _, hidden = gates.shape
    return (_DTYPE_CODE[gates.dtype], _ptr(gates), _ptr(lengths), _ptr(c0), _ptr(keep), keep_prob,
            batch, time, hidden, _POOL_CODE[pooling], int(reverse))


class _CompiledPool(torch.autograd.Function):
    """Fused forward and backward through the C kernel."""

    @staticmethod
    def forward(ctx, gates, lengths, c0, keep, keep_prob, pooling, reverse):
        lib = _compiled_library()
        batch, time, _, hidden = gates.shape
        h = gates.new_empty(batch, time, hidden)
        c_last = gates.new_empty(batch, hidden)
        needs_grad = ctx.needs_input_grad[0] or ctx.needs_input_grad[2]
        c_all = gates.new_empty(batch, time, hidden) if needs_grad else None  # saved for the backward
        args = _kernel_args(gates, lengths, c0, keep, keep_prob, pooling, reverse)
        if lib.qrnn_pool_forward(*args, _ptr(h), _ptr(c_all), _ptr(c_last), torch.get_num_threads()) != 0:
            raise RuntimeError("qrnn_pool_forward: could not start worker threads")
        ctx.config = (keep_prob, pooling, reverse)
        ctx.save_for_backward(gates, lengths, c0, keep, c_all)
        return h, c_last

    @staticmethod
    def backward(ctx, dh, dc_last):
        gates, lengths, c0, keep, c_all = ctx.saved_tensors
        dh, dc_last = dh.contiguous(), dc_last.contiguous()
        dgates = torch.empty_like(gates)
        dc0 = torch.empty_like(dc_last)
        args = _kernel_args(gates, lengths, c0, keep, *ctx.config)
        outs = (_ptr(c_all), _ptr(dh), _ptr(dc_last), _ptr(dgates), _ptr(dc0))
        status = _compiled_library().qrnn_pool_backward(*args, *outs, torch.get_num_threads())
        if status != 0:
            raise RuntimeError("qrnn_pool_backward: could not start worker threads")
        return dgates, None, dc0 if ctx.needs_input_grad[2] else None, None, None, None, None


def qrnn_pool_compiled(
    gates: Tensor,
    lengths: Tensor,
    c0: Tensor | None = None,
    *,
    pooling: str = "fo",
    keep: Tensor | None = None,
    keep_prob: float = 1.0,
    reverse: bool = False,
) -> tuple[Tensor, Tensor]:
    """The C kernel (CPU, float32/float64); raises RuntimeError where it is not available."""
    lib = _compiled_library()
    if isinstance(lib, str):
        raise RuntimeError(lib)
    if gates.is_cuda or gates.dtype not in _DTYPE_CODE:
        raise RuntimeError(f"the compiled pooling runs float32/float64 on CPU, got {gates.dtype} on {gates.device}")
    gates = gates.contiguous()
    lengths = lengths.to(torch.int64).contiguous()
    c0 = None if c0 is None else c0.to(gates.dtype).contiguous()
    keep = None if keep is None else keep.to(torch.uint8).contiguous()
    return _CompiledPool.apply(gates, lengths, c0, keep, float(keep_prob), pooling, reverse)


def pool_backend(device: torch.device | str = "cpu", dtype: torch.dtype = torch.float32) -> str:
    """Name of the backend :func:`qrnn_pool` uses for tensors of this device and dtype."""
    if os.environ.get("SEQZOO_QRNN_BACKEND", "auto") == "reference":
        return "reference"
    if torch.device(device).type == "cuda":
        from seqzoo.kernels.qrnn_pool_triton import triton_unavailable_reason

        return "reference" if triton_unavailable_reason() else "triton"
    if isinstance(_compiled_library(), str) or dtype not in _DTYPE_CODE:
        return "reference"
    return "compiled"


def _fallback_reason(gates: Tensor) -> str:
    if gates.is_cuda:
        from seqzoo.kernels.qrnn_pool_triton import triton_unavailable_reason

        return triton_unavailable_reason() or ""
    lib = _compiled_library()
    return lib if isinstance(lib, str) else f"the compiled kernel does not support {gates.dtype}"


def qrnn_pool(
    gates: Tensor,
    lengths: Tensor,
    c0: Tensor | None = None,
    *,
    pooling: str = "fo",
    keep: Tensor | None = None,
    keep_prob: float = 1.0,
    reverse: bool = False,
) -> tuple[Tensor, Tensor]:
    """QRNN pooling through the fastest available backend (see the module docstring)."""
    if pooling not in POOLINGS:
        raise ValueError(f"pooling must be one of {sorted(POOLINGS)}, got {pooling!r}")
    if gates.dim() != 4 or gates.shape[2] != POOLINGS[pooling]:
        raise ValueError(f"{pooling}-pooling needs gates (B, T, {POOLINGS[pooling]}, H), got {tuple(gates.shape)}")
    kwargs = {"pooling": pooling, "keep": keep, "keep_prob": keep_prob, "reverse": reverse}
    backend = pool_backend(gates.device, gates.dtype)
    if backend == "compiled":
        return qrnn_pool_compiled(gates, lengths, c0, **kwargs)
    if backend == "triton":
        from seqzoo.kernels.qrnn_pool_triton import qrnn_pool_triton

        return qrnn_pool_triton(gates, lengths, c0, **kwargs)
    if os.environ.get("SEQZOO_QRNN_BACKEND", "auto") != "reference":
        warnings.warn(
            f"seqzoo: fused QRNN pooling unavailable ({_fallback_reason(gates)}); using the slower PyTorch reference",
            RuntimeWarning,
            stacklevel=2,
        )
    return qrnn_pool_reference(gates, lengths, c0, **kwargs)
