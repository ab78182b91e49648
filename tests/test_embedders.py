"""TokenEmbedder: word table, pretrained vectors, char-CNN and char-BiLSTM features; char-id batching."""

from pathlib import Path

import pytest
import torch
from conftest import write_sentiment_corpus

from seqzoo.config import config_from_dict
from seqzoo.data.chars import MAX_WORD_CHARS, build_char_vocab, encode_chars, pad_chars
from seqzoo.data.text import Vocab
from seqzoo.embedders import TokenEmbedder
from seqzoo.training.runner import load_task, run

pytestmark = pytest.mark.usefixtures("single_thread")

NUM_CHARS = 9


def _embedder(char_encoder: str, **kwargs) -> TokenEmbedder:
    torch.manual_seed(0)
    sizes = {"char_embedding_dim": 3, "char_hidden_size": 4, **kwargs}
    return TokenEmbedder(11, 5, char_encoder=char_encoder, num_chars=NUM_CHARS, **sizes).double()


def _batch() -> tuple[torch.Tensor, torch.Tensor]:
    """Two texts: three words (the second without characters) and one word; (B, T) and (B, T, C)."""
    words = [[[2, 3, 4, 5], [], [6, 7]], [[8, 2, 2, 3, 1]]]
    ids = torch.tensor([[3, 1, 4], [5, 0, 0]])
    return ids, pad_chars(words)


@pytest.mark.parametrize(("char_encoder", "size"), [("none", 5), ("cnn", 9), ("lstm", 9)])
def test_shapes(char_encoder, size):
    embedder = _embedder(char_encoder)
    ids, chars = _batch()
    out = embedder(ids, None if char_encoder == "none" else chars)
    assert embedder.output_size == size and out.shape == (2, 3, size)
    assert out[1, 1:].eq(0).all()  # pad words: zero word row, zero char feature
    if char_encoder != "none":
        assert out[0, 1, 5:].eq(0).all()  # a word without characters has a zero char feature
        assert out[0, 0, 5:].ne(0).any()


@pytest.mark.parametrize("char_encoder", ["none", "cnn", "lstm"])
def test_pad_words_and_pad_chars_change_nothing(char_encoder):
    embedder = _embedder(char_encoder)
    ids, chars = _batch()
    wide_ids = torch.cat([ids, torch.zeros(2, 2, dtype=torch.long)], dim=1)  # two more pad words
    wide_chars = torch.cat([chars, torch.zeros(2, 3, 4, dtype=torch.long)], dim=2)  # four more pad chars
    wide_chars = torch.cat([wide_chars, torch.zeros(2, 2, wide_chars.shape[2], dtype=torch.long)], dim=1)

    def run(i, c):
        return embedder(i, None if char_encoder == "none" else c)

    out = run(ids, chars)
    torch.testing.assert_close(run(wide_ids, wide_chars)[:, :3], out, rtol=0, atol=1e-12)
    alone = run(ids[1:, :1], chars[1:, :1, :5])  # the second text alone, a batch of one
    torch.testing.assert_close(alone[0, 0], out[1, 0], rtol=0, atol=1e-12)


def test_pretrained_vectors_frozen_get_no_gradient():
    vectors = torch.randn(11, 5)
    frozen = TokenEmbedder(11, 5, vectors=vectors, freeze=True, char_encoder="cnn", num_chars=NUM_CHARS)
    tuned = TokenEmbedder(11, 5, vectors=vectors, char_encoder="cnn", num_chars=NUM_CHARS)
    ids, chars = _batch()
    for embedder in (frozen, tuned):
        torch.testing.assert_close(embedder.weight, vectors, rtol=0, atol=0)
        embedder(ids, chars).sum().backward()
        assert embedder.chars.conv.weight.grad is not None
    assert frozen.weight.grad is None
    assert tuned.weight.grad is not None and tuned.weight.grad[3].ne(0).all()
    with pytest.raises(ValueError, match=r"vectors of shape \(11, 4\), expected \(11, 5\)"):
        TokenEmbedder(11, 5, vectors=torch.zeros(11, 4))


@pytest.mark.parametrize("kernel_size", [1, 2, 3, 4])
def test_char_cnn_equals_a_per_word_loop(kernel_size):
    embedder = _embedder("cnn", char_kernel_size=kernel_size)
    ids, chars = _batch()
    got = embedder(ids, chars)[..., 5:]  # (B, T, F)
    table, conv = embedder.chars.embedding.weight, embedder.chars.conv
    left = (kernel_size - 1) // 2  # the window of char i covers i - left .. i - left + kernel_size - 1
    for b in range(2):
        for t in range(3):
            word = [int(c) for c in chars[b, t] if c != 0]
            expected = torch.zeros(4, dtype=torch.float64)
            if word:
                positions = []
                for i in range(len(word)):
                    total = conv.bias.clone()
                    for k in range(kernel_size):
                        j = i - left + k
                        if 0 <= j < len(word):  # outside the word: zero embeddings
                            total = total + conv.weight[:, :, k] @ table[word[j]]
                    positions.append(total)
                expected = torch.stack(positions).amax(0)
            torch.testing.assert_close(got[b, t], expected, rtol=0, atol=1e-12)


def test_char_lstm_equals_nn_lstm_on_each_word_alone():
    embedder = _embedder("lstm")
    ids, chars = _batch()
    got = embedder(ids, chars)[..., 5:]  # (B, T, F)
    lstm, table = embedder.chars.lstm, embedder.chars.embedding.weight
    for b in range(2):
        for t in range(3):
            word = [int(c) for c in chars[b, t] if c != 0]
            if not word:
                assert got[b, t].eq(0).all()
                continue
            _, (h_n, _) = lstm(table[word].unsqueeze(0))  # (2, 1, F/2), the word alone, unpadded
            torch.testing.assert_close(got[b, t], torch.cat([h_n[0, 0], h_n[1, 0]]), rtol=0, atol=1e-12)


@pytest.mark.parametrize("char_encoder", ["cnn", "lstm"])
def test_char_feature_gradients_pass_gradcheck(char_encoder):
    embedder = _embedder(char_encoder, char_hidden_size=2, char_embedding_dim=2)
    ids, chars = _batch()
    table = embedder.chars.embedding.weight.detach().clone().requires_grad_()

    def features(weight):
        return torch.func.functional_call(embedder, {"chars.embedding.weight": weight}, (ids, chars))[..., 5:]

    assert torch.autograd.gradcheck(features, (table,))
    grad = torch.autograd.grad(features(table).pow(2).sum(), table)[0]
    assert grad[0].eq(0).all()  # the pad char's row is never read


def test_embedder_refuses_mismatched_char_ids():
    ids, chars = _batch()
    with pytest.raises(ValueError, match="no character features"):
        _embedder("none")(ids, chars)
    with pytest.raises(ValueError, match=r"char ids must be \(B, T, C\) with \(B, T\) = \(2, 3\), got None"):
        _embedder("cnn")(ids)
    with pytest.raises(ValueError, match="hidden_size positive and even"):
        TokenEmbedder(11, 5, char_encoder="lstm", num_chars=NUM_CHARS, char_hidden_size=5)
    with pytest.raises(ValueError, match="unknown char_encoder 'gru'"):
        TokenEmbedder(11, 5, char_encoder="gru", num_chars=NUM_CHARS)


def test_char_vocab_and_batching():
    vocab = build_char_vocab([["ab", "b"], ["cb"]])
    assert list(vocab) == [Vocab.PAD, Vocab.UNK, "b", "a", "c"]  # by frequency, then by character
    long_word = "x" * (MAX_WORD_CHARS + 5)
    texts = [encode_chars(["ab", "", "z"], vocab), encode_chars([long_word], vocab)]
    assert texts[0] == [[3, 2], [], [1]]  # z is unknown
    assert len(texts[1][0]) == MAX_WORD_CHARS
    chars = pad_chars(texts, num_words=4)
    assert chars.shape == (2, 4, MAX_WORD_CHARS) and chars.dtype == torch.long
    assert chars[0, 0, :3].tolist() == [3, 2, 0] and chars[0, 2, :2].tolist() == [1, 0]
    assert chars[0, 1].eq(0).all() and chars[0, 3].eq(0).all() and chars[1, 1:].eq(0).all()
    assert pad_chars([[[]]]).shape == (1, 1, 1)
    with pytest.raises(ValueError, match="more than the batch's 2"):
        pad_chars(texts[:1], num_words=2)
    with pytest.raises(ValueError, match="max_chars must be >= 1"):
        encode_chars(["a"], vocab, max_chars=0)


def test_char_cnn_float32_is_float64_up_to_rounding():
    embedder = _embedder("cnn")
    ids, chars = _batch()
    exact = embedder(ids, chars)[..., 5:]
    conv, table = embedder.chars.conv, embedder.chars.embedding.weight
    # every output is a sum of `terms` products, each at most |w| |x|: the rounding bound of such sums
    terms = conv.weight[0].numel() + 1
    magnitude = conv.weight.abs().sum((1, 2)).max() * table.abs().max() + conv.bias.abs().max()
    single = embedder.float()(ids, chars)[..., 5:].double()
    assert (single - exact).abs().max() <= 2 * terms * torch.finfo(torch.float32).eps * magnitude.detach()


def test_word_table_is_named_and_drawn_as_nn_embeddings():
    """A model that swaps its nn.Embedding for a TokenEmbedder keeps its parameter names (old checkpoints
    load) and, from one seed, its initial weights."""
    torch.manual_seed(3)
    table = torch.nn.Embedding(7, 4, padding_idx=0).state_dict()
    torch.manual_seed(3)
    embedder = TokenEmbedder(7, 4, char_encoder="cnn", num_chars=NUM_CHARS)
    assert set(table) == {name for name in embedder.state_dict() if not name.startswith("chars.")}
    torch.testing.assert_close(embedder.weight, table["weight"], rtol=0, atol=0)


@pytest.mark.parametrize("char_encoder", ["cnn", "lstm"])
def test_a_classifier_with_char_features_trains_saves_its_char_vocabulary_and_reloads(tmp_path, char_encoder):
    data_dir = write_sentiment_corpus(tmp_path / "data", sizes=(24, 8, 8))
    config = config_from_dict(
        {
            "data": {"name": "toy", "data_dir": str(data_dir), "embedding_dim": 6},
            "model": {
                "encoder": "gru", "encoder_args": {"hidden_size": 6}, "char_encoder": char_encoder,
                "char_embedding_dim": 3, "char_hidden_size": 4,
            },
            "train": {"epochs": 1, "batch_size": 8, "patience": None, "progress": False},
        }
    )  # fmt: skip
    run(config, tmp_path / "run")
    assert (tmp_path / "run" / "best" / "chars.json").is_file()
    task = load_task(tmp_path / "run", with_data=False)
    assert task.model.embedding.output_size == 10 and "g" in task.chars
    texts = ["good film", "doog", "mlif", ""]  # two unknown words of known characters: only these tell them apart
    first, again = task.predict(texts), load_task(tmp_path / "run", with_data=False).predict(texts)
    assert first == again
    assert first[1]["probabilities"] != first[2]["probabilities"]


def test_an_aspect_classifier_with_char_features_trains_and_reloads(tmp_path):
    fixtures = Path(__file__).parent / "fixtures" / "absa"
    config = config_from_dict(
        {
            "task": "absa",
            "data": {"train": str(fixtures / "Restaurants_Train.xml"), "test": str(fixtures / "Laptop_Train.xml"),
                     "embedding_dim": 6},
            "model": {"encoder": "gru", "encoder_args": {"hidden_size": 6}, "char_encoder": "lstm",
                      "char_embedding_dim": 3, "char_hidden_size": 4},
            "train": {"epochs": 1, "batch_size": 16, "patience": None, "progress": False},
        }
    )  # fmt: skip
    run(config, tmp_path / "run")
    assert (tmp_path / "run" / "best" / "chars.json").is_file()
    task = load_task(tmp_path / "run", with_data=False)
    assert task.model.embedding.output_size == 10 and task.model.classifier.in_features == 6 + 6
    texts = ["the sushi was great\tsushi", "the ihsus was great\tsushi", "the ihsuz was great\tsushi"]
    first, again = task.predict(texts), load_task(tmp_path / "run", with_data=False).predict(texts)
    assert first == again
    assert first[1]["probabilities"] != first[2]["probabilities"]  # two unknown words, told apart by their chars
