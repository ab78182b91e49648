"""QRNN pooling (Bradbury et al., ICLR 2017, eqs. 3-6): the plain-PyTorch reference every fast path is
tested against, and the autograd helper the fast paths' double backward goes through.

The signature and conventions are those of :func:`seqzoo.kernels.qrnn_pool.qrnn_pool` (see that
module's docstring). This module imports no fast path: the dispatcher (:mod:`seqzoo.kernels.qrnn_pool`,
with the C kernel's wrapper) and the Triton kernel (:mod:`seqzoo.kernels.qrnn_pool_triton`) import it.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import Tensor

__all__ = ["POOLINGS", "qrnn_pool_reference", "reference_gradients"]

#: Number of gate blocks per pooling type: z, f (, o (, i)).
POOLINGS = {"f": 2, "fo": 3, "ifo": 4}


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
    gated = torch.sigmoid(gates[:, :, 1:])  # f, o, i in one pass, (B, T, G - 1, H)
    f, i = gated[:, :, 0], gated[:, :, 2] if pooling == "ifo" else None
    if keep is not None or keep_prob != 1.0:  # eq. 6: zoned-out channels get f = 1 (no rescaling) ...
        scale = keep_prob if keep is None else keep.to(f.dtype) * keep_prob
        f = 1 - (1 - f) * scale
        if i is not None:  # ... and i = 0 with ifo-pooling, so that they keep their state
            i = i * scale
    new = i * z if i is not None else torch.addcmul(z, f, z, value=-1)  # i z, or (1 - f) z
    real = (torch.arange(time, device=gates.device) < lengths.unsqueeze(1)).unsqueeze(-1)  # (B, T, 1)
    padded = torch.jit.is_tracing() or not bool(real.all())  # a trace records the masked path, right for every mask
    if padded:
        f, new = f.masked_fill(~real, 1.0), new.masked_fill(~real, 0.0)  # pads keep the state
    c = gates.new_zeros(batch, hidden) if c0 is None else c0
    steps = list(zip(f.unbind(1), new.unbind(1), strict=True))  # unbind: O(T) backward, unlike f[:, t]
    cells = []
    for f_t, new_t in reversed(steps) if reverse else steps:
        c = torch.addcmul(new_t, f_t, c)  # c_t = f_t * c_{t-1} + (1 - f_t) * z_t  (or + i_t * z_t)
        cells.append(c)
    if reverse:
        cells.reverse()
    h = torch.stack(cells, 1) if cells else z  # (B, T, H); T = 0: the empty z, in the graph like the kernels' h
    if pooling != "f":
        h = h * gated[:, :, 1]  # h_t = o_t * c_t
    return (h.masked_fill(~real, 0.0) if padded else h), c


def reference_gradients(
    recompute: Callable[..., tuple[Tensor, Tensor]],
    inputs: tuple[Tensor | None, ...],
    needs: tuple[bool, ...],
    grads: tuple[Tensor | None, Tensor | None],
) -> tuple[Tensor | None, ...]:
    """The gradients, for ``grads`` = (dh, dc_last), of ``recompute(*inputs)`` -> (h, c_last) with
    respect to the ``inputs`` that ``needs``, computed by autograd through the reference with a
    graph of their own. A fused kernel's backward returns these under ``create_graph=True``
    (double backward: gradient penalties, ``gradgradcheck``), which autograd could not
    differentiate through the kernel."""
    wanted = [t for t, need in zip(inputs, needs, strict=True) if need and t is not None]
    pairs = [(out, grad) for out, grad in zip(recompute(*inputs), grads, strict=True) if grad is not None]
    found = torch.autograd.grad(
        [out for out, _ in pairs], wanted, [grad for _, grad in pairs], create_graph=True, allow_unused=True
    )
    found = iter(found if pairs else [None] * len(wanted))
    return tuple(next(found) if need and t is not None else None for t, need in zip(inputs, needs, strict=True))
