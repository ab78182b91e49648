"""Run a config end to end: seeds x folds sub-runs, each trained by :class:`seqzoo.training.trainer.Trainer`,
then a ``summary.json`` with mean ± std of every test metric."""

from __future__ import annotations

import dataclasses
import importlib
import json
import logging
import os
import re
import zlib
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import yaml

from seqzoo.config import DATA_PATHS, ConfigError, RunConfig, apply_override, config_from_dict, config_to_dict
from seqzoo.data.errors import DataError
from seqzoo.data.io import atomic_write_text, read_json, read_text, write_json
from seqzoo.training.checkpoint import resolve_checkpoint
from seqzoo.training.devices import set_seed, set_threads
from seqzoo.training.distributed import global_batch_config, is_main, main_rank_lock
from seqzoo.training.rundir import check_run_dir
from seqzoo.training.stats import per_seed, summarize
from seqzoo.training.trainer import Trainer, stop_reason

__all__ = ["completed_test_record", "find_runs", "load_task", "per_seed", "run", "run_root", "summarize"]

log = logging.getLogger("seqzoo")

_TASK_MODULES = {
    "classification": "seqzoo.tasks.classification",
    "lm": "seqzoo.tasks.lm",
    "absa": "seqzoo.tasks.absa",
    "translation": "seqzoo.tasks.translation",
}


def task_module(task: str) -> Any:
    """The module implementing ``task`` (its ``build_tasks`` and ``load_trained``)."""
    return importlib.import_module(_TASK_MODULES[task])


def completed_test_record(run_dir: Path) -> dict[str, Any] | None:
    """The ``test`` record of a finished run, else None. A last line cut short (a run killed while
    writing it; resuming drops it) is no record; any other malformed line is a :class:`DataError`."""
    path = run_dir / "metrics.jsonl"
    if not path.exists():
        return None
    lines = read_text(path).splitlines()
    for number, line in enumerate(lines, 1):
        try:
            record = json.loads(line) if line.strip() else {}
        except json.JSONDecodeError as err:
            if number == len(lines):
                return None
            raise DataError(f"invalid JSON: {err.msg}", path, number) from None
        if record.get("event") == "test":
            return record
    return None


def run(config: RunConfig, run_dir: str | Path, resume: bool = False) -> dict[str, Any]:
    """Train every (seed, fold) of ``config`` under ``run_dir`` and return the summary.

    ``run_dir`` is locked while it trains (:func:`seqzoo.training.rundir.run_lock`): a second process asked to
    train in it stops with a :class:`ConfigError` before it writes anything there.
    """
    run_dir = Path(run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    with main_rank_lock(run_dir):  # data-parallel runs: rank 0 locks and writes (seqzoo.training.distributed)
        return _run_locked(config, run_dir, resume)


def _run_locked(config: RunConfig, run_dir: Path, resume: bool) -> dict[str, Any]:
    resolved = yaml.safe_dump(config_to_dict(config), sort_keys=False)
    if is_main():
        atomic_write_text(run_dir / "config.yaml", resolved)  # what `seqzoo train --resume` reads
    set_threads(config.train)
    seeds = config.train.seeds or [config.train.seed]
    module = task_module(config.task)
    results: dict[str, dict[str, Any]] = {}
    for seed in seeds:
        cfg = dataclasses.replace(config, train=dataclasses.replace(config.train, seed=seed, seeds=[]))
        seed_dir = run_dir / f"seed-{seed}" if len(seeds) > 1 else run_dir
        set_seed(seed)
        for sub, task in module.build_tasks(global_batch_config(cfg)):  # each rank trains on its part of a batch
            sub_dir = seed_dir / sub if sub else seed_dir
            check_run_dir(sub_dir)  # each sub-run writes; none into a directory that is no longer this run
            name = str(sub_dir.relative_to(run_dir)) if sub_dir != run_dir else "."
            done = completed_test_record(sub_dir) if resume else None
            best = resolve_checkpoint(sub_dir / "best") if resume else None
            if best is not None and is_main():  # a --resume --set may have moved the data: `seqzoo evaluate` reads this
                write_json(best / "config.json", config_to_dict(cfg))
            if done is not None:
                reason = stop_reason(sub_dir, cfg)
                if reason is None:
                    log.info("%s: the config lets it train on", sub_dir)
                    done = None
                else:
                    log.info("%s is finished (%s); reporting its test result", sub_dir, reason)
            if done is None:
                log.info("training %s (seed %d) -> %s", config.name, seed, sub_dir)
                if sub:  # each fold's draws start from a seed of its own, not from where the folds before it
                    set_seed(zlib.crc32(f"{seed}/{sub}".encode()))  # left them: a resume may skip those
                Trainer(cfg, task, sub_dir).fit(resume=resume)
                check_run_dir(sub_dir)
                done = completed_test_record(sub_dir)
            results[name] = {k: v for k, v in done.items() if k.startswith("test_")}
    summary = summarize(results)
    check_run_dir(run_dir)
    if is_main():
        write_json(run_dir / "summary.json", summary)
    return summary


def format_summary(summary: dict[str, Any]) -> list[str]:
    """One line per test metric: ``mean ± std (n=seeds)``; a single seed has no spread to show.

    Accuracies in % with 2 decimals, counts (integers in every run, e.g. tokens, with an integral
    mean and spread) as integers,
    everything else (BPC, perplexity, BLEU, losses) with 3 decimals, the resolution at which models
    are compared.
    """
    lines = []
    for key, s in summary["metrics"].items():
        scale, unit, decimals = (100.0, "%", 2) if "accuracy" in key else (1.0, "", 3)
        counts = all(isinstance(run[key], int) for run in summary["runs"].values() if key in run)
        integral = all(float(s[k]).is_integer() for k in ("mean", "std") if s[k] is not None)  # fold means may not be
        if counts and integral:
            decimals = 0
        spread = f" ± {s['std'] * scale:.{decimals}f}{unit}" if s["n"] > 1 else ""
        lines.append(f"{key}: {s['mean'] * scale:.{decimals}f}{unit}{spread} (n={s['n']})")
    return lines


def find_runs(run_dir: str | Path) -> list[Path]:
    """Every sub-run directory below ``run_dir`` that holds a ``best/`` checkpoint."""
    found = []
    for parent, dirs, _ in os.walk(run_dir):  # unlike rglob, not thrown by a checkpoint swapped meanwhile
        if ("best" in dirs or "best.old" in dirs) and resolve_checkpoint(Path(parent) / "best"):
            found.append(Path(parent))
    return sorted(found)


def run_root(sub_run: Path) -> Path:
    """The run directory ``sub_run`` belongs to: ``sub_run`` without its ``fold-K`` and ``seed-N``
    parts (the layout :func:`run` writes), so that runs found below one folder are told apart."""
    if re.fullmatch(r"fold-\d+", sub_run.name):
        sub_run = sub_run.parent
    if re.fullmatch(r"seed-\d+", sub_run.name):
        sub_run = sub_run.parent
    return sub_run


def load_task(sub_run: str | Path, with_data: bool = True, data_paths: Sequence[str] = ()) -> Any:
    """Rebuild a trained task from ``sub_run/best`` (safetensors + JSON; nothing is unpickled).

    ``data_paths``: ``key=value`` overrides of where the data lies (:data:`~seqzoo.config.DATA_PATHS`),
    for a run whose data has moved since training, and of ``train.device`` (e.g. a run trained on a
    GPU evaluated on the CPU); other keys are a :class:`ConfigError`.
    """
    best = resolve_checkpoint(Path(sub_run) / "best")
    if best is None:
        raise FileNotFoundError(f"{sub_run}: no best/ checkpoint")
    values = read_json(best / "config.json")
    for assignment in data_paths:
        if assignment.split("=", 1)[0].strip() not in (*DATA_PATHS, "train.device"):
            paths = ", ".join(DATA_PATHS)
            raise ConfigError(
                f"--set {assignment}: a trained run can only be pointed at its data ({paths}) or device (train.device)"
            )
        apply_override(values, assignment)
    config = config_from_dict(values)
    return task_module(config.task).load_trained(config, best, with_data=with_data)
