import gzip
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

import seqzoo.encoders.dtgru  # registers "dtgru"
import seqzoo.encoders.mzu  # noqa: F401  (registers mzu)
from seqzoo.data.absa import POLARITIES, AspectExample, hard_subset, read_semeval2014
from seqzoo.data.errors import DataError
from seqzoo.data.text import Tokenizer, Vocab
from seqzoo.tasks.absa import AspectSentimentClassifier, make_batch

FIXTURES = Path(__file__).parent / "fixtures" / "absa"
RESTAURANTS = FIXTURES / "Restaurants_Train.xml"
LAPTOPS = FIXTURES / "Laptop_Train.xml"


pytestmark = pytest.mark.usefixtures("single_thread")


def test_reader_examples_and_offsets():
    ds = read_semeval2014(RESTAURANTS)
    assert len(ds) == 23 and {e.polarity for e in ds} == set(POLARITIES)
    assert all(e.text[e.start : e.end] == e.aspect for e in ds)
    first = ds[0]
    assert (first.sentence_id, first.aspect, first.start, first.end, first.polarity) == (
        "3121",
        "staff",
        8,
        13,
        "negative",
    )
    chef = next(e for e in ds if e.aspect == '"chef"')  # XML entities decoded in text and term
    assert "sushi & friendly" in chef.text
    assert "2534" not in {e.sentence_id for e in ds}  # a sentence without aspect terms gives nothing
    assert len(read_semeval2014(LAPTOPS)) == 18


def test_hard_subset_copies_mixed_sentences_once_per_aspect():
    ds = read_semeval2014(RESTAURANTS)
    hds = hard_subset(ds)
    by_sentence: dict[str, list[str]] = {}
    for e in hds:
        by_sentence.setdefault(e.sentence_id, []).append(e.polarity)
    assert sorted(by_sentence) == ["1", "1057", "1634", "402", "77", "951"]
    assert all(len(set(p)) > 1 for p in by_sentence.values())
    assert len(by_sentence["1634"]) == 3  # one copy per aspect
    assert "813" not in by_sentence  # several aspects, all positive: not hard
    assert "3121" not in by_sentence  # a single aspect


def test_gzip_input(tmp_path):
    path = tmp_path / "laptop.xml.gz"
    path.write_bytes(gzip.compress(LAPTOPS.read_bytes()))
    assert read_semeval2014(path) == read_semeval2014(LAPTOPS)


def test_offset_mismatch_names_file_sentence_and_the_aspect_terms_line(tmp_path):
    path = tmp_path / "bad.xml"
    path.write_text(RESTAURANTS.read_text().replace('from="8" to="13"', 'from="9" to="13"'))
    with pytest.raises(DataError, match=r"bad\.xml:6: sentence id=3121: aspect term 'staff' does not match") as err:
        read_semeval2014(path)
    assert err.value.line == 6  # the <aspectTerm>'s line, not its <sentence>'s (3)


def test_a_blank_aspect_term_is_refused_where_it_is_written(tmp_path):
    """A whitespace-only term passed the reader and crashed training ("sequence 6 of the batch is empty")."""
    path = tmp_path / "blank.xml"
    path.write_text(
        RESTAURANTS.read_text().replace(
            'term="staff" polarity="negative" from="8" to="13"', 'term=" " polarity="negative" from="7" to="8"'
        )
    )
    with pytest.raises(DataError, match=r"blank\.xml:6: sentence id=3121: aspect term ' ' is blank"):
        read_semeval2014(path)


def test_errors_in_a_sentence_without_id_give_a_line(tmp_path):
    path = tmp_path / "noid.xml"
    lines = [
        "<sentences>",
        "  <sentence>",
        "    <text>Good food.</text>",
        '    <aspectTerms><aspectTerm term="food" polarity="positive" from="5" to="9"/></aspectTerms>',
        "  </sentence>",
        "  <sentence>",
        "    <text>Bad wine.</text>",
        "    <aspectTerms>",
        '      <aspectTerm term="wine" polarity="negative" from="x" to="8"/>',
        "    </aspectTerms>",
        "  </sentence>",
        "  <sentence></sentence>",
        "</sentences>",
    ]
    path.write_text("\n".join(lines))
    with pytest.raises(DataError, match=r"noid\.xml:9: sentence id=#2: aspect term 'wine': 'from' and 'to'"):
        read_semeval2014(path)
    path.write_text("\n".join(lines).replace('from="x"', 'from="4"'))
    with pytest.raises(DataError, match=r"noid\.xml:12: sentence id=#3: missing <text>"):
        read_semeval2014(path)


def test_an_unset_environment_variable_in_the_path_is_named(tmp_path, monkeypatch):
    monkeypatch.delenv("SEMEVAL_DIR", raising=False)
    unset = r"Train\.xml: cannot read: No such file or directory \(an environment variable .* is not set\)"
    with pytest.raises(DataError, match=unset):
        read_semeval2014("$SEMEVAL_DIR/Train.xml")
    with pytest.raises(DataError, match=r"missing\.xml: cannot read: No such file or directory$"):
        read_semeval2014(tmp_path / "missing.xml")


def test_a_byte_order_mark_is_not_text(tmp_path):
    path = tmp_path / "bom.xml"
    path.write_bytes(b"\xef\xbb\xbf" + RESTAURANTS.read_bytes())
    assert read_semeval2014(path) == read_semeval2014(RESTAURANTS)


CAFE = """<?xml version="1.0" encoding="{}"?>
<sentences>
  <sentence id="1">
    <text>The café crème was great</text>
    <aspectTerms><aspectTerm term="café crème" polarity="positive" from="4" to="14"/></aspectTerms>
  </sentence>
</sentences>
"""


@pytest.mark.parametrize("encoding", ["UTF-8", "ISO-8859-1", "windows-1252", "UTF-16"])
def test_the_declared_encoding_is_honoured(tmp_path, encoding):
    path = tmp_path / "cafe.xml"
    path.write_bytes(CAFE.format(encoding).encode(encoding))
    (example,) = read_semeval2014(path)
    assert (example.text, example.aspect) == ("The café crème was great", "café crème")


def test_undeclared_latin1_names_the_line_and_the_remedy(tmp_path):
    path = tmp_path / "cafe.xml"
    path.write_bytes(CAFE.format("UTF-8").encode("latin-1"))
    with pytest.raises(DataError, match=r"cafe\.xml:4: malformed XML: .*must declare its encoding"):
        read_semeval2014(path)


def test_malformed_xml_names_file_and_line(tmp_path):
    path = tmp_path / "broken.xml"
    path.write_text(RESTAURANTS.read_text().replace("</text>", "", 2))
    with pytest.raises(DataError, match=r"broken\.xml:\d+: malformed XML") as err:
        read_semeval2014(path)
    assert err.value.line is not None


def test_bad_polarity(tmp_path):
    path = tmp_path / "polarity.xml"
    path.write_text(RESTAURANTS.read_text().replace('polarity="negative" from="8"', 'polarity="bad" from="8"'))
    with pytest.raises(DataError, match="polarity"):
        read_semeval2014(path)


@pytest.mark.parametrize(
    ("encoder", "args"),
    [
        ("mzu", {"composition": "cap", "transition_depth": 1, "num_zones": 4, "disagreement": 1.0}),
        ("dtgru", {"transition_depth": 1}),
    ],
)
def test_pipeline_forward_backward(encoder, args):
    torch.manual_seed(0)
    tokenizer = Tokenizer(lowercase=True)
    train = read_semeval2014(RESTAURANTS)
    vocab = Vocab.build(tokenizer(e.text) for e in train)
    model = AspectSentimentClassifier(
        len(vocab), 8, encoder, {"hidden_size": 8, "bidirectional": True, **args}, dropout=0.1
    )
    for examples in (train, hard_subset(train), read_semeval2014(LAPTOPS)):  # laptop words are mostly <unk>
        batch = make_batch(examples, vocab, tokenizer)
        logits = model(batch.ids, batch.mask, batch.aspect_ids, batch.aspect_mask)
        assert logits.shape == (len(examples), len(POLARITIES))
        loss = F.cross_entropy(logits, batch.labels)
        aux = model.auxiliary_loss()
        if aux is not None:
            loss = loss + aux
        model.zero_grad()
        loss.backward()
        assert torch.isfinite(loss)
        assert model.embedding.weight.grad.abs().sum() > 0
        assert all(p.grad is not None for p in model.encoder.parameters())


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (
            ('from="8" to="13"', 'from="-40" to="13"'),
            r"aspect term 'staff': needs 0 <= from < to <= \d+, got -40 and 13",
        ),
        (('from="8" to="13"', 'from="13" to="8"'), r"aspect term 'staff': needs 0 <= from < to <= \d+, got 13 and 8"),
    ],
)
def test_offsets_outside_the_text_are_refused(tmp_path, change, message):
    """Python's slicing made text[-40:13] match the term, so negative offsets passed."""
    path = tmp_path / "bad.xml"
    path.write_text(RESTAURANTS.read_text().replace(*change))
    with pytest.raises(DataError, match=message):
        read_semeval2014(path)


def test_an_empty_sentence_text_is_refused(tmp_path):
    path = tmp_path / "empty.xml"
    path.write_text('<sentences><sentence id="7"><text> </text></sentence></sentences>')
    with pytest.raises(DataError, match=r"empty\.xml:1: sentence id=7: empty <text>"):
        read_semeval2014(path)


def test_an_aspect_term_may_end_the_sentence(tmp_path):
    """To == len(text) is valid (e.g. a sentence without final punctuation)."""
    path = tmp_path / "a.xml"
    path.write_text(
        '<sentences><sentence id="1"><text>I liked the pizza</text><aspectTerms>'
        '<aspectTerm term="pizza" polarity="positive" from="12" to="17"/></aspectTerms></sentence></sentences>'
    )
    (example,) = read_semeval2014(path)
    assert (example.start, example.end, example.aspect) == (12, 17, "pizza")


def test_hds_groups_by_sentence_not_by_equal_text():
    """Two sentences that happen to have the same text, one aspect each, are not hard."""
    a = AspectExample("1", 0, "Good food.", "food", 5, 9, "positive")
    b = AspectExample("2", 1, "Good food.", "food", 5, 9, "negative")
    assert hard_subset([a, b]) == []
