import json

import pytest

import seqzoo.training.plots
from seqzoo.training.plots import plot_curves

STEPS = [{"event": "step", "epoch": 1, "step": s, "lr": 1e-3, "train_loss": 3.0 - s / 100} for s in (100, 200, 300)]
EPOCHS = [
    {"event": "epoch", "epoch": 1, "step": 350, "train_loss": 2.2, "dev_loss": 2.1, "dev_bpc": 3.0},
    {"event": "epoch", "epoch": 2, "step": 700, "train_loss": 1.9, "dev_loss": 1.8, "dev_bpc": 2.6},
]
TEST = {"event": "test", "best_epoch": 2, "test_bpc": 2.5}


@pytest.fixture
def figures(monkeypatch):
    """The figures plot_curves draws, by file name, instead of PNGs."""
    drawn = {}
    monkeypatch.setattr(
        seqzoo.training.plots, "save_figure", lambda fig, path: drawn.setdefault(path.name, fig) and path
    )
    return drawn


def _write(tmp_path, records):
    path = tmp_path / "metrics.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    return path


def _lines(fig):
    return {line.get_label(): (list(line.get_xdata()), list(line.get_ydata())) for line in fig.axes[0].get_lines()}


def test_curves_are_drawn_against_training_steps(tmp_path, figures):
    """A one-epoch run (every brown_char recipe, IMDb) drew one dot per curve; the train loss is now
    the mean of each ``train.log_every`` window, the dev values sit at their epochs' last steps."""
    plot_curves(_write(tmp_path, [*STEPS, EPOCHS[0], *STEPS, EPOCHS[1], TEST]), tmp_path, "bpc")
    loss = _lines(figures["loss.png"])
    assert loss["train"] == ([100, 200, 300] * 2, [2.0, 1.0, 0.0] * 2)
    assert loss["dev (after each epoch)"] == ([350, 700], [2.1, 1.8])
    bpc = figures["bpc.png"]
    assert _lines(bpc)["test (best dev)"] == ([700], [2.5])
    assert bpc.axes[0].get_xlabel() == "training step" and bpc.axes[0].get_title() == "BPC (bits per character)"


def test_records_without_steps_are_drawn_by_epoch(tmp_path, figures):
    older = [{**{k: v for k, v in r.items() if k != "step"}, "dev_accuracy": 0.8} for r in EPOCHS]
    plot_curves(_write(tmp_path, [*STEPS, *older, {"event": "test", "best_epoch": 2}]), tmp_path, "accuracy")
    assert _lines(figures["loss.png"])["train"] == ([1, 2], [2.2, 1.9])
    accuracy = figures["accuracy.png"].axes[0]
    assert accuracy.get_xlabel() == "epoch" and accuracy.get_title() == "Accuracy"
    assert all(tick == int(tick) for tick in accuracy.get_xticks())  # no epoch 1.25


def test_train_curve_leaves_out_the_auxiliary_term_and_the_star_sits_at_the_best_epoch(tmp_path, figures):
    """The train curve leaves out the auxiliary (disagreement) term, and the test star sits at the
    best epoch, not the last."""
    records = [
        {"event": "step", "epoch": 1, "step": 10, "train_loss": 3.0, "train_auxiliary": 0.5},
        {"event": "epoch", "epoch": 1, "step": 10, "train_loss": 3.0, "dev_loss": 2.0, "dev_bpc": 2.9},
        {"event": "step", "epoch": 2, "step": 20, "train_loss": 2.0, "train_auxiliary": 0.25},
        {"event": "epoch", "epoch": 2, "step": 20, "train_loss": 2.0, "dev_loss": 2.2, "dev_bpc": 3.1},
        {"event": "test", "best_epoch": 1, "test_bpc": 2.8},
    ]
    plot_curves(_write(tmp_path, records), tmp_path, "bpc")
    assert _lines(figures["loss.png"])["train"] == ([10, 20], [2.5, 1.75])
    assert _lines(figures["bpc.png"])["test (best dev)"] == ([10], [2.8])
