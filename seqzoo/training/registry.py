"""The task registry: each training recipe registers itself under a name (``task:`` in a config).

A task is one module that calls :func:`register_task` at import time with

- ``data_config``: the dataclass of its ``data:`` section (validated like every config section);
- ``model_keys``: the ``model.*`` keys it reads (the others are refused as having no effect);
- ``build_tasks(config) -> [(sub_run, task), ...]``: the :class:`~seqzoo.training.task.Task` objects a run
  trains, ``""`` for a single sub-run or e.g. ``"fold-1"``;
- ``load_trained(config, best, with_data) -> task``: a trained task rebuilt from a ``best/`` checkpoint;
- optionally ``inert_keys(config) -> {dotted key: reason}``: its own keys that have no effect under
  ``config``, and ``capabilities``: named functions of a loaded task that commands other than
  train/evaluate/predict use (``"sample"``, ``"length_buckets"``, ...).

The built-in tasks live in :mod:`seqzoo.tasks`, imported on the first lookup, so that the config, the
runner and the CLI name no task; a task of one's own registers from any module imported before the
lookup (``seqzoo --import MODULE train ...``).
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from seqzoo.config import RunConfig
    from seqzoo.training.task import Task

__all__ = ["TaskSpec", "available_tasks", "get_task", "register_task"]


@dataclass(frozen=True)
class TaskSpec:
    """What a registered task gives the config, the runner and the CLI (module docstring)."""

    name: str
    data_config: type
    model_keys: frozenset[str]
    build_tasks: Callable[[RunConfig], list[tuple[str, Task]]]
    load_trained: Callable[[RunConfig, Path, bool], Task]
    inert_keys: Callable[[RunConfig], dict[str, str]] = lambda config: {}
    capabilities: Mapping[str, Callable[..., Any]] = field(default_factory=dict)


_TASKS: dict[str, TaskSpec] = {}
_BUILT_INS = "seqzoo.tasks"


def register_task(
    name: str,
    *,
    data_config: type,
    model_keys: set[str] | frozenset[str],
    build_tasks: Callable[[RunConfig], list[tuple[str, Task]]],
    load_trained: Callable[[RunConfig, Path, bool], Task],
    inert_keys: Callable[[RunConfig], dict[str, str]] | None = None,
    capabilities: Mapping[str, Callable[..., Any]] | None = None,
) -> TaskSpec:
    """Register a task under ``name``; registering the same module's task again (a re-import) replaces it,
    while a name taken by a task of another module is a ``ValueError``."""
    spec = TaskSpec(
        name, data_config, frozenset(model_keys), build_tasks, load_trained,
        inert_keys or TaskSpec.inert_keys, dict(capabilities or {}),
    )  # fmt: skip
    held = _TASKS.get(name)
    if held is not None and held.build_tasks.__module__ != build_tasks.__module__:
        raise ValueError(f"task {name!r} is already registered by {held.build_tasks.__module__}")
    _TASKS[name] = spec
    return spec


def _load_built_ins() -> None:
    importlib.import_module(_BUILT_INS)  # its modules register themselves


def get_task(name: str) -> TaskSpec:
    """The task registered as ``name``; an unknown name is a ``KeyError`` listing the registered ones."""
    _load_built_ins()
    if name not in _TASKS:
        raise KeyError(f"{name!r} is not one of {', '.join(map(repr, available_tasks()))}")
    return _TASKS[name]


def available_tasks() -> list[str]:
    """The registered task names, built-in ones included."""
    _load_built_ins()
    return sorted(_TASKS)
