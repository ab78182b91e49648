"""MZU fast path: M_h and M_g's heads as one batch of two (``StackedHeads``) against one by one.

After zone generation, each M-function runs its composition, FFN, output map and LN: a few
dozen small operations per function and step, so at CPU sizes an MZU step is bound by the
number of operations, not by arithmetic. ``seqzoo.encoders.mzu`` runs the heads of M_h and M_g stacked
(one call per operation for both); the one-by-one layout, the reference's, is what the
REGULAR ablations still use. Both give the same values (checked below in float64). Timed:
forward + backward of one capMZU+DT encoder (4 zones, J = 2, T = 3, one shared t-MZU, candidate
dropout off) over a chunk, best of ``--rounds`` interleaved rounds, at the brown_char CPU config
(B 64, TBPTT 100, input 64, hidden 192, filter 192) and the paper's PTB config with a short
chunk (B 256, 10 steps, input 256, hidden 800, filter 1000).

    python benchmarks/mzu_stacked_heads.py [--threads 2] [--rounds 5]
"""

from __future__ import annotations

from unittest import mock

import torch
from _layouts import capsule_mzu_dt, forward_backward_seconds, layout_args

from seqzoo.encoders.mzu import MZUTransition

SHAPES = {  # name: (batch, steps, input, hidden, filter)
    "brown_char (B 64, T 100, H 192)": (64, 100, 64, 192, 192),
    "PTB (B 256, T 10, H 800)": (256, 10, 256, 800, 1000),
}


def _one_by_one():
    """The fast path with M_h's and M_g's heads run one after the other."""
    return mock.patch.object(MZUTransition, "stacked_heads", lambda self: None)


def main() -> None:
    args = layout_args(__doc__, rounds=5)
    small = capsule_mzu_dt(3, 8, 6).double()
    x = torch.randn(2, 4, 3, dtype=torch.float64)
    with _one_by_one():
        expected = small(x)[0]
    print(f"max |stacked - one by one| (float64): {(small(x)[0] - expected).abs().max().item():.1e}")

    for name, (batch, steps, input_size, hidden, filter_size) in SHAPES.items():
        encoder = capsule_mzu_dt(input_size, hidden, filter_size)
        x = torch.randn(batch, steps, input_size)
        best = {"one by one": float("inf"), "stacked (seqzoo)": float("inf")}
        for round_ in range(args.rounds + 1):  # round 0 warms up and is not counted
            with _one_by_one():
                one_by_one = forward_backward_seconds(encoder, x)
            stacked = forward_backward_seconds(encoder, x)
            if round_ > 0:
                best["one by one"] = min(best["one by one"], one_by_one)
                best["stacked (seqzoo)"] = min(best["stacked (seqzoo)"], stacked)
        ratio = best["one by one"] / best["stacked (seqzoo)"]
        times = ", ".join(f"{layout} {seconds * 1e3:.0f} ms" for layout, seconds in best.items())
        print(f"{name}: forward + backward, {times} (x{ratio:.2f})")


if __name__ == "__main__":
    main()
