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


def shape_arg(text: str) -> tuple[int, int, int]:
    """An ``argparse`` type: one ``BxTxN`` shape (batch, length, a size), each >= 1."""
    try:
        batch, seq_len, size = (positive_int(v) for v in text.lower().split("x"))
    except (ValueError, argparse.ArgumentTypeError):
        raise argparse.ArgumentTypeError(f"expected BxTxN of sizes >= 1, e.g. 32x50x9; got {text!r}") from None
    return batch, seq_len, size


def shapes_arg(text: str) -> list[tuple[int, int, int]]:
    """An ``argparse`` type: comma-separated ``BxTxN`` shapes (:func:`shape_arg`)."""
    return [shape_arg(item) for item in text.split(",")]


def device_arg(text: str) -> torch.device:
    """An ``argparse`` type: a torch device that exists here ("cpu", "cuda", "cuda:1")."""
    try:
        device = torch.device(text)
    except RuntimeError:
        raise argparse.ArgumentTypeError(f"expected a device such as cpu or cuda, got {text!r}") from None
    if device.type not in ("cpu", "cuda"):
        raise argparse.ArgumentTypeError(f"benchmarks run on cpu or cuda, got {text!r}")
    if device.type == "cuda" and not torch.cuda.is_available():
        raise argparse.ArgumentTypeError(f"{text}: torch sees no CUDA device here")
    return device


def synchronize(device: torch.device) -> None:
    """Wait for ``device``'s queued work (a no-op on the CPU): a host clock read after it is honest."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def sgemm_flops_per_s(size: int | None = None, repeats: int = 5, device: torch.device | str = "cpu") -> float:
    """The device's fp32 matmul rate (under torch's matmul precision setting): the best of
    ``repeats`` ``size``³ products (FLOP/s); ``size`` defaults to 2048 on the CPU, 4096 on a GPU."""
    device = torch.device(device)
    size = size or (4096 if device.type == "cuda" else 2048)
    a, b = torch.randn(size, size, device=device), torch.randn(size, size, device=device)
    a @ b
    best = float("inf")
    for _ in range(repeats):
        synchronize(device)
        start = time.perf_counter()
        a @ b
        synchronize(device)
        best = min(best, time.perf_counter() - start)
    return 2 * size**3 / best
