"""Multi-task learning: one model over several classification and sequence tagging tasks, trained by
drawing a task at every step and a batch of it.

Architectures (``data.architecture``):

* ``single``: each task its own encoder (and, without ``data.share_embeddings``, its own word table):
  the single-task baseline, trained under the same sampling and budget as the others;
* ``fs`` FS-MTL, ``sp`` SP-MTL, ``asp`` ASP-MTL: Liu, Qiu, Huang, "Adversarial Multi-task Learning
  for Text Classification", ACL 2017 (MODELS.md 3.4): one shared encoder; plus a private encoder per
  task whose features are concatenated to the shared ones; plus a task discriminator behind a
  gradient-reversal layer and the orthogonality loss ``L = L_task + λ L_adv + γ L_diff``;
* ``meta`` Meta-MTL: Chen, Qiu, Liu, Huang, "Meta Multi-Task Learning for Sequence Modeling",
  AAAI 2018 (MODELS.md 3.2, eqs. 21-22): the Meta-LSTM cells are shared, each task owns the basic
  LSTM's P, Q, B (a ``meta_lstm`` encoder per task built with ``shared_meta``) and its head.

A task is a classification task (``kind: classification``, Fudan files: pooled features -> MLP ->
softmax, eq. 8 of Chen et al.) or a tagging task (``kind: tagging``, CoNLL files read as the tagging
recipe reads them: the per-token features -> linear -> CRF with its tag scheme's constraints, or a
softmax per token, :class:`~seqzoo.tasks.tagging.TagHead`; Chen et al.'s "Exp-II"). ASP's discriminator
reads the shared features pooled per sentence (``model.pooler``) and, for a tagging task, the
orthogonality loss is taken over the real tokens' features. The word table (joint vocabulary over
every task's training split) and the character features are shared (``data.share_embeddings``).

The model is one task to the trainer: its batches are ``(task name, example indices)``, its metrics each
task's own under ``TASK/`` (``TASK/accuracy`` for a classification task; the tagging recipe's metrics for
a tagging task: ``TASK/f1`` and the chunk scores with a chunk scheme, ``TASK/accuracy`` always) with
``TASK/loss``, plus the macro average of the tasks' main metrics (accuracy; tagging: f1 with a chunk
scheme, else accuracy), the early-stopping metric, named after that metric where every task has the same
one (``accuracy``, ``f1``), else ``score``, and the macro ``loss``. A shared module is one module under
several names; its tensors are saved once, under the first name (``shared.*``).

Data-parallel training (docs/distributed.md): the draws depend on (seed, epoch) alone, so every rank draws the
same task at a step and takes its part of that task's batch (:meth:`MultiTask.shard_train`); a step's losses come
out of one forward pass (:class:`Objective`), and the model has DDP look for the modules a step leaves out.
"""

from __future__ import annotations

import random
import zlib
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any, Literal, NamedTuple

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from seqzoo.config import (
    ConfigError,
    ModelConfig,
    RunConfig,
    names_config_errors,
    require_name,
    require_ranges,
    with_recipe_arguments,
)
from seqzoo.data.batching import bucket_batches, pad_batch, shard_batches
from seqzoo.data.chars import build_char_vocab
from seqzoo.data.classification import ClassificationData, LabelSet, bundled_corpus_dir
from seqzoo.data.conll import TaggedSentence
from seqzoo.data.embeddings import with_pretrained_words
from seqzoo.data.errors import DataError
from seqzoo.data.text import Tokenizer, Vocab
from seqzoo.embedders import CHAR_KEYS, TokenEmbedder
from seqzoo.encoders.base import Encoder, build_encoder, module_mode
from seqzoo.encoders.meta_lstm import MetaLSTM
from seqzoo.heads.poolers import build_pooler
from seqzoo.tasks.common import (
    DEFAULT_MAX_LEN,
    Checkpoint,
    accuracy_and_loss,
    class_probabilities,
    epoch_seed,
    pretrained_vectors,
    restore,
    token_embedder,
)
from seqzoo.tasks.tagging import (
    TaggedCorpus,
    TaggingCorpusConfig,
    TaggingData,
    TagHead,
    load_data,
)
from seqzoo.training.devices import resolve_device
from seqzoo.training.distributed import global_batch_loss
from seqzoo.training.registry import register_task
from seqzoo.training.task import StepLoss

__all__ = [
    "Features",
    "MultiTask",
    "MultiTaskDataConfig",
    "MultiTaskModel",
    "Objective",
    "SubTaskConfig",
    "TagOutput",
    "build_tasks",
    "grad_reverse",
    "load_trained",
    "orthogonality_loss",
]

#: The model keys of a tagging sub-task's head and token embedder.
_TAG_KEYS = ("decoder", "constraints", *CHAR_KEYS)
Architecture = Literal["single", "fs", "sp", "asp", "meta"]
_SHARED_ENCODER = ("fs", "sp", "asp")
_PRIVATE_ENCODER = ("single", "sp", "asp", "meta")
#: The corpus keys only a tagging sub-task reads (``data_dir`` and ``max_len`` belong to every kind).
_TAGGING_ONLY = tuple(f for f in fields(TaggingCorpusConfig) if f.name not in ("data_dir", "max_len"))


@dataclass(kw_only=True)
class SubTaskConfig(TaggingCorpusConfig):
    """One task of the suite. ``kind: classification``: ``{data_dir}/{name}.{train,dev,test}[.gz]`` in the Fudan
    format. ``kind: tagging``: a CoNLL corpus named by the tagging recipe's corpus keys
    (:class:`~seqzoo.tasks.tagging.TaggingCorpusConfig`: ``data_dir``, required here, ``train_file``,
    ``dev_file``, ``test_file``, ``token_column``, ``tag_column``, ``scheme``, ``train_scheme``, ``unseen_tags``)."""

    name: str
    kind: Literal["classification", "tagging"] = "classification"
    data_dir: str | None = None  # None: data.data_dir (classification only)
    weight: float = 1.0  # λ_m of the task's loss
    max_train: int | None = None  # keep the first max_train training examples
    # None: data.max_len. A longer classification text is cut to it; a longer tagged sentence is an error.
    max_len: int | None = None

    def __post_init__(self) -> None:
        super().__post_init__()
        require_ranges(self, positive=("weight", "max_train"))
        require_name(self.name, "name")  # classification: the files' stem in data_dir
        if self.kind == "tagging" and not self.data_dir:
            raise ConfigError("data_dir: a tagging sub-task reads its CoNLL files from its own data_dir")
        given = [f.name for f in _TAGGING_ONLY if getattr(self, f.name) != f.default]
        if self.kind == "classification" and given:
            raise ConfigError(f"{given[0]}: only a tagging sub-task (kind: tagging) reads it")


@dataclass
class MultiTaskDataConfig:
    """The ``data:`` section of the multi-task recipe: its tasks, what they share and how steps draw them."""

    tasks: list[SubTaskConfig] = field(default_factory=lambda: [SubTaskConfig(name="movie_snippets")])
    data_dir: str | None = None  # None = the corpus bundled with seqzoo (classification tasks)
    # The tasks this run trains and evaluates (None: all). The vocabulary is built over every task's
    # training split, so runs over different subsets (transfer stages) share it.
    active: list[str] | None = None
    architecture: Architecture = "meta"
    sampling: Literal["uniform", "proportional"] = "proportional"  # task drawn per step: ∝ 1, or ∝ its train size
    steps_per_epoch: int | None = None  # None: as many as the active tasks have training batches together
    share_embeddings: bool = True
    adversarial_weight: float = 0.05  # asp: λ
    orthogonality_weight: float = 0.01  # asp: γ
    lowercase: bool = True  # word lookup; the character features keep the case
    split_hyphens: bool = False
    min_freq: int = 1
    max_vocab: int | None = None
    max_len: int | None = DEFAULT_MAX_LEN  # texts are cut to their first max_len tokens (None: no cap)
    embeddings: str | None = None  # GloVe-format text vectors (.txt or .gz)
    embedding_vocab: bool = False  # with embeddings: every split's words that have a vector join the vocabulary
    embedding_dim: int = 50
    freeze_embeddings: bool = False
    dev_fraction: float = 0.1  # held out of train for a classification task without a dev split

    def __post_init__(self) -> None:
        require_ranges(self, positive=("steps_per_epoch", "min_freq", "max_vocab", "max_len", "embedding_dim"))
        require_ranges(self, non_negative=("adversarial_weight", "orthogonality_weight"), rate=("dev_fraction",))
        names = [t.name for t in self.tasks]
        if not names or len(set(names)) != len(names):
            raise ConfigError(f"tasks: one or more tasks, each once, got {names}")
        unknown = [name for name in self.active or [] if name not in names]
        if unknown or self.active == []:
            raise ConfigError(f"active: names of data.tasks ({', '.join(names)}), got {self.active}")

    def active_tasks(self) -> list[SubTaskConfig]:
        return [t for t in self.tasks if self.active is None or t.name in self.active]


class _GradReverse(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, x: Tensor) -> Tensor:
        return x.view_as(x)

    @staticmethod
    def backward(ctx: Any, grad: Tensor) -> Tensor:
        return -grad


def grad_reverse(x: Tensor) -> Tensor:
    """The gradient-reversal layer of ASP-MTL: the identity forward, the gradient negated backward."""
    return _GradReverse.apply(x)


def orthogonality_loss(shared: Tensor, private: Tensor, examples: int | None = None) -> Tensor:
    """ASP-MTL's difference loss ``‖Sᵀ H‖_F²`` of a batch's shared (N, d_s) and private (N, d_p) features. Given
    the number of ``examples`` the rows come from, in data-parallel training, that of the global batch, of which
    these are this rank's part (:func:`~seqzoo.training.distributed.global_batch_loss`)."""
    product = shared.transpose(0, 1) @ private  # (d_s, d_p)
    if examples is None:
        return product.pow(2).sum()
    return global_batch_loss(lambda whole: whole.pow(2).sum(), product, examples)


class _Branch(nn.Module):
    """An encoder and, where a classification task or ASP's discriminator reads a vector per sentence, its
    pooler: (B, T, E) -> the per-token outputs (B, T, H) and, with ``pool``, the pooled (B, P)."""

    def __init__(self, encoder: Encoder, pooler: str | None) -> None:
        super().__init__()
        self.encoder = encoder
        self.pooler = (
            None
            if pooler is None
            else build_pooler(pooler, encoder.output_size, encoder.bidirectional, encoder.global_size)
        )
        self.output_size = encoder.output_size
        self.pooled_size = 0 if self.pooler is None else self.pooler.output_size

    def forward(self, x: Tensor, mask: Tensor, pool: bool) -> tuple[Tensor, Tensor | None]:
        outputs, state = self.encoder(x, mask)  # (B, T, H), zeros at pads
        if not pool:
            return outputs, None
        return outputs, self.pooler(outputs, mask, self.encoder.global_state(state))  # (B, P)


@dataclass(frozen=True)
class TagOutput:
    """A tagging task's head: its tags by index and the scheme whose transitions it forbids (None: none)."""

    tags: tuple[str, ...]
    constraints: str | None


class Features(NamedTuple):
    """A batch's features for one task: the shared and private encoders' (None where the architecture has no
    such branch; the meta architecture's are private), pooled (B, S), (B, P) for a classification task, per
    token (B, T, S), (B, T, P) for a tagging task; and ``sentence``, the shared features pooled (B, S) where a
    classification task or ASP's discriminator reads them."""

    shared: Tensor | None
    private: Tensor | None
    sentence: Tensor | None


class Objective(NamedTuple):
    """A training batch's losses, from one forward pass of :class:`MultiTaskModel` (None: none of that kind)."""

    task: Tensor  # the task's own loss: a classification batch's mean cross-entropy, a tagging batch's mean NLL
    auxiliary: Tensor | None  # the regularisers of the encoders the batch ran through (e.g. the MZU's)
    adversarial: Tensor | None  # asp: L_adv, the discriminator's cross-entropy (its gradient reversed below it)
    difference: Tensor | None  # asp: L_diff, the orthogonality loss of the (global) batch's shared and private features


class MultiTaskModel(nn.Module):
    """Token embedder -> shared and/or private encoders -> per-task head (module docstring): ``outputs`` maps
    each task to its number of classes (an MLP head on the pooled features) or its :class:`TagOutput` (a
    :class:`~seqzoo.tasks.tagging.TagHead` on the per-token features).

    Registration order makes the shared modules' names the canonical ones: ``embedding`` (when shared),
    ``shared`` (the shared encoder branch, or the Meta-LSTM's shared ``MetaCell`` list), then
    ``private.TASK.*`` (its own token embedder, encoder branch and ``head``) and ``discriminator`` (asp).
    """

    def __init__(
        self,
        outputs: dict[str, int | TagOutput],
        vocab_size: int,
        embedding_dim: int,
        architecture: Architecture,
        cfg: ModelConfig,
        *,
        share_embeddings: bool = True,
        freeze_embeddings: bool = False,
        vectors: Tensor | None = None,
        num_chars: int = 0,
    ) -> None:
        super().__init__()
        self.architecture, self.task_names = architecture, list(outputs)
        self.tagging = {name for name, output in outputs.items() if isinstance(output, TagOutput)}
        asp = architecture == "asp"

        def embedder() -> TokenEmbedder:
            return token_embedder(
                cfg, vocab_size, embedding_dim, vectors=vectors, freeze=freeze_embeddings, num_chars=num_chars
            )

        self.embedding = embedder() if share_embeddings else None
        # [word vector; char feature] (TokenEmbedder.output_size, known before a private embedder is built)
        input_size = embedding_dim + (0 if cfg.char_encoder == "none" else cfg.char_hidden_size)

        def branch(pooled: bool, **shared: Any) -> _Branch:
            arguments = with_recipe_arguments(cfg.encoder_args, input_size=input_size, **shared)
            return _Branch(build_encoder(cfg.encoder, **arguments), cfg.pooler if pooled else None)

        self.embedding_dropout = nn.Dropout(cfg.embedding_dropout)
        branches: dict[str, _Branch] = {}
        self.shared: nn.Module | None = None
        if architecture in _SHARED_ENCODER:
            self.shared = branch(asp or len(self.tagging) < len(outputs))
        elif architecture == "meta":
            first = branch(self.task_names[0] not in self.tagging)
            if not isinstance(first.encoder, MetaLSTM):
                raise ValueError(
                    f"architecture meta shares Meta-LSTM cells: model.encoder must be meta_lstm, not {cfg.encoder!r}"
                )
            self.shared = first.encoder.meta_cells  # eq. 21: one Meta-LSTM for every task
            branches[self.task_names[0]] = first
        shared = self.shared if isinstance(self.shared, _Branch) else None
        private = {}
        for name, output in outputs.items():
            parts: dict[str, nn.Module] = {} if share_embeddings else {"embedding": embedder()}
            if architecture in _PRIVATE_ENCODER:  # eq. 22: the task's own P, Q, B around the shared meta cells
                meta = {"shared_meta": self.shared} if architecture == "meta" else {}
                parts["branch"] = branches.get(name) or branch(name not in self.tagging, **meta)
            own = parts.get("branch")
            if isinstance(output, TagOutput):
                width = (shared.output_size if shared else 0) + (own.output_size if own else 0)
                parts["head"] = TagHead(width, output.tags, cfg.decoder, output.constraints, cfg.dropout)
            else:
                width = (shared.pooled_size if shared else 0) + (own.pooled_size if own else 0)
                layers: list[nn.Module] = []
                for hidden in cfg.mlp_hidden:
                    layers += [nn.Dropout(cfg.dropout), nn.Linear(width, hidden), nn.ReLU()]
                    width = hidden
                parts["head"] = nn.Sequential(*layers, nn.Dropout(cfg.dropout), nn.Linear(width, output))
            private[name] = nn.ModuleDict(parts)
        self.private = nn.ModuleDict(private)
        self.discriminator = nn.Linear(shared.pooled_size, len(outputs)) if asp and shared else None
        #: A step runs one task's modules: data-parallel training must look for those it left out
        #: (DDP's find_unused_parameters, :func:`seqzoo.training.distributed.replicate`).
        self.leaves_parameters_unused = len(outputs) > 1
        self._aliases = _aliases(self)
        self.register_state_dict_post_hook(_drop_aliases)
        self.register_load_state_dict_pre_hook(_add_aliases)

    def encode(self, task: str, ids: Tensor, mask: Tensor, chars: Tensor | None = None) -> Features:
        """The shared and private features of a batch of ``task``: word ids (B, T) [and char ids (B, T, C)]."""
        own = self.private[task]
        embedding = own["embedding"] if self.embedding is None else self.embedding
        x = self.embedding_dropout(embedding(ids, chars))  # (B, T, E)
        tagging = task in self.tagging
        shared = sentence = private = None
        if isinstance(self.shared, _Branch):
            tokens, sentence = self.shared(x, mask, pool=not tagging or self.discriminator is not None)
            shared = tokens if tagging else sentence  # (B, T, S) or (B, S)
        if "branch" in own:
            tokens, pooled = own["branch"](x, mask, pool=not tagging)
            private = tokens if tagging else pooled  # (B, T, P) or (B, P)
        return Features(shared, private, sentence)

    def scores(self, task: str, features: Features) -> Tensor:
        """The task's head on its features: logits (B, C) of a classification task, emissions (B, T, K) of a
        tagging task."""
        joined = torch.cat([f for f in (features.shared, features.private) if f is not None], dim=-1)
        return self.private[task]["head"](joined)  # (B, [T,] S + P) -> (B, C) or (B, T, K)

    def forward(
        self, task: str, ids: Tensor, mask: Tensor, chars: Tensor | None = None, targets: Tensor | None = None
    ) -> Tensor | Objective:
        """The task's scores (B, C) or (B, T, K); with ``targets`` (labels (B,) or tags (B, T), -1 at pads) the
        training :class:`Objective` instead: every loss a step differentiates comes out of this one call, as
        data-parallel training needs (DDP reduces the gradients of what its forward pass computed)."""
        features = self.encode(task, ids, mask, chars)
        scores = self.scores(task, features)  # (B, C) or (B, T, K)
        if targets is None:
            return scores
        if task in self.tagging:  # the mean sentence NLL (Lample et al. eq. 2 with a CRF)
            loss = self.private[task]["head"].nll(scores, targets, mask).sum() / len(ids)
        else:  # Chen et al. eq. 8's cross-entropy
            loss = F.cross_entropy(scores, targets)
        adversarial = difference = None
        if self.discriminator is not None:  # ASP-MTL: the task discriminator behind gradient reversal, L_diff
            target = torch.full((len(ids),), self.task_names.index(task), device=ids.device)  # (B,)
            adversarial = F.cross_entropy(self.discriminator(grad_reverse(features.sentence)), target)
            shared, private = features.shared, features.private
            if task in self.tagging:  # the real tokens' features: (N, S), (N, P)
                shared, private = shared[mask], private[mask]
            difference = orthogonality_loss(shared, private, len(ids))
        return Objective(loss, self.auxiliary_loss(task), adversarial, difference)

    def auxiliary_loss(self, task: str) -> Tensor | None:
        """The regularisers of the encoders a batch of ``task`` ran through (e.g. the MZU's), summed."""
        branches = [
            self.shared if isinstance(self.shared, _Branch) else None,
            self.private[task]["branch"] if "branch" in self.private[task] else None,
        ]
        losses = [loss for b in branches if b is not None for loss in [b.encoder.auxiliary_loss()] if loss is not None]
        return torch.stack(losses).sum() if losses else None


def _aliases(model: nn.Module) -> dict[str, str]:
    """``{name: canonical name}`` for every parameter or buffer the model holds under more than one
    name (a shared module), the canonical name being the first in registration order."""
    first: dict[int, str] = {}
    aliases = {}
    named = [*model.named_parameters(remove_duplicate=False), *model.named_buffers(remove_duplicate=False)]
    for name, tensor in named:
        canonical = first.setdefault(id(tensor), name)
        if canonical != name:
            aliases[name] = canonical
    return aliases


def _drop_aliases(module: nn.Module, state: dict[str, Any], prefix: str, metadata: Any) -> None:
    """State-dict hook: a shared tensor once, under its canonical name."""
    for alias in module._aliases:
        state.pop(prefix + alias, None)


def _add_aliases(module: nn.Module, state: dict[str, Any], prefix: str, *args: Any) -> None:
    """Load hook: a shared tensor saved once fills each of its names (a state dict that has them all loads too)."""
    for alias, canonical in module._aliases.items():
        if prefix + canonical in state:
            state.setdefault(prefix + alias, state[prefix + canonical])


Suite = dict[str, ClassificationData | TaggingData]


def _load_suite(config: RunConfig) -> Suite:
    """Every task of ``data.tasks``, its training split capped at its ``max_train``."""
    data: MultiTaskDataConfig = config.data
    suite: Suite = {}
    for sub in data.tasks:
        if sub.kind == "tagging":
            tagged = load_data(sub)
            tagged.splits["train"] = tagged.splits["train"][: sub.max_train]
            suite[sub.name] = tagged
            continue
        directory = sub.data_dir or data.data_dir or bundled_corpus_dir()
        loaded = ClassificationData.from_dir(
            directory, sub.name, dev_fraction=data.dev_fraction, seed=config.train.seed
        )
        if loaded.test is None:
            raise DataError(f"{sub.name}: the multi-task recipe needs a test split ({sub.name}.test)", directory)
        loaded.train = loaded.train[: sub.max_train]
        suite[sub.name] = loaded
    return suite


def _texts(suite: Suite) -> dict[str, dict[str, list[Any]]]:
    """``{task: {split: examples}}``: a classification task's :class:`LabeledText`, a tagging task's
    :class:`TaggedSentence`."""
    return {
        name: d.splits if isinstance(d, TaggingData) else {"train": d.train, "dev": d.dev, "test": d.test or []}
        for name, d in suite.items()
    }


def _sources(suite: Suite) -> dict[str, dict[str, Path]]:
    return {name: d.sources for name, d in suite.items() if isinstance(d, TaggingData)}


class _TaggingPart(TaggedCorpus):
    """A tagging task of a multi-task model: its corpus (encoded with the joint vocabularies), read through
    the owner's model."""

    def __init__(
        self,
        owner: MultiTask,
        sub: SubTaskConfig,
        splits: dict[str, list[TaggedSentence]],
        sources: dict[str, Path] | None,
        tags: Sequence[str] | None,
    ) -> None:
        self.owner, self.name = owner, sub.name
        self.config, self.device = owner.config, owner.device
        data: MultiTaskDataConfig = owner.config.data
        super().__init__(
            sub, splits, vocab=owner.vocab, chars=owner.chars, tags=tags, lowercase=data.lowercase,
            max_len=data.max_len if sub.max_len is None else sub.max_len, sources=sources,
        )  # fmt: skip

    @property
    def model(self) -> nn.Module:  # type: ignore[override]
        return self.owner.model

    @property
    def head(self) -> TagHead:
        return self.owner.model.private[self.name]["head"]

    def emissions(self, ids: Tensor, mask: Tensor, chars: Tensor | None) -> Tensor:
        return self.owner.model(self.name, ids, mask, chars)  # (B, T, K)


def _refuse_char_features(config: RunConfig) -> None:
    """Character features are read by tagging tasks only (a classification task's tokens are not the text's)."""
    plain = [sub.name for sub in config.data.tasks if sub.kind == "classification"]
    if config.model.char_encoder != "none" and plain:
        raise ConfigError(
            f"model.char_encoder: character features are read by tagging sub-tasks only, and data.tasks has "
            f"classification sub-tasks ({', '.join(plain)}): set it to none, or leave those tasks out"
        )


class MultiTask:
    """The :class:`~seqzoo.training.task.Task` of the multi-task recipe (module docstring).

    ``texts``: ``{task: {split: examples}}`` of every task of ``data.tasks`` (:class:`LabeledText` of a
    classification task, :class:`TaggedSentence` of a tagging task; the vocabularies are built over their
    training splits; only the active tasks are trained and evaluated), or empty for a model reloaded
    without data, whose ``vocab``, ``tokenizer``, ``labels``, ``tags``, ``chars`` and ``embedding_dim``
    come from its checkpoint. ``sources``: a tagging task's files by split, for error messages.
    """

    higher_is_better = True

    def __init__(
        self,
        config: RunConfig,
        texts: dict[str, dict[str, list[Any]]],
        labels: dict[str, LabelSet],
        vocab: Vocab | None = None,
        tokenizer: Tokenizer | None = None,
        embedding_dim: int | None = None,
        *,
        tags: dict[str, Sequence[str]] | None = None,
        chars: Vocab | None = None,
        sources: dict[str, dict[str, Path]] | None = None,
    ) -> None:
        self.config = config
        data: MultiTaskDataConfig = config.data
        self.subtasks = {sub.name: sub for sub in data.active_tasks()}
        tagging = [sub for sub in data.tasks if sub.kind == "tagging"]
        self._max_lens = {sub.name: sub.max_len for sub in data.tasks if sub.max_len is not None}
        self.tokenizer = tokenizer or Tokenizer(lowercase=data.lowercase, split_hyphens=data.split_hyphens)
        sentences = [s.tokens for sub in tagging if sub.name in texts for s in texts[sub.name]["train"]]
        if vocab is None:
            tagged = {sub.name for sub in tagging}
            words = [
                self._tokens(ex.text, name)
                for name, splits in texts.items()
                if name not in tagged
                for ex in splits["train"]
            ]
            words += [[t.lower() if data.lowercase else t for t in tokens] for tokens in sentences]
            vocab = Vocab.build(words, min_freq=data.min_freq, max_size=data.max_vocab)
            if data.embeddings and data.embedding_vocab:
                vocab = with_pretrained_words(vocab, self._all_words(texts, tagged), data.embeddings)
        self.vocab = vocab
        #: The character vocabulary, when the model reads character features (else None).
        self.chars = None if config.model.char_encoder == "none" else chars or build_char_vocab(sentences)
        self.device = resolve_device(config.train.device)
        self.parts = {
            sub.name: _TaggingPart(self, sub, texts.get(sub.name, {}), (sources or {}).get(sub.name),
                                   (tags or {}).get(sub.name))
            for sub in tagging if sub.name in self.subtasks
        }  # fmt: skip
        self.labels = {name: labels[name] for name in self.subtasks if name not in self.parts}
        self.encoded = {  # {classification task: {split: [(ids, label)]}}
            name: {
                split: [
                    (self._encode(ex.text, name), self.labels[name].encode(ex.label, ex.path, ex.line))
                    for ex in examples
                ]
                for split, examples in texts[name].items()
            }
            for name in self.labels
            if name in texts
        }
        dim, vectors = pretrained_vectors(data.embeddings, self.vocab, data.embedding_dim, embedding_dim)
        outputs: dict[str, int | TagOutput] = {
            name: TagOutput(tuple(self.parts[name].tags), self._constraints(name))
            if name in self.parts
            else len(self.labels[name])
            for name in self.subtasks
        }
        with names_config_errors("model"):
            self.model = MultiTaskModel(
                outputs, len(self.vocab), dim, data.architecture, config.model,
                share_embeddings=data.share_embeddings, freeze_embeddings=data.freeze_embeddings, vectors=vectors,
                num_chars=len(self.chars) if self.chars else 0,
            )  # fmt: skip
        self.model.to(self.device)
        #: Each task's main metric: accuracy, or its tagging metric (f1 with a chunk scheme).
        self.main_metrics = {name: self.parts[name].metric if name in self.parts else "accuracy" for name in outputs}
        kinds = set(self.main_metrics.values())
        self.metric = kinds.pop() if len(kinds) == 1 else "score"
        self._shard = (0, 1)  # (rank, world size) of data-parallel training (shard_train)

    def _all_words(self, texts: dict[str, dict[str, list[Any]]], tagged: set[str]) -> Iterator[str]:
        """Every word of every split of every task, as the vocabulary keys it."""
        for name, splits in texts.items():
            for examples in splits.values():
                for ex in examples:
                    if name in tagged:
                        yield from (t.lower() if self.config.data.lowercase else t for t in ex.tokens)
                    else:
                        yield from self._tokens(ex.text, name)

    def _constraints(self, task: str) -> str | None:
        """The scheme whose transitions ``task``'s head forbids (None: tags without chunks, or ``model.constraints``
        off)."""
        return self.parts[task].model_scheme if self.config.model.constraints else None

    def _tokens(self, text: str, task: str) -> list[str]:
        limit = self._max_lens.get(task, self.config.data.max_len)
        tokens = self.tokenizer(text)
        return tokens[:limit] if limit else tokens

    def _encode(self, text: str, task: str) -> list[int]:
        """The word ids of ``text`` as ``task`` cuts it (an empty text: one unknown word)."""
        return self.vocab.encode(self._tokens(text, task)) or [self.vocab.token_to_id(Vocab.UNK)]

    def _inputs(self, rows: Sequence[list[int]]) -> tuple[Tensor, Tensor]:
        ids, mask = pad_batch(list(rows), self.vocab.pad_id)  # (B, T)
        return ids.to(self.device), mask.to(self.device)

    def _batch(self, task: str, split: str, indices: Sequence[int]) -> tuple[Tensor, Tensor, Tensor]:
        examples = [self.encoded[task][split][i] for i in indices]
        labels = torch.tensor([label for _, label in examples], device=self.device)  # (B,)
        return *self._inputs([ids for ids, _ in examples]), labels

    def _task_batches(self, task: str, split: str, size: int, seed: int | None = None) -> list[list[int]]:
        if task in self.parts:
            return self.parts[task].batches(split, size, seed)
        lengths = [len(ids) for ids, _ in self.encoded[task][split]]
        return bucket_batches(lengths, size, shuffle=seed is not None, seed=seed)

    def _train_size(self, task: str) -> int:
        return len(self.parts[task].encoded["train"] if task in self.parts else self.encoded[task]["train"])

    def train_batches(self, epoch: int) -> list[tuple[str, list[int]]]:
        """The epoch's ``(task, indices)`` steps: each draws a task (uniformly, or in proportion to the tasks'
        training sizes) and the task's next batch, the task's batches reshuffled whenever they run out. A
        pure function of (seed, epoch), so a resumed run replays it, and so does every rank of a data-parallel run,
        which then takes its part of each batch (:meth:`shard_train`)."""
        data: MultiTaskDataConfig = self.config.data
        seed, size = self.config.train.seed, self.config.train.batch_size
        names = list(self.subtasks)
        rounds = dict.fromkeys(names, 0)
        queues: dict[str, list[list[int]]] = {name: [] for name in names}

        def order(name: str) -> int:  # the seed of the task's (rounds[name])-th pass in this epoch
            return zlib.crc32(f"{epoch_seed(seed, epoch)}/{name}/{rounds[name]}".encode())

        sizes = [self._train_size(name) for name in names]
        weights = sizes if data.sampling == "proportional" else [1] * len(names)
        steps = data.steps_per_epoch or sum(-(-n // size) for n in sizes)
        draw = random.Random(epoch_seed(seed, epoch))
        batches = []
        for name in draw.choices(names, weights, k=steps):
            if not queues[name]:
                queues[name] = self._task_batches(name, "train", size, order(name))
                rounds[name] += 1
            batches.append((name, queues[name].pop(0)))
        rank, world = self._shard
        return [(name, part) for name, batch in batches for part in shard_batches([batch], rank, world)]

    def shard_train(self, rank: int, world_size: int) -> None:
        """Data-parallel training: from now on :meth:`train_batches` gives rank ``rank`` of ``world_size`` its part
        of each step's batch (the task is built with the global batch size, and every rank draws the same task at
        a step); a step whose batch has fewer than ``world_size`` examples is left out on every rank."""
        self._shard = (rank, world_size)

    def train_loss(self, batch: tuple[str, list[int]]) -> StepLoss:
        """``λ_m`` times the task's loss (the cross-entropy of a classification batch, the mean sentence NLL
        of a tagging batch), plus the encoders' regularisers and ASP's ``λ L_adv + γ L_diff``."""
        task, indices = batch
        part = self.parts.get(task)
        if part is None:
            ids, mask, targets = self._batch(task, "train", indices)
            chars = None
        else:
            examples = [part.encoded["train"][i] for i in indices]
            ids, mask, chars = part.inputs(examples)
            targets = part.targets(examples)  # (B, T)
        objective = self.model(task, ids, mask, chars, targets)  # one forward pass (data-parallel training)
        auxiliary = objective.auxiliary
        if objective.adversarial is not None:  # ASP-MTL: L_task + λ L_adv + γ L_diff
            data: MultiTaskDataConfig = self.config.data
            asp = data.adversarial_weight * objective.adversarial + data.orthogonality_weight * objective.difference
            auxiliary = asp if auxiliary is None else auxiliary + asp
        loss = self.subtasks[task].weight * objective.task
        return StepLoss.plus(loss, auxiliary, int(mask.sum()), len(indices))

    @torch.no_grad()
    def evaluate(self, split: str) -> dict[str, float]:
        """Every active task's metrics on ``split`` under ``TASK/`` (module docstring), the macro average of
        their main metrics (named :attr:`metric`) and of their losses (``loss``)."""
        metrics: dict[str, float] = {}
        size = self.config.train.eval_batch_size
        for name in self.subtasks:

            def logits_and_labels(name: str = name) -> Any:
                for indices in self._task_batches(name, split, size):
                    ids, mask, labels = self._batch(name, split, indices)
                    yield self.model(name, ids, mask), labels

            if name in self.parts:
                own = self.parts[name].evaluate(split)
            else:
                own = accuracy_and_loss(self.model, logits_and_labels())
            metrics.update({f"{name}/{k}": v for k, v in own.items()})
        main = [metrics[f"{name}/{key}"] for name, key in self.main_metrics.items()]
        metrics[self.metric] = sum(main) / len(main)
        metrics["loss"] = sum(metrics[f"{name}/loss"] for name in self.subtasks) / len(self.subtasks)
        return metrics

    @torch.no_grad()
    def predict(self, texts: list[str], task: str | None = None) -> list[dict[str, Any]]:
        """For each raw text, in input order, the prediction of ``task`` (optional where the model has one
        task) with its name under ``task``: a classification task's most probable label and every label's
        probability; a tagging task's record of the tagging recipe (tokens, tags, confidences, spans)."""
        names = list(self.subtasks)
        if task is None and len(names) == 1:
            task = names[0]
        if task not in self.subtasks:
            raise ConfigError(f"a multi-task model predicts for a task: name one of {', '.join(names)} (--task)")
        if task in self.parts:
            return [{"task": task, **row} for row in self.parts[task].predict(texts)]
        rows = [self._encode(text, task) for text in texts]
        results: list[dict[str, Any]] = []
        size = self.config.train.eval_batch_size
        with module_mode(self.model, training=False):
            for start in range(0, len(rows), size):
                logits = self.model(task, *self._inputs(rows[start : start + size]))  # (B, C)
                results.extend({"task": task, **row} for row in class_probabilities(logits, list(self.labels[task])))
        return results

    def documents(self) -> dict[str, Any]:
        tagged = {"tags.json": {name: part.tags_document() for name, part in self.parts.items()}} if self.parts else {}
        chars = {} if self.chars is None else {"chars.json": self.chars.to_dict()}
        return {
            "vocab.json": self.vocab.to_dict(),
            "labels.json": {name: labels.to_dict() for name, labels in self.labels.items()},
            "tokenizer.json": self.tokenizer.to_dict(),
            **tagged,
            **chars,
        }


def build_tasks(config: RunConfig) -> list[tuple[str, MultiTask]]:
    _refuse_char_features(config)
    suite = _load_suite(config)
    labels = {name: d.labels for name, d in suite.items() if isinstance(d, ClassificationData)}
    return [("", MultiTask(config, _texts(suite), labels, sources=_sources(suite)))]


def load_trained(config: RunConfig, best: Path, with_data: bool = True) -> MultiTask:
    """Rebuild a trained multi-task model from a ``best/`` checkpoint directory."""
    _refuse_char_features(config)
    data: MultiTaskDataConfig = config.data
    suite = _load_suite(config) if with_data else {}
    tagging = any(sub.kind == "tagging" for sub in data.active_tasks())

    def build(checkpoint: Checkpoint) -> MultiTask:
        labels = {name: LabelSet.from_dict(d) for name, d in checkpoint.document("labels.json").items()}
        tags = {name: d["tags"] for name, d in checkpoint.document("tags.json").items()} if tagging else None
        chars = None if config.model.char_encoder == "none" else checkpoint.vocab("chars.json")
        first = data.active_tasks()[0].name
        table = checkpoint.tensor("embedding.weight" if data.share_embeddings else f"private.{first}.embedding.weight")
        tokenizer = Tokenizer.from_dict(checkpoint.document("tokenizer.json"))
        return MultiTask(
            config, _texts(suite), labels, checkpoint.vocab(), tokenizer, table.shape[1], tags=tags, chars=chars,
            sources=_sources(suite),
        )  # fmt: skip

    return restore(best, build)


def _inert_keys(config: RunConfig) -> dict[str, str]:
    data: MultiTaskDataConfig = config.data
    inert = {}
    if data.architecture != "asp":
        for key in ("adversarial_weight", "orthogonality_weight"):
            inert[f"data.{key}"] = "only the asp architecture has the adversarial and orthogonality losses"
    if not data.embeddings:
        inert["data.embedding_vocab"] = "it adds the words of data.embeddings"
    kinds = {sub.kind for sub in data.tasks}
    if "classification" not in kinds:
        inert["model.mlp_hidden"] = "only a classification sub-task has an MLP head"
        if data.architecture != "asp":
            inert["model.pooler"] = "only a classification sub-task or ASP's discriminator pools the encoder outputs"
    if "tagging" not in kinds:
        for key in ("decoder", "constraints"):
            inert[f"model.{key}"] = "only a tagging sub-task (kind: tagging) has a tag decoder"
    return inert


register_task(
    "multitask",
    data_config=MultiTaskDataConfig,
    model_keys={"encoder", "encoder_args", "pooler", "mlp_hidden", "embedding_dropout", "dropout", *_TAG_KEYS},
    build_tasks=build_tasks,
    load_trained=load_trained,
    inert_keys=_inert_keys,
)
