"""Sequence tagging recipe (POS, chunking, NER): token embedder -> any registered encoder -> dropout ->
linear -> CRF or per-token softmax.

The BiLSTM-CRF of Lample et al. (2016), "Neural Architectures for Named Entity Recognition", and Ma &
Hovy (2016), "End-to-end Sequence Labeling via Bi-directional LSTM-CNNs-CRF": word vectors (GloVe) and
character features (:class:`~seqzoo.embedders.TokenEmbedder`) -> bidirectional encoder -> per-token
tag scores (emissions, eq. 1 of Lample et al.) -> a linear-chain CRF (:class:`~seqzoo.heads.crf.CRF`,
eq. 2) or a softmax per token. Any encoder that meets the contract may be used (``model.encoder``).

Data: CoNLL column files (:func:`seqzoo.data.conll.read_conll`), ``{data_dir}/{train,dev,test}_file``.
``data.scheme`` is the corpus's tag scheme (``iob1``/``iob2``/``iobes``, or ``none`` for tags without
chunks, e.g. POS); the model learns and decodes tags in ``data.train_scheme`` (e.g. IOBES) and every
score is reported in the corpus's own scheme: predictions are converted back and compared with the
corpus's gold tags with conlleval's rules (:func:`seqzoo.data.tags.chunk_scores`).

Tag set: the training split's tags; with a chunk scheme, every prefix of the scheme for every chunk
type seen in training (so e.g. an ``S-X`` of IOBES exists even if training only had longer ``X``).
A tag that is not ``O``/``PREFIX-TYPE`` of the corpus's scheme is an error naming file:line.

Unknown tags in dev/test (a gold tag outside the tag set): with ``data.unseen_tags: error`` (the
default) an error naming the file and line of the first one; with ``keep`` they stay in the gold
tags the scores are computed against, which the model never predicts (they count as errors: the
score is not flattered), and one warning names how many there are and where the first one is.
A tag seen only in dev/test cannot be learned, so mapping it to another tag would only hide errors.

Vocabulary: the training words seen ``data.min_freq`` times (lowercased with ``data.lowercase``; the
character features keep the case); with ``data.embeddings`` and ``data.embedding_vocab`` also every
word of any split that has a pretrained vector (as Lample et al. do: the word table holds the
pretrained words, and no label is read).
"""

from __future__ import annotations

import abc
import logging
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from seqzoo.config import (
    ConfigError,
    ModelConfig,
    RunConfig,
    names_config_errors,
    require_ranges,
    with_recipe_arguments,
)
from seqzoo.data.batching import bucket_batches, pad_batch
from seqzoo.data.chars import build_char_vocab, encode_chars, pad_chars
from seqzoo.data.conll import TaggedSentence, read_conll
from seqzoo.data.embeddings import with_pretrained_words
from seqzoo.data.errors import DataError
from seqzoo.data.io import require_regular
from seqzoo.data.tags import allowed_transitions, check_scheme, chunk_scores, chunks, convert, split_tag
from seqzoo.data.text import Vocab
from seqzoo.embedders import CHAR_KEYS, TokenEmbedder
from seqzoo.encoders.base import Encoder, build_encoder, module_mode
from seqzoo.heads.crf import CRF, DISALLOWED, viterbi
from seqzoo.tasks.common import DEFAULT_MAX_LEN, Checkpoint, epoch_seed, pretrained_vectors, restore, token_embedder
from seqzoo.training.devices import resolve_device
from seqzoo.training.registry import register_task
from seqzoo.training.task import StepLoss

__all__ = [
    "TagHead",
    "TaggedCorpus",
    "Tagger",
    "TaggingCorpusConfig",
    "TaggingData",
    "TaggingDataConfig",
    "TaggingTask",
    "build_tag_set",
    "build_tagger",
    "build_tasks",
    "build_vocab",
    "load_data",
    "load_trained",
]

log = logging.getLogger("seqzoo")

SPLITS = ("train", "dev", "test")


@dataclass
class TaggingCorpusConfig:
    """A CoNLL corpus ``{data_dir}/{train_file,dev_file,test_file}`` (token and tag columns by index) and how
    its tags read: the keys a tagging run and a tagging sub-task of a multi-task run share."""

    data_dir: str = "."
    train_file: str = "train.txt"
    dev_file: str = "valid.txt"
    test_file: str = "test.txt"
    token_column: int = 0
    tag_column: int = -1
    scheme: Literal["iob1", "iob2", "iobes", "none"] = "iob2"  # the corpus's; none: tags without chunks (POS)
    train_scheme: Literal["iob1", "iob2", "iobes"] | None = None  # the model's tags; None = the corpus's scheme
    unseen_tags: Literal["error", "keep"] = "error"  # dev/test gold tags outside the tag set (module docstring)
    max_len: int | None = DEFAULT_MAX_LEN  # a longer sentence (in a split or predict) is an error (None: no cap)

    def __post_init__(self) -> None:
        require_ranges(self, positive=("max_len",))
        if self.scheme == "none" and self.train_scheme is not None:
            raise ConfigError(
                f"train_scheme: tags without chunks (scheme none) have no other scheme, got {self.train_scheme!r}"
            )

    @property
    def metric(self) -> str:
        """The dev metric: chunk F1 for a chunk scheme, token accuracy for tags without chunks."""
        return "accuracy" if self.scheme == "none" else "f1"

    @property
    def model_scheme(self) -> str | None:
        """The canonical scheme of the tags the model learns (None: tags without chunks)."""
        if self.scheme == "none":
            return None
        return check_scheme(self.train_scheme or self.scheme)


@dataclass
class TaggingDataConfig(TaggingCorpusConfig):
    """The ``data:`` section of the tagging recipe: the corpus, and its vocabulary and word vectors."""

    lowercase: bool = True  # word lookup only; the character features keep the case
    min_freq: int = 1
    embeddings: str | None = None  # GloVe-format text vectors (.txt or .gz)
    embedding_dim: int = 50
    embedding_vocab: bool = True  # with embeddings: every split's words that have a vector join the vocabulary
    freeze_embeddings: bool = False

    def __post_init__(self) -> None:
        super().__post_init__()
        require_ranges(self, positive=("min_freq", "embedding_dim"))


@dataclass
class TaggingData:
    """The sentences of each split and the file each was read from."""

    splits: dict[str, list[TaggedSentence]]
    sources: dict[str, Path]


def load_data(cfg: TaggingCorpusConfig) -> TaggingData:
    """The train, dev and test splits of ``cfg`` (each file required; ``.gz`` aware), each sentence's tags
    checked against the corpus's scheme (an error naming file:line)."""
    splits: dict[str, list[TaggedSentence]] = {}
    sources: dict[str, Path] = {}
    for split, name in zip(SPLITS, (cfg.train_file, cfg.dev_file, cfg.test_file), strict=True):
        path = require_regular(Path(cfg.data_dir) / name)  # a directory or FIFO there: named, not read
        sentences = read_conll(path, cfg.token_column, cfg.tag_column)
        if cfg.scheme != "none":
            for sentence in sentences:
                _check_tags(sentence, cfg.scheme, path)
        splits[split], sources[split] = sentences, path
    return TaggingData(splits, sources)


def _check_tags(sentence: TaggedSentence, scheme: str, path: Path) -> None:
    """A :class:`DataError` at the first tag of ``sentence`` that is not a tag of ``scheme``."""
    try:
        convert(sentence.tags, scheme, scheme)
    except ValueError:
        for offset, tag in enumerate(sentence.tags):
            try:
                convert([tag], scheme, scheme)
            except ValueError as err:
                raise DataError(str(err), path, sentence.line + offset) from None
        raise


def build_tag_set(train: Sequence[Sequence[str]], scheme: str | None) -> list[str]:
    """The tags a model predicts: ``O`` first, then every prefix of ``scheme`` for each chunk type of
    ``train`` (types sorted); without a scheme, the tags of ``train`` sorted."""
    seen = {tag for tags in train for tag in tags}
    if scheme is None:
        return sorted(seen)
    prefixes = "BIES" if scheme == "IOBES" else "BI"
    kinds = sorted({split_tag(tag)[1] for tag in seen} - {""})
    return ["O", *(f"{prefix}-{kind}" for kind in kinds for prefix in prefixes)]


class TagHead(nn.Module):
    """Encoder outputs (B, T, H) -> dropout -> linear -> emissions (B, T, K), scored by a CRF (``"crf"``)
    or a softmax per token (``"softmax"``).

    ``constraints``: a tag scheme whose forbidden transitions (:func:`seqzoo.data.tags.allowed_transitions`)
    are never decoded: the CRF scores them :data:`~seqzoo.heads.crf.DISALLOWED` in training and decoding;
    the softmax decodes the most probable allowed path of its independent token probabilities (Viterbi over
    log-probabilities with those transitions forbidden).
    """

    def __init__(
        self,
        input_size: int,
        tags: Sequence[str],
        decoder: Literal["crf", "softmax"] = "crf",
        constraints: str | None = None,
        dropout: float = 0.5,
    ) -> None:
        super().__init__()
        if decoder not in ("crf", "softmax"):
            raise ValueError(f"decoder must be crf or softmax, got {decoder!r}")
        self.tags = list(tags)
        self.decoder = decoder
        self.dropout = nn.Dropout(dropout)
        self.linear = nn.Linear(input_size, len(self.tags))
        self.crf = CRF(len(self.tags), constraints, self.tags if constraints else None) if decoder == "crf" else None
        k = len(self.tags)
        between, start, end = [[True] * k] * k, [True] * k, [True] * k  # the CRF holds its own constraints
        if constraints and decoder == "softmax":
            between, start, end = allowed_transitions(constraints, self.tags)
        self.constraints = constraints
        self.register_buffer("forbidden", ~torch.tensor(between, dtype=torch.bool), False)  # (K, K) [from, to]
        self.register_buffer("forbidden_start", ~torch.tensor(start, dtype=torch.bool), False)  # (K,)
        self.register_buffer("forbidden_end", ~torch.tensor(end, dtype=torch.bool), False)  # (K,)

    def forward(self, outputs: Tensor) -> Tensor:
        return self.linear(self.dropout(outputs))  # (B, T, K)

    def nll(self, emissions: Tensor, tags: Tensor, mask: Tensor) -> Tensor:
        """Each sentence's negative log-likelihood of ``tags`` (B, T) (pads: any value), (B,)."""
        if self.crf is not None:
            return -self.crf(emissions, tags, mask)  # Lample et al. eq. 2
        token = F.cross_entropy(emissions.transpose(1, 2), tags.clamp(min=0), reduction="none")  # (B, T)
        return token.masked_fill(~mask, 0.0).sum(1)

    @torch.no_grad()
    def decode(self, emissions: Tensor, mask: Tensor) -> Tensor:
        """The best tag paths (B, T) int64, -1 at pads."""
        if self.crf is not None:
            return self.crf.decode(emissions, mask)
        if not self.constraints:
            return emissions.argmax(-1).masked_fill(~mask, -1)
        zeros = emissions.new_zeros(len(self.tags), dtype=torch.float32)
        start, end = (zeros.masked_fill(f, DISALLOWED) for f in (self.forbidden_start, self.forbidden_end))
        trans = zeros.expand(len(self.tags), -1).masked_fill(self.forbidden, DISALLOWED)  # (K, K)
        logp = torch.log_softmax(emissions.float(), -1).masked_fill(~mask.unsqueeze(2), 0.0)  # (B, T, K)
        return viterbi(logp, mask, start, trans, end)[0]

    @torch.no_grad()
    def confidence(self, emissions: Tensor, mask: Tensor, paths: Tensor) -> Tensor:
        """Each token's probability of its tag in ``paths`` (B, T): the CRF's marginal p(y_t | x) or the
        softmax's probability; 0 at pads."""
        if self.crf is not None:
            probs = self.crf.marginals(emissions, mask)  # (B, T, K)
        else:
            probs = torch.softmax(emissions.float(), -1)  # (B, T, K)
        return probs.gather(2, paths.clamp(min=0).unsqueeze(2)).squeeze(2).masked_fill(~mask, 0.0)


class Tagger(nn.Module):
    """Word ids (B, T) [+ char ids (B, T, C)] -> embedder (B, T, E) -> encoder (B, T, H) -> head: emissions
    (B, T, K). ``forward`` with gold tags is the training loss (one call, as data-parallel training needs)."""

    def __init__(self, embedding: TokenEmbedder, encoder: Encoder, head: TagHead, embedding_dropout: float = 0.0):
        super().__init__()
        self.embedding = embedding
        self.embedding_dropout = nn.Dropout(embedding_dropout)
        self.encoder = encoder
        self.head = head

    def emissions(self, ids: Tensor, mask: Tensor, chars: Tensor | None = None) -> Tensor:
        x = self.embedding_dropout(self.embedding(ids, chars))  # (B, T, E)
        outputs, _ = self.encoder(x, mask)  # (B, T, H), zeros at pads
        return self.head(outputs)  # (B, T, K)

    def forward(self, ids: Tensor, mask: Tensor, chars: Tensor | None, tags: Tensor) -> Tensor:
        """The sum over the batch's sentences of -log p(tags | sentence), a scalar."""
        return self.head.nll(self.emissions(ids, mask, chars), tags, mask).sum()

    def auxiliary_loss(self) -> Tensor | None:
        return self.encoder.auxiliary_loss()


def build_tagger(
    cfg: ModelConfig, vocab_size: int, embedding_dim: int, tags: Sequence[str], scheme: str | None, *,
    vectors: Tensor | None = None, freeze_embeddings: bool = False, num_chars: int = 0,
    encoder: Encoder | None = None,
) -> Tagger:  # fmt: skip
    """A :class:`Tagger` from the ``model`` config (``encoder``: one given instead of ``model.encoder``, e.g.
    shared by the tasks of a multi-task model; its input size must be the embedder's output size)."""
    embedding = token_embedder(
        cfg, vocab_size, embedding_dim, vectors=vectors, freeze=freeze_embeddings, num_chars=num_chars
    )
    if encoder is None:
        encoder = build_encoder(
            cfg.encoder, **with_recipe_arguments(cfg.encoder_args, input_size=embedding.output_size)
        )
    constraints = scheme if cfg.constraints else None
    head = TagHead(encoder.output_size, tags, cfg.decoder, constraints, cfg.dropout)
    return Tagger(embedding, encoder, head, cfg.embedding_dropout)


@dataclass
class _Encoded:
    ids: list[int]
    chars: list[list[int]] | None
    tags: list[int]  # the model's tag indices (-1: a gold tag outside the tag set, kept for scoring)
    gold: tuple[str, ...]  # the corpus's tags, which the scores compare with


def build_vocab(splits: dict[str, list[TaggedSentence]], data: TaggingDataConfig) -> Vocab:
    """The training words seen ``data.min_freq`` times and, with ``data.embeddings`` and ``data.embedding_vocab``,
    every word of any split that has a pretrained vector (module docstring)."""

    def key(token: str) -> str:
        return token.lower() if data.lowercase else token

    train = Vocab.build(([key(t) for t in s.tokens] for s in splits["train"]), min_freq=data.min_freq)
    if not (data.embeddings and data.embedding_vocab):
        return train
    words = (key(t) for split in splits.values() for s in split for t in s.tokens)
    return with_pretrained_words(train, words, data.embeddings)


class TaggedCorpus(abc.ABC):
    """A tagging corpus as a model reads it, and all that a tagging task does besides running its network:
    the schemes and the tag set, each split's sentences as ids (checked for length and unseen tags), batches
    as tensors, decoding, the scores in the corpus's scheme and the ``seqzoo predict`` records.

    ``splits``: sentences by split (empty when only predicting); ``vocab``/``chars``: the word and character
    vocabularies (``chars`` None: no character features); ``tags``: those of a trained model (else built from
    the training split); ``lowercase``: words are looked up lowercased; ``max_len``: a longer sentence is an
    error; ``sources``: the files, for error messages. A subclass gives the network: ``config`` (its
    ``train.eval_batch_size``), ``device``, ``model`` (put in eval mode to decode), :attr:`head` and
    :meth:`emissions`. Shared by the tagging recipe and the tagging sub-tasks of the multi-task recipe.
    """

    higher_is_better = True
    config: RunConfig
    device: torch.device
    model: nn.Module

    def __init__(
        self,
        data: TaggingCorpusConfig,
        splits: dict[str, list[TaggedSentence]],
        *,
        vocab: Vocab,
        chars: Vocab | None,
        tags: Sequence[str] | None = None,
        lowercase: bool = True,
        max_len: int | None = None,
        sources: dict[str, Path] | None = None,
    ) -> None:
        self.data = data
        self.metric = data.metric
        self.scheme = None if data.scheme == "none" else check_scheme(data.scheme)
        self.model_scheme = data.model_scheme
        self.vocab, self.chars, self.lowercase, self.max_len = vocab, chars, lowercase, max_len
        model_tags = {name: [self._to_model(s.tags) for s in split] for name, split in splits.items()}
        self.tags = list(tags) if tags is not None else build_tag_set(model_tags["train"], self.model_scheme)
        index = {tag: i for i, tag in enumerate(self.tags)}
        self.encoded: dict[str, list[_Encoded]] = {}
        for name, split in splits.items():
            for s in split:  # a tagged sentence is not cut (its gold tags would be): one too long stops the run
                self._refuse_long(s.tokens, (sources or {}).get(name), s.line)
            self.encoded[name] = [
                _Encoded(self._words(s.tokens), self._chars(s.tokens), [index.get(t, -1) for t in tags_], s.tags)
                for s, tags_ in zip(split, model_tags[name], strict=True)
            ]
            self._check_unseen(name, split, model_tags[name], (sources or {}).get(name))

    @property
    @abc.abstractmethod
    def head(self) -> TagHead:
        """The head that scores and decodes this corpus's tags."""

    @abc.abstractmethod
    def emissions(self, ids: Tensor, mask: Tensor, chars: Tensor | None) -> Tensor:
        """The network's tag scores (B, T, K) of word ids (B, T) [and char ids (B, T, C)]."""

    # -- data ---------------------------------------------------------------------------------------------

    def _to_model(self, tags: Sequence[str]) -> list[str]:
        """Corpus tags in the model's scheme."""
        if self.scheme is None or self.scheme == self.model_scheme:
            return list(tags)
        return convert(tags, self.scheme, self.model_scheme)

    def _from_model(self, tags: Sequence[str]) -> list[str]:
        """Model tags in the corpus's scheme."""
        if self.scheme is None or self.scheme == self.model_scheme:
            return list(tags)
        return convert(tags, self.model_scheme, self.scheme)

    def _refuse_long(self, tokens: Sequence[str], path: Path | None, line: int) -> None:
        """A :class:`DataError` at ``path``:``line`` where ``tokens`` are more than ``max_len``."""
        if self.max_len is not None and len(tokens) > self.max_len:
            raise DataError(f"a sentence of {len(tokens)} tokens, more than data.max_len={self.max_len}", path, line)

    def _words(self, tokens: Sequence[str]) -> list[int]:
        return self.vocab.encode(t.lower() if self.lowercase else t for t in tokens)

    def _chars(self, tokens: Sequence[str]) -> list[list[int]] | None:
        return None if self.chars is None else encode_chars(tokens, self.chars)

    def _check_unseen(
        self, split: str, sentences: list[TaggedSentence], model_tags: list[list[str]], path: Path | None
    ) -> None:
        """Dev/test gold tags outside the tag set: an error, or (``data.unseen_tags: keep``) one warning."""
        known = set(self.tags)
        unseen = [
            (s.line + i, s.tags[i]) for s, tags in zip(sentences, model_tags, strict=True) for i, tag in enumerate(tags)
            if tag not in known
        ]  # fmt: skip
        if not unseen:
            return
        line, tag = unseen[0]
        what = f"tag {tag!r} does not occur in the training data (the model cannot predict it)"
        if self.data.unseen_tags == "error":
            raise DataError(f"{what}; set data.unseen_tags: keep to score such tags as errors", path, line)
        log.warning(
            "%s: %d gold tags do not occur in the training data, first %r at line %d; they are kept and scored as "
            "errors", path or split, len(unseen), tag, line,
        )  # fmt: skip

    # -- batches ------------------------------------------------------------------------------------------

    def inputs(self, examples: Sequence[_Encoded]) -> tuple[Tensor, Tensor, Tensor | None]:
        """Word ids (B, T), mask (B, T) and char ids (B, T, C) (None without char features), on the device."""
        ids, mask = pad_batch([e.ids for e in examples], self.vocab.pad_id)
        chars = None if self.chars is None else pad_chars([e.chars for e in examples], ids.shape[1]).to(self.device)
        return ids.to(self.device), mask.to(self.device), chars

    def targets(self, examples: Sequence[_Encoded]) -> Tensor:
        """Tag indices (B, T), -1 at pads (and at a kept unseen gold tag)."""
        return pad_batch([e.tags for e in examples], -1)[0].to(self.device)

    def batches(self, split: str, size: int, seed: int | None = None) -> list[list[int]]:
        """``split``'s sentences in batches of similar lengths (shuffled with a ``seed``)."""
        lengths = [len(e.ids) for e in self.encoded[split]]
        return bucket_batches(lengths, size, shuffle=seed is not None, seed=seed)

    # -- evaluation and prediction ------------------------------------------------------------------------

    @torch.no_grad()
    def _decode(
        self, examples: Sequence[_Encoded], *, loss: bool = False, confidence: bool = False
    ) -> tuple[list[list[int]], list[list[float]], float]:
        """Each example's best tag indices, their probabilities (with ``confidence``, else ``[]``) and the summed
        NLL (with ``loss``; a kept unseen gold tag has no likelihood, so its sentence is left out of it)."""
        ids, mask, chars = self.inputs(examples)
        emissions = self.emissions(ids, mask, chars)  # (B, T, K)
        head = self.head
        paths = head.decode(emissions, mask)  # (B, T)
        lengths = mask.sum(1).tolist()
        probs: list[list[float]] = []
        if confidence:
            probs = [row[:n] for row, n in zip(head.confidence(emissions, mask, paths).tolist(), lengths, strict=True)]
        total = 0.0
        if loss:
            targets = self.targets(examples)
            whole = ~((targets < 0) & mask).any(1)  # (B,)
            if whole.any():
                total = float(head.nll(emissions[whole], targets[whole], mask[whole]).sum())
        return [row[:n] for row, n in zip(paths.tolist(), lengths, strict=True)], probs, total

    def predicted_tags(self, split: str) -> list[list[str]]:
        """The model's best tags (in its own scheme, ``data.train_scheme``) for every sentence of ``split``."""
        return self._predict_split(split)[0]

    def _predict_split(self, split: str) -> tuple[list[list[str]], float]:
        examples = self.encoded[split]
        predicted: list[list[str]] = [[] for _ in examples]
        loss = 0.0
        with module_mode(self.model, training=False):
            for batch in self.batches(split, self.config.train.eval_batch_size):
                paths, _, batch_loss = self._decode([examples[i] for i in batch], loss=True)
                loss += batch_loss
                for i, path in zip(batch, paths, strict=True):
                    predicted[i] = [self.tags[t] for t in path]
        return predicted, loss / max(len(examples), 1)

    def evaluate(self, split: str) -> dict[str, float]:
        """Token ``accuracy``, mean sentence NLL ``loss`` and, with a chunk scheme, chunk ``precision``,
        ``recall``, ``f1`` (micro) and ``precision_X``/``recall_X``/``f1_X`` per chunk type X, all in the
        corpus's own scheme (fractions in [0, 1])."""
        predicted, loss = self._predict_split(split)
        gold = [e.gold for e in self.encoded[split]]
        if self.scheme is None:  # tags without chunks: token accuracy alone
            pairs = [
                (g, p)
                for gold_tags, tags in zip(gold, predicted, strict=True)
                for g, p in zip(gold_tags, tags, strict=True)
            ]
            return {"accuracy": sum(g == p for g, p in pairs) / max(len(pairs), 1), "loss": loss}
        scores = chunk_scores(gold, [self._from_model(p) for p in predicted])
        micro = scores.micro
        metrics = {"accuracy": scores.accuracy, "loss": loss}
        metrics.update(precision=micro.precision, recall=micro.recall, f1=micro.f1)
        for kind, s in scores.per_type.items():
            metrics.update({f"precision_{kind}": s.precision, f"recall_{kind}": s.recall, f"f1_{kind}": s.f1})
        return metrics

    @torch.no_grad()
    def predict(self, texts: list[str]) -> list[dict[str, Any]]:
        """For each whitespace-tokenised sentence: ``tokens``, ``tags`` (the corpus's scheme), ``confidences``
        (each token's probability of its tag: CRF marginal or softmax probability), and with a chunk scheme
        ``spans``: ``{"type", "start", "end" (token offsets, end exclusive), "text"}``."""
        results: list[dict[str, Any]] = []
        sentences = [text.split() for text in texts]
        for line, tokens in enumerate(sentences, 1):
            self._refuse_long(tokens, None, line)
        examples = [_Encoded(self._words(t), self._chars(t), [], tuple(t)) for t in sentences]
        size = self.config.train.eval_batch_size
        with module_mode(self.model, training=False):
            for start in range(0, len(examples), size):
                chunk = examples[start : start + size]
                paths, confidences, _ = self._decode(chunk, confidence=True)
                for tokens, path, confidence in zip(sentences[start : start + size], paths, confidences, strict=True):
                    tags = self._from_model([self.tags[t] for t in path])
                    record: dict[str, Any] = {"tokens": tokens, "tags": tags, "confidences": confidence}
                    if self.scheme is not None:
                        record["spans"] = [
                            {"type": kind, "start": begin, "end": end, "text": " ".join(tokens[begin:end])}
                            for kind, begin, end in chunks(tags)
                        ]
                    results.append(record)
        return results

    def tags_document(self) -> dict[str, Any]:
        """The tag set and the schemes, as ``tags.json`` stores them."""
        return {"tags": self.tags, "scheme": self.scheme or "none", "train_scheme": self.model_scheme or "none"}


class TaggingTask(TaggedCorpus):
    """The :class:`seqzoo.training.task.Task` for sequence tagging (module docstring): a :class:`TaggedCorpus`
    read by a :class:`Tagger`.

    ``splits``: sentences by split (empty when only predicting); ``vocab``, ``chars``, ``tags``: those of a
    trained model (else built from the training split); ``sources``: the files, for error messages.
    """

    def __init__(
        self,
        config: RunConfig,
        splits: dict[str, list[TaggedSentence]],
        *,
        sources: dict[str, Path] | None = None,
        vocab: Vocab | None = None,
        chars: Vocab | None = None,
        tags: Sequence[str] | None = None,
        embedding_dim: int | None = None,
        encoder: Encoder | None = None,
    ) -> None:
        self.config = config
        data: TaggingDataConfig = config.data
        char_vocab = (
            None
            if config.model.char_encoder == "none"
            else chars or build_char_vocab(s.tokens for s in splits["train"])
        )
        super().__init__(
            data, splits, vocab=vocab or build_vocab(splits, data), chars=char_vocab, tags=tags,
            lowercase=data.lowercase, max_len=data.max_len, sources=sources,
        )  # fmt: skip
        dim, vectors = pretrained_vectors(data.embeddings, self.vocab, data.embedding_dim, embedding_dim)
        with names_config_errors("model"):
            self.model = build_tagger(
                config.model, len(self.vocab), dim, self.tags, self.model_scheme, vectors=vectors,
                freeze_embeddings=data.freeze_embeddings, num_chars=len(self.chars) if self.chars else 0,
                encoder=encoder,
            )  # fmt: skip
        self.device = resolve_device(config.train.device)
        self.model.to(self.device)

    @property
    def head(self) -> TagHead:
        return self.model.head

    def emissions(self, ids: Tensor, mask: Tensor, chars: Tensor | None) -> Tensor:
        return self.model.emissions(ids, mask, chars)  # (B, T, K)

    def train_batches(self, epoch: int) -> list[list[int]]:
        return self.batches("train", self.config.train.batch_size, epoch_seed(self.config.train.seed, epoch))

    def train_loss(self, batch: list[int]) -> StepLoss:
        examples = [self.encoded["train"][i] for i in batch]
        ids, mask, chars = self.inputs(examples)
        loss = self.model(ids, mask, chars, self.targets(examples)) / len(batch)
        return StepLoss.plus(loss, self.model.auxiliary_loss(), int(mask.sum()), len(batch))

    def documents(self) -> dict[str, Any]:
        chars = {} if self.chars is None else {"chars.json": self.chars.to_dict()}
        return {"vocab.json": self.vocab.to_dict(), "tags.json": self.tags_document(), **chars}


def build_tasks(config: RunConfig) -> list[tuple[str, TaggingTask]]:
    """One task: ``[("", task)]``."""
    data = load_data(config.data)
    return [("", TaggingTask(config, data.splits, sources=data.sources))]


def load_trained(config: RunConfig, best: Path, with_data: bool = True) -> TaggingTask:
    """Rebuild a trained tagger from a ``best/`` checkpoint directory (its vocabulary, characters and tags)."""
    data = load_data(config.data) if with_data else TaggingData({}, {})

    def build(checkpoint: Checkpoint) -> TaggingTask:
        chars = None if config.model.char_encoder == "none" else checkpoint.vocab("chars.json")
        saved = checkpoint.document("tags.json")
        return TaggingTask(
            config, data.splits, sources=data.sources, vocab=checkpoint.vocab(), chars=chars, tags=saved["tags"],
            embedding_dim=checkpoint.tensor("embedding.weight").shape[1],
        )  # fmt: skip

    return restore(best, build)


def _inert_keys(config: RunConfig) -> dict[str, str]:
    data: TaggingDataConfig = config.data
    inert = {}
    if data.scheme == "none":
        inert["model.constraints"] = "tags without chunks (data.scheme none) have no transitions to forbid"
    if not data.embeddings:
        inert["data.embedding_vocab"] = "it adds the words of data.embeddings"
    return inert


register_task(
    "tagging",
    data_config=TaggingDataConfig,
    model_keys={"encoder", "encoder_args", "embedding_dropout", "dropout", "decoder", "constraints", *CHAR_KEYS},
    build_tasks=build_tasks,
    load_trained=load_trained,
    inert_keys=_inert_keys,
)
