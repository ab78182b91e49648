"""Optimisers, learning-rate schedules and the optimiser step (clipping, loss scaling)."""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch
from torch import Tensor, nn

from seqzoo.config import OptimConfig

__all__ = ["build_optimizer", "scheduled_lr", "update"]


def build_optimizer(params: Sequence[nn.Parameter], cfg: OptimConfig) -> torch.optim.Optimizer:
    params = [p for p in params if p.requires_grad]
    if cfg.optimizer == "adam":
        return torch.optim.Adam(params, lr=cfg.lr, eps=cfg.eps, weight_decay=cfg.weight_decay)
    if cfg.optimizer == "adamw":
        return torch.optim.AdamW(params, lr=cfg.lr, eps=cfg.eps, weight_decay=cfg.weight_decay)
    if cfg.optimizer == "rmsprop":
        return torch.optim.RMSprop(
            params, lr=cfg.lr, alpha=cfg.alpha, eps=cfg.eps, weight_decay=cfg.weight_decay, momentum=cfg.momentum
        )
    if cfg.optimizer == "sgd":
        return torch.optim.SGD(params, lr=cfg.lr, momentum=cfg.momentum, weight_decay=cfg.weight_decay)
    return torch.optim.Adagrad(params, lr=cfg.lr, eps=cfg.eps, weight_decay=cfg.weight_decay)


def scheduled_lr(cfg: OptimConfig, lr: float, step: int, total_steps: int) -> float:
    """The learning rate of optimiser step ``step`` (0-based) of a run of ``total_steps`` steps.

    ``lr`` is the epoch schedule's rate (``cfg.lr`` itself for "constant", "linear" and "cosine").
    The step schedules decay it from the end of the warm-up to ``cfg.min_lr`` at ``total_steps``;
    then the first ``cfg.warmup_steps`` steps scale it by (step + 1) / warmup_steps.
    """
    if cfg.schedule in ("linear", "cosine"):
        progress = min(max(step - cfg.warmup_steps, 0) / max(total_steps - cfg.warmup_steps, 1), 1.0)
        shape = 1.0 - progress if cfg.schedule == "linear" else 0.5 * (1.0 + math.cos(math.pi * progress))
        lr = cfg.min_lr + (lr - cfg.min_lr) * shape
    if step < cfg.warmup_steps:
        lr *= (step + 1) / cfg.warmup_steps
    return lr


def update(
    model: nn.Module,
    optimizer: torch.optim.Optimizer,
    loss: Tensor,
    clip_norm: float | None,
    scaler: torch.amp.GradScaler | None = None,
) -> float | None:
    """One optimiser step on ``loss``: backward, gradient-norm clipping when ``clip_norm``, step.

    With a ``scaler`` (float16 training) the loss is scaled before backward and the gradients
    unscaled before clipping; a step whose gradients overflowed is skipped and the scale lowered.
    Returns the total gradient norm before clipping (None when not clipping).
    """
    optimizer.zero_grad(set_to_none=True)
    if scaler is None:
        loss.backward()
    else:
        scaler.scale(loss).backward()
        scaler.unscale_(optimizer)
    norm = float(nn.utils.clip_grad_norm_(model.parameters(), clip_norm)) if clip_norm else None
    if scaler is None:
        optimizer.step()
    else:
        scaler.step(optimizer)
        scaler.update()
    return norm
