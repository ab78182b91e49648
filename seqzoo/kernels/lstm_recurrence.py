"""The recurrence of a single-layer (bidirectional) LSTM over the real tokens of a batch, for inference.

    out = lstm_recurrence(gates_x, weight_hh, lengths)             # the C kernel (``lstm_recurrence.c``)
    out = lstm_recurrence_reference(gates_x, weight_hh, lengths)   # the same in plain PyTorch

    gates_x    (M, D, 4H) the input part ``x W_ihᵀ + b_ih + b_hh`` of each direction's gates (D = 1 or 2) at
               the M real tokens, row after row (``x[mask]`` order); gate order i, f, g, o as torch.nn.LSTM
    weight_hh  (D, 4H, H) each direction's recurrent weights (``weight_hh_l0``, ``weight_hh_l0_reverse``)
    lengths    (B,) int64 real tokens per row, summing to M
    out        (M, D, H) h_t of each token and direction: direction 0 reads each row forward, direction 1
               backward, both from h₀ = c₀ = 0

``c_t = σ(f_t) c_{t−1} + σ(i_t) tanh(g_t)``, ``h_t = σ(o_t) tanh(c_t)`` with ``[i; f; g; o] = gates_x[t] +
W_hh h_{t−1}``. The kernel takes the whole batch in one call: no operator dispatch per step and no step
over a pad (torch's fused CPU LSTM steps over the pads of an unpacked batch; a packed batch costs a
dispatch per step). No autograd: :class:`~seqzoo.encoders.dagrn.DAGRN` calls it at CPU inference only,
when :func:`lstm_recurrence_available`, and says so when it cannot load.
"""

from __future__ import annotations

import torch
from torch import Tensor

from seqzoo.kernels._loader import DTYPE_CODE, CompiledKernel

__all__ = ["lstm_recurrence", "lstm_recurrence_available", "lstm_recurrence_reference"]

_ABI_VERSION = 2  # lstm_recurrence_abi_version() of the C source this wrapper calls
_KERNEL = CompiledKernel("lstm_recurrence", _ABI_VERSION, lstm_recurrence="i pppp lll p i")


def lstm_recurrence_available() -> str | None:
    """None when the kernel is loaded, else why it is not."""
    return _KERNEL.unavailable()


def _checked(gates_x: Tensor, weight_hh: Tensor, lengths: Tensor) -> tuple[int, int, int]:
    """(M, D, H) of consistent inputs (see the module docstring), else a ValueError."""
    if gates_x.dim() != 3 or gates_x.shape[1] not in (1, 2) or gates_x.shape[2] % 4:
        raise ValueError(f"gates_x must be (M, D, 4H) with D 1 or 2, got {tuple(gates_x.shape)}")
    words, directions, width = gates_x.shape
    hidden = width // 4
    if tuple(weight_hh.shape) != (directions, width, hidden):
        raise ValueError(f"weight_hh must be ({directions}, {width}, {hidden}), got {tuple(weight_hh.shape)}")
    if lengths.dim() != 1 or bool((lengths < 0).any()) or int(lengths.sum()) != words:
        raise ValueError(f"lengths must be (B,), non-negative, summing to M = {words}; got {lengths.tolist()}")
    return words, directions, hidden


def lstm_recurrence_reference(gates_x: Tensor, weight_hh: Tensor, lengths: Tensor) -> Tensor:
    """h of every token and direction (M, D, H), one row, direction and step at a time."""
    words, directions, hidden = _checked(gates_x, weight_hh, lengths)
    out = gates_x.new_zeros(words, directions, hidden)
    first = (torch.cumsum(lengths, 0) - lengths).tolist()
    for start, length in zip(first, lengths.tolist(), strict=True):
        for d in range(directions):
            h = c = gates_x.new_zeros(hidden)
            steps = range(start, start + length)
            for word in reversed(steps) if d else steps:
                i, f, g, o = (gates_x[word, d] + weight_hh[d] @ h).chunk(4)
                c = torch.sigmoid(f) * c + torch.sigmoid(i) * torch.tanh(g)
                h = torch.sigmoid(o) * torch.tanh(c)
                out[word, d] = h
    return out


def lstm_recurrence(gates_x: Tensor, weight_hh: Tensor, lengths: Tensor) -> Tensor:
    """:func:`lstm_recurrence_reference` by the C kernel: float32/float64 CPU tensors, no autograd."""
    lib = _KERNEL.loaded()
    words, directions, hidden = _checked(gates_x, weight_hh, lengths)
    if gates_x.dtype not in DTYPE_CODE or gates_x.device.type != "cpu":
        raise TypeError(f"the LSTM recurrence kernel takes float32/float64 CPU tensors, got {gates_x.dtype}")
    gates_x = gates_x.detach().contiguous()
    weight_t = weight_hh.detach().to(gates_x.dtype).transpose(1, 2).contiguous()  # (D, H, 4H)
    lengths = lengths.to(torch.int64).contiguous()
    order = torch.argsort(lengths, descending=True, stable=True)  # the rows longest first: the kernel's bundles
    out = gates_x.new_empty(words, directions, hidden)
    status = lib.lstm_recurrence(
        DTYPE_CODE[gates_x.dtype], gates_x.data_ptr(), weight_t.data_ptr(), lengths.data_ptr(), order.data_ptr(),
        lengths.numel(), hidden, directions, out.data_ptr(), torch.get_num_threads(),
    )  # fmt: skip
    if status != 0:
        raise RuntimeError("lstm_recurrence: could not start worker threads or allocate scratch memory")
    return out
