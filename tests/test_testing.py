"""The contract checker itself (seqzoo.testing): it must pass correct encoders and reject each
fault it exists for, one deliberately broken encoder per fault."""

from __future__ import annotations

from functools import partial

import pytest
import torch
from torch import nn

from seqzoo import build_encoder
from seqzoo.encoders.base import Encoder, lengths_from_mask, zero_padding
from seqzoo.testing import (
    assert_batch_invariant,
    assert_contract,
    assert_padding_gradients,
    assert_padding_invariant,
    assert_stateful_chunks,
    rounding_tolerance,
)


def test_contract_check_catches_leaking_encoder():
    """The invariant checks must fail on an encoder that lets pads into its state."""
    torch.manual_seed(0)
    enc = build_encoder("lstm", 4, hidden_size=3)
    atol = rounding_tolerance(enc)  # before the patch below, which a copy of enc would not follow
    leaky_forward = type(enc).forward

    def leaky(x, mask=None, state=None):
        return leaky_forward(enc, x, None, state)  # ignores the mask

    enc.forward = leaky
    with pytest.raises(AssertionError):
        assert_padding_invariant(enc.eval(), [5, 2], atol)


@pytest.mark.parametrize("name", ["lstm", "gru", "dtgru"])
def test_assert_contract_finds_the_batch_dimension_of_any_state(name):
    """The padding check runs a batch of 5: a state (layers, B, H) with 5 layers once had its layer
    dimension taken for the batch's, and a correct encoder failed the contract."""
    assert_contract(build_encoder(name, 3, hidden_size=4, num_layers=5))


class _PadsInTheGradient(Encoder):
    """Finite outputs (pads masked after the matmul), but ``linear.weight``'s gradient sums x over
    every position, NaN pads included: the fault the gradient check exists for."""

    def __init__(self) -> None:
        super().__init__(3, 4)
        self.linear = torch.nn.Linear(3, 4)

    def forward(self, x, mask=None, state=None):
        mask = self.check_input(x, mask)
        return torch.where(mask.unsqueeze(-1), self.linear(x), 0.0), None


def test_the_padding_gradient_check_finds_nan_pads_in_a_gradient_and_leaves_grads_and_rng_alone():
    with pytest.raises(AssertionError, match=r"non-finite gradients of \['linear\.weight'\]"):
        assert_padding_gradients(_PadsInTheGradient(), [3, 1])
    enc = build_encoder("lstm", 3, hidden_size=4, num_layers=2, dropout=0.5)
    for p in enc.parameters():
        p.grad = torch.ones_like(p)
    rng = torch.get_rng_state()
    assert_padding_gradients(enc, [3, 1, 0])
    assert all(p.grad.eq(1).all() for p in enc.parameters()) and torch.equal(torch.get_rng_state(), rng)


class _CumSum(Encoder):
    """A correct causal, stateful encoder: out_t = state + sum_{s<=t} W x_s at real tokens, 0 at
    pads; final state (B, H) = the sum after each row's last real token. Subclasses break it."""

    def __init__(self, input_size: int = 3, hidden_size: int = 4) -> None:
        super().__init__(input_size, hidden_size)
        with torch.random.fork_rng():  # the same weights every time, the global RNG left alone
            torch.manual_seed(0)
            self.linear = nn.Linear(input_size, hidden_size)

    def run(self, x, mask, state):
        """(outputs before the pad fill, final state)."""
        y = zero_padding(self.linear(zero_padding(x, mask)), mask)
        start = state if state is not None else y.new_zeros(x.shape[0], self.hidden_size)
        c = y.cumsum(1) + start.unsqueeze(1)
        lengths = lengths_from_mask(mask)
        last = c.gather(1, (lengths - 1).clamp(min=0).view(-1, 1, 1).expand(-1, 1, self.hidden_size))[:, 0]
        return c, torch.where((lengths > 0).unsqueeze(1), last, start)

    def forward(self, x, mask=None, state=None):
        mask = self.check_input(x, mask)
        c, final = self.run(x, mask, state)
        return zero_padding(c, mask), final


def test_the_reference_encoder_of_these_checker_tests_passes_the_contract():
    assert_contract(_CumSum())
    assert_contract(_CumSum().double())  # the checker draws its input in the encoder's dtype


class _PadOutputsNotZero(_CumSum):
    def forward(self, x, mask=None, state=None):
        mask = self.check_input(x, mask)
        return self.run(x, mask, state)  # pads hold the running sum, not 0


class _MultipliesByTheMask(_CumSum):
    """``y * mask`` instead of a fill: a NaN pad stays NaN (0 x NaN) in the pad outputs only."""

    def forward(self, x, mask=None, state=None):
        mask = self.check_input(x, mask)
        c, final = self.run(x, mask, state)
        return (c + 0 * x.sum(-1, keepdim=True)) * mask.unsqueeze(-1), final


class _SecondStateCountsPads(_CumSum):
    """State (sum, steps) whose second tensor counts every position, pads included."""

    def forward(self, x, mask=None, state=None):
        mask = self.check_input(x, mask)
        c, final = self.run(x, mask, None if state is None else state[0])
        steps = x.new_full((x.shape[0], 1), float(x.shape[1]))
        return zero_padding(c, mask), (final, steps)


class _DropsEmptyRowsFromTheState(_CumSum):
    """Returns the final state of the non-empty rows only (as a packed run that skips them would)."""

    def forward(self, x, mask=None, state=None):
        mask = self.check_input(x, mask)
        c, final = self.run(x, mask, state)
        return zero_padding(c, mask), final[lengths_from_mask(mask) > 0]


class _NormalisesOverTheBatch(_CumSum):
    def forward(self, x, mask=None, state=None):
        out, final = super().forward(x, mask, state)
        return out / (1 + lengths_from_mask(self.check_input(x, mask)).max()), final


class _UnsortsWithTheSortPermutation(_CumSum):
    """Sorts rows by length and 'unsorts' with the same permutation instead of its inverse: right
    whenever that permutation is its own inverse (as for the check's first two batches)."""

    def forward(self, x, mask=None, state=None):
        mask = self.check_input(x, mask)
        order = lengths_from_mask(mask).argsort(descending=True, stable=True)
        out, final = super().forward(x[order], mask[order], None if state is None else state[order])
        return out[order], final[order]


class _ForgetsTheStepCount(_CumSum):
    """State (sum, tokens seen); the count restarts at every chunk instead of carrying on."""

    def forward(self, x, mask=None, state=None):
        mask = self.check_input(x, mask)
        c, final = self.run(x, mask, None if state is None else state[0])
        return zero_padding(c, mask), (final, lengths_from_mask(mask).to(x.dtype).unsqueeze(1))


class _EmptyRowsRestart(_CumSum):
    """A row with no real token in a chunk gets the zero state back instead of keeping its own."""

    def forward(self, x, mask=None, state=None):
        out, final = super().forward(x, mask, state)
        return out, final * lengths_from_mask(self.check_input(x, mask)).gt(0).unsqueeze(1)


def test_chunk_check_carries_the_state_of_rows_that_have_ended():
    """Chunks of a padded batch: a row that ended in an earlier chunk keeps its state (FAULTS has
    the encoder that resets it); without early ends it passes, and the rows must span the chunks."""
    assert_stateful_chunks(_EmptyRowsRestart().eval(), lengths=(9, 9, 9, 9))  # no row ends early: no fault
    with pytest.raises(ValueError, match="must span the chunks"):
        assert_stateful_chunks(_CumSum().eval(), lengths=(8, 4))


class _GradientLeaksToPads(torch.autograd.Function):
    """A hand-written backward (as the QRNN kernels have) that forgets to zero the pads' gradient."""

    @staticmethod
    def forward(ctx, x, mask):
        return x.masked_fill(~mask.unsqueeze(-1), 0.0)

    @staticmethod
    def backward(ctx, grad):
        return grad + 1.0, None


class _ReadsPadsBackwards(Encoder):
    """Right outputs, finite parameter gradients, but a nonzero input gradient at the pads."""

    def __init__(self) -> None:
        super().__init__(3, 3)
        self.scale = nn.Parameter(torch.ones(3))

    def forward(self, x, mask=None, state=None):
        mask = self.check_input(x, mask)
        return torch.where(mask.unsqueeze(-1), _GradientLeaksToPads.apply(x, mask) * self.scale, 0.0), None


def test_gradient_check_rejects_an_input_gradient_at_pads():
    """The input gradient must be zero at pads."""
    enc = _ReadsPadsBackwards()
    with torch.no_grad():
        assert_padding_invariant(enc.eval(), [4, 2])  # the outputs alone look right
    with pytest.raises(AssertionError, match="input gradient at pad positions"):
        assert_padding_gradients(enc, [4, 2])


class _PadsInTheGradientWhenTraining(_CumSum):
    """A training-only fast path that multiplies by the mask (0 x NaN in the weight gradient)."""

    def forward(self, x, mask=None, state=None):
        if not self.training:
            return super().forward(x, mask, state)
        mask = self.check_input(x, mask)
        y = torch.where(mask.unsqueeze(-1), self.linear(x), 0.0)
        return y.cumsum(1) * mask.unsqueeze(-1), None


class _PartlyNanGradient(Encoder):
    """One parameter whose gradient is NaN in one entry only."""

    def __init__(self) -> None:
        super().__init__(3, 3)
        self.mix = nn.Parameter(torch.tensor([0.5, 0.5]))

    def forward(self, x, mask=None, state=None):
        mask = self.check_input(x, mask)
        y = self.mix[0] * x + self.mix[1] * x.nan_to_num()
        return torch.where(mask.unsqueeze(-1), y, 0.0), None


class _DependsSlightlyOnPadding(_CumSum):
    def __init__(self, size: float) -> None:
        super().__init__()
        self.size = size

    def forward(self, x, mask=None, state=None):
        out, final = super().forward(x, mask, state)
        pads = (~self.check_input(x, mask)).sum(1, keepdim=True).unsqueeze(-1)
        return out + self.size * pads * (out != 0), final


def test_assert_contract_tolerance_is_float32_rounding():
    """assert_contract's tolerance is derived from float32's rounding error on the encoder (here a
    few 1e-6): a padding dependence of 1e-4 fails, one of 1e-7 (float rounding's size) passes."""
    assert 1e-6 < rounding_tolerance(_DependsSlightlyOnPadding(1e-4)) < 1e-4
    with pytest.raises(AssertionError, match="padded vs alone"):
        assert_contract(_DependsSlightlyOnPadding(1e-4))
    assert_contract(_DependsSlightlyOnPadding(1e-7))


# (the broken encoder, the check that must reject it, what the check says)
FAULTS = [
    (_PadOutputsNotZero, partial(assert_padding_invariant, lengths=[4, 2]), "pad positions must be zero"),
    (_MultipliesByTheMask, partial(assert_padding_invariant, lengths=[4, 2]), "pad positions"),
    (_SecondStateCountsPads, partial(assert_padding_invariant, lengths=[4, 2]), "final state"),
    (_DropsEmptyRowsFromTheState, partial(assert_padding_invariant, lengths=[7, 3, 1, 5, 0]), "no batch dimension"),
    (_NormalisesOverTheBatch, assert_batch_invariant, r"rows 1\.\.3"),
    (_UnsortsWithTheSortPermutation, assert_batch_invariant, "shuffled batch"),
    (_ForgetsTheStepCount, assert_stateful_chunks, "final state"),
    (_EmptyRowsRestart, assert_stateful_chunks, "final state"),
    (_PadsInTheGradientWhenTraining, partial(assert_padding_gradients, lengths=[4, 2]), "non-finite gradients"),
    (_PartlyNanGradient, partial(assert_padding_gradients, lengths=[4, 2]), r"non-finite gradients of \['mix'\]"),
    (_PadsInTheGradient, assert_contract, "non-finite gradients"),  # passes every other invariant
]


@pytest.mark.parametrize(("broken", "check", "message"), FAULTS, ids=[f[0].__name__.strip("_") for f in FAULTS])
def test_the_checker_rejects_each_fault(broken, check, message):
    """Each deliberately broken encoder is rejected by the check that exists for its fault (the
    padding check runs the batch with NaN pads, compares every state tensor of every row, needs a
    state of the whole batch; the batch check compares a padded sub-batch and a shuffled batch; the
    chunk check compares the final state; the gradient check runs in training mode and refuses any
    non-finite entry; assert_contract includes it)."""
    with pytest.raises(AssertionError, match=message):
        check(broken().eval())
