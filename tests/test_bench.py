"""Smoke tests of the benchmark commands: they run at tiny sizes and report consistent fields.

Speed itself is never asserted here (benchmarks are not timed tests); see docs/results.md.
"""

import json
import sys

import pytest
import torch
from conftest import needs_cxx, no_eager_fallback
from torch._dynamo.utils import counters
from torch.utils.flop_counter import FlopCounterMode

from seqzoo.bench.mzu import dtgru_forward_flops, mzu_forward_flops
from seqzoo.cli import main
from seqzoo.dtgru import DeepTransitionGRU
from seqzoo.mzu import MZU


def _rows(capsys) -> list[dict]:
    return [json.loads(line) for line in capsys.readouterr().out.splitlines() if line.strip()]


@pytest.mark.parametrize(("window", "pooling"), [(1, "fo"), (2, "fo"), (2, "ifo"), (1, "f")])
@pytest.mark.parametrize("backend", ["auto", "reference"])
def test_bench_encoders_reports_rates_bound_and_pooling_share(capsys, monkeypatch, window, pooling, backend):
    monkeypatch.setenv("SEQZOO_QRNN_BACKEND", backend)  # pooling_share on every backend, as the spec asks
    monkeypatch.setattr("seqzoo.bench.encoders.sgemm_flops_per_s", lambda *_, **__: 123.4e9)  # (measured elsewhere)
    args = [
        "bench",
        "encoders",
        "--encoders",
        "lstm,gru,qrnn,qrnn",  # a name given twice is measured once
        "--shapes",
        "2x6x8,3x4x8",
        "--json",
        "--repeats",
        "1",
        "--warmup",
        "0",
        "--threads",
        "1",
        "--qrnn-window",
        str(window),
        "--qrnn-pooling",
        pooling,
    ]
    assert main(args) == 0
    rows = _rows(capsys)
    assert [(r["encoder"], r["batch"], r["seq_len"]) for r in rows] == [
        (e, b, t) for b, t in ((2, 6), (3, 4)) for e in ("lstm", "gru", "qrnn")
    ]
    for row in rows:
        assert row["hidden"] == 8 and row["threads"] == 1
        assert row["fwd_tokens_per_s"] > 0 and row["fwd_bwd_tokens_per_s"] > 0
    for row in (r for r in rows if r["encoder"] == "qrnn"):
        assert row["window"] == window and row["pooling"] == pooling
        # (a ratio of two timings: at these sizes, one run and no warm-up, it may exceed 1)
        assert row["gemm_bound_fwd_bwd_tokens_per_s"] > 0 and row["pooling_share"] > 0
    assert all(row["sgemm_gflops"] == 123.4 for row in rows)


def test_bench_encoders_under_bf16_times_the_pooling_of_bfloat16_gates(capsys, monkeypatch):
    """``--precision bf16`` runs every case under CPU autocast; the QRNN's pooling share is the
    pooling of the bfloat16 gates the layer hands its kernel (widening, kernel, narrowing)."""
    import seqzoo.bench.encoders as bench
    from seqzoo.kernels import pool_backend

    pooled = []
    original = bench.qrnn_pool_compiled

    def spy(gates, *args, **kwargs):
        pooled.append(gates.dtype)
        return original(gates, *args, **kwargs)

    monkeypatch.setattr(bench, "qrnn_pool_compiled", spy)
    monkeypatch.setattr("seqzoo.bench.encoders.sgemm_flops_per_s", lambda *_, **__: 123.4e9)
    args = ["bench", "encoders", "--encoders", "lstm,qrnn", "--shapes", "2x6x8", "--json", "--precision", "bf16"]
    assert main([*args, "--repeats", "1", "--warmup", "0", "--threads", "1"]) == 0
    rows = _rows(capsys)
    assert [(r["encoder"], r["precision"]) for r in rows] == [("lstm", "bf16"), ("qrnn", "bf16")]
    assert rows[1]["pooling_share"] > 0 and rows[1]["gemm_bound_fwd_bwd_tokens_per_s"] > 0
    if pool_backend() == "compiled":
        assert pooled and set(pooled) == {torch.bfloat16}


@pytest.mark.parametrize("compile_step", [False, pytest.param(True, marks=needs_cxx)])
def test_bench_mzu_reports_flop_efficiency(capsys, compile_step):
    flags = ["--compile-step"] if compile_step else []
    args = ["bench", "mzu", "--batch", "2", "--bptt", "2", "--repeats", "1", "--threads", "1", "--json", *flags]
    counters.clear()
    with no_eager_fallback():
        assert main(args) == 0
    assert (counters["stats"]["unique_graphs"] > 0) is compile_step  # the flag reaches the encoders
    rows = {r["model"]: r for r in _rows(capsys)}
    assert set(rows) == {"capMZU+DT", "DT-GRU"}
    for row in rows.values():
        assert row["batch"] == 2 and row["bptt"] == 2 and row["params"] > 1_000_000
        assert row["compile_step"] is compile_step
        achieved = row["chars_per_s"] * row["train_flops_per_char"] / 1e9
        assert row["achieved_gflops"] == pytest.approx(achieved, rel=0.01)
        assert row["flop_efficiency"] == pytest.approx(achieved / max(row["sgemm_gflops"]), abs=2e-3)


@pytest.mark.parametrize("name", ["nope", "__init__"])
def test_bench_unknown_name_is_a_clear_error(capsys, name):
    with pytest.raises(SystemExit) as exit_info:  # argparse's usage error, listing the benchmarks
        main(["bench", name])
    assert exit_info.value.code == 2
    assert f"invalid choice: '{name}' (choose from 'encoders', 'mzu')" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["encoders", "--encoders", "lstm,nope"], "unknown encoder(s) nope"),
        (["encoders", "--shapes", "2x8"], "shapes are BxTxH of sizes >= 1"),
        (["encoders", "--shapes", "2x0x8"], "shapes are BxTxH of sizes >= 1"),
        (["encoders", "--repeats", "0"], "expected an integer >= 1, got 0"),
        (["encoders", "--warmup", "-4"], "expected an integer >= 0, got -4"),
        (["mzu", "--bptt", "x"], "expected an integer, got 'x'"),
        (["encoders", "--encoders", "lstm,mzu", "--shapes", "2x4x6"], "mzu at hidden size 6: hidden_size 6 must be"),
        (["encoders", "--encoders", "sru"], "no encoder left to measure"),  # sru hidden below
    ],
)
def test_bench_arguments_are_checked_by_the_parser(args, message, capsys, monkeypatch):
    monkeypatch.setitem(sys.modules, "sru", None)  # not installed (CI's case), also where it is
    with pytest.raises(SystemExit) as exit_info:
        main(["bench", *args])
    assert exit_info.value.code == 2 and message in capsys.readouterr().err


@pytest.mark.parametrize("composition", ["dtgru", "sat", "gcn"])
def test_analytic_flops_equal_the_matmuls_torch_counts(composition):
    """The FLOP counts behind the efficiency figures, against torch's FlopCounterMode on a small
    forward (per token). The DT-GRU's count once left out the L-GRU's W_hl (11.5 % low at the PTB
    size). The capsule count is of eqs. 10-14, not of the zone-space routing the code runs (see
    _m_function_flops), so it is not compared here."""
    n, hidden, filter_size = 8, 12, 10
    if composition == "dtgru":
        encoder, expected = (
            DeepTransitionGRU(n, hidden, linear_gate=True, layer_norm=True),
            dtgru_forward_flops(n, hidden),
        )
    else:
        kwargs = {"composition": composition, "num_zones": 4, "filter_size": filter_size}
        encoder = MZU(n, hidden, transition_depth=1, share_transition=True, **kwargs)
        expected = mzu_forward_flops(n, hidden, composition, 4, filter_size)
    with FlopCounterMode(display=False) as counter, torch.no_grad():
        encoder.eval()(torch.randn(2, 3, n))
    assert counter.get_total_flops() == 2 * 3 * expected


@pytest.mark.parametrize("bench", ["encoders", "mzu"])
def test_bench_device_must_be_cpu_or_a_cuda_device_torch_sees(capsys, bench):
    for device, message in (
        ("mps", "benchmarks run on cpu or cuda"),
        ("gpu0", "expected a device such as cpu or cuda"),
    ):
        with pytest.raises(SystemExit):
            main(["bench", bench, "--device", device])
        assert message in capsys.readouterr().err
    if not torch.cuda.is_available():
        with pytest.raises(SystemExit):
            main(["bench", bench, "--device", "cuda"])
        assert "cuda: torch sees no CUDA device here" in capsys.readouterr().err
