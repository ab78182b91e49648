"""Checkpoints as plain files: ``model.safetensors`` + JSON, never pickled code.

A checkpoint is a directory. It is written next to its final place and swapped in with
renames, so a crash at any moment leaves either the old or the new checkpoint complete
(``{dir}.old`` is picked up by :func:`resolve_checkpoint` if the crash fell between the two
renames).

Training state is stored the same way (``last/``): ``model``, ``optimizer``, ``rng`` and
``extra`` (task state) ``.safetensors`` files for the tensors, ``train_state.json`` for the loop
counters and the tensors' places in the optimiser's state.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path
from typing import Any

import torch
from safetensors import SafetensorError
from safetensors.torch import load_file, save_file

from seqzoo.data.errors import DataError
from seqzoo.data.io import require_regular

__all__ = [
    "join_tensors",
    "load_tensors",
    "load_weights",
    "resolve_checkpoint",
    "save_checkpoint_dir",
    "split_tensors",
]


def split_tensors(tree: Any, prefix: str = "") -> tuple[Any, dict[str, torch.Tensor]]:
    """Replace every tensor in a nested dict/list by a ``{"__tensor__": key}`` reference.

    Returns the JSON-able skeleton and the flat ``{key: tensor}`` dict for safetensors.
    """
    tensors: dict[str, torch.Tensor] = {}

    def walk(node: Any, path: str) -> Any:
        if isinstance(node, torch.Tensor):
            tensors[path] = node.detach().cpu().contiguous()
            return {"__tensor__": path}
        if isinstance(node, dict):
            return {str(k): walk(v, f"{path}.{k}" if path else str(k)) for k, v in node.items()}
        if isinstance(node, (list, tuple)):
            return [walk(v, f"{path}.{i}" if path else str(i)) for i, v in enumerate(node)]
        return node

    return walk(tree, prefix), tensors


def join_tensors(skeleton: Any, tensors: dict[str, torch.Tensor]) -> Any:
    """Inverse of :func:`split_tensors` (dict keys come back as strings)."""
    if isinstance(skeleton, dict):
        if set(skeleton) == {"__tensor__"}:
            return tensors[skeleton["__tensor__"]]
        return {k: join_tensors(v, tensors) for k, v in skeleton.items()}
    if isinstance(skeleton, list):
        return [join_tensors(v, tensors) for v in skeleton]
    return skeleton


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def save_checkpoint_dir(
    directory: str | Path,
    tensors: dict[str, dict[str, torch.Tensor]],
    documents: dict[str, Any],
) -> Path:
    """Atomically (re)write checkpoint ``directory``.

    ``tensors`` maps file stems to flat tensor dicts (written as ``{stem}.safetensors``),
    ``documents`` maps file names to JSON-able objects (or ``str`` for verbatim text).
    """
    directory = Path(directory)
    tmp = directory.with_name(directory.name + ".tmp")
    old = directory.with_name(directory.name + ".old")
    shutil.rmtree(tmp, ignore_errors=True)
    try:
        tmp.mkdir(parents=True)
        for stem, flat in tensors.items():
            save_file(flat, str(tmp / f"{stem}.safetensors"))
        for name, content in documents.items():
            text = content if isinstance(content, str) else json.dumps(content, indent=2, sort_keys=True)
            (tmp / name).write_text(text, encoding="utf-8")
        for child in tmp.iterdir():
            with open(child, "rb") as handle:
                os.fsync(handle.fileno())
        _fsync_dir(tmp)
    except OSError as err:  # a full disk, a quota: the half-written copy goes, the complete one stays
        shutil.rmtree(tmp, ignore_errors=True)
        code = err.errno if err.errno is not None else next(iter(err.args), None)
        reason = err.strerror or (os.strerror(code) if isinstance(code, int) else str(err))
        kept = "the previous checkpoint is kept" if directory.exists() else "no earlier checkpoint exists"
        raise OSError(code, f"{directory}: cannot write the checkpoint ({reason}); {kept}") from None
    if directory.exists():
        shutil.rmtree(old, ignore_errors=True)
        os.replace(directory, old)
    os.replace(tmp, directory)
    _fsync_dir(directory.parent)
    shutil.rmtree(old, ignore_errors=True)
    return directory


def resolve_checkpoint(directory: str | Path) -> Path | None:
    """The complete checkpoint at ``directory`` (or its ``.old`` twin after a crash), else None."""
    directory = Path(directory)
    for candidate in (directory, directory.with_name(directory.name + ".old")):
        try:  # a checkpoint being swapped by a training may vanish between the two looks
            if any(entry.name.endswith(".safetensors") for entry in os.scandir(candidate)):
                return candidate
        except (FileNotFoundError, NotADirectoryError):
            continue
    return None


def load_tensors(path: str | Path) -> dict[str, torch.Tensor]:
    """Load a safetensors file (no code is ever unpickled); a corrupt or truncated one is a
    :class:`DataError` naming the file (a missing one the usual :class:`FileNotFoundError`)."""
    try:
        return load_file(str(require_regular(path)))  # never a device or FIFO, which may not end
    except SafetensorError as err:
        raise DataError(f"corrupt or truncated safetensors file ({err})", path) from None


def load_weights(model: torch.nn.Module, path: str | Path, tensors: dict[str, torch.Tensor] | None = None) -> None:
    """Load the ``model.safetensors`` at ``path`` (or its ``tensors``, already read) into ``model``.

    Weights that do not fit the model (a ``config.json`` edited by hand, a checkpoint of another
    layout) are a :class:`DataError` naming the file and the first mismatches, not torch's traceback.
    """
    try:
        model.load_state_dict(load_tensors(path) if tensors is None else tensors)
    except RuntimeError as err:
        problems = [line.strip() for line in str(err).splitlines()[1:] if line.strip()]
        detail = "; ".join(problems)[:400] or str(err)
        raise DataError(f"the weights do not fit the model its config describes ({detail})", path) from None
