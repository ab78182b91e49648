"""Data-parallel training (seqzoo.training.distributed): 2 CPU processes (gloo) started by torchrun train as
1 process on their global batch does (classification, LM, tagging with a CRF, multi-task with a tagging and a
classification sub-task), and a job one of whose processes is killed stops at once and resumes to the
uninterrupted job's result."""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml
from conftest import killing_cli, metric_records, without_gpu, write_sentiment_corpus
from test_lm import write_corpus
from test_multitask_tagging import _ner, _write
from test_tagging import write_corpus as write_tagged_corpus

from seqzoo.cli import _torchrun_argv, build_parser, main
from seqzoo.config import RunConfig, config_from_dict, load_config
from seqzoo.data.batching import bucket_batches, shard_batches
from seqzoo.training.checkpoint import load_tensors
from seqzoo.training.distributed import global_batch_config
from seqzoo.training.registry import get_task

pytestmark = pytest.mark.usefixtures("single_thread")

#: The weights of 2 ranks with batch b and of 1 process with batch 2b differ only by float32 rounding
#: (a sum of two halves instead of one sum), a few ulps per step of SGD on O(1) weights.
WEIGHT_TOLERANCE = 1e-5


def test_shards_give_every_rank_as_many_batches_and_each_example_once():
    lengths = [(7 * i) % 13 + 1 for i in range(50)]
    batches = bucket_batches(lengths, 8, shuffle=True, seed=3, bucket_size_multiplier=2)  # pools end in small batches
    shards = [shard_batches(batches, rank, 3) for rank in range(3)]
    kept = [batch for batch in batches if len(batch) >= 3]
    assert len(kept) < len(batches)  # a batch too small for every rank to get a part is dropped
    assert all(len(shard) == len(kept) for shard in shards)
    for step, batch in enumerate(kept):
        parts = [shard[step] for shard in shards]
        assert sorted(i for part in parts for i in part) == sorted(batch)
        assert max(map(len, parts)) - min(map(len, parts)) <= 1
    assert shard_batches(batches, 1, 3) == shards[1]  # a pure function: a resume replays it
    with pytest.raises(ValueError, match="rank"):
        shard_batches(batches, 3, 3)


def test_one_process_keeps_the_per_rank_batch():
    config = config_from_dict({"train": {"batch_size": 4}})
    assert global_batch_config(config) is config


def test_nproc_hands_each_process_the_same_command_without_it():
    parser = build_parser()
    given = ["--threads", "1", "--import", "mod", "train", "c.yaml", "--set", "a=b c", "--nproc", "2", "--run-dir", "r"]
    args = parser.parse_args(given)
    again = parser.parse_args(_torchrun_argv(args))
    assert again.nproc is None
    assert {**vars(again), "nproc": 2} == vars(args)
    resumed = parser.parse_args(["train", "--resume", "r", "--nproc", "3"])
    assert vars(parser.parse_args(_torchrun_argv(resumed))) == {**vars(resumed), "nproc": None}


def test_a_run_resumes_only_on_as_many_processes_as_it_trained_on(tmp_path, capsys):
    config = _classification_config(tmp_path)
    run_dir = tmp_path / "run"
    assert main(["train", str(config), "--run-dir", str(run_dir), "--set", "train.epochs=1"]) == 0
    state = run_dir / "last" / "train_state.json"
    assert json.loads(state.read_text())["world_size"] == 1
    state.write_text(json.dumps({**json.loads(state.read_text()), "world_size": 2}))
    capsys.readouterr()
    assert main(["train", "--resume", str(run_dir), "--set", "train.epochs=2"]) == 2
    assert "saved by a run on 2 process(es)" in capsys.readouterr().err


def _torchrun(*args: str, timeout: float = 120) -> subprocess.CompletedProcess:
    """``torchrun --nproc-per-node 2 -m seqzoo train ...``: two data-parallel CPU processes, one thread each."""
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=2", "-m", "seqzoo"]
    command += ["train", *args]
    env = without_gpu({**os.environ, "OMP_NUM_THREADS": "1"})
    return subprocess.run(command, env=env, capture_output=True, text=True, timeout=timeout, check=False)


def _write_config(path: Path, config: RunConfig) -> Path:
    from seqzoo.config import config_to_dict

    path.write_text(yaml.safe_dump(config_to_dict(config)), encoding="utf-8")
    return path


def _max_weight_difference(run_a: Path, run_b: Path) -> float:
    a, b = load_tensors(run_a / "best" / "model.safetensors"), load_tensors(run_b / "best" / "model.safetensors")
    assert a.keys() == b.keys()
    return max(float((a[k] - b[k]).abs().max()) for k in a)


def _test_record(run_dir: Path) -> dict:
    return next(r for r in metric_records(run_dir) if r["event"] == "test")


def _classification_config(tmp_path: Path) -> Path:
    """A GRU classifier, SGD, no dropout, 3 epochs of 50 steps of 8 examples (4 per rank on 2)."""
    data_dir = write_sentiment_corpus(tmp_path / "data", sizes=(400, 40, 40))
    config = config_from_dict(
        {
            "name": "toy",
            "output_dir": str(tmp_path / "runs"),
            "data": {"name": "toy", "data_dir": str(data_dir), "embedding_dim": 8, "min_freq": 1},
            "model": {"encoder": "gru", "encoder_args": {"hidden_size": 8}, "dropout": 0.0},
            "optim": {"optimizer": "sgd", "lr": 0.5, "clip_norm": 1.0},
            "train": {
                "epochs": 3,
                "batch_size": 4,
                "patience": None,
                "seed": 3,
                "progress": False,
                "threads": 1,
                "checkpoint_every": 5,
                "device": "cpu",
            },
        }
    )
    return _write_config(tmp_path / "toy.yaml", config)


def _one_and_two_ranks(config: Path) -> tuple[Path, Path, Path]:
    """``config`` (batch 4) trained by 1 process with batch 8 and by 2 ranks with batch 4 each, in run
    directories ``one`` and ``two`` beside it: (config, one, two)."""
    single, double = config.parent / "one", config.parent / "two"
    assert main(["train", str(config), "--run-dir", str(single), "--set", "train.batch_size=8"]) == 0
    job = _torchrun(str(config), "--run-dir", str(double))
    assert job.returncode == 0, job.stderr[-3000:]
    return config, single, double


@pytest.fixture(scope="module")
def classification_runs(tmp_path_factory):
    """The classification config trained by 1 process with batch 8 and by 2 ranks with batch 4 each."""
    return _one_and_two_ranks(_classification_config(tmp_path_factory.mktemp("dp")))


def test_two_ranks_train_as_one_process_on_the_global_batch(classification_runs):
    _, single, double = classification_runs
    assert _max_weight_difference(single, double) <= WEIGHT_TOLERANCE
    one, two = metric_records(single), metric_records(double)
    assert [r["event"] for r in two] == [r["event"] for r in one]  # as many epochs and step records
    assert [r["step"] for r in two if "step" in r] == [r["step"] for r in one if "step" in r]
    assert _test_record(double)["test_accuracy"] == pytest.approx(_test_record(single)["test_accuracy"], abs=0.03)


def test_rank_zero_alone_writes_the_run_directory(classification_runs):
    _, _, double = classification_runs
    log = (double / "train.log").read_text()
    assert log.count("training on cpu, 2 data-parallel processes") == 1  # one process logs
    assert [log.count(f"epoch {n}: train loss") for n in (1, 2, 3)] == [1, 1, 1]
    assert yaml.safe_load((double / "config.yaml").read_text())["train"]["batch_size"] == 4  # the per-rank batch
    assert json.loads((double / "last" / "train_state.json").read_text())["world_size"] == 2


def _children(pid: int) -> list[int]:
    """Processes whose parent is ``pid`` (from /proc)."""
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                stat = (entry / "stat").read_text()
            except OSError:
                continue
            if int(stat.rsplit(")", 1)[1].split()[1]) == pid:
                found.append(int(entry.name))
    return found


def _rank_of(pid: int) -> int | None:
    try:
        environ = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
    except OSError:
        return None
    return next((int(item[5:]) for item in environ if item.startswith(b"RANK=")), None)


def test_a_killed_rank_stops_the_job_and_resume_finishes_it_as_uninterrupted(classification_runs, tmp_path):
    config, _, uninterrupted = classification_runs
    run_dir = tmp_path / "killed"
    command = [sys.executable, "-m", "seqzoo", "train", "--nproc", "2", str(config), "--run-dir", str(run_dir)]
    env = without_gpu({**os.environ, "OMP_NUM_THREADS": "1"})
    job = subprocess.Popen(command, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 90
        while not (run_dir / "last").exists():  # the first checkpoint: training is under way
            assert job.poll() is None and time.monotonic() < deadline, "the job ended before its first checkpoint"
            time.sleep(0.01)
        workers = [pid for pid in _children(job.pid) if _rank_of(pid) == 1]
        assert workers, "no rank-1 process found"
        os.kill(workers[0], signal.SIGKILL)
        killed_at = time.monotonic()
        _, stderr = job.communicate(timeout=60)
        print(f"killed rank 1 at {run_dir / 'last'}; the job ended {time.monotonic() - killed_at:.1f} s later")
    finally:
        if job.poll() is None:
            job.kill()
    assert job.returncode != 0
    assert "failed" in stderr
    records = metric_records(run_dir) if (run_dir / "metrics.jsonl").exists() else []
    assert not any(r["event"] == "test" for r in records), "killed after it had finished"
    resumed = _torchrun("--resume", str(run_dir))
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert _test_record(run_dir) == _test_record(uninterrupted)
    assert metric_records(run_dir) == metric_records(uninterrupted)


def test_two_ranks_of_the_lm_recipe_train_as_one_process_on_twice_the_streams(tmp_path):
    corpus = write_corpus(tmp_path / "corpus", sizes=(120, 20, 20))
    config = config_from_dict(
        {
            "task": "lm",
            "name": "toy_lm",
            "output_dir": str(tmp_path / "runs"),
            "data": {"data_dir": str(corpus), "batch_size": 2, "eval_batch_size": 3, "bptt": 8, "embedding_dim": 8},
            "model": {"encoder": "lstm", "encoder_args": {"hidden_size": 8}, "dropout": 0.0, "tie_weights": True},
            "optim": {"optimizer": "sgd", "lr": 1.0, "clip_norm": 1.0},
            "train": {"epochs": 1, "max_steps": 12, "patience": None, "seed": 5, "progress": False, "threads": 1},
        }
    )
    path = _write_config(tmp_path / "lm.yaml", config)
    single, double = tmp_path / "one", tmp_path / "two"
    assert main(["train", str(path), "--run-dir", str(single), "--set", "data.batch_size=4"]) == 0
    job = _torchrun(str(path), "--run-dir", str(double), "--set", "train.device=cpu")
    assert job.returncode == 0, job.stderr[-3000:]
    assert _max_weight_difference(single, double) <= WEIGHT_TOLERANCE
    assert _test_record(double)["test_ppl"] == pytest.approx(_test_record(single)["test_ppl"], rel=1e-4)
    steps = [[r["step"] for r in metric_records(run) if r["event"] == "epoch"] for run in (single, double)]
    assert steps == [[12], [12]]  # both trained (from the same initial weights)


def test_two_ranks_of_the_tagging_recipe_train_as_one_process_on_the_global_batch(tmp_path):
    """A BiLSTM-CRF with character features: 2 epochs of 8 steps of 8 sentences (4 per rank on 2)."""
    corpus = write_tagged_corpus(tmp_path / "data", sizes=(64, 16, 16))
    config = config_from_dict(
        {
            "task": "tagging",
            "name": "toy_tagging",
            "output_dir": str(tmp_path / "runs"),
            "data": {"data_dir": str(corpus), "scheme": "iob2", "train_scheme": "iobes", "embedding_dim": 8},
            "model": {
                "encoder": "lstm",
                "encoder_args": {"hidden_size": 6, "bidirectional": True},
                "char_encoder": "cnn",
                "char_embedding_dim": 4,
                "char_hidden_size": 4,
                "dropout": 0.0,
            },
            "optim": {"optimizer": "sgd", "lr": 0.5, "clip_norm": 5.0},
            "train": {
                "epochs": 2,
                "batch_size": 4,
                "patience": None,
                "seed": 2,
                "progress": False,
                "threads": 1,
                "device": "cpu",
            },
        }
    )
    _, single, double = _one_and_two_ranks(_write_config(tmp_path / "tagging.yaml", config))
    assert _max_weight_difference(single, double) <= WEIGHT_TOLERANCE
    assert "crf.transitions" in "".join(load_tensors(double / "best" / "model.safetensors"))  # the CRF trained too
    _assert_records_close(metric_records(double), metric_records(single))


def _assert_records_close(records: list[dict], expected: list[dict]) -> None:
    """The same metric records, each figure up to the float32 rounding of weights that differ by a few ulps."""
    assert [sorted(r) for r in records] == [sorted(r) for r in expected]
    for record, want in zip(records, expected, strict=True):
        assert record == {k: v if isinstance(v, str) else pytest.approx(v, rel=1e-4, abs=1e-6) for k, v in want.items()}


def _multitask_config(tmp_path: Path) -> Path:
    """ASP-MTL over an IOB2 tagging task with a CRF (64 sentences) and a classification task (48 texts): 2 epochs
    of 8 + 6 steps of 8 examples (4 per rank on 2), checkpoints every 5 steps. The discriminator behind its
    gradient reversal, and the orthogonality loss, a statistic of the whole batch (not a mean over examples),
    which the ranks take together."""
    _write(tmp_path / "ner", _ner, (64, 16, 16), seed=0)
    cls = write_sentiment_corpus(tmp_path / "cls", "alpha", (48, 16, 16), seed=2)
    path = tmp_path / "mtl.yaml"
    path.write_text(
        f"""\
task: multitask
output_dir: {tmp_path / "runs"}
data:
  tasks: [{{name: ner, kind: tagging, data_dir: {tmp_path / "ner"}, scheme: iob2}}, {{name: alpha, data_dir: {cls}}}]
  architecture: asp
  orthogonality_weight: 0.1
  embedding_dim: 8
model: {{encoder: lstm, encoder_args: {{hidden_size: 6}}, dropout: 0.0}}
optim: {{optimizer: sgd, lr: 0.2, clip_norm: 5.0}}
train: {{epochs: 2, batch_size: 4, patience: null, progress: false, log_every: 3, device: cpu, threads: 1, seed: 4,
         checkpoint_every: 5}}
""",
        encoding="utf-8",
    )
    return path


def test_every_rank_draws_the_same_task_at_a_step_and_takes_its_part_of_the_batch(tmp_path):
    config = load_config(_multitask_config(tmp_path), ["train.batch_size=7"])  # the global batch of 3 ranks
    task = get_task("multitask").build_tasks(config)[0][1]
    whole = task.train_batches(1)
    shards = []
    for rank in range(3):
        task.shard_train(rank, 3)
        shards.append(task.train_batches(1))
    assert len({name for name, _ in whole}) == 2
    kept = [(name, batch) for name, batch in whole if len(batch) >= 3]
    assert len(kept) < len(whole)  # 64 sentences in batches of 7 leave one of 1: no rank trains on it
    for shard in shards:
        assert [name for name, _ in shard] == [name for name, _ in kept]
    for step, (_, batch) in enumerate(kept):
        assert sorted(i for shard in shards for i in shard[step][1]) == sorted(batch)


@pytest.fixture(scope="module")
def multitask_runs(tmp_path_factory):
    """The multi-task config trained by 1 process with batch 8 and by 2 ranks with batch 4 each."""
    return _one_and_two_ranks(_multitask_config(tmp_path_factory.mktemp("dp_mtl")))


def test_two_ranks_of_the_multitask_recipe_train_as_one_process_on_the_global_batch(multitask_runs):
    _, single, double = multitask_runs
    assert _max_weight_difference(single, double) <= WEIGHT_TOLERANCE  # every task's head and private encoder
    one, two = metric_records(single), metric_records(double)
    assert [r.get("step") for r in two] == [r.get("step") for r in one] == [3, 6, 9, 12, 14, 17, 20, 23, 26, 28, None]
    _assert_records_close(two, one)  # losses, per-task dev and test metrics


def test_a_multitask_job_killed_mid_epoch_resumes_as_uninterrupted(multitask_runs, tmp_path):
    config, _, uninterrupted = multitask_runs
    script = tmp_path / "killing.py"  # run by torchrun instead of -m seqzoo: each rank dies at its 19th step
    script.write_text(killing_cli("multitask.MultiTask"), encoding="utf-8")
    run_dir = tmp_path / "killed"
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=2", str(script)]
    env = without_gpu({**os.environ, "OMP_NUM_THREADS": "1", "KILL_AT": "19"})  # epoch 2, step 5
    command += ["train", str(config), "--run-dir", str(run_dir)]
    killed = subprocess.run(command, env=env, capture_output=True, text=True, timeout=120, check=False)
    assert killed.returncode != 0, killed.stderr[-3000:]
    loop = json.loads((run_dir / "last" / "train_state.json").read_text())["loop"]
    assert (loop["epoch"], loop["step_in_epoch"], loop["global_step"]) == (1, 1, 15)  # the checkpoint of step 15
    resumed = _torchrun("--resume", str(run_dir))
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert metric_records(run_dir) == metric_records(uninterrupted)
    assert _max_weight_difference(run_dir, uninterrupted) == 0.0
