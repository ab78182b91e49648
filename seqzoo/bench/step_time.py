"""Training-step time of recipes side by side: seconds per step on the same real batches.

Builds each config's task, takes the first ``--steps`` training batches of epoch 0 (of the first
config; all configs must read the same training data), and times forward + backward + optimiser
step of each model on each batch, interleaving the models round by round so that machine drift
hits all of them alike. Prints one JSON object per config: median and total seconds, and the ratio
of its total to the first config's. It answers "how much shorter is an epoch of A than of B?" in
minutes; a whole epoch's wall-clock (``seqzoo train``) is the reference.

    SEQZOO_DATA=../shared/data seqzoo bench step_time \\
        configs/imdb_dense_qrnn.yaml configs/imdb_dense_lstm.yaml --steps 40

``--precisions fp32,bf16`` times each config under each ``train.precision`` (mixed precision's
autocast, as the trainer runs it), one model per config and precision, from the same seed.
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Callable, Iterator

from torch.optim import Optimizer

from seqzoo.bench import bench_parser, positive_int, time_cases
from seqzoo.config import RunConfig, load_config
from seqzoo.data.io import atomic_write_text
from seqzoo.training.devices import autocast, model_device, set_seed, set_threads
from seqzoo.training.optim import build_optimizer, update
from seqzoo.training.registry import get_task
from seqzoo.training.task import Task


def build_parser() -> argparse.ArgumentParser:
    """The options of ``seqzoo bench step_time``."""
    parser = bench_parser("step_time", __doc__)
    parser.add_argument("configs", nargs="+")
    parser.add_argument("--steps", type=positive_int, default=40)
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="applied to every config")
    parser.add_argument("--per-step", metavar="PATH", help="also write every step's seconds to PATH (JSONL)")
    parser.add_argument("--precisions", help="comma-separated train.precision values to time each config under")
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    runs = []
    for path in args.configs:
        for precision in args.precisions.split(",") if args.precisions else [None]:
            extra = [] if precision is None else [f"train.precision={precision}"]
            cfg = load_config(path, [*args.set, *extra])
            set_seed(cfg.train.seed)
            tasks = get_task(cfg.task).build_tasks(cfg)
            if len(tasks) != 1:
                parser.error(f"{path}: needs a single task (no folds), got {len(tasks)}")
            task = tasks[0][1]
            task.model.train()
            runs.append((path, cfg, task, build_optimizer(list(task.model.parameters()), cfg.optim)))
    set_threads(runs[0][1].train)
    batches = runs[0][2].train_batches(0)[: args.steps]
    # a round steps every model on the same batch: each model's steps go through the batches in turn
    steps = {i: _step(cfg, task, optimizer, iter(batches)) for i, (_, cfg, task, optimizer) in enumerate(runs)}
    timings = time_cases(steps, len(batches), warmup=0)
    first = sum(timings[0].wall)
    for (path, cfg, task, _), timing in zip(runs, timings.values(), strict=True):
        times = timing.wall
        record = {
            "config": path,
            "precision": cfg.train.precision,
            "steps": len(times),
            "median_s": round(timing.median, 4),
            "total_s": round(sum(times), 2),
            "total_vs_first": round(sum(times) / first, 3),
            "parameters": sum(p.numel() for p in task.model.parameters()),
        }
        print(json.dumps(record), flush=True)
    if args.per_step:
        rows = (
            {"config": run[0], "step": i, "s": round(t, 5)}
            for run, timing in zip(runs, timings.values(), strict=True)
            for i, t in enumerate(timing.wall)
        )
        atomic_write_text(args.per_step, "".join(json.dumps(row) + "\n" for row in rows))
    return 0


def _step(cfg: RunConfig, task: Task, optimizer: Optimizer, batches: Iterator[object]) -> Callable[[], None]:
    """One training step of ``task``'s model (forward, backward, optimiser) on the next of ``batches``."""

    def step() -> None:
        with autocast(cfg.train.precision, model_device(task.model)):
            loss = task.train_loss(next(batches)).loss
        update(task.model, optimizer, loss, cfg.optim.clip_norm)

    return step


if __name__ == "__main__":
    raise SystemExit(main())
