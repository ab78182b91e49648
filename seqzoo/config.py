"""Typed run configuration: dataclasses built from YAML plus ``--set key=value`` overrides.

Every key is validated against the dataclass fields, their types and their ranges (a size is
positive, a dropout rate lies in [0, 1), ...); a bad key or value raises :class:`ConfigError`
naming the dotted key (and the file it came from).
"""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import math
import os
import re
import types
import typing
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import yaml

__all__ = [
    "ConfigError",
    "ModelConfig",
    "OptimConfig",
    "RunConfig",
    "StageConfig",
    "TrainConfig",
    "config_from_dict",
    "config_to_dict",
    "inert_keys",
    "load_config",
    "names_config_errors",
    "require_name",
    "require_ranges",
    "stage_config",
    "unset_variable",
]


class ConfigError(ValueError):
    """A config key or value is invalid; the message names the dotted key."""


def require_ranges(
    config: object, *, positive: tuple[str, ...] = (), non_negative: tuple[str, ...] = (), rate: tuple[str, ...] = ()
) -> None:
    """Range checks of a config's fields: ``positive`` > 0, ``non_negative`` >= 0, ``rate`` in [0, 1).

    None (the "off" of optional fields) passes; a list is checked element by element.
    """
    for names, ok, bound in (
        (positive + non_negative + rate, math.isfinite, "finite"),
        (positive, lambda v: v > 0, "> 0"),
        (non_negative, lambda v: v >= 0, ">= 0"),
        (rate, lambda v: 0 <= v < 1, "in [0, 1)"),
    ):
        for name in names:
            value = getattr(config, name)
            if any(not ok(v) for v in (value if isinstance(value, list) else [value]) if v is not None):
                raise ConfigError(f"{name}: must be {bound}, got {value!r}")


def require_name(name: str, key: str) -> None:
    """A :class:`ConfigError` unless ``name`` is one file or directory name (no path separator, not ``..``)."""
    if not name or "/" in name or os.sep in name or ".." in name or name == ".":
        raise ConfigError(f"{key}: must be a file name without a path separator or '..', got {name!r}")


def unset_variable(value: str) -> str | None:
    """The first ``$NAME`` or ``${NAME}`` left in ``value`` after :func:`os.path.expandvars` (a variable
    that is not set), else None."""
    found = re.search(r"\$(\w+|\{[^}]*\})", value)
    return found.group(0) if found else None


@dataclass
class ModelConfig:
    encoder: str = "lstm"
    encoder_args: dict[str, Any] = field(default_factory=lambda: {"hidden_size": 128, "bidirectional": True})
    pooler: Literal["last", "mean", "max", "meanmax", "meanmaxglobal", "attention"] = "mean"
    mlp_hidden: list[int] = field(default_factory=list)
    embedding_dropout: float = 0.0
    dropout: float = 0.5  # before the classifier / output layer
    tie_weights: bool = False  # language models: share input embedding and softmax weights
    embedding_init: float = 0.1  # language models: the input embedding starts as U(-a, a)
    # Character features concatenated to each word vector (seqzoo.embedders.TokenEmbedder): a char-CNN
    # (char_hidden_size filters of width char_kernel_size) or a char-BiLSTM (char_hidden_size / 2 per direction).
    char_encoder: Literal["none", "cnn", "lstm"] = "none"
    char_embedding_dim: int = 25
    char_hidden_size: int = 50
    char_kernel_size: int = 3
    # Sequence tagging: a CRF or a per-token softmax over the tags; the tag scheme's allowed transitions
    # (IOB1/IOB2/IOBES) enforced in training (CRF) and decoding.
    decoder: Literal["crf", "softmax"] = "crf"
    constraints: bool = True

    def __post_init__(self) -> None:
        sizes = ("mlp_hidden", "embedding_init", "char_embedding_dim", "char_hidden_size", "char_kernel_size")
        require_ranges(self, positive=sizes, rate=("embedding_dropout", "dropout"))
        if self.char_encoder == "lstm" and self.char_hidden_size % 2:
            raise ConfigError(f"char_hidden_size: must be even with char_encoder lstm, got {self.char_hidden_size}")


@dataclass
class OptimConfig:
    optimizer: Literal["adam", "adamw", "rmsprop", "sgd", "adagrad"] = "adam"
    lr: float = 1e-3
    weight_decay: float = 0.0  # L2
    momentum: float = 0.0
    alpha: float = 0.99  # RMSprop decay
    eps: float = 1e-8
    clip_norm: float | None = 5.0
    # Epoch schedules multiply the LR by ``decay`` after every epoch ("exponential"), after an epoch
    # without a dev improvement ("plateau"), or after every epoch from epoch ``decay_start`` on
    # ("step_after": the first decay_start epochs, at least one, run at ``lr``). Step schedules decay
    # it at every step from ``lr`` towards ``min_lr``, which it reaches when the run ends (step N of
    # N = min(train.max_steps, train.epochs x steps per epoch) runs one decay step above it, as in
    # torch's CosineAnnealingLR with T_max = N): "linear", "cosine".
    schedule: Literal["constant", "plateau", "exponential", "step_after", "linear", "cosine"] = "constant"
    decay: float = 0.5  # LR multiplier of the epoch schedules
    decay_start: int = 0  # step_after: epochs at the full LR (at least 1) before the first decayed one
    min_lr: float = 0.0  # floor of every decay
    warmup_steps: int = 0  # any schedule: the LR rises linearly over the first steps, lr / warmup_steps to lr

    def __post_init__(self) -> None:
        require_ranges(self, positive=("lr", "eps", "clip_norm", "decay"), rate=("momentum", "alpha"))
        require_ranges(self, non_negative=("weight_decay", "decay_start", "min_lr", "warmup_steps"))


@dataclass
class TrainConfig:
    epochs: int = 10
    max_steps: int | None = None  # fixed compute budget: stop (after evaluating) once this many steps ran
    batch_size: int = 32
    eval_batch_size: int = 128
    patience: int | None = 3  # early stopping on the dev metric (epochs without improvement)
    seed: int = 1
    seeds: list[int] = field(default_factory=list)  # multi-seed runs: mean ± std
    checkpoint_every: int = 200  # steps between resumable checkpoints, also saved at every epoch end (0 = only there)
    threads: int | None = None  # torch.set_num_threads
    progress: bool | None = None  # None = only on a terminal
    # Every this many steps of an epoch (counted from its first): a step record in metrics.jsonl and,
    # without a progress bar, a log line (None = off; an epoch of fewer batches has none).
    log_every: int | None = 100
    device: str = "auto"  # "auto" (the GPU when torch sees one, else the CPU), "cpu", "cuda" or "cuda:N"
    # Training steps' forward pass under torch.autocast: "bf16", "fp16" (a GPU only; with loss
    # scaling), or "fp32" (none). Weights, optimiser state and evaluation stay in float32.
    precision: Literal["fp32", "bf16", "fp16"] = "fp32"
    # Data-parallel runs (torchrun; docs/distributed.md): DDP's find_unused_parameters, for models whose
    # forward leaves some parameters out on some steps; seconds a collective waits for a silent rank.
    find_unused_parameters: bool = False
    dist_timeout: int = 600

    def __post_init__(self) -> None:
        names = ("epochs", "max_steps", "batch_size", "eval_batch_size", "patience", "threads", "log_every")
        names += ("dist_timeout",)
        require_ranges(self, positive=names, non_negative=("checkpoint_every",))
        if len(set(self.seeds)) != len(self.seeds):
            raise ConfigError(f"seeds: each seed once, got {self.seeds}")
        if not re.fullmatch(r"auto|cpu|cuda(:\d+)?", self.device):
            raise ConfigError(f"device: must be auto, cpu, cuda or cuda:N, got {self.device!r}")


@dataclass
class StageConfig:
    """One stage of a staged run (:attr:`RunConfig.stages`): ``name`` (its sub-directory ``RUN/NAME``),
    ``init_from`` (an earlier stage whose best checkpoint gives the weights whose names and shapes match),
    ``freeze`` (parameter-name prefixes kept fixed, e.g. ``encoder.``) and ``overrides``: the stage's
    ``task``/``data``/``model``/``optim``/``train`` keys, set over the run's own (:func:`stage_config`)."""

    name: str
    init_from: str | None = None
    freeze: list[str] = field(default_factory=list)
    overrides: dict[str, Any] = field(default_factory=dict)


@dataclass
class RunConfig:
    """A run: ``task`` (a registered task, :mod:`seqzoo.training.registry`) and its sections.

    ``stages``, when given, makes a staged run: each stage trains in turn with the run's config
    overridden by the stage's keys, e.g. pretraining and fine-tuning with a frozen encoder::

        stages:
          - name: pretrain
            data: {name: corpus_a}
          - name: finetune
            init_from: pretrain     # start from the pretrain stage's best weights (matching names and shapes)
            freeze: [encoder.]      # parameters whose names start so are not trained
            data: {name: corpus_b}
            optim: {lr: 0.0005}
    """

    task: str = "classification"
    name: str = "run"
    output_dir: str = "runs"
    data: Any = None  # the task's data config (its registered ``data_config``), set by config_from_dict
    model: ModelConfig = field(default_factory=ModelConfig)
    optim: OptimConfig = field(default_factory=OptimConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    stages: list[StageConfig] = field(default_factory=list)

    def __post_init__(self) -> None:
        require_name(self.name, "name")
        unset = unset_variable(self.output_dir)
        if unset:
            raise ConfigError(f"output_dir: the environment variable {unset} is not set, in {self.output_dir!r}")


#: The sections a stage may override.
_STAGE_SECTIONS = ("task", "data", "model", "optim", "train")


def _check_value(value: Any, hint: Any, key: str) -> Any:
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if hint is Any:
        return value
    if origin in (typing.Union, types.UnionType):
        if value is None and type(None) in args:
            return None
        errors = []
        for option in (a for a in args if a is not type(None)):
            try:
                return _check_value(value, option, key)
            except ConfigError as err:
                errors.append(str(err))
        raise ConfigError(errors[0] if len(errors) == 1 else f"{key}: {value!r} does not match {hint}")
    if origin is Literal:
        if value not in args:
            raise ConfigError(f"{key}: {value!r} is not one of {', '.join(map(repr, args))}")
        return value
    if origin is list:
        if not isinstance(value, list):
            raise ConfigError(f"{key}: expected a list, got {value!r}")
        return [_check_value(v, args[0], f"{key}[{i}]") for i, v in enumerate(value)]
    if origin is dict:
        if not isinstance(value, dict):
            raise ConfigError(f"{key}: expected a mapping, got {value!r}")
        names = [k for k in value if not isinstance(k, args[0])] if args else []
        if names:
            raise ConfigError(f"{key}: keys must be {args[0].__name__}s, got {names[0]!r}")
        return dict(value)
    if dataclasses.is_dataclass(hint):
        return _build(hint, value, key)
    if hint is str and isinstance(value, str):
        return os.path.expandvars(value)  # paths may name $SEQZOO_DATA etc.
    if hint is float and isinstance(value, int) and not isinstance(value, bool):
        try:
            return float(value)
        except OverflowError:
            raise ConfigError(f"{key}: {value} is too large for a float") from None
    if hint is float and isinstance(value, str):  # YAML 1.1 reads "1e-3" as a string
        try:
            return float(value)
        except ValueError:
            pass
    if (hint in (int, float) and isinstance(value, bool)) or not isinstance(value, hint):
        raise ConfigError(f"{key}: expected {hint.__name__}, got {value!r}")
    return value


def _build(cls: type, values: Any, prefix: str) -> Any:
    if not isinstance(values, dict):
        raise ConfigError(f"{prefix or 'config'}: expected a mapping, got {values!r}")
    hints = typing.get_type_hints(cls)
    names = {f.name for f in dataclasses.fields(cls)}
    for key in values:
        if key not in names:
            raise ConfigError(f"unknown key {prefix + '.' if prefix else ''}{key} (valid: {', '.join(sorted(names))})")
    kwargs = {k: _check_value(v, hints[k], f"{prefix + '.' if prefix else ''}{k}") for k, v in values.items()}
    try:
        return cls(**kwargs)
    except ConfigError as err:  # a range check, which names the field only
        raise ConfigError(f"{prefix}.{err}" if prefix else str(err)) from None


def _task_spec(task: Any) -> Any:
    """The registered task ``task`` names (:func:`seqzoo.training.registry.get_task`)."""
    from seqzoo.training.registry import available_tasks, get_task

    if not isinstance(task, str) or task not in available_tasks():
        raise ConfigError(f"task: {task!r} is not one of {', '.join(map(repr, available_tasks()))}")
    return get_task(task)


def config_from_dict(values: dict[str, Any]) -> RunConfig:
    """Build and validate a :class:`RunConfig` from a plain dict (YAML content)."""
    values = dict(values)
    spec = _task_spec(values.get("task", "classification"))
    data = _build(spec.data_config, values.pop("data", {}) or {}, "data")
    stages = values.pop("stages", []) or []
    config = _build(RunConfig, values, "")
    config.data = data
    config.stages = _stages(config, stages)
    return config


def _stages(config: RunConfig, values: Any) -> list[StageConfig]:
    """The ``stages`` list checked: unique names, ``init_from`` an earlier stage, and each stage's
    config (the run's, overridden by it) valid."""
    if not isinstance(values, list):
        raise ConfigError(f"stages: expected a list, got {values!r}")
    stages: list[StageConfig] = []
    for i, raw in enumerate(values):
        key = f"stages[{i}]"
        if not isinstance(raw, dict) or not isinstance(raw.get("name"), str):
            raise ConfigError(f"{key}: expected a mapping with a name, got {raw!r}")
        raw = dict(raw)
        name = raw.pop("name")
        if not re.fullmatch(r"[A-Za-z0-9_][A-Za-z0-9_.-]*", name) or re.fullmatch(r"(seed|fold)-\d+", name):
            raise ConfigError(f"{key}.name: {name!r} is no stage directory name (letters, digits, _ . -)")
        if name in (s.name for s in stages):
            raise ConfigError(f"{key}.name: two stages are named {name!r}")
        init_from, freeze = raw.pop("init_from", None), raw.pop("freeze", [])
        if init_from is not None and init_from not in (s.name for s in stages):
            raise ConfigError(f"{key}.init_from: {init_from!r} is not an earlier stage")
        freeze = _check_value(freeze, list[str], f"{key}.freeze")
        unknown = [k for k in raw if k not in _STAGE_SECTIONS]
        if unknown:
            raise ConfigError(
                f"unknown key {key}.{unknown[0]} (valid: name, init_from, freeze, {', '.join(_STAGE_SECTIONS)})"
            )
        stage = StageConfig(name, init_from, freeze, raw)
        try:
            _refuse_inert(stage_config(config, stage), {key: key for key in _given_keys(raw)})
        except ConfigError as err:
            raise ConfigError(f"{key} ({name}): {err}") from None
        stages.append(stage)
    return stages


def _merged(base: dict[str, Any], over: Mapping[str, Any]) -> dict[str, Any]:
    """``base`` with ``over``'s keys set, section by section (``encoder_args`` is one value)."""
    merged = dict(base)
    for key, value in over.items():
        both = isinstance(value, Mapping) and isinstance(merged.get(key), dict) and key != "encoder_args"
        merged[key] = _merged(merged[key], value) if both else copy.deepcopy(value)
    return merged


def stage_config(config: RunConfig, stage: StageConfig) -> RunConfig:
    """The config ``stage`` trains with: ``config`` (without its stages) overridden by the stage's keys;
    a stage of another task starts from that task's data defaults, not from the run's data section."""
    values = config_to_dict(config)
    values.pop("stages", None)
    if stage.overrides.get("task", config.task) != config.task:
        values.pop("data")
    return config_from_dict(_merged(values, stage.overrides))


def config_to_dict(config: RunConfig) -> dict[str, Any]:
    """``config`` as a plain dict, without the keys that have no effect in it (:func:`inert_keys`),
    so that a stored run config loads again with :func:`load_config` as a new run's config."""
    values = dataclasses.asdict(dataclasses.replace(config, stages=[]))
    for key in inert_keys(config):
        section, name = key.split(".")
        del values[section][name]
    values["stages"] = [
        {
            "name": s.name,
            **({"init_from": s.init_from} if s.init_from else {}),
            **({"freeze": s.freeze} if s.freeze else {}),
            **s.overrides,
        }
        for s in config.stages
    ]
    if not values["stages"]:
        del values["stages"]
    return values


class _UniqueKeyLoader(yaml.SafeLoader):
    """PyYAML's safe loader, except that a key given twice in one mapping is an error (PyYAML keeps
    the last silently, so a config that sets a key twice would train with the one read last).

    A merge key (``<<: *base``) is one key of its mapping; the keys it brings in may be set again
    there, which is what merging is for (the mapping's own value wins)."""

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
        seen: set[Any] = set()
        for key_node, _ in node.value:
            # the merge key has no constructor of its own: SafeLoader resolves it while flattening
            merge = key_node.tag == "tag:yaml.org,2002:merge"
            key = "<<" if merge else self.construct_object(key_node, deep=deep)
            if key in seen:
                raise yaml.constructor.ConstructorError(
                    "while reading a mapping", node.start_mark, f"found key {key!r} twice", key_node.start_mark
                )
            seen.add(key)
        return super().construct_mapping(node, deep=deep)


#: Keys that say where the data lies, not what a model was trained with: a resumed or reloaded run may move them.
DATA_PATHS = ("data.data_dir", "data.train", "data.dev", "data.test", "data.embeddings")


def apply_override(values: dict[str, Any], assignment: str) -> None:
    """Set ``key.sub=value`` (the value read as YAML) in a nested config dict."""
    if "=" not in assignment:
        raise ConfigError(f"override {assignment!r} is not of the form key=value")
    key, raw = assignment.split("=", 1)
    parts = key.strip().split(".")
    target = values
    for part in parts[:-1]:
        target = target.setdefault(part, {})
        if not isinstance(target, dict):
            raise ConfigError(f"override {key}: {part} is not a section")
    try:
        target[parts[-1]] = yaml.safe_load(raw) if raw.strip() else None
    except yaml.YAMLError as err:
        raise ConfigError(f"override {key}: invalid YAML value {raw!r} ({getattr(err, 'problem', err)})") from None


_EPOCH_SCHEDULES = ("plateau", "exponential", "step_after")


def inert_keys(config: RunConfig) -> dict[str, str]:
    """The dotted keys that have no effect under ``config``, each with the reason (a set value would
    be ignored silently: ``train.batch_size`` in a language model, ``optim.momentum`` with Adam, ...)."""
    task, data, optim, train = config.task, config.data, config.optim, config.train
    spec = _task_spec(task)
    inert = {
        f"model.{f.name}": f"the {task} recipe does not use it"
        for f in dataclasses.fields(ModelConfig)
        if f.name not in spec.model_keys
    }
    inert.update(spec.inert_keys(config))
    if getattr(data, "embeddings", None) is not None:
        inert["data.embedding_dim"] = "the vectors of data.embeddings set the embedding size"
    if train.seeds:
        inert["train.seed"] = "train.seeds lists the seeds"
    if optim.optimizer not in ("sgd", "rmsprop"):
        inert["optim.momentum"] = f"optimizer {optim.optimizer} has no momentum term"
    if optim.optimizer != "rmsprop":
        inert["optim.alpha"] = "it is RMSprop's decay"
    if optim.optimizer == "sgd":
        inert["optim.eps"] = "SGD has no epsilon"
    if optim.schedule not in _EPOCH_SCHEDULES:
        inert["optim.decay"] = f"it is the multiplier of the {'/'.join(_EPOCH_SCHEDULES)} schedules"
    if optim.schedule != "step_after":
        inert["optim.decay_start"] = "it belongs to the step_after schedule"
    if optim.schedule == "constant":
        inert["optim.min_lr"] = "the constant schedule does not decay"
    return inert


def _given_keys(values: Mapping[str, Any], prefix: str = "") -> Iterator[str]:
    """The dotted keys a config dict sets (``encoder_args`` counts as one key)."""
    for key, value in values.items():
        if isinstance(value, Mapping) and key != "encoder_args":
            yield from _given_keys(value, f"{prefix}{key}.")
        else:
            yield f"{prefix}{key}"


def _override_keys(overrides: Sequence[str]) -> dict[str, str]:
    """{dotted key: how it was given} for the keys ``--set`` overrides set: a section given as a
    mapping (``--set "optim={optimizer: sgd, eps: 0.5}"``) sets each key in it."""
    given = {}
    for assignment in overrides:
        key, alone = assignment.split("=", 1)[0].strip(), {}
        apply_override(alone, assignment)  # the override by itself, as a nested dict
        given.update(
            {dotted: f"--set {key}" + (f": {dotted}" if dotted != key else "") for dotted in _given_keys(alone)}
        )
    return given


def _refuse_inert(config: RunConfig, given: dict[str, str]) -> None:
    """``given``: {dotted key: how it was given}, for the keys the user set."""
    inert = inert_keys(config)
    found = [f"{label} would have no effect ({inert[key]})" for key, label in given.items() if key in inert]
    if found:
        raise ConfigError(f"{'; '.join(found)}: remove {'it' if len(found) == 1 else 'them'}")


def load_config(
    path: str | Path | None = None, overrides: list[str] | tuple[str, ...] = (), *, resolved: bool = False
) -> RunConfig:
    """Read a YAML config (or start from defaults) and apply ``key.sub=value`` overrides.

    A key that would have no effect (:func:`inert_keys`) is a :class:`ConfigError`: a key of the
    file in the file's own config, an override in the result. ``resolved``: ``path`` is a run's
    stored config, checked only for its overrides (runs stored before this check list every key).
    """
    values: dict[str, Any] = {}
    if path is not None:
        try:
            loaded = yaml.load(Path(path).read_text(encoding="utf-8"), Loader=_UniqueKeyLoader)  # a SafeLoader
        except yaml.YAMLError as err:
            raise ConfigError(f"{path}: invalid YAML: {err}") from None
        except OSError as err:
            raise ConfigError(f"{path}: {err.strerror}") from None
        except UnicodeDecodeError as err:
            raise ConfigError(f"{path}: not UTF-8 text (invalid byte at offset {err.start})") from None
        if loaded is None:  # only `seqzoo train` without a file trains the default recipe
            raise ConfigError(f"{path}: the config file is empty")
        if not isinstance(loaded, dict):
            raise ConfigError(f"{path}: the top level must be a mapping")
        values = loaded
    file_keys = {} if resolved else {key: key for key in _given_keys(values)}
    try:  # the file's keys must act in the file's own config (an override may switch one off:
        # --set train.seeds=[1,2] over a file's seed: 1); the overrides', in the result
        config = config_from_dict(copy.deepcopy(values))
        _refuse_inert(config, file_keys)
    except ConfigError as err:
        raise ConfigError(f"{path}: {err}" if path else str(err)) from None
    where = str(path) if path else "config"
    if overrides:
        for assignment in overrides:
            apply_override(values, assignment)
        where = " ".join(f"--set {assignment}" for assignment in overrides)
        try:
            config = config_from_dict(values)
        except ConfigError as err:
            raise ConfigError(f"{where}: {err}") from None
        _refuse_inert(config, _override_keys(overrides))
    optim = config.optim
    if optim.min_lr > optim.lr:  # checked on the result: an override may set either
        raise ConfigError(f"{where}: optim.min_lr: decays' floor must be <= lr ({optim.lr}), got {optim.min_lr}")
    return config


def with_recipe_arguments(encoder_args: Mapping[str, Any], **owned: Any) -> dict[str, Any]:
    """``encoder_args`` plus the arguments the recipe sets itself (``owned``, e.g. ``input_size``: the
    embedding size). An ``encoder_args`` entry for one of those is a ``ValueError`` that names it."""
    clash = [f"{key} (the recipe sets it to {owned[key]!r})" for key in encoder_args if key in owned]
    if clash:
        raise ValueError(f"encoder_args may not set {', '.join(clash)}")
    return {**owned, **encoder_args}


@contextlib.contextmanager
def names_config_errors(key: str) -> Iterator[None]:
    """Report the ``ValueError`` a constructor raises for arguments from the config section ``key``
    (an unknown encoder, an unknown or out-of-range ``encoder_args`` entry: see
    :func:`seqzoo.encoders.base.build_encoder`) as a :class:`ConfigError` naming it. Other exceptions
    (a ``TypeError`` or ``KeyError`` is a bug, not a config error) keep their traceback."""
    from seqzoo.data.errors import DataError

    try:
        yield
    except DataError:
        raise
    except ValueError as err:
        raise ConfigError(f"{key}: {err}") from None
