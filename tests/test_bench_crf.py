"""Smoke test of ``seqzoo bench crf``: it runs at tiny sizes and reports consistent fields (speed is
never asserted here; see docs/results.md)."""

import builtins
import json

import pytest

from seqzoo.bench import crf as crf_bench

ARGS = ["--shapes", "2x4x3,3x5x70", "--repeats", "1", "--warmup", "0", "--threads", "1"]


def test_json_rows_cover_every_shape_and_length_variant(capsys):
    pytest.importorskip("torchcrf", reason="pytorch-crf is not installed (pip install 'seqzoo[dev]')")
    assert crf_bench.main([*ARGS, "--json"]) == 0
    rows = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert [(r["batch"], r["seq_len"], r["tags"], r["lengths"]) for r in rows] == [
        (2, 4, 3, "full"),
        (2, 4, 3, "padded"),
        (3, 5, 70, "full"),
        (3, 5, 70, "padded"),
    ]
    for r in rows:
        assert r["threads"] == 1
        if r["lengths"] == "full":
            assert r["tokens"] == r["batch"] * r["seq_len"]
        else:  # one row of length T, the others at least T/2
            assert r["seq_len"] + (r["batch"] - 1) * (r["seq_len"] // 2) <= r["tokens"] <= r["batch"] * r["seq_len"]
        for kind in ("llh", "viterbi"):
            ours, peer = r[f"seqzoo_{kind}_tokens_per_s"], r[f"pytorch_crf_{kind}_tokens_per_s"]
            assert ours > 0 and peer > 0
            assert r[f"seqzoo_{kind}_best_tokens_per_s"] >= ours and r[f"pytorch_crf_{kind}_best_tokens_per_s"] >= peer
            assert r[f"{kind}_speedup"] == pytest.approx(ours / peer, abs=0.006)


def test_table_and_running_without_pytorch_crf(capsys, monkeypatch):
    real_import = builtins.__import__

    def no_torchcrf(name, *args, **kwargs):
        if name == "torchcrf":
            raise ImportError(name)
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_torchcrf)
    assert crf_bench.main([*ARGS, "--lengths", "padded"]) == 0
    out, err = capsys.readouterr()
    assert "pytorch-crf is not installed" in err
    lines = out.splitlines()
    assert lines[0].split()[:3] == ["shape", "lengths", "llh"]
    assert [line.split()[:2] for line in lines[1:]] == [["2x4x3", "padded"], ["3x5x70", "padded"]]
    assert all(line.split()[3] == "-" for line in lines[1:])  # no peer, no ratio


def test_rejects_bad_shapes(capsys):
    with pytest.raises(SystemExit):
        crf_bench.main(["--shapes", "2x4"])
    assert "expected BxTxN of sizes >= 1" in capsys.readouterr().err
