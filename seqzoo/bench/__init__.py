"""Benchmarks run as ``seqzoo bench <name>``: each module here has ``main(argv) -> int``."""

from __future__ import annotations

import argparse
import json
import statistics
import time
from collections.abc import Callable, Hashable, Iterable, Mapping
from dataclasses import dataclass
from typing import TypeVar

import torch

Key = TypeVar("Key", bound=Hashable)


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


@dataclass(frozen=True)
class Timings:
    """Seconds of one case's timed runs, in order: ``wall`` by the host clock, ``cpu`` by this
    process's CPU time (all its threads: less sensitive than the wall clock to other processes)."""

    wall: list[float]
    cpu: list[float]

    @property
    def median(self) -> float:
        """The median wall-clock seconds."""
        return statistics.median(self.wall)


def time_cases(
    cases: Mapping[Key, Callable[[], object]], repeats: int, warmup: int, device: torch.device | None = None
) -> dict[Key, Timings]:
    """Time each case over ``warmup + repeats`` rounds, keeping the last ``repeats``. A round runs
    every case once, in turn (round-robin: load from other processes hits all cases alike). With a
    ``device``, its queued work is waited for before and after each run (:func:`synchronize`)."""
    timings = {key: Timings([], []) for key in cases}
    for i in range(warmup + repeats):
        for key, run in cases.items():
            if device is not None:
                synchronize(device)
            start_cpu = time.process_time()
            start = time.perf_counter()
            run()
            if device is not None:
                synchronize(device)
            wall = time.perf_counter() - start
            cpu = time.process_time() - start_cpu
            if i >= warmup:
                timings[key].wall.append(wall)
                timings[key].cpu.append(cpu)
    return timings


def bench_parser(name: str, doc: str | None) -> argparse.ArgumentParser:
    """The parser of ``seqzoo bench NAME``, described by the first paragraph of its module's docstring."""
    return argparse.ArgumentParser(prog=f"seqzoo bench {name}", description=(doc or "").split("\n\n")[0])


def add_timing_arguments(parser: argparse.ArgumentParser, *, warmup: int, per: str = "measurement") -> None:
    """A timing benchmark's options: ``--repeats`` (``per`` measurement), ``--warmup``, ``--threads``, ``--json``."""
    parser.add_argument("--repeats", type=positive_int, default=5, help=f"timed runs per {per} (median)")
    first = f"untimed runs first (default {warmup})"
    parser.add_argument("--warmup", type=non_negative_int, default=warmup, help=first)
    parser.add_argument("--threads", type=positive_int, default=2, help="torch.set_num_threads (default 2)")
    parser.add_argument("--json", action="store_true", help="one JSON object per line instead of a table")


def print_rows(rows: Iterable[dict], as_json: bool, table: Callable[[list[dict]], str]) -> None:
    """Print each row as one JSON line as soon as it comes (``as_json``), or else all rows as one
    ``table`` at the end."""
    done = []
    for row in rows:
        done.append(row)
        if as_json:
            print(json.dumps(row), flush=True)
    if not as_json:
        print(table(done))
