"""Run any recurrent cell over time under the :mod:`seqzoo.encoders.base` contract.

:class:`RecurrentCellEncoder` owns the machinery every hand-written recurrent encoder needs
(the MZU, the layer-normalised GRU, the deep-transition GRU, the Meta-LSTM and the HyperLSTM
use it): the time loop, masks (pads neither update the state nor produce outputs), carried
state, stacked layers and bidirectionality (the reverse direction starts at each row's last
*real* token).

A cell is an ``nn.Module`` with a ``hidden_size`` attribute and a ``prepare`` method::

    inputs, step = cell.prepare(x)  # x (T, B, D) time-major; inputs (T, B, ·): input-only work
    h_t, aux_t = step(x_t, h_prev)  # x_t = step t of inputs; h (B, H); aux_t (B,) or None

A cell whose state is more than its output (an LSTM's ``(h, c)``, the Meta-LSTM's
``(h, c, ĥ, ĉ)``) declares ``state_sizes``, the width of each state tensor, and an ``output``
method; its ``step`` takes and returns the tuple, and its output at a step is ``output(state)``::

    state_t, aux_t = step(x_t, state_prev)  # state: tuple of (B, state_sizes[i]) tensors
    h_t = cell.output(state_t)              # (B, H)

The encoder's state is then a tuple of the same length, each (num_layers * directions, B,
state_sizes[i]); a single-state cell's is one tensor (num_layers * directions, B, H).

``prepare`` is where a cell hoists everything that does not depend on the state (e.g. the
input half of its projections as one big matmul over all ``T`` steps), so the loop only does
the state-dependent work. The loop hands each step its slice of ``inputs`` from one
``inputs.unbind(0)``: indexing ``inputs[t]`` at every step would make each step's backward write a
full-size zero tensor (O(T²) memory traffic). Cells that compute a regulariser (the MZU's zone
disagreement) return it per row from ``step``; the encoder averages it over the real tokens.

A cell whose class sets ``float32_recurrence = True`` (the MZU) runs its time loop in float32
under autocast: ``prepare``'s input-only matmul follows autocast, then its output and the state
are widened once and the loop runs with autocast off. Its step is dozens of small ops, each of
which would pay a cast under autocast and gain little from a half-precision type.

``compile_step=True`` runs each cell's ``step`` through ``torch.compile`` (Inductor). A cell
step at CPU sizes is a few dozen small operations, and Inductor fuses the element-wise ones
into generated C++ loops: at the brown_char configs the training step gets faster after a
compile of 3-35 s (``benchmarks/compiled_step.py``; Inductor caches the code on disk). Training
and evaluation compile apart. The layers and directions of a stack share their graphs, as
their steps differ only in the weight tensors they hold; a cell should give those tensors the
same strides in every layer, or each layer compiles a graph of its own. The first graph has
static sizes; a call with another batch size compiles one more graph with dynamic sizes that
serves them all (about 10 % slower than a static one at the brown_char size). It needs a C++
compiler at run time, so it is off by default; if compiling fails, the step runs eagerly after
a warning.
Compiled dropout draws its own random numbers, so a compiled run does not repeat an eager one
bit for bit (it is still reproducible from its seed).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Protocol

import torch
from torch import Tensor, nn

from seqzoo._warn import warn_user
from seqzoo.encoders.base import (
    Encoder,
    State,
    describe_state,
    lengths_from_mask,
    reverse_padded,
    takes_all_real_shortcut,
    zero_padding,
)

__all__ = ["RecurrentCell", "RecurrentCellEncoder", "StepFn", "TupleStepFn", "compile_failure", "compiled_step"]

StepFn = Callable[[Tensor, Tensor], tuple[Tensor, Tensor | None]]
TupleStepFn = Callable[[Tensor, tuple[Tensor, ...]], tuple[tuple[Tensor, ...], Tensor | None]]


class RecurrentCell(Protocol):
    hidden_size: int

    def prepare(self, x: Tensor) -> tuple[Tensor, StepFn | TupleStepFn]: ...


_compile_failure: str | None = None  # set by the first failed compile; later steps run eagerly


def compile_failure() -> str | None:
    """Why ``compile_step`` fell back to eager in this process (the first failed compile), or None."""
    return _compile_failure


def compiled_step(step: StepFn | TupleStepFn) -> StepFn | TupleStepFn:
    """``step`` through ``torch.compile``; where compiling fails, ``step`` itself after one warning."""
    if _compile_failure is not None:
        return step
    compiled = torch.compile(step)

    def run(x_t: Tensor, h: Tensor | tuple[Tensor, ...]) -> tuple[Any, Tensor | None]:
        global _compile_failure
        # In training, a chunk's first state (fresh or detached) needs no gradient and every later
        # one does: a graph apart for the first step would double the compile time for 1/T of the work.
        needs_grad = h.requires_grad if isinstance(h, Tensor) else any(t.requires_grad for t in h)
        if _compile_failure is None and (needs_grad or not torch.is_grad_enabled()):
            try:
                return compiled(x_t, h)
            except Exception as error:  # any backend failure; an error in the step itself recurs below
                _compile_failure = f"{type(error).__name__}: {(str(error).splitlines() or [''])[0]}"
                warn_user(
                    f"compile_step: torch.compile of the recurrent step failed ({_compile_failure}); "
                    "running it eagerly",
                    RuntimeWarning,
                )
        return step(x_t, h)

    return run


class RecurrentCellEncoder(Encoder):
    """Stacked (optionally bidirectional) recurrence of cells built by ``make_cell(input_size)``.

    State: ``h`` of shape (num_layers * directions, B, hidden_size), ordered like ``nn.GRU``
    (layer-major, forward direction first); for cells with ``state_sizes``, a tuple of such
    tensors, one per state part (module docstring). Outputs (B, T, hidden_size * directions),
    zero at pads. Layer ``l > 0`` consumes the concatenated directions of layer ``l - 1``.
    ``compile_step``: run the cells' steps through ``torch.compile`` (module docstring).
    """

    repr_fields = ("num_layers",)

    def __init__(
        self,
        input_size: int,
        hidden_size: int,
        make_cell: Callable[[int], nn.Module],
        num_layers: int = 1,
        bidirectional: bool = False,
        compile_step: bool = False,
    ) -> None:
        super().__init__(input_size, hidden_size, bidirectional=bidirectional)
        self.compile_step = bool(compile_step)
        if num_layers < 1:
            raise ValueError(f"num_layers must be >= 1, got {num_layers}")
        self.num_layers = int(num_layers)
        self.num_directions = 2 if bidirectional else 1
        self.cells = nn.ModuleList(
            make_cell(input_size if layer == 0 else hidden_size * self.num_directions)
            for layer in range(self.num_layers)
            for _ in range(self.num_directions)
        )
        #: The width of each state tensor for tuple-state cells, None for single-state cells.
        self.state_sizes: tuple[int, ...] | None = getattr(self.cells[0], "state_sizes", None)
        #: From the last forward: the cells' auxiliary terms summed over cells and real tokens,
        #: divided by the number of real tokens (None when the cells return none).
        self.aux_per_token: Tensor | None = None

    def __getstate__(self) -> dict[str, Any]:
        """Copies (``copy.deepcopy``, pickle) leave out the last forward's auxiliary term, a graph node."""
        return {**self.__dict__, "aux_per_token": None}

    def _initial_state(self, x: Tensor, state: State) -> tuple[Tensor, ...]:
        """``state`` checked and as a tuple of (num_layers * directions, B, ·) tensors; zeros for None."""
        count, batch = self.num_layers * self.num_directions, x.shape[0]
        sizes = self.state_sizes or (self.hidden_size,)
        shapes = [(count, batch, size) for size in sizes]
        dtype = next(self.parameters()).dtype  # the state's, also when autocast runs x in lower precision
        if state is None:
            return tuple(x.new_zeros(shape, dtype=dtype) for shape in shapes)
        parts = (state,) if self.state_sizes is None else state
        expected = shapes[0] if self.state_sizes is None else tuple(shapes)
        if (
            not isinstance(parts, tuple)
            or len(parts) != len(shapes)
            or not all(isinstance(t, Tensor) and tuple(t.shape) == s for t, s in zip(parts, shapes, strict=True))
        ):
            what = "a tensor" if self.state_sizes is None else f"a tuple of {len(shapes)} tensors"
            raise ValueError(f"state must be {what} of shape {expected}, got {describe_state(state)}")
        for tensor in parts:
            if tensor.dtype != dtype:  # also under autocast (unlike check_state_dtype): the cells' steps
                # mix the state with float32 results (torch.lerp refuses a bfloat16 state there)
                raise TypeError(f"state is {tensor.dtype} but the encoder's weights are {dtype}")
        return parts

    def forward(self, x: Tensor, mask: Tensor | None = None, state: State = None) -> tuple[Tensor, State]:
        mask = self.check_input(x, mask)
        initial = self._initial_state(x, state)
        steps = mask.t()  # (T, B)
        full = takes_all_real_shortcut(mask)
        lengths = lengths_from_mask(mask)
        # (T, B, D): every step's slice contiguous after prepare
        layer_input = zero_padding(x, mask, all_real=full).transpose(0, 1)
        finals: list[tuple[Tensor, ...]] = []
        aux_total: Tensor | None = None
        for layer in range(self.num_layers):
            outputs = []
            for direction in range(self.num_directions):
                k = layer * self.num_directions + direction
                reverse = direction == 1
                inputs = reverse_padded(layer_input, lengths, time_dim=0) if reverse else layer_input
                cell_state = tuple(part[k] for part in initial)
                out, final, aux = _unroll(self.cells[k], inputs, steps, cell_state, full, self.compile_step)
                outputs.append(reverse_padded(out, lengths, time_dim=0) if reverse else out)
                finals.append(final)
                if aux is not None:
                    aux_total = aux if aux_total is None else aux_total + aux
            layer_input = torch.cat(outputs, dim=-1)
        self.aux_per_token = None if aux_total is None else aux_total / lengths.sum().clamp(min=1)
        stacked = tuple(torch.stack(parts) for parts in zip(*finals, strict=True))
        return layer_input.transpose(0, 1), stacked[0] if self.state_sizes is None else stacked

    def trace(self, x: Tensor, state: State = None) -> tuple[Tensor, Tensor]:
        """Candidates and states of the top layer for ``x`` (B, T, d_x), no padding, unidirectional;
        for cells with a ``trace`` method (MZU, GRU, DT-GRU), for analysis (MZU paper Figure 3).

        Returns candidates (B, T, L + 1, H), one per transition depth (depth 0 reads ``x_t``), and
        the states (B, T, H), which equal :meth:`forward`'s outputs. Dropout follows the modules' mode.
        """
        if self.bidirectional:
            raise ValueError("trace needs a unidirectional encoder")
        if not all(hasattr(cell, "trace") for cell in self.cells):
            raise ValueError(f"{type(self.cells[0]).__name__} has no trace method")
        h0 = x.new_zeros(self.num_layers, x.shape[0], self.hidden_size) if state is None else state
        inputs = x.transpose(0, 1)
        for cell, h in zip(self.cells, h0, strict=True):
            candidates, inputs = cell.trace(inputs, h)
        return candidates.permute(2, 0, 1, 3), inputs.transpose(0, 1)


def _unroll(
    cell: nn.Module, x: Tensor, steps: Tensor, state: tuple[Tensor, ...], full: bool, compile_step: bool
) -> tuple[Tensor, tuple[Tensor, ...], Tensor | None]:
    """Run ``cell`` over time-major ``x`` (T, B, D) from ``state`` (each part (B, ·)); pads keep the state.

    Returns outputs (T, B, H) zero at pads, the final state (a tuple, also for a single-state
    cell) and the sum of the per-row auxiliary terms over real tokens (or None).
    """
    inputs, step = cell.prepare(x)
    if compile_step:
        step = compiled_step(step)
    if hasattr(cell, "state_sizes"):
        output: Callable[[tuple[Tensor, ...]], Tensor] = cell.output
    else:
        step, output = _as_tuple_step(step), _first
    device = x.device.type
    if getattr(cell, "float32_recurrence", False) and torch.is_autocast_enabled(device):
        # widened once; the loop below runs with autocast off
        inputs, state = inputs.float(), tuple(part.float() for part in state)
        with torch.autocast(device, enabled=False):
            return _loop(step, output, inputs, steps, state, full)
    return _loop(step, output, inputs, steps, state, full)


def _first(state: tuple[Tensor, ...]) -> Tensor:
    """A single-state cell's output: its state."""
    return state[0]


def _as_tuple_step(step: StepFn) -> TupleStepFn:
    """A single-state cell's ``step`` on one-tensor tuples."""

    def run(x_t: Tensor, state: tuple[Tensor, ...]) -> tuple[tuple[Tensor, ...], Tensor | None]:
        h, aux = step(x_t, state[0])
        return (h,), aux

    return run


def _loop(
    step: TupleStepFn,
    output: Callable[[tuple[Tensor, ...]], Tensor],
    inputs: Tensor,
    steps: Tensor,
    state: tuple[Tensor, ...],
    full: bool,
) -> tuple[Tensor, tuple[Tensor, ...], Tensor | None]:
    """:func:`_unroll`'s time loop over the prepared ``inputs`` (T, B, ·)."""
    outputs = []
    aux_sum: Tensor | None = None
    for x_t, real in zip(inputs.unbind(0), steps.unbind(0), strict=True):
        new, aux = step(x_t, state)
        if full:
            state = new
            outputs.append(output(new))
        else:
            keep = real.unsqueeze(1)
            state = tuple(torch.where(keep, n, s) for n, s in zip(new, state, strict=True))
            outputs.append(torch.where(keep, output(new), 0.0))
            if aux is not None:
                aux = torch.where(real, aux, 0.0)
        if aux is not None:
            aux_sum = aux.sum() if aux_sum is None else aux_sum + aux.sum()
    return torch.stack(outputs), state, aux_sum
