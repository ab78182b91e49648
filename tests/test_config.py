import re

import pytest
from conftest import assert_config_refused

from seqzoo.config import ConfigError, config_to_dict, inert_keys, load_config
from seqzoo.tasks.classification import ClassificationDataConfig
from seqzoo.tasks.lm import LMDataConfig


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


def test_yaml_merge_keys_share_settings(tmp_path):
    """A merge key (``<<``) crashed the duplicate-key check: "could not determine a constructor for
    the tag 'tag:yaml.org,2002:merge'". The mapping's own keys override the merged ones."""
    path = tmp_path / "merge.yaml"
    path.write_text("optim:\n  <<: &adam {optimizer: adam, lr: 0.002, clip_norm: 1.0}\n  lr: 0.005\n")
    cfg = load_config(path)
    assert (cfg.optim.optimizer, cfg.optim.lr, cfg.optim.clip_norm) == ("adam", 0.005, 1.0)


def test_errors_name_the_file(tmp_path):
    path = tmp_path / "bad.yaml"
    assert_config_refused(path, "train:\n  epochz: 3\n", r"bad\.yaml: unknown key train\.epochz")
    assert_config_refused(path, "optim:\n  lr: -1\n", r"bad\.yaml: optim\.lr: must be > 0")
    assert_config_refused(
        path,
        "model:\n  dropout: 0.1\n  pooler: max\n  dropout: 0.3\n",  # PyYAML kept the last silently
        r"(?s)bad\.yaml: invalid YAML.*found key 'dropout' twice.*line 4",
    )
    assert_config_refused(
        path,
        "base: &b {dropout: 0.1}\nmodel:\n  <<: *b\n  <<: *b\n",
        r"(?s)bad\.yaml: invalid YAML.*found key '<<' twice.*line 4",
    )
    assert_config_refused(path, "train: [unclosed\n", r"bad\.yaml: invalid YAML")
    latin1 = b"name: caf\xe9\n"
    assert_config_refused(path, latin1, r"bad\.yaml: not UTF-8 text \(invalid byte at offset 9\)")


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (
            ["task=lm", "train.batch_size=64"],
            r"train\.batch_size would have no effect \(a language model batches by data",
        ),
        (["task=lm", "train.eval_batch_size=8"], r"train\.eval_batch_size would have no effect"),
        (["task=lm", "model.pooler=max"], r"model\.pooler would have no effect \(the lm recipe does not use it\)"),
        (["task=translation", "model.embedding_dropout=0.2"], r"model\.embedding_dropout would have no effect"),
        (["model.tie_weights=true"], r"model\.tie_weights would have no effect \(the classification recipe"),
        (["model.embedding_init=1.0"], r"model\.embedding_init would have no effect"),
        (["task=absa", "model.mlp_hidden=[8]"], r"model\.mlp_hidden would have no effect"),
        (["optim.momentum=0.9"], r"optim\.momentum would have no effect \(optimizer adam has no momentum term\)"),
        (["optim.alpha=0.9", "optim.optimizer=sgd"], r"optim\.alpha would have no effect \(it is RMSprop's decay\)"),
        (["optim.optimizer=sgd", "optim.eps=1e-6"], r"optim\.eps would have no effect \(SGD has no epsilon\)"),
        (["optim.decay=0.3"], r"optim\.decay would have no effect \(it is the multiplier of the plateau/"),
        (["optim.schedule=plateau", "optim.decay_start=2"], r"optim\.decay_start would have no effect"),
        (["optim.min_lr=1e-5"], r"optim\.min_lr would have no effect \(the constant schedule does not decay\)"),
        (["train.seeds=[1,2]", "train.seed=3"], r"train\.seed would have no effect \(train\.seeds lists the seeds\)"),
        (
            ["data.embeddings=v.txt", "data.embedding_dim=300"],
            r"data\.embedding_dim would have no effect \(the vectors",
        ),
        (["task=absa", "data.dev=d.xml", "data.dev_seed=3"], r"data\.dev_seed would have no effect \(data\.dev gives"),
        (["task=translation", "data.beam_size=1", "data.length_alpha=1.0"], r"data\.length_alpha would have no effect"),
        (["optim={optimizer: sgd, lr: 0.1, eps: 0.5}"], r"optim: optim\.eps would have no effect \(SGD has no epsilon"),
        (["train={seeds: [1, 2], seed: 7}"], r"train: train\.seed would have no effect"),
    ],
)
def test_keys_that_would_have_no_effect_are_refused(overrides, message):
    with pytest.raises(ConfigError, match=f"--set {message}.*: remove it$"):
        load_config(None, overrides)


def test_keys_without_effect_are_named_each_from_the_file_or_the_command_line(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text("task: lm\nmodel: {pooler: max, dropout: 0.2}\ntrain: {batch_size: 64}\n")
    with pytest.raises(ConfigError) as err:
        load_config(path, ["optim.lr=0.1"])
    assert str(err.value) == (
        f"{path}: model.pooler would have no effect (the lm recipe does not use it); train.batch_size would have no "
        "effect (a language model batches by data.batch_size): remove them"
    )
    path.write_text("task: lm\nmodel: {dropout: 0.2}\n")
    with pytest.raises(ConfigError, match=r"^--set optim\.momentum would have no effect \(optimizer adam"):
        load_config(path, ["optim.momentum=0.5"])


def test_an_overrides_error_names_the_overrides_not_the_file(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text("train: {epochs: 2}\n")
    with pytest.raises(ConfigError, match=r"^--set train\.epoch=3: unknown key train\.epoch \(valid: "):
        load_config(path, ["train.epoch=3"])
    path.write_text("train: {epoch: 2}\n")  # the file's own error names the file, overrides or not
    with pytest.raises(ConfigError, match=rf"^{re.escape(str(path))}: unknown key train\.epoch"):
        load_config(path, ["train.epochs=3"])


def test_min_lr_is_checked_against_lr_after_the_overrides(tmp_path):
    """A decay's floor above the rate would raise it; either may come from the file or an override."""
    message = r"^--set optim\.schedule=cosine --set optim\.min_lr=0\.01: optim\.min_lr: decays' floor must be <= lr"
    with pytest.raises(ConfigError, match=message):
        load_config(None, ["optim.schedule=cosine", "optim.min_lr=0.01"])
    path = tmp_path / "c.yaml"
    assert_config_refused(
        path,
        "optim: {schedule: cosine, min_lr: 0.002}\n",  # above the default lr 0.001
        rf"^{re.escape(str(path))}: optim\.min_lr: .* <= lr \(0\.001\), got 0\.002",
    )
    assert load_config(path, ["optim.lr=0.01"]).optim.min_lr == 0.002


def test_odd_values_are_config_errors(tmp_path):
    with pytest.raises(ConfigError, match=r"optim\.lr: 9{400} is too large for a float"):
        load_config(None, ["optim.lr=" + "9" * 400])
    path = tmp_path / "c.yaml"
    assert_config_refused(
        path, "model:\n  encoder_args: {1: 2}\n", r"c\.yaml: model\.encoder_args: keys must be strs, got 1"
    )


def test_an_override_may_switch_off_a_key_of_the_file(tmp_path):
    """The file's keys are checked in the file's own config: a file's seed is its single-seed default."""
    path = tmp_path / "c.yaml"
    path.write_text("train: {seed: 3}\noptim: {optimizer: rmsprop, alpha: 0.9}\n")
    config = load_config(path, ["train.seeds=[1,2]", "optim.optimizer=adam"])
    assert config.train.seeds == [1, 2] and config.optim.optimizer == "adam"
    with pytest.raises(ConfigError, match=r"--set train\.seed would have no effect"):
        load_config(path, ["train.seeds=[1,2]", "train.seed=4"])


@pytest.mark.parametrize(
    "overrides",
    [
        ["optim.optimizer=sgd", "optim.momentum=0.9"],
        ["optim.optimizer=rmsprop", "optim.momentum=0.9", "optim.alpha=0.9", "optim.eps=1e-6"],
        ["optim.schedule=step_after", "optim.decay_start=2", "optim.decay=0.3", "optim.min_lr=1e-5"],
        ["optim.schedule=cosine", "optim.min_lr=1e-5"],
        ["task=lm", "data.batch_size=64", "model.tie_weights=true", "model.embedding_init=1.0"],
        ["train.seed=3", "model.pooler=max", "model.mlp_hidden=[8]", "data.embedding_dim=300"],
        ["task=absa", "data.dev_seed=3", "data.dev_fraction=0.2", "model.pooler=max"],
    ],
)
def test_keys_that_have_an_effect_pass(overrides):
    config = load_config(None, overrides)
    assert not {key.split("=")[0] for key in overrides} & inert_keys(config).keys()


def test_a_run_config_stores_only_the_keys_that_have_an_effect():
    config = load_config(None, ["task=lm", "train.seeds=[1,2]"])
    stored = config_to_dict(config)
    assert "batch_size" not in stored["train"] and "seed" not in stored["train"] and "pooler" not in stored["model"]
    assert stored["data"]["batch_size"] == 20 and stored["train"]["seeds"] == [1, 2]


def test_override_edge_cases():
    """An empty value is null, a value may contain '=', and min_lr may equal lr."""
    assert load_config(None, ["train.patience="]).train.patience is None
    assert load_config(None, ["name=a=b"]).name == "a=b"
    cfg = load_config(None, ["optim.schedule=cosine", "optim.lr=0.01", "optim.min_lr=0.01"])
    assert cfg.optim.min_lr == cfg.optim.lr == 0.01
