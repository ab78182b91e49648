"""The seam between a recipe and the trainer: what a task gives (:class:`Task`) and what one training
step returns (:class:`StepLoss`)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, NamedTuple, Protocol

from torch import Tensor, nn

__all__ = ["StepLoss", "Task"]


class StepLoss(NamedTuple):
    """What :meth:`Task.train_loss` returns for one batch."""

    loss: Tensor  # to minimise: the mean over ``count`` units, auxiliary losses included
    tokens: int  # tokens processed, for throughput
    count: int  # units the loss is a mean over (examples, or target tokens), for epoch averages
    auxiliary: float = 0.0  # the part of ``loss`` that is the model's regulariser, reported apart

    @classmethod
    def plus(cls, loss: Tensor, auxiliary: Tensor | None, tokens: int, count: int) -> StepLoss:
        """``loss`` plus the model's regulariser ``auxiliary`` (e.g. the MZU's −λ·D; None: none)."""
        if auxiliary is None:
            return cls(loss, tokens, count)
        return cls(loss + auxiliary, tokens, count, auxiliary.item())


class Task(Protocol):
    """What a recipe gives the trainer."""

    model: nn.Module
    metric: str  # dev metric used for model selection, e.g. "accuracy", "ppl", "bpc"
    higher_is_better: bool

    def train_batches(self, epoch: int) -> Sequence[Any]:
        """The epoch's training batches; must depend only on the seed and ``epoch``."""

    def train_loss(self, batch: Any) -> StepLoss:
        """Loss to minimise for ``batch`` (auxiliary losses included), its tokens and its count."""

    def evaluate(self, split: str) -> dict[str, float]:
        """Metrics on ``split`` ("dev" or "test"), including ``self.metric``."""

    def documents(self) -> dict[str, Any]:
        """JSON documents saved beside the model (vocabulary, labels, ...)."""
