"""CRF throughput: ``seqzoo bench crf`` (or ``python -m seqzoo.bench.crf``).

For each shape BxTxK (batch, sequence length, tags) seqzoo's :class:`~seqzoo.heads.crf.CRF` and
pytorch-crf's ``torchcrf.CRF`` (PyPI ``pytorch-crf``, when installed) get the same parameters and the
same random float32 emissions and tags, and are timed on the log-likelihood forward + backward
(gradients of the emissions and the CRF's parameters, ``reduction="sum"``) and on Viterbi decoding
(pytorch-crf returns lists, seqzoo a padded tensor). Each shape runs twice: ``full``, every row of
length T, and ``padded``, row lengths drawn uniformly from [T/2, T] with one row of length T.
Throughput counts real tokens. Measurements are interleaved round-robin, so load from other
processes hits both alike; each figure is the median over ``--repeats`` after warm-up (the JSON
rows also carry the fastest run, ``*_best_tokens_per_s``, the steadier figure on a loaded machine).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from collections.abc import Callable

import torch
from torch import Tensor

from seqzoo.bench import bench_parser, non_negative_int, positive_int, shapes_arg, time_cases
from seqzoo.heads.crf import CRF

__all__ = ["build_parser", "main", "measure"]

DEFAULT_SHAPES = "32x50x9,32x50x50,16x100x415"
VARIANTS = ("full", "padded")


def _inputs(shape: tuple[int, int, int], variant: str) -> tuple[Tensor, Tensor, Tensor]:
    """Emissions (B, T, K), tags (B, T) and a right-padded mask (B, T), seeded."""
    batch, seq_len, tags = shape
    gen = torch.Generator().manual_seed(0)
    emissions = torch.randn(batch, seq_len, tags, generator=gen)
    labels = torch.randint(tags, (batch, seq_len), generator=gen)
    lengths = torch.full((batch,), seq_len)
    if variant == "padded":
        lengths = torch.randint((seq_len + 1) // 2, seq_len + 1, (batch,), generator=gen)
        lengths[0] = seq_len
    mask = torch.arange(seq_len).unsqueeze(0) < lengths.unsqueeze(1)
    return emissions, labels, mask


def _cases(model: torch.nn.Module, emissions: Tensor, tags: Tensor, mask: Tensor) -> dict[str, Callable[[], None]]:
    leaf = emissions.clone().requires_grad_(True)
    params = list(model.parameters())

    def llh() -> None:
        torch.autograd.grad(model(leaf, tags, mask, reduction="sum"), [leaf, *params])

    def viterbi() -> None:
        model.decode(emissions, mask)

    return {"llh": llh, "viterbi": viterbi}


def measure(shape: tuple[int, int, int], variant: str, repeats: int, warmup: int, peer: bool) -> dict:
    """One result row for one shape and length variant (see the module docstring)."""
    emissions, tags, mask = _inputs(shape, variant)
    models = {"seqzoo": CRF(shape[2])}
    if peer:
        import torchcrf

        models["pytorch_crf"] = torchcrf.CRF(shape[2], batch_first=True)
        models["pytorch_crf"].load_state_dict(models["seqzoo"].state_dict())
    cases = {
        (name, kind): fn for name, model in models.items() for kind, fn in _cases(model, emissions, tags, mask).items()
    }
    samples = {key: timings.wall for key, timings in time_cases(cases, repeats, warmup).items()}
    tokens = int(mask.sum())
    batch, seq_len, num_tags = shape
    row: dict = {"batch": batch, "seq_len": seq_len, "tags": num_tags, "lengths": variant, "tokens": tokens}
    for name in models:
        for kind in ("llh", "viterbi"):
            row[f"{name}_{kind}_tokens_per_s"] = round(tokens / statistics.median(samples[name, kind]), 1)
            row[f"{name}_{kind}_best_tokens_per_s"] = round(tokens / min(samples[name, kind]), 1)
    for kind in ("llh", "viterbi"):
        peer_rate = row.get(f"pytorch_crf_{kind}_tokens_per_s")
        row[f"{kind}_speedup"] = round(row[f"seqzoo_{kind}_tokens_per_s"] / peer_rate, 2) if peer_rate else None
    return row


def _table(rows: list[dict]) -> str:
    lines = [
        f"{'shape':>12} {'lengths':>7} {'llh tok/s':>11} {'peer':>10} {'x':>6} "
        f"{'viterbi tok/s':>13} {'peer':>10} {'x':>6}"
    ]
    for r in rows:
        cells = []
        for kind in ("llh", "viterbi"):
            peer = r.get(f"pytorch_crf_{kind}_tokens_per_s")
            ratio = r[f"{kind}_speedup"]
            width = 11 if kind == "llh" else 13
            cells.append(
                f"{r[f'seqzoo_{kind}_tokens_per_s']:>{width}.0f} {'-' if peer is None else f'{peer:.0f}':>10} "
                f"{'-' if ratio is None else f'{ratio:.2f}':>6}"
            )
        shape = f"{r['batch']}x{r['seq_len']}x{r['tags']}"
        lines.append(f"{shape:>12} {r['lengths']:>7} " + " ".join(cells))
    return "\n".join(lines)


def build_parser() -> argparse.ArgumentParser:
    """The options of ``seqzoo bench crf``."""
    parser = bench_parser("crf", __doc__)
    parser.add_argument("--shapes", type=shapes_arg, default=DEFAULT_SHAPES, help="comma-separated BxTxK")
    parser.add_argument(
        "--lengths", choices=(*VARIANTS, "both"), default="both", help="full rows, padded rows or both (default)"
    )
    parser.add_argument("--json", action="store_true", help="one JSON object per line instead of a table")
    parser.add_argument("--repeats", type=positive_int, default=5, help="timed runs per measurement (median)")
    parser.add_argument("--warmup", type=non_negative_int, default=1, help="untimed runs first (default 1)")
    parser.add_argument("--threads", type=positive_int, default=2, help="torch.set_num_threads (default 2)")
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        import torchcrf  # noqa: F401

        peer = True
    except ImportError:
        print("pytorch-crf is not installed (pip install 'seqzoo[bench]'); timing seqzoo alone", file=sys.stderr)
        peer = False
    torch.set_num_threads(args.threads)
    variants = VARIANTS if args.lengths == "both" else (args.lengths,)
    rows = []
    for shape in args.shapes:
        for variant in variants:
            rows.append({**measure(shape, variant, args.repeats, args.warmup, peer), "threads": args.threads})
            if args.json:
                print(json.dumps(rows[-1]), flush=True)
    if not args.json:
        print(_table(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
