"""DA-GRN depth analyses (seqzoo.analysis.depths, ``seqzoo plot-depths``) on a tiny trained run."""

from __future__ import annotations

import json
import textwrap
import types

import pytest
import torch
from conftest import train_toy_run
from torch import nn

from seqzoo.analysis.depths import DepthHistogram, SentenceDepths, depth_figure, sentence_depths, split_depths
from seqzoo.cli import main
from seqzoo.training.runner import load_task

TEXT = "the film was great and the plot was fine but the actor was dull"
LAYERS = 3


@pytest.fixture(scope="module")
def dagrn_run(tmp_path_factory):
    torch.set_num_threads(1)
    model = textwrap.dedent(f"""\
        model:
          encoder: dagrn
          encoder_args: {{hidden_size: 16, num_layers: {LAYERS}, depth_size: 4, dropout: 0.1}}
          pooler: meanmaxglobal
          char_encoder: cnn
          char_embedding_dim: 4
          char_hidden_size: 4
        """)
    return train_toy_run(tmp_path_factory.mktemp("depths"), model)


@pytest.fixture(scope="module")
def task(dagrn_run):
    return load_task(dagrn_run)


def _forward(task, texts: list[str]) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Logits (B, C), depths (B, T) and mask (B, T) of one batch of raw texts, dropout off."""
    model = task.model.eval()
    inputs = task._inputs([task._encode_text(text, line)[0] for line, text in enumerate(texts, 1)])
    with torch.no_grad():
        logits = model(*inputs)
    return logits, model.encoder.last_depths, inputs[1]


def _test_texts(dagrn_run) -> tuple[list[str], list[str]]:
    path = load_task(dagrn_run, with_data=False).config.data.data_dir + "/toy.test"
    rows = [line.split("\t", 1) for line in open(path, encoding="utf-8").read().splitlines()]
    return [text for _, text in rows], [label for label, _ in rows]


def test_sentence_depths_are_the_encoders(task):
    found = sentence_depths(task, TEXT)
    _, depths, mask = _forward(task, [TEXT])
    assert found.tokens == TEXT.split()
    assert found.depths == depths[0][mask[0]].tolist()
    assert all(1 <= d <= LAYERS for d in found.depths)  # depth_offset 1: 1..L updates


def test_split_histogram_counts_every_real_word_and_scores_both_depths(task, dagrn_run):
    histogram = split_depths(task, "test")
    texts, labels = _test_texts(dagrn_run)
    expected = torch.zeros(LAYERS + 1, dtype=torch.long)
    for text in texts:  # one sentence at a time: another batching than evaluate's
        expected += torch.bincount(torch.tensor(sentence_depths(task, text).depths), minlength=LAYERS + 1)
    assert histogram.counts == expected.tolist()
    assert histogram.num_layers == LAYERS and histogram.counts[0] == 0
    assert histogram.mean == pytest.approx(float((expected * torch.arange(LAYERS + 1)).sum() / expected.sum()))
    gold = torch.tensor([task.label_names.index(label) for label in labels])
    logits, _, _ = _forward(task, texts)
    assert histogram.accuracy == pytest.approx(float((logits.argmax(-1) == gold).double().mean()))
    task.model.encoder.full_depth = True
    try:
        full_logits, _, _ = _forward(task, texts)
    finally:
        task.model.encoder.full_depth = False
    assert histogram.full_depth_accuracy == pytest.approx(float((full_logits.argmax(-1) == gold).double().mean()))
    assert task.model.encoder.full_depth is False  # restored
    if sum(histogram.counts[:LAYERS]):  # some word stops before L
        assert not torch.allclose(logits, full_logits)  # the ablation changes the computation


def test_figure_draws_the_depths_and_the_shares():
    sentence = SentenceDepths(["a", "fine", "film"], [1, 3, 2])
    histogram = DepthHistogram("test", 3, [0, 2, 1, 1], 0.5, 0.75)
    fig = depth_figure(sentence, histogram)
    top, bottom = fig.axes
    assert [p.get_height() for p in top.patches] == [1, 3, 2]
    assert [t.get_text() for t in top.get_xticklabels()] == ["a", "fine", "film"]
    assert [p.get_height() for p in bottom.patches] == pytest.approx([0, 50, 25, 25])
    assert "mean depth 1.75 of 3" in bottom.get_title() and "full depth 75.00" in bottom.get_title()
    assert len(depth_figure(sentence).axes) == 1


def test_refuses_models_without_depths():
    task = types.SimpleNamespace(model=types.SimpleNamespace(encoder=nn.LSTM(2, 2)), predict=None, tokenizer=None)
    with pytest.raises(ValueError, match="dagrn"):
        sentence_depths(task, TEXT)


def test_cli_writes_the_png_and_the_record(dagrn_run, tmp_path, capsys):
    out = tmp_path / "depths.png"
    assert main(["plot-depths", str(dagrn_run), "--text", TEXT, "--out", str(out), "--split", "dev"]) == 0
    path, line = capsys.readouterr().out.strip().splitlines()
    assert path == str(out) and out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    record = json.loads(line)
    histogram = split_depths(load_task(dagrn_run), "dev")
    assert record["tokens"] == TEXT.split() and record["counts"] == histogram.counts
    assert record["split"] == "dev" and record["full_depth_accuracy"] == histogram.full_depth_accuracy
    assert main(["plot-depths", str(dagrn_run), "--text", TEXT, "--out", str(out), "--split", "none"]) == 0
    assert "counts" not in json.loads(capsys.readouterr().out.strip().splitlines()[1])
    assert main(["plot-depths", str(dagrn_run), "--text", "   ", "--out", str(out)]) == 2
