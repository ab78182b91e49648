"""QRNN pooling (Bradbury et al., ICLR 2017, eqs. 3-6): a PyTorch reference and fused fast paths.

All paths share one signature and one convention (the paper's: ``f`` multiplies the OLD state)::

    h, c_last = qrnn_pool(gates, lengths, c0, pooling="fo", keep=None, keep_prob=1.0, reverse=False)

    gates     (B, T, G, H) pre-activations in the order z, f, o, i; G = POOLINGS[pooling]
    lengths   (B,) int64 real tokens per row (right-padded); pads leave the state unchanged
    c0        (B, H) initial cell state in the gates' dtype (float32 for half gates), or None for zeros
    keep      (B, T, H) bool zoneout keep mask (training; False = zoned out: f = 1, and i = 0 with
              ifo-pooling, so the channel keeps its state), or None
    keep_prob scale of 1 - f (and of i): 1.0, or 1 - p at evaluation (the expectation of the mask)
    reverse   run each row from its last real token back to its first (backward direction)
    h         (B, T, H) pooled outputs, zero at pads
    c_last    (B, H) cell state after the last real step (c0 for empty rows)

The reference (:func:`qrnn_pool_reference`) lives in :mod:`seqzoo.kernels.qrnn_pool_reference`, which
imports no fast path; this module (the dispatcher and the C kernel's wrapper) and the Triton module
both import it, and this module imports the Triton one lazily, for CUDA tensors only.

Backends: ``"compiled"`` (C kernel built at install time, loaded with ctypes; float32/float64 on
CPU; bfloat16/float16 gates are pooled in float32, :func:`qrnn_pool` returning their dtype),
``"triton"`` (CUDA tensors) and ``"reference"``. Both fast paths fuse the activations, zoneout
and the recurrence in one pass forward and a reverse-time pass backward (the compiled backward reads
the activations its forward left in the gate buffer, recomputes the cell states from them in cache,
and writes d(gates) in place; the Triton kernels take chunks of time steps at once, each by a scan
over time, see :mod:`seqzoo.kernels.qrnn_pool_triton`). A backward that must itself be
differentiable (``create_graph=True``) differentiates the reference instead
(:func:`~seqzoo.kernels.qrnn_pool_reference.reference_gradients`). When a fast path cannot run,
:func:`qrnn_pool` warns and uses the reference; setting the environment variable
``SEQZOO_QRNN_BACKEND=reference`` selects the reference on purpose. :func:`qrnn_layer` runs a whole
layer direction (convolution and pooling), fused the same way on the compiled backend. Under
``torch.compile`` both entry points run eagerly on every backend (``torch.compiler.disable``, a
graph break): dynamo cannot trace a ctypes call, the fused kernels leave nothing for inductor to
fuse, and the reference's loop over time would only unroll into a graph as long as the sequence.
"""

from __future__ import annotations

import ctypes
import functools
import os
from collections.abc import Callable
from dataclasses import dataclass, replace

import torch
from torch import Tensor
from torch.nn import functional as F

from seqzoo._warn import warn_user
from seqzoo.kernels._loader import DTYPE_CODE, load_kernel
from seqzoo.kernels.qrnn_pool_reference import POOLINGS, qrnn_pool_reference, reference_gradients

__all__ = ["POOLINGS", "pool_backend", "qrnn_layer", "qrnn_pool", "qrnn_pool_compiled", "qrnn_pool_reference"]

_POOL_CODE = {"f": 0, "fo": 1, "ifo": 2}
_WIDENED = (torch.bfloat16, torch.float16)  # gates the compiled path pools in float32 (qrnn_pool_compiled)
_ABI_VERSION = 3  # qrnn_pool_abi_version() of the C sources this wrapper calls


@functools.cache
def _compiled_library() -> ctypes.CDLL | str:
    """The compiled kernel, or the reason it is unavailable."""
    common = "i p l pppp d lll ii"  # dtype, gates, gate_time, bias..keep, keep_prob, shape, pooling, reverse
    return load_kernel(
        "qrnn_pool", _ABI_VERSION, qrnn_pool_forward=common + " i pp i", qrnn_pool_backward=common + " pppp i"
    )


def _ptr(t: Tensor | None) -> int | None:
    return None if t is None else t.data_ptr()


@dataclass(frozen=True)
class _Kernel:
    """One fused pooling problem, as the C forward and backward functions take it.

    ``gates`` holds row ``b * gate_time + t`` for step t of batch row b (``gate_time >= time``),
    ``G * hidden`` values each, without ``bias`` (G*H,) when one is given. A training forward
    replaces them by their activations, and the backward those by d(gates), in place.
    """

    gates: Tensor
    gate_time: int
    bias: Tensor | None
    lengths: Tensor
    c0: Tensor | None
    keep: Tensor | None
    keep_prob: float
    pooling: str
    reverse: bool
    shape: tuple[int, int, int]  # batch, time, hidden

    def _args(self) -> tuple:
        return (
            DTYPE_CODE[self.gates.dtype],
            _ptr(self.gates),
            self.gate_time,
            _ptr(self.bias),
            _ptr(self.lengths),
            _ptr(self.c0),
            _ptr(self.keep),
            self.keep_prob,
            *self.shape,
            _POOL_CODE[self.pooling],
            int(self.reverse),
        )

    def forward(self, training: bool) -> tuple[Tensor, Tensor]:
        """h (B, T, H) and c_last (B, H); ``training`` leaves the activations in the gates for the backward."""
        batch, time, hidden = self.shape
        h = self.gates.new_empty(batch, time, hidden)
        c_last = self.gates.new_empty(batch, hidden)
        lib = _compiled_library()
        if lib.qrnn_pool_forward(*self._args(), int(training), _ptr(h), _ptr(c_last), torch.get_num_threads()) != 0:
            raise RuntimeError("qrnn_pool_forward: could not start worker threads")
        return h, c_last

    def backward(self, dh: Tensor | None, dc_last: Tensor | None) -> tuple[Tensor, Tensor]:
        """Overwrites the activations with d(gates); returns d(bias) and d(c0). None gradients are zeros."""
        batch, time, hidden = self.shape
        dbias = self.gates.new_empty(batch, POOLINGS[self.pooling] * hidden)  # row 0: the sum over rows
        dc0 = self.gates.new_empty(batch, hidden)
        dh = self.gates.new_zeros(batch, time, hidden) if dh is None else dh.contiguous()
        dc_last = None if dc_last is None else dc_last.contiguous()
        outs = (_ptr(dh), _ptr(dc_last), _ptr(dbias), _ptr(dc0))
        if _compiled_library().qrnn_pool_backward(*self._args(), *outs, torch.get_num_threads()) != 0:
            raise RuntimeError("qrnn_pool_backward: could not start worker threads or allocate scratch memory")
        return dbias[0], dc0


def _pool_kwargs(kernel: _Kernel) -> dict:
    """The keyword arguments of :func:`qrnn_pool_reference` for ``kernel``'s problem."""
    return {"pooling": kernel.pooling, "keep": kernel.keep, "keep_prob": kernel.keep_prob, "reverse": kernel.reverse}


def _unspent_kernel(ctx, gates: Callable[[], Tensor]) -> _Kernel:
    """``ctx.kernel`` for a backward; the first spends its buffer, so later ones (``retain_graph``)
    get a kernel on a rebuilt one (``gates()``, then the forward again for the activations)."""
    kernel = ctx.kernel
    if ctx.gates_spent:
        kernel = replace(kernel, gates=gates())
        kernel.forward(training=True)
    ctx.gates_spent = True
    return kernel


class _CompiledPool(torch.autograd.Function):
    """Fused pooling forward and backward through the C kernel (through the reference when the
    backward itself must be differentiable)."""

    @staticmethod
    def forward(ctx, gates, lengths, c0, keep, keep_prob, pooling, reverse):
        batch, time, _, hidden = gates.shape
        training = any(ctx.needs_input_grad)
        # The kernel turns its gates into activations, then gradients: it works in a buffer of its
        # own, a copy (training) or the widened float32 gates (half-precision ones, in one pass).
        work = _buffer(gates) if training or gates.dtype in _WIDENED else gates
        ctx.kernel = _Kernel(work, time, None, lengths, c0, keep, keep_prob, pooling, reverse, (batch, time, hidden))
        h, c_last = ctx.kernel.forward(training)
        ctx.gates_spent = False
        ctx.set_materialize_grads(False)  # an unused output's gradient stays None (the kernel reads zeros)
        ctx.save_for_backward(gates, c0)
        return h, c_last

    @staticmethod
    def backward(ctx, dh, dc_last):
        gates, c0 = ctx.saved_tensors
        if torch.is_grad_enabled():  # create_graph=True

            def recompute(gates: Tensor, c0: Tensor | None) -> tuple[Tensor, Tensor]:
                wide = gates.to(ctx.kernel.gates.dtype)
                return qrnn_pool_reference(wide, ctx.kernel.lengths, c0, **_pool_kwargs(ctx.kernel))

            dgates, dc0 = reference_gradients(
                recompute, (gates, c0), (ctx.needs_input_grad[0], ctx.needs_input_grad[2]), (dh, dc_last)
            )
            return dgates, None, dc0, None, None, None, None
        kernel = _unspent_kernel(ctx, lambda: _buffer(gates))
        _, dc0 = kernel.backward(dh, dc_last)
        dgates = kernel.gates.to(gates.dtype)  # narrowed back for half-precision gates
        return dgates, None, dc0 if ctx.needs_input_grad[2] else None, None, None, None, None


def _buffer(gates: Tensor) -> Tensor:
    """A buffer of the kernel's own holding ``gates``: float32 for half-precision gates, else a copy."""
    return gates.float() if gates.dtype in _WIDENED else gates.clone()


def _check_pool_args(
    shape: tuple[int, int, int], lengths: Tensor, c0: Tensor | None, keep: Tensor | None, gates_like: Tensor
) -> None:
    """Refuse what would make the kernels (which index without bounds checks) read or write out of
    bounds, or dereference another device's pointer; called once per path: by :func:`_compiled_inputs`
    for the C kernel, by :func:`qrnn_pool` for the others. The lengths' values are checked on CPU
    only: on CUDA that would cost a device sync per call, and the encoders derive them from a
    checked mask. ``gates_like``: the gates (or the layer's input), whose device and dtype the others follow;
    ``c0`` of another dtype would be cast by a fast path but promote the reference's result, so it
    must be ``gates_like``'s dtype (or float32 for half-precision gates, which pool in float32)."""
    device, dtype = gates_like.device, gates_like.dtype
    if c0 is not None and c0.dtype != dtype and not (dtype in _WIDENED and c0.dtype == torch.float32):
        raise TypeError(f"c0 is {c0.dtype} but the gates are {dtype}: cast it (.to({dtype}))")
    for name, tensor in (("lengths", lengths), ("c0", c0), ("keep", keep)):
        if tensor is not None and tensor.device != device:
            raise ValueError(f"{name} is on {tensor.device} but the gates on {device}: move it (.to({str(device)!r}))")
    if lengths.is_floating_point() or lengths.is_complex():  # 2.5 was 2 in the C kernel and 3 in the reference
        raise TypeError(f"lengths must be integers, got {lengths.dtype}")
    batch, time, hidden = shape
    in_range = lengths.is_cuda or bool(((lengths >= 0) & (lengths <= time)).all())
    if tuple(lengths.shape) != (batch,) or not in_range:
        raise ValueError(f"lengths must be ({batch},) with values in [0, {time}], got {lengths.tolist()}")
    if c0 is not None and tuple(c0.shape) != (batch, hidden):
        raise ValueError(f"c0 must be ({batch}, {hidden}), got {tuple(c0.shape)}")
    if keep is not None and tuple(keep.shape) != shape:
        raise ValueError(f"keep must be {shape}, got {tuple(keep.shape)}")


def _compiled_inputs(
    x: Tensor, lengths: Tensor, c0: Tensor | None, keep: Tensor | None, shape: tuple[int, int, int]
) -> tuple:
    """x, lengths, c0, keep as the C kernel reads them (contiguous; int64, the dtype it computes in,
    uint8), after checking them against the pooling problem's ``shape`` (batch, time, hidden)."""
    _check_pool_args(shape, lengths, c0, keep, gates_like=x)
    c0 = None if c0 is None else c0.to(torch.float32 if x.dtype in _WIDENED else x.dtype).contiguous()
    keep = None if keep is None else keep.to(torch.uint8).contiguous()
    return x.contiguous(), lengths.to(torch.int64).contiguous(), c0, keep


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
    """The C kernel (CPU, float32/float64); raises RuntimeError where it is not available.

    bfloat16 / float16 gates (a projection under CPU autocast) are pooled in float32: widened in
    one pass into the kernel's buffer, h and c_last float32 (a state carried in half precision
    would lose its precision over the sequence), d(gates) narrowed back to the gates' dtype.
    """
    lib = _compiled_library()
    if isinstance(lib, str):
        raise RuntimeError(lib)
    if gates.is_cuda or gates.dtype not in (*DTYPE_CODE, *_WIDENED):
        raise RuntimeError(
            "the compiled pooling runs float32/float64 (bfloat16/float16 widened) on CPU, "
            f"got {gates.dtype} on {gates.device}"
        )
    batch, time, _, hidden = gates.shape
    gates, lengths, c0, keep = _compiled_inputs(gates, lengths, c0, keep, (batch, time, hidden))
    return _CompiledPool.apply(gates, lengths, c0, keep, float(keep_prob), pooling, reverse)


class _CompiledLayer(torch.autograd.Function):
    """A QRNN layer direction: the convolution as k accumulated matmuls into one gate buffer, then the
    fused pooling (bias added there), which leaves the activations in that buffer; the backward
    writes d(gates) over them. A second backward through the same graph (``retain_graph``)
    recomputes the buffer first."""

    @staticmethod
    def forward(ctx, x_pad, weight, bias, lengths, c0, keep, keep_prob, pooling, reverse):
        kernel = _layer_kernel(x_pad, weight, bias, lengths, c0, keep, keep_prob, pooling, reverse)
        h, c_last = kernel.forward(training=True)
        ctx.kernel, ctx.gates_spent = kernel, False
        ctx.set_materialize_grads(False)  # an unused output's gradient stays None (the kernel reads zeros)
        ctx.save_for_backward(x_pad, weight, bias, c0)
        return h, c_last

    @staticmethod
    def backward(ctx, dh, dc_last):
        x_pad, weight, bias, c0 = ctx.saved_tensors
        needs = ctx.needs_input_grad
        if torch.is_grad_enabled():  # create_graph=True
            batch, time, hidden = ctx.kernel.shape

            def recompute(
                x_pad: Tensor, weight: Tensor, bias: Tensor | None, c0: Tensor | None
            ) -> tuple[Tensor, Tensor]:
                gates = window_linear(x_pad, weight, bias).view(batch, time, -1, hidden)  # (B, T, G, H)
                return qrnn_pool_reference(gates, ctx.kernel.lengths, c0, **_pool_kwargs(ctx.kernel))

            dx, dw, dbias, dc0 = reference_gradients(
                recompute, (x_pad, weight, bias, c0), (needs[0], needs[1], needs[2], needs[4]), (dh, dc_last)
            )
            return dx, dw, dbias, None, dc0, None, None, None, None
        kernel = _unspent_kernel(ctx, lambda: _convolve(x_pad, weight))
        dbias, dc0 = kernel.backward(dh, dc_last)
        dgates = kernel.gates  # (rows, G*H), overwritten in place
        rows, taps = x_pad.view(-1, x_pad.shape[-1]), weight.split(x_pad.shape[-1], 1)  # taps: (G*H, n) each
        count = dgates.shape[0]
        dx = dw = None
        if ctx.needs_input_grad[0]:
            dx = torch.empty_like(rows)
            torch.mm(dgates, taps[0], out=dx[:count])
            dx[count:].zero_()
            for j, tap in enumerate(taps[1:], 1):
                dx[j : j + count].addmm_(dgates, tap)
            dx = dx.view_as(x_pad)
        if ctx.needs_input_grad[1]:  # as dW^T = X^T dY, one row block per tap (faster than dY^T X in MKL)
            dw = weight.new_empty(weight.shape[1], weight.shape[0])
            for j, block in enumerate(dw.split(x_pad.shape[-1])):
                torch.mm(rows[j : j + count].t(), dgates, out=block)
            dw = dw.t()
        return dx, dw, dbias if needs[2] else None, None, dc0 if needs[4] else None, None, None, None, None


def _convolve(x_pad: Tensor, weight: Tensor) -> Tensor:
    """The convolution of ``x_pad`` (B, T + k - 1, n) as one buffer (B (T + k - 1) - k + 1, G*H).

    Flattened to rows, window (b, t) is rows b (T + k - 1) + t + j, j < k, so the convolution is a
    sum over taps W_j of one matmul on a shifted row range each, with no window copies; row
    b (T + k - 1) + t holds step t of batch row b, and the k - 1 rows that straddle two batch rows
    are spare.
    """
    rows, taps = x_pad.view(-1, x_pad.shape[-1]), weight.split(x_pad.shape[-1], 1)
    count = rows.shape[0] - len(taps) + 1
    gates = torch.mm(rows[:count], taps[0].t())
    for j, tap in enumerate(taps[1:], 1):
        gates.addmm_(rows[j : j + count], tap.t())
    return gates


def window_linear(x_pad: Tensor, weight: Tensor, bias: Tensor | None) -> Tensor:
    """The width-k convolution as one ``F.linear`` over concatenated windows: x_pad (B, T + k - 1, n) -> (B, T, G*H).

    ``weight`` (G*H, k*n) and ``bias`` as in :func:`qrnn_layer`; window t is ``x_pad[:, t : t + k]``.
    """
    window = weight.shape[1] // x_pad.shape[-1]
    time = x_pad.shape[1] - window + 1
    windows = torch.cat([x_pad[:, j : j + time] for j in range(window)], -1) if window > 1 else x_pad
    return F.linear(windows, weight, bias)


def _layer_kernel(x_pad, weight, bias, lengths, c0, keep, keep_prob, pooling, reverse) -> _Kernel:
    batch, padded_time, n = x_pad.shape
    shape = (batch, padded_time - weight.shape[1] // n + 1, weight.shape[0] // POOLINGS[pooling])
    return _Kernel(_convolve(x_pad, weight), padded_time, bias, lengths, c0, keep, keep_prob, pooling, reverse, shape)


@torch.compiler.disable  # see the module docstring
def qrnn_layer(
    x_pad: Tensor,
    weight: Tensor,
    bias: Tensor | None,
    lengths: Tensor,
    c0: Tensor | None = None,
    *,
    pooling: str = "fo",
    keep: Tensor | None = None,
    keep_prob: float = 1.0,
    reverse: bool = False,
) -> tuple[Tensor, Tensor]:
    """A QRNN layer direction: the width-k convolution (eqs. 1-2) followed by :func:`qrnn_pool`.

    ``x_pad`` (B, T + k - 1, n) is the input with the k - 1 frames the windows reach beyond it
    (window t is ``x_pad[:, t : t + k]``); ``weight`` (G*H, k*n) and ``bias`` (G*H,) are the
    taps of an ``nn.Linear`` over the flattened window, gates in the order z, f, o, i. The
    compiled backend fuses the convolution into the pooling's buffers (no window copies); the
    other backends concatenate the windows and run one ``F.linear``.
    """
    if pooling not in POOLINGS:
        raise ValueError(f"pooling must be one of {sorted(POOLINGS)}, got {pooling!r}")
    batch, padded_time, n = x_pad.shape
    window = weight.shape[1] // n
    if weight.shape[0] % POOLINGS[pooling] or weight.shape[1] != window * n or window > padded_time:
        raise ValueError(
            f"{pooling}-pooling on inputs of size {n} needs weight ({POOLINGS[pooling]}*H, k*{n}) with "
            f"k <= {padded_time}, got {tuple(weight.shape)}"
        )
    time = padded_time - window + 1
    kwargs = {"pooling": pooling, "keep": keep, "keep_prob": keep_prob, "reverse": reverse}
    device = x_pad.device.type
    if device == "cpu" and torch.is_autocast_enabled(device):
        # CPU autocast (bfloat16): the projection in bfloat16 (2.5x float32's matmul rate with
        # AVX512-BF16), the pooling in float32 (a recurrence in bfloat16 would lose the state's
        # precision over the sequence): the fused kernel widens the gates into its own buffer.
        gates = window_linear(x_pad, weight, bias).view(batch, time, POOLINGS[pooling], -1)
        c0 = None if c0 is None else c0.to(weight.dtype)
        with torch.autocast(device, enabled=False):
            if pool_backend(x_pad.device, gates.dtype) == "compiled":  # states in float32 for half gates
                return qrnn_pool_compiled(gates, lengths, c0, **kwargs)
            return qrnn_pool(gates.to(weight.dtype), lengths, c0, **kwargs)
    # under CUDA autocast the gates come out in the autocast dtype
    dtype = torch.get_autocast_dtype(device) if torch.is_autocast_enabled(device) else x_pad.dtype
    if pool_backend(x_pad.device, dtype) != "compiled" or dtype not in DTYPE_CODE:  # fused layer: float32/64
        gates = window_linear(x_pad, weight, bias).view(batch, time, POOLINGS[pooling], -1)  # (B, T, G, H)
        return qrnn_pool(gates, lengths, c0, **kwargs)
    shape = (batch, time, weight.shape[0] // POOLINGS[pooling])
    if bias is not None:  # the C kernel reads it through a raw pointer, as (G*H,) values of x's dtype
        if tuple(bias.shape) != (weight.shape[0],) or bias.dtype != x_pad.dtype:
            expected = f"({weight.shape[0]},) of {x_pad.dtype} (the input's)"
            raise ValueError(f"bias must be {expected}, got {tuple(bias.shape)} {bias.dtype}")
        bias = bias.contiguous()
    x_pad, lengths, c0, keep = _compiled_inputs(x_pad, lengths, c0, keep, shape)
    args = (x_pad, weight, bias, lengths, c0, keep, float(keep_prob), pooling, reverse)
    tracked = [t for t in (x_pad, weight, bias, c0) if t is not None]
    if torch.is_grad_enabled() and any(t.requires_grad for t in tracked):
        return _CompiledLayer.apply(*args)
    return _layer_kernel(*args).forward(training=False)


def pool_backend(device: torch.device | str = "cpu", dtype: torch.dtype = torch.float32) -> str:
    """Name of the backend :func:`qrnn_pool` uses for tensors of this device and dtype (the
    reference while ``torch.jit.trace`` runs: it records PyTorch operations, not the fused kernels).
    On CPU the compiled kernel serves float32 and float64, and pools bfloat16/float16 in float32."""
    if os.environ.get("SEQZOO_QRNN_BACKEND", "auto") == "reference" or torch.jit.is_tracing():
        return "reference"
    if torch.device(device).type == "cuda":
        from seqzoo.kernels.qrnn_pool_triton import triton_unavailable_reason

        return "reference" if triton_unavailable_reason() else "triton"
    if isinstance(_compiled_library(), str) or dtype not in (*DTYPE_CODE, *_WIDENED):
        return "reference"
    return "compiled"


def _fallback_reason(gates: Tensor) -> str:
    if torch.jit.is_tracing():
        return "torch.jit.trace records PyTorch operations only"
    if gates.is_cuda:
        from seqzoo.kernels.qrnn_pool_triton import triton_unavailable_reason

        return triton_unavailable_reason() or ""
    lib = _compiled_library()
    return lib if isinstance(lib, str) else f"the compiled kernel does not support {gates.dtype}"


@torch.compiler.disable  # see the module docstring
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
    if backend == "compiled":  # the C kernel checks its arguments; half-precision gates pool in float32
        h, c_last = qrnn_pool_compiled(gates, lengths, c0, **kwargs)
        return h.to(gates.dtype), c_last.to(gates.dtype)
    batch, time, _, hidden = gates.shape
    _check_pool_args((batch, time, hidden), lengths, c0, keep, gates_like=gates)
    if backend == "triton":
        from seqzoo.kernels.qrnn_pool_triton import qrnn_pool_triton

        return qrnn_pool_triton(gates, lengths, c0, **kwargs)
    if os.environ.get("SEQZOO_QRNN_BACKEND", "auto") != "reference":
        warn_user(
            f"seqzoo: fused QRNN pooling unavailable ({_fallback_reason(gates)}); using the slower PyTorch reference",
            RuntimeWarning,
        )
    h, c_last = qrnn_pool_reference(gates, lengths, c0, **kwargs)  # a float32 c0 with half gates promotes
    return h.to(gates.dtype), c_last.to(gates.dtype)  # as the fast paths: the gates' dtype
