"""Recurrent cells with ``compile_step``: the time loop's step through ``torch.compile``, against eager.

A hand-written recurrent cell runs its step T times per chunk, and at CPU sizes each step is a
few dozen small operations. ``compile_step=True`` (``seqzoo.encoders.recurrent``) hands the step to
Inductor, which fuses the element-wise operations into generated C++ loops. This script times,
side by side in one process, forward + backward of the three brown_char encoders (the configs'
sizes: B 64, TBPTT 100, input 64; capMZU+DT hidden 192, DT-GRU 172, GRU + LN 264; candidate
dropout 0.1, training mode) eager and compiled, with the same weights, over interleaved rounds
(median of ``--rounds``), and the first compiled call, which includes compiling. Inductor keeps
compiled code in a cache on disk; this script points it at a fresh directory, so the compile
time is the cold-cache one. With dropout off, the compiled encoder's outputs and gradients are
compared with the eager ones.

    python benchmarks/compiled_step.py [--threads 2] [--rounds 5] [--ptb] [--stack]

``--ptb`` adds the capMZU+DT at the paper's PTB configuration with a short chunk (B 256, 20
steps, input 256, hidden 800, filter 1000). ``--stack`` adds a 2-layer bidirectional capMZU+DT
at the brown_char size, whose four cells should all run one compiled graph; each row reports
how many graphs Dynamo compiled.
"""

from __future__ import annotations

import os
import statistics
import tempfile
from collections.abc import Callable

os.environ["TORCHINDUCTOR_CACHE_DIR"] = tempfile.mkdtemp(prefix="seqzoo-inductor-")  # before torch

import torch
from _layouts import capsule_mzu_dt, forward_backward_seconds, layout_args
from torch._dynamo.utils import counters

from seqzoo.encoders.dtgru import DeepTransitionGRU, LayerNormGRU

ENCODERS = {  # name: (batch, steps, input, build(**kwargs))
    "capMZU+DT (H 192)": (64, 100, 64, lambda **kw: capsule_mzu_dt(64, 192, 192, **kw)),
    "DT-GRU (H 172)": (64, 100, 64, lambda **kw: DeepTransitionGRU(64, 172, **kw)),
    "GRU + LN (H 264)": (64, 100, 64, lambda **kw: LayerNormGRU(64, 264, **kw)),
}
PTB = {"capMZU+DT, PTB (B 256, T 20, H 800)": (256, 20, 256, lambda **kw: capsule_mzu_dt(256, 800, 1000, **kw))}
STACK = {
    "capMZU+DT, 2 layers, bidirectional (H 192)": (
        64,
        100,
        64,
        lambda **kw: capsule_mzu_dt(64, 192, 192, num_layers=2, bidirectional=True, **kw),
    )
}


def _max_difference(build: Callable[..., torch.nn.Module], x: torch.Tensor) -> float:
    """Largest |compiled − eager| over outputs and parameter gradients, dropout off."""
    eager, compiled = build(), build(compile_step=True)
    compiled.load_state_dict(eager.state_dict())
    results = []
    for encoder in (eager, compiled):
        out, _ = encoder(x)
        out.pow(2).sum().backward()
        results.append([out.detach(), *(p.grad for p in encoder.parameters())])
    return max((a - b).abs().max().item() for a, b in zip(*results, strict=True))


def main() -> None:
    args = layout_args(__doc__, rounds=5, flags=("ptb", "stack"))
    encoders = {**ENCODERS, **(PTB if args.ptb else {}), **(STACK if args.stack else {})}
    for name, (batch, steps, input_size, build) in encoders.items():
        torch._dynamo.reset()  # each encoder's first graph static, as in a process that trains one model
        counters.clear()
        x = torch.randn(batch, steps, input_size)
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
        difference = _max_difference(build, x[:4, :10])
        print(
            f"{name}: forward + backward, median of {args.rounds}: eager {median['eager'] * 1e3:.0f} ms, "
            f"compiled {median['compiled'] * 1e3:.0f} ms (x{median['eager'] / median['compiled']:.2f}); "
            f"first compiled call (compiling, cold cache) {first:.1f} s, {graphs} graph(s); "
            f"max |compiled - eager| (dropout off) {difference:.1e}",
            flush=True,
        )


if __name__ == "__main__":
    main()
