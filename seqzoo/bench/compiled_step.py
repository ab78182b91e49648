"""Recurrent cells with ``compile_step``: the time loop's step through ``torch.compile``, against eager.

A hand-written recurrent cell runs its step T times per chunk, and at CPU sizes each step is a
few dozen small operations. ``compile_step=True`` (:mod:`seqzoo.encoders.recurrent`) hands the step to
Inductor, which fuses the element-wise operations into generated C++ loops. This benchmark times,
side by side in one process, forward + backward of recurrent encoders (by default the three
brown_char ones at the configs' sizes: B 64, TBPTT 100, input 64; capMZU+DT hidden 192, DT-GRU 172,
GRU + LN 264; candidate dropout 0.1, training mode) eager and compiled, with the same weights, over
interleaved rounds (median of ``--rounds``), and the first compiled call, which includes compiling.
Inductor keeps compiled code in a cache on disk; this benchmark points it at a fresh directory, so
the compile time is the cold-cache one. With dropout off, the compiled encoder's outputs and
gradients are compared with the eager ones.

    seqzoo bench compiled_step [--threads 2] [--rounds 5] [--encoders capmzu,dtgru,gru_ln,capmzu_ptb,capmzu_stack]

``capmzu_ptb`` is the capMZU+DT at the paper's PTB configuration with a short chunk (B 256, 20
steps, input 256, hidden 800, filter 1000); ``capmzu_stack`` a 2-layer bidirectional capMZU+DT at
the brown_char size, whose four cells should all run one compiled graph; each row reports how
many graphs Dynamo compiled. ``--batch`` and ``--steps`` replace every encoder's batch size and
chunk length (a quick look).
"""

from __future__ import annotations

import argparse
import contextlib
import os
import statistics
import tempfile
import time
from collections.abc import Callable, Iterator

import torch
from torch._dynamo.utils import counters

from seqzoo.bench import bench_parser, positive_int
from seqzoo.encoders.dtgru import DeepTransitionGRU, LayerNormGRU
from seqzoo.encoders.mzu import MZU


def capsule_mzu_dt(input_size: int, hidden: int, filter_size: int, **kwargs: object) -> MZU:
    """The recipes' capMZU+DT: 4 zones, 2 capsules, 3 routing iterations, one shared t-MZU."""
    return MZU(
        input_size, hidden, composition="cap", num_zones=4, filter_size=filter_size, capsules=2, routing_iters=3,
        transition_depth=1, share_transition=True, **kwargs,
    )  # fmt: skip


ENCODERS: dict[str, tuple[str, int, int, int, Callable[..., torch.nn.Module]]] = {
    # key: (name, batch, steps, input, build(**kwargs))
    "capmzu": ("capMZU+DT (H 192)", 64, 100, 64, lambda **kw: capsule_mzu_dt(64, 192, 192, **kw)),
    "dtgru": ("DT-GRU (H 172)", 64, 100, 64, lambda **kw: DeepTransitionGRU(64, 172, **kw)),
    "gru_ln": ("GRU + LN (H 264)", 64, 100, 64, lambda **kw: LayerNormGRU(64, 264, **kw)),
    "capmzu_ptb": (
        "capMZU+DT, PTB (B 256, T 20, H 800)", 256, 20, 256, lambda **kw: capsule_mzu_dt(256, 800, 1000, **kw)
    ),
    "capmzu_stack": (
        "capMZU+DT, 2 layers, bidirectional (H 192)", 64, 100, 64,
        lambda **kw: capsule_mzu_dt(64, 192, 192, num_layers=2, bidirectional=True, **kw),
    ),
}  # fmt: skip
DEFAULT = ("capmzu", "dtgru", "gru_ln")


def forward_backward_seconds(encoder: torch.nn.Module, x: torch.Tensor) -> float:
    """Wall time of one forward and backward of ``encoder(x)`` (loss: the outputs' sum)."""
    start = time.perf_counter()
    out, _ = encoder(x)
    out.sum().backward()
    return time.perf_counter() - start


def max_difference(build: Callable[..., torch.nn.Module], x: torch.Tensor) -> float:
    """Largest |compiled − eager| over outputs and parameter gradients, dropout off."""
    eager, compiled = build(), build(compile_step=True)
    compiled.load_state_dict(eager.state_dict())
    results = []
    for encoder in (eager, compiled):
        out, _ = encoder(x)
        out.pow(2).sum().backward()
        results.append([out.detach(), *(p.grad for p in encoder.parameters())])
    return max((a - b).abs().max().item() for a, b in zip(*results, strict=True))


def _encoder_keys(text: str) -> list[str]:
    keys = [k for k in text.split(",") if k]
    unknown = sorted(set(keys) - set(ENCODERS))
    if unknown or not keys:
        raise argparse.ArgumentTypeError(f"unknown encoder(s) {', '.join(unknown)}; choose from {', '.join(ENCODERS)}")
    return keys


def build_parser() -> argparse.ArgumentParser:
    """The options of ``seqzoo bench compiled_step``."""
    parser = bench_parser("compiled_step", __doc__)
    parser.add_argument("--encoders", type=_encoder_keys, default=list(DEFAULT), help=f"of {', '.join(ENCODERS)}")
    parser.add_argument("--rounds", type=positive_int, default=5, help="interleaved timed rounds (median)")
    parser.add_argument("--threads", type=positive_int, default=2, help="torch intra-op threads")
    parser.add_argument("--batch", type=positive_int, help="every encoder's batch size (default: its own)")
    parser.add_argument("--steps", type=positive_int, help="every encoder's chunk length (default: its own)")
    return parser


@contextlib.contextmanager
def _cold_inductor_cache() -> Iterator[None]:
    """Inductor's on-disk cache in a fresh directory for the duration (the compile times are cold-cache ones)."""
    previous = os.environ.get("TORCHINDUCTOR_CACHE_DIR")
    with tempfile.TemporaryDirectory(prefix="seqzoo-inductor-") as cache:
        os.environ["TORCHINDUCTOR_CACHE_DIR"] = cache
        try:
            yield
        finally:
            if previous is None:
                del os.environ["TORCHINDUCTOR_CACHE_DIR"]
            else:
                os.environ["TORCHINDUCTOR_CACHE_DIR"] = previous


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    with _cold_inductor_cache():
        for key in args.encoders:
            _compare(ENCODERS[key], args)
    return 0


def _compare(encoder: tuple[str, int, int, int, Callable[..., torch.nn.Module]], args: argparse.Namespace) -> None:
    """One row: eager against compiled, forward + backward, and the first compiled call."""
    name, batch, steps, input_size, build = encoder
    torch._dynamo.reset()  # each encoder's first graph static, as in a process that trains one model
    counters.clear()
    x = torch.randn(args.batch or batch, args.steps or steps, input_size)
    eager, compiled = build(dropout=0.1), build(dropout=0.1, compile_step=True)
    compiled.load_state_dict(eager.state_dict())
    first = forward_backward_seconds(compiled, x)
    graphs = counters["stats"]["unique_graphs"]
    forward_backward_seconds(eager, x)  # warm-up
    times: dict[str, list[float]] = {"eager": [], "compiled": []}
    for _ in range(args.rounds):
        times["eager"].append(forward_backward_seconds(eager, x))
        times["compiled"].append(forward_backward_seconds(compiled, x))
    median = {mode: statistics.median(values) for mode, values in times.items()}
    difference = max_difference(build, x[:4, :10])
    print(
        f"{name}: forward + backward, median of {args.rounds}: eager {median['eager'] * 1e3:.0f} ms, "
        f"compiled {median['compiled'] * 1e3:.0f} ms (x{median['eager'] / median['compiled']:.2f}); "
        f"first compiled call (compiling, cold cache) {first:.1f} s, {graphs} graph(s); "
        f"max |compiled - eager| (dropout off) {difference:.1e}",
        flush=True,
    )


if __name__ == "__main__":
    raise SystemExit(main())
