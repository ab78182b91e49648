"""Zone relevance (MZU paper Figure 3) on a tiny char-level MZU language model trained in-process."""

import random

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from seqzoo import build_encoder
from seqzoo.analysis.zones import plot_zone_relevance, relevance_matrix, zone_relevance
from seqzoo.cli import main
from seqzoo.config import config_from_dict
from seqzoo.tasks.lm import LMTask
from seqzoo.training.runner import load_task, run

WORDS = ["agreements", "payments", "the", "signed", "inc.", "talks", "ended"]


def _config(tmp_path, encoder="mzu", encoder_args=None):
    return config_from_dict({
        "task": "lm", "name": "zones", "output_dir": str(tmp_path / "runs"),
        "data": {"data_dir": str(tmp_path / "corpus"), "level": "char", "batch_size": 4, "eval_batch_size": 2,
                 "bptt": 16, "embedding_dim": 8},
        "model": {"encoder": encoder, "encoder_args": encoder_args or {
            "hidden_size": 8, "composition": "cap", "num_zones": 4, "filter_size": 8, "transition_depth": 1,
            "share_transition": True, "dropout": 0.1}, "dropout": 0.0},
        "train": {"epochs": 1, "patience": None, "seed": 1, "progress": False, "checkpoint_every": 0},
    })  # fmt: skip


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    tmp_path = tmp_path_factory.mktemp("zones")
    rng = random.Random(0)
    (tmp_path / "corpus").mkdir()
    for stem, lines in (("train", 40), ("valid", 6), ("test", 6)):
        text = "\n".join(" ".join(rng.choices(WORDS, k=5)) for _ in range(lines)) + "\n"
        (tmp_path / "corpus" / f"{stem}.txt").write_text(text)
    yield tmp_path
    torch.set_num_threads(threads)


@pytest.fixture(scope="module")
def trained(corpus):
    run(_config(corpus), corpus / "capmzu")
    return corpus / "capmzu"


@pytest.fixture(scope="module")
def trained_gru(corpus):
    run(_config(corpus, "gru_ln", {"hidden_size": 8, "dropout": 0.1}), corpus / "gru")
    return corpus / "gru"


def test_relevance_matrix_is_masked_cosine():
    torch.manual_seed(0)
    cand, states = torch.randn(5, 6), torch.randn(5, 6)
    per_zone = relevance_matrix(cand, states, 3)
    assert per_zone.shape == (3, 5, 5)
    assert torch.isnan(per_zone[:, 2, 2:]).all() and not torch.isnan(per_zone[:, 2, :2]).any()
    assert per_zone[1, 4, 0] == pytest.approx(float(F.cosine_similarity(cand[4, 2:4], states[0, 2:4], dim=0)))
    overall = relevance_matrix(cand, states)[0]
    assert overall[3, 1] == pytest.approx(float(F.cosine_similarity(cand[3], states[1], dim=0)))


def test_zone_relevance_of_a_trained_model(trained):
    task = load_task(trained, with_data=False)
    text = "signed agreements"
    relevance = zone_relevance(task, text)
    steps = len(text)
    assert relevance.chars == list(text)
    assert relevance.overall.shape == (steps, steps) and relevance.zones.shape == (4, steps, steps)
    known = ~torch.isnan(relevance.overall)
    assert known.sum() == steps * (steps - 1) // 2 and (relevance.overall[known].abs() <= 1 + 1e-6).all()
    # the states are the encoder's own outputs: recompute one cosine from a plain forward pass
    ids = torch.tensor([task.vocab.encode(list(text))])
    task.model.eval()
    with torch.no_grad():
        outputs, _ = task.model.encoder(task.model.embedding(ids))
        candidates, _ = task.model.encoder.trace(task.model.embedding(ids))
    expected = F.cosine_similarity(candidates[0, -1, 0, 2:4], outputs[0, 3, 2:4], dim=0)
    assert relevance.zones[1, -1, 3] == pytest.approx(float(expected), abs=1e-6)
    deeper = zone_relevance(task, text, depth=1)
    assert not torch.allclose(deeper.overall[known], relevance.overall[known])
    with pytest.raises(ValueError, match="depth"):
        zone_relevance(task, text, depth=2)


def test_characters_outside_the_vocabulary_are_named(trained, caplog):
    """They are read as <unk> but labelled as written, so the plot would show a character the model never saw."""
    task = load_task(trained, with_data=False)
    zone_relevance(task, "pay€ments")
    assert "characters outside the vocabulary, read as <unk>: '€'" in caplog.text


def test_plot_and_cli(trained, tmp_path, capsys):
    task = load_task(trained, with_data=False)
    path = plot_zone_relevance(zone_relevance(task, "the talks ended\n"), tmp_path / "direct.png", last=3)
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    out = tmp_path / "fig" / "zones.png"
    assert main(["plot-zones", str(trained), "--text", "payments", "--out", str(out)]) == 0
    assert out.stat().st_size > 1000 and str(out) in capsys.readouterr().out
    assert main(["plot-zones", str(trained), "--text", "payments", "--out", str(out), "--last", "0"]) == 2
    assert "last must be >= 1" in capsys.readouterr().err
    assert main(["plot-hidden", str(trained), "--text", "payments", "--out", str(out)]) == 2  # an LM run
    assert "plot-hidden reads classification and ABSA runs" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("name", "args"), [("mzu", {"composition": "gcn"}), ("gru_ln", {}), ("dtgru", {"transition_depth": 0})]
)
def test_trace_in_training_returns_the_candidate_the_state_takes(name, args):
    """With dropout in training, the traced h̃ is the one after dropout, which the state moves towards
    (h_t − h_{t−1} = u ⊙ (h̃_t − h_{t−1})); the DT-GRU's and GRU+LN's trace returned it before dropout."""
    torch.manual_seed(0)
    encoder = build_encoder(name, 5, hidden_size=8, dropout=0.5, **args).double().train()
    candidates, states = encoder.trace(torch.randn(3, 9, 5, dtype=torch.float64))
    previous = torch.cat([torch.zeros(3, 1, 8, dtype=torch.float64), states[:, :-1]], dim=1)
    step, towards = states - previous, candidates[:, :, 0] - previous
    assert (candidates == 0).any()  # dropout acted
    assert torch.equal(step.sign(), towards.sign())


def test_dt_gru_trace_in_training_returns_every_depths_candidate_after_dropout():
    """The T-GRUs' candidates too: tanh never gives exactly 0, dropout does."""
    torch.manual_seed(0)
    encoder = build_encoder("dtgru", 5, hidden_size=8, dropout=0.5, transition_depth=2).train()
    candidates, _ = encoder.trace(torch.randn(3, 9, 5))
    assert all((candidates[:, :, depth] == 0).any() for depth in range(3))


@pytest.mark.parametrize(("name", "args"), [("gru_ln", {}), ("dtgru", {"transition_depth": 2})])
def test_gru_trace_matches_the_encoder(name, args):
    """Figure 3(a) needs the GRU's candidates: the trace's states are the encoder's own outputs,
    and each state is the update gate's mix of the previous state and the traced candidate."""
    torch.manual_seed(0)
    encoder = build_encoder(name, 5, hidden_size=6, num_layers=2, dropout=0.2, **args).eval()
    x = torch.randn(3, 7, 5)
    with torch.no_grad():
        outputs, _ = encoder(x)
        candidates, states = encoder.trace(x)
    assert candidates.shape == (3, 7, 1 + args.get("transition_depth", 0), 6)
    torch.testing.assert_close(states, outputs)
    top = encoder.cells[-1]
    _, layer_input = encoder.cells[0].trace(x.transpose(0, 1), torch.zeros(3, 6))  # layer 1: (T, B, H)
    h = torch.zeros(3, 6)
    for t in range(7):
        x_part = top.cells[0].x_proj(layer_input[t])
        cand, u = top.cells[0].candidate_and_gate(x_part, h)
        torch.testing.assert_close(cand, candidates[:, t, 0])
        h = torch.lerp(h, cand, u)
        for depth, cell in enumerate(top.cells[1:], 1):
            cand, u = cell.candidate_and_gate(None, h)
            torch.testing.assert_close(cand, candidates[:, t, depth])
            h = torch.lerp(h, cand, u)
        torch.testing.assert_close(h, states[:, t])


def test_gru_and_mzu_panels_in_one_figure(trained, trained_gru, tmp_path, capsys):
    """The paper's Figure 3: (a) the GRU, (b) the capMZU, (c) the capMZU's zones, for one text."""
    gru = zone_relevance(load_task(trained_gru, with_data=False), "signed agreements")
    assert gru.zones.shape == (1, 17, 17)
    torch.testing.assert_close(gru.zones[0], gru.overall, equal_nan=True)  # a GRU has one "zone"
    out = tmp_path / "figure3.png"
    assert main(["plot-zones", str(trained_gru), str(trained), "--text", "payments", "--out", str(out)]) == 0
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and str(out) in capsys.readouterr().out
    mzu = zone_relevance(load_task(trained, with_data=False), "the talks")
    with pytest.raises(ValueError, match="same text"):
        plot_zone_relevance({"GRU": gru, "capMZU": mzu}, tmp_path / "mixed.png")


@pytest.fixture
def figures(monkeypatch):
    """The figures plot_zone_relevance draws, in order, instead of PNGs."""
    drawn = []
    monkeypatch.setattr("seqzoo.analysis.zones.save_figure", lambda fig, path: drawn.append(fig) or path)
    return drawn


def test_the_per_block_panel_is_labelled_as_blocks_of_units(trained, tmp_path, figures):
    """The panel slices h̃ and h into N blocks of units, which are not the MZU's zones (its last linear
    map mixes every zone into every unit): labelled "block k", not "zone k"; an MZU whose candidate
    is no M-function (regular_trans) has one block, not the gate's N."""
    plot_zone_relevance(zone_relevance(load_task(trained, with_data=False), "the talks"), tmp_path / "x.png")
    blocks = figures[0].axes[1]  # the relevance panel, then the blocks panel (then their colour bars)
    assert [t.get_text() for t in blocks.get_yticklabels()] == ["block 1", "block 2", "block 3", "block 4"]
    assert "not zones" in blocks.get_title()
    args = {"hidden_size": 8, "composition": "cap", "num_zones": 4, "filter_size": 8, "regular_trans": True}
    task = LMTask(_config(tmp_path, "mzu", args), {"train": list("abc abc\n")})
    assert zone_relevance(task, "abc").zones.shape[0] == 1


def test_other_encoders_are_refused(tmp_path):
    task = LMTask(_config(tmp_path, "lstm", {"hidden_size": 8}), {"train": list("abc abc\n")})
    with pytest.raises(ValueError, match="needs an MZU, GRU"):
        zone_relevance(task, "abc")


def test_char_sampling_never_draws_unk_and_warns_of_unknown_prime_characters(trained, caplog):
    from seqzoo.tasks.lm import sample

    task = load_task(trained, with_data=False)
    with caplog.at_level("WARNING", logger="seqzoo"):
        text = sample(task, length=400, temperature=50.0, prime="€t", seed=1)  # near-uniform draws
    assert text.startswith("€t") and "<unk>" not in text
    assert "prime tokens outside the vocabulary, read as <unk>: '€'" in caplog.text


def test_zone_plot_panels_show_the_last_characters_and_the_final_ones_blocks(tmp_path, figures):
    """The panel shows the last characters' relevance rows, and the block panel the final one's."""
    from seqzoo.analysis.zones import ZoneRelevance

    torch.manual_seed(0)
    cand, state = torch.randn(7, 8), torch.randn(7, 8)
    rel = ZoneRelevance(list("abcdefg"), relevance_matrix(cand, state)[0], relevance_matrix(cand, state, 4))
    plot_zone_relevance(rel, tmp_path / "x.png", last=3)
    panel, blocks = (ax.images[0].get_array() for ax in figures[0].axes[:2])
    assert torch.allclose(torch.tensor(np.ma.filled(panel, np.nan)), rel.overall[4:], equal_nan=True)
    assert torch.allclose(torch.tensor(np.ma.filled(blocks, np.nan)), rel.zones[:, -1], equal_nan=True)
