"""Multi-task text classification: one model over several classification tasks, trained by drawing a
task at every step and a batch of it.

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

The word embeddings are shared (``data.share_embeddings``). The model is one task to the trainer:
its batches are ``(task name, example indices)``, its metrics ``TASK/accuracy`` and ``TASK/loss``
plus their macro averages ``accuracy`` (the early-stopping metric) and ``loss``. A shared module is
one module under several names; its tensors are saved once, under the first name (``shared.*``).
"""

from __future__ import annotations

import random
import zlib
from collections.abc import Sequence
from dataclasses import dataclass, field
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
    require_name,
    require_ranges,
    with_recipe_arguments,
)
from seqzoo.data.batching import bucket_batches, pad_batch
from seqzoo.data.classification import ClassificationData, LabeledText, LabelSet, bundled_corpus_dir
from seqzoo.data.errors import DataError
from seqzoo.data.text import Tokenizer, Vocab
from seqzoo.embedders import TokenEmbedder
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
)
from seqzoo.training.devices import resolve_device
from seqzoo.training.registry import register_task
from seqzoo.training.task import StepLoss

__all__ = [
    "MultiTask",
    "MultiTaskClassifier",
    "MultiTaskDataConfig",
    "SubTaskConfig",
    "build_tasks",
    "grad_reverse",
    "load_trained",
    "orthogonality_loss",
]

Architecture = Literal["single", "fs", "sp", "asp", "meta"]
_SHARED_ENCODER = ("fs", "sp", "asp")
_PRIVATE_ENCODER = ("single", "sp", "asp", "meta")


@dataclass
class SubTaskConfig:
    """One task of the suite: ``{data_dir}/{name}.{train,dev,test}[.gz]`` in the Fudan format."""

    name: str
    data_dir: str | None = None  # None: data.data_dir
    weight: float = 1.0  # λ_m of the task's cross-entropy
    max_train: int | None = None  # keep the first max_train training examples (the files are shuffled)
    max_len: int | None = None  # None: data.max_len

    def __post_init__(self) -> None:
        require_ranges(self, positive=("weight", "max_train", "max_len"))
        require_name(self.name, "name")  # the files' stem in data_dir


@dataclass
class MultiTaskDataConfig:
    """The ``data:`` section of the multi-task recipe: its tasks, what they share and how steps draw them."""

    tasks: list[SubTaskConfig] = field(default_factory=lambda: [SubTaskConfig("movie_snippets")])
    data_dir: str | None = None  # None = the corpus bundled with seqzoo
    # The tasks this run trains and evaluates (None: all). The vocabulary is built over every task's
    # training split, so runs over different subsets (transfer stages) share it.
    active: list[str] | None = None
    architecture: Architecture = "meta"
    sampling: Literal["uniform", "proportional"] = "proportional"  # task drawn per step: ∝ 1, or ∝ its train size
    steps_per_epoch: int | None = None  # None: as many as the active tasks have training batches together
    share_embeddings: bool = True
    adversarial_weight: float = 0.05  # asp: λ
    orthogonality_weight: float = 0.01  # asp: γ
    lowercase: bool = True
    split_hyphens: bool = False
    min_freq: int = 1
    max_vocab: int | None = None
    max_len: int | None = DEFAULT_MAX_LEN  # texts are cut to their first max_len tokens (None: no cap)
    embeddings: str | None = None  # GloVe-format text vectors (.txt or .gz)
    embedding_dim: int = 50
    freeze_embeddings: bool = False
    dev_fraction: float = 0.1  # held out of train for a task without a dev split

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


def orthogonality_loss(shared: Tensor, private: Tensor) -> Tensor:
    """ASP-MTL's difference loss ``‖Sᵀ H‖_F²`` of a batch's shared (N, d_s) and private (N, d_p) features."""
    return (shared.transpose(0, 1) @ private).pow(2).sum()  # (d_s, d_p) -> ()


class _Branch(nn.Module):
    """An encoder and its pooler: (B, T, E) -> (B, P)."""

    def __init__(self, encoder: Encoder, pooler: str) -> None:
        super().__init__()
        self.encoder = encoder
        self.pooler = build_pooler(pooler, encoder.output_size, encoder.bidirectional, encoder.global_size)
        self.output_size = self.pooler.output_size

    def forward(self, x: Tensor, mask: Tensor) -> Tensor:
        outputs, state = self.encoder(x, mask)  # (B, T, H)
        return self.pooler(outputs, mask, self.encoder.global_state(state))  # (B, P)


class MultiTaskClassifier(nn.Module):
    """Word embeddings -> shared and/or private encoders -> per-task MLP head (module docstring).

    Registration order makes the shared modules' names the canonical ones: ``embedding`` (when shared),
    ``shared`` (the shared encoder branch, or the Meta-LSTM's shared ``MetaCell`` list), then
    ``private.TASK.*`` (its own word table, encoder branch and ``head``) and ``discriminator`` (asp).
    """

    def __init__(
        self,
        num_classes: dict[str, int],
        vocab_size: int,
        embedding_dim: int,
        architecture: Architecture,
        cfg: ModelConfig,
        *,
        share_embeddings: bool = True,
        freeze_embeddings: bool = False,
        vectors: Tensor | None = None,
    ) -> None:
        super().__init__()
        self.architecture, self.task_names = architecture, list(num_classes)

        def embedder() -> TokenEmbedder:
            return TokenEmbedder(vocab_size, embedding_dim, vectors=vectors, freeze=freeze_embeddings)

        def branch(**shared: Any) -> _Branch:
            arguments = with_recipe_arguments(cfg.encoder_args, input_size=embedding_dim, **shared)
            return _Branch(build_encoder(cfg.encoder, **arguments), cfg.pooler)

        self.embedding = embedder() if share_embeddings else None
        self.embedding_dropout = nn.Dropout(cfg.embedding_dropout)
        branches: dict[str, _Branch] = {}
        self.shared: nn.Module | None = None
        if architecture in _SHARED_ENCODER:
            self.shared = branch()
        elif architecture == "meta":
            first = branch()
            if not isinstance(first.encoder, MetaLSTM):
                raise ValueError(
                    f"architecture meta shares Meta-LSTM cells: model.encoder must be meta_lstm, not {cfg.encoder!r}"
                )
            self.shared = first.encoder.meta_cells  # eq. 21: one Meta-LSTM for every task
            branches[self.task_names[0]] = first
        shared_size = self.shared.output_size if isinstance(self.shared, _Branch) else 0
        private = {}
        for name, classes in num_classes.items():
            parts: dict[str, nn.Module] = {} if share_embeddings else {"embedding": embedder()}
            if architecture in _PRIVATE_ENCODER:  # eq. 22: the task's own P, Q, B around the shared meta cells
                meta = {"shared_meta": self.shared} if architecture == "meta" else {}
                parts["branch"] = branches.get(name) or branch(**meta)
            width = shared_size + (parts["branch"].output_size if "branch" in parts else 0)
            layers: list[nn.Module] = []
            for hidden in cfg.mlp_hidden:
                layers += [nn.Dropout(cfg.dropout), nn.Linear(width, hidden), nn.ReLU()]
                width = hidden
            parts["head"] = nn.Sequential(*layers, nn.Dropout(cfg.dropout), nn.Linear(width, classes))
            private[name] = nn.ModuleDict(parts)
        self.private = nn.ModuleDict(private)
        self.discriminator = nn.Linear(shared_size, len(num_classes)) if architecture == "asp" else None
        self._aliases = _aliases(self)
        self.register_state_dict_post_hook(_drop_aliases)
        self.register_load_state_dict_pre_hook(_add_aliases)

    def encode(self, task: str, ids: Tensor, mask: Tensor) -> tuple[Tensor | None, Tensor | None]:
        """The shared (B, S) and private (B, P) features of a batch of ``task`` (None where the
        architecture has no such encoder branch; the meta architecture's are private)."""
        own = self.private[task]
        embedding = own["embedding"] if self.embedding is None else self.embedding
        x = self.embedding_dropout(embedding(ids))  # (B, T, E)
        shared = self.shared(x, mask) if isinstance(self.shared, _Branch) else None  # (B, S)
        private = own["branch"](x, mask) if "branch" in own else None  # (B, P)
        return shared, private

    def classify(self, task: str, shared: Tensor | None, private: Tensor | None) -> Tensor:
        features = torch.cat([f for f in (shared, private) if f is not None], dim=-1)  # (B, S + P)
        return self.private[task]["head"](features)  # (B, C)

    def forward(self, task: str, ids: Tensor, mask: Tensor) -> Tensor:
        return self.classify(task, *self.encode(task, ids, mask))  # (B, C)

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


def _load_suite(config: RunConfig) -> dict[str, ClassificationData]:
    """Every task of ``data.tasks``, its training split capped at its ``max_train``."""
    data: MultiTaskDataConfig = config.data
    suite = {}
    for sub in data.tasks:
        directory = sub.data_dir or data.data_dir or bundled_corpus_dir()
        loaded = ClassificationData.from_dir(
            directory, sub.name, dev_fraction=data.dev_fraction, seed=config.train.seed
        )
        if loaded.test is None:
            raise DataError(f"{sub.name}: the multi-task recipe needs a test split ({sub.name}.test)", directory)
        loaded.train = loaded.train[: sub.max_train]
        suite[sub.name] = loaded
    return suite


class MultiTask:
    """The :class:`~seqzoo.training.task.Task` of the multi-task recipe (module docstring).

    ``texts``: ``{task: {split: [LabeledText]}}`` of every task of ``data.tasks`` (the vocabulary is
    built over their training splits; only the active ones are trained and evaluated), or empty for
    a model reloaded without data, whose ``vocab``, ``tokenizer``, ``labels`` and ``embedding_dim``
    come from its checkpoint.
    """

    metric = "accuracy"
    higher_is_better = True

    def __init__(
        self,
        config: RunConfig,
        texts: dict[str, dict[str, list[LabeledText]]],
        labels: dict[str, LabelSet],
        vocab: Vocab | None = None,
        tokenizer: Tokenizer | None = None,
        embedding_dim: int | None = None,
    ) -> None:
        self.config = config
        data: MultiTaskDataConfig = config.data
        self.subtasks = {sub.name: sub for sub in data.active_tasks()}
        self._max_lens = {sub.name: sub.max_len for sub in data.tasks if sub.max_len is not None}
        self.tokenizer = tokenizer or Tokenizer(lowercase=data.lowercase, split_hyphens=data.split_hyphens)
        if vocab is None:
            train = [self._tokens(ex.text, name) for name, splits in texts.items() for ex in splits["train"]]
            vocab = Vocab.build(train, min_freq=data.min_freq, max_size=data.max_vocab)
        self.vocab, self.labels = vocab, {name: labels[name] for name in self.subtasks}
        self.encoded = {  # {task: {split: [(ids, label)]}}
            name: {
                split: [
                    (self._encode(ex.text, name), self.labels[name].encode(ex.label, ex.path, ex.line))
                    for ex in examples
                ]
                for split, examples in texts[name].items()
            }
            for name in self.subtasks
            if name in texts
        }
        dim, vectors = pretrained_vectors(data.embeddings, self.vocab, data.embedding_dim, embedding_dim)
        with names_config_errors("model"):
            self.model = MultiTaskClassifier(
                {name: len(self.labels[name]) for name in self.subtasks}, len(self.vocab), dim, data.architecture,
                config.model, share_embeddings=data.share_embeddings, freeze_embeddings=data.freeze_embeddings,
                vectors=vectors,
            )  # fmt: skip
        self.device = resolve_device(config.train.device)
        self.model.to(self.device)

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
        lengths = [len(ids) for ids, _ in self.encoded[task][split]]
        return bucket_batches(lengths, size, shuffle=seed is not None, seed=seed)

    def train_batches(self, epoch: int) -> list[tuple[str, list[int]]]:
        """The epoch's ``(task, indices)`` steps: each draws a task (uniformly, or in proportion to the tasks'
        training sizes) and the task's next batch, the task's batches reshuffled whenever they run out. A
        pure function of (seed, epoch), so a resumed run replays it."""
        data: MultiTaskDataConfig = self.config.data
        seed, size = self.config.train.seed, self.config.train.batch_size
        names = list(self.subtasks)
        rounds = dict.fromkeys(names, 0)
        queues: dict[str, list[list[int]]] = {name: [] for name in names}

        def order(name: str) -> int:  # the seed of the task's (rounds[name])-th pass in this epoch
            return zlib.crc32(f"{epoch_seed(seed, epoch)}/{name}/{rounds[name]}".encode())

        sizes = [len(self.encoded[name]["train"]) for name in names]
        weights = sizes if data.sampling == "proportional" else [1] * len(names)
        steps = data.steps_per_epoch or sum(-(-n // size) for n in sizes)
        draw = random.Random(epoch_seed(seed, epoch))
        batches = []
        for name in draw.choices(names, weights, k=steps):
            if not queues[name]:
                queues[name] = self._task_batches(name, "train", size, order(name))
                rounds[name] += 1
            batches.append((name, queues[name].pop(0)))
        return batches

    def train_loss(self, batch: tuple[str, list[int]]) -> StepLoss:
        task, indices = batch
        ids, mask, labels = self._batch(task, "train", indices)
        shared, private = self.model.encode(task, ids, mask)
        loss = self.subtasks[task].weight * F.cross_entropy(self.model.classify(task, shared, private), labels)
        auxiliary = self.model.auxiliary_loss(task)
        if self.model.discriminator is not None:  # ASP-MTL: L_task + λ L_adv + γ L_diff
            data: MultiTaskDataConfig = self.config.data
            target = torch.full_like(labels, self.model.task_names.index(task))  # (B,)
            adversarial = F.cross_entropy(self.model.discriminator(grad_reverse(shared)), target)
            asp = data.adversarial_weight * adversarial + data.orthogonality_weight * orthogonality_loss(
                shared, private
            )
            auxiliary = asp if auxiliary is None else auxiliary + asp
        return StepLoss.plus(loss, auxiliary, int(mask.sum()), len(indices))

    def evaluate(self, split: str) -> dict[str, float]:
        """``TASK/accuracy`` and ``TASK/loss`` of every active task on ``split``, and their macro averages."""
        metrics: dict[str, float] = {}
        size = self.config.train.eval_batch_size
        for name in self.subtasks:

            def logits_and_labels(name: str = name) -> Any:
                for indices in self._task_batches(name, split, size):
                    ids, mask, labels = self._batch(name, split, indices)
                    yield self.model(name, ids, mask), labels

            metrics.update({f"{name}/{k}": v for k, v in accuracy_and_loss(self.model, logits_and_labels()).items()})
        for key in ("accuracy", "loss"):
            metrics[key] = sum(metrics[f"{name}/{key}"] for name in self.subtasks) / len(self.subtasks)
        return metrics

    @torch.no_grad()
    def predict(self, texts: list[str], task: str | None = None) -> list[dict[str, Any]]:
        """The most probable label of ``task`` (optional where the model has one task) for each raw text,
        and every label's probability, in input order."""
        names = list(self.subtasks)
        if task is None and len(names) == 1:
            task = names[0]
        if task not in self.subtasks:
            raise ConfigError(f"a multi-task model classifies for a task: name one of {', '.join(names)} (--task)")
        rows = [self._encode(text, task) for text in texts]
        results: list[dict[str, Any]] = []
        size = self.config.train.eval_batch_size
        with module_mode(self.model, training=False):
            for start in range(0, len(rows), size):
                logits = self.model(task, *self._inputs(rows[start : start + size]))  # (B, C)
                results.extend({"task": task, **row} for row in class_probabilities(logits, list(self.labels[task])))
        return results

    def documents(self) -> dict[str, Any]:
        return {
            "vocab.json": self.vocab.to_dict(),
            "labels.json": {name: labels.to_dict() for name, labels in self.labels.items()},
            "tokenizer.json": self.tokenizer.to_dict(),
        }


def _texts(suite: dict[str, ClassificationData]) -> dict[str, dict[str, list[LabeledText]]]:
    return {name: {"train": d.train, "dev": d.dev, "test": d.test or []} for name, d in suite.items()}


def build_tasks(config: RunConfig) -> list[tuple[str, MultiTask]]:
    suite = _load_suite(config)
    return [("", MultiTask(config, _texts(suite), {name: d.labels for name, d in suite.items()}))]


def load_trained(config: RunConfig, best: Path, with_data: bool = True) -> MultiTask:
    """Rebuild a trained multi-task model from a ``best/`` checkpoint directory."""
    texts = _texts(_load_suite(config)) if with_data else {}

    def build(checkpoint: Checkpoint) -> MultiTask:
        labels = {name: LabelSet.from_dict(d) for name, d in checkpoint.document("labels.json").items()}
        word_table = next(v for k, v in checkpoint.weights.items() if k.endswith("embedding.weight"))
        tokenizer = Tokenizer.from_dict(checkpoint.document("tokenizer.json"))
        return MultiTask(config, texts, labels, checkpoint.vocab(), tokenizer, word_table.shape[1])

    return restore(best, build)


def _inert_keys(config: RunConfig) -> dict[str, str]:
    data: MultiTaskDataConfig = config.data
    inert = {}
    if data.architecture != "asp":
        for key in ("adversarial_weight", "orthogonality_weight"):
            inert[f"data.{key}"] = "only the asp architecture has the adversarial and orthogonality losses"
    return inert


register_task(
    "multitask",
    data_config=MultiTaskDataConfig,
    model_keys={"encoder", "encoder_args", "pooler", "mlp_hidden", "embedding_dropout", "dropout"},
    build_tasks=build_tasks,
    load_trained=load_trained,
    inert_keys=_inert_keys,
)
