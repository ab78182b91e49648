"""Shared command line of the layout benchmarks in this folder (imported by path, not a package)."""

from __future__ import annotations

import argparse

import torch


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
