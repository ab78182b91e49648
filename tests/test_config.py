import pytest

from seqzoo.config import ClassificationDataConfig, ConfigError, LMDataConfig, load_config


def test_yaml_and_overrides(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text("name: x\nmodel:\n  encoder: gru\n  encoder_args: {hidden_size: 8}\noptim:\n  lr: 1\n")
    cfg = load_config(path, ["train.seeds=[1,2]", "model.encoder_args.bidirectional=true", "data.max_len=5"])
    assert cfg.model.encoder == "gru" and cfg.model.encoder_args == {"hidden_size": 8, "bidirectional": True}
    assert cfg.optim.lr == 1.0 and isinstance(cfg.optim.lr, float)
    assert cfg.train.seeds == [1, 2] and isinstance(cfg.data, ClassificationDataConfig) and cfg.data.max_len == 5


def test_lm_task_selects_lm_data_config():
    cfg = load_config(None, ["task=lm", "data.level=char", "data.bptt=150"])
    assert isinstance(cfg.data, LMDataConfig) and cfg.data.bptt == 150


@pytest.mark.parametrize(
    ("override", "message"),
    [
        ("model.encodr=gru", "unknown key model.encodr"),
        ("optim.lr=fast", "optim.lr: expected float"),
        ("optim.optimizer=lbfgs", "optim.optimizer: 'lbfgs' is not one of"),
        ("train.seeds=3", "train.seeds: expected a list"),
        ("train.epochs=true", "train.epochs: expected int"),
        ("task=nope", "task: 'nope' is not one of"),
        ("task=[1]", r"task: \[1\] is not one of"),
        ("noequals", "not of the form key=value"),
        ("train.seeds=[1,2", r"override train\.seeds: invalid YAML value '\[1,2'"),
        ("train.seeds=[1,1]", r"train\.seeds: each seed once"),
    ],
)
def test_bad_values_name_the_key(override, message):
    with pytest.raises(ConfigError, match=message):
        load_config(None, [override])


@pytest.mark.parametrize(
    ("override", "message"),
    [
        ("optim.lr=0", r"optim\.lr: must be > 0, got 0\.0"),
        ("optim.lr=inf", r"optim\.lr: must be finite, got inf"),
        ("optim.clip_norm=nan", r"optim\.clip_norm: must be finite, got nan"),
        ("optim.warmup_steps=-5", r"optim\.warmup_steps: must be >= 0"),
        ("optim.momentum=1.0", r"optim\.momentum: must be in \[0, 1\)"),
        ("model.dropout=1.0", r"model\.dropout: must be in \[0, 1\)"),
        ("model.mlp_hidden=[64,0]", r"model\.mlp_hidden: must be > 0, got \[64, 0\]"),
        ("train.epochs=0", r"train\.epochs: must be > 0"),
        ("train.patience=0", r"train\.patience: must be > 0"),
        ("data.folds=1", r"data\.folds: must be >= 2"),
        ("data.dev_fraction=1.5", r"data\.dev_fraction: must be in \[0, 1\)"),
    ],
)
def test_out_of_range_values_name_the_key(override, message):
    with pytest.raises(ConfigError, match=message):
        load_config(None, [override])


def test_range_checks_let_off_values_through():
    cfg = load_config(None, ["train.patience=null", "train.checkpoint_every=0", "optim.clip_norm=null", "task=lm"])
    assert cfg.train.patience is None and cfg.train.checkpoint_every == 0 and cfg.optim.clip_norm is None
    with pytest.raises(ConfigError, match=r"data\.bptt: must be > 0"):
        load_config(None, ["task=lm", "data.bptt=0"])


def test_errors_name_the_file(tmp_path):
    path = tmp_path / "bad.yaml"
    path.write_text("train:\n  epochz: 3\n")
    with pytest.raises(ConfigError, match=r"bad\.yaml: unknown key train\.epochz"):
        load_config(path)
    path.write_text("optim:\n  lr: -1\n")
    with pytest.raises(ConfigError, match=r"bad\.yaml: optim\.lr: must be > 0"):
        load_config(path)
    path.write_text("model:\n  dropout: 0.1\n  pooler: max\n  dropout: 0.3\n")  # PyYAML kept the last silently
    with pytest.raises(ConfigError, match=r"(?s)bad\.yaml: invalid YAML.*found key 'dropout' twice.*line 4"):
        load_config(path)
    path.write_text("train: [unclosed\n")
    with pytest.raises(ConfigError, match=r"bad\.yaml: invalid YAML"):
        load_config(path)
    path.write_bytes(b"name: caf\xe9\n")  # Latin-1
    with pytest.raises(ConfigError, match=r"bad\.yaml: not UTF-8 text \(invalid byte at offset 9\)"):
        load_config(path)
