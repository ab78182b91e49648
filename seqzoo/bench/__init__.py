"""Benchmarks run as ``seqzoo bench <name>``: each module here has ``main(argv) -> int``."""

import argparse
import time

import torch


def _int_at_least(text: str, minimum: int) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an integer, got {text!r}") from None
    if value < minimum:
        raise argparse.ArgumentTypeError(f"expected an integer >= {minimum}, got {value}")
    return value


def positive_int(text: str) -> int:
    """An ``argparse`` type: an integer >= 1 (repeats, threads, sizes)."""
    return _int_at_least(text, 1)


def non_negative_int(text: str) -> int:
    """An ``argparse`` type: an integer >= 0 (warm-up runs)."""
    return _int_at_least(text, 0)


def sgemm_flops_per_s(size: int = 2048, repeats: int = 5) -> float:
    """The machine's fp32 matmul rate: the best of ``repeats`` ``size``³ products (FLOP/s)."""
    a, b = torch.randn(size, size), torch.randn(size, size)
    a @ b
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        a @ b
        best = min(best, time.perf_counter() - start)
    return 2 * size**3 / best
