"""``seqzoo bench meta`` at tiny sizes: its rows and fields (speed itself is never asserted)."""

import json

import pytest
import torch

import seqzoo.bench.meta as meta_bench
from seqzoo.encoders.hyper_lstm import HyperLSTM
from seqzoo.encoders.meta_lstm import MetaLSTM

TINY = ["--batch", "2", "--seq-len", "3", "--input-size", "5", "--hidden", "4", "--meta-size", "3"]
TINY += ["--hyper-size", "3", "--signal-size", "2", "--repeats", "2", "--warmup", "1", "--threads", "1"]


@pytest.fixture
def keep_threads():
    threads = torch.get_num_threads()
    yield
    torch.set_num_threads(threads)


def test_json_rows_carry_each_model_its_rate_and_both_ratios(capsys, keep_threads):
    assert meta_bench.main([*TINY, "--json"]) == 0
    rows = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert [r["model"] for r in rows] == ["meta_lstm", "materialized", "lstm", "hyper_lstm"]
    by_model = {r["model"]: r for r in rows}
    for r in rows:
        assert (r["batch"], r["seq_len"], r["input_size"], r["hidden"], r["meta_size"], r["z_size"]) == (
            2,
            3,
            5,
            4,
            3,
            3,
        )
        assert (r["hyper_size"], r["signal_size"], r["threads"]) == (3, 2, 1)
        assert r["fwd_bwd_tokens_per_s"] == pytest.approx(6 / (r["fwd_bwd_ms"] / 1e3), rel=1e-2)
        for ratio, base in (("vs_materialized", "materialized"), ("vs_lstm", "lstm")):
            assert r[ratio] == pytest.approx(by_model[base]["fwd_bwd_ms"] / r["fwd_bwd_ms"], rel=1e-2)
    assert by_model["materialized"]["vs_materialized"] == by_model["lstm"]["vs_lstm"] == 1.0
    meta = MetaLSTM(5, 4, meta_size=3)
    assert (
        by_model["meta_lstm"]["params"]
        == by_model["materialized"]["params"]
        == sum(p.numel() for p in meta.parameters())
    )
    assert by_model["lstm"]["params"] == 4 * 4 * (5 + 4 + 2)  # nn.LSTM: two bias vectors
    hyper = HyperLSTM(5, 4, hyper_size=3, signal_size=2)
    assert by_model["hyper_lstm"]["params"] == sum(p.numel() for p in hyper.parameters())
    assert torch.get_num_threads() == 1


def test_the_table_has_a_line_per_model(capsys, keep_threads):
    assert meta_bench.main(TINY) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].split()[:2] == ["model", "params"]
    assert [line.split()[0] for line in lines[1:]] == ["meta_lstm", "materialized", "lstm", "hyper_lstm"]
