"""Run a config end to end: seeds x folds sub-runs, each trained by :class:`seqzoo.training.trainer.Trainer`,
then a ``summary.json`` with mean ± std of every test metric.

A staged run (``stages:`` in the config, :class:`~seqzoo.config.StageConfig`) trains its stages in
turn, each in ``RUN/STAGE/`` with its seeds and folds below as usual; a stage with ``init_from``
starts each sub-run from the best checkpoint of the same sub-run (seed, fold) of that earlier stage,
loading the weights whose names and shapes match (what was and was not loaded is logged and kept in
the sub-run's ``init_from.json``), and ``freeze`` keeps the parameters under the given name prefixes
fixed. ``--resume`` skips the finished stages and resumes the one in progress. ``summary.json`` holds
the last stage's summary and, under ``stages``, each stage's.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import re
import zlib
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import yaml
from torch import nn

from seqzoo.config import (
    DATA_PATHS,
    ConfigError,
    RunConfig,
    StageConfig,
    apply_override,
    config_from_dict,
    config_to_dict,
    stage_config,
)
from seqzoo.data.errors import DataError
from seqzoo.data.io import atomic_write_text, read_json, read_text, write_json
from seqzoo.training.checkpoint import load_tensors, resolve_checkpoint
from seqzoo.training.devices import set_seed, set_threads
from seqzoo.training.distributed import global_batch_config, is_main, main_rank_lock
from seqzoo.training.registry import get_task
from seqzoo.training.rundir import check_run_dir
from seqzoo.training.stats import summarize
from seqzoo.training.trainer import Trainer, stop_reason

__all__ = [
    "completed_test_record",
    "find_runs",
    "format_summary",
    "initialise",
    "load_task",
    "locked_root",
    "run",
    "run_root",
]

log = logging.getLogger("seqzoo")


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
    if config.stages:
        stages = {}
        for stage in config.stages:
            log.info("stage %s", stage.name)
            stages[stage.name] = _train(stage_config(config, stage), run_dir, resume, stage)
        summary = {**stages[config.stages[-1].name], "stages": stages}
    else:
        summary = _train(config, run_dir, resume)
    check_run_dir(run_dir)
    if is_main():
        write_json(run_dir / "summary.json", summary)
    return summary


def _train(config: RunConfig, run_dir: Path, resume: bool, stage: StageConfig | None = None) -> dict[str, Any]:
    """Train every (seed, fold) of ``config`` (of ``stage``, in ``run_dir/STAGE``) and summarise them."""
    stage_dir = run_dir / stage.name if stage else run_dir
    seeds = config.train.seeds or [config.train.seed]
    spec = get_task(config.task)
    results: dict[str, dict[str, Any]] = {}
    for seed in seeds:
        cfg = dataclasses.replace(config, train=dataclasses.replace(config.train, seed=seed, seeds=[]))
        seed_dir = stage_dir / f"seed-{seed}" if len(seeds) > 1 else stage_dir
        set_seed(seed)
        for sub, task in spec.build_tasks(global_batch_config(cfg)):  # each rank trains on its part of a batch
            sub_dir = seed_dir / sub if sub else seed_dir
            check_run_dir(sub_dir)  # each sub-run writes; none into a directory that is no longer this run
            name = str(sub_dir.relative_to(stage_dir)) if sub_dir != stage_dir else "."
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
                report = None
                if stage and (stage.init_from or stage.freeze):
                    report = _prepare_stage(task.model, stage, run_dir / (stage.init_from or "") / name)
                trainer = Trainer(cfg, task, sub_dir)
                if report is not None and is_main():
                    write_json(sub_dir / "init_from.json", report)
                trainer.fit(resume=resume)
                check_run_dir(sub_dir)
                done = completed_test_record(sub_dir)
            results[name] = {k: v for k, v in done.items() if k.startswith("test_")}
    summary = summarize(results)
    if stage and is_main():
        check_run_dir(stage_dir)
        write_json(stage_dir / "summary.json", summary)
    return summary


def _prepare_stage(model: nn.Module, stage: StageConfig, source: Path) -> dict[str, Any]:
    """``stage``'s ``init_from`` (the best checkpoint of the sub-run ``source``) and ``freeze`` applied to
    ``model``; what was done, for the sub-run's ``init_from.json``."""
    report: dict[str, Any] = {}
    if stage.init_from:
        best = resolve_checkpoint(source / "best")
        if best is None:
            raise ConfigError(f"stage {stage.name}: init_from {stage.init_from}: {source} has no best/ checkpoint")
        report = {"from": str(best), **initialise(model, best)}
    frozen = []
    for name, parameter in model.named_parameters():
        if name.startswith(tuple(stage.freeze)):
            parameter.requires_grad_(False)
            frozen.append(name)
    if stage.freeze and not frozen:
        raise ConfigError(f"stage {stage.name}: freeze {stage.freeze} matches no parameter of the model")
    if frozen:
        log.info("stage %s: %d parameters frozen (%s)", stage.name, len(frozen), ", ".join(stage.freeze))
    return {**report, "frozen": frozen}


def initialise(model: nn.Module, best: Path) -> dict[str, list[str]]:
    """Load into ``model`` the weights of the checkpoint ``best`` whose names and shapes match its own;
    returns (and logs) the names ``loaded``, the model's ``not_loaded`` ones (kept as initialised) and
    the checkpoint's ``unused`` ones."""
    tensors = load_tensors(best / "model.safetensors")
    own = model.state_dict()
    loaded = sorted(k for k, v in tensors.items() if k in own and own[k].shape == v.shape)
    model.load_state_dict({k: tensors[k] for k in loaded}, strict=False)
    report = {
        "loaded": loaded,
        "not_loaded": sorted(own.keys() - set(loaded)),
        "unused": sorted(tensors.keys() - set(loaded)),
    }
    log.info(
        "initialised from %s: %d tensors loaded; not loaded: %s; unused: %s",
        best,
        len(loaded),
        ", ".join(report["not_loaded"]) or "none",
        ", ".join(report["unused"]) or "none",
    )
    return report


_PER_TYPE = re.compile(r"(?P<head>.*?)(?P<score>precision|recall|f1)_(?P<kind>[^/]+)")  # chunk scores per type
_SCORE = re.compile(r"(^|_|/)(precision|recall|f1|score)$")  # chunk scores, multi-task macro scores: in %
_TYPE_COLUMNS = ("precision", "recall", "f1")


def format_summary(summary: dict[str, Any]) -> list[str]:
    """One line per test metric: ``mean ± std (n=seeds)``; a single seed has no spread to show.

    Accuracies, chunk precision, recall and F1, and a multi-task run's macro ``score`` in % with 2
    decimals, counts (integers in every run, e.g. tokens, with an integral mean and spread) as
    integers, everything else (BPC, perplexity, BLEU, losses) with 3 decimals, the resolution at
    which models are compared. Scores per chunk type (a tagging run's ``precision_X``, ``recall_X``,
    ``f1_X``) follow as a table, a row per type X and a last row of the micro scores over all
    types, in %.
    """
    lines = []
    tables: dict[str, dict[str, dict[str, dict[str, Any]]]] = {}  # head -> type -> score -> stats
    for key, s in summary["metrics"].items():
        per_type = _PER_TYPE.fullmatch(key)
        if per_type:
            tables.setdefault(per_type["head"], {}).setdefault(per_type["kind"], {})[per_type["score"]] = s
            continue
        percent = "accuracy" in key or _SCORE.search(key) is not None
        scale, unit, decimals = (100.0, "%", 2) if percent else (1.0, "", 3)
        counts = all(isinstance(run[key], int) for run in summary["runs"].values() if key in run)
        integral = all(float(s[k]).is_integer() for k in ("mean", "std") if s[k] is not None)  # fold means may not be
        if counts and integral:
            decimals = 0
        spread = f" ± {s['std'] * scale:.{decimals}f}{unit}" if s["n"] > 1 else ""
        lines.append(f"{key}: {s['mean'] * scale:.{decimals}f}{unit}{spread} (n={s['n']})")
    for head, kinds in tables.items():
        n = max(s["n"] for scores in kinds.values() for s in scores.values())
        title = f"{head.rstrip('_/')} per type (%, n={n}):"
        width = max(18, len(title) - 2, *(len(kind) for kind in kinds))
        lines.append(f"{title:<{width + 2}}" + "".join(f"{c:>16}" for c in _TYPE_COLUMNS))
        micro = {c: summary["metrics"][head + c] for c in _TYPE_COLUMNS if head + c in summary["metrics"]}
        for kind, scores in [*sorted(kinds.items()), *([("(micro, all types)", micro)] if micro else [])]:
            cells = [_percent(scores[c]) if c in scores else "-" for c in _TYPE_COLUMNS]
            lines.append(f"  {kind:<{width}}" + "".join(f"{c:>16}" for c in cells))
    return lines


def _percent(s: dict[str, Any]) -> str:
    return f"{s['mean'] * 100:.2f}" + (f" ± {s['std'] * 100:.2f}" if s["n"] > 1 else "")


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


def locked_root(path: Path) -> Path:
    """The run directory whose lock guards ``path`` (a run, or a seed, fold or stage of one): its
    :func:`run_root`, or the staged run whose stage that is."""
    root = run_root(path)
    stored = root.parent / "config.yaml"
    if stored.is_file():
        try:
            stages = yaml.safe_load(read_text(stored)) or {}
        except (yaml.YAMLError, DataError):  # not a run's config: root is no stage of it
            return root
        if isinstance(stages, dict) and any(
            isinstance(s, dict) and s.get("name") == root.name for s in stages.get("stages") or []
        ):
            return root.parent
    return root


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
    if not isinstance(values, dict):
        raise DataError(f"expected a JSON object (a run config), got a {type(values).__name__}", best / "config.json")
    for assignment in data_paths:
        if assignment.split("=", 1)[0].strip() not in (*DATA_PATHS, "train.device"):
            paths = ", ".join(DATA_PATHS)
            raise ConfigError(
                f"--set {assignment}: a trained run can only be pointed at its data ({paths}) or device (train.device)"
            )
        apply_override(values, assignment)
    config = config_from_dict(values)
    return get_task(config.task).load_trained(config, best, with_data)
