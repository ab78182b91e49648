"""QRNN pooling for CUDA tensors in Triton: the same signature and math as the C kernel.

One program per (batch row, block of channels) runs the recurrence over time, a chunk of time
steps at a time: the chunk's gates are loaded at once and its states computed by a scan over time
(``tl.associative_scan`` of the affine maps c -> (1 - leak) c + new), so each chunk costs one
round trip to memory instead of one per step, which left the GPU waiting on memory latency at
small batch sizes. Activations and zoneout are fused; the backward is the same scan in reverse
time over dL/dc, recomputing the activations from the saved gates and states. Arithmetic is in
float32 (float16/bfloat16 gates are widened, the outputs stored in the gates' dtype), or float64
for float64 gates. Imported only for CUDA tensors (or under ``TRITON_INTERPRET=1`` in tests).
"""

from __future__ import annotations

import contextlib

import torch
from torch import Tensor

from seqzoo.kernels.qrnn_pool_reference import qrnn_pool_reference, reference_gradients

try:
    import triton
    import triton.language as tl
except ImportError as err:  # pragma: no cover - depends on the install
    triton = None
    _IMPORT_ERROR = str(err)

__all__ = ["qrnn_pool_triton", "triton_unavailable_reason"]

_POOL_CODE = {"f": 0, "fo": 1, "ifo": 2}
_BLOCK = 32  # channels per program
_CHUNK = 32  # time steps per scan


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
    def _affine_then(a1, b1, a2, b2):
        """The scan's operator: c -> a1 c + b1 followed by c -> a2 c + b2."""
        return a1 * a2, b1 * a2 + b2

    @triton.jit
    def _add(a, b):
        return a + b

    @triton.jit
    def _row(tile, steps, index):
        """Row ``index`` of a (CHUNK, BLOCK) tile, as a (BLOCK,) vector. (``tl.reduce`` with our own
        operator rather than ``tl.sum``: Triton's interpreter cannot run its library's jit functions
        when Triton was imported before ``TRITON_INTERPRET`` was set, as in the tests.)"""
        return tl.reduce(tl.where(steps[:, None] == index, tile, 0.0), 0, _add)

    @triton.jit
    def _forward_kernel(
        gates,
        lengths,
        c0,
        keep,
        h,
        c_all,
        c_last,
        KEEP_PROB: tl.constexpr,  # in the kernel's precision: a float argument would be float32
        T,
        H,
        POOLING: tl.constexpr,
        G: tl.constexpr,
        REVERSE: tl.constexpr,
        HAS_C0: tl.constexpr,
        HAS_KEEP: tl.constexpr,
        SAVE_C: tl.constexpr,
        BLOCK: tl.constexpr,
        CHUNK: tl.constexpr,
        ACC: tl.constexpr,
    ):
        b = tl.program_id(0)
        cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
        valid = cols < H
        steps = tl.arange(0, CHUNK)
        length = tl.load(lengths + b)
        if HAS_C0:
            c = tl.load(c0 + b * H + cols, mask=valid, other=0.0).to(ACC)
        else:
            c = tl.full([BLOCK], 0.0, ACC)
        for t0 in range(length, T, CHUNK):  # pads: zero outputs
            t = t0 + steps
            pads = (t < T)[:, None] & valid[None, :]
            tl.store(h + (b * T + t)[:, None] * H + cols[None, :], tl.full([CHUNK, BLOCK], 0.0, ACC), mask=pads)
        for s0 in range(0, length, CHUNK):  # CHUNK steps at a time, in the direction's order
            s = s0 + steps
            row = b * T + (length - 1 - s if REVERSE else s)  # (CHUNK,)
            m = (s < length)[:, None] & valid[None, :]  # (CHUNK, BLOCK)
            g = gates + row[:, None] * (G * H) + cols[None, :]
            z = _tanh(tl.load(g, mask=m, other=0.0).to(ACC))  # eq. 1
            scale = tl.full([CHUNK, BLOCK], KEEP_PROB, ACC)
            if HAS_KEEP:  # eq. 6: zoned-out channels get f = 1 (and i = 0 with ifo: they keep their state)
                scale = scale * tl.load(keep + row[:, None] * H + cols[None, :], mask=m, other=0).to(ACC)
            leak = (1.0 - _sigmoid(tl.load(g + H, mask=m, other=0.0).to(ACC))) * scale
            if POOLING == 2:
                new = _sigmoid(tl.load(g + 3 * H, mask=m, other=0.0).to(ACC)) * scale * z
            else:
                new = leak * z
            # c_t = (1 - leak_t) c_{t-1} + new_t (eqs. 3-5), for the whole chunk by one scan over
            # time; steps past the end keep the state.
            decay, new = tl.where(m, 1.0 - leak, 1.0), tl.where(m, new, 0.0)
            span, gain = tl.associative_scan((decay, new), 0, _affine_then)
            cs = span * c[None, :] + gain
            out = cs
            if POOLING != 0:
                out = _sigmoid(tl.load(g + 2 * H, mask=m, other=0.0).to(ACC)) * cs
            tl.store(h + row[:, None] * H + cols[None, :], out, mask=m)
            if SAVE_C:
                tl.store(c_all + row[:, None] * H + cols[None, :], cs, mask=m)
            c = _row(cs, steps, CHUNK - 1)  # the chunk's last state
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
        KEEP_PROB: tl.constexpr,  # in the kernel's precision: a float argument would be float32
        T,
        H,
        POOLING: tl.constexpr,
        G: tl.constexpr,
        REVERSE: tl.constexpr,
        HAS_C0: tl.constexpr,
        HAS_KEEP: tl.constexpr,
        BLOCK: tl.constexpr,
        CHUNK: tl.constexpr,
        ACC: tl.constexpr,
    ):
        b = tl.program_id(0)
        cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
        valid = cols < H
        steps = tl.arange(0, CHUNK)
        length = tl.load(lengths + b)
        for t0 in range(length, T, CHUNK):  # pads: no gradient
            t = t0 + steps
            pads = (t < T)[:, None] & valid[None, :]
            for k in tl.static_range(G):
                pointers = dgates + ((b * T + t)[:, None] * G + k) * H + cols[None, :]
                tl.store(pointers, tl.full([CHUNK, BLOCK], 0.0, ACC), mask=pads)
        dc = tl.load(dc_last + b * H + cols, mask=valid, other=0.0).to(ACC)  # dL/dc after the chunk
        chunks = (length + CHUNK - 1) // CHUNK
        for j in range(0, chunks):  # the chunks from the last back to the first
            s = (chunks - 1 - j) * CHUNK + steps
            row = b * T + (length - 1 - s if REVERSE else s)
            m = (s < length)[:, None] & valid[None, :]
            g = gates + row[:, None] * (G * H) + cols[None, :]
            dg = dgates + row[:, None] * (G * H) + cols[None, :]
            z = _tanh(tl.load(g, mask=m, other=0.0).to(ACC))
            f = _sigmoid(tl.load(g + H, mask=m, other=0.0).to(ACC))
            scale = tl.full([CHUNK, BLOCK], KEEP_PROB, ACC)
            if HAS_KEEP:
                scale = scale * tl.load(keep + row[:, None] * H + cols[None, :], mask=m, other=0).to(ACC)
            leak = (1.0 - f) * scale
            # dL/dc_s = u_s + (1 - leak_{s+1}) dL/dc_{s+1}: the next step's decay carries it back
            nxt = b * T + (length - 2 - s if REVERSE else s + 1)
            m_next = (s + 1 < length)[:, None] & valid[None, :]
            scale_next = tl.full([CHUNK, BLOCK], KEEP_PROB, ACC)
            if HAS_KEEP:
                scale_next = scale_next * tl.load(keep + nxt[:, None] * H + cols[None, :], mask=m_next, other=0).to(ACC)
            f_next = _sigmoid(
                tl.load(gates + nxt[:, None] * (G * H) + H + cols[None, :], mask=m_next, other=0.0).to(ACC)
            )
            decay = tl.where(m_next, 1.0 - (1.0 - f_next) * scale_next, 1.0)
            dht = tl.load(dh + row[:, None] * H + cols[None, :], mask=m, other=0.0).to(ACC)
            if POOLING == 0:
                u = dht
            else:
                o = _sigmoid(tl.load(g + 2 * H, mask=m, other=0.0).to(ACC))
                c = tl.load(c_all + row[:, None] * H + cols[None, :], mask=m, other=0.0).to(ACC)
                tl.store(dg + 2 * H, dht * c * o * (1.0 - o), mask=m)
                u = dht * o
            span, gain = tl.associative_scan((decay, tl.where(m, u, 0.0)), 0, _affine_then, reverse=True)
            dct = span * dc[None, :] + gain  # (CHUNK, BLOCK) dL/dc_s
            prev = b * T + (length - s if REVERSE else s - 1)  # c_{s-1}: saved, or c0 before the first step
            cp = tl.load(c_all + prev[:, None] * H + cols[None, :], mask=m & (s > 0)[:, None], other=0.0).to(ACC)
            if HAS_C0:
                first = tl.load(c0 + b * H + cols, mask=valid, other=0.0).to(ACC)
                cp = tl.where((s == 0)[:, None], first[None, :], cp)
            if POOLING == 2:
                i = _sigmoid(tl.load(g + 3 * H, mask=m, other=0.0).to(ACC))
                tl.store(dg + 3 * H, dct * scale * z * i * (1.0 - i), mask=m)
                dz = dct * scale * i
                df = dct * cp * scale * f * (1.0 - f)
            else:
                dz = dct * leak
                df = -dct * (z - cp) * scale * f * (1.0 - f)
            tl.store(dg, dz * (1.0 - z * z), mask=m)
            tl.store(dg + H, df, mask=m)
            dc = _row(dct, steps, 0)  # dL/dc at the chunk's first step
        # dL/dc0: the first step's decay carries dL/dc_0 back (an empty row passes dc_last on)
        first = b * T + (length - 1 if REVERSE else 0)
        m0 = valid & (cols * 0 + length > 0)  # (a vector: the interpreter refuses a scalar in a mask)
        scale0 = tl.full([BLOCK], KEEP_PROB, ACC)
        if HAS_KEEP:
            scale0 = scale0 * tl.load(keep + first * H + cols, mask=m0, other=0).to(ACC)
        f0 = _sigmoid(tl.load(gates + first * (G * H) + H + cols, mask=m0, other=0.0).to(ACC))
        tl.store(dc0 + b * H + cols, tl.where(m0, 1.0 - (1.0 - f0) * scale0, 1.0) * dc, mask=valid)


def _launching_on(gates: Tensor) -> contextlib.AbstractContextManager:
    """Triton launches on the current CUDA device: make it the tensors' (``cuda:1`` with ``cuda:0``
    current would run on the wrong GPU)."""
    return torch.cuda.device(gates.device) if gates.is_cuda else contextlib.nullcontext()


def _pointers(gates: Tensor, c0: Tensor | None, keep: Tensor | None) -> tuple[Tensor, Tensor]:
    """``c0`` and ``keep`` for the kernels' pointer arguments: an absent one passes ``gates``, which
    the kernel never reads there (``HAS_C0`` / ``HAS_KEEP`` are false)."""
    return (gates if c0 is None else c0), (gates if keep is None else keep)


def _constants(gates: Tensor, c0: Tensor | None, keep: Tensor | None, pooling: str, reverse: bool) -> dict:
    """The compile-time arguments both kernels take. Arithmetic is in float64 for float64 gates
    (gradcheck), else in float32 (which half-precision gates are widened to)."""
    return {
        "POOLING": _POOL_CODE[pooling],
        "G": gates.shape[2],
        "REVERSE": reverse,
        "HAS_C0": c0 is not None,
        "HAS_KEEP": keep is not None,
        "BLOCK": _BLOCK,
        "CHUNK": _CHUNK,
        "ACC": tl.float64 if gates.dtype == torch.float64 else tl.float32,
    }


class _TritonPool(torch.autograd.Function):
    @staticmethod
    def forward(ctx, gates, lengths, c0, keep, keep_prob, pooling, reverse):
        batch, time, _, hidden = gates.shape
        h = gates.new_empty(batch, time, hidden)
        c_last = gates.new_empty(batch, hidden)
        c_all = gates.new_empty(batch, time, hidden) if ctx.needs_input_grad[0] or ctx.needs_input_grad[2] else h
        grid = (batch, triton.cdiv(hidden, _BLOCK))
        with _launching_on(gates):
            _forward_kernel[grid](
                gates,
                lengths,
                *_pointers(gates, c0, keep),
                h,
                c_all,
                c_last,
                keep_prob,
                time,
                hidden,
                SAVE_C=c_all is not h,
                **_constants(gates, c0, keep, pooling, reverse),
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
        batch, time, _, hidden = gates.shape
        dgates = torch.empty_like(gates)
        dc0 = gates.new_empty(batch, hidden)  # contiguous, as the kernel writes it (dc_last may be strided)
        grid = (batch, triton.cdiv(hidden, _BLOCK))
        with _launching_on(gates):
            _backward_kernel[grid](
                gates,
                lengths,
                *_pointers(gates, c0, keep),
                c_all,
                dh.contiguous(),
                dc_last.contiguous(),
                dgates,
                dc0,
                keep_prob,
                time,
                hidden,
                **_constants(gates, c0, keep, pooling, reverse),
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
