"""Sequence-to-vector poolers: (B, T, D) outputs + (B, T) mask -> (B, D_out)."""

from __future__ import annotations

import torch
from torch import Tensor, nn

from seqzoo.encoders.base import check_mask

__all__ = [
    "POOLERS",
    "AttentionPooler",
    "LastPooler",
    "MaxPooler",
    "MeanMaxPooler",
    "MeanPooler",
    "Pooler",
    "build_pooler",
]


class Pooler(nn.Module):
    """outputs (B, T, input_size) and mask (B, T) bool, True = real token (None: all real) -> (B, output_size).

    The mask is checked as the encoders check theirs; rows without a real token pool to zeros.
    """

    def __init__(self, input_size: int) -> None:
        super().__init__()
        self.input_size = input_size

    @property
    def output_size(self) -> int:
        return self.input_size

    def forward(self, outputs: Tensor, mask: Tensor | None = None) -> Tensor:
        mask = check_mask(outputs, mask)
        if outputs.shape[-1] != self.input_size:
            raise ValueError(f"pooler input has {outputs.shape[-1]} features, its input_size is {self.input_size}")
        return self.pool(outputs, mask)

    def pool(self, outputs: Tensor, mask: Tensor) -> Tensor:  # pragma: no cover - abstract
        """The pooling itself, on checked inputs."""
        raise NotImplementedError

    def extra_repr(self) -> str:
        return f"input_size={self.input_size}"


class LastPooler(Pooler):
    """Last real time step; for a bidirectional encoder the backward half is taken at t = 0."""

    def __init__(self, input_size: int, bidirectional: bool = False) -> None:
        super().__init__(input_size)
        if bidirectional and input_size % 2:
            raise ValueError(f"a bidirectional encoder's outputs have an even size, got input_size {input_size}")
        self.bidirectional = bidirectional

    def extra_repr(self) -> str:
        return f"input_size={self.input_size}, bidirectional={self.bidirectional}"

    def pool(self, outputs: Tensor, mask: Tensor) -> Tensor:
        last = (mask.sum(1) - 1).clamp(min=0)  # (B,)
        rows = torch.arange(outputs.shape[0], device=outputs.device)
        final = outputs[rows, last]  # (B, D)
        if self.bidirectional:
            half = outputs.shape[-1] // 2
            final = torch.cat([final[:, :half], outputs[:, 0, half:]], dim=-1)
        return final * mask[:, :1]  # a row without tokens pools to 0, as with the other poolers


class MeanPooler(Pooler):
    def pool(self, outputs: Tensor, mask: Tensor) -> Tensor:
        weights = mask.unsqueeze(-1).to(outputs.dtype)
        return (outputs * weights).sum(1) / weights.sum(1).clamp(min=1.0)


class MaxPooler(Pooler):
    def pool(self, outputs: Tensor, mask: Tensor) -> Tensor:
        filled = outputs.masked_fill(~mask.unsqueeze(-1), float("-inf")).amax(1)
        return torch.where(mask.any(1, keepdim=True), filled, torch.zeros_like(filled))


class MeanMaxPooler(Pooler):
    def __init__(self, input_size: int) -> None:
        super().__init__(input_size)
        self.mean, self.max = MeanPooler(input_size), MaxPooler(input_size)

    @property
    def output_size(self) -> int:
        return 2 * self.input_size

    def pool(self, outputs: Tensor, mask: Tensor) -> Tensor:
        return torch.cat([self.mean.pool(outputs, mask), self.max.pool(outputs, mask)], dim=-1)


class AttentionPooler(Pooler):
    """Additive self-attention pooling: a = softmax_t(v . tanh(W h_t)), sum_t a_t h_t."""

    def __init__(self, input_size: int, attention_size: int | None = None) -> None:
        super().__init__(input_size)
        self.proj = nn.Linear(input_size, attention_size or input_size)
        self.score = nn.Linear(attention_size or input_size, 1, bias=False)

    def pool(self, outputs: Tensor, mask: Tensor) -> Tensor:
        scores = self.score(torch.tanh(self.proj(outputs))).squeeze(-1)  # (B, T)
        scores = scores.masked_fill(~mask, float("-inf"))
        weights = torch.softmax(scores, dim=1).nan_to_num(0.0)  # rows without tokens -> zeros
        return torch.einsum("bt,btd->bd", weights, outputs)


POOLERS = ("last", "mean", "max", "meanmax", "attention")


def build_pooler(name: str, input_size: int, bidirectional: bool = False) -> Pooler:
    if name == "last":
        return LastPooler(input_size, bidirectional)
    simple = {"mean": MeanPooler, "max": MaxPooler, "meanmax": MeanMaxPooler, "attention": AttentionPooler}
    if name not in simple:
        raise ValueError(f"unknown pooler {name!r}; choose one of {', '.join(POOLERS)}")
    return simple[name](input_size)
