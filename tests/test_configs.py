"""Every recipe shipped in configs/ loads as a typed config and builds its model (no data needed).

A typo in an encoder argument would otherwise surface only when a run starts, after its data load.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from seqzoo.config import config_to_dict, load_config
from seqzoo.encoders.base import build_encoder
from seqzoo.heads.seq2seq import build_seq2seq

CONFIGS = sorted((Path(__file__).resolve().parents[1] / "configs").glob("*.yaml"))


def test_configs_are_found():
    assert len(CONFIGS) >= 20


@pytest.mark.parametrize("path", CONFIGS, ids=lambda p: p.stem)
def test_config_loads_and_builds(path):
    config = load_config(path)
    model, embedding_dim = config.model, config.data.embedding_dim
    if getattr(config.data, "embeddings", None):
        embedding_dim = 50  # the configs' vectors are GloVe 50d
    if getattr(model, "char_encoder", "none") != "none":
        embedding_dim += model.char_hidden_size  # char features are concatenated to each word vector
    if config.task == "translation":
        built = build_seq2seq(model.encoder, 40, embedding_dim, **model.encoder_args)
    else:
        built = build_encoder(model.encoder, embedding_dim, **model.encoder_args)
    assert sum(p.numel() for p in built.parameters()) > 0


@pytest.mark.parametrize("path", CONFIGS, ids=lambda p: p.stem)
def test_a_stored_run_config_loads_again_as_a_config(path, tmp_path):
    """A run stores its resolved config without the keys that have no effect, so that it can start a new run."""
    config = load_config(path)
    stored = tmp_path / "config.yaml"
    stored.write_text(yaml.safe_dump(config_to_dict(config), sort_keys=False))
    assert load_config(stored) == config
