"""DA-GRN inference speed against the same weights at full depth: ``seqzoo bench dagrn``.

A DA-GRN encoder in evaluation mode (Gumbel-Max selection without noise) encodes batches of
``--batch`` sentences; the same module with ``full_depth=True`` (every word updated L times, same
weights and inputs) is timed in the same run, interleaved round-robin, median over ``--repeats``
after ``--warmup``. The mean depth is driven by a depth bias: for each ``--depth-bias`` β the depth
logits get ``−β·j`` added at depth index j (β > 0 favours shallow words; β = 0 is the model's own
choice). Each row reports the mean predicted depth over the real words and the speed-up
``adaptive sentences/s ÷ full-depth sentences/s`` of the encoder (wall clock; ``cpu_time_speedup``
the same ratio of this process's CPU seconds, steadier on a shared machine; ``stack_speedup`` the
same ratio for the S-LSTM stack alone, run on the inputs the encoder gave it, without the Bi-LSTM,
the depth predictor and the input projection, which cost the same at any depth; ``min_*`` the
ratios of the least CPU seconds over the repeats, the run least disturbed on a loaded machine).

``--run RUN_DIR`` (a trained classification run with a ``dagrn`` encoder, read by
:func:`seqzoo.load`; ``--seed`` picks one of several seeds) times the trained model: the test
sentences of its corpus (``DIR/NAME.test``, DIR the run's ``data.data_dir`` or ``--data``), in file
order, through the model's own token embedder; the rows add the speed-up of the whole model
(``model_speedup``: embedder, encoder, pooler and classifier). Without ``--run`` the weights are
random (MODELS.md 2.3 sizes: token features ``--input`` 350, hidden 400, depth embedding 50,
L = ``--layers`` 9) and so are the features; the sentence lengths are those of ``DIR/mr.test``
(whitespace tokens) with ``--data DIR``, else random lengths of MR-like statistics (mean 23,
clipped to 2..61): only the lengths and depths set the cost.

``--training`` instead times the training step (forward and backward, dropout and Gumbel noise on,
the same seed for both) over the same batches with the active words gathered at each layer
(:attr:`DAGRN.gather_in_training`, the default) against every word computed and the frozen ones kept:
the choice of the training path.

``--gemm-bound`` instead times one S-LSTM (``slstm``, paper variant) forward+backward step at
``--gemm-shape`` BxTxH against its GEMM bound: every ``nn.Linear`` product the step runs (found by
hooks on one forward) replayed alone, forward ``Y = XWᵀ + b``, backward ``dX = dY W`` and
``dW = dYᵀ X``, in the same run.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import Tensor, nn

from seqzoo.api import load
from seqzoo.bench import bench_parser, non_negative_int, positive_int, print_rows, shape_arg, time_cases
from seqzoo.encoders.base import build_encoder
from seqzoo.encoders.dagrn import DAGRN
from seqzoo.encoders.slstm import SentenceStateCell, WordLayout

__all__ = [
    "StackCall",
    "Workload",
    "build_parser",
    "depth_bias",
    "depth_rows",
    "main",
    "random_workload",
    "trained_workload",
    "training_row",
]


@contextmanager
def depth_bias(encoder: DAGRN, bias: float) -> Iterator[None]:
    """Within the block, ``encoder``'s depth logits get ``−bias·j`` at depth index j (bias > 0
    favours shallow words), on any DA-GRN, trained or not."""
    logits = encoder.depth_logits
    levels = torch.arange(encoder.num_layers, device=encoder.depth_embedding.device)

    def biased(inner: Tensor) -> Tensor:
        return logits(inner) - bias * levels.to(inner.dtype)

    encoder.depth_logits = biased
    try:
        yield
    finally:
        del encoder.depth_logits


def _floats(text: str) -> list[float]:
    try:
        return [float(v) for v in text.split(",") if v.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated numbers, got {text!r}") from None


def _texts(path: Path) -> list[str]:
    """The text column of a classification file (``label<TAB>text`` lines)."""
    if not path.is_file():
        raise SystemExit(f"seqzoo bench dagrn: {path} not found (--data must be a classification folder)")
    return [line.split("\t", 1)[-1] for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]


def _lengths(data: Path | None, count: int | None) -> tuple[list[int], str]:
    """Sentence lengths and where they come from: those of ``data/mr.test`` (``count`` of them,
    cycling through the file if it has fewer; all by default), else ``count`` (default 256) random
    MR-like ones."""
    if data is None:
        rng = random.Random(0)
        lengths = [min(61, max(2, round(rng.gauss(23, 10)))) for _ in range(count or 256)]
        return lengths, "random (MR-like: mean 23, 2..61)"
    path = data / "mr.test"
    lengths = [max(1, len(text.split())) for text in _texts(path)]
    return [lengths[i % len(lengths)] for i in range(count or len(lengths))], str(path)


def _batches(lengths: list[int], batch: int, size: int) -> list[tuple[Tensor, Tensor]]:
    gen = torch.Generator().manual_seed(0)
    out = []
    for start in range(0, len(lengths), batch):
        chunk = torch.tensor(lengths[start : start + batch])
        mask = torch.arange(int(chunk.max())).unsqueeze(0) < chunk.unsqueeze(1)  # (B, T)
        out.append((torch.randn(len(chunk), mask.shape[1], size, generator=gen), mask))
    return out


def _median_times(cases: dict[str, Callable[[], None]], repeats: int, warmup: int) -> dict[str, float]:
    """Median wall-clock seconds of each case (``key``), median CPU seconds of this process
    (``key + "_cpu"``, all its threads: less sensitive than the wall clock to other processes) and
    the least CPU seconds (``key + "_cpu_min"``: the run least disturbed by a loaded machine)."""
    timings = time_cases(cases, repeats, warmup).items()
    return {
        key + end: reduce(times)
        for key, t in timings
        for end, times, reduce in (
            ("", t.wall, statistics.median),
            ("_cpu", t.cpu, statistics.median),
            ("_cpu_min", t.cpu, min),
        )
    }


@dataclass
class StackCall:
    """The S-LSTM stack's inputs for one batch (what :meth:`DAGRN.forward_compact` gives
    :meth:`SentenceStateCell.run_compact`), at the real words in ``mask.nonzero()`` order."""

    mask: Tensor  # (B, T)
    depths: Tensor  # (M,) the predicted depths
    x_pre: Tensor  # (M, G·H)
    x_cell: Tensor | None  # (M, H)
    state: tuple[Tensor, Tensor, Tensor, Tensor]  # h, c (M, H); g, c_g (B, H)
    start: tuple[Tensor, Tensor] | None  # m (M, d_e), W_3 (H, d_e)

    def run(self, cell: SentenceStateCell, steps: int, full_depth: bool) -> None:
        """The stack on these inputs: its layout (the predicted depths, or every word at ``steps``), its steps."""
        depths = torch.full_like(self.depths, steps) if full_depth else self.depths
        layout = cell.layout(self.mask, depths, steps)

        def laid_out(t: Tensor) -> Tensor:
            return t.index_select(0, layout.order)

        h, c, g, c_g = self.state
        x_cell = None if self.x_cell is None else laid_out(self.x_cell)
        start = None if self.start is None else (laid_out(self.start[0]), self.start[1])
        cell.run_compact(laid_out(self.x_pre), x_cell, (laid_out(h), laid_out(c), g, c_g), layout, start)


def _stack_calls(model: DAGRN, batches: list[tuple[Tensor, Tensor]]) -> list[StackCall]:
    """The S-LSTM stack's inputs for each batch (see :class:`StackCall`)."""
    calls: list[StackCall] = []
    run = model.cell.run_compact

    def recording(
        x_pre: Tensor, x_cell: Tensor | None, state: tuple, layout: WordLayout, start: tuple | None = None
    ) -> tuple[Tensor, ...]:
        def row_major(t: Tensor) -> Tensor:
            return t.new_empty(t.shape).index_copy_(0, layout.order, t)

        mask = torch.zeros(layout.shape, dtype=torch.bool).flatten().index_fill_(0, layout.position, True)
        mask = mask.view(layout.shape)
        h, c, g, c_g = state
        calls.append(
            StackCall(
                mask,
                model.last_depths[mask],
                row_major(x_pre),
                None if x_cell is None else row_major(x_cell),
                (row_major(h), row_major(c), g, c_g),
                None if start is None else (row_major(start[0]), start[1]),
            )
        )
        return run(x_pre, x_cell, state, layout, start)

    model.cell.run_compact = recording
    try:
        with torch.no_grad():
            for x, mask in batches:
                model(x, mask)
    finally:
        del model.cell.run_compact
    return calls


@dataclass
class Workload:
    """What the depth rows time: a DA-GRN in evaluation mode and its inputs per batch (x (B, T, D),
    mask (B, T)); for a trained run also its whole model and the model's inputs per batch."""

    encoder: DAGRN
    features: list[tuple[Tensor, Tensor]]
    sentences: int
    words: int
    source: str
    model: nn.Module | None = None
    inputs: list[list[Tensor]] | None = None


def random_workload(args: argparse.Namespace) -> Workload:
    """Random weights and features (see the module docstring)."""
    torch.manual_seed(0)
    encoder = DAGRN(args.input, args.input + args.depth_size, args.layers, args.depth_size, args.window).eval()
    lengths, source = _lengths(args.data, args.sentences)
    return Workload(encoder, _batches(lengths, args.batch, args.input), len(lengths), sum(lengths), source)


def trained_workload(args: argparse.Namespace) -> Workload:
    """The trained model of ``args.run`` on its corpus's test sentences (see the module docstring)."""
    trained = load(args.run, seed=args.seed)
    model, encoder, task = trained.model.eval(), trained.encoder, trained.task
    if not isinstance(encoder, DAGRN) or encoder.full_depth:
        raise SystemExit(f"seqzoo bench dagrn: {trained.path} has no depth-adaptive DA-GRN encoder ({encoder!r})")
    data = trained.config.data
    path = (args.data or Path(data.data_dir)) / f"{data.name}.test"
    texts = _texts(path)[: args.sentences]
    # the task's own encoding and batching of raw texts, as its predict has them
    encoded = [task._encode_text(text, line)[0] for line, text in enumerate(texts, 1)]
    inputs = [task._inputs(encoded[start : start + args.batch]) for start in range(0, len(encoded), args.batch)]
    features: list[tuple[Tensor, Tensor]] = []  # what the model gives its encoder: x (B, T, D), mask (B, T)
    hook = encoder.register_forward_pre_hook(lambda _, given: features.append((given[0], given[1])))
    try:
        with torch.no_grad():
            for batch in inputs:
                model(*batch)
    finally:
        hook.remove()
    words = sum(int(mask.sum()) for _, mask in features)
    return Workload(encoder, features, len(texts), words, str(path), model, inputs)


def _row(args: argparse.Namespace, work: Workload, bias: float) -> dict:
    """The timings of one depth bias (applied by the caller)."""
    encoder = work.encoder
    calls = _stack_calls(encoder, work.features)
    depths = sum(int(call.depths.sum()) for call in calls)

    def encode(full_depth: bool) -> None:
        encoder.full_depth = full_depth
        with torch.no_grad():
            for x, mask in work.features:
                encoder(x, mask)

    def classify(full_depth: bool) -> None:
        encoder.full_depth = full_depth
        with torch.no_grad():
            for batch in work.inputs:
                work.model(*batch)

    def stack(full_depth: bool) -> None:
        with torch.no_grad():
            for call in calls:
                call.run(encoder.cell, encoder.num_layers, full_depth)

    cases = {"adaptive": lambda: encode(False), "full": lambda: encode(True)}
    if work.model is not None:
        cases |= {"model_adaptive": lambda: classify(False), "model_full": lambda: classify(True)}
    cases |= {"stack_adaptive": lambda: stack(False), "stack_full": lambda: stack(True)}
    try:
        times = _median_times(cases, args.repeats, args.warmup)
    finally:
        encoder.full_depth = False
    row = {
        "depth_bias": bias,
        "mean_depth": round(depths / work.words, 3),
        "layers": encoder.num_layers,
        "adaptive_sentences_per_s": round(work.sentences / times["adaptive"], 1),
        "full_depth_sentences_per_s": round(work.sentences / times["full"], 1),
        "speedup": round(times["full"] / times["adaptive"], 3),
        "cpu_time_speedup": round(times["full_cpu"] / times["adaptive_cpu"], 3),
        "min_cpu_time_speedup": round(times["full_cpu_min"] / times["adaptive_cpu_min"], 3),
    }
    if work.model is not None:
        row |= {
            "model_adaptive_sentences_per_s": round(work.sentences / times["model_adaptive"], 1),
            "model_full_depth_sentences_per_s": round(work.sentences / times["model_full"], 1),
            "model_speedup": round(times["model_full"] / times["model_adaptive"], 3),
            "model_cpu_time_speedup": round(times["model_full_cpu"] / times["model_adaptive_cpu"], 3),
            "model_min_cpu_time_speedup": round(times["model_full_cpu_min"] / times["model_adaptive_cpu_min"], 3),
        }
    return row | {
        "stack_speedup": round(times["stack_full"] / times["stack_adaptive"], 3),
        "stack_min_cpu_time_speedup": round(times["stack_full_cpu_min"] / times["stack_adaptive_cpu_min"], 3),
        "stack_share_full_depth": round(times["stack_full"] / times["full"], 3),
        "batch": args.batch,
        "sentences": work.sentences,
        "mean_length": round(work.words / work.sentences, 2),
        "inputs": work.source,
        "run": str(args.run) if args.run else None,
        "threads": torch.get_num_threads(),
        "load_1min": round(os.getloadavg()[0], 2),  # the machine's load over the last minute, this run included
    }


def depth_rows(args: argparse.Namespace) -> Iterator[dict]:
    """One row per depth bias (as it is measured): mean predicted depth, adaptive and full-depth
    sentences/s and speed-ups (see the module docstring)."""
    work = trained_workload(args) if args.run else random_workload(args)
    for bias in args.depth_bias:
        with depth_bias(work.encoder, bias):
            yield _row(args, work, bias)


def training_row(args: argparse.Namespace) -> dict:
    """The training step's time with and without gathering the active words (see the module docstring)."""
    work = trained_workload(args) if args.run else random_workload(args)
    encoder = work.encoder.train()
    params = [p for p in encoder.parameters() if p.requires_grad]
    depths: list[int] = []

    def step(gather: bool) -> None:
        encoder.gather_in_training = gather
        torch.manual_seed(0)  # the same dropout masks and Gumbel noise for both
        depths.clear()
        for x, mask in work.features:
            out, state = encoder(x, mask)
            depths.append(int(encoder.last_depths.sum()))
            loss = out.sum() + encoder.global_state(state).sum()
            torch.autograd.grad(loss, params, allow_unused=True)

    try:
        times = _median_times({"gather": lambda: step(True), "all": lambda: step(False)}, args.repeats, args.warmup)
    finally:
        encoder.gather_in_training = DAGRN.gather_in_training
        encoder.eval()
    return {
        "mode": "training (forward + backward)",
        "mean_depth": round(sum(depths) / work.words, 3),
        "gather_sentences_per_s": round(work.sentences / times["gather"], 1),
        "all_words_sentences_per_s": round(work.sentences / times["all"], 1),
        "gather_speedup": round(times["all"] / times["gather"], 3),
        "gather_min_cpu_time_speedup": round(times["all_cpu_min"] / times["gather_cpu_min"], 3),
        "batch": args.batch,
        "sentences": work.sentences,
        "inputs": work.source,
        "run": str(args.run) if args.run else None,
        "threads": torch.get_num_threads(),
        "load_1min": round(os.getloadavg()[0], 2),
    }


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
    parser = bench_parser("dagrn", __doc__)
    parser.add_argument("--run", type=Path, default=None, help="a trained run with a dagrn encoder (see above)")
    parser.add_argument("--seed", type=int, default=None, help="which seed's model of --run, where it has several")
    parser.add_argument("--data", type=Path, default=None, help="a classification folder (lengths, or --run's texts)")
    parser.add_argument("--depth-bias", type=_floats, default="0,0.05,0.1,0.3", help="comma-separated β values")
    parser.add_argument("--batch", type=positive_int, default=32)
    help_sentences = "sentences encoded per timed run (default: the whole test file; 256 random lengths)"
    parser.add_argument("--sentences", type=positive_int, default=None, help=help_sentences)
    parser.add_argument("--layers", type=positive_int, default=9, help="L, the S-LSTM layers (default 9)")
    parser.add_argument("--input", type=positive_int, default=350, help="token feature size (default 300 + 50)")
    parser.add_argument("--depth-size", type=positive_int, default=50, help="depth embedding d_e (default 50)")
    parser.add_argument("--window", type=positive_int, default=1, help="S-LSTM window (default 1)")
    mode = parser.add_mutually_exclusive_group()  # default: the inference depth rows
    mode.add_argument("--training", action="store_true", help="time a training step, gathered or all words")
    mode.add_argument("--gemm-bound", action="store_true", help="time an S-LSTM step against its GEMM bound")
    parser.add_argument("--gemm-shape", type=shape_arg, default="32x23x400", help="BxTxH for --gemm-bound")
    parser.add_argument("--repeats", type=positive_int, default=5, help="timed runs per measurement (median)")
    parser.add_argument("--warmup", type=non_negative_int, default=1, help="untimed runs first (default 1)")
    parser.add_argument("--threads", type=positive_int, default=2, help="torch.set_num_threads (default 2)")
    parser.add_argument("--json", action="store_true", help="one JSON object per line instead of a table")
    return parser


def _table(rows: list[dict]) -> str:
    """Speed-ups: wall clock (median) and least CPU time ("cpu min"); the stack's by least CPU time."""
    first = rows[0]
    source = f"run {first['run']}, " if first["run"] else "random weights, "
    lines = [
        f"{source}inputs: {first['inputs']}; {first['sentences']} sentences, batch {first['batch']}, "
        f"L = {first['layers']}, {first['threads']} threads, load {first['load_1min']} (1-min average, after row 1)"
    ]
    model = "model_speedup" in first
    header = (
        f"{'bias':>6} {'mean depth':>10} {'adaptive sent/s':>16} {'full sent/s':>12} {'speed-up':>9} {'cpu min':>8}"
    )
    lines.append(header + (f" {'model':>7} {'cpu min':>8}" if model else "") + f" {'stack':>7}")
    for r in rows:
        line = (
            f"{r['depth_bias']:>6g} {r['mean_depth']:>10.2f} {r['adaptive_sentences_per_s']:>16.1f} "
            f"{r['full_depth_sentences_per_s']:>12.1f} {r['speedup']:>8.2f}x {r['min_cpu_time_speedup']:>7.2f}x"
        )
        if model:
            line += f" {r['model_speedup']:>6.2f}x {r['model_min_cpu_time_speedup']:>7.2f}x"
        lines.append(line + f" {r['stack_min_cpu_time_speedup']:>6.2f}x")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    torch.set_num_threads(args.threads)
    if args.gemm_bound or args.training:
        row = gemm_row(args) if args.gemm_bound else training_row(args)
        print(json.dumps(row) if args.json else ", ".join(f"{k}={v}" for k, v in row.items()))
        return 0
    print_rows(depth_rows(args), args.json, _table)
    return 0


if __name__ == "__main__":
    sys.exit(main())
