"""Single-layer encoder throughput: ``seqzoo bench encoders`` (or ``python -m seqzoo.bench.encoders``).

For each shape BxTxH (batch, sequence length, hidden = input size) every encoder runs forward
(inference, no autograd) and forward+backward (gradients of the input and all parameters).
Measurements are interleaved round-robin across encoders, so load from other processes hits
all of them alike; each figure is the median over ``--repeats`` after warm-up.

QRNN rows (pooling ``--qrnn-pooling``, fo by default; window ``--qrnn-window``) also report
``gemm_bound_fwd_bwd_tokens_per_s``, the same projection's forward and backward matmuls alone
(Y = XW^T + b, dX = dY W, dW^T = X^T dY) timed in the same run, and ``pooling_share``, the
fraction of the layer's fwd+bwd time spent in its activations, zoneout and pooling (the fused
kernel on the compiled backend; the backend's ``qrnn_pool`` forward and backward otherwise).
Each encoder name is measured once. Every row also carries ``sgemm_gflops``, the machine's fp32
matmul rate measured before the first shape (:func:`seqzoo.bench.sgemm_flops_per_s`), so runs
on different machines can be compared. ``sru`` (PyPI ``sru``) is measured when installed; on CPU
its training path (forward with autograd, backward) is SRU's own Python loop over time, its
inference path a compiled kernel.

``--device cuda`` measures on the GPU: ``lstm`` and ``gru`` are then cuDNN's, the QRNN pools with
the Triton kernel, every timing waits for the GPU's queued work, ``sgemm_gflops`` is the GPU's
rate (4096³, under torch's float32 matmul precision, which ``--tf32`` lowers to TF32 for cuBLAS
and cuDNN alike) and rows carry ``device`` and ``tf32``.

``--precision bf16`` (or ``fp16``, a GPU only) times every case under ``torch.autocast``, as
``train.precision`` trains: the matmuls of the encoders and of the GEMM bound run in half
precision; the QRNN's pooling stays in float32. On CPU its ``pooling_share`` is then the pooling
of bfloat16 gates as the layer runs it: the widening into the kernel's buffer, the kernel, and the
narrowing of d(gates).
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable

import torch
from torch import Tensor, nn

from seqzoo.bench import (
    add_timing_arguments,
    bench_parser,
    device_arg,
    positive_int,
    print_rows,
    sgemm_flops_per_s,
    shapes_arg,
    time_cases,
)
from seqzoo.config import ConfigError
from seqzoo.encoders.base import available_encoders, build_encoder
from seqzoo.encoders.qrnn import QRNN
from seqzoo.kernels import pool_backend
from seqzoo.kernels.qrnn_pool import _Kernel, qrnn_pool, qrnn_pool_compiled
from seqzoo.training.devices import autocast, check_precision

__all__ = ["build_parser", "main"]

DEFAULT_SHAPES = "8x512x512,32x128x512,128x32x512"


def _parse_encoders(text: str) -> list[str]:
    """``--encoders``: comma-separated registered encoder names, or sru."""
    names = [e.strip() for e in text.split(",") if e.strip()]
    unknown = sorted(set(names) - {*available_encoders(), "sru"})
    if unknown or not names:
        known = ", ".join([*available_encoders(), "sru"])
        raise argparse.ArgumentTypeError(f"unknown encoder(s) {', '.join(unknown) or '(none given)'}; known: {known}")
    return names


def _build(name: str, hidden: int, window: int, pooling: str) -> nn.Module:
    if name == "qrnn":
        return QRNN(hidden, hidden, window=window, pooling=pooling)
    if name == "sru":
        import sru

        return _TimeFirst(sru.SRU(hidden, hidden, num_layers=1))
    return build_encoder(name, hidden, hidden_size=hidden)


class _TimeFirst(nn.Module):
    """Adapts a time-first (T, B, D) module returning (outputs, state) to batch-first input."""

    def __init__(self, module: nn.Module) -> None:
        super().__init__()
        self.module = module

    def forward(self, x: Tensor) -> tuple[Tensor, Tensor]:
        out, state = self.module(x.transpose(0, 1))
        return out.transpose(0, 1), state


def _under_autocast(fn: Callable[[], object], device: torch.device, precision: str) -> Callable[[], None]:
    """``fn`` under autocast in ``precision``: the case :func:`measure` times."""

    def run() -> None:
        with autocast(precision, device):
            fn()

    return run


def _encoder_cases(model: nn.Module, x: Tensor, precision: str) -> dict[str, Callable[[], None]]:
    device = x.device
    params = [p for p in model.parameters() if p.requires_grad]
    x_grad = x.detach().requires_grad_(True)
    grad_out = torch.randn_like(model(x)[0].detach())

    def fwd() -> None:
        model.eval()
        with torch.no_grad():
            model(x)

    def fwd_bwd() -> None:
        model.train()
        out = model(x_grad)[0]
        torch.autograd.grad(out, [x_grad, *params], grad_out)

    return {"fwd": _under_autocast(fwd, device, precision), "fwd_bwd": _under_autocast(fwd_bwd, device, precision)}


def _qrnn_cases(model: QRNN, x: Tensor, precision: str) -> dict[str, Callable[[], None]]:
    """The GEMM bound of the QRNN projection and the fused pooling alone, on the same shapes."""
    layer = model.layers[0][0]
    batch, seq_len, _ = x.shape
    device = x.device
    inputs = x.reshape(batch * seq_len, -1).repeat(1, layer.window)  # (B*T, k*n) like the window matrix
    weight, bias = layer.linear.weight.detach(), layer.linear.bias.detach()
    grad_gates = torch.randn(batch * seq_len, weight.shape[0], device=device)
    lengths = torch.full((batch,), seq_len, dtype=torch.int64, device=device)
    grad_h = torch.randn(batch, seq_len, layer.hidden_size, device=device)
    grad_c = torch.zeros(batch, layer.hidden_size, device=device)
    fused = pool_backend(device.type) == "compiled"
    # The compiled layer's fused kernel on its own buffer (turned into activations, then gradients, in
    # place; its run time does not depend on the values).
    kernel = (
        _Kernel(
            grad_gates.clone(),
            seq_len,
            bias,
            lengths,
            None,
            None,
            1.0,
            layer.pooling,
            False,
            (batch, seq_len, layer.hidden_size),
        )
        if fused
        else None
    )

    def gemm() -> None:
        torch.addmm(bias, inputs, weight.t())  # forward
        torch.mm(grad_gates, weight)  # dX
        torch.mm(inputs.t(), grad_gates)  # dW^T, the faster of the two layouts (as the layer computes it)

    def fused_pool() -> None:
        kernel.forward(training=True)
        kernel.backward(grad_h, grad_c)

    gates = grad_gates.view(batch, seq_len, -1, layer.hidden_size).detach().requires_grad_(True)

    def pool() -> None:  # the other backends: activations, zoneout and pooling through autograd
        h, c = qrnn_pool(gates, lengths, pooling=layer.pooling)
        torch.autograd.grad((h, c), gates, (grad_h, grad_c))

    half = gates.detach().bfloat16().requires_grad_(True) if fused and precision != "fp32" else None

    def half_pool() -> None:  # under CPU autocast (bf16) the layer hands the kernel its bfloat16 gates
        h, c = qrnn_pool_compiled(half, lengths, pooling=layer.pooling)
        torch.autograd.grad((h, c), half, (grad_h, grad_c))

    pooling = half_pool if half is not None else fused_pool if fused else pool
    return {"gemm": _under_autocast(gemm, device, precision), "pool": _under_autocast(pooling, device, "fp32")}


def measure(
    encoders: list[str],
    shape: tuple[int, int, int],
    repeats: int,
    warmup: int,
    window: int,
    threads: int,
    pooling: str,
    device: torch.device | str = "cpu",
    precision: str = "fp32",
) -> list[dict]:
    """One result row per encoder for one shape (see the module docstring)."""
    batch, seq_len, hidden = shape
    device = torch.device(device)
    torch.manual_seed(0)
    x = torch.randn(batch, seq_len, hidden).to(device)
    cases: dict[tuple[str, str], Callable[[], None]] = {}
    qrnn_layer = None
    for name in encoders:
        model = _build(name, hidden, window, pooling).to(device)
        for kind, run in _encoder_cases(model, x, precision).items():
            cases[name, kind] = run
        if name == "qrnn":
            qrnn_layer = model.layers[0][0]
            for kind, run in _qrnn_cases(model, x, precision).items():
                cases[name, kind] = run
    timings = time_cases(cases, repeats, warmup, device)
    tokens = batch * seq_len

    def seconds(name: str, kind: str) -> float:
        return timings[name, kind].median

    rows = []
    for name in encoders:
        row = {
            "encoder": name,
            "batch": batch,
            "seq_len": seq_len,
            "hidden": hidden,
            "threads": threads,
            "device": device.type,
            "precision": precision,
            "fwd_tokens_per_s": round(tokens / seconds(name, "fwd"), 1),
            "fwd_bwd_tokens_per_s": round(tokens / seconds(name, "fwd_bwd"), 1),
        }
        if name == "qrnn":
            row.update(
                window=qrnn_layer.window,  # as built and timed, not as asked for
                pooling=qrnn_layer.pooling,
                backend=pool_backend(device.type),
                gemm_bound_fwd_bwd_tokens_per_s=round(tokens / seconds(name, "gemm"), 1),
            )
            row["pooling_share"] = round(seconds(name, "pool") / seconds(name, "fwd_bwd"), 4)
        rows.append(row)
    return rows


def _table(rows: list[dict]) -> str:
    columns = ("fwd tok/s", 10), ("fwd+bwd tok/s", 14), ("x lstm", 7), ("%gemm", 6), ("pool", 5)
    names = max([8, *(len(r["encoder"]) for r in rows)])
    lines = [f"{'encoder':{names}} {'shape':>12} " + " ".join(f"{name:>{width}}" for name, width in columns)]
    lstm = {(r["batch"], r["seq_len"], r["hidden"]): r["fwd_bwd_tokens_per_s"] for r in rows if r["encoder"] == "lstm"}
    for r in rows:
        shape = (r["batch"], r["seq_len"], r["hidden"])
        ratio = f"{r['fwd_bwd_tokens_per_s'] / lstm[shape]:.2f}" if shape in lstm else "-"
        bound = share = ""
        if "gemm_bound_fwd_bwd_tokens_per_s" in r:
            bound = f"{100 * r['fwd_bwd_tokens_per_s'] / r['gemm_bound_fwd_bwd_tokens_per_s']:.0f}%"
        if "pooling_share" in r:
            share = f"{100 * r['pooling_share']:.0f}%"
        lines.append(
            f"{r['encoder']:{names}} {'x'.join(map(str, shape)):>12} {r['fwd_tokens_per_s']:>10.0f} "
            f"{r['fwd_bwd_tokens_per_s']:>14.0f} {ratio:>7} {bound:>6} {share:>5}"
        )
    return "\n".join(lines)


def build_parser() -> argparse.ArgumentParser:
    """The options of ``seqzoo bench encoders``."""
    parser = bench_parser("encoders", __doc__)
    parser.add_argument(
        "--encoders",
        type=_parse_encoders,
        default="lstm,gru,qrnn,sru",
        help="comma-separated; sru is skipped if not installed",
    )
    parser.add_argument(
        "--shapes", type=shapes_arg, default=DEFAULT_SHAPES, help="comma-separated BxTxH (input size = H)"
    )
    parser.add_argument("--qrnn-window", type=positive_int, default=1, help="QRNN filter width k (default 1)")
    parser.add_argument("--qrnn-pooling", choices=("f", "fo", "ifo"), default="fo", help="QRNN pooling (default fo)")
    add_timing_arguments(parser, warmup=2)
    parser.add_argument("--device", type=device_arg, default="cpu", help="cpu (default) or cuda")
    parser.add_argument("--tf32", action="store_true", help="on CUDA: TF32 matmuls in cuBLAS and cuDNN alike")
    parser.add_argument(
        "--precision",
        choices=("fp32", "bf16", "fp16"),
        default="fp32",
        help="autocast, as train.precision (default fp32)",
    )
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        check_precision(args.precision, args.device)
    except ConfigError as err:
        parser.error(str(err).replace("train.precision", "--precision"))
    encoders = list(dict.fromkeys(args.encoders))  # a name given twice is measured once
    if "sru" in encoders:
        try:
            import sru  # noqa: F401
        except ImportError:
            print("sru is not installed (pip install 'seqzoo[bench]'); skipping it", file=sys.stderr)
            encoders.remove("sru")
    if "sru" in encoders and args.precision != "fp32" and args.device.type == "cpu":
        print("sru's CPU kernel takes float32 only (it fails under autocast); skipping it", file=sys.stderr)
        encoders.remove("sru")
    if not encoders:
        parser.error("no encoder left to measure")
    for name in encoders:  # an encoder that cannot be built at a shape's size: an error now, not a traceback later
        for hidden in sorted({shape[2] for shape in args.shapes}):
            try:
                _build(name, hidden, args.qrnn_window, args.qrnn_pooling)
            except ValueError as err:
                parser.error(f"{name} at hidden size {hidden}: {err}")
    torch.set_num_threads(args.threads)
    if args.device.type == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = args.tf32
    tf32 = {"tf32": args.tf32} if args.device.type == "cuda" else {}
    sgemm = round(sgemm_flops_per_s(device=args.device) / 1e9, 1)  # the rate a GEMM-bound QRNN follows
    measured = (
        row
        for shape in args.shapes
        for row in measure(
            encoders,
            shape,
            args.repeats,
            args.warmup,
            args.qrnn_window,
            args.threads,
            args.qrnn_pooling,
            args.device,
            args.precision,
        )
    )
    print_rows(({**row, **tf32, "sgemm_gflops": sgemm} for row in measured), args.json, _table)
    return 0


if __name__ == "__main__":
    sys.exit(main())
