"""QRNN pooling kernels: fast paths == PyTorch reference, gradchecks, fallback warnings."""

from __future__ import annotations

import functools
import importlib
import sys
import warnings

import pytest
import torch
from numerics import EPS32, assert_all_close_to_float64, assert_close_to_float64

from seqzoo import build_encoder
from seqzoo.kernels.qrnn_pool import (
    POOLINGS,
    pool_backend,
    qrnn_layer,
    qrnn_pool,
    qrnn_pool_compiled,
    qrnn_pool_reference,
    window_linear,
)

pool_module = importlib.import_module("seqzoo.kernels.qrnn_pool")  # the package re-exports a function of that name
needs_compiled = pytest.mark.skipif(pool_backend() != "compiled", reason="compiled kernel not built")
ZONEOUT = ["none", "train", "eval"]


def _inputs(pooling: str, zoneout: str, dtype: torch.dtype = torch.float32, shape=(4, 9, 70), seed: int = 0):
    gen = torch.Generator().manual_seed(seed)
    batch, time, hidden = shape
    gates = torch.randn(batch, time, POOLINGS[pooling], hidden, generator=gen, dtype=dtype).requires_grad_(True)
    c0 = torch.randn(batch, hidden, generator=gen, dtype=dtype).requires_grad_(True)
    lengths = torch.tensor([time, time // 2, 0, 1][:batch])
    keep = torch.rand(batch, time, hidden, generator=gen) >= 0.3 if zoneout == "train" else None
    return gates, lengths, c0, {"pooling": pooling, "keep": keep, "keep_prob": 0.7 if zoneout == "eval" else 1.0}


def _weighted_loss(h: torch.Tensor, c: torch.Tensor) -> torch.Tensor:
    gen = torch.Generator().manual_seed(1)
    weights = [torch.randn(t.shape, generator=gen).to(t.device, t.dtype) for t in (h, c)]  # alike in any dtype
    return (h * weights[0]).sum() + (c * weights[1]).sum()


def _values_and_grads(fn, gates, lengths, c0, kwargs, reverse, loss=_weighted_loss):
    """h, c_last and the gradients of ``loss(h, c_last)`` w.r.t. the gates (and c0, where given)."""
    h, c = fn(gates, lengths, c0, reverse=reverse, **kwargs)
    return (h, c, *torch.autograd.grad(loss(h, c), (gates,) if c0 is None else (gates, c0)))


def _assert_all_close(fast, ref, atol, rtol):
    """Float64 results that must agree to rounding (``atol`` and ``rtol`` far above float64's eps)."""
    for name, a, b in zip(("h", "c_last", "d_gates", "d_c0")[: len(fast)], fast, ref, strict=True):
        assert a.dtype == b.dtype == torch.float64, f"{name}: {a.dtype}, {b.dtype}"
        assert torch.allclose(a, b, atol=atol, rtol=rtol), f"{name}: max diff {(a - b).abs().max():.3g}"


def _float64(t: torch.Tensor | None) -> torch.Tensor | None:
    """A float64 leaf copy of ``t`` (None stays None), for the float64 twin of a float32 computation."""
    return None if t is None else t.detach().double().requires_grad_(t.requires_grad)


def _assert_matches_float64_reference(fast, gates, lengths, c0, kwargs, reverse, loss=_weighted_loss):
    """Float32 results of a fast path (h, c_last and gradients) are as close to the reference run in
    float64 as the float32 reference is, up to a factor (tests/numerics.py)."""
    twin = _values_and_grads(qrnn_pool_reference, gates, lengths, c0, kwargs, reverse, loss)
    exact = _values_and_grads(qrnn_pool_reference, _float64(gates), lengths, _float64(c0), kwargs, reverse, loss)
    assert [a.dtype for a in fast] == [b.dtype for b in twin]
    assert_all_close_to_float64(list(fast), list(exact), list(twin))


def _assert_matches_reference(fn, pooling, zoneout, reverse):
    gates, lengths, c0, kwargs = _inputs(pooling, zoneout)
    fast = _values_and_grads(fn, gates, lengths, c0, kwargs, reverse)
    _assert_matches_float64_reference(fast, gates, lengths, c0, kwargs, reverse)
    assert not fast[0][1, lengths[1] :].any() and not fast[0][2].any(), "outputs at pads must be zero"


@needs_compiled
@pytest.mark.parametrize("pooling", list(POOLINGS))
@pytest.mark.parametrize("zoneout", ZONEOUT)
@pytest.mark.parametrize("reverse", [False, True])
def test_compiled_matches_reference(pooling, zoneout, reverse):
    _assert_matches_reference(qrnn_pool_compiled, pooling, zoneout, reverse)


@pytest.mark.parametrize("backend", ["reference", pytest.param("compiled", marks=needs_compiled)])
@pytest.mark.parametrize("pooling", list(POOLINGS))
@pytest.mark.parametrize("reverse", [False, True])
def test_gradcheck_float64(backend, pooling, reverse):
    fn = qrnn_pool_compiled if backend == "compiled" else qrnn_pool_reference
    for zoneout in ZONEOUT:
        gates, lengths, c0, kwargs = _inputs(pooling, zoneout, torch.float64, shape=(3, 5, 4))
        pool = functools.partial(fn, lengths=lengths, reverse=reverse, **kwargs)
        assert torch.autograd.gradcheck(lambda g, c, pool=pool: pool(g, c0=c), (gates, c0))


@needs_compiled
def test_compiled_inference_without_autograd():
    gates, lengths, c0, kwargs = _inputs("fo", "eval")
    with torch.no_grad():
        h, c = qrnn_pool_compiled(gates, lengths, c0, **kwargs)
        h_ref, c_ref = qrnn_pool_reference(gates, lengths, c0, **kwargs)
        h64, c64 = qrnn_pool_reference(gates.double(), lengths, c0.double(), **kwargs)
    assert_close_to_float64(h, h64, h_ref, what="h")
    assert_close_to_float64(c, c64, c_ref, what="c_last")


def test_fallback_warns_when_compiled_kernel_is_missing(monkeypatch):
    monkeypatch.delenv("SEQZOO_QRNN_BACKEND", raising=False)
    monkeypatch.setattr(pool_module, "_compiled_library", lambda: "cannot load _qrnn_pool.so (test)")
    assert pool_backend() == "reference"
    gates, lengths, c0, kwargs = _inputs("fo", "none")
    with pytest.warns(RuntimeWarning, match="cannot load _qrnn_pool.so") as record:
        h, _ = qrnn_pool(gates, lengths, c0, **kwargs)
    assert torch.equal(h, qrnn_pool_reference(gates, lengths, c0, **kwargs)[0])  # it is the reference
    # the warning names the user's line, not torch's compiler wrapper or the encoder's internals
    assert [w.filename for w in record] == [__file__]
    with pytest.warns(RuntimeWarning, match="cannot load _qrnn_pool.so") as record:
        build_encoder("qrnn", 4, hidden_size=3)(torch.randn(2, 5, 4))
    assert [w.filename for w in record] == [__file__]


def test_reference_on_request_does_not_warn(monkeypatch):
    monkeypatch.setenv("SEQZOO_QRNN_BACKEND", "reference")
    assert pool_backend() == "reference"
    gates, lengths, c0, kwargs = _inputs("ifo", "none")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        qrnn_pool(gates, lengths, c0, **kwargs)


def test_rejects_wrong_gate_count():
    with pytest.raises(ValueError, match="needs gates"):
        qrnn_pool(torch.zeros(2, 3, 2, 4), torch.tensor([3, 3]), pooling="fo")


def _interpreted_triton(monkeypatch, small: bool):
    """The Triton module re-imported with TRITON_INTERPRET=1, so its kernels run on CPU tensors;
    ``small``: chunks of 4 steps and blocks of 16 channels, so that the short test sequences span
    several chunks (the scan's carry from chunk to chunk) and rows several blocks."""
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    pytest.importorskip("triton")
    sys.modules.pop("seqzoo.kernels.qrnn_pool_triton", None)
    module = importlib.import_module("seqzoo.kernels.qrnn_pool_triton")
    if small:
        monkeypatch.setattr(module, "_CHUNK", 4)
        monkeypatch.setattr(module, "_BLOCK", 16)
    try:  # a loop bound loaded from memory, as the kernels have
        module.qrnn_pool_triton(torch.zeros(1, 1, 1, 1), torch.tensor([1]), pooling="f")
    except Exception as error:
        if "only 0-dimensional arrays can be converted" not in str(error):
            raise
        import numpy
        import triton

        sys.modules.pop("seqzoo.kernels.qrnn_pool_triton", None)  # later tests get the compiled kernel
        pytest.skip(
            f"Triton {triton.__version__}'s interpreter keeps scalars as 1-element arrays, which NumPy "
            f"{numpy.__version__} no longer converts to int (a loop bound); Triton 3.9 runs these tests"
        )
    return module


@pytest.fixture
def interpreted_triton(monkeypatch):
    """The interpreted kernel at small chunk and block sizes."""
    yield _interpreted_triton(monkeypatch, small=True).qrnn_pool_triton
    sys.modules.pop("seqzoo.kernels.qrnn_pool_triton", None)


@pytest.fixture
def interpreted_triton_at_gpu_sizes(monkeypatch):
    """The interpreted kernel at the module's own chunk and block sizes, which a GPU runs."""
    yield _interpreted_triton(monkeypatch, small=False).qrnn_pool_triton
    sys.modules.pop("seqzoo.kernels.qrnn_pool_triton", None)


@pytest.mark.parametrize(
    ("pooling", "zoneout", "reverse"),
    [("f", "eval", True), ("fo", "train", False), ("ifo", "train", True), ("ifo", "none", False)],
)
def test_triton_interpreter_matches_reference(interpreted_triton, pooling, zoneout, reverse):
    _assert_matches_reference(interpreted_triton, pooling, zoneout, reverse)


@pytest.mark.parametrize(
    ("pooling", "reverse", "zoneout"), [("f", True, "eval"), ("fo", False, "train"), ("ifo", True, "train")]
)
def test_triton_interpreter_gradcheck_float64(interpreted_triton, pooling, reverse, zoneout):
    """Float64 gates make the kernels compute in float64, so they pass a float64 gradcheck (small:
    the interpreter is slow; 5 steps span two of the fixture's chunks)."""
    gates, lengths, c0, kwargs = _inputs(pooling, zoneout, torch.float64, shape=(2, 5, 2))
    pool = functools.partial(interpreted_triton, lengths=lengths, reverse=reverse, **kwargs)
    assert torch.autograd.gradcheck(lambda g, c: pool(g, c0=c), (gates, c0))


def test_triton_double_backward_goes_through_the_reference(interpreted_triton):
    gates, lengths, c0, kwargs = _inputs("fo", "train", shape=(3, 5, 4))
    results = []
    for fn, g, c0_ in ((interpreted_triton, gates, c0), (qrnn_pool_reference, gates, c0)):
        h, c = fn(g, lengths, c0_, **kwargs)
        dgates, dc0 = torch.autograd.grad(h.square().sum() + c.sum(), (g, c0_), create_graph=True)
        results.append(torch.autograd.grad(dgates.square().sum() + dc0.square().sum(), (g, c0_)))
    g64, c64 = _float64(gates), _float64(c0)
    h, c = qrnn_pool_reference(g64, lengths, c64, **kwargs)
    dgates, dc0 = torch.autograd.grad(h.square().sum() + c.sum(), (g64, c64), create_graph=True)
    exact = torch.autograd.grad(dgates.square().sum() + dc0.square().sum(), (g64, c64))
    assert_all_close_to_float64(list(results[0]), list(exact), list(results[1]))


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("pooling", list(POOLINGS))
def test_triton_on_gpu_keeps_float64_keep_prob_exact(pooling):
    """keep_prob (zoneout at evaluation) reached the kernel as a float32 argument: float64 results
    were 6e-9 off the reference at keep_prob 0.7 (Triton's interpreter, in CI, holds it as a double)."""
    assert pool_backend("cuda") == "triton"
    gates, lengths, c0, kwargs = _inputs(pooling, "eval", torch.float64)
    gates, c0 = gates.detach().cuda().requires_grad_(True), c0.detach().cuda().requires_grad_(True)
    lengths = lengths.cuda()
    fast = _values_and_grads(qrnn_pool, gates, lengths, c0, kwargs, reverse=True)
    ref = _values_and_grads(qrnn_pool_reference, gates, lengths, c0, kwargs, reverse=True)
    for a, b in zip(fast, ref, strict=True):
        torch.testing.assert_close(a, b, atol=1e-12, rtol=1e-12)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("pooling", list(POOLINGS))
def test_triton_on_gpu_matches_reference(pooling):
    assert pool_backend("cuda") == "triton"
    gates, lengths, c0, kwargs = _inputs(pooling, "train")
    gates, c0 = gates.detach().cuda().requires_grad_(True), c0.detach().cuda().requires_grad_(True)
    lengths, kwargs["keep"] = lengths.cuda(), kwargs["keep"].cuda()
    fast = _values_and_grads(qrnn_pool, gates, lengths, c0, kwargs, reverse=False)
    _assert_matches_float64_reference(fast, gates, lengths, c0, kwargs, reverse=False)


def _layer_inputs(window: int, pooling: str, dtype: torch.dtype = torch.float32, shape=(4, 9, 6, 5)):
    gen = torch.Generator().manual_seed(window)
    batch, time, n, hidden = shape
    x_pad = torch.randn(batch, time + window - 1, n, generator=gen, dtype=dtype)
    weight = torch.randn(POOLINGS[pooling] * hidden, window * n, generator=gen, dtype=dtype)
    bias = torch.randn(POOLINGS[pooling] * hidden, generator=gen, dtype=dtype)
    c0 = torch.randn(batch, hidden, generator=gen, dtype=dtype)
    lengths = torch.tensor([time, time // 2, 0, 1][:batch])
    return [t.requires_grad_(True) for t in (x_pad, weight, bias, c0)], lengths


@needs_compiled
@pytest.mark.parametrize(
    ("window", "pooling", "zoneout", "reverse"),
    [
        (1, "fo", "none", False),
        (2, "fo", "train", True),
        (2, "ifo", "train", False),
        (3, "ifo", "eval", False),
        (2, "f", "none", False),
    ],
)
def test_compiled_layer_matches_reference(monkeypatch, window, pooling, zoneout, reverse):
    """The fused convolution + pooling == concatenated windows + F.linear + reference pooling."""
    (x_pad, weight, bias, c0), lengths = _layer_inputs(window, pooling)
    _, _, _, kwargs = _inputs(pooling, zoneout, shape=(4, 9, 5))
    results = []
    for backend, dtype in (("auto", torch.float32), ("reference", torch.float32), ("reference", torch.float64)):
        monkeypatch.setenv("SEQZOO_QRNN_BACKEND", backend)
        inputs = [t if dtype == torch.float32 else _float64(t) for t in (x_pad, weight, bias, c0)]
        h, c = qrnn_layer(*inputs[:3], lengths, inputs[3], reverse=reverse, **kwargs)
        loss = (h * torch.linspace(-1, 1, h.numel(), dtype=dtype).view_as(h)).sum() + c.square().sum()
        results.append([h, c, *torch.autograd.grad(loss, inputs)])  # h, c_last, d_x, d_weight, d_bias, d_c0
    fast, twin, exact = results
    assert_all_close_to_float64(fast, exact, twin)


@needs_compiled
@pytest.mark.parametrize("window", [1, 2])
def test_gradcheck_compiled_layer_float64(window):
    (x_pad, weight, bias, c0), lengths = _layer_inputs(window, "fo", torch.float64, shape=(3, 4, 3, 2))
    keep = torch.rand(3, 4, 2, generator=torch.Generator().manual_seed(0)) >= 0.3
    for reverse in (False, True):
        layer = functools.partial(qrnn_layer, lengths=lengths, keep=keep, reverse=reverse)
        assert torch.autograd.gradcheck(lambda x, w, b, c, f=layer: f(x, w, b, c0=c), (x_pad, weight, bias, c0))


@needs_compiled
@pytest.mark.parametrize(("pooling", "reverse"), [("fo", False), ("ifo", True), ("f", False)])
def test_double_backward_through_the_compiled_kernels(pooling, reverse):
    """Under create_graph=True the fused backward returns the reference's gradients with their own
    graph, so gradients of gradients are right (they used to come out None or zero, silently)."""
    gates, lengths, c0, kwargs = _inputs(pooling, "train", torch.float64, shape=(3, 5, 4))
    pool = functools.partial(qrnn_pool_compiled, lengths=lengths, reverse=reverse, **kwargs)
    assert torch.autograd.gradgradcheck(lambda g, c: pool(g, c0=c), (gates, c0))
    (x_pad, weight, bias, c0), lengths = _layer_inputs(2, pooling, torch.float64, shape=(3, 4, 3, 2))
    layer = functools.partial(qrnn_layer, lengths=lengths, pooling=pooling, reverse=reverse)
    assert torch.autograd.gradgradcheck(lambda x, w, b, c: layer(x, w, b, c0=c), (x_pad, weight, bias, c0))


def test_gradient_penalty_of_a_qrnn_equals_the_reference(monkeypatch):
    """A penalty on the input gradient (WGAN-GP style) trains the same on either backend."""
    from seqzoo.encoders.qrnn import QRNN

    torch.manual_seed(0)
    encoder = QRNN(3, 4, num_layers=2, window=2).double()
    x = torch.randn(2, 5, 3, dtype=torch.float64, requires_grad=True)
    mask = torch.arange(5) < torch.tensor([5, 3]).unsqueeze(1)
    results = []
    for backend in ("auto", "reference"):
        monkeypatch.setenv("SEQZOO_QRNN_BACKEND", backend)
        (dx,) = torch.autograd.grad(encoder(x, mask)[0].square().sum(), x, create_graph=True)
        results.append(torch.autograd.grad(dx.square().sum(), (x, *encoder.parameters())))
    for a, b in zip(*results, strict=True):
        torch.testing.assert_close(a, b)
    assert results[0][0].abs().sum() > 0


@needs_compiled
def test_compiled_layer_backward_twice_recomputes_its_gate_buffer():
    (x_pad, weight, bias, c0), lengths = _layer_inputs(2, "fo")
    h, _ = qrnn_layer(x_pad, weight, bias, lengths, c0)
    first = torch.autograd.grad(h.sum(), (x_pad, weight, bias, c0), retain_graph=True)
    second = torch.autograd.grad(h.sum(), (x_pad, weight, bias, c0))
    for a, b in zip(first, second, strict=True):
        assert torch.equal(a, b)


@needs_compiled
@pytest.mark.parametrize("output", [0, 1])
def test_compiled_layer_gradient_through_one_output(monkeypatch, output):
    """An unused output's gradient is None inside the backward (read as zeros)."""
    (x_pad, weight, bias, c0), lengths = _layer_inputs(2, "ifo")
    grads = []
    for backend, inputs in (("auto", (x_pad, weight, bias, c0)), ("reference", (x_pad, weight, bias, c0))):
        monkeypatch.setenv("SEQZOO_QRNN_BACKEND", backend)
        out = qrnn_layer(*inputs[:3], lengths, inputs[3], pooling="ifo")[output]
        grads.append(torch.autograd.grad(out.square().sum(), inputs))
    inputs = [_float64(t) for t in (x_pad, weight, bias, c0)]
    out = qrnn_layer(*inputs[:3], lengths, inputs[3], pooling="ifo")[output]  # the reference: float64 is not fused
    assert_all_close_to_float64(list(grads[0]), list(torch.autograd.grad(out.square().sum(), inputs)), list(grads[1]))


def test_layer_rejects_weight_of_wrong_shape():
    (x_pad, weight, bias, c0), lengths = _layer_inputs(2, "ifo")
    with pytest.raises(ValueError, match="weight"):
        qrnn_layer(x_pad, weight, bias, lengths, c0, pooling="fo")


def test_shapes_the_kernels_would_index_out_of_bounds_are_refused():
    """The kernels do not bounds-check: lengths past T, a c0 or keep of another shape must be refused first."""
    gates, lengths, c0, kwargs = _inputs("fo", "none")  # B = 4, T = 9, H = 70
    (x_pad, weight, bias, _), _ = _layer_inputs(2, "fo")  # B = 4, T = 9, H = 5
    with pytest.raises(ValueError, match="lengths"):
        qrnn_pool(gates, torch.tensor([9, 10, 0, 1]), c0, **kwargs)
    with pytest.raises(ValueError, match="lengths"):
        qrnn_layer(x_pad, weight, bias, torch.tensor([9, 9, -1, 1]), pooling="fo")
    with pytest.raises(ValueError, match="c0"):
        qrnn_pool(gates, lengths, c0[:2], **kwargs)
    with pytest.raises(ValueError, match="c0"):
        qrnn_layer(x_pad, weight, bias, lengths, torch.zeros(4, 70), pooling="fo")
    with pytest.raises(ValueError, match="keep"):
        qrnn_pool(gates, lengths, c0, pooling="fo", keep=torch.ones(4, 2, 70, dtype=torch.bool))
    with pytest.raises(TypeError, match=r"lengths must be integers, got torch\.float32"):
        qrnn_pool(gates, lengths.float(), c0, **kwargs)


def test_tensors_on_another_device_than_the_gates_are_refused():
    """The C kernel dereferenced a CUDA pointer (a segfault) for lengths or c0 on CUDA with CPU gates
    (the meta device stands in for CUDA here)."""
    gates, lengths, c0, kwargs = _inputs("fo", "none")
    (x_pad, weight, bias, _), _ = _layer_inputs(2, "fo")
    for name, args in (("lengths", (lengths.to("meta"), c0)), ("c0", (lengths, c0.to("meta")))):
        with pytest.raises(ValueError, match=rf"^{name} is on meta but the gates on cpu: move it \(\.to\('cpu'\)\)"):
            qrnn_pool(gates, *args, **kwargs)
    with pytest.raises(ValueError, match=r"^lengths is on meta but the gates on cpu"):
        qrnn_layer(x_pad, weight, bias, lengths.to("meta"), pooling="fo")


@pytest.mark.parametrize("backend", ["reference", pytest.param("compiled", marks=needs_compiled)])
def test_c0_of_another_dtype_than_the_gates_is_refused(monkeypatch, backend):
    """A float64 c0 with float32 gates was narrowed by the fused kernel but promoted the reference's
    result to float64; half-precision gates pool in float32, so a float32 c0 is theirs."""
    monkeypatch.setenv("SEQZOO_QRNN_BACKEND", backend)
    gates, lengths, c0, kwargs = _inputs("fo", "none")
    (x_pad, weight, bias, _), layer_lengths = _layer_inputs(2, "fo")
    with pytest.raises(TypeError, match=r"^c0 is torch\.float64 but the gates are torch\.float32"):
        qrnn_pool(gates, lengths, c0.double(), **kwargs)
    with pytest.raises(TypeError, match=r"^c0 is torch\.bfloat16 but the gates are torch\.float32"):
        qrnn_layer(x_pad, weight, bias, layer_lengths, torch.zeros(4, 5, dtype=torch.bfloat16), pooling="fo")
    h, c_last = qrnn_pool(gates.bfloat16(), lengths, c0, **kwargs)  # every path returns the gates' dtype
    assert h.dtype == c_last.dtype == torch.bfloat16 and torch.isfinite(h.float()).all()


@pytest.mark.parametrize("backend", ["reference", pytest.param("compiled", marks=needs_compiled)])
@pytest.mark.parametrize("pooling", list(POOLINGS))
def test_empty_sequences_pool_to_their_initial_state(monkeypatch, backend, pooling):
    """T = 0: every path gives (B, 0, H) outputs and c0 back (the reference crashed in torch.stack)."""
    monkeypatch.setenv("SEQZOO_QRNN_BACKEND", backend)
    gates = torch.randn(3, 0, POOLINGS[pooling], 4, requires_grad=True)
    c0 = torch.randn(3, 4)
    h, c_last = qrnn_pool(gates, torch.zeros(3, dtype=torch.int64), c0, pooling=pooling)
    assert h.shape == (3, 0, 4) and torch.equal(c_last, c0)
    h.sum().backward()
    assert gates.grad.shape == gates.shape


@needs_compiled
def test_layer_bias_is_checked_and_may_be_strided(monkeypatch):
    """The fused layer reads the bias through a raw pointer: a strided one was read as if contiguous,
    one of another size past its end, a float64 one as float32."""
    (x_pad, weight, bias, c0), lengths = _layer_inputs(2, "fo")
    strided = torch.randn(2 * bias.numel())[::2]
    outputs = []
    for backend in ("auto", "reference"):
        monkeypatch.setenv("SEQZOO_QRNN_BACKEND", backend)
        outputs.append(qrnn_layer(x_pad, weight, strided, lengths, c0, pooling="fo"))
    args64 = [_float64(t) for t in (x_pad, weight, strided)]
    exact = qrnn_layer(*args64, lengths, _float64(c0), pooling="fo")
    assert_all_close_to_float64(list(outputs[0]), list(exact), list(outputs[1]))
    monkeypatch.setenv("SEQZOO_QRNN_BACKEND", "auto")
    for bad in (bias[:-1], bias.double()):
        with pytest.raises(ValueError, match=rf"bias must be \({bias.numel()},\) of torch\.float32"):
            qrnn_layer(x_pad, weight, bad, lengths, c0, pooling="fo")


@needs_compiled
@pytest.mark.parametrize("half", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("pooling", list(POOLINGS))
@pytest.mark.parametrize("reverse", [False, True])
def test_compiled_pools_half_precision_gates_in_float32(half, pooling, reverse):
    """Half-precision gates (a projection under CPU autocast) are widened into the kernel's own
    buffer in one pass, instead of a widened copy that the kernel then copied again: h, c_last and
    d(c0) equal the float32 kernel's on the widened gates exactly, and d(gates) is its d(gates)
    narrowed to the gates' dtype; also for a second backward through the same graph and, through
    the reference, for a differentiable one."""
    gates, lengths, c0, kwargs = _inputs(pooling, "train")
    narrow = gates.detach().to(half).requires_grad_(True)
    wide = narrow.detach().float().requires_grad_(True)
    (h, c), (h32, c32) = (qrnn_pool_compiled(g, lengths, c0, reverse=reverse, **kwargs) for g in (narrow, wide))
    assert h.dtype == c.dtype == torch.float32
    assert torch.equal(h, h32) and torch.equal(c, c32)
    gen = torch.Generator().manual_seed(1)
    dh, dc = torch.randn(h.shape, generator=gen), torch.randn(c.shape, generator=gen)
    for _ in range(2):  # the second backward rebuilds the spent buffer
        d_narrow, d_c0 = torch.autograd.grad((h, c), (narrow, c0), (dh, dc), retain_graph=True)
        d_wide, d_c0_32 = torch.autograd.grad((h32, c32), (wide, c0), (dh, dc), retain_graph=True)
        assert d_narrow.dtype == half and torch.equal(d_narrow, d_wide.to(half)) and torch.equal(d_c0, d_c0_32)
    d_narrow, _ = torch.autograd.grad((h, c), (narrow, c0), (dh, dc), create_graph=True)
    # the reference's float32 d(gates) rounded to the gates' dtype: half an ulp of it, plus float32 rounding
    bound = torch.finfo(half).eps / 2 * d_wide.abs() + 32 * EPS32 * d_wide.abs().max()
    assert d_narrow.requires_grad and bool(((d_narrow.float() - d_wide).abs() <= bound).all())


@needs_compiled
@pytest.mark.parametrize("bidirectional", [False, True])
def test_a_bfloat16_qrnn_pools_with_the_fused_kernel_in_float32(bidirectional):
    """A QRNN cast wholly to bfloat16 (inference, say) pools with the fused kernel in float32 and
    returns bfloat16 (it used to fall back, with a warning, to the reference's loop in bfloat16,
    whose state kept 8 bits of mantissa over the sequence): qrnn_pool on bfloat16 gates is the
    float32 kernel on the widened gates, rounded; the encoder stays near its float32 self."""
    gates, lengths, c0, kwargs = _inputs("fo", "eval")
    half = gates.detach().bfloat16()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        h, c = qrnn_pool(half, lengths, c0.detach().bfloat16(), **kwargs)
    h32, c32 = qrnn_pool_compiled(half.float(), lengths, c0.detach().bfloat16().float(), **kwargs)
    assert h.dtype == c.dtype == torch.bfloat16
    assert torch.equal(h, h32.bfloat16()) and torch.equal(c, c32.bfloat16())
    torch.manual_seed(0)
    encoder = build_encoder("qrnn", 8, hidden_size=16, num_layers=2, window=2, bidirectional=bidirectional).eval()
    x, mask = torch.randn(3, 200, 8), torch.arange(200) < torch.tensor([200, 90, 1]).unsqueeze(1)
    with torch.no_grad():
        out32, _ = encoder(x, mask)
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            out, _ = encoder.to(torch.bfloat16)(x.bfloat16(), mask)
    assert out.dtype == torch.bfloat16
    assert (out.float() - out32).norm() <= 2e-2 * out32.norm()


@needs_compiled
def test_layer_under_cpu_autocast_pools_widened_gates_with_the_fused_kernel():
    """Under CPU autocast the projection runs in bfloat16 and the fused kernel pools its gates in
    float32 (it used to fall back, with a warning, to the reference in bfloat16)."""
    (x_pad, weight, bias, c0), lengths = _layer_inputs(2, "fo")
    h_float, _ = qrnn_layer(x_pad, weight, bias, lengths, c0, pooling="fo")
    with torch.autocast("cpu", dtype=torch.bfloat16), warnings.catch_warnings():
        warnings.simplefilter("error")
        h, c = qrnn_layer(x_pad, weight, bias, lengths, c0, pooling="fo")
    assert h.dtype == c.dtype == torch.float32 and not torch.equal(h, h_float)
    # = the bfloat16 projection's gates pooled in float32: as close to them pooled in float64 as the reference is
    with torch.autocast("cpu", dtype=torch.bfloat16), torch.no_grad():
        gates = window_linear(x_pad, weight, bias).view(4, 9, 3, 5)  # (B, T, G, H) in bfloat16
    twin = qrnn_pool_reference(gates.float(), lengths, c0.detach(), pooling="fo")
    exact = qrnn_pool_reference(gates.double(), lengths, c0.detach().double(), pooling="fo")
    assert_all_close_to_float64([h, c], list(exact), list(twin))


@pytest.mark.parametrize("backend", ["reference", pytest.param("compiled", marks=needs_compiled)])
@pytest.mark.parametrize("pooling", list(POOLINGS))
def test_zoneout_keeps_the_state_and_evaluates_its_expectation(backend, pooling):
    """Zoneout keeps "the previous pooling state" of a zoned-out channel (the paper's definition; for
    ifo eq. 6's f = 1 is not enough, i must be 0), and evaluation gives the expectation over masks."""
    fn = qrnn_pool_compiled if backend == "compiled" else qrnn_pool_reference
    gates, _, c0, kwargs = _inputs(pooling, "train", torch.float64, shape=(2, 1, 300))
    lengths = torch.ones(2, dtype=torch.int64)
    with torch.no_grad():
        _, c_train = fn(gates, lengths, c0, pooling=pooling, keep=kwargs["keep"])
        _, c_plain = fn(gates, lengths, c0, pooling=pooling)
        _, c_eval = fn(gates, lengths, c0, pooling=pooling, keep_prob=0.7)
    zoned = ~kwargs["keep"][:, 0]
    assert bool(zoned.any()) and bool((~zoned).any())
    assert torch.equal(c_train[zoned], c0[zoned]), "zoned-out channels keep their state"
    assert torch.allclose(c_train[~zoned], c_plain[~zoned], rtol=0, atol=1e-12), "the others update as without zoneout"
    assert torch.allclose(c_eval, 0.3 * c0 + 0.7 * c_plain, rtol=0, atol=1e-12), "p c_{t-1} + (1 - p) c_t"


def test_reference_zoneout_keeps_float64():
    gates, lengths, c0, kwargs = _inputs("fo", "train", dtype=torch.float64)
    h, _ = qrnn_pool_reference(gates, lengths, c0, pooling="fo", keep=kwargs["keep"], keep_prob=0.7)
    f = 1 - (1 - torch.sigmoid(gates[:, 0, 1])) * kwargs["keep"][:, 0].double() * 0.7
    c = f * c0 + (1 - f) * torch.tanh(gates[:, 0, 0])
    assert torch.allclose(h[0, 0], (c * torch.sigmoid(gates[:, 0, 2]))[0], rtol=0, atol=1e-12)


def test_library_from_other_sources_is_refused(monkeypatch):
    """A stale build (other exported signatures) falls back with a reason instead of being called."""
    stale = type("StaleLibrary", (), {"qrnn_pool_abi_version": staticmethod(lambda: 1)})()
    monkeypatch.setattr(pool_module.ctypes, "CDLL", lambda path: stale)
    pool_module._compiled_library.cache_clear()
    try:
        assert "built from other kernel sources" in pool_module._compiled_library()
    finally:
        monkeypatch.undo()
        pool_module._compiled_library.cache_clear()


@pytest.mark.skipif(pool_backend() != "compiled", reason="compiled kernel not built")
@pytest.mark.parametrize("pooling", list(POOLINGS))
def test_compiled_pool_scales_a_keep_mask_by_keep_prob_like_the_reference(pooling):
    """A keep mask with keep_prob < 1 is scaled alike by both backends. The encoder never passes
    both, so this guards the public qrnn_pool signature only."""
    gen = torch.Generator().manual_seed(0)
    gates = torch.randn(2, 4, POOLINGS[pooling], 3, generator=gen, dtype=torch.float64)
    c0 = torch.randn(2, 3, generator=gen, dtype=torch.float64)
    keep = torch.rand(2, 4, 3, generator=gen) >= 0.3
    lengths = torch.tensor([4, 2])
    kwargs = {"pooling": pooling, "keep": keep, "keep_prob": 0.7}
    for a, b in zip(
        qrnn_pool_compiled(gates, lengths, c0, **kwargs), qrnn_pool_reference(gates, lengths, c0, **kwargs), strict=True
    ):
        torch.testing.assert_close(a, b)


# --- cases the kernel tests above do not reach -----------------------------------------------------


def test_dc0_is_right_when_the_c_last_gradient_arrives_transposed(interpreted_triton):
    """A loss through c_last.t() hands the backward a dc_last with strides (1, B); the kernel
    writes dc0 contiguous (b * H + col), so dc0 must be allocated so (it was empty_like(dc_last),
    and dL/dc0 came back scrambled, silently)."""
    gates, lengths, c0, kwargs = _inputs("fo", "none", torch.float64, shape=(3, 5, 4))
    weight = torch.randn(4, 3, generator=torch.Generator().manual_seed(2), dtype=torch.float64)

    def loss(h, c):
        return (c.t() * weight).sum() + h.sum()

    fast = _values_and_grads(interpreted_triton, gates, lengths, c0, kwargs, False, loss)
    ref = _values_and_grads(qrnn_pool_reference, gates, lengths, c0, kwargs, False, loss)
    _assert_all_close(fast, ref, atol=1e-10, rtol=1e-10)


@pytest.mark.parametrize(("pooling", "reverse"), [("fo", False), ("ifo", True)])
def test_without_c0_matches_the_reference(interpreted_triton, pooling, reverse):
    """The encoders' usual call passes no c0 (HAS_C0 false): the state starts at zero, and the
    backward's c_{s-1} before the first step is zero, not the previous row's last state."""
    gates, lengths, _, kwargs = _inputs(pooling, "train", shape=(3, 9, 20))
    fast = _values_and_grads(interpreted_triton, gates, lengths, None, kwargs, reverse)
    _assert_matches_float64_reference(fast, gates, lengths, None, kwargs, reverse)


def test_non_contiguous_inputs(interpreted_triton):
    """Time-major gates (a (T, B, ...) projection transposed), a transposed c0 and keep mask: the
    kernels index as if contiguous, so the wrapper must make them so."""
    gates, lengths, c0, kwargs = _inputs("fo", "train", shape=(3, 9, 20))
    gates_tm = gates.transpose(0, 1).contiguous().transpose(0, 1)  # same values, strides of (T, B, G, H)
    c0_t = c0.t().contiguous().t()
    keep_tm = kwargs["keep"].transpose(0, 1).contiguous().transpose(0, 1)
    assert not (gates_tm.is_contiguous() or c0_t.is_contiguous() or keep_tm.is_contiguous())
    fast = _values_and_grads(interpreted_triton, gates_tm, lengths, c0_t, {**kwargs, "keep": keep_tm}, False)
    _assert_matches_float64_reference(fast, gates, lengths, c0, kwargs, False)


@pytest.mark.parametrize("loss", ["sum", "time_major"])
def test_non_contiguous_output_gradients(interpreted_triton, loss):
    """h.sum() / c.sum() hand the backward expanded (stride-0) gradients, a time-major consumer of h
    a transposed one: the wrapper must make them contiguous before the kernel reads them."""
    gates, lengths, c0, kwargs = _inputs("ifo", "none", shape=(3, 9, 20))
    weight = torch.randn(9, 3, 20, generator=torch.Generator().manual_seed(3))  # (T, B, H)

    def loss_fn(h, c):
        return h.sum() + c.sum() if loss == "sum" else (h.transpose(0, 1) * weight).sum() + c.sum()

    fast = _values_and_grads(interpreted_triton, gates, lengths, c0, kwargs, True, loss_fn)
    _assert_matches_float64_reference(fast, gates, lengths, c0, kwargs, True, loss_fn)


@pytest.mark.parametrize("pooling", ["f", "ifo"])
def test_float64_keep_prob_is_exact(interpreted_triton, pooling):
    """The CPU twin of test_triton_on_gpu_keeps_float64_keep_prob_exact: keep_prob in float32
    anywhere in the kernel is 1e-8 off."""
    gates, lengths, c0, kwargs = _inputs(pooling, "eval", torch.float64, shape=(3, 9, 20))

    def loss_fn(h, c):
        return h.square().sum() + c.sum()

    fast = _values_and_grads(interpreted_triton, gates, lengths, c0, kwargs, True, loss_fn)
    ref = _values_and_grads(qrnn_pool_reference, gates, lengths, c0, kwargs, True, loss_fn)
    _assert_all_close(fast, ref, atol=1e-12, rtol=1e-12)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_half_precision_gates_pool_in_float32(interpreted_triton, dtype):
    """Forget gates near 1 (f = sigmoid(6)): pooled in the gates' own precision, the state's small
    steps round away; in float32 (as documented) only the output's rounding remains."""
    gates, _, c0, _ = _inputs("fo", "none", shape=(2, 40, 20))
    gates = gates.detach().clone()
    gates[:, :, 1] = 6.0
    lengths = torch.tensor([40, 33])
    gates, c0 = gates.to(dtype), c0.detach().to(dtype)
    h, c = interpreted_triton(gates, lengths, c0, pooling="fo")
    h_ref, c_ref = qrnn_pool_reference(gates.float(), lengths, c0.float(), pooling="fo")
    assert h.dtype == dtype and c.dtype == dtype
    eps = torch.finfo(dtype).eps
    assert torch.allclose(h.float(), h_ref, atol=2 * eps, rtol=2 * eps), (h.float() - h_ref).abs().max()
    assert torch.allclose(c.float(), c_ref, atol=2 * eps, rtol=2 * eps), (c.float() - c_ref).abs().max()


def test_default_chunk_and_block_sizes(interpreted_triton_at_gpu_sizes):
    """The other tests shrink the chunk to 4 steps and blocks to 16 channels; a GPU runs the module's
    own sizes: > 32 steps and > 32 channels cross a chunk and a block boundary."""
    gates, lengths, c0, kwargs = _inputs("fo", "train", shape=(2, 37, 34))
    fast = _values_and_grads(interpreted_triton_at_gpu_sizes, gates, lengths, c0, kwargs, True)
    _assert_matches_float64_reference(fast, gates, lengths, c0, kwargs, True)


# --- the dispatch from qrnn_pool ----------------------------------------------------------------


def test_cuda_tensors_are_routed_to_triton():
    """Needs no GPU: pool_backend only asks whether Triton imports."""
    pytest.importorskip("triton")
    assert pool_backend("cuda") == "triton"


@pytest.fixture
def routed_to_triton(monkeypatch, interpreted_triton):
    """qrnn_pool taking its CUDA branch on CPU tensors (the interpreted kernel)."""
    monkeypatch.delenv("SEQZOO_QRNN_BACKEND", raising=False)
    monkeypatch.setattr(pool_module, "pool_backend", lambda *args, **kwargs: "triton")
    return interpreted_triton


@pytest.mark.parametrize("pooling", ["f", "ifo"])
def test_qrnn_pool_hands_every_option_to_triton(routed_to_triton, pooling):
    """qrnn_pool passes every option (here reverse) on to the kernel."""
    gates, lengths, c0, kwargs = _inputs(pooling, "train", shape=(3, 9, 20))
    kwargs["keep_prob"] = 0.9
    fast = _values_and_grads(qrnn_pool, gates, lengths, c0, kwargs, True)
    _assert_matches_float64_reference(fast, gates, lengths, c0, kwargs, True)


def test_qrnn_pool_checks_arguments_before_triton(routed_to_triton):
    """The Triton kernel indexes without bounds checks: qrnn_pool must refuse bad shapes first."""
    gates, lengths, c0, _ = _inputs("fo", "none", shape=(3, 9, 20))
    with pytest.raises(ValueError, match="c0 must be"):
        qrnn_pool(gates, lengths, c0[:, :-1], pooling="fo")
    with pytest.raises(ValueError, match="lengths must be"):
        qrnn_pool(gates, lengths[:-1], c0, pooling="fo")
    with pytest.raises(ValueError, match="keep must be"):
        qrnn_pool(gates, lengths, c0, pooling="fo", keep=torch.ones(3, 9, 19, dtype=torch.bool))


def _kernel_imports() -> dict[str, set[str]]:
    """{module: the seqzoo.kernels modules it imports, at top level or inside functions} for seqzoo/kernels/*.py."""
    import ast
    from pathlib import Path

    import seqzoo.kernels

    folder = Path(seqzoo.kernels.__file__).parent
    graph = {}
    for path in folder.glob("*.py"):
        name = "seqzoo.kernels" if path.stem == "__init__" else f"seqzoo.kernels.{path.stem}"
        found = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.module:
                found.add(node.module)
            elif isinstance(node, ast.Import):
                found.update(alias.name for alias in node.names)
        graph[name] = {m for m in found if m.startswith("seqzoo.kernels")}
    return graph


def test_the_kernel_modules_import_one_way():
    """The reference imports no fast path, the Triton kernel not the dispatcher: no import cycle."""
    graph = _kernel_imports()
    assert graph["seqzoo.kernels.qrnn_pool_reference"] == set()
    assert graph["seqzoo.kernels.qrnn_pool_triton"] == {"seqzoo.kernels.qrnn_pool_reference"}
    assert "seqzoo.kernels.qrnn_pool_reference" in graph["seqzoo.kernels.qrnn_pool"]

    def reaches(start: str, goal: str, seen: frozenset = frozenset()) -> bool:
        return any(m == goal or (m not in seen and reaches(m, goal, seen | {m})) for m in graph.get(start, ()))

    assert not [m for m in graph if reaches(m, m)], "an import cycle among seqzoo/kernels/*.py"
