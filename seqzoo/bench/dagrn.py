"""DA-GRN inference speed against the same weights at full depth: ``seqzoo bench dagrn``.

The encoder (MODELS.md 2.3: token features of ``--input`` = 350 dims, hidden 400, depth embedding
50, L = ``--layers`` 9, evaluation mode, Gumbel-Max selection without noise) encodes batches of
``--batch`` sentences; the same module with ``full_depth=True`` (every word updated L times, same
weights and inputs) is timed in the same run, interleaved round-robin, median over ``--repeats``
after ``--warmup``. Weights are random, so the predicted depths are driven by a depth bias:
for each ``--depth-bias`` β the logits get ``−β·j`` added at depth index j (β > 0 favours shallow
words), and each row reports the mean predicted depth over the real words and the speed-up
``adaptive sentences/s ÷ full-depth sentences/s`` (wall clock; ``cpu_time_speedup`` the same ratio of
this process's CPU seconds, steadier on a shared machine; ``stack_speedup`` the same ratio for the
S-LSTM stack alone, run on the inputs the model gave it, without the Bi-LSTM and the depth
predictor, which cost the same at any depth). Inputs: with ``--data DIR`` (a classification
folder) the sentence lengths are those of ``DIR/mr.test`` (whitespace tokens), else random
lengths of MR-like statistics (mean 23, clipped to 2..61); the features are random either way
(only the lengths and depths set the cost).

``--gemm-bound`` instead times one S-LSTM (``slstm``, paper variant) forward+backward step at
``--gemm-shape`` BxTxH against its GEMM bound: every ``nn.Linear`` product the step runs (found by
hooks on one forward) replayed alone, forward ``Y = XWᵀ + b``, backward ``dX = dY W`` and
``dW = dYᵀ X``, in the same run.
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import sys
from collections.abc import Callable
from pathlib import Path

import torch
from torch import Tensor, nn

from seqzoo.bench import non_negative_int, positive_int, shape_arg, time_cases
from seqzoo.encoders.base import build_encoder
from seqzoo.encoders.dagrn import DAGRN

__all__ = ["build_parser", "main"]


class _BiasedDAGRN(DAGRN):
    """A DA-GRN whose depth logits get ``−bias·j`` at depth index j (drives the mean depth)."""

    bias: float = 0.0

    def depth_logits(self, inner: Tensor) -> Tensor:
        levels = torch.arange(self.num_layers, device=inner.device, dtype=inner.dtype)
        return super().depth_logits(inner) - self.bias * levels


def _floats(text: str) -> list[float]:
    try:
        return [float(v) for v in text.split(",") if v.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated numbers, got {text!r}") from None


def _lengths(data: Path | None, count: int) -> tuple[list[int], str]:
    """``count`` sentence lengths (cycling through the file if it has fewer) and where they come from."""
    if data is None:
        rng = random.Random(0)
        return [min(61, max(2, round(rng.gauss(23, 10)))) for _ in range(count)], "random (MR-like: mean 23, 2..61)"
    path = data / "mr.test"
    if not path.is_file():
        raise SystemExit(f"seqzoo bench dagrn: {path} not found (--data must be a classification folder)")
    lines = [line.split("\t", 1)[-1] for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]
    lengths = [max(1, len(text.split())) for text in lines]
    return [lengths[i % len(lengths)] for i in range(count)], str(path)


def _batches(lengths: list[int], batch: int, size: int) -> list[tuple[Tensor, Tensor]]:
    gen = torch.Generator().manual_seed(0)
    out = []
    for start in range(0, len(lengths), batch):
        chunk = torch.tensor(lengths[start : start + batch])
        mask = torch.arange(int(chunk.max())).unsqueeze(0) < chunk.unsqueeze(1)  # (B, T)
        out.append((torch.randn(len(chunk), mask.shape[1], size, generator=gen), mask))
    return out


def _median_times(cases: dict[str, Callable[[], None]], repeats: int, warmup: int) -> dict[str, float]:
    """Median wall-clock seconds of each case (``key``) and median CPU seconds of this process
    (``key + "_cpu"``, all its threads: less sensitive than the wall clock to other processes)."""
    timings = time_cases(cases, repeats, warmup).items()
    return {key + end: statistics.median(times) for key, t in timings for end, times in (("", t.wall), ("_cpu", t.cpu))}


def _stack_calls(model: DAGRN, batches: list[tuple[Tensor, Tensor]]) -> list[tuple[tuple, dict]]:
    """The arguments of the S-LSTM stack's run (:meth:`SentenceStateCell.run`) for each batch."""
    calls, run = [], model.cell.run

    def recording(*args: object, **kwargs: object) -> tuple[Tensor, ...]:
        calls.append((args, kwargs))
        return run(*args, **kwargs)

    model.cell.run = recording
    try:
        with torch.no_grad():
            for x, mask in batches:
                model(x, mask)
    finally:
        del model.cell.run
    return calls


def depth_rows(args: argparse.Namespace) -> list[dict]:
    """One row per depth bias: mean predicted depth, adaptive and full-depth sentences/s, speed-up."""
    torch.manual_seed(0)
    model = _BiasedDAGRN(args.input, args.input + args.depth_size, args.layers, args.depth_size, args.window)
    model.eval()
    lengths, source = _lengths(args.data, args.sentences)
    batches = _batches(lengths, args.batch, args.input)
    rows = []
    for bias in args.depth_bias:

        def encode(full_depth: bool, bias: float = bias) -> None:
            model.bias, model.full_depth = bias, full_depth
            with torch.no_grad():
                for x, mask in batches:
                    model(x, mask)

        model.bias, model.full_depth = bias, False
        calls = _stack_calls(model, batches)
        depths = sum(int(kwargs["updates"].sum()) for _, kwargs in calls)
        words = sum(int(mask.sum()) for _, mask in batches)

        def stack(full_depth: bool, calls: list[tuple[tuple, dict]] = calls) -> None:
            with torch.no_grad():
                for call_args, kwargs in calls:
                    model.cell.run(*call_args, **{**kwargs, "updates": None if full_depth else kwargs["updates"]})

        cases = {
            "adaptive": lambda: encode(False),
            "full": lambda: encode(True),
            "stack_adaptive": lambda: stack(False),
            "stack_full": lambda: stack(True),
        }
        times = _median_times(cases, args.repeats, args.warmup)
        rows.append(
            {
                "depth_bias": bias,
                "mean_depth": round(depths / words, 3),
                "layers": args.layers,
                "adaptive_sentences_per_s": round(len(lengths) / times["adaptive"], 1),
                "full_depth_sentences_per_s": round(len(lengths) / times["full"], 1),
                "speedup": round(times["full"] / times["adaptive"], 3),
                "cpu_time_speedup": round(times["full_cpu"] / times["adaptive_cpu"], 3),
                "stack_speedup": round(times["stack_full"] / times["stack_adaptive"], 3),
                "stack_share_full_depth": round(times["stack_full"] / times["full"], 3),
                "batch": args.batch,
                "sentences": len(lengths),
                "mean_length": round(sum(lengths) / len(lengths), 2),
                "inputs": source,
                "threads": torch.get_num_threads(),
            }
        )
    return rows


def _linear_products(model: nn.Module, x: Tensor) -> list[tuple[Tensor, Tensor, Tensor | None]]:
    """(input, weight, bias) of every ``nn.Linear`` call of one forward of ``model`` on ``x``."""
    calls: list[tuple[Tensor, Tensor, Tensor | None]] = []

    def record(module: nn.Linear, inputs: tuple[Tensor, ...], _: Tensor) -> None:
        bias = module.bias.detach() if module.bias is not None else None
        calls.append((inputs[0].detach().reshape(-1, module.in_features), module.weight.detach(), bias))

    handles = [m.register_forward_hook(record) for m in model.modules() if isinstance(m, nn.Linear)]
    with torch.no_grad():
        model(x)
    for handle in handles:
        handle.remove()
    return calls


def gemm_row(args: argparse.Namespace) -> dict:
    """An S-LSTM forward+backward step against its matmuls alone (see the module docstring)."""
    batch, seq_len, hidden = args.gemm_shape
    torch.manual_seed(0)
    model = build_encoder("slstm", hidden, hidden_size=hidden, window=args.window)
    model.train()
    x = torch.randn(batch, seq_len, hidden, requires_grad=True)
    params = list(model.parameters())
    grad_out = torch.randn(batch, seq_len, hidden)
    products = [(a, w, b, torch.randn(a.shape[0], w.shape[0])) for a, w, b in _linear_products(model, x)]

    def step() -> None:
        out = model(x)[0]
        torch.autograd.grad(out, [x, *params], grad_out)

    def gemm() -> None:
        for inputs, weight, bias, grad in products:
            if bias is None:
                torch.mm(inputs, weight.t())
            else:
                torch.addmm(bias, inputs, weight.t())
            torch.mm(grad, weight)  # dX
            torch.mm(grad.t(), inputs)  # dW

    times = _median_times({"step": step, "gemm": gemm}, args.repeats, args.warmup)
    tokens = batch * seq_len
    return {
        "encoder": "slstm",
        "variant": model.variant,
        "num_steps": model.num_steps,
        "window": model.window,
        "shape": f"{batch}x{seq_len}x{hidden}",
        "fwd_bwd_tokens_per_s": round(tokens / times["step"], 1),
        "gemm_bound_fwd_bwd_tokens_per_s": round(tokens / times["gemm"], 1),
        "of_gemm_bound": round(times["gemm"] / times["step"], 4),
        "of_gemm_bound_cpu_time": round(times["gemm_cpu"] / times["step_cpu"], 4),
        "linear_calls": len(products),
        "threads": torch.get_num_threads(),
    }


def build_parser() -> argparse.ArgumentParser:
    """The options of ``seqzoo bench dagrn``."""
    parser = argparse.ArgumentParser(prog="seqzoo bench dagrn", description=__doc__.split("\n\n")[0])
    parser.add_argument("--data", type=Path, default=None, help="a classification folder: lengths from mr.test")
    parser.add_argument("--depth-bias", type=_floats, default="0,0.05,0.1,0.3", help="comma-separated β values")
    parser.add_argument("--batch", type=positive_int, default=32)
    parser.add_argument("--sentences", type=positive_int, default=256, help="sentences encoded per timed run")
    parser.add_argument("--layers", type=positive_int, default=9, help="L, the S-LSTM layers (default 9)")
    parser.add_argument("--input", type=positive_int, default=350, help="token feature size (default 300 + 50)")
    parser.add_argument("--depth-size", type=positive_int, default=50, help="depth embedding d_e (default 50)")
    parser.add_argument("--window", type=positive_int, default=1, help="S-LSTM window (default 1)")
    parser.add_argument("--gemm-bound", action="store_true", help="time an S-LSTM step against its GEMM bound")
    parser.add_argument("--gemm-shape", type=shape_arg, default="32x23x400", help="BxTxH for --gemm-bound")
    parser.add_argument("--repeats", type=positive_int, default=5, help="timed runs per measurement (median)")
    parser.add_argument("--warmup", type=non_negative_int, default=1, help="untimed runs first (default 1)")
    parser.add_argument("--threads", type=positive_int, default=2, help="torch.set_num_threads (default 2)")
    parser.add_argument("--json", action="store_true", help="one JSON object per line instead of a table")
    return parser


def _table(rows: list[dict]) -> str:
    lines = [f"inputs: {rows[0]['inputs']}; batch {rows[0]['batch']}, L = {rows[0]['layers']}"]
    header = f"{'bias':>6} {'mean depth':>10} {'adaptive sent/s':>16} {'full sent/s':>12} {'speed-up':>9} {'cpu':>7}"
    lines.append(header + f" {'stack':>7}")
    for r in rows:
        lines.append(
            f"{r['depth_bias']:>6g} {r['mean_depth']:>10.2f} {r['adaptive_sentences_per_s']:>16.1f} "
            f"{r['full_depth_sentences_per_s']:>12.1f} {r['speedup']:>8.2f}x {r['cpu_time_speedup']:>6.2f}x "
            f"{r['stack_speedup']:>6.2f}x"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    torch.set_num_threads(args.threads)
    if args.gemm_bound:
        row = gemm_row(args)
        print(json.dumps(row) if args.json else ", ".join(f"{k}={v}" for k, v in row.items()))
        return 0
    rows = depth_rows(args)
    if args.json:
        for row in rows:
            print(json.dumps(row))
    else:
        print(_table(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
