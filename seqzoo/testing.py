"""Checks of the encoder contract, reusable for any encoder (ours or a user's).

Each function raises AssertionError with the measured difference when the invariant fails. Their
``atol`` defaults to :func:`rounding_tolerance`, derived from the encoder's float32-vs-float64 error,
so that a correct encoder passes on any CPU (vector width, fused multiply-adds) or GPU.
"""

from __future__ import annotations

import copy

import torch
from torch import Tensor

from seqzoo.encoders.base import Encoder, detach_state, module_mode

__all__ = [
    "assert_batch_invariant",
    "assert_contract",
    "assert_padding_gradients",
    "assert_padding_invariant",
    "assert_stateful_chunks",
    "rounding_tolerance",
]


def _close(a: Tensor, b: Tensor, atol: float, what: str) -> None:
    diff = (a - b).abs().max().item() if a.numel() else 0.0
    if not diff <= atol:
        raise AssertionError(f"{what}: max abs diff {diff:.3g} > {atol:.3g}")


def _flat(state: object) -> list[Tensor]:
    if state is None:
        return []
    if isinstance(state, Tensor):
        return [state]
    if isinstance(state, (tuple, list)):
        return [t for s in state for t in _flat(s)]
    if isinstance(state, dict):
        return [t for k in sorted(state) for t in _flat(state[k])]
    raise TypeError(type(state))


def _batch_dim(batched: Tensor, alone: Tensor, batch: int) -> int:
    """Index of the batch dimension of a state tensor: the one dimension where the batch's state
    (size ``batch`` > 1) and a single row's state (size 1) differ."""
    if batched.dim() != alone.dim():
        raise AssertionError(f"state shapes {tuple(batched.shape)} (batch) and {tuple(alone.shape)} (one row) differ")
    dims = [d for d, (a, b) in enumerate(zip(batched.shape, alone.shape, strict=True)) if a != b]
    if len(dims) != 1 or batched.shape[dims[0]] != batch or alone.shape[dims[0]] != 1:
        raise AssertionError(f"state of shape {tuple(batched.shape)} has no batch dimension of size {batch}")
    return dims[0]


def _nan_padded(encoder: Encoder, lengths: list[int], seed: int) -> tuple[Tensor, Tensor]:
    """Random input (B, T, D) with NaN at every pad position, and its mask (B, T)."""
    gen = torch.Generator().manual_seed(seed)
    x = _randn(encoder, gen, len(lengths), max(lengths))
    mask = (torch.arange(x.shape[1]).unsqueeze(0) < torch.tensor(lengths).unsqueeze(1)).to(x.device)
    return x.masked_fill(~mask.unsqueeze(-1), float("nan")), mask


def rounding_tolerance(encoder: Encoder, seed: int = 0) -> float:
    """How far two correct evaluations of ``encoder`` in its dtype may differ (a row alone and in a
    batch take different kernels, so they round differently): the default ``atol`` of the checks.

    A copy of the encoder runs a padded batch in float32 and in float64; their difference ``e`` is
    float32's rounding error on this function (about κ · eps32 for its condition number κ), so in
    the encoder's dtype the error is about ``e · eps / eps32``. Each of two evaluations lies within
    it of the exact result: 8 times it, plus 16 ulps of the outputs' scale, bounds their difference."""
    param = next(encoder.parameters(), None)
    dtype = param.dtype if param is not None and param.is_floating_point() else torch.get_default_dtype()
    twin = copy.deepcopy(encoder)
    x = _randn(twin.double(), torch.Generator().manual_seed(seed), 6, 9).double()  # (B, T, D)
    mask = (torch.arange(9).unsqueeze(0) < torch.tensor([9, 4, 7, 1, 9, 5]).unsqueeze(1)).to(x.device)
    with module_mode(twin, training=False), torch.no_grad():
        exact = twin(x, mask)[0]
        error = (twin.float()(x.float(), mask)[0].double() - exact).abs().max().item()
    eps = torch.finfo(dtype).eps
    scale = max(1.0, exact.abs().max().item())
    return 8 * error * eps / torch.finfo(torch.float32).eps + 16 * eps * scale


def assert_padding_invariant(encoder: Encoder, lengths: list[int], atol: float | None = None, seed: int = 0) -> None:
    """Each row of a padded batch gives the outputs (and final state) of that row run alone,
    whatever its pads hold: they are NaN here. ``atol``: :func:`rounding_tolerance` when None."""
    atol = rounding_tolerance(encoder, seed) if atol is None else atol
    x, mask = _nan_padded(encoder, lengths, seed)
    batch, time = x.shape[:2]
    out, state = encoder(x, mask)
    if out.shape != (batch, time, encoder.output_size):
        raise AssertionError(f"output shape {tuple(out.shape)} != {(batch, time, encoder.output_size)}")
    _close(out[~mask], torch.zeros_like(out[~mask]), 0.0, "outputs at pad positions must be zero")
    for b, n in enumerate(lengths):
        if n == 0:
            continue
        alone, alone_state = encoder(x[b : b + 1, :n], torch.ones(1, n, dtype=torch.bool, device=x.device))
        _close(out[b, :n], alone[0], atol, f"row {b} (length {n}) padded vs alone")
        for s_batch, s_alone in zip(_flat(state), _flat(alone_state), strict=True):
            if batch > 1:
                dim = _batch_dim(s_batch, s_alone, batch)
                s_batch, s_alone = s_batch.select(dim, b), s_alone.select(dim, 0)
            _close(s_batch, s_alone, atol, f"row {b} final state")


def assert_padding_gradients(encoder: Encoder, lengths: list[int], seed: int = 0) -> None:
    """Gradients from the real outputs of a padded batch whose pads are NaN, in training mode (cuDNN
    has no RNN backward in eval mode): every parameter's gradient is finite and the input's
    gradient is zero at the pads. The parameters' ``.grad`` and the global random state (dropout
    draws) are left as they were."""
    x, mask = _nan_padded(encoder, lengths, seed)
    x.requires_grad_(True)
    named = [(name, p) for name, p in encoder.named_parameters() if p.requires_grad]
    with (
        torch.random.fork_rng(devices=[x.device.index or 0] if x.is_cuda else []),
        module_mode(encoder, training=True),
    ):
        out, _ = encoder(x, mask)
    dx, *grads = torch.autograd.grad(out[mask].sum(), [x, *(p for _, p in named)], allow_unused=True)
    bad = [name for (name, _), g in zip(named, grads, strict=True) if g is not None and not g.isfinite().all()]
    if bad:
        raise AssertionError(f"non-finite gradients of {bad} from a batch with NaN pads")
    _close(dx[~mask], torch.zeros_like(dx[~mask]), 0.0, "input gradient at pad positions must be zero")


def assert_batch_invariant(encoder: Encoder, atol: float | None = None, seed: int = 0) -> None:
    """Outputs of a row do not depend on which other rows share the batch. ``atol``:
    :func:`rounding_tolerance` when None."""
    atol = rounding_tolerance(encoder, seed) if atol is None else atol
    gen = torch.Generator().manual_seed(seed)
    x = _randn(encoder, gen, 6, 9)
    mask = (torch.arange(9).unsqueeze(0) < torch.tensor([9, 4, 7, 1, 9, 5]).unsqueeze(1)).to(x.device)
    full, _ = encoder(x, mask)
    part, _ = encoder(x[1:4], mask[1:4])
    _close(full[1:4], part, atol, "rows 1..3 in a batch of 6 vs a batch of 3")
    order = torch.tensor([5, 3, 1, 0, 4, 2], device=x.device)
    shuffled, _ = encoder(x[order], mask[order])
    _close(full[order], shuffled, atol, "shuffled batch")


def assert_stateful_chunks(
    encoder: Encoder,
    chunks: tuple[int, ...] = (3, 1, 5),
    atol: float | None = None,
    seed: int = 0,
    lengths: tuple[int, ...] = (9, 6, 4, 2),
) -> None:
    """Running a padded batch chunk by chunk, carrying (detached) state, equals one whole run:
    outputs and each row's final state. The default rows end in the last chunk, at the end of
    the second and inside the first (then all pads: their state must pass through unchanged).
    ``atol``: :func:`rounding_tolerance` when None."""
    time = sum(chunks)
    if max(lengths) != time:
        raise ValueError(f"the longest row ({max(lengths)}) must span the chunks ({time} steps)")
    atol = rounding_tolerance(encoder, seed) if atol is None else atol
    x, mask = _nan_padded(encoder, list(lengths), seed)
    whole, whole_state = encoder(x, mask)
    state, pieces, start = None, [], 0
    for n in chunks:
        out, state = encoder(x[:, start : start + n], mask[:, start : start + n], state=state)
        state = detach_state(state)
        pieces.append(out)
        start += n
    _close(torch.cat(pieces, 1), whole, atol, "chunked vs whole-sequence outputs")
    for a, b in zip(_flat(state), _flat(whole_state), strict=True):
        _close(a, b, atol, "chunked vs whole-sequence final state")


def assert_contract(encoder: Encoder, atol: float | None = None) -> None:
    """All invariants that apply to ``encoder`` (stateful chunking only for causal ones): in eval mode,
    except the gradient check (:func:`assert_padding_gradients`). ``atol``: :func:`rounding_tolerance`
    when None."""
    atol = rounding_tolerance(encoder) if atol is None else atol
    with module_mode(encoder, training=False):
        with torch.no_grad():
            assert_padding_invariant(encoder, [7, 3, 1, 5, 0], atol)
            assert_batch_invariant(encoder, atol)
            if encoder.causal and encoder.stateful:
                assert_stateful_chunks(encoder, atol=atol)
        assert_padding_gradients(encoder, [7, 3, 1, 5, 0])


def _randn(encoder: Encoder, gen: torch.Generator, batch: int, time: int) -> Tensor:
    """(batch, time, input_size) normal input, drawn on the CPU (the same values on every device)
    in the dtype and on the device of the encoder's parameters."""
    param = next(encoder.parameters(), None)
    dtype = param.dtype if param is not None else torch.get_default_dtype()
    x = torch.randn(batch, time, encoder.input_size, generator=gen, dtype=dtype)
    return x if param is None else x.to(param.device)
