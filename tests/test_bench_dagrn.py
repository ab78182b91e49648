"""Smoke tests of ``seqzoo bench dagrn`` (python -m seqzoo.bench.dagrn) at tiny sizes; speed is never asserted."""

import json

import pytest
import torch

import seqzoo.bench.dagrn as dagrn_bench
import seqzoo.bench.encoders as enc_bench

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


def test_lengths_from_mr_test(tmp_path, capsys):
    (tmp_path / "mr.test").write_text("pos\ta good film\nneg\tbad\n", encoding="utf-8")
    assert dagrn_bench.main([*TINY, "--sentences", "3", "--data", str(tmp_path), "--depth-bias", "0"]) == 0
    out = capsys.readouterr().out
    assert str(tmp_path / "mr.test") in out and "speed-up" in out
    lengths, _ = dagrn_bench._lengths(tmp_path, 3)
    assert lengths == [3, 1, 3]
    with pytest.raises(SystemExit, match=r"mr\.test"):
        dagrn_bench._lengths(tmp_path / "missing", 2)


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
