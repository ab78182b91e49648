"""QRNN pooling for CUDA tensors in Triton: the same signature and math as the C kernel.

One program per (batch row, block of channels) runs the recurrence over time; activations and
zoneout are fused, the backward is the reverse-time recurrence recomputing the activations from
the saved gates. Arithmetic is in float32 (float16/bfloat16 gates are widened, the outputs
stored in the gates' dtype), or float64 for float64 gates. Imported only for CUDA tensors (or
under ``TRITON_INTERPRET=1`` in tests).
"""

from __future__ import annotations

import torch
from torch import Tensor

from seqzoo.kernels.qrnn_pool import qrnn_pool_reference, reference_gradients

try:
    import triton
    import triton.language as tl
except ImportError as err:  # pragma: no cover - depends on the install
    triton = None
    _IMPORT_ERROR = str(err)

__all__ = ["qrnn_pool_triton", "triton_unavailable_reason"]

_POOL_CODE = {"f": 0, "fo": 1, "ifo": 2}
_BLOCK = 128


def triton_unavailable_reason() -> str | None:
    """None when Triton can run the kernels, else why not."""
    return None if triton is not None else f"triton is not installed ({_IMPORT_ERROR})"


if triton is not None:

    @triton.jit
    def _sigmoid(x):
        return 1.0 / (1.0 + tl.exp(-x))

    @triton.jit
    def _tanh(x):
        return 1.0 - 2.0 / (tl.exp(2.0 * x) + 1.0)

    @triton.jit
    def _forward_kernel(
        gates,
        lengths,
        c0,
        keep,
        h,
        c_all,
        c_last,
        keep_prob,
        T,
        H,
        POOLING: tl.constexpr,
        G: tl.constexpr,
        REVERSE: tl.constexpr,
        HAS_C0: tl.constexpr,
        HAS_KEEP: tl.constexpr,
        SAVE_C: tl.constexpr,
        BLOCK: tl.constexpr,
        ACC: tl.constexpr,
    ):
        b = tl.program_id(0)
        cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
        valid = cols < H
        length = tl.load(lengths + b)
        if HAS_C0:
            c = tl.load(c0 + b * H + cols, mask=valid, other=0.0).to(ACC)
        else:
            c = tl.full([BLOCK], 0.0, ACC)
        for t in range(length, T):  # pads: zero outputs
            tl.store(h + (b * T + t) * H + cols, tl.full([BLOCK], 0.0, ACC), mask=valid)
        for s in range(0, length):
            row = b * T + (length - 1 - s if REVERSE else s)
            g = gates + row * G * H + cols
            z = _tanh(tl.load(g, mask=valid, other=0.0).to(ACC))  # eq. 1
            scale = tl.full([BLOCK], keep_prob, ACC)
            if HAS_KEEP:  # eq. 6: zoned-out channels get f = 1 (and i = 0 with ifo: they keep their state)
                scale = scale * tl.load(keep + row * H + cols, mask=valid, other=0).to(ACC)
            leak = (1.0 - _sigmoid(tl.load(g + H, mask=valid, other=0.0).to(ACC))) * scale
            if POOLING == 2:
                c = (1.0 - leak) * c + _sigmoid(tl.load(g + 3 * H, mask=valid, other=0.0).to(ACC)) * scale * z
            else:
                c = c + leak * (z - c)  # f c + (1 - f) z, eqs. 3-4
            out = c
            if POOLING != 0:
                out = _sigmoid(tl.load(g + 2 * H, mask=valid, other=0.0).to(ACC)) * c
            tl.store(h + row * H + cols, out, mask=valid)
            if SAVE_C:
                tl.store(c_all + row * H + cols, c, mask=valid)
        tl.store(c_last + b * H + cols, c, mask=valid)

    @triton.jit
    def _backward_kernel(
        gates,
        lengths,
        c0,
        keep,
        c_all,
        dh,
        dc_last,
        dgates,
        dc0,
        keep_prob,
        T,
        H,
        POOLING: tl.constexpr,
        G: tl.constexpr,
        REVERSE: tl.constexpr,
        HAS_C0: tl.constexpr,
        HAS_KEEP: tl.constexpr,
        BLOCK: tl.constexpr,
        ACC: tl.constexpr,
    ):
        b = tl.program_id(0)
        cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
        valid = cols < H
        length = tl.load(lengths + b)
        dc = tl.load(dc_last + b * H + cols, mask=valid, other=0.0).to(ACC)
        for t in range(length, T):  # pads: no gradient
            for g in range(0, G):
                tl.store(dgates + ((b * T + t) * G + g) * H + cols, tl.full([BLOCK], 0.0, ACC), mask=valid)
        for k in range(0, length):
            s = length - 1 - k
            row = b * T + (length - 1 - s if REVERSE else s)
            if s > 0:
                prev = b * T + (length - s if REVERSE else s - 1)
                cp = tl.load(c_all + prev * H + cols, mask=valid, other=0.0).to(ACC)
            elif HAS_C0:
                cp = tl.load(c0 + b * H + cols, mask=valid, other=0.0).to(ACC)
            else:
                cp = tl.full([BLOCK], 0.0, ACC)
            g = gates + row * G * H + cols
            dg = dgates + row * G * H + cols
            z = _tanh(tl.load(g, mask=valid, other=0.0).to(ACC))
            f = _sigmoid(tl.load(g + H, mask=valid, other=0.0).to(ACC))
            scale = tl.full([BLOCK], keep_prob, ACC)
            if HAS_KEEP:
                scale = scale * tl.load(keep + row * H + cols, mask=valid, other=0).to(ACC)
            leak = (1.0 - f) * scale
            dht = tl.load(dh + row * H + cols, mask=valid, other=0.0).to(ACC)
            if POOLING == 0:
                dct = dc + dht
            else:
                o = _sigmoid(tl.load(g + 2 * H, mask=valid, other=0.0).to(ACC))
                c = tl.load(c_all + row * H + cols, mask=valid, other=0.0).to(ACC)
                tl.store(dg + 2 * H, dht * c * o * (1.0 - o), mask=valid)
                dct = dc + dht * o
            if POOLING == 2:
                i = _sigmoid(tl.load(g + 3 * H, mask=valid, other=0.0).to(ACC))
                tl.store(dg + 3 * H, dct * scale * z * i * (1.0 - i), mask=valid)
                dz = dct * scale * i
                df = dct * cp * scale * f * (1.0 - f)
            else:
                dz = dct * leak
                df = -dct * (z - cp) * scale * f * (1.0 - f)
            tl.store(dg, dz * (1.0 - z * z), mask=valid)
            tl.store(dg + H, df, mask=valid)
            dc = dct * (1.0 - leak)
        tl.store(dc0 + b * H + cols, dc, mask=valid)


def _accumulator(gates: Tensor) -> object:
    """The kernels' arithmetic type: float64 for float64 gates (gradcheck), else float32 (which
    half-precision gates are widened to)."""
    return tl.float64 if gates.dtype == torch.float64 else tl.float32


class _TritonPool(torch.autograd.Function):
    @staticmethod
    def forward(ctx, gates, lengths, c0, keep, keep_prob, pooling, reverse):
        batch, time, groups, hidden = gates.shape
        h = gates.new_empty(batch, time, hidden)
        c_last = gates.new_empty(batch, hidden)
        c_all = gates.new_empty(batch, time, hidden) if ctx.needs_input_grad[0] or ctx.needs_input_grad[2] else h
        grid = (batch, triton.cdiv(hidden, _BLOCK))
        _forward_kernel[grid](
            gates,
            lengths,
            c0 if c0 is not None else gates,
            keep if keep is not None else gates,
            h,
            c_all,
            c_last,
            keep_prob,
            time,
            hidden,
            POOLING=_POOL_CODE[pooling],
            G=groups,
            REVERSE=reverse,
            HAS_C0=c0 is not None,
            HAS_KEEP=keep is not None,
            SAVE_C=c_all is not h,
            BLOCK=_BLOCK,
            ACC=_accumulator(gates),
        )
        ctx.config = (keep_prob, pooling, reverse)
        ctx.save_for_backward(gates, lengths, c0, keep, c_all)
        return h, c_last

    @staticmethod
    def backward(ctx, dh, dc_last):
        gates, lengths, c0, keep, c_all = ctx.saved_tensors
        keep_prob, pooling, reverse = ctx.config
        if torch.is_grad_enabled():  # create_graph=True: the kernel's backward is not differentiable

            def recompute(gates: Tensor, c0: Tensor | None) -> tuple[Tensor, Tensor]:
                kwargs = {"pooling": pooling, "keep": keep, "keep_prob": keep_prob, "reverse": reverse}
                return qrnn_pool_reference(gates, lengths, c0, **kwargs)

            needs = (ctx.needs_input_grad[0], ctx.needs_input_grad[2])
            dgates, dc0 = reference_gradients(recompute, (gates, c0), needs, (dh, dc_last))
            return dgates, None, dc0, None, None, None, None
        batch, time, groups, hidden = gates.shape
        dgates = torch.empty_like(gates)
        dc0 = torch.empty_like(dc_last, dtype=gates.dtype)
        grid = (batch, triton.cdiv(hidden, _BLOCK))
        _backward_kernel[grid](
            gates,
            lengths,
            c0 if c0 is not None else gates,
            keep if keep is not None else gates,
            c_all,
            dh.contiguous(),
            dc_last.contiguous(),
            dgates,
            dc0,
            keep_prob,
            time,
            hidden,
            POOLING=_POOL_CODE[pooling],
            G=groups,
            REVERSE=reverse,
            HAS_C0=c0 is not None,
            HAS_KEEP=keep is not None,
            BLOCK=_BLOCK,
            ACC=_accumulator(gates),
        )
        return dgates, None, dc0 if ctx.needs_input_grad[2] else None, None, None, None, None


def qrnn_pool_triton(
    gates: Tensor,
    lengths: Tensor,
    c0: Tensor | None = None,
    *,
    pooling: str = "fo",
    keep: Tensor | None = None,
    keep_prob: float = 1.0,
    reverse: bool = False,
) -> tuple[Tensor, Tensor]:
    """The Triton kernel (see :mod:`seqzoo.kernels.qrnn_pool` for the signature)."""
    reason = triton_unavailable_reason()
    if reason:
        raise RuntimeError(reason)
    gates = gates.contiguous()
    lengths = lengths.to(torch.int64).contiguous()
    c0 = None if c0 is None else c0.to(gates.dtype).contiguous()
    keep = None if keep is None else keep.to(torch.uint8).contiguous()
    return _TritonPool.apply(gates, lengths, c0, keep, float(keep_prob), pooling, bool(reverse))
