import pytest

from seqzoo.data import DataError, Tokenizer, Vocab


@pytest.mark.parametrize(
    ("text", "tokens"),
    [
        ("Don't panic, it's 3.5 km!", ["Do", "n't", "panic", ",", "it", "'s", "3.5", "km", "!"]),
        ("I can't; we'll see...", ["I", "ca", "n't", ";", "we", "'ll", "see", "..."]),
        ("over-all 1,000 10:30 (ok)", ["over-all", "1,000", "10:30", "(", "ok", ")"]),
        ("``Quoted'' 'single'", ["``", "Quoted", "''", "'", "single", "'"]),
        ("it\u2019s naïve café", ["it", "\u2019s", "naïve", "café"]),
        ("  \t\n ", []),
    ],
)
def test_tokenizer(text, tokens):
    assert Tokenizer()(text) == tokens


def test_tokenizer_lowercase_and_dict_round_trip():
    tok = Tokenizer(lowercase=True)
    assert tok("DON'T Stop") == ["do", "n't", "stop"]
    again = Tokenizer.from_dict(tok.to_dict())
    assert again.lowercase and again("A b") == ["a", "b"]
    with pytest.raises(ValueError):
        Tokenizer.from_dict({"kind": "something-else", "lowercase": False})


CORPUS = [["b", "a", "c", "a"], ["b", "a", "d"], ["e"]]


def test_vocab_build_order_specials_and_counts():
    vocab = Vocab.build(CORPUS, specials=("<eos>",))
    assert list(vocab) == ["<pad>", "<unk>", "<eos>", "a", "b", "c", "d", "e"]
    assert (vocab.token_to_id(Vocab.PAD), vocab.token_to_id(Vocab.UNK)) == (0, 1)
    assert vocab.counts["a"] == 3 and vocab.counts["b"] == 2 and vocab.counts[Vocab.UNK] == 0
    assert "a" in vocab and "zzz" not in vocab and len(vocab) == 8


def test_vocab_min_freq_max_size_and_unk_count():
    vocab = Vocab.build(CORPUS, min_freq=2)
    assert list(vocab) == ["<pad>", "<unk>", "a", "b"]
    assert vocab.counts[Vocab.UNK] == 3  # c, d, e
    capped = Vocab.build(CORPUS, max_size=1)
    assert list(capped) == ["<pad>", "<unk>", "a"]
    assert capped.counts[Vocab.UNK] == 5


def test_vocab_is_independent_of_input_order():
    shuffled = [list(reversed(tokens)) for tokens in reversed(CORPUS)]
    assert Vocab.build(CORPUS) == Vocab.build(shuffled)


def test_vocab_encode_decode():
    vocab = Vocab.build(CORPUS)
    ids = vocab.encode(["a", "unseen", "e"])
    assert ids == [2, Vocab.unk_id, vocab.token_to_id("e")]
    assert vocab.decode(ids) == ["a", "<unk>", "e"]
    with pytest.raises(IndexError):
        vocab.id_to_token(len(vocab))


def test_vocab_save_load_round_trip(tmp_path):
    vocab = Vocab.build(CORPUS, min_freq=2, specials=("<eos>",))
    path = tmp_path / "vocab.json"
    vocab.save(path)
    loaded = Vocab.load(path)
    assert loaded == vocab and loaded.counts == vocab.counts and loaded.specials == vocab.specials
    assert Vocab.from_dict(vocab.to_dict()) == vocab


def test_vocab_load_rejects_malformed(tmp_path):
    path = tmp_path / "vocab.json"
    path.write_text('{"tokens": ["a", "<unk>"], "counts": [0, 0]}')
    with pytest.raises(DataError, match=r"vocab\.json: a vocabulary must start with"):
        Vocab.load(path)
    with pytest.raises(ValueError, match="duplicate"):
        Vocab(["<pad>", "<unk>", "x", "x"])


def test_split_hyphens_option_round_trips():
    tok = Tokenizer(lowercase=True, split_hyphens=True)
    assert tok("A well-acted, feel-good film") == ["a", "well", "-", "acted", ",", "feel", "-", "good", "film"]
    assert Tokenizer()("well-acted") == ["well-acted"]
    assert Tokenizer.from_dict(tok.to_dict()).split_hyphens
    assert not Tokenizer.from_dict({"kind": Tokenizer.KIND, "lowercase": True}).split_hyphens
