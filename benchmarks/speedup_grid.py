"""QRNN speed over the LSTM's as a batch x length grid (the QRNN paper's Figure 4, right), from the
JSON lines of ``seqzoo bench encoders --json`` (any device; one hidden size per file).

    python benchmarks/speedup_grid.py bench.jsonl [--png grid.png]

Prints, for the forward pass (inference) and forward+backward (training), the ratio of the QRNN's
tokens/s to the LSTM's measured in the same run, one row per batch size, one column per length.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path


def grids(rows: list[dict]) -> dict[str, dict[tuple[int, int], float]]:
    """{"fwd"/"fwd_bwd": {(batch, seq_len): qrnn / lstm tokens per second}}."""
    by_shape: dict[tuple[int, int], dict[str, dict]] = {}
    for row in rows:
        by_shape.setdefault((row["batch"], row["seq_len"]), {})[row["encoder"]] = row
    result: dict[str, dict[tuple[int, int], float]] = {"fwd": {}, "fwd_bwd": {}}
    for shape, encoders in by_shape.items():
        if {"qrnn", "lstm"} <= set(encoders):
            for kind in result:
                key = f"{kind}_tokens_per_s"
                result[kind][shape] = encoders["qrnn"][key] / encoders["lstm"][key]
    return result


def table(grid: dict[tuple[int, int], float]) -> str:
    batches, lengths = sorted({b for b, _ in grid}), sorted({t for _, t in grid})
    lines = ["batch \\ T " + "".join(f"{t:>8}" for t in lengths)]
    for b in batches:
        cells = "".join(f"{grid[b, t]:>8.2f}" if (b, t) in grid else f"{'-':>8}" for t in lengths)
        lines.append(f"{b:>9} {cells}")
    return "\n".join(lines)


def plot(all_grids: dict[str, dict[tuple[int, int], float]], title: str, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    fig, axes = plt.subplots(1, 2, figsize=(10, 4), constrained_layout=True)
    for ax, (kind, grid) in zip(axes, all_grids.items(), strict=True):
        batches, lengths = sorted({b for b, _ in grid}), sorted({t for _, t in grid})
        values = np.array([[grid.get((b, t), np.nan) for t in lengths] for b in batches])
        image = ax.imshow(values, cmap="viridis", origin="lower")
        for i in range(len(batches)):
            for j in range(len(lengths)):
                ax.text(j, i, f"{values[i, j]:.1f}", ha="center", va="center", color="white", fontsize=8)
        ax.set_xticks(range(len(lengths)), lengths)
        ax.set_yticks(range(len(batches)), batches)
        ax.set_xlabel("sequence length")
        ax.set_ylabel("batch size")
        ax.set_title({"fwd": "inference", "fwd_bwd": "training (fwd+bwd)"}[kind])
        fig.colorbar(image, ax=ax, shrink=0.8, label="QRNN / LSTM tokens per s")
    fig.suptitle(title)
    fig.savefig(path, dpi=120)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("jsonl", type=Path)
    parser.add_argument("--png", type=Path, help="also draw the two grids as a heat map")
    args = parser.parse_args()
    rows = [json.loads(line) for line in args.jsonl.read_text().splitlines() if line.strip()]
    all_grids = grids(rows)
    qrnn = next(r for r in rows if r["encoder"] == "qrnn")
    title = f"QRNN (k = {qrnn['window']}, {qrnn['pooling']}) vs LSTM, hidden {qrnn['hidden']}, {qrnn['device']}"
    print(title)
    for kind, grid in all_grids.items():
        print(f"{kind}: QRNN / LSTM tokens per second\n{table(grid)}")
    if args.png:
        plot(all_grids, title, args.png)


if __name__ == "__main__":
    main()
