"""Shared parts of the layout benchmarks in this folder (imported by path, not a package)."""

from __future__ import annotations

import argparse
import time

import torch

from seqzoo.encoders.mzu import MZU


def layout_args(doc: str, rounds: int, flags: tuple[str, ...] = ()) -> argparse.Namespace:
    """``--threads`` (set for torch, default 2), ``--rounds`` and on/off ``flags``; seeds torch with 0."""
    parser = argparse.ArgumentParser(description=doc.splitlines()[0])
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=rounds)
    for flag in flags:
        parser.add_argument(f"--{flag}", action="store_true")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    return args


def capsule_mzu_dt(input_size: int, hidden: int, filter_size: int, **kwargs: object) -> MZU:
    """The recipes' capMZU+DT: 4 zones, 2 capsules, 3 routing iterations, one shared t-MZU."""
    return MZU(
        input_size,
        hidden,
        composition="cap",
        num_zones=4,
        filter_size=filter_size,
        capsules=2,
        routing_iters=3,
        transition_depth=1,
        share_transition=True,
        **kwargs,
    )


def forward_backward_seconds(encoder: torch.nn.Module, x: torch.Tensor) -> float:
    """Wall time of one forward and backward of ``encoder(x)`` (loss: the outputs' sum)."""
    start = time.perf_counter()
    out, _ = encoder(x)
    out.sum().backward()
    return time.perf_counter() - start
