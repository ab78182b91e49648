"""Smoke tests of ``seqzoo bench dagrn`` (python -m seqzoo.bench.dagrn) at tiny sizes; speed is never asserted."""

import json
import textwrap

import pytest
import torch
from conftest import train_toy_run

import seqzoo.bench.dagrn as dagrn_bench
import seqzoo.bench.encoders as enc_bench
from seqzoo.encoders.dagrn import DAGRN

TINY = ["--input", "4", "--depth-size", "2", "--layers", "3", "--batch", "2", "--repeats", "1", "--warmup", "0"]


def _rows(capsys) -> list[dict]:
    return [json.loads(line) for line in capsys.readouterr().out.splitlines() if line.strip()]


@pytest.fixture(autouse=True)
def keep_threads():
    threads = torch.get_num_threads()
    yield
    torch.set_num_threads(threads)


def test_depth_rows_follow_the_bias(capsys):
    assert dagrn_bench.main([*TINY, "--sentences", "5", "--depth-bias=-50,50", "--threads", "1", "--json"]) == 0
    deep, shallow = _rows(capsys)
    assert (deep["depth_bias"], shallow["depth_bias"]) == (-50.0, 50.0)
    assert deep["mean_depth"] == 3.0 and shallow["mean_depth"] == 1.0  # a huge bias forces the depth
    for row in (deep, shallow):
        assert row["layers"] == 3 and row["sentences"] == 5 and row["inputs"].startswith("random")
        assert row["adaptive_sentences_per_s"] > 0 and row["full_depth_sentences_per_s"] > 0
        ratio = row["adaptive_sentences_per_s"] / row["full_depth_sentences_per_s"]
        assert row["speedup"] == pytest.approx(ratio, rel=0.01)
        assert row["stack_speedup"] > 0 and 0 < row["stack_share_full_depth"]


@pytest.fixture(scope="module")
def dagrn_run(tmp_path_factory):
    model = textwrap.dedent("""\
        model:
          encoder: dagrn
          encoder_args: {hidden_size: 12, num_layers: 3, depth_size: 4}
          pooler: meanmaxglobal
        """)
    return train_toy_run(tmp_path_factory.mktemp("bench_dagrn"), model)


def test_trained_run_times_the_model_on_its_test_sentences(dagrn_run, capsys):
    args = ["--run", str(dagrn_run), "--batch", "4", "--repeats", "1", "--warmup", "0", "--threads", "1"]
    assert dagrn_bench.main([*args, "--depth-bias=0,-50,50", "--json"]) == 0
    own, deep, shallow = _rows(capsys)
    test_file = dagrn_run.parent / "data" / "toy.test"
    assert own["inputs"] == str(test_file) and own["run"] == str(dagrn_run)
    assert own["sentences"] == len(test_file.read_text(encoding="utf-8").splitlines())
    assert 1 <= own["mean_depth"] <= 3 and deep["mean_depth"] == 3.0 and shallow["mean_depth"] == 1.0
    for row in (own, deep, shallow):
        assert row["layers"] == 3 and row["model_speedup"] > 0 and row["stack_speedup"] > 0
        ratio = row["model_adaptive_sentences_per_s"] / row["model_full_depth_sentences_per_s"]
        assert row["model_speedup"] == pytest.approx(ratio, rel=0.01)
    assert dagrn_bench.main([*args, "--sentences", "2", "--depth-bias", "0"]) == 0
    out = capsys.readouterr().out
    assert f"run {dagrn_run}" in out and "2 sentences" in out and "model" in out


def test_depth_bias_is_undone():
    encoder = DAGRN(4, 6, num_layers=3, depth_size=2).eval()
    inner = torch.randn(2, 3, 2)
    before = encoder.depth_logits(inner)
    with dagrn_bench.depth_bias(encoder, 2.0):
        torch.testing.assert_close(encoder.depth_logits(inner), before - 2.0 * torch.arange(3.0), rtol=0, atol=1e-6)
    assert torch.equal(encoder.depth_logits(inner), before)


def test_lengths_from_mr_test(tmp_path, capsys):
    (tmp_path / "mr.test").write_text("pos\ta good film\nneg\tbad\n", encoding="utf-8")
    assert dagrn_bench.main([*TINY, "--sentences", "3", "--data", str(tmp_path), "--depth-bias", "0"]) == 0
    out = capsys.readouterr().out
    assert str(tmp_path / "mr.test") in out and "speed-up" in out
    lengths, _ = dagrn_bench._lengths(tmp_path, 3)
    assert lengths == [3, 1, 3]
    with pytest.raises(SystemExit, match=r"mr\.test"):
        dagrn_bench._lengths(tmp_path / "missing", 2)


def test_training_times_both_paths_and_restores_the_encoder(monkeypatch, capsys):
    encoders = []
    workload = dagrn_bench.random_workload
    monkeypatch.setattr(dagrn_bench, "random_workload", lambda args: encoders.append(w := workload(args)) or w)
    assert dagrn_bench.main([*TINY, "--sentences", "5", "--training", "--threads", "1", "--json"]) == 0
    (row,) = _rows(capsys)
    assert row["mode"].startswith("training") and row["sentences"] == 5 and 1 <= row["mean_depth"] <= 3
    assert row["gather_sentences_per_s"] > 0 and row["all_words_sentences_per_s"] > 0
    ratio = row["gather_sentences_per_s"] / row["all_words_sentences_per_s"]
    assert row["gather_speedup"] == pytest.approx(ratio, rel=0.01)
    (work,) = encoders
    assert not work.encoder.training and work.encoder.gather_in_training is DAGRN.gather_in_training
    with pytest.raises(SystemExit):  # one mode at a time
        dagrn_bench.main(["--training", "--gemm-bound"])


def test_gemm_bound_replays_every_linear(capsys):
    assert dagrn_bench.main(["--gemm-bound", "--gemm-shape", "2x3x4", "--repeats", "1", "--warmup", "0", "--json"]) == 0
    (row,) = _rows(capsys)
    assert row["encoder"] == "slstm" and row["shape"] == "2x3x4"
    # the input projection once, then per step: recurrent, global input, global gates, mean gates, word forget
    assert row["linear_calls"] == 1 + 1 + row["num_steps"] * 5
    assert 0 < row["of_gemm_bound"] and row["fwd_bwd_tokens_per_s"] > 0


def test_bench_encoders_measures_slstm(monkeypatch, capsys):
    monkeypatch.setattr("seqzoo.bench.encoders.sgemm_flops_per_s", lambda *_, **__: 1e9)
    args = ["--encoders", "lstm,slstm", "--shapes", "2x3x4", "--repeats", "1", "--warmup", "0", "--json"]
    assert enc_bench.main(args) == 0
    rows = _rows(capsys)
    assert [r["encoder"] for r in rows] == ["lstm", "slstm"]
    assert all(r["fwd_bwd_tokens_per_s"] > 0 for r in rows)
