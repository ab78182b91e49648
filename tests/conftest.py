import contextlib
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import warnings
from pathlib import Path

import pytest

from seqzoo.encoders.recurrent import compile_failure

POSITIVE = "good great fine superb lovely moving brilliant fun warm charming".split()
NEGATIVE = "bad awful dull boring weak poor flat tedious messy bland".split()
NEUTRAL = "the a film movie story plot it is was and of with this that actor scene".split()

needs_cxx = pytest.mark.skipif(
    not (shutil.which("g++") or shutil.which("clang++")), reason="torch.compile needs a C++ compiler"
)


@contextlib.contextmanager
def no_eager_fallback():
    """A failed ``compile_step`` compile raises instead of running eagerly (now or since an earlier failure)."""
    assert compile_failure() is None, f"compiling is off since: {compile_failure()}"
    with warnings.catch_warnings():
        warnings.filterwarnings("error", message="compile_step")
        yield


def write_sentiment_corpus(directory: Path, name: str = "toy", sizes=(240, 60, 60), seed: int = 0) -> Path:
    """A small learnable two-class corpus in the Fudan format (LABEL<TAB>TEXT)."""
    rng = random.Random(seed)
    directory.mkdir(parents=True, exist_ok=True)
    for split, n in zip(("train", "dev", "test"), sizes, strict=True):
        lines = []
        for i in range(n):
            label = "pos" if i % 2 else "neg"
            cue = POSITIVE if label == "pos" else NEGATIVE
            words = rng.choices(NEUTRAL, k=rng.randint(3, 12)) + rng.choices(cue, k=rng.randint(1, 2))
            rng.shuffle(words)
            lines.append(f"{label}\t{' '.join(words)}")
        (directory / f"{name}.{split}").write_text("\n".join(lines) + "\n", encoding="utf-8")
    return directory


def assert_config_refused(path: Path, content: str | bytes, match: str) -> None:
    """The config file ``path``, written with ``content``, is a ConfigError matching ``match``."""
    from seqzoo.config import ConfigError, load_config

    if isinstance(content, bytes):
        path.write_bytes(content)
    else:
        path.write_text(content)
    with pytest.raises(ConfigError, match=match):
        load_config(path)


def train_toy_run(root: Path, model: str) -> Path:
    """A one-epoch run in ``root`` on the toy corpus of :func:`write_sentiment_corpus` (8-d word vectors),
    its model the YAML lines ``model``; returns the run directory."""
    from seqzoo.config import load_config
    from seqzoo.training.runner import run

    data = write_sentiment_corpus(root / "data")
    config = root / "toy.yaml"
    config.write_text(
        f"name: toy\ndata: {{name: toy, data_dir: {data}, embedding_dim: 8}}\n{model}"
        "train: {epochs: 1, batch_size: 16, patience: null, progress: false}\n"
    )
    run(load_config(config), root / "run")
    return root / "run"


@pytest.fixture(autouse=True)
def cpu_unless_marked_gpu(request, monkeypatch):
    """Tests not marked ``gpu`` see no GPU, so that on a machine with one they check the CPU path,
    as CI does (``train.device: auto`` would otherwise train them on the GPU); the gpu-marked ones
    name their device. Subprocesses get ``CUDA_VISIBLE_DEVICES`` from :func:`without_gpu`."""
    if request.node.get_closest_marker("gpu") is None:
        import torch

        monkeypatch.setattr(torch.cuda, "is_available", lambda: False)


def without_gpu(env: dict[str, str]) -> dict[str, str]:
    """``env`` for a subprocess that must not see a GPU (see :func:`cpu_unless_marked_gpu`)."""
    return {**env, "CUDA_VISIBLE_DEVICES": ""}


def killing_cli(task_class: str) -> str:
    """``python -c`` source of the ``seqzoo`` command line (on its argv) in which ``task_class``
    (``module.Class`` under ``seqzoo.tasks``) SIGKILLs the process at the ``$KILL_AT``-th call of its
    ``train_loss`` and at the ``$KILL_AT_EVALUATION``-th of its ``evaluate`` (unset or 0: never)."""
    module, name = task_class.split(".")
    return f"""
import os, signal, sys
from seqzoo.tasks.{module} import {name} as task
calls = {{"train_loss": 0, "evaluate": 0}}
def killing(name, variable):
    original = getattr(task, name)
    def method(self, *args):
        calls[name] += 1
        if calls[name] == int(os.environ.get(variable, "0")):
            os.kill(os.getpid(), signal.SIGKILL)
        return original(self, *args)
    setattr(task, name, method)
killing("train_loss", "KILL_AT")
killing("evaluate", "KILL_AT_EVALUATION")
from seqzoo.cli import main
sys.exit(main(sys.argv[1:]))
"""


def killed_run_state(command: list[str], env: dict[str, str], run_dir: Path) -> dict:
    """Run ``command``, a :func:`killing_cli` training into ``run_dir`` that must be killed; the loop
    state of the last checkpoint it wrote."""
    killed = subprocess.run(command, env=env, capture_output=True, text=True)
    assert killed.returncode == -signal.SIGKILL, killed.stderr
    return json.loads((run_dir / "last" / "train_state.json").read_text())["loop"]


def cli_env() -> dict[str, str]:
    """The environment of a ``seqzoo`` subprocess: this checkout importable, one OpenMP thread, no GPU."""
    return without_gpu({**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1]), "OMP_NUM_THREADS": "1"})


def kill_resume_and_rerun(task_class: str, config: Path, settings: list[str], kill_at: int, root: Path) -> dict:
    """Train ``config`` with the ``--set`` ``settings`` into ``root/killed`` in a :func:`killing_cli` of
    ``task_class`` SIGKILLed at its ``kill_at``-th training step, resume that run to its end, and train
    ``config`` uninterrupted into ``root/clean`` (both in this process); the loop state of the checkpoint
    the kill left (see :func:`assert_same_runs` to compare the two runs)."""
    from seqzoo.cli import main

    train = ["train", *(arg for setting in settings for arg in ("--set", setting))]
    killed = root / "killed"
    command = [sys.executable, "-c", killing_cli(task_class), *train, str(config), "--run-dir", str(killed)]
    state = killed_run_state(command, {**cli_env(), "KILL_AT": str(kill_at)}, killed)
    assert main([*train, "--resume", str(killed)]) == 0
    assert main([*train, str(config), "--run-dir", str(root / "clean")]) == 0
    return state


def assert_same_runs(a: Path, b: Path) -> None:
    """Runs ``a`` and ``b`` went on to their test evaluation, logged the same records (timings aside) and
    saved the same best and last weights, bit for bit."""
    import torch
    from safetensors.torch import load_file

    records = metric_records(a)
    assert records == metric_records(b) and records[-1]["event"] == "test"
    for checkpoint in ("best", "last"):
        x, y = (load_file(run / checkpoint / "model.safetensors") for run in (a, b))
        assert x.keys() == y.keys() and all(torch.equal(x[k], y[k]) for k in x), checkpoint


def predicted_rows(capsys, run_dir: Path, texts: Path, *options: str) -> list[dict]:
    """The JSON lines ``seqzoo predict RUN_DIR --input TEXTS OPTIONS`` prints (what was printed before
    it is dropped)."""
    from seqzoo.cli import main

    capsys.readouterr()
    assert main(["predict", str(run_dir), "--input", str(texts), *options]) == 0
    return [json.loads(line) for line in capsys.readouterr().out.splitlines()]


def metric_records(run_dir: Path) -> list[dict]:
    """A run's ``metrics.jsonl`` records without their timing keys (which differ between otherwise
    identical runs)."""
    import json

    from seqzoo.training.trainer import TIMING_KEYS

    lines = (run_dir / "metrics.jsonl").read_text().splitlines()
    return [{k: v for k, v in json.loads(line).items() if k not in TIMING_KEYS} for line in lines]


@pytest.fixture
def toy_corpus(tmp_path: Path) -> Path:
    return write_sentiment_corpus(tmp_path / "data")


@pytest.fixture
def single_thread():
    """Tiny tensors: OpenMP threads only add synchronisation cost (severe on a shared machine)."""
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture
def shared_data() -> Path:
    """Real corpora (a directory laid out like shared/data), from the SEQZOO_DATA variable."""
    root = os.environ.get("SEQZOO_DATA")
    if not root:
        pytest.skip("SEQZOO_DATA is not set: real-corpus integration tests need it (see README)")
    if not Path(root).is_dir():  # the README's command names ../shared/data, which a new machine lacks
        pytest.skip(f"SEQZOO_DATA={root} is no directory: real-corpus integration tests need it (see README)")
    return Path(root)
