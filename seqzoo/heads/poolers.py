"""Sequence-to-vector poolers: outputs (B, T, D), mask (B, T) and the encoder's global state -> (B, D_out).

``final`` is the encoder's :meth:`~seqzoo.encoders.base.Encoder.global_state` (a (B, G) summary of
the sequence, e.g. the S-LSTM's global node g) or None; every call site passes it, and only the
poolers that read it (``"meanmaxglobal"``, the DA-GRN head of Liu et al. 2020, "Depth-Adaptive Graph
Recurrent Network for Text Classification", eq. 15) use it.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from seqzoo.encoders.base import check_mask, zero_padding

__all__ = [
    "POOLERS",
    "AttentionPooler",
    "LastPooler",
    "MaxPooler",
    "MeanMaxGlobalPooler",
    "MeanMaxPooler",
    "MeanPooler",
    "Pooler",
    "build_pooler",
]


class Pooler(nn.Module):
    """outputs (B, T, input_size), mask (B, T) bool, True = real token (None: all real), and the
    encoder's global state ``final`` (B, G) or None -> (B, output_size).

    The mask is checked as the encoders check theirs; pad positions are never read (whatever they
    hold), and rows without a real token pool to zeros.
    """

    def __init__(self, input_size: int) -> None:
        super().__init__()
        self.input_size = input_size

    @property
    def output_size(self) -> int:
        return self.input_size

    def forward(self, outputs: Tensor, mask: Tensor | None = None, final: Tensor | None = None) -> Tensor:
        mask = check_mask(outputs, mask)
        if outputs.shape[-1] != self.input_size:
            raise ValueError(f"pooler input has {outputs.shape[-1]} features, its input_size is {self.input_size}")
        return self.pool(zero_padding(outputs, mask), mask, final)  # pads may hold anything, NaN included

    def pool(self, outputs: Tensor, mask: Tensor, final: Tensor | None = None) -> Tensor:  # pragma: no cover - abstract
        """The pooling itself, on checked inputs (``final`` is read only by the poolers that need it)."""
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

    def pool(self, outputs: Tensor, mask: Tensor, final: Tensor | None = None) -> Tensor:
        last = (mask.sum(1) - 1).clamp(min=0)  # (B,)
        rows = torch.arange(outputs.shape[0], device=outputs.device)
        pooled = outputs[rows, last]  # (B, D)
        if self.bidirectional:
            half = outputs.shape[-1] // 2
            pooled = torch.cat([pooled[:, :half], outputs[:, 0, half:]], dim=-1)
        return pooled * mask[:, :1]  # a row without tokens pools to 0, as with the other poolers


class MeanPooler(Pooler):
    def pool(self, outputs: Tensor, mask: Tensor, final: Tensor | None = None) -> Tensor:
        weights = mask.unsqueeze(-1).to(outputs.dtype)
        return (outputs * weights).sum(1) / weights.sum(1).clamp(min=1.0)


class MaxPooler(Pooler):
    def pool(self, outputs: Tensor, mask: Tensor, final: Tensor | None = None) -> Tensor:
        filled = outputs.masked_fill(~mask.unsqueeze(-1), float("-inf")).amax(1)
        return torch.where(mask.any(1, keepdim=True), filled, torch.zeros_like(filled))


class MeanMaxPooler(Pooler):
    def __init__(self, input_size: int) -> None:
        super().__init__(input_size)
        self.mean, self.max = MeanPooler(input_size), MaxPooler(input_size)

    @property
    def output_size(self) -> int:
        return 2 * self.input_size

    def pool(self, outputs: Tensor, mask: Tensor, final: Tensor | None = None) -> Tensor:
        return torch.cat([self.mean.pool(outputs, mask), self.max.pool(outputs, mask)], dim=-1)  # (B, 2D)


class MeanMaxGlobalPooler(MeanMaxPooler):
    """``ReLU([mean; max; g])`` (DA-GRN eq. 15): mean and max over the real positions and the encoder's
    global state g (``final``, (B, global_size)), which an encoder without one cannot give."""

    def __init__(self, input_size: int, global_size: int | None) -> None:
        if global_size is None:
            raise ValueError(
                "pooler 'meanmaxglobal' reads the encoder's global state (ReLU([mean; max; g]), DA-GRN eq. 15), "
                "but this encoder keeps none (its global_size is None): choose an encoder with a global node "
                "(e.g. the S-LSTM) or another pooler"
            )
        super().__init__(input_size)
        self.global_size = global_size

    @property
    def output_size(self) -> int:
        return 2 * self.input_size + self.global_size

    def extra_repr(self) -> str:
        return f"input_size={self.input_size}, global_size={self.global_size}"

    def pool(self, outputs: Tensor, mask: Tensor, final: Tensor | None = None) -> Tensor:
        expected = (outputs.shape[0], self.global_size)
        if final is None or tuple(final.shape) != expected:
            got = None if final is None else tuple(final.shape)
            raise ValueError(
                f"pooler 'meanmaxglobal' needs the encoder's global state as final, shape {expected} "
                f"(encoder.global_state(state)), got {got}"
            )
        return torch.relu(torch.cat([super().pool(outputs, mask), final.to(outputs.dtype)], dim=-1))  # (B, 2D + G)


class AttentionPooler(Pooler):
    """Additive self-attention pooling: a = softmax_t(v . tanh(W h_t)), sum_t a_t h_t."""

    def __init__(self, input_size: int, attention_size: int | None = None) -> None:
        super().__init__(input_size)
        self.proj = nn.Linear(input_size, attention_size or input_size)
        self.score = nn.Linear(attention_size or input_size, 1, bias=False)

    def pool(self, outputs: Tensor, mask: Tensor, final: Tensor | None = None) -> Tensor:
        scores = self.score(torch.tanh(self.proj(outputs))).squeeze(-1)  # (B, T)
        scores = scores.masked_fill(~mask, float("-inf"))
        weights = torch.softmax(scores, dim=1).nan_to_num(0.0)  # rows without tokens -> zeros
        return torch.einsum("bt,btd->bd", weights, outputs)


POOLERS = ("last", "mean", "max", "meanmax", "meanmaxglobal", "attention")


def build_pooler(name: str, input_size: int, bidirectional: bool = False, global_size: int | None = None) -> Pooler:
    """The pooler ``name`` over an encoder's outputs of size ``input_size``; ``global_size`` is the
    encoder's :attr:`~seqzoo.encoders.base.Encoder.global_size` (None: it keeps no global state)."""
    if name == "last":
        return LastPooler(input_size, bidirectional)
    if name == "meanmaxglobal":
        return MeanMaxGlobalPooler(input_size, global_size)
    simple = {"mean": MeanPooler, "max": MaxPooler, "meanmax": MeanMaxPooler, "attention": AttentionPooler}
    if name not in simple:
        raise ValueError(f"unknown pooler {name!r}; choose one of {', '.join(POOLERS)}")
    return simple[name](input_size)
