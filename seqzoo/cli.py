"""The ``seqzoo`` command: train, evaluate, predict, sample, plot-zones, plot-lengths, plot-hidden, plot-depths,
compare, bench."""

from __future__ import annotations

import argparse
import importlib
import inspect
import json
import logging
import os
import shutil
import sys
from pathlib import Path
from typing import Any

from seqzoo.config import DATA_PATHS, ConfigError, RunConfig, config_to_dict, load_config

__all__ = ["main"]

log = logging.getLogger("seqzoo")

DEFAULT_CONFIG = Path(__file__).with_name("configs") / "default.yaml"
#: What a resumed run keeps once it has trained: what its checkpoints were trained with, and the
#: optimiser's own settings, which its restored state would silently keep (or, for another
#: optimiser, fail to load). A resume may change the rest: the epoch and step budgets, patience,
#: the optimiser's schedule, threads, logging. Data paths may move (:data:`DATA_PATHS`); seeds may
#: only be added (:func:`_seed_list`). A staged run's stages are fixed as a whole.
FIXED_ON_RESUME = (
    "task",
    "data",
    "model",
    "stages",
    "train.batch_size",
    *(f"optim.{key}" for key in ("optimizer", "lr", "weight_decay", "momentum", "alpha", "eps")),
)


def _train(args: argparse.Namespace) -> int:
    from seqzoo.training.distributed import init_from_env, is_main, launch, on_main
    from seqzoo.training.rundir import new_run_dir
    from seqzoo.training.runner import format_summary

    if args.nproc is not None:  # this command again, as N data-parallel processes started by torchrun
        if args.nproc < 1:
            raise ConfigError(f"--nproc must be >= 1, got {args.nproc}")
        return launch(args.nproc, _torchrun_argv(args))
    if args.resume:
        if args.config or args.run_dir:  # the run's own config.yaml is used, in its own directory
            given = "a config file" if args.config else "--run-dir"
            raise ConfigError(f"--resume continues {args.resume} with its stored config.yaml; {given} cannot be added")
        run_dir, created = Path(args.resume), None
        stored = run_dir / "config.yaml"
        if not stored.exists():
            raise ConfigError(f"{run_dir}: not a run directory (no config.yaml)")
        _refuse_part_of_a_run(run_dir, "resume that (--resume {root})")
        config = load_config(stored, args.set, resolved=True)
        init_from_env(config.train)  # under torchrun: join the job's process group (docs/distributed.md)
    else:
        config = load_config(args.config or DEFAULT_CONFIG, args.set)
        init_from_env(config.train)
        # A data-parallel job's rank 0 claims its directory, for all its ranks.
        run_dir = Path(args.run_dir) if args.run_dir else on_main(lambda: new_run_dir(config.output_dir, config.name))
        _refuse_part_of_a_run(run_dir, "train in a directory of its own")
        fresh = args.run_dir is None or not run_dir.exists()
        run_dir.mkdir(parents=True, exist_ok=True)
        created = _identity(run_dir) if fresh and is_main() else None  # the directory this training made
    try:
        summary = _train_in(args, config, run_dir)
    except Exception:  # a run that failed before it trained leaves no directory behind (the one it
        # created: not one that replaced it meanwhile)
        if created is not None and created == _identity(run_dir) and not _has_trained(run_dir):
            shutil.rmtree(run_dir, ignore_errors=True)
        raise
    if summary is None:
        return 130
    if not is_main():  # rank 0 reports for the job
        return 0
    print("\n".join(format_summary(summary)))
    plots = sorted(str(p) for p in run_dir.rglob("*.png"))
    print(f"run directory: {run_dir}")
    if plots:
        print("plots: " + ", ".join(plots))
    return 0


def _identity(path: Path) -> tuple[int, int] | None:
    """The device and inode of the directory at ``path`` (None where there is none)."""
    try:
        info = os.stat(path)
    except OSError:
        return None
    return info.st_dev, info.st_ino


def _train_in(args: argparse.Namespace, config: RunConfig, run_dir: Path) -> dict[str, Any] | None:
    """Train ``config`` in ``run_dir`` (locked); its summary, or None when interrupted."""
    from seqzoo.training.distributed import is_main, main_rank_lock
    from seqzoo.training.runner import run

    stored = run_dir / "config.yaml"
    with main_rank_lock(run_dir):  # the checks below see the directory as no other training will change it
        if is_main() and _has_trained(run_dir):  # (the other ranks of a job: rank 0 may be writing there now)
            if not args.resume:
                raise ConfigError(
                    f"{run_dir} holds a trained run: resume it (--resume {run_dir}) or pick another --run-dir"
                )
            _refuse_changes_on_resume(load_config(stored, resolved=True), config, stored)
        try:
            return run(config, run_dir, resume=bool(args.resume))
        except KeyboardInterrupt:
            print(f"seqzoo: interrupted; continue with: seqzoo train --resume {run_dir}", file=sys.stderr)
            return None


def _torchrun_argv(args: argparse.Namespace) -> list[str]:
    """The ``seqzoo`` arguments that ``train --nproc N`` hands each process (the same, without ``--nproc``)."""
    argv = [f"--import={name}" for name in args.imports]
    argv += [f"--threads={args.threads}"] if args.threads is not None else []
    argv += ["train", *([args.config] if args.config else []), *(f"--set={item}" for item in args.set)]
    argv += [f"--run-dir={args.run_dir}"] if args.run_dir else []
    return argv + ([f"--resume={args.resume}"] if args.resume else [])


def _refuse_part_of_a_run(run_dir: Path, advice: str) -> None:
    """A ConfigError where ``run_dir`` is a ``seed-N``/``fold-K``/stage sub-directory of a run (one that
    has been locked by a training: a user's own folder named so is not): the run trains it, and
    locks only its own root, so a second training there would write into the run's files."""
    from seqzoo.training.rundir import LOCK_NAME
    from seqzoo.training.runner import locked_root, run_root

    real = Path(os.path.realpath(run_dir))
    root = locked_root(real)
    if root != real and (root / LOCK_NAME).exists():
        part = "one seed or fold" if run_root(real) != real else "one stage"
        raise ConfigError(f"{run_dir} is {part} of the run {root}: " + advice.format(root=root))


def _flat(values: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    """A nested config dict as {dotted key: value}."""
    flat: dict[str, Any] = {}
    for key, value in values.items():
        flat.update(_flat(value, f"{prefix}{key}.") if isinstance(value, dict) else {f"{prefix}{key}": value})
    return flat


def _has_trained(run_dir: Path) -> bool:
    """``run_dir`` holds a checkpoint or metrics (a run that failed before either can start again)."""
    return any(
        "metrics.jsonl" in files or any(name.startswith("last") for name in dirs + files)
        for _, dirs, files in os.walk(run_dir)
    )


def _seed_list(config: RunConfig) -> list[int]:
    return config.train.seeds or [config.train.seed]


def _refuse_changes_on_resume(stored: RunConfig, config: RunConfig, path: Path) -> None:
    """A ``--resume --set`` may not change what the checkpoints were trained with (:data:`FIXED_ON_RESUME`,
    data paths apart), nor the seeds, except by adding seeds to a multi-seed run (the layout of its
    directory: one sub-directory per seed)."""
    old, new = _flat(config_to_dict(stored)), _flat(config_to_dict(config))
    changed = []
    for key in sorted(old.keys() | new.keys()):
        fixed = any(key == name or key.startswith(name + ".") for name in FIXED_ON_RESUME)
        moved = key in DATA_PATHS and isinstance(old.get(key), str) and isinstance(new.get(key), str)
        if fixed and not moved and old.get(key) != new.get(key):
            changed.append(f"{key} ({old.get(key)!r} -> {new.get(key)!r})")
    if changed:
        raise ConfigError(
            f"{path}: --resume cannot change {', '.join(changed)}; the run's checkpoints were trained with "
            f"{'it' if len(changed) == 1 else 'them'}: start a new run instead"
        )
    seeds, more = _seed_list(stored), _seed_list(config)
    if more != seeds and not (len(seeds) > 1 and more[: len(seeds)] == seeds):
        raise ConfigError(
            f"{path}: --resume can only add seeds to a run of several seeds, not turn {seeds} into {more}"
        )


def _trained_runs(run_dir: str) -> list[Path]:
    """Sub-runs with a best/ checkpoint below ``run_dir``; an error if there is none."""
    from seqzoo.training.runner import find_runs

    runs = find_runs(run_dir)
    if not runs:
        raise ConfigError(f"{run_dir}: no trained model (no best/ checkpoint) below this directory")
    _warn_if_training(runs)
    return runs


def _model_run(run_dir: str) -> Path:
    """The sub-run whose model predict, sample and the plots read: the first seed or fold below ``run_dir``
    (of its last stage, where it is a staged run)."""
    from seqzoo.api import last_stage

    stage = last_stage(Path(run_dir))
    return _trained_runs(str(Path(run_dir) / stage) if stage else run_dir)[0]


def _warn_if_training(paths: list[Path]) -> None:
    """A warning for each run among ``paths`` (sub-runs or runs) that a process is training now: what
    is read of it is its latest checkpoint, not its final result."""
    from seqzoo.training.rundir import training_pid
    from seqzoo.training.runner import locked_root

    for root in dict.fromkeys(locked_root(Path(p)) for p in paths):
        pid = training_pid(root)
        if pid is not None:
            log.warning("%s is being trained (pid %s): what is read of it is its latest checkpoint so far", root, pid)


def _evaluate(args: argparse.Namespace) -> int:
    """One JSON line per sub-run, then mean ± std per run: a folder holding several runs (e.g.
    ``runs/``) gets one summary for each, headed by its path, not one over unrelated models."""
    from seqzoo.training.runner import format_summary, load_task, run_root
    from seqzoo.training.stats import summarize

    runs: dict[Path, dict[str, dict[str, float]]] = {}
    for sub in _trained_runs(args.run_dir):
        task = load_task(sub, data_paths=args.set)
        broken = _non_finite_weights(task)
        if broken:
            log.warning("%s: weights with NaN or infinite values (%s): its metrics mean nothing", sub, broken)
        metrics = task.evaluate(args.split)
        root = run_root(sub)
        name = str(sub.relative_to(root)) if sub != root else "."
        runs.setdefault(root, {})[name] = {f"{args.split}_{k}": v for k, v in metrics.items()}
        print(json.dumps({"run": str(sub), "split": args.split, **metrics}))
    for root, results in runs.items():
        lines = format_summary(summarize(results))
        print("\n".join([f"{root}:", *(f"  {line}" for line in lines)] if len(runs) > 1 else lines))
    return 0


def _predict(args: argparse.Namespace) -> int:
    from seqzoo.data.errors import DataError
    from seqzoo.data.io import open_text
    from seqzoo.training.runner import load_task

    run = _model_run(args.run_dir)
    task = load_task(run, with_data=False)
    if not hasattr(task, "predict"):
        raise ConfigError(
            f"{run}: `seqzoo predict` serves classification, aspect sentiment and translation runs, not this one"
        )
    broken = _non_finite_weights(task)
    if broken:
        raise ConfigError(f"{run}: the model's weights hold NaN or infinite values ({broken}): it cannot predict")
    source = "<stdin>" if args.input in (None, "-") else args.input
    with open_text(source, sys.stdin.buffer if source == "<stdin>" else None) as lines:  # stdin read as a file is
        numbered = [(lines.line, line.removesuffix("\n")) for line in lines if line.strip()]
    try:
        if args.task is not None and "task" not in inspect.signature(task.predict).parameters:
            raise ConfigError(f"{run}: --task names a task of a multi-task run; this run has one task")
        results = task.predict([text for _, text in numbered], **({} if args.task is None else {"task": args.task}))
    except DataError as err:  # the task numbers the texts; name the input's own line
        if err.line is None or err.path is not None:
            raise
        raise DataError(err.message, source, numbered[err.line - 1][0]) from None
    for (line, text), result in zip(numbered, results, strict=True):  # blank lines have no record
        print(json.dumps({"line": line, "text": text, **result}, ensure_ascii=False))
    return 0


def _non_finite_weights(task: Any) -> str:
    """The names of the first tensors of ``task.model`` that hold a NaN or an infinity ("" if none)."""
    import torch

    state = task.model.state_dict()
    names = [name for name, t in state.items() if t.is_floating_point() and not bool(torch.isfinite(t).all())]
    return ", ".join(names[:3]) + (f" and {len(names) - 3} more" if len(names) > 3 else "")


def _capability(task: Any, sub: Path, name: str, what: str) -> Any:
    """The function ``name`` that the registered task of ``task`` offers (``sample``, ...); a
    :class:`ConfigError` naming the run where its task has none."""
    from seqzoo.training.registry import get_task

    found = get_task(task.config.task).capabilities.get(name)
    if found is None:
        raise ConfigError(f"{sub}: a {task.config.task} run cannot {what} (its task has no {name!r})")
    return found


def _sample(args: argparse.Namespace) -> int:
    from seqzoo.training.runner import load_task

    run = _model_run(args.run_dir)
    task = load_task(run, with_data=False)
    sample = _capability(task, run, "sample", "generate text")
    try:
        text = sample(task, args.length, args.temperature, args.prime, args.seed, args.top_p)
    except ValueError as err:  # --length < 0, --temperature <= 0, --top-p outside (0, 1]
        raise ConfigError(f"{run}: {err}") from None
    print(text)
    return 0


def _plot_labels(run_dirs: list[str]) -> list[str]:
    """The legend label of each run a plot compares: its directory's name, which must be unique."""
    labels: list[str] = []
    for run_dir in run_dirs:
        label = Path(run_dir).resolve().name
        if label in labels:
            raise ConfigError(f"{run_dir}: two run directories are named {label!r}")
        labels.append(label)
    return labels


def _plot_zones(args: argparse.Namespace) -> int:
    from seqzoo.analysis.zones import plot_zone_relevance, zone_relevance
    from seqzoo.training.runner import load_task

    relevances = {}
    labels = _plot_labels(args.run_dirs) if len(args.run_dirs) > 1 else [""]
    for run_dir, label in zip(args.run_dirs, labels, strict=True):  # one model each (its first seed)
        run = _model_run(run_dir)
        try:
            relevances[label] = zone_relevance(load_task(run, with_data=False), args.text, args.depth)
        except ValueError as err:
            raise ConfigError(f"{run}: {err}") from None
    try:
        path = plot_zone_relevance(relevances, args.out, args.last)
    except ValueError as err:
        raise ConfigError(str(err)) from None
    print(path)
    return 0


def _plot_lengths(args: argparse.Namespace) -> int:
    from seqzoo.training.runner import load_task

    try:
        boundaries = sorted({int(b) for b in args.boundaries.split(",")})
    except ValueError:
        raise ConfigError(f"--boundaries must be comma-separated integers, got {args.boundaries!r}") from None
    if boundaries[0] < 1:
        raise ConfigError(f"--boundaries must be line lengths >= 1, got {args.boundaries!r}")
    series, metric, plot = {}, None, None
    for run_dir, label in zip(args.run_dirs, _plot_labels(args.run_dirs), strict=True):
        sub = _model_run(run_dir)
        task = load_task(sub, data_paths=args.set)
        loss_by_length_bucket = _capability(task, sub, "length_buckets", "score by sequence length")
        plot = _capability(task, sub, "plot_length_buckets", "plot scores by sequence length")
        if metric not in (None, task.metric):
            raise ConfigError(f"{sub}: reports {task.metric}, the runs before it {metric}; plot one level at a time")
        metric = task.metric
        series[label] = buckets = loss_by_length_bucket(task, args.split, boundaries)
        for bucket in buckets:
            print(json.dumps({"run": str(sub), "split": args.split, **bucket}))
    print(plot(series, args.out, metric))
    return 0


def _plot_hidden(args: argparse.Namespace) -> int:
    from seqzoo.analysis.hidden import plot_hidden_states
    from seqzoo.data.io import read_text
    from seqzoo.training.runner import load_task

    run = _model_run(args.run_dir)
    text = args.text if args.input is None else read_text(args.input)
    try:
        path, _ = plot_hidden_states(load_task(run, with_data=False), text, args.out, args.channels)
    except ValueError as err:
        raise ConfigError(f"{run}: {err}") from None
    print(path)
    return 0


def _plot_depths(args: argparse.Namespace) -> int:
    """The figure, then one JSON line: the text's depths and the split's histogram, mean depth and its
    accuracy at the predicted depths and at full depth on the same weights (the full-depth ablation)."""
    from seqzoo.analysis.depths import plot_depths
    from seqzoo.training.runner import load_task

    run = _model_run(args.run_dir)
    split = None if args.split == "none" else args.split
    task = load_task(run, with_data=split is not None, data_paths=args.set)
    try:
        path, sentence, histogram = plot_depths(task, args.text, args.out, split)
    except ValueError as err:
        raise ConfigError(f"{run}: {err}") from None
    record = {"run": str(run), "tokens": sentence.tokens, "depths": sentence.depths}
    if histogram is not None:
        summary = {"mean_depth": histogram.mean, "num_layers": histogram.num_layers, "counts": histogram.counts}
        accuracies = {"accuracy": histogram.accuracy, "full_depth_accuracy": histogram.full_depth_accuracy}
        record |= {"split": histogram.split, **summary, **accuracies}
    print(path)
    print(json.dumps(record, ensure_ascii=False))
    return 0


def _compare(args: argparse.Namespace) -> int:
    from seqzoo.training.stats import compare_runs, finite_or_none, format_comparison

    _warn_if_training([Path(args.run_a), Path(args.run_b)])
    records = compare_runs(args.run_a, args.run_b)
    if not records:
        raise ConfigError(f"{args.run_a} and {args.run_b} share no test metric")
    lines = [json.dumps(finite_or_none(r)) for r in records] if args.json else format_comparison(records)
    print("\n".join(lines))
    return 0


#: The modules of :mod:`seqzoo.bench`, each with a ``main(argv)`` (found by file name, imported when run).
BENCHMARKS = tuple(sorted(p.stem for p in (Path(__file__).parent / "bench").glob("*.py") if not p.stem.startswith("_")))


def _bench(args: argparse.Namespace) -> int:
    return int(importlib.import_module(f"seqzoo.bench.{args.name}").main(args.rest) or 0)


def _import_modules(modules: list[str]) -> None:
    """``--import``: the modules by name, from the current directory too (as ``python -m`` would)."""
    if modules and os.getcwd() not in sys.path and "" not in sys.path:
        sys.path.insert(0, os.getcwd())
    for name in modules:
        try:
            importlib.import_module(name)
        except ImportError as err:
            raise ConfigError(f"--import {name}: {err}") from None


MOVED_DATA_HELP = "where the run's data lies now (data.data_dir=DIR; data paths only), or train.device=cpu|cuda"


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="seqzoo", description=__doc__)
    parser.add_argument(
        "--import",
        dest="imports",
        action="append",
        default=[],
        metavar="MODULE",
        help="import MODULE first (an installed module or one in the current directory), e.g. one that "
        "registers an encoder of your own with @seqzoo.register_encoder; repeatable",
    )
    parser.add_argument(
        "--threads", type=int, metavar="N", help="torch threads (default: torch's; `train` follows train.threads)"
    )
    sub = parser.add_subparsers(dest="command", required=True)
    train = sub.add_parser("train", help="train and evaluate a recipe from a YAML config")
    train.add_argument("config", nargs="?", help="YAML config (default: BiLSTM on the bundled movie_snippets corpus)")
    train.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="override a config key")
    train.add_argument("--run-dir", help="run directory (default: OUTPUT_DIR/NAME[-N])")
    train.add_argument(
        "--resume",
        metavar="RUN_DIR",
        help="continue a run from its last/ checkpoint: an interrupted one, or one given more epochs or a "
        "relaxed early stopping with --set",
    )
    train.add_argument(
        "--nproc",
        type=int,
        metavar="N",
        help="data-parallel training in N processes on this node, started by torchrun (gloo on the CPU, NCCL on "
        "GPUs; train.batch_size is per process); several nodes: torchrun ... -m seqzoo train (docs/distributed.md)",
    )
    train.set_defaults(func=_train)
    evaluate = sub.add_parser("evaluate", help="evaluate the best checkpoint(s) of a run")
    evaluate.add_argument("run_dir", help="a run, or a folder of runs (each summarised apart)")
    evaluate.add_argument("--split", default="test", choices=["train", "dev", "test"], help="(default: test)")
    evaluate.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help=MOVED_DATA_HELP)
    evaluate.set_defaults(func=_evaluate)
    predict = sub.add_parser(
        "predict",
        help="classify or translate texts (one per line; aspect sentiment: sentence<TAB>aspect term) "
        "with a trained run; one JSON record per non-blank line, with its line number",
    )
    predict.add_argument("run_dir")
    predict.add_argument(
        "--input", help="file with one text per line (aspect sentiment: sentence<TAB>aspect term; default: stdin)"
    )
    predict.add_argument("--task", help="multi-task runs: the task whose labels to predict")
    predict.set_defaults(func=_predict)
    gen = sub.add_parser("sample", help="generate text from a trained language model run")
    gen.add_argument("run_dir")
    gen.add_argument("--length", type=int, default=200, help="tokens to generate (default 200)")
    gen.add_argument("--temperature", type=float, default=1.0, help="softmax temperature > 0 (default 1)")
    gen.add_argument("--top-p", type=float, default=1.0, help="nucleus sampling: draw from the top tokens of this mass")
    gen.add_argument("--prime", default="", help="text to start from (default: a new line)")
    gen.add_argument("--seed", type=int, default=0)
    gen.set_defaults(func=_sample)
    zones = sub.add_parser(
        "plot-zones", help="char-LM relevance heat maps of MZU, GRU and DT-GRU runs (MZU paper Figure 3) as PNG"
    )
    zones.add_argument("run_dirs", nargs="+", metavar="RUN_DIR", help="one panel per run (its first seed), same text")
    zones.add_argument("--text", required=True, help="text to read (characters)")
    zones.add_argument("--out", required=True, help="PNG path")
    zones.add_argument("--last", type=int, default=5, help="characters whose relevances are shown (default 5)")
    zones.add_argument("--depth", type=int, default=0, help="candidate of this transition depth (default 0)")
    zones.set_defaults(func=_plot_zones)
    lengths = sub.add_parser(
        "plot-lengths", help="LM runs' BPC / perplexity by line-length bucket (MZU paper Figure 2) as PNG"
    )
    lengths.add_argument("run_dirs", nargs="+", metavar="RUN_DIR", help="one series per run (its first seed)")
    lengths.add_argument("--split", default="test", choices=["dev", "test"])
    lengths.add_argument("--boundaries", default="20,40,60,80,100", help="bucket edges, [lo, hi) (default 20,...,100)")
    lengths.add_argument("--out", required=True, help="PNG path")
    lengths.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help=MOVED_DATA_HELP)
    lengths.set_defaults(func=_plot_lengths)
    hidden = sub.add_parser("plot-hidden", help="last-layer hidden states over a document (QRNN paper Figure 3) as PNG")
    hidden.add_argument("run_dir")
    document = hidden.add_mutually_exclusive_group(required=True)
    document.add_argument("--text", help="the document")
    document.add_argument("--input", help="file holding the document")
    hidden.add_argument("--out", required=True, help="PNG path")
    hidden.add_argument("--channels", type=int, help="show only the N units that vary most over the document")
    hidden.set_defaults(func=_plot_hidden)
    depths = sub.add_parser("plot-depths", help="DA-GRN depth of each word of a text and over a split, as PNG")
    depths.add_argument("run_dir", help="a dagrn run (its first seed) or one seed-N of it")
    depths.add_argument("--text", required=True, help="the sentence whose words' depths are drawn")
    depths.add_argument("--split", default="test", choices=["train", "dev", "test", "none"], help="(default: test)")
    depths.add_argument("--out", required=True, help="PNG path")
    depths.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help=MOVED_DATA_HELP)
    depths.set_defaults(func=_plot_depths)
    compare = sub.add_parser("compare", help="test metrics of two multi-seed runs: mean ± std and Welch's t-test")
    compare.add_argument("run_a")
    compare.add_argument("run_b")
    compare.add_argument("--json", action="store_true", help="one JSON object per metric")
    compare.set_defaults(func=_compare)
    bench = sub.add_parser("bench", help=f"benchmarks: seqzoo bench {'|'.join(BENCHMARKS)} --help")
    bench.add_argument("name", choices=BENCHMARKS, help="the benchmark (its own options: seqzoo bench NAME --help)")
    bench.add_argument("rest", nargs=argparse.REMAINDER, metavar="...", help="the benchmark's own options")
    bench.set_defaults(func=_bench)
    return parser


class _Console(logging.StreamHandler):
    """The console log: writes to whatever ``sys.stderr`` is when a record is emitted. A stream
    taken once goes stale when a caller of :func:`main` redirects stderr between calls (pytest's
    capture, ``contextlib.redirect_stderr``): records went to the old stream, or failed on it once
    it was closed."""

    @property
    def stream(self):  # type: ignore[override]
        return sys.stderr

    @stream.setter
    def stream(self, value) -> None:  # StreamHandler.__init__ sets it
        pass


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if not any(isinstance(h, _Console) for h in log.handlers):
        console = _Console()
        console.setFormatter(logging.Formatter("%(message)s"))
        log.addHandler(console)
    log.setLevel(logging.INFO)
    from seqzoo.data.errors import DataError
    from seqzoo.training.trainer import TrainingError

    try:
        _import_modules(args.imports)
        if args.threads is not None:
            if args.threads < 1:
                raise ConfigError(f"--threads must be >= 1, got {args.threads}")
            import torch

            torch.set_num_threads(args.threads)
        return args.func(args)
    except (ConfigError, DataError, TrainingError, OSError) as err:
        print(f"seqzoo: error: {err}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
