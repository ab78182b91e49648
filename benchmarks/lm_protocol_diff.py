"""A trained language model's metric under both evaluation protocols, from one pass.

Since session 32 ``seqzoo`` scores every token of a split but its first (TASKS.md). Runs measured
before scored only the tokens of the batchified rows but each row's first, and dropped the
N mod rows left-over tokens. The tokens both protocols score get the same loss (the rows are
read alike), so one call of :meth:`seqzoo.tasks.lm.LMTask.token_nll` gives both means. This
tells how far the change moves a documented figure; docs/results.md reports it.

    SEQZOO_DATA=../shared/data python benchmarks/lm_protocol_diff.py RUN_DIR [RUN_DIR ...] [--split test]
"""

from __future__ import annotations

import argparse

import torch

from seqzoo.training.runner import load_task


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("run_dirs", nargs="+", metavar="RUN_DIR", help="trained LM runs (a seed's directory)")
    parser.add_argument("--split", default="test", choices=["dev", "test"])
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    for run_dir in args.run_dirs:
        task = load_task(run_dir)
        nll = task.token_nll(args.split)  # (N,), NaN at the first token
        rows = min(task.config.data.eval_batch_size, nll.numel())
        width = nll.numel() // rows
        old = nll[: rows * width].view(rows, width)[:, 1:].reshape(-1)  # each row's tokens but its first
        new = nll[1:]
        before, after = task.metric_from_loss(old.mean().item()), task.metric_from_loss(new.mean().item())
        print(
            f"{run_dir}: {args.split} {task.metric} batchified rows {before:.5f} ({old.numel()} targets), "
            f"every token but the first {after:.5f} ({new.numel()} targets), difference {after - before:+.5f}",
            flush=True,
        )


if __name__ == "__main__":
    main()
