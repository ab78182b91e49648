"""``seqzoo.load(RUN_DIR)``: a trained run as one object that predicts, samples and evaluates.

A run directory may hold several trained models: one per seed (``seed-N/``), per fold (``fold-K/``)
and per stage (``STAGE/``). :func:`load` picks one: ``stage`` defaults to the run's last stage,
while among several seeds or folds it refuses to guess and lists them, to be chosen with ``seed=`` /
``fold=`` (a folder given directly, e.g. ``RUN/seed-2``, is one model).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from torch import nn

from seqzoo.config import RunConfig, load_config
from seqzoo.training.registry import get_task
from seqzoo.training.runner import find_runs, load_task

__all__ = ["TrainedModel", "last_stage", "load"]


class TrainedModel:
    """One trained model of a run (its ``best/`` checkpoint), as :func:`load` returns it.

    ``task`` is the recipe's task object, ``model`` its whole model, ``encoder`` the trained sequence
    encoder inside it, ``config`` the config it was trained with, ``path`` its sub-run directory.
    """

    def __init__(self, path: Path, task: Any, data_paths: Sequence[str] = ()) -> None:
        self.path, self.task, self._data_paths = path, task, tuple(data_paths)
        self._with_data = False

    @property
    def config(self) -> RunConfig:
        return self.task.config

    @property
    def model(self) -> nn.Module:
        return self.task.model

    @property
    def encoder(self) -> nn.Module:
        return self.task.model.encoder

    def predict(self, texts: Sequence[str]) -> list[dict[str, Any]]:
        """One record per text: its ``label`` and ``probabilities`` (a classifier; aspect sentiment reads
        ``sentence<TAB>aspect term``), or its ``translation``; a task that predicts nothing raises ``TypeError``."""
        if not hasattr(self.task, "predict"):
            raise TypeError(f"{self.path}: a {self.config.task} model does not predict (see its capabilities)")
        return self.task.predict(list(texts))

    def sample(
        self, length: int = 200, temperature: float = 1.0, prime: str = "", seed: int = 0, top_p: float = 1.0
    ) -> str:
        """Text drawn from a language model (``seqzoo sample``); other tasks raise ``TypeError``."""
        sample = get_task(self.config.task).capabilities.get("sample")
        if sample is None:
            raise TypeError(f"{self.path}: a {self.config.task} model does not sample")
        return sample(self.task, length, temperature, prime, seed, top_p)

    def evaluate(self, split: str = "test") -> dict[str, float]:
        """The model's metrics on ``split`` of its data (read on the first call; ``data_paths`` of
        :func:`load` say where it lies now, if it has moved)."""
        if not self._with_data:
            self.task = load_task(self.path, with_data=True, data_paths=self._data_paths)
            self._with_data = True
        return self.task.evaluate(split)

    def __repr__(self) -> str:
        return f"TrainedModel({str(self.path)!r}, task={self.config.task!r}, encoder={self.config.model.encoder!r})"


def last_stage(run_dir: Path) -> str | None:
    """The name of the last stage where ``run_dir`` is a staged run, else None."""
    stored = run_dir / "config.yaml"
    if not stored.is_file():
        return None
    stages = load_config(stored, resolved=True).stages
    return stages[-1].name if stages else None


def load(
    run_dir: str | Path,
    *,
    seed: int | None = None,
    fold: int | None = None,
    stage: str | None = None,
    data_paths: Sequence[str] = (),
) -> TrainedModel:
    """The trained model of ``run_dir`` (see the module docstring for which one), ready to predict.

    ``data_paths``: ``key=value`` overrides of where the run's data lies now (``data.data_dir=DIR``, ...)
    and of ``train.device``, as ``seqzoo evaluate --set`` takes them. No data is read until
    :meth:`TrainedModel.evaluate`. A choice that leaves no model, or several, is a ``ValueError``
    naming the models there.
    """
    root = Path(run_dir)
    stage = stage if stage is not None else last_stage(root)
    if stage is not None:
        root = root / stage
    runs = find_runs(root)
    if not runs:
        raise FileNotFoundError(f"{root}: no trained model (no best/ checkpoint) below this directory")
    wanted = {f"{part}-{value}" for part, value in (("seed", seed), ("fold", fold)) if value is not None}
    chosen = [run for run in runs if wanted <= set(run.relative_to(root).parts)]
    if len(chosen) != 1:
        names = ", ".join(str(run.relative_to(root)) for run in runs)
        problem = "none matches" if not chosen else "it holds several: pass seed= and/or fold="
        raise ValueError(f"{root}: {problem} (trained models: {names})")
    return TrainedModel(chosen[0], load_task(chosen[0], with_data=False, data_paths=data_paths), data_paths)
