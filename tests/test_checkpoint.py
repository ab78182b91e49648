import re

import pytest
import torch

from seqzoo.data.errors import DataError
from seqzoo.training.checkpoint import (
    join_tensors,
    load_tensors,
    resolve_checkpoint,
    save_checkpoint_dir,
    split_tensors,
)


def test_split_join_round_trip():
    tree = {"state": {0: {"step": torch.tensor(3.0), "exp_avg": torch.ones(2)}}, "groups": [{"lr": 0.1, "params": [0]}]}
    skeleton, tensors = split_tensors(tree)
    back = join_tensors(skeleton, tensors)
    assert torch.equal(back["state"]["0"]["exp_avg"], torch.ones(2)) and back["groups"] == [{"lr": 0.1, "params": [0]}]


def test_atomic_swap_and_crash_leftovers(tmp_path):
    target = tmp_path / "last"
    save_checkpoint_dir(target, {"model": {"w": torch.zeros(2)}}, {"a.json": {"v": 1}})
    save_checkpoint_dir(target, {"model": {"w": torch.ones(2)}}, {"a.json": {"v": 2}})
    assert torch.equal(load_tensors(target / "model.safetensors")["w"], torch.ones(2))
    assert not (tmp_path / "last.old").exists() and not (tmp_path / "last.tmp").exists()
    # A crash between the two renames leaves only last.old: it is still found.
    target.rename(tmp_path / "last.old")
    (tmp_path / "last.tmp").mkdir()  # a half-written new checkpoint is ignored
    assert resolve_checkpoint(target) == tmp_path / "last.old"
    assert resolve_checkpoint(tmp_path / "missing") is None


def test_a_corrupt_tensor_file_is_a_data_error_naming_it(tmp_path):
    path = tmp_path / "model.safetensors"
    save_checkpoint_dir(tmp_path / "ck", {"model": {"w": torch.ones(64)}}, {})
    whole = (tmp_path / "ck" / "model.safetensors").read_bytes()
    for data in (whole[: len(whole) // 2], b""):
        path.write_bytes(data)
        with pytest.raises(DataError, match=rf"^{re.escape(str(path))}: corrupt or truncated safetensors file"):
            load_tensors(path)


def test_a_crash_after_the_swap_but_before_cleanup_resolves_to_the_new_checkpoint(tmp_path):
    """Both last/ (new, complete) and last.old/ (previous) exist: the new one is the checkpoint."""
    save_checkpoint_dir(tmp_path / "last", {"model": {"w": torch.ones(2)}}, {})
    save_checkpoint_dir(tmp_path / "last.old", {"model": {"w": torch.zeros(2)}}, {})  # (saving last/ removes .old)
    assert (tmp_path / "last.old").is_dir()
    found = resolve_checkpoint(tmp_path / "last")
    assert found == tmp_path / "last"
    assert torch.equal(load_tensors(found / "model.safetensors")["w"], torch.ones(2))


def test_a_directory_without_tensors_is_no_checkpoint(tmp_path):
    """An empty best/ (created by hand, or by a tool) is not 'complete'; its .old twin is used."""
    (tmp_path / "best").mkdir()
    assert resolve_checkpoint(tmp_path / "best") is None
    save_checkpoint_dir(tmp_path / "best.old", {"model": {"w": torch.zeros(2)}}, {})
    assert resolve_checkpoint(tmp_path / "best") == tmp_path / "best.old"
