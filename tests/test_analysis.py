"""Hidden-state heat maps (QRNN paper Figure 3) of a trained run."""

from __future__ import annotations

import types

import numpy as np
import pytest
import torch
from conftest import train_toy_run, write_sentiment_corpus
from torch import nn

from seqzoo.analysis.hidden import HiddenStates, hidden_state_figure, hidden_states, plot_hidden_states
from seqzoo.cli import main
from seqzoo.config import load_config
from seqzoo.training.runner import load_task, run

TEXT = "the film was great and the plot was fine but the actor was dull"


@pytest.fixture(scope="module")
def qrnn_run(tmp_path_factory):
    model = "model: {encoder: qrnn, encoder_args: {hidden_size: 10, num_layers: 2, window: 2}, pooler: mean}\n"
    return train_toy_run(tmp_path_factory.mktemp("hidden"), model)


def _encoder_outputs(task, tokens):
    model = task.model.eval()
    with torch.no_grad():
        ids = torch.tensor([task.vocab.encode(tokens)])
        return model.encoder(model.embedding(ids), torch.ones_like(ids, dtype=torch.bool))[0][0]  # (T, D)


def test_plotted_matrix_is_the_encoder_output(qrnn_run, tmp_path):
    task = load_task(qrnn_run, with_data=False)
    path, states = plot_hidden_states(task, TEXT, tmp_path / "hidden.png")
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    outputs = _encoder_outputs(task, TEXT.split())
    assert states.tokens == TEXT.split() and states.channels == list(range(10))
    assert torch.allclose(states.values, outputs)
    image = hidden_state_figure(states).axes[0].images[0].get_array()
    assert np.allclose(image, outputs.T.numpy())  # units down, tokens across


def test_many_units_get_thin_unlabelled_rows():
    tokens = "a gorgeous witty film".split()
    few = hidden_state_figure(HiddenStates(tokens, list(range(32)), torch.randn(4, 32)))
    many = hidden_state_figure(HiddenStates(tokens, list(range(256)), torch.randn(4, 256)))
    assert len(few.axes[0].get_yticks()) == 32 and few.get_size_inches()[1] == pytest.approx(0.12 * 32 + 1.5)
    assert 8 < many.get_size_inches()[1] < 11  # was 30 inches: a strip eight times as high as wide


def test_channels_keeps_the_most_variable_units(qrnn_run):
    task = load_task(qrnn_run, with_data=False)
    states = hidden_states(task, TEXT, channels=4)
    outputs = _encoder_outputs(task, TEXT.split())
    variance = outputs.var(0)
    assert states.channels == sorted(states.channels) and len(states.channels) == 4
    assert variance[states.channels].min() >= variance.sort(descending=True).values[3]
    assert torch.allclose(states.values, outputs[:, states.channels])


def test_cli_reads_text_or_file(qrnn_run, tmp_path, capsys):
    document = tmp_path / "doc.txt"
    document.write_text(TEXT + "\n", encoding="utf-8")
    command = ["plot-hidden", str(qrnn_run)]
    assert main([*command, "--text", TEXT, "--out", str(tmp_path / "a.png"), "--channels", "3"]) == 0
    assert main([*command, "--input", str(document), "--out", str(tmp_path / "b.png")]) == 0
    assert capsys.readouterr().out.split() == [str(tmp_path / "a.png"), str(tmp_path / "b.png")]
    assert main([*command, "--text", "   ", "--out", str(tmp_path / "c.png")]) != 0


class _StubTask:
    """What hidden_states reads: tokenizer, vocab, config.data.max_len, model.embedding/encoder."""

    def __init__(self, table, max_len=None, dropout=0.0):
        self.tokenizer = str.split
        self.vocab = types.SimpleNamespace(encode=lambda tokens: [int(t) for t in tokens])
        self.config = types.SimpleNamespace(data=types.SimpleNamespace(max_len=max_len))
        self.model = nn.Module()
        self.model.embedding = nn.Embedding.from_pretrained(table)
        drop = nn.Dropout(dropout)

        class Identity(nn.Module):
            def __init__(self):
                super().__init__()
                self.drop = drop

            def forward(self, x, mask):
                return self.drop(x), None

        self.model.encoder = Identity()


def test_hidden_states_keep_the_units_of_largest_variance_not_magnitude():
    """Units are chosen by variance over the text, not by mean |value| (a large constant unit is no
    feature of the text)."""
    table = torch.tensor([[10.0, 0.0, 0.1], [10.0, 1.0, 0.2], [10.0, -1.0, 0.3]])
    states = hidden_states(_StubTask(table), "0 1 2 1", channels=1)
    assert states.channels == [1]


def test_hidden_states_are_read_with_dropout_off_and_cut_at_max_len():
    """Read in eval mode (no dropout noise in the figure), cut at data.max_len, and the model
    given back in its mode."""
    table = torch.arange(1.0, 13.0).view(4, 3)
    task = _StubTask(table, max_len=3, dropout=0.5)
    states = hidden_states(task, "0 1 2 3")
    assert states.tokens == ["0", "1", "2"] and torch.equal(states.values, table[:3])
    assert task.model.training  # given back in its mode


def test_hidden_states_of_a_model_with_character_features(tmp_path):
    """The encoder reads the word vectors and the char-CNN features it was trained on (it failed,
    asked for word vectors alone, where the model reads both)."""
    data = write_sentiment_corpus(tmp_path / "data", sizes=(60, 20, 20))
    overrides = [f"data.data_dir={data}", "data.name=toy", "data.embedding_dim=6", "model.char_encoder=cnn",
                 "model.char_hidden_size=4", "model.encoder=gru", "model.encoder_args={hidden_size: 5}",
                 "train.epochs=1", "train.progress=false"]  # fmt: skip
    run(load_config(None, overrides), tmp_path / "run")
    task = load_task(tmp_path / "run", with_data=False)
    states = hidden_states(task, TEXT)
    model = task.model.eval()
    with torch.no_grad():
        inputs = task._inputs([task._encode_text(TEXT, 1)[0]])  # ids, mask, char ids (1, T, C)
        expected = model.encoder(model.embedding(inputs[0], inputs[2]), inputs[1])[0][0]  # (T, D)
    assert torch.allclose(states.values, expected)
