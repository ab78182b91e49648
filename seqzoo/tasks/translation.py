"""Character-level translation: the QRNN paper's encoder–decoder and its LSTM baseline (MODELS.md 1.7–1.9, TASKS.md 5).

Data: ``{data_dir}/{train,dev,test}.{source,target}[.gz]`` (:mod:`seqzoo.data.translation`),
read as characters with one vocabulary for both sides. Training pairs with a side longer than
``data.max_chars`` are dropped (the paper: 300); dev and test are kept whole, but a line longer than
the bounds of decoding (``data.max_source_chars``, ``data.max_output_chars``) is an error.

Model: ``model.encoder`` is ``"qrnn"`` (:class:`~seqzoo.heads.seq2seq.QRNNSeq2Seq`: ``encoder_args``
``hidden_size``, ``num_layers``, ``encoder_window``, ``decoder_window``, ``enc_state``) or ``"lstm"``
(:class:`~seqzoo.heads.seq2seq.LSTMSeq2Seq`: ``hidden_size``, ``num_layers``); ``model.dropout`` is its
dropout (the configuration's default, 0.5, where a config does not set it: the paper's QRNN has 0,
its LSTM 0.2, as the two shipped configs set); ``data.embedding_dim`` the embedding size.

Metrics: ``loss`` is the teacher-forced mean NLL per target character (``<eos>`` included, in
nats); ``bleu`` and ``chrf`` are sacrebleu corpus scores of the beam-search output
(``data.beam_size``, ``data.length_alpha``) against the raw reference lines — the text is never
tokenised by seqzoo, so this is BLEU on detokenized text with sacrebleu's default ``13a``
tokenisation (its signature is logged, and stored in ``best/sacrebleu.json``). The dev metric for
model selection is ``bleu``.
"""

from __future__ import annotations

import importlib.util
import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor

from seqzoo.config import ConfigError, RunConfig, names_config_errors, require_ranges, with_recipe_arguments
from seqzoo.data.batching import bucket_batches, pad_batch
from seqzoo.data.errors import DataError
from seqzoo.data.text import Vocab
from seqzoo.data.translation import BOS, EOS, build_char_vocab, find_parallel, read_parallel
from seqzoo.encoders.base import module_mode
from seqzoo.heads.seq2seq import beam_search, build_seq2seq
from seqzoo.tasks.common import epoch_seed, restore
from seqzoo.training.devices import resolve_device
from seqzoo.training.registry import register_task
from seqzoo.training.task import StepLoss

__all__ = ["TranslationDataConfig", "TranslationTask", "build_tasks", "corpus_scores", "load_trained", "read_splits"]

log = logging.getLogger("seqzoo")

SPLITS = ("train", "dev", "test")


@dataclass
class TranslationDataConfig:
    """Line-aligned parallel text ``{data_dir}/{train,dev,test}.{source,target}[.gz]``, characters."""

    data_dir: str = ""
    source: str = "de"
    target: str = "en"
    max_chars: int | None = 300  # training pairs with a longer side are dropped (the paper: 300)
    min_freq: int = 1
    embedding_dim: int = 320
    beam_size: int = 8  # dev / test decoding (MODELS.md 1.8)
    length_alpha: float = 0.6  # α of the beam ranking criterion
    # Decoding is bounded: a dev, test or `seqzoo predict` source longer than max_source_chars (a dev or
    # test target longer than max_output_chars) is an error naming its line; no output is longer than
    # max_output_chars (nor than twice its source + 10).
    max_source_chars: int = 1000
    max_output_chars: int = 1000

    def __post_init__(self) -> None:
        sizes = ("max_chars", "min_freq", "embedding_dim", "beam_size", "max_source_chars", "max_output_chars")
        require_ranges(self, positive=sizes, non_negative=("length_alpha",))


def read_splits(cfg: TranslationDataConfig) -> dict[str, list[tuple[str, str]]]:
    """The sentence pairs of every split; training pairs longer than ``cfg.max_chars`` dropped."""
    if not cfg.data_dir:
        raise DataError("data.data_dir is not set: translation needs {train,dev,test}.{source,target}")
    pairs = {}
    for split in SPLITS:
        paths = find_parallel(cfg.data_dir, split, cfg.source, cfg.target)
        pairs[split] = read_parallel(*paths)
        if split != "train":  # decoded in every evaluation
            _refuse_long_lines(pairs[split], paths, cfg)
    if cfg.max_chars:
        kept = [p for p in pairs["train"] if max(map(len, p)) <= cfg.max_chars]
        log.info(
            "train: %d pairs, %d longer than %d characters dropped",
            len(kept),
            len(pairs["train"]) - len(kept),
            cfg.max_chars,
        )
        pairs["train"] = kept
        if not kept:
            raise DataError(f"no training pair has both sides within data.max_chars={cfg.max_chars} characters")
    return pairs


def _refuse_long_lines(pairs: list[tuple[str, str]], paths: tuple[Path, Path], cfg: TranslationDataConfig) -> None:
    """A :class:`DataError` at the first source longer than ``data.max_source_chars`` or target longer than
    ``data.max_output_chars`` (the limits of decoding)."""
    limits = (("max_source_chars", cfg.max_source_chars), ("max_output_chars", cfg.max_output_chars))
    for line, pair in enumerate(pairs, 1):
        for text, path, (key, limit) in zip(pair, paths, limits, strict=True):
            if len(text) > limit:
                raise DataError(f"a line of {len(text)} characters, more than data.{key}={limit}", path, line)


def corpus_scores(hypotheses: list[str], references: list[str]) -> tuple[dict[str, float], dict[str, str]]:
    """sacrebleu corpus BLEU and chrF, and their signature strings (TASKS.md: BLEU "with its signature")."""
    try:
        import sacrebleu
    except ImportError:
        raise ImportError("BLEU needs sacrebleu: pip install 'seqzoo[bleu]'") from None
    metrics = {"bleu": sacrebleu.metrics.BLEU(), "chrf": sacrebleu.metrics.CHRF()}
    scores = {name: metric.corpus_score(hypotheses, [references]).score for name, metric in metrics.items()}
    signatures = {name: str(metric.get_signature()) for name, metric in metrics.items()}
    log.info("sacrebleu %s", " | ".join(signatures.values()))
    return scores, signatures


class TranslationTask:
    """The :class:`seqzoo.training.trainer.Task` for character-level translation (module docstring).

    ``pairs`` maps split names to ``(source, target)`` sentence pairs; it may be empty when
    ``vocab`` is given (a model loaded only to translate).
    """

    metric = "bleu"
    higher_is_better = True

    def __init__(self, config: RunConfig, pairs: dict[str, list[tuple[str, str]]], vocab: Vocab | None = None) -> None:
        if pairs and importlib.util.find_spec("sacrebleu") is None:  # fail now, not after the first epoch
            raise ConfigError("task translation scores BLEU and chrF with sacrebleu: pip install 'seqzoo[bleu]'")
        self.config = config
        data: TranslationDataConfig = config.data
        self.vocab = vocab or build_char_vocab((text for pair in pairs["train"] for text in pair), data.min_freq)
        self.bos_id, self.eos_id = self.vocab.token_to_id(BOS), self.vocab.token_to_id(EOS)
        self.pairs = pairs
        self.signatures: dict[str, str] = {}  # sacrebleu's, from the last evaluation
        self.ids = {split: [(self.vocab.encode(s), self.vocab.encode(t)) for s, t in p] for split, p in pairs.items()}
        with names_config_errors("model"):
            arguments = with_recipe_arguments(
                config.model.encoder_args,
                vocab_size=len(self.vocab),
                embedding_dim=data.embedding_dim,
                dropout=config.model.dropout,
                pad_id=self.vocab.pad_id,
            )
            self.model = build_seq2seq(config.model.encoder, **arguments)
        self.device = resolve_device(config.train.device)
        self.model.to(self.device)

    def _batch(self, split: str, indices: list[int]) -> tuple[Tensor, ...]:
        """src, src_mask, decoder input (``<bos>`` + target), its mask, output (target + ``<eos>``)."""
        pairs = [self.ids[split][i] for i in indices]
        src, src_mask = pad_batch([s for s, _ in pairs])
        tgt_in, tgt_mask = pad_batch([[self.bos_id, *t] for _, t in pairs])
        tgt_out, _ = pad_batch([[*t, self.eos_id] for _, t in pairs])
        return tuple(t.to(self.device) for t in (src, src_mask, tgt_in, tgt_mask, tgt_out))

    def train_batches(self, epoch: int) -> list[list[int]]:
        lengths = [max(len(s), len(t)) for s, t in self.ids["train"]]
        seed = epoch_seed(self.config.train.seed, epoch)
        return bucket_batches(lengths, self.config.train.batch_size, shuffle=True, seed=seed)

    def _nll(self, split: str, indices: list[int]) -> tuple[Tensor, int, int]:
        """Summed target NLL of a batch, its target count and its token count (both sides)."""
        src, src_mask, tgt_in, tgt_mask, tgt_out = self._batch(split, indices)
        logits = self.model(src, src_mask, tgt_in, tgt_mask)  # (B, T, V)
        nll = F.cross_entropy(logits.flatten(0, 1), tgt_out.flatten(), ignore_index=self.vocab.pad_id, reduction="sum")
        targets = int(tgt_mask.sum())
        return nll, targets, targets + int(src_mask.sum())

    def train_loss(self, batch: list[int]) -> StepLoss:
        nll, targets, tokens = self._nll("train", batch)
        return StepLoss(nll / targets, tokens, targets)

    def evaluate(self, split: str) -> dict[str, float]:
        """``loss`` (teacher-forced NLL per target character), ``bleu`` and ``chrf`` of the beam output."""
        if split not in self.ids:
            raise ValueError(f"split {split!r} is not loaded (loaded: {', '.join(self.ids) or 'none'})")
        size = self.config.train.eval_batch_size
        nll, targets = 0.0, 0
        with module_mode(self.model, training=False), torch.no_grad():
            for indices in bucket_batches([len(t) for _, t in self.ids[split]], size, shuffle=False):
                batch_nll, batch_targets, _ = self._nll(split, indices)
                nll, targets = nll + float(batch_nll), targets + batch_targets
        sources, references = zip(*self.pairs[split], strict=True)
        scores, self.signatures = corpus_scores(self.translate(list(sources)), list(references))
        return {"loss": nll / targets, **scores}

    def translate(self, texts: list[str], beam_size: int | None = None, alpha: float | None = None) -> list[str]:
        """Beam-search translations of raw source sentences, in input order; a source longer than
        ``data.max_source_chars`` is a :class:`DataError` with its (1-based) position as ``line``."""
        data: TranslationDataConfig = self.config.data
        for line, text in enumerate(texts, 1):
            if len(text) > data.max_source_chars:
                message = f"a source of {len(text)} characters, more than data.max_source_chars={data.max_source_chars}"
                raise DataError(message, line=line)
        ids = [self.vocab.encode(text) for text in texts]
        out: list[str] = [""] * len(texts)
        for indices in bucket_batches([len(s) for s in ids], self.config.train.eval_batch_size, shuffle=False):
            src, src_mask = pad_batch([ids[i] for i in indices])
            best = beam_search(
                self.model,
                src.to(self.device),
                src_mask.to(self.device),
                self.bos_id,
                self.eos_id,
                beam_size or data.beam_size,
                data.length_alpha if alpha is None else alpha,
                banned=[self.vocab.unk_id],  # it would print as the five characters "<unk>"
                max_output=data.max_output_chars,
            )
            for i, hypothesis in zip(indices, best, strict=True):
                out[i] = "".join(self.vocab.decode(hypothesis))
        return out

    def predict(self, texts: list[str]) -> list[dict[str, Any]]:
        """``seqzoo predict``: one ``{"translation": ...}`` per source sentence."""
        return [{"translation": t} for t in self.translate(texts)]

    def documents(self) -> dict[str, Any]:
        """The vocabulary, and sacrebleu's signatures of the BLEU and chrF reported (TASKS.md)."""
        return {"vocab.json": self.vocab.to_dict(), "sacrebleu.json": self.signatures}


def build_tasks(config: RunConfig) -> list[tuple[str, TranslationTask]]:
    return [("", TranslationTask(config, read_splits(config.data)))]


def load_trained(config: RunConfig, best: Path, with_data: bool = True) -> TranslationTask:
    """Rebuild a trained translation model from a ``best/`` checkpoint directory."""
    pairs = read_splits(config.data) if with_data else {}
    return restore(best, lambda checkpoint: TranslationTask(config, pairs, vocab=checkpoint.vocab()))


def _inert_keys(config: RunConfig) -> dict[str, str]:
    if config.data.beam_size != 1:
        return {}
    return {"data.length_alpha": "greedy decoding (data.beam_size 1) ranks a single hypothesis"}


register_task(
    "translation",
    data_config=TranslationDataConfig,
    model_keys={"encoder", "encoder_args", "dropout"},
    build_tasks=build_tasks,
    load_trained=load_trained,
    inert_keys=_inert_keys,
)
