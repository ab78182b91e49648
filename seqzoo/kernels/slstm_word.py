"""The S-LSTM word nodes' cell and output (MODELS.md 2.1 and 2.2, the word node), for inference.

    h, c = word_cells(pre, global_pre, sentence, cells, near, c_global, x_cell)             # the C kernel
    h, c = word_cells_reference(pre, global_pre, sentence, cells, near, c_global, x_cell)   # PyTorch

    pre         (N, G·H) ``W ξ + U x + b`` of the N words being updated: G = 7 gate groups (``paper``: i, l, r,
                f, s, o, u) or 6 (``official``: f1, f2, f3, f4, i, o)
    global_pre  (B, G·H) ``V g`` of each sentence's global node
    sentence    (N,) int64 each word's sentence
    cells       (R, H) cell rows: word n's own cell is ``cells[n]``, its neighbours' are rows of ``near``
    near        (N, 2·w) int64 the rows of each word's w left neighbours' cells, then its w right ones'
                (summed on each side: ``paper`` reads w = 1, ``official`` its whole window)
    c_global    (B, H) each sentence's global cell
    x_cell      (N, H) the input gated into the cell (``official``), else None
    h, c        (N, H) each: the words' new state

The gates' weights are the per-dimension softmax over the sigmoids of the first five groups (:func:`word_gates`).
The kernel makes one pass over the words where PyTorch takes about twenty operations over all of them; it is
what a depth-adaptive S-LSTM pays at each step for each word, and, with the operations it replaces, a fixed
cost at each step whatever the number of words. No autograd: the S-LSTM's inference path
(:meth:`~seqzoo.encoders.slstm.SentenceStateCell.run_compact`) calls it on the CPU when
:func:`word_cells_available`, and says so when it cannot load.
"""

from __future__ import annotations

import torch
from torch import Tensor

from seqzoo.kernels._loader import DTYPE_CODE, CompiledKernel

__all__ = ["word_cells", "word_cells_available", "word_cells_reference", "word_gates"]

_ABI_VERSION = 1  # slstm_word_abi_version() of the C source this wrapper calls
_KERNEL = CompiledKernel("slstm_word", _ABI_VERSION, slstm_word_cells="i ppppppp llll pp i")


def word_cells_available() -> str | None:
    """None when the kernel is loaded, else why it is not."""
    return _KERNEL.unavailable()


def word_gates(
    pre: Tensor, c_self: Tensor, c_left: Tensor, c_right: Tensor, c_global: Tensor, x_cell: Tensor | None
) -> tuple[Tensor, Tensor]:
    """New (h, c) (N, H) of N words from their gate pre-activations ``pre`` (N, G·H), all terms included, and
    the cells they mix (N, H) each: their own, the neighbours' on each side, the global node's, and x's
    (``official``, G = 6; None for ``paper``, G = 7). With autograd: the S-LSTM's training path uses it too."""
    gates = pre.unflatten(-1, (-1, c_self.shape[-1]))  # (N, G, H)
    weights = torch.softmax(torch.sigmoid(gates[:, :5]), dim=1)  # (N, 5, H), per dimension over the five gates
    if x_cell is None:  # paper
        i, left, right, forget, glob = weights.unbind(1)  # i, l, r, f, s
        candidate = torch.tanh(gates[:, 6])  # u
        c = left * c_left + forget * c_self + right * c_right + glob * c_global + i * candidate
    else:  # official
        left, right, inner, glob, i = weights.unbind(1)  # f1, f2, f3, f4, i
        c = left * c_left + right * c_right + inner * x_cell + glob * c_global + i * c_self
    return torch.sigmoid(gates[:, 5]) * torch.tanh(c), c  # h = o ⊙ tanh(c)


def _checked(
    pre: Tensor,
    global_pre: Tensor,
    sentence: Tensor,
    cells: Tensor,
    near: Tensor,
    c_global: Tensor,
    x_cell: Tensor | None,
) -> None:
    """A ValueError unless the shapes agree (see the module docstring) and the indices are in range."""
    words, hidden, batch = pre.shape[0], cells.shape[1], c_global.shape[0]
    groups = 7 if x_cell is None else 6
    if tuple(pre.shape) != (words, groups * hidden) or tuple(global_pre.shape) != (batch, groups * hidden):
        raise ValueError(f"pre and global_pre must be (N, {groups * hidden}) and ({batch}, {groups * hidden})")
    if tuple(sentence.shape) != (words,) or near.dim() != 2 or near.shape[0] != words or near.shape[1] % 2:
        raise ValueError(f"sentence must be ({words},) and near ({words}, 2w)")
    if (x_cell is not None and tuple(x_cell.shape) != (words, hidden)) or cells.shape[0] < words:
        raise ValueError(f"x_cell must be ({words}, {hidden}) and cells hold at least {words} rows")
    if words and not (0 <= int(sentence.min()) and int(sentence.max()) < batch):
        raise ValueError(f"sentence must index the {batch} sentences")
    if near.numel() and not (0 <= int(near.min()) and int(near.max()) < cells.shape[0]):
        raise ValueError(f"near must index the {cells.shape[0]} rows of cells")


def word_cells_reference(
    pre: Tensor,
    global_pre: Tensor,
    sentence: Tensor,
    cells: Tensor,
    near: Tensor,
    c_global: Tensor,
    x_cell: Tensor | None,
    check: bool = True,
) -> tuple[Tensor, Tensor]:
    """The words' new ``(h, c)``, each (N, H); see the module docstring. ``check=False`` skips the checks of the
    arguments (a caller that built them so, once per step)."""
    if check:
        _checked(pre, global_pre, sentence, cells, near, c_global, x_cell)
    words, hidden, side = pre.shape[0], cells.shape[1], near.shape[1] // 2
    near_c = cells.index_select(0, near.flatten()).view(words, 2 * side, hidden)
    c_left, c_right = near_c[:, :side].sum(1), near_c[:, side:].sum(1)
    pre = pre + global_pre.index_select(0, sentence)
    return word_gates(pre, cells[:words], c_left, c_right, c_global.index_select(0, sentence), x_cell)


def word_cells(
    pre: Tensor,
    global_pre: Tensor,
    sentence: Tensor,
    cells: Tensor,
    near: Tensor,
    c_global: Tensor,
    x_cell: Tensor | None,
    check: bool = True,
) -> tuple[Tensor, Tensor]:
    """:func:`word_cells_reference` by the C kernel: float32/float64 CPU tensors, no autograd. ``check=False``
    skips the checks of shapes, dtypes, layouts and indices (out-of-range indices would read outside the
    tensors): for a caller that built them so, contiguous and of one dtype."""
    lib = _KERNEL.loaded()
    if cells.dtype not in DTYPE_CODE or cells.device.type != "cpu":
        raise TypeError(f"the S-LSTM word kernel takes float32/float64 CPU tensors, got {cells.dtype}")
    if check:
        _checked(pre, global_pre, sentence, cells, near, c_global, x_cell)
        floats = [t.to(cells.dtype).contiguous() for t in (pre, global_pre, c_global)]
        pre, global_pre, c_global = floats
        x_cell = None if x_cell is None else x_cell.to(cells.dtype).contiguous()
        sentence, near, cells = (
            sentence.to(torch.int64).contiguous(),
            near.to(torch.int64).contiguous(),
            cells.contiguous(),
        )
    words, hidden = pre.shape[0], cells.shape[1]
    h, c = cells.new_empty(words, hidden), cells.new_empty(words, hidden)
    status = lib.slstm_word_cells(
        DTYPE_CODE[cells.dtype], pre.data_ptr(), global_pre.data_ptr(), sentence.data_ptr(), cells.data_ptr(),
        near.data_ptr(), c_global.data_ptr(), None if x_cell is None else x_cell.data_ptr(), words,
        pre.shape[1] // hidden, near.shape[1] // 2, hidden, h.data_ptr(), c.data_ptr(), torch.get_num_threads(),
    )  # fmt: skip
    if status != 0:
        raise RuntimeError("slstm_word_cells: could not allocate memory or join a worker thread")
    return h, c
