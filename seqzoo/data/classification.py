"""Text classification data in the Fudan multi-task format (``LABEL<TAB>TEXT`` per line).

A task lives in a directory as ``<task>.train``, ``<task>.dev``, ``<task>.test`` (each may
be gzipped: ``<task>.train.gz``). :class:`ClassificationData` loads them; when the dev split
is missing it holds out a stratified 10% of train, and when the test split is missing the
evaluation protocol is k-fold cross-validation (:meth:`ClassificationData.folds`,
:func:`kfold_splits`).
"""

from __future__ import annotations

import random
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field, replace
from importlib.resources import files
from os import PathLike
from pathlib import Path
from typing import Any

from seqzoo.data.errors import DataError
from seqzoo.data.io import find_file, open_text, unset_variable_hint

__all__ = [
    "ClassificationData",
    "LabelSet",
    "LabeledText",
    "bundled_corpus_dir",
    "find_split",
    "holdout_split",
    "kfold_splits",
    "read_labeled",
]

SPLITS = ("train", "dev", "test")


@dataclass(frozen=True)
class LabeledText:
    """One example: its label, its text, and the file and 1-based line it was read from."""

    label: str
    text: str
    line: int
    path: str | None = None


def read_labeled(path: str | PathLike[str]) -> list[LabeledText]:
    """Read a ``LABEL<TAB>TEXT`` file (``.gz`` aware, strict UTF-8).

    The line holds one tab; label and text are stripped of surrounding whitespace and must
    both be non-empty (so blank lines are errors; a second tab, as in a file with more
    columns, is an error too rather than part of the text). Any problem raises
    :class:`DataError` naming the file and line; an empty file is an error too.
    """
    examples = []
    with open_text(path) as lines:
        for line in lines:
            label, tab, text = line.partition("\t")
            label, text = label.strip(), text.strip()
            if not line.strip():
                raise lines.error("blank line: expected LABEL<TAB>TEXT")
            if not tab:
                raise lines.error("missing tab: expected LABEL<TAB>TEXT")
            if "\t" in text:
                raise lines.error("a second tab: expected LABEL<TAB>TEXT, a text without tabs")
            if not label:
                raise lines.error("empty label")
            if not text:
                raise lines.error("empty text")
            examples.append(LabeledText(label, text, lines.line, str(path)))
    if not examples:
        raise DataError("empty file: no examples", path)
    return examples


class LabelSet:
    """The label inventory of a task: sorted label strings <-> ids 0..n-1."""

    def __init__(self, labels: Iterable[str]) -> None:
        self.labels: tuple[str, ...] = tuple(sorted(set(labels)))
        if not self.labels:
            raise ValueError("a label set needs at least one label")
        self._index = {label: i for i, label in enumerate(self.labels)}

    def encode(self, label: str, path: str | PathLike[str] | None = None, line: int | None = None) -> int:
        """The id of ``label``; an unknown label raises :class:`DataError` at ``path``:``line``."""
        try:
            return self._index[label]
        except KeyError:
            hint = " (a header line? the files have none)" if line == 1 else ""
            raise DataError(f"unknown label {label!r}{hint} (known: {', '.join(self.labels)})", path, line) from None

    def decode(self, i: int) -> str:
        return self.labels[i]

    def __len__(self) -> int:
        return len(self.labels)

    def __iter__(self) -> Iterator[str]:
        return iter(self.labels)

    def __contains__(self, label: object) -> bool:
        return label in self._index

    def __eq__(self, other: object) -> bool:
        return isinstance(other, LabelSet) and self.labels == other.labels

    def __repr__(self) -> str:
        return f"LabelSet({list(self.labels)!r})"

    def to_dict(self) -> dict[str, Any]:
        return {"labels": list(self.labels)}

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> LabelSet:
        labels = d.get("labels")
        if not (isinstance(labels, list) and all(isinstance(label, str) for label in labels)):
            raise ValueError("label set 'labels' must be a list of strings")
        return cls(labels)


def _refuse_header_line(train: Sequence[LabeledText], every: Sequence[LabeledText]) -> None:
    """A DataError if train's first line looks like a header: its label occurs nowhere else
    in any split, so it would become a class of one example."""
    first = train[0]
    if len(train) > 1 and sum(ex.label == first.label for ex in every) == 1:
        raise DataError(
            f"label {first.label!r} occurs only here, which would make it a class of one example:"
            " a header line? the format has none (remove it)",
            first.path,
            first.line,
        )


def find_split(data_dir: str | PathLike[str], task: str, split: str) -> Path | None:
    """``data_dir/task.split`` or ``data_dir/task.split.gz``, whichever exists (None if neither)."""
    return find_file(data_dir, f"{task}.{split}")


def bundled_corpus_dir() -> Path:
    """Directory of the bundled ``movie_snippets`` task (Hutto & Gilbert 2014, MIT license).

    Load it with ``ClassificationData.from_dir(bundled_corpus_dir(), "movie_snippets")``.
    """
    path = Path(str(files("seqzoo").joinpath("resources", "movie_snippets")))
    if not path.is_dir():
        raise FileNotFoundError(f"bundled corpus not found at {path}; is seqzoo installed with its package data?")
    return path


def _positions_by_label(labels: Sequence[str], rng: random.Random) -> list[list[int]]:
    """Positions of each label (labels in sorted order), each list shuffled by ``rng``."""
    groups: dict[str, list[int]] = {}
    for i, label in enumerate(labels):
        groups.setdefault(label, []).append(i)
    shuffled = []
    for label in sorted(groups):
        rng.shuffle(groups[label])
        shuffled.append(groups[label])
    return shuffled


def holdout_split(
    examples: Sequence[LabeledText], fraction: float, seed: int
) -> tuple[list[LabeledText], list[LabeledText]]:
    """Stratified split of ``examples`` into (kept, held_out), e.g. (train, dev).

    Per label (sorted), positions are shuffled with ``random.Random(seed)`` and the first
    ``floor(fraction * n + 0.5)`` are held out (the rule of the data README). Both lists
    keep the input order.
    """
    if not 0.0 < fraction < 1.0:
        raise ValueError(f"fraction must be in (0, 1), got {fraction}")
    groups = _positions_by_label([ex.label for ex in examples], random.Random(seed))
    held = {i for group in groups for i in group[: int(fraction * len(group) + 0.5)]}
    if not held:
        raise ValueError(f"{len(examples)} examples are too few to hold out {fraction:.0%} per label")
    return [ex for i, ex in enumerate(examples) if i not in held], [ex for i, ex in enumerate(examples) if i in held]


def kfold_splits(
    n_examples: int, k: int, seed: int, labels: Sequence[str] | None = None
) -> list[tuple[list[int], list[int]]]:
    """``k`` (train, test) position lists for k-fold cross-validation; every position is tested once.

    Positions are shuffled with ``random.Random(seed)`` and dealt to the folds in turn, so
    fold sizes differ by at most one. With ``labels`` the folds are stratified: each label's
    positions (labels in sorted order) are dealt in turn, continuing where the previous
    label stopped, so every fold has (nearly) the label distribution of the whole set.
    """
    if not 2 <= k <= n_examples:
        raise ValueError(f"k must be in [2, n_examples={n_examples}], got {k}")
    rng = random.Random(seed)
    if labels is None:
        order = list(range(n_examples))
        rng.shuffle(order)
    else:
        if len(labels) != n_examples:
            raise ValueError(f"got {len(labels)} labels for {n_examples} examples")
        order = [i for group in _positions_by_label(labels, rng) for i in group]
    folds = [sorted(order[f::k]) for f in range(k)]
    return [(sorted(i for g, fold in enumerate(folds) if g != f for i in fold), folds[f]) for f in range(k)]


@dataclass
class ClassificationData:
    """The train/dev/test examples of one task, with its label set (taken from train).

    ``test`` is None when the task has no test split: evaluate with :meth:`folds` then.
    ``sources`` says where each split came from (a file path or how it was derived); every
    example keeps the file and line it was read from.
    """

    task: str
    train: list[LabeledText]
    dev: list[LabeledText]
    test: list[LabeledText] | None
    labels: LabelSet
    sources: dict[str, str] = field(default_factory=dict)

    @classmethod
    def from_dir(
        cls,
        data_dir: str | PathLike[str],
        task: str,
        *,
        labels: LabelSet | None = None,
        dev_fraction: float = 0.1,
        seed: int = 13,
    ) -> ClassificationData:
        """Load ``task`` from ``data_dir`` (see :func:`find_split`); only the train split is required."""
        paths = {split: find_split(data_dir, task, split) for split in SPLITS}
        if paths["train"] is None:
            raise DataError(f"no {task}.train or {task}.train.gz{unset_variable_hint(data_dir)}", data_dir)
        return cls.from_files(
            paths["train"], paths["dev"], paths["test"], task=task, labels=labels, dev_fraction=dev_fraction, seed=seed
        )

    @classmethod
    def from_files(
        cls,
        train: str | PathLike[str],
        dev: str | PathLike[str] | None = None,
        test: str | PathLike[str] | None = None,
        *,
        task: str | None = None,
        labels: LabelSet | None = None,
        dev_fraction: float = 0.1,
        seed: int = 13,
    ) -> ClassificationData:
        """Load explicit split files. Without ``dev``, a stratified ``dev_fraction`` of train is held out.

        The label set is ``labels`` or else the labels of train; a dev or test label outside
        it raises :class:`DataError` at its file and line, and so does a first training line
        whose label occurs nowhere else (a header line: the format has none).
        """
        train_examples = read_labeled(train)
        labels = labels if labels is not None else LabelSet(ex.label for ex in train_examples)
        splits: dict[str, list[LabeledText] | None] = {"train": train_examples, "dev": None, "test": None}
        sources = {"train": str(train)}
        for split, path in (("dev", dev), ("test", test)):
            if path is not None:
                splits[split] = read_labeled(path)
                sources[split] = str(path)
        _refuse_header_line(train_examples, [ex for examples in splits.values() for ex in examples or ()])
        for examples in splits.values():
            for ex in examples or ():
                labels.encode(ex.label, ex.path, ex.line)
        if dev is None:
            try:
                splits["train"], splits["dev"] = holdout_split(train_examples, dev_fraction, seed)
            except ValueError as err:
                raise DataError(f"no dev file and {err}", train) from None
            sources["dev"] = f"{dev_fraction:.0%} of {train} held out (stratified, seed {seed})"
        return cls(
            task or Path(train).name.split(".")[0], splits["train"], splits["dev"], splits["test"], labels, sources
        )

    def folds(self, k: int = 5, seed: int = 13) -> list[ClassificationData]:
        """Stratified k-fold cross-validation over ``train``: fold f is the test set of the f-th copy.

        ``dev`` is shared by all folds (it was held out before the folds were drawn).
        """
        if self.test is not None:
            raise ValueError(f"task {self.task!r} has a test split; k-fold cross-validation is for tasks without one")
        try:
            splits = kfold_splits(len(self.train), k, seed, [ex.label for ex in self.train])
        except ValueError as err:
            raise DataError(
                f"{len(self.train)} training examples cannot make {k} folds ({err})", self.sources["train"]
            ) from None
        return [
            replace(
                self,
                train=[self.train[i] for i in train_idx],
                test=[self.train[i] for i in test_idx],
                sources={**self.sources, "test": f"fold {f + 1}/{k} of train (stratified, seed {seed})"},
            )
            for f, (train_idx, test_idx) in enumerate(splits)
        ]
