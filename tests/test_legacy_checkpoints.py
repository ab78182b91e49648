"""``best/`` checkpoints written by the code before the package layout moved (tests/fixtures/legacy_runs)
load with today's code, through :func:`seqzoo.load`, and give what that code gave (``expected.json``).

``expected.json`` records the outputs, not the inputs; these were recovered from them. The LM sample is
the prime "the cat" and 12 drawn words (seed 3, as tests/test_lm.py samples). The classifier's texts are
the only ones among all texts of one to three vocabulary words whose probabilities match the records
(to float32 rounding); the ABSA inputs are the natural sentences whose four probabilities match. Beam
search stops at 2 * len(source) + 10 characters, so the two translations (26 and 20 characters, the
barely trained model's spaces) are of 8- and 5-character sources.
"""

import json
from pathlib import Path

import pytest
from torch import nn

import seqzoo
from seqzoo.encoders.base import Encoder

LEGACY = Path(__file__).parent / "fixtures" / "legacy_runs"
EXPECTED = json.loads((LEGACY / "expected.json").read_text())


@pytest.fixture(autouse=True)
def _single_thread(single_thread):
    """Tiny models: one thread, as the fixtures were written."""


@pytest.mark.parametrize("task", ["classification", "lm", "absa", "translation"])
def test_each_legacy_checkpoint_loads_with_its_trained_model(task):
    trained = seqzoo.load(LEGACY / task)
    assert trained.config.task == task and isinstance(trained.model, nn.Module)
    encoder = trained.encoder
    assert isinstance(encoder, nn.Module) and any(p.numel() for p in encoder.parameters())
    if task != "translation":  # the seq2seq encoder is the model's own layer stack
        assert isinstance(encoder, Encoder)


def test_the_language_model_samples_the_same_text():
    assert seqzoo.load(LEGACY / "lm").sample(12, prime="the cat", seed=3) == EXPECTED["lm"]


def test_the_translation_model_gives_the_same_translations():
    assert seqzoo.load(LEGACY / "translation").predict(["ab cd ef", "fe dc"]) == EXPECTED["translation"]


#: The texts the classification and ABSA records of expected.json were predicted for (module docstring).
INPUTS = {
    "classification": ["good great film", "dull boring plot"],
    "absa": ["the food was great\tfood", "slow service\tservice"],
}


@pytest.mark.parametrize("task", ["classification", "absa"])
def test_the_classifiers_predict_the_same_labels_and_probabilities(task):
    predicted = seqzoo.load(LEGACY / task).predict(INPUTS[task])
    expected = EXPECTED[task]
    assert [p["label"] for p in predicted] == [e["label"] for e in expected]
    for p, e in zip(predicted, expected, strict=True):
        assert p.keys() == e.keys() and p["probabilities"].keys() == e["probabilities"].keys()
        assert all(abs(p["probabilities"][k] - v) <= 1e-5 for k, v in e["probabilities"].items())
