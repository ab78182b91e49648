"""Meta-LSTM layer speed: ``seqzoo bench meta`` (or ``python -m seqzoo.bench.meta``).

One layer at the Meta-LSTM paper's sizes (MODELS.md 3.2: input d_x = 200, basic LSTM h = 100,
Meta-LSTM m = 40 with z = 40; batch 16, length 50), forward + backward (gradients of the input and
every parameter), for four models built with the same seed:

* ``meta_lstm``: the encoder, ``P_γᵀ(z_t ⊙ Q_γ u_t) + B z_t`` per step;
* ``materialized``: the official code's form of the same cell
  (:func:`seqzoo.encoders.meta_lstm.materialized_reference`), which builds the (B, 4h, d_x + h)
  weight from ``P_γᵀ diag(z_t) Q_γ`` at every step;
* ``lstm``: ``torch.nn.LSTM`` of the same hidden size (seqzoo's ``lstm`` encoder);
* ``hyper_lstm``: the HyperLSTM of the same hidden size (``--hyper-size``, ``--signal-size``).

Measurements are interleaved round-robin across the models, so load from other processes hits
them alike; each figure is the median over ``--repeats`` after ``--warmup`` untimed runs. Every
row carries ``vs_materialized`` and ``vs_lstm``: the materialising form's and nn.LSTM's median
time over the row's own (above 1: the row's model is that many times faster).
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable

import torch
from torch import Tensor, nn

from seqzoo.bench import add_timing_arguments, bench_parser, positive_int, print_rows, time_cases
from seqzoo.encoders.base import build_encoder
from seqzoo.encoders.hyper_lstm import HyperLSTM
from seqzoo.encoders.meta_lstm import MetaLSTM, materialized_reference

__all__ = ["MODELS", "build_parser", "main", "measure"]

MODELS = ("meta_lstm", "materialized", "lstm", "hyper_lstm")


def _models(args: argparse.Namespace) -> dict[str, tuple[nn.Module, Callable[[Tensor], Tensor]]]:
    """Each model and its forward (x (B, T, d_x) -> outputs (B, T, h))."""
    torch.manual_seed(0)
    meta = MetaLSTM(args.input_size, args.hidden, meta_size=args.meta_size, z_size=args.z_size)
    lstm = build_encoder("lstm", args.input_size, hidden_size=args.hidden)
    hyper = HyperLSTM(args.input_size, args.hidden, hyper_size=args.hyper_size, signal_size=args.signal_size)
    return {
        "meta_lstm": (meta, lambda x: meta(x)[0]),
        "materialized": (meta, lambda x: materialized_reference(meta.cells[0], x)[0]),
        "lstm": (lstm, lambda x: lstm(x)[0]),
        "hyper_lstm": (hyper, lambda x: hyper(x)[0]),
    }


def _fwd_bwd(module: nn.Module, forward: Callable[[Tensor], Tensor], x: Tensor) -> Callable[[], None]:
    """One forward + backward (input and parameter gradients), to be timed."""
    params = [p for p in module.parameters() if p.requires_grad]
    x = x.detach().requires_grad_(True)
    grad_out = torch.randn_like(forward(x).detach())

    def run() -> None:
        torch.autograd.grad(forward(x), [x, *params], grad_out)

    return run


def measure(args: argparse.Namespace) -> list[dict]:
    """One row per model (module docstring)."""
    models = _models(args)
    x = torch.randn(args.batch, args.seq_len, args.input_size, generator=torch.Generator().manual_seed(1))
    cases = {name: _fwd_bwd(module, forward, x) for name, (module, forward) in models.items()}
    seconds = {name: timings.median for name, timings in time_cases(cases, args.repeats, args.warmup).items()}
    tokens = args.batch * args.seq_len
    return [
        {
            "model": name,
            "batch": args.batch,
            "seq_len": args.seq_len,
            "input_size": args.input_size,
            "hidden": args.hidden,
            "meta_size": args.meta_size,
            "z_size": args.z_size or args.meta_size,
            "hyper_size": args.hyper_size,
            "signal_size": args.signal_size,
            "threads": args.threads,
            "params": sum(p.numel() for p in models[name][0].parameters()),
            "fwd_bwd_ms": round(1e3 * seconds[name], 3),
            "fwd_bwd_tokens_per_s": round(tokens / seconds[name], 1),
            "vs_materialized": round(seconds["materialized"] / seconds[name], 3),
            "vs_lstm": round(seconds["lstm"] / seconds[name], 3),
        }
        for name in MODELS
    ]


def _table(rows: list[dict]) -> str:
    lines = [f"{'model':12} {'params':>8} {'fwd+bwd ms':>11} {'tok/s':>9} {'x materialized':>15} {'x lstm':>7}"]
    for r in rows:
        lines.append(
            f"{r['model']:12} {r['params']:>8} {r['fwd_bwd_ms']:>11.2f} {r['fwd_bwd_tokens_per_s']:>9.0f} "
            f"{r['vs_materialized']:>15.2f} {r['vs_lstm']:>7.2f}"
        )
    return "\n".join(lines)


def build_parser() -> argparse.ArgumentParser:
    """The options of ``seqzoo bench meta``."""
    parser = bench_parser("meta", __doc__)
    parser.add_argument("--batch", type=positive_int, default=16)
    parser.add_argument("--seq-len", type=positive_int, default=50)
    parser.add_argument("--input-size", type=positive_int, default=200, help="d_x (default 200)")
    parser.add_argument("--hidden", type=positive_int, default=100, help="basic LSTM h, also nn.LSTM's and HyperLSTM's")
    parser.add_argument("--meta-size", type=positive_int, default=40, help="Meta-LSTM m (default 40)")
    parser.add_argument("--z-size", type=positive_int, default=None, help="meta vector z (default m)")
    parser.add_argument("--hyper-size", type=positive_int, default=128, help="HyperLSTM hyper cell (default 128)")
    parser.add_argument("--signal-size", type=positive_int, default=16, help="HyperLSTM signal N_z (default 16)")
    add_timing_arguments(parser, warmup=2, per="model")
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    torch.set_num_threads(args.threads)
    print_rows(measure(args), args.json, _table)
    return 0


if __name__ == "__main__":
    sys.exit(main())
