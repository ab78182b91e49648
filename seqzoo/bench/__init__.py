"""Benchmarks run as ``seqzoo bench <name>``: each module here has ``main(argv) -> int``."""

import argparse


def positive_int(text: str) -> int:
    """An ``argparse`` type: an integer >= 1 (repeats, threads, sizes)."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an integer, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected an integer >= 1, got {value}")
    return value
