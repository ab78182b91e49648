"""Data-parallel training on PyTorch's own engine: ``torch.distributed`` + ``DistributedDataParallel``.

Processes are started by ``torchrun`` (``torchrun --nproc-per-node N -m seqzoo train CONFIG``, or
``seqzoo train --nproc N CONFIG``, which calls torchrun's launcher for one node). Each reads its
rank and the world size from the environment torchrun sets (``RANK``, ``WORLD_SIZE``,
``LOCAL_RANK``, ``MASTER_ADDR``/``MASTER_PORT``); without them a process is rank 0 of 1 and every
function here is a no-op or a plain call, so single-process training is unchanged.

The rules (docs/distributed.md):

* ``train.batch_size`` is per rank: a step of W ranks trains on ``batch_size * W`` examples. A task
  is built with the global batch size (:func:`global_batch_config`) and each rank takes its part
  of every batch (:func:`seqzoo.data.batching.shard_batches`), unless the task splits its own
  training data (the optional ``Task.shard_train(rank, world_size)`` hook; the LM recipe gives
  each rank ``data.batch_size`` of ``data.batch_size * W`` streams).
* The gradient is the global batch's mean: each rank's loss is weighted by its share of the
  all-reduced ``count`` before DDP averages the gradients (:meth:`seqzoo.training.trainer.Trainer`).
  A loss of a statistic summed over the batch (not a mean over its examples) is made the global
  batch's by :func:`global_batch_loss`.
* Rank 0 alone writes the run directory; every rank evaluates the whole split (the same weights
  give the same metrics) and follows rank 0's figures (:func:`broadcast`).
* The process group has a timeout (``train.dist_timeout`` seconds): a rank that stops answering
  fails the others' next collective instead of hanging them; torchrun tears down the rest of
  the job when one process dies and exits non-zero.
"""

from __future__ import annotations

import atexit
import contextlib
import dataclasses
import inspect
import logging
import os
from collections.abc import Callable, Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any, TypeVar

import torch
import torch.distributed as dist
from torch import Tensor, nn
from torch.nn.parallel import DistributedDataParallel

from seqzoo.config import RunConfig, TrainConfig

__all__ = [
    "all_sum",
    "barrier",
    "broadcast",
    "gather",
    "global_batch_config",
    "global_batch_loss",
    "init_from_env",
    "is_main",
    "launch",
    "main_rank_lock",
    "on_main",
    "rank",
    "replicate",
    "world_size",
]

T = TypeVar("T")
log = logging.getLogger("seqzoo")


def rank() -> int:
    """This process's rank (0 without a process group)."""
    return dist.get_rank() if dist.is_initialized() else 0


def world_size() -> int:
    """The number of data-parallel processes (1 without a process group)."""
    return dist.get_world_size() if dist.is_initialized() else 1


def is_main() -> bool:
    """Whether this process writes the run directory (rank 0)."""
    return rank() == 0


def init_from_env(train: TrainConfig) -> None:
    """Join the process group torchrun describes in the environment (``WORLD_SIZE`` > 1), once.

    Backend: gloo where torch sees no GPU, else NCCL for GPU tensors and gloo for CPU ones
    (``"cpu:gloo,cuda:nccl"``), each process on GPU ``LOCAL_RANK``. Ranks above 0 log warnings
    and errors only (rank 0 speaks for the job).
    """
    if dist.is_initialized() or int(os.environ.get("WORLD_SIZE", "1")) <= 1:
        return
    backend = "gloo"
    if torch.cuda.is_available() and train.device != "cpu":
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
        backend = "cpu:gloo,cuda:nccl"
    dist.init_process_group(backend, timeout=timedelta(seconds=train.dist_timeout))
    atexit.register(dist.destroy_process_group)
    if not is_main():
        log.setLevel(logging.WARNING)


def global_batch_config(config: RunConfig) -> RunConfig:
    """``config`` with ``train.batch_size`` the global batch (per-rank batch x world size), which
    a task is built with: each rank then trains on its part of each batch."""
    size = world_size()
    if size == 1:
        return config
    return dataclasses.replace(
        config, train=dataclasses.replace(config.train, batch_size=config.train.batch_size * size)
    )


def on_main(fn: Callable[[], T]) -> T:
    """``fn()`` run on rank 0 alone (e.g. claiming a run directory), its result given to every rank."""
    return broadcast(fn() if is_main() else None)


def broadcast(value: T) -> T:
    """Rank 0's ``value`` on every rank (picklable objects; ``value`` itself without a process group)."""
    if world_size() == 1:
        return value
    box = [value]
    dist.broadcast_object_list(box, src=0)
    return box[0]


def gather(value: T) -> list[T]:
    """Every rank's ``value``, in rank order, on every rank (tensors should be on the CPU)."""
    if world_size() == 1:
        return [value]
    values: list[Any] = [None] * world_size()
    dist.all_gather_object(values, value)
    return values


def all_sum(values: list[float]) -> list[float]:
    """Element-wise sums of ``values`` over the ranks, in float64 (``values`` itself on one rank)."""
    if world_size() == 1:
        return values
    totals = torch.tensor(values, dtype=torch.float64)  # on the CPU: gloo, whatever the model's device
    dist.all_reduce(totals)
    return totals.tolist()


def global_batch_loss(loss: Callable[[Tensor], Tensor], part: Tensor, examples: int) -> Tensor:
    """``loss`` of a statistic summed over the global batch's examples (e.g. ASP-MTL's ``SᵀH``), of which this rank
    holds ``part``, the sum over its ``examples``: ``loss(part)`` on one process. Over W ranks, a stand-in whose
    value and gradient, once the trainer weighs each rank's loss by its share ``examples / E`` of the global
    batch's E examples and DDP averages the gradients, are those of ``loss`` of the global sum ``S``: its value is
    ``loss(S) · E / (examples · W)``, its gradient that of ``loss`` at ``S`` times ``E / examples`` (``S`` is
    all-reduced, in float64, outside autograd; every rank must call it at the same step)."""
    world = world_size()
    if world == 1:
        return loss(part)
    flat = part.detach().flatten().to("cpu", torch.float64)
    totals = torch.cat([flat, flat.new_tensor([float(examples)])])
    dist.all_reduce(totals)  # on the CPU: gloo, whatever the model's device
    whole = totals[:-1].view_as(part).to(part.device, part.dtype)  # S, the global batch's statistic
    # The value loss(S); the gradient W·∇loss(S) with respect to this rank's part.
    return loss(whole + world * (part - part.detach())) * (float(totals[-1]) / (examples * world))


def barrier() -> None:
    """Wait until every rank gets here (e.g. until rank 0 has written what the others read)."""
    if world_size() > 1:
        dist.barrier()


@contextlib.contextmanager
def main_rank_lock(run_dir: Path) -> Iterator[None]:
    """The run directory's lock (:func:`seqzoo.training.rundir.run_lock`), held by rank 0, which
    alone writes there; the other ranks of the job do not contend for it."""
    from seqzoo.training.rundir import run_lock

    with run_lock(run_dir) if is_main() else contextlib.nullcontext():
        yield


class _Replicated(DistributedDataParallel):
    """DDP whose wrapper passes attribute look-ups it does not know on to the model (a task's
    ``self.model.auxiliary_loss()`` keeps working while the trainer has swapped the wrapper in)."""

    def __getattr__(self, name: str) -> Any:
        try:
            return super().__getattr__(name)
        except AttributeError:
            if name == "module":
                raise
            return getattr(self.module, name)


def replicate(model: nn.Module, find_unused_parameters: bool) -> nn.Module:
    """``model`` wrapped in DDP (gradients all-reduced, averaged, during backward); ``model`` itself
    on one process. ``find_unused_parameters``: for models whose forward leaves some parameters
    out on some steps (``train.find_unused_parameters``); a model that does so by design (a
    multi-task model runs one task's modules at a step) says so itself with a true
    ``leaves_parameters_unused`` attribute, which turns it on. Buffers are not re-broadcast at
    each forward: every rank computes the same ones."""
    if world_size() == 1:
        return model
    find_unused_parameters = find_unused_parameters or getattr(model, "leaves_parameters_unused", False)
    device = next(model.parameters()).device
    ids = [device] if device.type == "cuda" else None
    # The option's name since torch 2.13 (broadcast_buffers before it, now deprecated).
    sync = "forward_sync_buffers"
    if sync not in inspect.signature(_Replicated).parameters:
        sync = "broadcast_buffers"
    return _Replicated(model, device_ids=ids, find_unused_parameters=find_unused_parameters, **{sync: False})


def launch(nproc: int, argv: list[str]) -> int:
    """``torchrun --standalone --nproc-per-node nproc -m seqzoo ARGV`` on this node; its exit status
    (non-zero when any process failed: torchrun stops the others and reports it)."""
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.run import main as torchrun

    try:
        torchrun(["--standalone", f"--nproc-per-node={nproc}", "-m", "seqzoo", *argv])
    except ChildFailedError as err:
        failures = "; ".join(f"rank {r}: exit {f.exitcode}" for r, f in sorted(err.failures.items()))
        log.error("seqzoo: data-parallel training failed (%s)", failures)
        return 1
    return 0
