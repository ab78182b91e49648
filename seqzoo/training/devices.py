"""Where and in what precision a run trains: ``train.device``, ``train.precision``, seeds and threads."""

from __future__ import annotations

import contextlib
import random
from typing import Any

import torch
from torch import nn

from seqzoo.config import ConfigError, TrainConfig

__all__ = ["PRECISIONS", "autocast", "check_precision", "model_device", "resolve_device", "set_seed", "set_threads"]


def resolve_device(spec: str) -> torch.device:
    """``train.device`` as a torch device: "auto" is the GPU when torch sees one, else the CPU; a
    CUDA device that is not there is a :class:`ConfigError` that says how to run on the CPU."""
    if spec == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    device = torch.device(spec)
    if device.type == "cuda":
        count = torch.cuda.device_count() if torch.cuda.is_available() else 0
        if count == 0 or (device.index or 0) >= count:
            raise ConfigError(
                f"train.device is {spec!r} but torch sees {count} CUDA device(s) here; "
                "run with --set train.device=cpu (or auto)"
            )
    return device


#: ``train.precision``'s autocast dtype (None: no autocast).
PRECISIONS: dict[str, torch.dtype | None] = {"fp32": None, "bf16": torch.bfloat16, "fp16": torch.float16}


def check_precision(precision: str, device: torch.device) -> torch.dtype | None:
    """``train.precision``'s autocast dtype on ``device``, or a :class:`ConfigError` where it cannot
    run: float16 on the CPU (oneDNN has no float16 LSTM there; bfloat16 is the CPU's half
    precision), bfloat16 on a GPU without it."""
    if precision == "fp16" and device.type != "cuda":
        raise ConfigError(f"train.precision fp16 needs a GPU, not {device}; on the CPU use bf16")
    if precision == "bf16" and device.type == "cuda" and not torch.cuda.is_bf16_supported():
        raise ConfigError(f"train.precision bf16: {torch.cuda.get_device_name(device)} has no bfloat16; use fp16")
    return PRECISIONS[precision]


def autocast(precision: str, device: torch.device) -> contextlib.AbstractContextManager[Any]:
    """The context a training step's forward pass runs in: ``torch.autocast`` to ``precision``'s
    dtype (:func:`check_precision`), or nothing for "fp32"."""
    dtype = check_precision(precision, device)
    return contextlib.nullcontext() if dtype is None else torch.autocast(device.type, dtype=dtype)


def model_device(model: nn.Module) -> torch.device:
    """Where ``model``'s parameters live (the CPU for a model without any)."""
    param = next(model.parameters(), None)
    return param.device if param is not None else torch.device("cpu")


def set_seed(seed: int) -> None:
    random.seed(seed)
    torch.manual_seed(seed)


def set_threads(cfg: TrainConfig) -> None:
    """``torch.set_num_threads(cfg.threads)`` when the config names a thread count."""
    if cfg.threads:
        torch.set_num_threads(cfg.threads)
