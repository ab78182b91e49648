import random

import pytest
import torch

from seqzoo.data import bucket_batches, pad_batch


def test_pad_batch():
    ids, mask = pad_batch([[5, 6, 7], [8], [9, 10]], pad_id=0)
    assert ids.dtype == torch.long and mask.dtype == torch.bool
    assert ids.tolist() == [[5, 6, 7], [8, 0, 0], [9, 10, 0]]
    assert mask.tolist() == [[True, True, True], [True, False, False], [True, True, False]]


def test_pad_batch_truncates_and_rejects_empty():
    ids, mask = pad_batch([[1, 2, 3, 4], [5]], pad_id=-1, max_len=2)
    assert ids.tolist() == [[1, 2], [5, -1]] and mask.sum().item() == 3
    with pytest.raises(ValueError, match="sequence 1 of the batch is empty"):
        pad_batch([[1], []])
    with pytest.raises(ValueError):
        pad_batch([])


_RNG = random.Random(0)
LENGTHS = [_RNG.randint(1, 100) for _ in range(1003)]


@pytest.mark.parametrize("shuffle", [False, True])
def test_bucket_batches_cover_each_index_once(shuffle):
    batches = bucket_batches(LENGTHS, batch_size=16, shuffle=shuffle, seed=0, bucket_size_multiplier=5)
    flat = [i for batch in batches for i in batch]
    assert sorted(flat) == list(range(len(LENGTHS)))
    assert all(1 <= len(batch) <= 16 for batch in batches)


def test_bucket_batches_deterministic_per_seed():
    def run(seed):
        return bucket_batches(LENGTHS, batch_size=16, shuffle=True, seed=seed)

    assert run(1) == run(1)
    assert run(1) != run(2)
    state = random.getstate()
    run(3)
    assert random.getstate() == state  # never touches the global RNG


def test_bucket_batches_group_similar_lengths():
    def padding(batches):
        return sum(max(LENGTHS[i] for i in b) * len(b) - sum(LENGTHS[i] for i in b) for b in batches)

    bucketed = bucket_batches(LENGTHS, batch_size=16, shuffle=True, seed=0)
    unbucketed = bucket_batches(LENGTHS, batch_size=16, shuffle=True, seed=0, bucket_size_multiplier=1)
    assert padding(bucketed) < padding(unbucketed) / 5


def test_shuffled_batches_are_not_in_length_order():
    """The batch order is shuffled (unshuffled, every epoch ran a pool's batches short to long)."""
    lengths = list(range(100))  # one pool
    for seed in range(3):
        batches = bucket_batches(lengths, 10, shuffle=True, seed=seed)
        firsts = [min(lengths[i] for i in b) for b in batches]
        assert firsts != sorted(firsts)
