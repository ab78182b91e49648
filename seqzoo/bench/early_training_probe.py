"""Early-training probe: training cross-entropy over the first steps of a recipe.

Trains a config's model exactly as ``seqzoo train`` would (same seed, the first of ``train.seeds``;
same batches, optimiser, per-step learning rate, clipping and ``train.precision``, fp32 or bf16;
tested against the trainer's step records) for ``--steps`` steps of its first epoch and prints, every ``--every``
steps, the mean training cross-entropy in bits (dropout on, auxiliary losses such as the MZU's
disagreement term reported separately, not included) and, when the recipe clips, the median
gradient norm before clipping. Nothing is evaluated or written: it answers "does this variant learn
faster per step?" in minutes, not "which model is better" (that needs dev/test, ``seqzoo train``).
``train.threads`` is honoured as in ``seqzoo train``: two probes side by side need
``--set train.threads=1`` each; otherwise they oversubscribe the cores and run >15x slower.

    SEQZOO_DATA=../shared/data seqzoo bench early_training_probe \\
        configs/lm_brown_char_capmzu_dt.yaml --steps 150 --set model.encoder_args.num_zones=2
"""

from __future__ import annotations

import argparse
import math
import statistics
import time

from seqzoo.bench import bench_parser, positive_int
from seqzoo.config import load_config
from seqzoo.training.devices import autocast, model_device, set_seed, set_threads
from seqzoo.training.optim import build_optimizer, scheduled_lr, update
from seqzoo.training.registry import get_task
from seqzoo.training.trainer import total_steps


def build_parser() -> argparse.ArgumentParser:
    """The options of ``seqzoo bench early_training_probe``."""
    parser = bench_parser("early_training_probe", __doc__)
    parser.add_argument("config")
    parser.add_argument("--steps", type=positive_int, default=150)
    parser.add_argument("--every", type=positive_int, default=25, help="a row every this many steps")
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE")
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    cfg = load_config(args.config, args.set)
    if cfg.train.precision == "fp16":  # the trainer's loss scaling is not reproduced here
        parser.error("the probe runs train.precision fp32 or bf16, not fp16")
    set_threads(cfg.train)
    set_seed((cfg.train.seeds or [cfg.train.seed])[0])  # the first seed's run, as seqzoo train's first
    tasks = get_task(cfg.task).build_tasks(cfg)
    if len(tasks) != 1:
        parser.error(f"{args.config}: the probe needs a single task (no folds), got {len(tasks)}")
    task = tasks[0][1]
    model = task.model
    print(f"parameters {sum(p.numel() for p in model.parameters()):,}", flush=True)
    optimizer = build_optimizer(list(model.parameters()), cfg.optim)
    batches = task.train_batches(0)
    model.train()
    ce, aux, norms, start = [], [], [], time.perf_counter()
    steps = total_steps(cfg.train, len(batches))
    budget = min(args.steps, len(batches), cfg.train.max_steps or args.steps)  # the trainer stops at max_steps
    if budget < args.steps:
        limits = f"the first epoch has {len(batches)} batches, train.max_steps is {cfg.train.max_steps}"
        print(f"only {budget} of the {args.steps} steps asked for: {limits}")
    if budget < args.every:
        print(f"no row: --every {args.every} is more than the {budget} steps")
    for index in range(budget):
        with autocast(cfg.train.precision, model_device(model)):  # the forward pass, as the trainer's
            step = task.train_loss(batches[index])
        for group in optimizer.param_groups:  # warm-up and step schedules, as the trainer sets them
            group["lr"] = scheduled_lr(cfg.optim, cfg.optim.lr, index, steps)
        norms.append(update(model, optimizer, step.loss, cfg.optim.clip_norm))
        aux.append(step.auxiliary)
        ce.append(step.loss.detach().item() - step.auxiliary)
        if (index + 1) % args.every == 0:
            mean_ce, mean_aux = (sum(v[-args.every :]) / args.every / math.log(2) for v in (ce, aux))
            norm = "" if norms[-1] is None else f", grad norm {statistics.median(norms[-args.every :]):.3f}"
            print(
                f"step {index + 1}: train CE {mean_ce:.3f} bits, auxiliary {mean_aux:+.3f} bits{norm}, "
                f"{time.perf_counter() - start:.0f} s",
                flush=True,
            )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
