"""QRNN encoder–decoder (eqs. 7–8), its LSTM baseline, beam search (appendix eq. 9) and the translation recipe."""

from __future__ import annotations

import importlib.util
import itertools
import json
import math
import random
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from conftest import metric_records

import seqzoo
from seqzoo.cli import main
from seqzoo.config import ConfigError, load_config
from seqzoo.data.batching import pad_batch
from seqzoo.data.errors import DataError
from seqzoo.data.translation import read_parallel
from seqzoo.encoders.qrnn import QRNN, QRNNLayer
from seqzoo.heads.seq2seq import (
    EncoderOutput,
    LSTMSeq2Seq,
    QRNNDecoderLayer,
    QRNNSeq2Seq,
    beam_search,
    build_seq2seq,
    length_normalized_score,
)
from seqzoo.testing import assert_contract

BOS, EOS = 2, 3


def _model(seed: int = 0, kind: str = "qrnn") -> QRNNSeq2Seq | LSTMSeq2Seq:
    torch.manual_seed(seed)
    if kind == "lstm":
        return LSTMSeq2Seq(12, 6, 5, num_layers=3).double().eval()
    windows = {"encoder_window": [3, 2, 1], "decoder_window": [2, 2, 1]}
    return QRNNSeq2Seq(12, 6, 5, num_layers=3, enc_state="c" if kind == "qrnn_c" else "h", **windows).double().eval()


KINDS = ["qrnn", "qrnn_c", "lstm"]  # qrnn_c: the QRNN with enc_state="c"
RECIPES = ["qrnn", "lstm"]


@pytest.mark.parametrize("window", [1, 2, 3, 4])
def test_centred_window_is_a_direct_convolution(window):
    torch.manual_seed(0)
    layer = QRNNLayer(3, 4, window, "fo", causal=False).double()
    x = torch.randn(2, 6, 3, dtype=torch.float64)
    lengths = torch.tensor([6, 4])
    h, _, _ = layer(x, lengths)
    left = (window - 1) // 2
    for b, n in enumerate(lengths.tolist()):
        row = F.pad(x[b, :n], (0, 0, left, window - 1 - left))  # zeros outside the row
        windows = torch.cat([row[j : j + n] for j in range(window)], -1)
        z, f, o = layer.linear(windows).view(n, 3, 4).unbind(1)
        c, expected = torch.zeros(4, dtype=torch.float64), []
        for t in range(n):
            c = torch.sigmoid(f[t]) * c + (1 - torch.sigmoid(f[t])) * torch.tanh(z[t])
            expected.append(torch.sigmoid(o[t]) * c)
        torch.testing.assert_close(h[b, :n], torch.stack(expected))
        assert not h[b, n:].any()


def test_non_causal_qrnn_contract():
    torch.manual_seed(0)
    encoder = QRNN(6, 5, num_layers=2, window=[4, 2], causal=False)
    assert not encoder.causal and not encoder.stateful
    assert_contract(encoder)


@pytest.mark.parametrize("kind", KINDS)
def test_padded_pair_equals_the_pair_alone(kind):
    model = _model(kind=kind)
    src, src_mask = pad_batch([[4, 5, 6, 7, 8], [9, 10]])
    tgt, tgt_mask = pad_batch([[BOS, 4, 5], [BOS, 6, 7, 8, 9]])
    batched = model(src, src_mask, tgt, tgt_mask)
    for b in range(2):
        s, t = src[b : b + 1, : int(src_mask[b].sum())], tgt[b : b + 1, : int(tgt_mask[b].sum())]
        alone = model(s, torch.ones_like(s, dtype=torch.bool), t, torch.ones_like(t, dtype=torch.bool))
        torch.testing.assert_close(batched[b, : t.shape[1]], alone[0])


@pytest.mark.parametrize("kind", KINDS)
def test_source_and_target_masks_are_checked(kind):
    model = _model(kind=kind)
    src, src_mask = pad_batch([[4, 5, 6], [9, 10]])
    tgt, tgt_mask = pad_batch([[BOS, 4, 5], [BOS, 6]])
    for bad, error, message in (
        (src_mask.flip(1), ValueError, "right-padded"),  # left padding gave other logits, silently
        (src_mask.long(), TypeError, r"mask must be a bool tensor \(True = real token\), got torch\.int64"),
        (src_mask[:, :2], ValueError, r"mask shape \(2, 2\) does not match input \(batch, time\) = \(2, 3\)"),
    ):
        with pytest.raises(error, match=message):
            model(src, bad, tgt, tgt_mask)
        with pytest.raises(error, match=message):
            model(src, src_mask, tgt, bad)


def test_the_default_encoder_windows_fit_any_depth():
    """The paper's widths, 6 for the first encoder layer and 2 for the others, at any num_layers."""
    for layers in (1, 2, 4):
        model = QRNNSeq2Seq(12, 6, 5, num_layers=layers)
        assert [layer.window for layer in model.encoder] == [6] + [2] * (layers - 1)


def test_default_dropout_is_the_papers():
    """MODELS.md 1.9: none in the QRNN model, 0.2 in the LSTM baseline."""
    assert QRNNSeq2Seq(12, 6, 5).dropout.p == 0.0
    assert LSTMSeq2Seq(12, 6, 5).dropout.p == 0.2


@pytest.mark.parametrize("kind", KINDS)
def test_stepwise_decoding_equals_whole_prefix(kind):
    model = _model(kind=kind)
    src, src_mask = pad_batch([[4, 5, 6, 7], [9, 10, 11]])
    tgt = torch.tensor([[BOS, 4, 5, 6, 7], [BOS, 8, 9, 10, 11]])
    encoded = model.encode(src, src_mask)
    whole, _ = model.decode(tgt, encoded)
    state, steps = None, []
    for t in range(tgt.shape[1]):
        logits, state = model.decode(tgt[:, t : t + 1], encoded, state=state)
        steps.append(logits)
    torch.testing.assert_close(torch.cat(steps, 1), whole)


def test_attention_ignores_source_padding_and_encoder_state_conditions_every_layer():
    model = _model()
    src, src_mask = pad_batch([[4, 5, 6], [7, 8]])
    encoded = model.encode(src, src_mask)
    tgt = torch.tensor([[BOS, 4], [BOS, 5]])
    _, _, alpha = model.decoder[-1](
        torch.randn(2, 2, 5, dtype=torch.float64), torch.tensor([2, 2]), encoded, encoded.finals[-1]
    )
    assert alpha[1, :, 2].eq(0).all() and torch.allclose(alpha.sum(-1), torch.ones(2, 2, dtype=torch.float64))
    # eq. 7: every decoder layer reads its encoder layer's final state (through V h̃_T)
    logits, _ = model.decode(tgt, encoded)
    for layer in range(3):
        finals = list(encoded.finals)
        finals[layer] = finals[layer] + 1
        assert not torch.allclose(model.decode(tgt, encoded._replace(finals=finals))[0], logits)


def test_authors_variant_reads_the_encoder_cell_states():
    """enc_state="c": eq. 7 reads each layer's c̃_T and eq. 8 attends over the last layer's c̃_s,
    which the last layer's outputs are gated from (h̃ = o ⊙ c̃); the paper form reads h̃."""
    src, src_mask = pad_batch([[4, 5, 6, 7], [9, 10]])
    paper, authors = _model(), _model(kind="qrnn_c")
    authors.load_state_dict(paper.state_dict())
    h_form, c_form = paper.encode(src, src_mask), authors.encode(src, src_mask)
    x, lengths = paper.embed_source(src, src_mask)
    for i, layer in enumerate(paper.encoder):
        x_next, c_last, _ = layer(x, lengths)
        # eq. 7's conditioning term V h̃_T (V c̃_T), projected once per source
        torch.testing.assert_close(c_form.finals[i], paper.decoder[i].condition(c_last))
        torch.testing.assert_close(h_form.finals[i], paper.decoder[i].condition(x_next[torch.arange(2), lengths - 1]))
        if i == len(paper.encoder) - 1:
            gates = layer.linear(layer.padded_input(x, lengths, x.new_zeros(2, 0, layer.input_size)))
            o = torch.sigmoid(gates.view(2, -1, 3, layer.hidden_size)[:, :, 2])
            torch.testing.assert_close(o * c_form.memory, x_next)
            torch.testing.assert_close(c_form.memory[torch.arange(2), lengths - 1], c_last)
        x = x_next
    assert not c_form.memory[1, 2:].any(), "cell states are zero at source pads"
    tgt = torch.tensor([[BOS, 4, 5], [BOS, 6, 7]])
    assert not torch.allclose(
        paper(src, src_mask, tgt, torch.ones_like(tgt, dtype=torch.bool)),
        authors(src, src_mask, tgt, torch.ones_like(tgt, dtype=torch.bool)),
    )
    assert build_seq2seq("qrnn", 12, 6, hidden_size=5, enc_state="c").enc_state == "c"  # model.encoder_args
    with pytest.raises(ValueError, match="enc_state"):
        QRNNSeq2Seq(12, 6, 5, enc_state="x")


@pytest.mark.parametrize("attention", [False, True])
def test_decoder_layer_gradcheck(attention):
    torch.manual_seed(0)
    layer = QRNNDecoderLayer(3, 4, window=2, attention=attention).double()
    memory = torch.randn(2, 3, 4, dtype=torch.float64, requires_grad=True)
    mask = torch.tensor([[True, True, True], [True, True, False]])
    x = torch.randn(2, 4, 3, dtype=torch.float64, requires_grad=True)
    final = torch.randn(2, 4, dtype=torch.float64, requires_grad=True)
    lengths = torch.tensor([4, 3])

    def run(x, memory, final):
        conditioning = layer.condition(final)
        return layer(x, lengths, EncoderOutput(memory, mask, [conditioning]), conditioning)[0]

    assert torch.autograd.gradcheck(run, (x, memory, final))


def test_one_layer_lstm_model_with_dropout_does_not_warn_it_has_no_effect():
    """Its dropout acts on the embeddings and before the output layer; the inner one-layer LSTMs
    warned "dropout=0.3 has no effect with num_layers=1"."""
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("error")
        LSTMSeq2Seq(20, 8, 8, num_layers=1, dropout=0.3)


def test_length_criterion_limits():
    assert length_normalized_score(-6.0, 3, 10, 0.0) == -6.0  # eq. 10: summed log-probability
    assert length_normalized_score(-6.0, 3, 10, 1.0) == pytest.approx(10 * -6.0 / 3)  # eq. 11: T_trg x mean
    # with alpha = 1 a longer hypothesis with the same mean log-probability ties
    assert length_normalized_score(-4.0, 2, 7, 1.0) == pytest.approx(length_normalized_score(-8.0, 4, 7, 1.0))


def _greedy(model, src, src_mask, max_len):
    encoded, out = model.encode(src, src_mask), []
    last, state = torch.tensor([[BOS]]), None
    for _ in range(max_len):
        logits, state = model.decode(last, encoded, state=state)
        logits[0, -1, [0, BOS]] = -math.inf
        token = int(logits[0, -1].argmax())
        if token == EOS:
            break
        out.append(token)
        last = torch.tensor([[token]])
    return out


@pytest.mark.parametrize(("seed", "kind"), list(itertools.product(range(4), KINDS)))
def test_beam_of_one_is_greedy(seed, kind):
    model = _model(seed, kind)
    src, src_mask = pad_batch([[4, 5, 6, 7]])
    assert beam_search(model, src, src_mask, BOS, EOS, beam_size=1, max_len=12) == [_greedy(model, src, src_mask, 12)]


def test_beam_search_max_len_is_the_limit_and_must_be_positive():
    model = _model(1, "qrnn")
    src, src_mask = pad_batch([[4, 5, 6, 7]])
    assert all(len(out) <= 1 for out in beam_search(model, src, src_mask, BOS, EOS, beam_size=2, max_len=1))
    for bad in (0, -1):
        with pytest.raises(ValueError, match="max_len must be >= 1"):
            beam_search(model, src, src_mask, BOS, EOS, max_len=bad)


@pytest.mark.parametrize("kind", KINDS)
def test_rows_that_stopped_leave_the_decoders_batch(kind, monkeypatch):
    """The decoder runs only the rows still searched; each row's translation is as decoded alone."""
    model = _model(1, kind)
    sources = [[4, 5], [6, 7, 8, 9, 10, 11, 4, 5, 6, 7, 8], [7]]
    alone = [beam_search(model, *pad_batch([source]), BOS, EOS, beam_size=3)[0] for source in sources]
    decode, sizes = model.decode, []
    monkeypatch.setattr(model, "decode", lambda last, *a, **kw: sizes.append(len(last)) or decode(last, *a, **kw))
    assert beam_search(model, *pad_batch(sources), BOS, EOS, beam_size=3) == alone
    assert sizes[0] == 3 * 3 and sizes[-1] == 3 and sorted(sizes, reverse=True) == sizes  # the longest row ends last


@pytest.mark.parametrize("kind", KINDS)
def test_banned_tokens_are_never_emitted(kind):
    """The translation task bans <unk>, which would print as five characters."""
    model = _model(1, kind)
    src, src_mask = pad_batch([[4, 5, 6, 7], [8, 9]])
    free = beam_search(model, src, src_mask, BOS, EOS, beam_size=3, max_len=12)
    token = free[0][0]
    banned = beam_search(model, src, src_mask, BOS, EOS, beam_size=3, max_len=12, banned=[token])
    assert all(token not in out for out in banned) and banned != free


@pytest.mark.parametrize("kind", KINDS)
def test_a_row_decodes_alike_alone_and_in_any_batch(kind):
    """Each row's step limit is its own (twice its source + 10), not that of the batch's longest source."""
    model = _model(1, kind)
    sources = [[4, 5], [6, 7, 8, 9, 10, 11, 4, 5, 6, 7, 8], [7]]
    together = beam_search(model, *pad_batch(sources), BOS, EOS, beam_size=3)
    alone = [beam_search(model, *pad_batch([source]), BOS, EOS, beam_size=3)[0] for source in sources]
    assert together == alone
    assert max(len(out) for out in alone) > 2 * 1 + 10  # some row ran into a limit (else the test shows nothing)


def test_lstm_decoder_starts_from_the_encoder_states_and_attends_over_real_tokens():
    model = _model(kind="lstm")
    src, src_mask = pad_batch([[4, 5, 6], [7, 8]])
    encoded = model.encode(src, src_mask)
    assert len(encoded.finals) == 3 and encoded.finals[0].shape == (2, 2, 5)  # (B, [h; c], H) per layer
    tgt = torch.tensor([[BOS, 4], [BOS, 5]])
    logits, _ = model.decode(tgt, encoded)
    # whatever the memory holds at the padded source position, the output is the same
    junk = encoded.memory.clone()
    junk[1, 2] = 100.0
    torch.testing.assert_close(model.decode(tgt, encoded._replace(memory=junk))[0], logits)
    # every decoder layer starts from its encoder layer's final (h, c)
    for layer in range(3):
        finals = list(encoded.finals)
        finals[layer] = finals[layer] + 1
        assert not torch.allclose(model.decode(tgt, encoded._replace(finals=finals))[0], logits)


def test_lstm_decoder_gradcheck():
    model = _model(kind="lstm")
    mask = torch.tensor([[True, True, True], [True, True, False]])
    memory = torch.randn(2, 3, 5, dtype=torch.float64, requires_grad=True)
    finals = [torch.randn(2, 2, 5, dtype=torch.float64, requires_grad=True) for _ in range(3)]
    tgt, tgt_mask = pad_batch([[BOS, 4, 5], [BOS, 6]])

    def run(memory, *finals):
        return model.decode(tgt, EncoderOutput(memory, mask, list(finals)), tgt_mask)[0]

    assert torch.autograd.gradcheck(run, (memory, *finals))


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_beam_search_on_cuda_equals_cpu():
    model = _model(1)
    src, src_mask = pad_batch([[4, 5, 6, 7], [8, 9]])
    expected = beam_search(model, src, src_mask, BOS, EOS, beam_size=3, max_len=12)
    found = beam_search(model.cuda(), src.cuda(), src_mask.cuda(), BOS, EOS, beam_size=3, max_len=12)
    assert found == expected


def test_read_parallel_names_the_short_file(tmp_path):
    (tmp_path / "a.de").write_text("eins\nzwei\n", encoding="utf-8")
    (tmp_path / "a.en").write_text("one\n", encoding="utf-8")
    with pytest.raises(DataError, match=r"a\.en:2: has 1 lines"):
        read_parallel(tmp_path / "a.de", tmp_path / "a.en")
    (tmp_path / "a.en").write_text("one\n\n", encoding="utf-8")
    with pytest.raises(DataError, match=r"a\.en:2: empty line"):
        read_parallel(tmp_path / "a.de", tmp_path / "a.en")
    (tmp_path / "a.en").write_text("", encoding="utf-8")  # crashed after training when a dev or test file
    with pytest.raises(DataError, match=r"a\.en: empty file: no lines"):
        read_parallel(tmp_path / "a.de", tmp_path / "a.en")


def test_a_training_set_emptied_by_max_chars_is_refused(tmp_path):
    """It trained 0 steps and reported BLEU 0 with exit status 0."""
    from seqzoo.tasks.translation import read_splits

    _write_copy_corpus(tmp_path)
    cfg = load_config(None, ["task=translation", f"data.data_dir={tmp_path}", "data.max_chars=3"])
    with pytest.raises(DataError, match=r"no training pair has both sides within data\.max_chars=3 characters"):
        read_splits(cfg.data)


def _write_pairs(root: Path, pairs: dict[str, list[tuple[str, str]]]) -> None:
    """{split: [(German, English), ...]} as {split}.de / {split}.en in ``root``."""
    for split, rows in pairs.items():
        (root / f"{split}.de").write_text("".join(src + "\n" for src, _ in rows), encoding="utf-8")
        (root / f"{split}.en").write_text("".join(tgt + "\n" for _, tgt in rows), encoding="utf-8")


def _write_copy_corpus(root: Path) -> None:
    """A toy 'translation' that reverses words, enough for the pipeline to learn something."""
    rng = random.Random(0)
    words = ["ab", "cd", "ef", "gh", "ij"]
    pairs = {}
    for split, n in (("train", 800), ("dev", 20), ("test", 20)):
        sources = [" ".join(rng.choice(words) for _ in range(rng.randint(4, 6))) for _ in range(n)]
        pairs[split] = [(src, src[::-1]) for src in sources]
    _write_pairs(root, pairs)


TOY_ENCODER_ARGS = {
    "qrnn": "{hidden_size: 32, num_layers: 2, encoder_window: [3, 2], decoder_window: 2}",
    "lstm": "{hidden_size: 32, num_layers: 2}",
}


def _toy_translation_config(tmp_path: Path, kind: str, beam_size: int, epochs: int, precision: str = "fp32") -> Path:
    """The word-reversal corpus in ``tmp_path`` and a config that trains ``kind`` on it."""
    _write_copy_corpus(tmp_path)
    config = tmp_path / "config.yaml"
    train = f"epochs: {epochs}, patience: null, batch_size: 16, eval_batch_size: 32, progress: false, threads: 1"
    config.write_text(
        f"""
name: toy_translation
task: translation
data: {{data_dir: {tmp_path}, max_chars: 300, embedding_dim: 16, beam_size: {beam_size}}}
model: {{encoder: {kind}, encoder_args: {TOY_ENCODER_ARGS[kind]}, dropout: 0.0}}
optim: {{optimizer: adam, lr: 0.01}}
train: {{{train}, precision: {precision}}}
""",
        encoding="utf-8",
    )
    return config


@pytest.mark.parametrize("kind", RECIPES)
def test_translation_recipe_end_to_end(tmp_path, capsys, kind):
    pytest.importorskip("sacrebleu")
    config = _toy_translation_config(tmp_path, kind, beam_size=4, epochs=8)
    run_dir = tmp_path / "run"
    assert main(["train", str(config), "--run-dir", str(run_dir)]) == 0
    test = next(r for r in metric_records(run_dir) if r.get("event") == "test")
    signatures = json.loads((run_dir / "best/sacrebleu.json").read_text())  # TASKS.md: BLEU with its signature
    assert set(signatures) == {"bleu", "chrf"} and "tok:13a" in signatures["bleu"] and "nc:6" in signatures["chrf"]
    assert test["test_bleu"] > 50 and test["test_chrf"] > 50  # learnt the reversal, not noise
    source = tmp_path / "input.txt"
    source.write_text("ab cd ef gh\n", encoding="utf-8")
    capsys.readouterr()
    assert main(["predict", str(run_dir), "--input", str(source)]) == 0
    # What the trained model itself decodes for the line (its quality is the test set's bar above: one
    # sentence's translation depends on the CPU's rounding, e.g. "hg fe dc ba", "hg fe dc dc" or
    # "hg fe ba ba" from the same commit on AVX-512 and AVX2 kernels).
    translation = json.loads(capsys.readouterr().out)["translation"]
    assert translation == seqzoo.load(run_dir).predict(["ab cd ef gh"])[0]["translation"]


@pytest.mark.parametrize("kind", RECIPES)
def test_translation_trains_in_bf16(tmp_path, kind):
    """``train.precision: bf16``: the encoder-decoder's steps (attention over a masked source,
    the QRNN decoder's carried windows) run under CPU autocast and the loss falls."""
    pytest.importorskip("sacrebleu")
    config = _toy_translation_config(tmp_path, kind, beam_size=2, epochs=2, precision="bf16")
    run_dir = tmp_path / "run"
    assert main(["train", str(config), "--run-dir", str(run_dir)]) == 0
    records = metric_records(run_dir)
    epochs = [r for r in records if r.get("event") == "epoch"]
    assert epochs[1]["train_loss"] < epochs[0]["train_loss"] and math.isfinite(records[-1]["test_bleu"])
    assert "mixed precision bf16" in (run_dir / "train.log").read_text()


def test_translation_config_rejects_other_encoders(tmp_path):
    _write_copy_corpus(tmp_path)
    from seqzoo.tasks.translation import TranslationTask, read_splits

    cfg = load_config(None, ["task=translation", f"data.data_dir={tmp_path}", "model.encoder=gru"])
    with pytest.raises(ValueError, match="no encoder-decoder for encoder 'gru'; choose from qrnn, lstm"):
        TranslationTask(cfg, read_splits(cfg.data))
    for key in ("vocab_size", "dropout"):  # set by the recipe (from the data and model.dropout)
        cfg = load_config(None, ["task=translation", f"data.data_dir={tmp_path}", f"model.encoder_args.{key}=5"])
        with pytest.raises(ValueError, match=f"model: encoder_args may not set {key} \\(the recipe sets it to "):
            TranslationTask(cfg, read_splits(cfg.data))


def test_paper_protocol_config():
    """configs/translation_de_en_qrnn.yaml holds the QRNN paper's translation settings (MODELS.md 1.9)."""
    cfg = load_config(Path(__file__).resolve().parents[1] / "configs" / "translation_de_en_qrnn.yaml")
    args = cfg.model.encoder_args
    assert (cfg.task, args["hidden_size"], args["num_layers"]) == ("translation", 320, 4)
    assert (args["encoder_window"], args["decoder_window"], cfg.model.dropout) == ([6, 2, 2, 2], 2, 0.0)
    assert (cfg.data.beam_size, cfg.data.length_alpha, cfg.data.max_chars) == (8, 0.6, 300)
    assert (cfg.optim.optimizer, cfg.optim.lr, cfg.optim.clip_norm, cfg.train.batch_size) == ("adam", 0.001, 5.0, 16)
    assert (cfg.train.epochs, cfg.train.patience) == (10, None)  # 10 epochs, no early stop


def test_lstm_baseline_config_differs_from_the_qrnn_config_only_in_the_model():
    """configs/translation_de_en_lstm.yaml: the paper's LSTM baseline, same size, dropout 0.2 (MODELS.md 1.9)."""
    root = Path(__file__).resolve().parents[1] / "configs"
    qrnn, lstm = (load_config(root / f"translation_de_en_{kind}.yaml") for kind in RECIPES)
    assert (lstm.model.encoder, lstm.model.encoder_args, lstm.model.dropout) == (
        "lstm",
        {"hidden_size": 320, "num_layers": 4},
        0.2,
    )
    assert (lstm.data, lstm.optim, lstm.train) == (qrnn.data, qrnn.optim, qrnn.train)


def test_translation_without_sacrebleu_fails_before_training(tmp_path, monkeypatch):
    """BLEU needs the ``bleu`` extra; without it the recipe stops at once, not after an epoch."""
    _write_copy_corpus(tmp_path)
    from seqzoo.tasks.translation import TranslationTask, read_splits

    cfg = load_config(None, ["task=translation", f"data.data_dir={tmp_path}"])
    real_find_spec = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name: None if name == "sacrebleu" else real_find_spec(name))
    with pytest.raises(ConfigError, match=r"sacrebleu: pip install 'seqzoo\[bleu\]'"):
        TranslationTask(cfg, read_splits(cfg.data))


def _f_pool(gates: torch.Tensor) -> torch.Tensor:
    """f-pooling by hand over gates (B, T, 2, H) from c_0 = 0 -> c (B, T, H)."""
    z, f = torch.tanh(gates[:, :, 0]), torch.sigmoid(gates[:, :, 1])
    c, cells = torch.zeros_like(z[:, 0]), []
    for t in range(z.shape[1]):
        c = f[:, t] * c + (1 - f[:, t]) * z[:, t]
        cells.append(c)
    return torch.stack(cells, 1)


def test_attention_decoder_layer_follows_eq_8_and_is_zero_at_pads():
    """Eq. 8's scores are a plain dot product c_t · h̃_s (no 1/√H), and h is zero at target pads."""
    torch.manual_seed(0)
    layer = QRNNDecoderLayer(3, 4, window=1, attention=True).double()
    x = torch.randn(2, 3, 3, dtype=torch.float64)
    lengths = torch.tensor([3, 1])
    memory = torch.randn(2, 5, 4, dtype=torch.float64)
    src_mask = torch.arange(5) < torch.tensor([5, 2]).unsqueeze(1)
    final = torch.randn(2, 4, dtype=torch.float64)
    with torch.no_grad():
        conditioning = layer.condition(final)
        h, _, alpha = layer(x, lengths, EncoderOutput(memory, src_mask, [conditioning]), conditioning)
        gates = (layer.linear(x) + layer.condition(final).unsqueeze(1)).view(2, 3, 3, 4)
        c = _f_pool(gates[:, :, :2])
        scores = (c @ memory.transpose(1, 2)).masked_fill(~src_mask.unsqueeze(1), float("-inf"))
        expected_alpha = torch.softmax(scores, -1)
        expected_h = torch.sigmoid(gates[:, :, 2]) * layer.output(torch.cat([c, expected_alpha @ memory], -1))
    real = torch.arange(3) < lengths.unsqueeze(1)
    torch.testing.assert_close(alpha[real], expected_alpha[real])
    torch.testing.assert_close(h[real], expected_h[real])
    assert bool((h[~real] == 0).all()), "outputs at target pads must be zero"


def _tiny_model(seed: int) -> QRNNSeq2Seq:
    torch.manual_seed(seed)
    return QRNNSeq2Seq(6, 4, 3, num_layers=1, encoder_window=1, decoder_window=1).double().eval()


def _exhaustive_best(model, src, src_mask, max_len):
    """The best hypothesis at alpha = 0 over every sequence of the free tokens {1, 4, 5} that a search
    to ``max_len`` can end with: finished ones (<eos> within max_len steps, its log-probability
    included) and the live ones of exactly max_len tokens (scored as they stand, beam_search's docstring)."""
    encoded = model.encode(src, src_mask)

    @torch.no_grad()
    def score(seq, finished):
        logp = F.log_softmax(model.decode(torch.tensor([[BOS, *seq]]), encoded)[0][0], -1)
        tokens = [*seq, EOS] if finished else seq
        return float(sum(logp[i, tok] for i, tok in enumerate(tokens)))

    options = [(score(list(c), True), list(c)) for n in range(max_len) for c in itertools.product([1, 4, 5], repeat=n)]
    options += [(score(list(c), False), list(c)) for c in itertools.product([1, 4, 5], repeat=max_len)]
    return max(options)


@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize("eos_shift", [1.5, 0.0, -3.0])
def test_a_beam_wider_than_all_prefixes_is_an_exhaustive_search(seed, eos_shift):
    """A wide beam returns the highest-scoring hypothesis of an exhaustive search: no duplicate
    initial beams (K copies of <bos>), and at the step limit live hypotheses compete with finished
    ones (an unlikely <eos>, eos_shift = -3, makes a live one the best). With K = 50
    every prefix of <= 2 free tokens stays in the beam, so the search is exact at alpha = 0."""
    model = _tiny_model(seed)
    with torch.no_grad():
        model.generator.bias[EOS] += eos_shift
    src, src_mask = pad_batch([[4, 5]])
    best_score, _ = _exhaustive_best(model, src, src_mask, max_len=2)
    found = beam_search(model, src, src_mask, BOS, EOS, beam_size=50, alpha=0.0, max_len=2)[0]
    encoded = model.encode(src, src_mask)
    with torch.no_grad():
        logp = F.log_softmax(model.decode(torch.tensor([[BOS, *found]]), encoded)[0][0], -1)
    tokens = found if len(found) == 2 else [*found, EOS]  # a 2-token result is a live hypothesis at the limit
    assert float(sum(logp[i, t] for i, t in enumerate(tokens))) == pytest.approx(best_score)


def test_bos_is_never_emitted():
    """Even when the model prefers <bos> it is not emitted."""
    model = _tiny_model(0)
    with torch.no_grad():
        model.generator.bias[BOS] += 20.0
    src, src_mask = pad_batch([[4, 5], [1]])
    for out in beam_search(model, src, src_mask, BOS, EOS, beam_size=3, max_len=6):
        assert BOS not in out


def test_beam_ranking_uses_source_length_plus_5_as_target_length(monkeypatch):
    """Appendix eq. 9's T_trg is the source length + 5."""
    import seqzoo.heads.seq2seq as s2s

    seen = []
    original = s2s.length_normalized_score

    def recording(log_prob, length, target, alpha):
        seen.append(target)
        return original(log_prob, length, target, alpha)

    monkeypatch.setattr(s2s, "length_normalized_score", recording)
    model = _tiny_model(1)
    src, src_mask = pad_batch([[4, 5, 1], [5]])
    beam_search(model, src, src_mask, BOS, EOS, beam_size=2, max_len=4)
    assert seen and set(seen) <= {3 + 5, 1 + 5} and len(set(seen)) == 2


def _translation_corpus(tmp_path: Path) -> None:
    dev = [("abc", "cba"), ("a", "a")]
    _write_pairs(tmp_path, {"train": [("abcde", "edcba"), ("ab", "ba"), ("abcdef", "fedcba")], "dev": dev, "test": dev})


def _translation_config(tmp_path: Path, *overrides: str):
    return load_config(
        None,
        [
            "task=translation", f"data.data_dir={tmp_path}", "data.embedding_dim=8", "data.beam_size=1",
            "model.encoder=lstm", "model.encoder_args={hidden_size: 8, num_layers: 1}", "model.dropout=0.0",
            "train.device=cpu", *overrides,
        ],
    )  # fmt: skip


def test_max_chars_keeps_pairs_of_exactly_max_chars(tmp_path):
    """'A side longer than data.max_chars' is dropped; a side of exactly max_chars is kept."""
    from seqzoo.tasks.translation import read_splits

    _translation_corpus(tmp_path)
    pairs = read_splits(_translation_config(tmp_path, "data.max_chars=5").data)
    assert pairs["train"] == [("abcde", "edcba"), ("ab", "ba")]


def test_translation_loss_is_the_nll_per_target_character_ignoring_padding(tmp_path):
    """Dev loss = teacher-forced NLL summed over real target characters (<eos> included,
    padding excluded) / their number, whatever the batching."""
    pytest.importorskip("sacrebleu")
    from seqzoo.tasks.translation import TranslationTask, read_splits

    _translation_corpus(tmp_path)
    config = _translation_config(tmp_path)
    torch.manual_seed(0)
    task = TranslationTask(config, read_splits(config.data))
    nll, count = 0.0, 0
    task.model.double().eval()  # float64: batching changes only rounding, far below the tolerance below
    with torch.no_grad():
        for source, target in task.ids["dev"]:  # one pair at a time: no padding anywhere
            src = torch.tensor([source])
            tgt_in = torch.tensor([[task.bos_id, *target]])
            tgt_out = torch.tensor([[*target, task.eos_id]])
            logits = task.model(
                src, torch.ones_like(src, dtype=torch.bool), tgt_in, torch.ones_like(tgt_in, dtype=torch.bool)
            )
            nll += F.cross_entropy(logits[0], tgt_out[0], reduction="sum").item()
            count += tgt_out.numel()
    assert task.evaluate("dev")["loss"] == pytest.approx(nll / count, rel=1e-9)
