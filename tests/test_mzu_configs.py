"""The MZU paper configs: the brown_char bar compares models at equal size and budget."""

import dataclasses
from pathlib import Path

import pytest

import seqzoo.encoders.dtgru
import seqzoo.encoders.mzu  # noqa: F401  (register the encoders)
from seqzoo.config import load_config
from seqzoo.tasks.lm import LanguageModel

CONFIGS = Path(__file__).resolve().parents[1] / "configs"
BROWN_CHAR_VOCAB = 87  # 85 characters + <pad> + <unk>


def _params(name: str) -> tuple[object, int]:
    cfg = load_config(CONFIGS / f"{name}.yaml")
    model = LanguageModel(BROWN_CHAR_VOCAB, cfg.data.embedding_dim, cfg.model)
    return cfg, sum(p.numel() for p in model.parameters())


def test_brown_char_bar_configs_share_size_and_budget():
    mzu_cfg, mzu = _params("lm_brown_char_capmzu_dt")
    assert mzu_cfg.model.encoder == "mzu" and mzu_cfg.model.encoder_args["transition_depth"] == 1
    for name, encoder in (("lm_brown_char_dtgru", "dtgru"), ("lm_brown_char_gru", "gru_ln")):
        cfg, params = _params(name)
        assert cfg.model.encoder == encoder
        assert params == pytest.approx(mzu, rel=0.10)
        assert (cfg.data, cfg.optim, cfg.train) == (mzu_cfg.data, mzu_cfg.optim, mzu_cfg.train)
        assert cfg.model.encoder_args["dropout"] == mzu_cfg.model.encoder_args["dropout"]
        outside = dataclasses.replace(cfg.model, encoder="", encoder_args={})  # embedding init, dropouts, tying
        assert outside == dataclasses.replace(mzu_cfg.model, encoder="", encoder_args={})
    assert mzu_cfg.train.max_steps and mzu_cfg.train.epochs == 1 and len(mzu_cfg.train.seeds) >= 2


def test_brown_char_shallow_capmzu_differs_only_in_depth():
    deep_cfg, deep = _params("lm_brown_char_capmzu_dt")
    cfg, params = _params("lm_brown_char_capmzu")
    assert cfg.model.encoder_args["transition_depth"] == 0 and params == deep  # M shared: same size

    def without_depth(model_cfg):  # the model config with the depth arguments left out
        args = {k: v for k, v in model_cfg.encoder_args.items() if k not in ("transition_depth", "share_transition")}
        return dataclasses.replace(model_cfg, encoder_args=args)

    assert without_depth(cfg.model) == without_depth(deep_cfg.model)
    assert (cfg.data, cfg.optim, cfg.train) == (deep_cfg.data, deep_cfg.optim, deep_cfg.train)


@pytest.mark.parametrize(
    ("name", "hidden", "share"), [("lm_ptb_capmzu_dt", 800, True), ("lm_text8_capmzu_dt", 1536, False)]
)
def test_paper_protocol_configs(name, hidden, share):
    cfg = load_config(CONFIGS / f"{name}.yaml")
    args = cfg.model.encoder_args
    assert (cfg.data.batch_size, cfg.data.bptt, cfg.data.embedding_dim, cfg.optim.lr, cfg.optim.clip_norm) == (
        256, 150, 256, 1e-3, 5.0,
    )  # fmt: skip
    assert (args["hidden_size"], args["share_transition"], args["composition"], args["num_zones"]) == (
        hidden, share, "cap", 4,
    )  # fmt: skip
