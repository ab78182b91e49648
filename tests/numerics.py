"""Float32 tolerances derived from float64, so that they hold on any x86-64 CPU.

Two float32 computations of the same function (eager and compiled, a fused kernel and its
reference, a batch and a row alone) round differently, and by how much depends on the CPU's
vector width and fused multiply-adds (ATen picks its kernels by CPU capability: AVX2, AVX-512 ...).
A fixed ``atol`` tuned on one machine fails on another. Here a float32 result ``got`` is compared
with the same function in float64, ``ref64``, and allowed ``factor`` times the float32 error of a
plain float32 ``twin`` of it (the eager or reference computation), plus ``factor`` float32 ulps of
the result's scale: the error any correct float32 evaluation of the function makes, up to the
factor. A wrong formula (a sign, a missing term) is off by O(scale), orders of magnitude more.
"""

from __future__ import annotations

import copy

import torch
from conftest import no_eager_fallback
from torch import Tensor

EPS32 = torch.finfo(torch.float32).eps


def float32_tolerance(ref64: Tensor, twin: Tensor | None = None, factor: float = 32.0) -> float:
    """``factor`` x (max |twin - ref64| + eps32 · max |ref64|): what a float32 evaluation may be off by."""
    scale = ref64.abs().max().item() if ref64.numel() else 0.0
    twin_error = (twin.double() - ref64).abs().max().item() if twin is not None and twin.numel() else 0.0
    return factor * (twin_error + EPS32 * scale)


def assert_close_to_float64(
    got: Tensor, ref64: Tensor, twin: Tensor | None = None, *, factor: float = 32.0, what: str = ""
) -> None:
    """``got`` (float32) is within :func:`float32_tolerance` of ``ref64`` (the same function in float64)."""
    assert ref64.dtype == torch.float64, f"{what}: the reference must be float64, got {ref64.dtype}"
    assert got.shape == ref64.shape, f"{what}: shape {tuple(got.shape)} != {tuple(ref64.shape)}"
    tol = float32_tolerance(ref64, twin, factor)
    diff = (got.double() - ref64).abs().max().item() if got.numel() else 0.0
    assert diff <= tol, f"{what}: max abs diff to float64 {diff:.3g} > {tol:.3g}"


def assert_all_close_to_float64(
    got: list[Tensor], ref64: list[Tensor], twin: list[Tensor] | None = None, *, factor: float = 32.0
) -> None:
    """:func:`assert_close_to_float64` for each of a list of results (outputs, gradients ...)."""
    assert len(got) == len(ref64), f"{len(got)} results, {len(ref64)} references"
    twins = twin if twin is not None else [None] * len(got)
    for i, (a, r, t) in enumerate(zip(got, ref64, twins, strict=True)):
        assert_close_to_float64(a, r, t, factor=factor, what=f"result {i}")


def perturbed(module: torch.nn.Module, scale: float = 0.3) -> torch.nn.Module:
    """``module`` with every parameter moved off its initial value: zero biases or constant initial
    scales would hide a term read from the wrong place."""
    with torch.no_grad():
        for p in module.parameters():
            p.add_(torch.randn_like(p) * scale)
    return module


def assert_compiled_matches_eager(eager: torch.nn.Module, compiled: torch.nn.Module, x: Tensor, mask: Tensor) -> None:
    """``compiled`` (``compile_step``, ``eager``'s weights) is off float64 by no more than ``eager`` float32
    is, up to a factor (:func:`assert_all_close_to_float64`), in its outputs, its final state (a tuple of
    tensors) and its parameter gradients, without falling back to the eager step."""
    results = []
    for encoder, inputs in ((copy.deepcopy(eager).double(), x.double()), (eager, x), (compiled, x)):
        with no_eager_fallback():
            out, state = encoder(inputs, mask)
        loss = out.pow(2).sum() + sum(part.sum() for part in state)
        results.append([out, *state, *torch.autograd.grad(loss, list(encoder.parameters()))])
    exact, expected, got = results
    assert_all_close_to_float64(got, exact, expected)


def assert_encoder_gradcheck(encoder: torch.nn.Module) -> None:
    """float64 ``gradcheck`` (fast mode) of ``encoder``'s outputs with respect to every parameter and an
    input x (2, 3, input_size) drawn here, whose second row is one pad after two tokens."""
    x = torch.randn(2, 3, encoder.input_size, dtype=torch.float64, requires_grad=True)
    mask = torch.tensor([[True, True, True], [True, True, False]])
    names = [name for name, _ in encoder.named_parameters()]
    weights = tuple(p.detach().clone().requires_grad_(True) for p in encoder.parameters())

    def run(x: Tensor, *weights: Tensor) -> Tensor:
        return torch.func.functional_call(encoder, dict(zip(names, weights, strict=True)), (x, mask))[0]

    assert torch.autograd.gradcheck(run, (x, *weights), fast_mode=True)
