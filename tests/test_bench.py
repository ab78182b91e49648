"""Smoke tests of the benchmark commands: they run at tiny sizes and report consistent fields.

Speed itself is never asserted here (benchmarks are not timed tests); see docs/results.md.
"""

import json
import sys
import types

import pytest
import torch
from conftest import needs_cxx, no_eager_fallback
from torch._dynamo.utils import counters
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils.flop_counter import FlopCounterMode

import seqzoo.bench as bench_pkg
import seqzoo.bench.encoders as enc_bench
import seqzoo.bench.mzu as mzu_bench
from seqzoo import build_encoder
from seqzoo.bench.mzu import dtgru_forward_flops, mzu_forward_flops
from seqzoo.cli import main
from seqzoo.encoders.base import detach_state
from seqzoo.encoders.dtgru import DeepTransitionGRU
from seqzoo.encoders.mzu import MZU


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
    err = capsys.readouterr().err
    assert f"invalid choice: '{name}' (choose from " in err
    assert all(
        f"'{bench}'" in err for bench in ("compiled_step", "early_training_probe", "encoders", "mzu", "step_time")
    )


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["encoders", "--encoders", "lstm,nope"], "unknown encoder(s) nope"),
        (["encoders", "--shapes", "2x8"], "expected BxTxN of sizes >= 1"),
        (["encoders", "--shapes", "2x0x8"], "expected BxTxN of sizes >= 1"),
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


# seconds per case: a slow warm-up, then three timed runs whose median, mean and min all differ
_BASE = {"fwd": 0.5, "fwd_bwd": 2.0, "gemm": 1.0, "pool": 0.25, "fused_pool": 0.25, "half_pool": 0.25}


def _fake_timers(monkeypatch, warmup_s=100.0):
    made, now = {}, [0.0]
    monkeypatch.setattr(bench_pkg, "time", types.SimpleNamespace(perf_counter=lambda: now[0], process_time=lambda: 0.0))

    def fake_case(fn, device, precision):
        name, calls = fn.__name__, [0]
        made.setdefault(name, []).append((fn, precision))

        def run():  # moves the clock on by the case's seconds
            calls[0] += 1
            now[0] += warmup_s if calls[0] == 1 else _BASE[name] * (1, 2, 6)[(calls[0] - 2) % 3]

        return run

    monkeypatch.setattr(enc_bench, "_under_autocast", fake_case)
    return made


def test_bench_encoders_rates_are_tokens_over_the_median_after_warmup(monkeypatch):
    """Rates are batch x seq_len tokens over the median timed run, the warm-up not counted;
    pooling_share is the pooling's time over the fwd+bwd time."""
    _fake_timers(monkeypatch)
    batch, seq_len = 2, 3
    rows = enc_bench.measure(["lstm", "qrnn"], (batch, seq_len, 8), 3, 1, 1, 1, "fo")
    tokens = batch * seq_len
    for row in rows:  # medians: fwd 1.0 s, fwd_bwd 4.0 s, gemm 2.0 s, pool 0.5 s
        assert row["fwd_tokens_per_s"] == pytest.approx(tokens / 1.0)
        assert row["fwd_bwd_tokens_per_s"] == pytest.approx(tokens / 4.0)
    qrnn = rows[1]
    assert qrnn["gemm_bound_fwd_bwd_tokens_per_s"] == pytest.approx(tokens / 2.0)
    assert qrnn["pooling_share"] == pytest.approx(0.5 / 4.0)


def test_bench_encoders_times_the_requested_shape_batch_first(monkeypatch):
    """The input is drawn batch-first, (B, T, H): (T, B, H) has the same token count but is another shape."""
    _fake_timers(monkeypatch)
    seen = []
    original = enc_bench._encoder_cases
    monkeypatch.setattr(enc_bench, "_encoder_cases", lambda m, x, p: seen.append(tuple(x.shape)) or original(m, x, p))
    enc_bench.measure(["gru"], (2, 5, 8), 1, 0, 1, 1, "fo")
    assert seen == [(2, 5, 8)]


class _MatmulLog(TorchDispatchMode):
    def __init__(self):
        super().__init__()
        self.calls = []

    def __torch_dispatch__(self, func, types_, args=(), kwargs=None):
        name = func.overloadpacket.__name__
        if name in ("mm", "addmm"):
            tensors = [a for a in args if isinstance(a, torch.Tensor)]
            if name == "addmm":
                tensors = tensors[1:]
            self.calls.append((name, *(tuple(t.shape) for t in tensors)))
        return func(*args, **(kwargs or {}))


@pytest.mark.parametrize(("window", "pooling", "gates"), [(1, "fo", 3), (2, "ifo", 4)])
def test_bench_gemm_bound_times_the_layers_three_projection_matmuls(monkeypatch, window, pooling, gates):
    """Y = X W^T + b, dX = dY W, dW^T = X^T dY on (B*T, k*n) inputs, in this layout, all three."""
    made = _fake_timers(monkeypatch)
    batch, seq_len, hidden = 2, 3, 8
    enc_bench.measure(["qrnn"], (batch, seq_len, hidden), 1, 0, window, 1, pooling)
    ((gemm, _),) = made["gemm"]
    log = _MatmulLog()
    with log:
        gemm()
    rows, cols, out = batch * seq_len, window * hidden, gates * hidden
    assert log.calls == [
        ("addmm", (rows, cols), (cols, out)),
        ("mm", (rows, out), (out, cols)),
        ("mm", (cols, rows), (rows, out)),
    ]


def test_bench_gemm_bound_runs_under_the_requested_precision(monkeypatch):
    """Under --precision bf16 the GEMM bound is timed in bf16 too (an fp32 bound the bf16 layer beats)."""
    made = _fake_timers(monkeypatch)
    enc_bench.measure(["qrnn"], (2, 3, 8), 1, 0, 1, 1, "fo", precision="bf16")
    assert made["gemm"][0][1] == "bf16" and made["fwd_bwd"][0][1] == "bf16"


def test_bench_encoders_table_percent_of_gemm_bound_and_pool_share():
    """The table's % of the GEMM bound is achieved / bound."""
    row = {"encoder": "qrnn", "batch": 2, "seq_len": 3, "hidden": 8, "fwd_tokens_per_s": 100.0,
           "fwd_bwd_tokens_per_s": 50.0, "gemm_bound_fwd_bwd_tokens_per_s": 200.0, "pooling_share": 0.3}  # fmt: skip
    lstm = {**row, "encoder": "lstm", "fwd_bwd_tokens_per_s": 25.0}
    del lstm["gemm_bound_fwd_bwd_tokens_per_s"], lstm["pooling_share"]
    last = enc_bench._table([lstm, row]).splitlines()[-1].split()
    assert last[-3:] == ["2.00", "25%", "30%"]


def _thread_spy(monkeypatch, module, attr):
    seen, threads = [], torch.get_num_threads()
    original = getattr(module, attr)
    monkeypatch.setattr(module, attr, lambda *a, **k: seen.append(torch.get_num_threads()) or original(*a, **k))
    return seen, threads


def test_bench_encoders_sets_the_thread_count_before_measuring(monkeypatch, capsys):
    """--threads is applied before anything is measured."""
    seen, threads = _thread_spy(monkeypatch, enc_bench, "measure")
    monkeypatch.setattr(enc_bench, "sgemm_flops_per_s", lambda *a, **k: seen.append(torch.get_num_threads()) or 1e9)
    _fake_timers(monkeypatch)
    want = 3 if threads != 3 else 2
    try:
        assert enc_bench.main(["--encoders", "gru", "--shapes", "2x3x8", "--json", "--threads", str(want)]) == 0
    finally:
        torch.set_num_threads(threads)
    assert seen and set(seen) == {want}
    assert json.loads(capsys.readouterr().out)["threads"] == want


def test_sgemm_rate_is_two_n_cubed_over_the_best_run(monkeypatch):
    """2 n^3 FLOPs over the best run."""
    ticks = iter([0.0, 3.0, 10.0, 11.0, 20.0, 22.0])  # runs of 3 s, 1 s, 2 s
    monkeypatch.setattr(bench_pkg, "time", types.SimpleNamespace(perf_counter=lambda: next(ticks)))
    assert bench_pkg.sgemm_flops_per_s(size=8, repeats=3) == 2 * 8**3 / 1.0


def test_time_cases_runs_the_cases_round_robin_and_keeps_the_runs_after_warmup(monkeypatch):
    """Each round runs every case once, in turn; both clocks are read around each run, the warm-up dropped."""
    wall, cpu, order = [0.0], [0.0], []
    clock = types.SimpleNamespace(perf_counter=lambda: wall[0], process_time=lambda: cpu[0])
    monkeypatch.setattr(bench_pkg, "time", clock)

    def case(name, seconds):
        def run():
            order.append(name)
            wall[0] += seconds
            cpu[0] += 2 * seconds

        return run

    timings = bench_pkg.time_cases({"a": case("a", 1.0), "b": case("b", 3.0)}, repeats=2, warmup=1)
    assert order == ["a", "b"] * 3
    assert timings["a"] == bench_pkg.Timings(wall=[1.0, 1.0], cpu=[2.0, 2.0]) and timings["b"].median == 3.0


def test_mzu_step_time_is_the_median_of_the_timed_steps_after_warmup(monkeypatch):
    """The median of the timed steps, the warm-up step not timed."""
    ticks = iter([0.0, 10.0, 10.0, 11.0, 20.0, 22.0, 30.0, 36.0])  # warm-up 10 s, then steps of 1, 2, 6 s
    clock = types.SimpleNamespace(perf_counter=lambda: next(ticks), process_time=lambda: 0.0)
    monkeypatch.setattr(bench_pkg, "time", clock)
    lm = mzu_bench._CharLM(build_encoder("gru", mzu_bench.EMBEDDING, hidden_size=4))
    assert mzu_bench._time_training(lm, batch=2, bptt=3, repeats=3) == 2.0


@pytest.fixture
def small_mzu_bench(monkeypatch):
    """bench mzu at toy sizes with injected timings: each step 0.5 s; sgemm 100 then 200 GFLOP/s."""
    monkeypatch.setattr(mzu_bench, "EMBEDDING", 8)
    monkeypatch.setattr(mzu_bench, "HIDDEN", 16)
    # (FILTER stays: main counts with mzu_forward_flops' default filter_size, bound to it at import)
    built = {}
    monkeypatch.setattr(mzu_bench, "_time_training", lambda lm, *a: built.setdefault(len(built), lm) and 0.5)
    rates = iter([100e9, 200e9])
    monkeypatch.setattr(mzu_bench, "sgemm_flops_per_s", lambda *a, **k: next(rates))
    return built


def _forward_backward_flops(lm, batch=2, bptt=3):
    """Matmul FLOPs per char of a forward and backward, from a carried state that needs a gradient
    (so that the first step's recurrent products have their backward too)."""
    chars = torch.randint(mzu_bench.VOCAB, (batch, bptt))
    lm.eval()
    _, state = lm.encoder(lm.embedding(chars))
    state = detach_state(state)
    for t in state if isinstance(state, (tuple, list)) else [state]:
        t.requires_grad_(True)
    with FlopCounterMode(display=False) as counter:
        out, _ = lm.encoder(lm.embedding(chars), state=state)
        lm.decoder(out).sum().backward()
    return counter.get_total_flops() / (batch * bptt)


def test_bench_mzu_flop_count_is_the_models_forward_and_backward_matmuls(small_mzu_bench, capsys):
    """train_flops_per_char = fwd+bwd matmul FLOPs per char of the whole LM (embedding lookups
    free), as torch counts them on the same (toy-sized) models: the backward's 2x, the decoder's
    2*H*V, the DT-GRU's depth and the MZU's composition."""
    assert mzu_bench.main(["--composition", "sat", "--batch", "2", "--bptt", "3", "--json"]) == 0
    rows = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    for row, lm in zip(rows, small_mzu_bench.values(), strict=True):
        assert row["train_flops_per_char"] == _forward_backward_flops(lm), row["model"]


def test_bench_mzu_rates_and_efficiency(small_mzu_bench, capsys):
    """chars/s = batch x bptt per step, sgemm measured around the models, params of the whole LM."""
    assert mzu_bench.main(["--composition", "sat", "--batch", "4", "--bptt", "5", "--json"]) == 0
    rows = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    for row, lm in zip(rows, small_mzu_bench.values(), strict=True):
        assert row["chars_per_s"] == 4 * 5 / 0.5
        assert row["sgemm_gflops"] == [100.0, 200.0]
        assert row["flop_efficiency"] == round(row["train_flops_per_char"] * 40 / 200e9, 3)
        assert row["params"] == sum(p.numel() for p in lm.parameters())


def test_bench_mzu_threads(small_mzu_bench, monkeypatch, capsys):
    """--threads is applied."""
    threads = torch.get_num_threads()
    want = 3 if threads != 3 else 2
    try:
        assert mzu_bench.main(["--composition", "sat", "--threads", str(want), "--json"]) == 0
    finally:
        torch.set_num_threads(threads)
    assert {json.loads(line)["threads"] for line in capsys.readouterr().out.splitlines()} == {want}


@needs_cxx
def test_bench_compiled_step_compares_eager_and_compiled(capsys):
    """One row per encoder, from a cold Inductor cache it sets up and takes down again."""
    import os

    before = os.environ.get("TORCHINDUCTOR_CACHE_DIR")
    args = ["bench", "compiled_step", "--encoders", "gru_ln", "--batch", "2", "--steps", "3", "--rounds", "1"]
    with no_eager_fallback():
        assert main([*args, "--threads", "1"]) == 0
    assert os.environ.get("TORCHINDUCTOR_CACHE_DIR") == before
    (row,) = capsys.readouterr().out.splitlines()
    assert row.startswith("GRU + LN (H 264): forward + backward, median of 1: eager ")
    assert ", 1 graph(s); max |compiled - eager| (dropout off) " in row
    assert float(row.rsplit(" ", 1)[1]) < 1e-3  # the same function (tests/test_recurrent.py bounds it properly)


def test_bench_compiled_step_refuses_an_unknown_encoder(capsys):
    with pytest.raises(SystemExit):
        main(["bench", "compiled_step", "--encoders", "gru_ln,nope"])
    assert "unknown encoder(s) nope; choose from capmzu, dtgru, gru_ln" in capsys.readouterr().err


def test_bench_step_time_times_each_config_under_each_precision(tmp_path, capsys):
    from conftest import write_sentiment_corpus

    data = write_sentiment_corpus(tmp_path / "data", sizes=(24, 4, 4))
    configs = []
    for encoder in ("lstm", "gru"):
        path = tmp_path / f"{encoder}.yaml"
        path.write_text(
            f"name: toy\noutput_dir: {tmp_path / 'runs'}\n"
            f"data: {{name: toy, data_dir: {data}, embedding_dim: 8}}\n"
            f"model: {{encoder: {encoder}, encoder_args: {{hidden_size: 6}}, pooler: mean}}\n"
            "optim: {optimizer: adam, lr: 0.01}\n"
            "train: {epochs: 1, batch_size: 8, seed: 3, progress: false, threads: 1}\n"
        )
        configs.append(str(path))
    per_step = tmp_path / "steps.jsonl"
    args = ["bench", "step_time", *configs, "--steps", "2", "--precisions", "fp32,bf16", "--per-step", str(per_step)]
    assert main(args) == 0
    rows = _rows(capsys)
    assert [(r["config"], r["precision"], r["steps"]) for r in rows] == [
        (c, p, 2) for c in configs for p in ("fp32", "bf16")
    ]
    assert rows[0]["total_vs_first"] == 1.0 and all(r["median_s"] > 0 and r["parameters"] > 0 for r in rows)
    steps = [json.loads(line) for line in per_step.read_text().splitlines()]
    assert len(steps) == 8 and {s["step"] for s in steps} == {0, 1}
