"""Padding and length-bucketed batching for variable-length sequences."""

from __future__ import annotations

import random
from collections.abc import Sequence

import torch

__all__ = ["bucket_batches", "pad_batch", "shard_batches"]


def pad_batch(
    seqs: Sequence[Sequence[int]], pad_id: int = 0, max_len: int | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """Right-pad id sequences into ``(ids, mask)``, both (B, T) with T the longest (capped) length.

    ``ids`` is int64, ``mask`` bool with True at real tokens (the encoder contract of
    :mod:`seqzoo.encoders.base`). Sequences longer than ``max_len`` are truncated to their first
    ``max_len`` ids. Empty sequences are rejected: every row needs a real token.
    """
    if not seqs:
        raise ValueError("cannot pad an empty batch")
    if max_len is not None and max_len < 1:
        raise ValueError(f"max_len must be >= 1, got {max_len}")
    lengths = [len(s) if max_len is None else min(len(s), max_len) for s in seqs]
    if min(lengths) == 0:
        raise ValueError(f"sequence {lengths.index(0)} of the batch is empty")
    ids = torch.full((len(seqs), max(lengths)), pad_id, dtype=torch.long)
    for row, (seq, n) in enumerate(zip(seqs, lengths, strict=True)):
        ids[row, :n] = torch.as_tensor(seq[:n], dtype=torch.long)
    mask = torch.arange(ids.shape[1]) < torch.tensor(lengths).unsqueeze(1)
    return ids, mask


def bucket_batches(
    lengths: Sequence[int],
    batch_size: int,
    shuffle: bool,
    seed: int | None = None,
    bucket_size_multiplier: int = 50,
) -> list[list[int]]:
    """Batches of example indices grouped by similar length, to minimise padding.

    Indices are cut, in order (shuffled first when ``shuffle``), into pools of
    ``batch_size * bucket_size_multiplier``; each pool is sorted by length (stable) and cut
    into batches of ``batch_size`` (the last batch of a pool may be smaller); with
    ``shuffle`` the order of all batches is shuffled too. Every index appears exactly once.
    Randomness comes only from ``random.Random(seed)``: the same seed gives the same batches
    (``seed=None`` draws fresh entropy). Without ``shuffle``, the result is fixed and
    ``seed`` is ignored (evaluation order; map outputs back through the indices).
    """
    if batch_size < 1 or bucket_size_multiplier < 1:
        raise ValueError(
            f"batch_size and bucket_size_multiplier must be >= 1, got {batch_size}, {bucket_size_multiplier}"
        )
    rng = random.Random(seed)
    order = list(range(len(lengths)))
    if shuffle:
        rng.shuffle(order)
    pool_size = batch_size * bucket_size_multiplier
    batches = []
    for start in range(0, len(order), pool_size):
        pool = sorted(order[start : start + pool_size], key=lengths.__getitem__)
        batches.extend(pool[i : i + batch_size] for i in range(0, len(pool), batch_size))
    if shuffle:
        rng.shuffle(batches)
    return batches


def shard_batches(batches: Sequence[Sequence[int]], rank: int, world_size: int) -> list[list[int]]:
    """Rank ``rank``'s part of each of ``batches`` in data-parallel training over ``world_size`` ranks.

    Each batch (of example indices, e.g. from :func:`bucket_batches` with the global batch size) is
    dealt out in turn: rank ``r`` gets its items ``r, r + world_size, ...``, so the parts differ in
    size by at most one. A batch with fewer than ``world_size`` items is dropped (no rank may get
    an empty batch): every rank gets the same number of batches, so none waits on an all-reduce
    that another never joins. The result is a pure function of the arguments.
    """
    if not 0 <= rank < world_size:
        raise ValueError(f"rank must be in [0, {world_size}), got {rank}")
    return [list(batch[rank::world_size]) for batch in batches if len(batch) >= world_size]
