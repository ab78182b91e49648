import json
import math
import warnings

import pytest

from seqzoo.cli import main
from seqzoo.data.io import write_json
from seqzoo.training.stats import compare_runs, mean_std, student_t_two_sided_p, summarize, welch_t_test


@pytest.mark.parametrize("t", [0.0, 0.3, 1.0, 2.5, 40.0])
def test_t_tail_matches_closed_forms(t):
    # df = 1 is the Cauchy distribution, df = 2 has a closed-form CDF
    assert student_t_two_sided_p(t, 1) == pytest.approx(1 - 2 / math.pi * math.atan(t), abs=1e-13)
    assert student_t_two_sided_p(-t, 2) == pytest.approx(1 - t / math.sqrt(t * t + 2), abs=1e-13)


@pytest.mark.parametrize(("t", "df"), [(12.706205, 1), (2.228139, 10), (2.042272, 30), (1.959964, 1e7)])
def test_t_tail_at_tabulated_two_sided_five_percent_points(t, df):
    assert student_t_two_sided_p(t, df) == pytest.approx(0.05, abs=2e-7)


def test_t_tail_rejects_nonpositive_df():
    with pytest.raises(ValueError, match="df must be > 0"):
        student_t_two_sided_p(1.0, 0)


def test_welch_equals_student_for_equal_sizes_and_spreads():
    a, b = [1.0, 2.0, 3.0], [2.5, 3.5, 4.5]  # both std 1, n 3: t = 1.5 / sqrt(2/3), df = 4
    test = welch_t_test(a, b)
    assert test["diff"] == pytest.approx(1.5)
    assert test["t"] == pytest.approx(1.5 / math.sqrt(2 / 3))
    assert test["df"] == pytest.approx(4.0)
    assert test["p"] == pytest.approx(student_t_two_sided_p(1.5 / math.sqrt(2 / 3), 4))


def test_welch_degrees_of_freedom_follow_the_spreads():
    a, b = [0.0, 2.0], [0.0, 0.0, 0.0, 1.0]  # s_a² / n_a = 1, s_b² / n_b = 1/16
    test = welch_t_test(a, b)
    expected_df = (1 + 1 / 16) ** 2 / (1 / 1 + (1 / 16) ** 2 / 3)
    assert test["df"] == pytest.approx(expected_df)
    assert test["t"] == pytest.approx((0.25 - 1.0) / math.sqrt(1 + 1 / 16))


def test_welch_needs_two_values_a_side_and_handles_no_spread():
    assert welch_t_test([1.0], [1.0, 2.0]) is None
    assert welch_t_test([1.0, 1.0], [1.0, 1.0])["p"] == 1.0
    assert welch_t_test([1.0, 1.0], [2.0, 2.0])["p"] == 0.0


def _run(tmp_path, name, accuracies, losses):
    run_dir = tmp_path / name
    runs = {
        f"seed-{i + 1}": {"test_accuracy": acc, "test_loss": loss, "test_tokens": 4957}  # a count: not compared
        for i, (acc, loss) in enumerate(zip(accuracies, losses, strict=True))
    }
    run_dir.mkdir()
    write_json(run_dir / "summary.json", summarize(runs))
    return run_dir


def test_equal_values_have_no_spread_so_equal_runs_are_not_told_apart():
    """0.7 × 3 summed in floats left a spread of 1e-16 and a mean of 0.6999999999999998: two runs
    whose seeds all scored 0.7 then got p = 0.29, and 0.7 against 0.8 a finite t of 9e14."""
    assert mean_std([0.7] * 3) == (0.7, 0.0)
    assert welch_t_test([0.7] * 3, [0.7] * 5) == {"diff": 0.0, "t": 0.0, "df": None, "p": 1.0}
    assert welch_t_test([0.7] * 3, [0.8] * 3)["t"] is None
    mean, std = mean_std([90.52, 90.03, 90.84])
    assert mean == pytest.approx(90.46333333333334, abs=1e-12) and std == pytest.approx(0.40796241656963, abs=1e-12)
    assert mean_std([math.inf, 1.0])[0] == math.inf and math.isnan(mean_std([math.inf, 1.0])[1])
    assert mean_std([0.7])[0] == 0.7 and math.isnan(mean_std([0.7])[1])  # one value has no sample std


def test_compare_command_reports_both_runs_and_the_test(tmp_path, capsys):
    a = _run(tmp_path, "qrnn", [0.9052, 0.9000, 0.9085], [0.25, 0.26, 0.24])
    b = _run(tmp_path, "lstm", [0.9080, 0.9095, 0.9095], [0.24, 0.24, 0.25])
    assert main(["compare", str(a), str(b)]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].startswith("test_accuracy: A 90.457 ± 0.429 (n=3) vs B 90.900 ± 0.087 (n=3), B − A +0.443")
    assert "Welch t = 1.76, df = 2.2, p = 0.212" in lines[0] and lines[1].startswith("test_loss:")
    assert main(["compare", str(a), str(b), "--json"]) == 0
    records = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert [r["metric"] for r in records] == ["test_accuracy", "test_loss"]
    assert records[0]["a"] == [0.9052, 0.9, 0.9085]
    assert records[0]["welch"]["p"] == pytest.approx(compare_runs(a, b)[0]["welch"]["p"])
    assert 0.1 < records[0]["welch"]["p"] < 0.3


def test_no_spread_on_either_side_is_valid_json_and_prints_n_a(tmp_path, capsys):
    a = _run(tmp_path, "a", [0.90, 0.91], [0.3, 0.3])
    b = _run(tmp_path, "b", [0.92, 0.93], [0.2, 0.2])  # test_loss: std 0 on both sides, means differ
    assert main(["compare", str(a), str(b), "--json"]) == 0
    out = capsys.readouterr().out
    records = [json.loads(line, parse_constant=pytest.fail) for line in out.splitlines()]  # no Infinity/NaN
    assert records[1]["welch"] == {"diff": pytest.approx(-0.1), "t": None, "df": None, "p": 0.0}
    assert welch_t_test([1.0, 1.0], [1.0, 1.0]) == {"diff": 0.0, "t": 0.0, "df": None, "p": 1.0}
    assert main(["compare", str(a), str(b)]) == 0
    assert "; Welch t = n/a, df = n/a, p = 0\n" in capsys.readouterr().out
    c = _run(tmp_path, "c", [0.90, 0.91], [0.3, math.inf])  # an overflowed loss
    assert main(["compare", str(a), str(c), "--json"]) == 0
    records = [json.loads(line, parse_constant=pytest.fail) for line in capsys.readouterr().out.splitlines()]
    assert records[1]["b"] == [0.3, None] and records[1]["mean_b"] is None


def test_compare_errors_name_the_run(tmp_path, capsys):
    a = _run(tmp_path, "a", [0.9], [0.3])
    assert main(["compare", str(a), str(tmp_path / "missing")]) == 2
    assert "missing: no summary.json" in capsys.readouterr().err
    single = _run(tmp_path, "b", [0.8], [0.4])
    assert main(["compare", str(a), str(single)]) == 0
    out = capsys.readouterr().out
    assert "no test (a side has one seed)" in out
    assert "A 90.000 (n=1) vs B 80.000 (n=1)" in out  # one seed has no spread: no "± 0.000"
    assert main(["compare", str(a), str(single), "--json"]) == 0
    assert json.loads(capsys.readouterr().out.splitlines()[0])["std_a"] is None
    (tmp_path / "bad").mkdir()
    (tmp_path / "bad" / "summary.json").write_text("{}")
    assert main(["compare", str(a), str(tmp_path / "bad")]) == 2
    assert "summary.json: not a seqzoo summary" in capsys.readouterr().err


def test_runs_of_other_tasks_are_refused_and_other_data_is_named(tmp_path, capsys):
    a = _run(tmp_path, "a", [0.90, 0.91], [0.3, 0.3])
    b = _run(tmp_path, "b", [0.92, 0.93], [0.2, 0.2])
    (a / "config.yaml").write_text("task: classification\ndata: {name: mr, data_dir: /d/mtl}\n")
    (b / "config.yaml").write_text("task: lm\ndata: {data_dir: /d/lm/brown_word, level: word}\n")
    assert main(["compare", str(a), str(b)]) == 2
    message = "are not comparable: task 'classification' vs 'lm', data 'mr' vs 'brown_word', level None vs 'word'"
    assert message in capsys.readouterr().err
    (b / "config.yaml").write_text("task: classification\ndata: {name: imdb, data_dir: /d/mtl}\n")
    with pytest.warns(UserWarning, match="were tested on different data \\(data 'mr' vs 'imdb'\\)"):
        assert main(["compare", str(a), str(b)]) == 0
    (b / "config.yaml").write_text("task: classification\ndata: {name: mr, data_dir: /moved/mtl}\n")
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # the same data elsewhere is the same data
        assert main(["compare", str(a), str(b)]) == 0


def test_absa_runs_are_compared_by_their_test_file_and_subset(tmp_path, capsys):
    """ABSA's data config has no data_dir (compare raised AttributeError); its example count is no metric."""
    a = _run(tmp_path, "a", [0.80, 0.81], [0.5, 0.5])
    b = _run(tmp_path, "b", [0.82, 0.83], [0.4, 0.4])
    for run_dir, subset in ((a, "ds"), (b, "ds")):
        (run_dir / "config.yaml").write_text(
            f"task: absa\ndata: {{train: /x/R_Train.xml, test: /x/R_Test.xml, subset: {subset}}}\n"
        )
        summary = json.loads((run_dir / "summary.json").read_text())
        for record in summary["runs"].values():
            record["test_examples"] = 1120
        write_json(run_dir / "summary.json", summary)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert main(["compare", str(a), str(b), "--json"]) == 0
    assert [json.loads(line)["metric"] for line in capsys.readouterr().out.splitlines()] == [
        "test_accuracy",
        "test_loss",
    ]
    (b / "config.yaml").write_text("task: absa\ndata: {train: /x/R_Train.xml, test: /x/R_Test.xml, subset: hds}\n")
    with pytest.warns(UserWarning, match="different data \\(subset 'ds' vs 'hds'\\)"):
        assert main(["compare", str(a), str(b)]) == 0


def test_compare_treats_seeds_not_folds_as_samples(tmp_path):
    """Folds of one seed are averaged before Welch's test (README: folds are no independent samples)."""
    for name, base in (("a", 0.70), ("b", 0.80)):
        runs = {f"seed-{s}/fold-{k}": {"test_accuracy": base + 0.01 * s + 0.001 * k} for s in (1, 2) for k in (1, 2)}
        (tmp_path / name).mkdir()
        (tmp_path / name / "summary.json").write_text(json.dumps({"runs": runs}))
    (record,) = compare_runs(tmp_path / "a", tmp_path / "b")
    assert record["a"] == pytest.approx([0.7115, 0.7215])  # one value per seed
    assert record["b"] == pytest.approx([0.8115, 0.8215])
