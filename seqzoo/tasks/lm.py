"""Language-modelling recipe: embedding -> any causal, stateful encoder -> softmax over the vocabulary.

Data: ``{data_dir}/{train,valid,test}.txt[.gz]`` read at ``data.level`` = ``"word"`` or
``"char"`` by :func:`seqzoo.data.lm.read_lm_tokens` (word level appends ``<eos>`` to every
line; char level keeps every character, newlines included). The vocabulary comes from train.

Training: each split is one contiguous stream cut into parallel rows by
:func:`~seqzoo.data.lm.batchify` (``data.batch_size`` rows for train) and walked in
``data.bptt`` windows, in order, with the encoder state carried from window to window and
detached (truncated BPTT); the state is reset to zeros at the first window of every epoch.

Metric protocol (TASKS.md "Metrics"): every token of the split but its first is a target
(``tokens`` = N - 1), predicted with the state carried and dropout off. The split is batchified
into ``data.eval_batch_size`` rows, each read in order from the zero state (the usual protocol,
Zaremba et al. 2014); then the tokens that protocol leaves out, each row's first and the
``N mod rows`` that batchify drops, are predicted as the continuation of the row before them,
from its final state. ``loss`` is the mean NLL in nats over the targets; word level reports
``ppl`` = exp(loss) (``<eos>`` is a target like any word), char level reports ``bpc`` =
loss / ln 2 (newlines are targets like any character). Lower is better for both.
"""

from __future__ import annotations

import logging
import math
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import torch
import torch.nn.functional as F
from matplotlib.figure import Figure
from torch import Tensor, nn

from seqzoo.config import ModelConfig, RunConfig, names_config_errors, require_ranges, with_recipe_arguments
from seqzoo.data.errors import DataError
from seqzoo.data.io import require_file
from seqzoo.data.lm import EOS, batchify, build_lm_vocab, read_lm_tokens, tbptt_batches
from seqzoo.data.text import Vocab, warn_outside_vocabulary
from seqzoo.encoders.base import State, build_encoder, detach_state, module_mode
from seqzoo.tasks.common import Checkpoint, restore
from seqzoo.training.devices import resolve_device
from seqzoo.training.plots import save_figure
from seqzoo.training.registry import register_task
from seqzoo.training.task import StepLoss

__all__ = [
    "LMDataConfig",
    "LMTask",
    "LanguageModel",
    "build_tasks",
    "load_trained",
    "loss_by_length_bucket",
    "plot_length_buckets",
    "read_splits",
    "sample",
]

log = logging.getLogger("seqzoo")

#: Task split name -> file stem in the data directory.
SPLIT_FILES = {"train": "train", "dev": "valid", "test": "test"}


@dataclass
class LMDataConfig:
    """Language-modelling corpus: ``{data_dir}/{train,valid,test}.txt[.gz]``."""

    data_dir: str = ""
    level: Literal["word", "char"] = "word"
    batch_size: int = 20
    eval_batch_size: int = 10
    bptt: int = 35
    embedding_dim: int = 256

    def __post_init__(self) -> None:
        require_ranges(self, positive=("batch_size", "eval_batch_size", "bptt", "embedding_dim"))


class LanguageModel(nn.Module):
    """Embedding (B, T) -> dropout -> encoder (B, T, H) -> dropout -> logits (B, T, V).

    With ``cfg.tie_weights`` the output layer reuses the embedding matrix (Press & Wolf 2017;
    needs encoder output size == embedding size) and only its bias is a separate parameter.
    The embedding starts as U(−a, a) with ``a = cfg.embedding_init`` (0.1, the word-LM
    convention of Zaremba et al. 2014); an untied output layer as U(−0.1, 0.1).
    """

    def __init__(self, vocab_size: int, embedding_dim: int, cfg: ModelConfig) -> None:
        super().__init__()
        self.embedding = nn.Embedding(vocab_size, embedding_dim)
        self.embedding_dropout = nn.Dropout(cfg.embedding_dropout)
        self.encoder = build_encoder(cfg.encoder, **with_recipe_arguments(cfg.encoder_args, input_size=embedding_dim))
        if not (self.encoder.causal and self.encoder.stateful):
            raise ValueError(
                f"encoder {cfg.encoder!r} with args {cfg.encoder_args} is not causal and stateful "
                "(bidirectional, or unable to carry its state across windows); a language model needs both"
            )
        self.dropout = nn.Dropout(cfg.dropout)
        size = self.encoder.output_size
        if cfg.tie_weights and size != embedding_dim:
            raise ValueError(f"tie_weights needs encoder output size ({size}) == embedding size ({embedding_dim})")
        self.output_weight = None if cfg.tie_weights else nn.Parameter(torch.empty(vocab_size, size))
        self.output_bias = nn.Parameter(torch.zeros(vocab_size))
        nn.init.uniform_(self.embedding.weight, -cfg.embedding_init, cfg.embedding_init)
        if self.output_weight is not None:
            nn.init.uniform_(self.output_weight, -0.1, 0.1)

    def forward(self, ids: Tensor, state: State = None) -> tuple[Tensor, State]:
        x = self.embedding_dropout(self.embedding(ids))  # (B, T, E)
        h, state = self.encoder(x, None, state)  # (B, T, H)
        weight = self.embedding.weight if self.output_weight is None else self.output_weight
        return F.linear(self.dropout(h), weight, self.output_bias), state  # (B, T, V)

    def auxiliary_loss(self) -> Tensor | None:
        return self.encoder.auxiliary_loss()


def read_splits(cfg: LMDataConfig) -> dict[str, list[str]]:
    """The token streams of train, dev (``valid.txt``) and test, at ``cfg.level``.

    Each stream must fill its parallel rows (``data.batch_size`` for train, ``data.eval_batch_size``
    for dev and test) with at least 2 tokens each, or no token would be a target: a
    :class:`DataError` naming the file says so before any training.
    """
    if not cfg.data_dir:
        raise DataError("data.data_dir is not set: a language model needs {train,valid,test}.txt[.gz]")
    splits = {}
    for split, stem in SPLIT_FILES.items():
        path = require_file(cfg.data_dir, f"{stem}.txt")
        splits[split] = read_lm_tokens(path, cfg.level)
        key = "batch_size" if split == "train" else "eval_batch_size"
        rows = getattr(cfg, key)
        if len(splits[split]) < 2 * rows:
            raise DataError(
                f"{len(splits[split])} tokens are too few for data.{key}={rows} streams: "
                f"the {split} split needs at least {2 * rows} (2 per stream)",
                path,
            )
    return splits


class LMTask:
    """The :class:`seqzoo.training.trainer.Task` for word- or character-level language modelling.

    ``tokens`` maps split names ("train", "dev", "test") to token streams; it may be empty
    when ``vocab`` is given (a model loaded only to sample). See the module docstring for the
    metric protocol.
    """

    higher_is_better = False

    def __init__(self, config: RunConfig, tokens: Mapping[str, Sequence[str]], vocab: Vocab | None = None) -> None:
        self.config = config
        data: LMDataConfig = config.data
        self.level = data.level
        self.metric = "ppl" if self.level == "word" else "bpc"
        self.vocab = vocab or build_lm_vocab(tokens["train"], self.level)
        self.ids = {split: torch.tensor(self.vocab.encode(toks), dtype=torch.long) for split, toks in tokens.items()}
        for split, toks in tokens.items():
            unseen = Counter() if split == "train" else Counter(token for token in toks if token not in self.vocab)
            if unseen:
                count = sum(unseen.values())
                log.warning(
                    "%s: %d of its %d tokens (%.4f %%; %d distinct) are not in the training vocabulary and are "
                    "scored as <unk>%s",
                    split,
                    count,
                    len(toks),
                    100 * count / len(toks),
                    len(unseen),
                    ", which training never shows as a target: they raise the BPC" if self.level == "char" else "",
                )
        #: The token that ends a line: ``<eos>`` or ``"\n"`` (None for single-line char corpora like text8).
        line_end = EOS if self.level == "word" else "\n"
        self.line_end_id = self.vocab.token_to_id(line_end) if line_end in self.vocab else None
        with names_config_errors("model"):
            self.model = LanguageModel(len(self.vocab), data.embedding_dim, config.model)
        self.device = resolve_device(config.train.device)
        self.model.to(self.device)
        train = self.ids.get("train")
        streams = None if train is None else batchify(train, data.batch_size).to(self.device)
        self._chunks = [] if streams is None else tbptt_batches(streams, data.bptt)
        self._state: State = None  # carried across training windows

    def _split_ids(self, split: str) -> Tensor:
        if split not in self.ids:
            raise ValueError(f"split {split!r} is not loaded (loaded: {', '.join(self.ids) or 'none'})")
        return self.ids[split]

    def train_batches(self, epoch: int) -> list[int]:
        """Window indices in stream order (TBPTT needs them sequential); the same every epoch."""
        return list(range(len(self._chunks)))

    def shard_train(self, rank: int, world_size: int) -> None:
        """Data-parallel training (:mod:`seqzoo.training.distributed`): this rank trains on streams
        ``rank * B .. (rank + 1) * B - 1`` of the train split cut into ``B * world_size`` streams
        (B = ``data.batch_size``), so a step of all ranks sees what one process with
        ``data.batch_size = B * world_size`` would."""
        data: LMDataConfig = self.config.data
        streams = batchify(self.ids["train"], data.batch_size * world_size)  # (B * world_size, W)
        own = streams[rank * data.batch_size : (rank + 1) * data.batch_size].to(self.device)  # (B, W)
        self._chunks = tbptt_batches(own, data.bptt)
        self._state = None

    def train_loss(self, batch: int) -> StepLoss:
        """Mean NLL per target token of window ``batch`` (+ the encoder's auxiliary loss)."""
        if batch == 0:
            self._state = None
        x, y = self._chunks[batch]
        logits, state = self.model(x, self._state)
        self._state = detach_state(state)
        loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), y.reshape(-1))
        return StepLoss.plus(loss, self.model.auxiliary_loss(), y.numel(), y.numel())

    def extra_state(self) -> dict[str, Any]:
        """The carried training state, saved in ``last/`` so a resumed run continues exactly."""
        return {"state": self._state}

    def load_extra_state(self, extra: dict[str, Any]) -> None:
        self._state = _restored(extra["state"], self.device)

    @torch.no_grad()
    def token_nll(self, split: str) -> Tensor:
        """NLL (nats, float64) of every token of ``split``'s stream, (N,); NaN at the first token.

        Computed as in the metric protocol (eval_batch_size rows, state carried, no dropout).
        """
        ids = self._split_ids(split)
        data: LMDataConfig = self.config.data
        streams = batchify(ids, min(data.eval_batch_size, ids.numel())).to(self.device)  # (B, W)
        rows, width = streams.shape
        nll = torch.full((ids.numel(),), math.nan, dtype=torch.float64)
        within = nll[: streams.numel()].view(rows, width)  # the rows' own tokens
        with module_mode(self.model, training=False):
            state: State = None
            starts = range(0, width - 1, data.bptt)
            for start, (x, y) in zip(starts, tbptt_batches(streams, data.bptt), strict=True):
                logits, state = self.model(x, state)
                within[:, start + 1 : start + 1 + y.shape[1]] = _token_nll(logits, y).cpu()
            # Row b goes on with the first token of row b + 1, the last row with the R < B tokens that
            # batchify dropped (every row reads those; only the last row's predictions are kept).
            rest = ids[streams.numel() :].to(self.device)  # (R,)
            logits, state = self.model(streams[:, -1:], state)  # (B, 1, V): what follows each row
            nll[width : streams.numel() : width] = _token_nll(logits[:-1], streams[1:, :1]).view(-1).cpu()
            if rest.numel():
                nll[streams.numel()] = _token_nll(logits[-1:], rest[:1].view(1, 1)).item()
            if rest.numel() > 1:
                logits, _ = self.model(rest[:-1].expand(rows, -1), state)  # (B, R - 1, V)
                nll[streams.numel() + 1 :] = _token_nll(logits[-1:], rest[1:].view(1, -1)).view(-1).cpu()
        return nll

    def evaluate(self, split: str) -> dict[str, float]:
        """``loss`` (nats/token), ``ppl`` or ``bpc``, and the number of target ``tokens``."""
        nll = self.token_nll(split)
        targets = nll[~torch.isnan(nll)]
        if targets.numel() == 0:
            raise ValueError(f"split {split!r} is too short for eval_batch_size {self.config.data.eval_batch_size}")
        loss = float(targets.sum()) / targets.numel()
        return {"loss": loss, self.metric: self.metric_from_loss(loss), "tokens": targets.numel()}

    def metric_from_loss(self, loss: float) -> float:
        """exp(loss) (perplexity; inf past float range) at word level, loss / ln 2 (bits per character) at
        char level."""
        if self.level == "char":
            return loss / math.log(2)
        try:
            return math.exp(loss)
        except OverflowError:  # a dev loss over 709 nats: a diverged model, which early stopping must still rank
            return math.inf

    def documents(self) -> dict[str, Any]:
        return {"vocab.json": self.vocab.to_dict(), "lm.json": {"level": self.level}}


def _token_nll(logits: Tensor, targets: Tensor) -> Tensor:
    """NLL (nats, float64) of ``targets`` (B, T) under ``logits`` (B, T, V), (B, T)."""
    nll = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1), reduction="none")
    return nll.view(targets.shape).double()


def _restored(state: Any, device: torch.device) -> State:
    """A carried state as a checkpoint stores it (tuples as lists, tensors on the CPU) made what
    the encoder returns and expects again: tuples, tensors on the model's ``device``."""
    if isinstance(state, list):
        return tuple(_restored(s, device) for s in state)
    if isinstance(state, dict):
        return {k: _restored(v, device) for k, v in state.items()}
    return state.to(device) if isinstance(state, Tensor) else state


def build_tasks(config: RunConfig) -> list[tuple[str, LMTask]]:
    """One task on the corpus of ``config.data``."""
    return [("", LMTask(config, read_splits(config.data)))]


def load_trained(config: RunConfig, best: Path, with_data: bool = True) -> LMTask:
    """Rebuild a trained language model from a ``best/`` checkpoint directory."""
    tokens = read_splits(config.data) if with_data else {}

    def build(checkpoint: Checkpoint) -> LMTask:
        level = checkpoint.document("lm.json")["level"]
        if level != config.data.level:
            raise DataError(f"lm.json says level {level!r} but the config says {config.data.level!r}", best)
        return LMTask(config, tokens, vocab=checkpoint.vocab())

    return restore(best, build)


def loss_by_length_bucket(task: LMTask, split: str, boundaries: Sequence[int]) -> list[dict[str, Any]]:
    """Mean loss of ``split`` per line-length bucket (the MZU paper's Figure 2, "BPC by length").

    Each line of the split is a sequence; its length is its number of tokens without the line
    terminator (characters without ``"\\n"``, or words without ``<eos>``). ``boundaries``
    ``[b1, b2, ...]`` make buckets ``[0, b1), [b1, b2), ..., [bk, inf)``. The per-token losses
    are those of :meth:`LMTask.token_nll` (state carried across the whole split exactly as in
    evaluation, so a line is predicted with all text before it as context); a line's tokens
    include its terminator. The buckets' token-weighted mean equals ``evaluate(split)["loss"]``.

    Returns one dict per non-empty bucket: ``min_length``, ``max_length`` (exclusive; None for
    the last), ``lines``, ``tokens``, ``loss`` and the task's metric (``bpc`` or ``ppl``).
    """
    edges = torch.tensor(sorted(boundaries), dtype=torch.long)
    ids = task._split_ids(split)
    nll = task.token_nll(split)
    is_end = ids == task.line_end_id if task.line_end_id is not None else torch.zeros_like(ids, dtype=torch.bool)
    line = torch.cumsum(is_end.long(), 0) - is_end.long()  # a terminator belongs to the line it ends
    lines = int(line[-1]) + 1
    length = torch.bincount(line, weights=(~is_end).double(), minlength=lines).long()
    bucket = torch.bucketize(length, edges, right=True)  # (lines,)
    known = ~torch.isnan(nll)
    line_tokens = torch.bincount(line[known], minlength=lines)
    line_nll = torch.zeros(lines, dtype=torch.float64).index_add_(0, line[known], nll[known])
    results = []
    for k in range(len(edges) + 1):
        members = (bucket == k) & (line_tokens > 0)
        tokens = int(line_tokens[members].sum())
        if tokens == 0:
            continue
        loss = float(line_nll[members].sum()) / tokens
        results.append(
            {
                "min_length": int(edges[k - 1]) if k > 0 else 0,
                "max_length": int(edges[k]) if k < len(edges) else None,
                "lines": int(members.sum()),
                "tokens": tokens,
                "loss": loss,
                task.metric: task.metric_from_loss(loss),
            }
        )
    return results


def plot_length_buckets(series: Mapping[str, Sequence[dict[str, Any]]], path: str | Path, metric: str) -> Path:
    """PNG of ``metric`` per length bucket, one line per model (``{label: loss_by_length_bucket(...)}``)."""
    fig = Figure(figsize=(6, 3.5))
    ax = fig.subplots()
    # One x position per bucket of any run, in length order: runs may lack different (empty) buckets.
    names = {
        b["min_length"]: f"{b['min_length']}-{b['max_length'] - 1}"
        if b["max_length"] is not None
        else f"{b['min_length']}+"
        for buckets in series.values()
        for b in buckets
    }
    position = {start: i for i, start in enumerate(sorted(names))}
    for label, buckets in series.items():
        ax.plot([position[b["min_length"]] for b in buckets], [b[metric] for b in buckets], "o-", label=label)
    ax.set_xticks(range(len(position)), [names[start] for start in position])
    ax.set(xlabel="sequence length", ylabel=metric.upper(), title=f"{metric.upper()} by sequence length")
    ax.grid(alpha=0.3)
    ax.legend()
    return save_figure(fig, Path(path))


@torch.no_grad()
def sample(
    task: LMTask, length: int = 200, temperature: float = 1.0, prime: str = "", seed: int = 0, top_p: float = 1.0
) -> str:
    """``prime`` followed by ``length`` tokens drawn from the model (softmax of logits / temperature).

    ``top_p`` < 1 is nucleus sampling (Holtzman et al. 2020): each draw is from the most probable
    tokens whose probabilities first sum to ``top_p`` or more, renormalised (a tiny ``top_p``: greedy).

    Char level: ``prime`` is read character by character and the result is the raw text.
    Word level: ``prime`` is split on whitespace; words are joined by spaces, ``<eos>`` by newlines.
    An empty prime starts after a line terminator. ``<pad>`` is never drawn, nor, at char level,
    ``<unk>`` (it would print as five characters). Prime tokens outside the vocabulary are read as
    ``<unk>``, with a warning.
    """
    if length < 0:
        raise ValueError(f"length must be >= 0, got {length}")
    if not (temperature > 0 and math.isfinite(temperature)):
        raise ValueError(f"temperature must be a finite number > 0, got {temperature}")
    if not 0 < top_p <= 1:
        raise ValueError(f"top_p must be in (0, 1], got {top_p}")
    vocab, model = task.vocab, task.model
    context = list(prime) if task.level == "char" else prime.split()
    warn_outside_vocabulary(context, vocab, "prime tokens")
    ids = vocab.encode(context) or [task.line_end_id if task.line_end_id is not None else vocab.unk_id]
    generator = torch.Generator().manual_seed(seed)
    with module_mode(model, training=False):
        logits, state = model(torch.tensor([ids], device=task.device))
        drawn: list[int] = []
        for _ in range(length):
            scaled = logits[0, -1].cpu()  # drawn on the CPU: the same text on any device
            scaled[vocab.pad_id] = -math.inf
            if task.level == "char":
                scaled[vocab.unk_id] = -math.inf
            # minus the maximum: a tiny temperature is greedy, not inf / inf
            probs = torch.softmax((scaled - scaled.max()) / temperature, -1)
            if top_p < 1:  # drop each token once the more probable ones hold top_p
                ranked, order = probs.sort(descending=True)
                probs[order[ranked.cumsum(0) - ranked >= top_p]] = 0.0
            drawn.append(int(torch.multinomial(probs, 1, generator=generator)))
            logits, state = model(torch.tensor([[drawn[-1]]], device=task.device), state)
    tokens = vocab.decode(drawn)
    if task.level == "char":
        return prime + "".join(tokens)
    text = " ".join(context)
    for token in tokens:
        if token == EOS:
            text += "\n"
        else:
            text += token if not text or text.endswith("\n") else " " + token
    return text


def _inert_keys(config: RunConfig) -> dict[str, str]:
    return {
        "train.batch_size": "a language model batches by data.batch_size",
        "train.eval_batch_size": "a language model evaluates with data.eval_batch_size",
    }


register_task(
    "lm",
    data_config=LMDataConfig,
    model_keys={"encoder", "encoder_args", "embedding_dropout", "dropout", "tie_weights", "embedding_init"},
    build_tasks=build_tasks,
    load_trained=load_trained,
    inert_keys=_inert_keys,
    capabilities={
        "sample": sample,
        "length_buckets": loss_by_length_bucket,
        "plot_length_buckets": plot_length_buckets,
    },
)
