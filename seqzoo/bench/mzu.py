"""MZU+DT training throughput and FLOP efficiency: ``python -m seqzoo.bench.mzu [--json]``.

Model: the paper's PTB character LM (MODELS.md 4.6): embedding 256 -> MZU+DT (hidden 800,
filter 1000, 4 zones, cap with J = 2, T = 3, one t-MZU, M shared across depths, candidate
dropout 0.5, λ = 1) -> Linear to the 50-symbol vocabulary; batch 256, TBPTT 150. One timed
training step = forward over a chunk (state carried from the previous chunk), cross-entropy
plus the disagreement term, backward, Adam update. The DT-GRU (one T-GRU) is timed the same
way at the same hidden size.

FLOP efficiency = (analytic FLOPs of forward+backward per char x chars/s) / sgemm FLOP/s.
FLOPs count only matrix products (``2·m·n·k`` each, from :func:`mzu_forward_flops` /
:func:`dtgru_forward_flops`; element-wise work is not counted), times 3 for forward+backward.
The sgemm rate is the best of a 2048³ fp32 matmul measured before and after the models in the
same run, so load from other processes lowers both sides alike as far as possible.

``--compile-step`` builds both encoders with ``compile_step=True`` (their recurrent step through
``torch.compile``, :mod:`seqzoo.encoders.recurrent`); the untimed warm-up step then includes compiling. A
record says ``compile_step`` only for a step that ran compiled: a failed compile (which warns)
falls back to eager, and the record says false.

``--device cuda`` times the steps on the GPU (each step waits for the GPU's queued work) and
measures the GPU's sgemm rate (4096³) instead.
"""

from __future__ import annotations

import argparse
import json

import torch
import torch.nn.functional as F
from torch import nn

from seqzoo.bench import bench_parser, device_arg, positive_int, sgemm_flops_per_s, time_cases
from seqzoo.encoders.base import Encoder, detach_state
from seqzoo.encoders.dtgru import DeepTransitionGRU
from seqzoo.encoders.mzu import MZU
from seqzoo.encoders.recurrent import compile_failure

__all__ = ["build_parser", "dtgru_forward_flops", "main", "mzu_forward_flops"]

VOCAB, EMBEDDING, HIDDEN, FILTER = 50, 256, 800, 1000


def _m_function_flops(hidden: int, composition: str, zones: int, filter_size: int, capsules: int, iters: int) -> int:
    """Matmul FLOPs of one M-function after zone generation, per token.

    Capsule routing is counted as eqs. 10–14 read (the N predictions formed once, then the
    routing products). :func:`seqzoo.encoders.mzu.capsule_routing` routes in zone space instead, which
    costs 2T − 1 products with W^c in place of N (5 against 4 at T = 3, N = 4); the extra ones
    are not counted, so the efficiency below is of the equations' work.
    """
    zone = hidden // zones
    if composition == "sat":
        out_zones, out_size = zones, zone
        compose = 2 * zones * zone * 3 * zone + 2 * (2 * zones * zones * zone)
    elif composition == "gcn":
        out_zones, out_size = zones, zone
        compose = 2 * zones * zones * zone + 2 * zones * zone * zone + 2 * zones * zones * zone
    else:
        out_zones, out_size = capsules, hidden // capsules
        compose = 2 * zones * zone * capsules * out_size + (2 * iters - 1) * 2 * zones * capsules * out_size
    ffn = out_zones * 2 * (2 * out_size * filter_size)
    return compose + ffn + 2 * out_zones * out_size * hidden


def mzu_forward_flops(
    input_size: int,
    hidden: int,
    composition: str = "cap",
    zones: int = 4,
    filter_size: int = FILTER,
    capsules: int = 2,
    iters: int = 3,
    transition_depth: int = 1,
) -> int:
    """Forward matmul FLOPs per token of one MZU(+DT) layer (M_h and M_g at every depth)."""
    per_depth = 2 * (2 * hidden * hidden + _m_function_flops(hidden, composition, zones, filter_size, capsules, iters))
    return 2 * (2 * input_size * hidden) + (transition_depth + 1) * per_depth


def dtgru_forward_flops(input_size: int, hidden: int, transition_depth: int = 1) -> int:
    """Forward matmul FLOPs per token of one DT-GRU layer: the L-GRU with linear gate (x to r, u,
    l, candidate and H(x): 5H; h to r, u, l, candidate: 4H), then T-GRUs (h to r, u, candidate: 3H)."""
    return 2 * input_size * 5 * hidden + 2 * hidden * 4 * hidden + transition_depth * 2 * hidden * 3 * hidden


class _CharLM(nn.Module):
    def __init__(self, encoder: Encoder) -> None:
        super().__init__()
        self.embedding = nn.Embedding(VOCAB, EMBEDDING)
        self.encoder = encoder
        self.decoder = nn.Linear(encoder.output_size, VOCAB)


def _time_training(lm: _CharLM, batch: int, bptt: int, repeats: int) -> float:
    """Median seconds of one TBPTT training step (after one warm-up step)."""
    optimizer = torch.optim.Adam(lm.parameters(), lr=1e-3)
    device = lm.decoder.weight.device
    gen = torch.Generator().manual_seed(0)
    batches = iter([torch.randint(VOCAB, (batch, bptt + 1), generator=gen).to(device) for _ in range(repeats + 1)])
    state = None

    def step() -> None:
        nonlocal state
        chars = next(batches)
        outputs, state = lm.encoder(lm.embedding(chars[:, :-1]), state=state)
        loss = F.cross_entropy(lm.decoder(outputs).flatten(0, 1), chars[:, 1:].flatten())
        aux = lm.encoder.auxiliary_loss()
        if aux is not None:
            loss = loss + aux
        optimizer.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(lm.parameters(), 5.0)
        optimizer.step()
        state = detach_state(state)

    return time_cases({"step": step}, repeats, warmup=1, device=device)["step"].median


def build_parser() -> argparse.ArgumentParser:
    """The options of ``seqzoo bench mzu``."""
    parser = bench_parser("mzu", __doc__)
    parser.add_argument("--batch", type=positive_int, default=256)
    parser.add_argument("--bptt", type=positive_int, default=150, help="the paper's 150 needs ~15 GB of RAM")
    parser.add_argument("--repeats", type=positive_int, default=2, help="timed training steps per model (median)")
    parser.add_argument("--composition", choices=["sat", "gcn", "cap"], default="cap")
    parser.add_argument("--threads", type=positive_int, default=None, help="torch intra-op threads (default: torch's)")
    parser.add_argument("--compile-step", action="store_true", help="the recurrent steps through torch.compile")
    parser.add_argument("--device", type=device_arg, default="cpu", help="cpu (default) or cuda")
    parser.add_argument("--json", action="store_true", help="one JSON object per line")
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)

    torch.manual_seed(0)
    sgemm = [sgemm_flops_per_s(device=args.device)]
    mzu = MZU(
        EMBEDDING, HIDDEN, dropout=0.5, composition=args.composition, num_zones=4, filter_size=FILTER,
        capsules=2, routing_iters=3, transition_depth=1, share_transition=True, disagreement=1.0,
        compile_step=args.compile_step,
    )  # fmt: skip
    dtgru = DeepTransitionGRU(EMBEDDING, HIDDEN, dropout=0.5, compile_step=args.compile_step)
    models = [
        (f"{args.composition}MZU+DT", _CharLM(mzu), mzu_forward_flops(EMBEDDING, HIDDEN, args.composition)),
        ("DT-GRU", _CharLM(dtgru), dtgru_forward_flops(EMBEDDING, HIDDEN)),
    ]
    results = []
    for name, lm, encoder_flops in models:
        seconds = _time_training(lm.to(args.device), args.batch, args.bptt, args.repeats)
        flops_per_char = 3 * (encoder_flops + 2 * HIDDEN * VOCAB)
        results.append((name, lm, seconds, flops_per_char))
    sgemm.append(sgemm_flops_per_s(device=args.device))
    peak = max(sgemm)
    for name, lm, seconds, flops_per_char in results:
        chars_per_s = args.batch * args.bptt / seconds
        record = {
            "model": name,
            "params": sum(p.numel() for p in lm.parameters()),
            "batch": args.batch,
            "bptt": args.bptt,
            "threads": torch.get_num_threads(),
            "device": args.device.type,
            "compile_step": args.compile_step and compile_failure() is None,  # false after a fallback
            "step_s": round(seconds, 3),
            "chars_per_s": round(chars_per_s, 1),
            "train_flops_per_char": flops_per_char,
            "achieved_gflops": round(flops_per_char * chars_per_s / 1e9, 2),
            "sgemm_gflops": [round(s / 1e9, 1) for s in sgemm],
            "flop_efficiency": round(flops_per_char * chars_per_s / peak, 3),
        }
        if args.json:
            print(json.dumps(record))
        else:
            print(", ".join(f"{k}={v}" for k, v in record.items()))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
