"""Is run B better than run A, or is the difference within the seed spread?

``seqzoo compare RUN_A RUN_B`` reads both runs' ``summary.json`` (the test metrics of every seed
and fold) and, for every metric both have, reports each side's mean ± sample std and Welch's
unequal-variance t-test of the difference of means (Welch 1947): ``t = (m_B − m_A) / √(s_A²/n_A
+ s_B²/n_B)`` with Welch–Satterthwaite degrees of freedom and a two-sided p-value from Student's
t distribution. Each seed is one sample; with 2–3 seeds per side the test has little power, so a
large p says "not shown", not "equal".

The t distribution's tail comes from the regularized incomplete beta function, evaluated by its
continued fraction (modified Lentz), so no SciPy is needed.
"""

from __future__ import annotations

import json
import math
import statistics
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from seqzoo._warn import warn_user
from seqzoo.config import ConfigError, load_config
from seqzoo.data.errors import DataError

__all__ = [
    "compare_runs",
    "finite_or_none",
    "format_comparison",
    "mean_std",
    "per_seed",
    "student_t_two_sided_p",
    "summarize",
    "welch_t_test",
]

_TINY = 1e-300


def _incomplete_beta_fraction(a: float, b: float, x: float) -> float:
    """Continued fraction of I_x(a, b), converging for x < (a + 1) / (a + b + 2)."""
    c, d = 1.0, 1.0 - (a + b) * x / (a + 1)
    d = 1.0 / (d if abs(d) > _TINY else _TINY)
    result = d
    for m in range(1, 300):
        even = m * (b - m) * x / ((a + 2 * m - 1) * (a + 2 * m))
        odd = -(a + m) * (a + b + m) * x / ((a + 2 * m) * (a + 2 * m + 1))
        for numerator in (even, odd):
            d = 1.0 + numerator * d
            d = 1.0 / (d if abs(d) > _TINY else _TINY)
            c = 1.0 + numerator / c
            c = c if abs(c) > _TINY else _TINY
            result *= c * d
        if abs(c * d - 1.0) < 1e-15:
            break
    return result


def _regularized_incomplete_beta(a: float, b: float, x: float) -> float:
    """I_x(a, b) for a, b > 0 and 0 <= x <= 1."""
    if x <= 0.0 or x >= 1.0:
        return 0.0 if x <= 0.0 else 1.0
    log_front = math.lgamma(a + b) - math.lgamma(a) - math.lgamma(b) + a * math.log(x) + b * math.log1p(-x)
    if x < (a + 1) / (a + b + 2):
        return math.exp(log_front) * _incomplete_beta_fraction(a, b, x) / a
    return 1.0 - math.exp(log_front) * _incomplete_beta_fraction(b, a, 1.0 - x) / b


def student_t_two_sided_p(t: float, df: float) -> float:
    """P(|T| >= |t|) for Student's t with ``df`` > 0 degrees of freedom (real-valued df allowed)."""
    if df <= 0:
        raise ValueError(f"df must be > 0, got {df}")
    return _regularized_incomplete_beta(df / 2, 0.5, df / (df + t * t))


def welch_t_test(a: list[float], b: list[float]) -> dict[str, float | None] | None:
    """Welch's t-test of mean(b) − mean(a): ``diff``, ``t``, ``df``, ``p`` (two-sided).

    None when a side has fewer than 2 values (no spread to test against). When both sides have
    no spread at all, ``p`` is 1 for equal means and 0 otherwise, and ``df`` (and ``t`` for
    different means) is None: infinite, so that the record stays valid JSON. So is any other
    value that is not finite (a NaN metric).
    """
    if len(a) < 2 or len(b) < 2:
        return None
    (mean_a, std_a), (mean_b, std_b) = mean_std(a), mean_std(b)
    var_a, var_b = std_a**2 / len(a), std_b**2 / len(b)
    diff = mean_b - mean_a
    if var_a + var_b == 0:
        t = math.copysign(math.inf, diff) if diff else 0.0
        test = {"diff": diff, "t": t, "df": math.inf, "p": float(diff == 0)}
    else:
        t = diff / math.sqrt(var_a + var_b)
        df = (var_a + var_b) ** 2 / (var_a**2 / (len(a) - 1) + var_b**2 / (len(b) - 1))
        test = {"diff": diff, "t": t, "df": df, "p": student_t_two_sided_p(t, df)}
    return finite_or_none(test)


def finite_or_none(value: Any) -> Any:
    """``value`` (a number, or dicts and lists of them) with every non-finite float as None: valid JSON."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {key: finite_or_none(v) for key, v in value.items()}
    return [finite_or_none(v) for v in value] if isinstance(value, list) else value


def _test_metrics(run_dir: Path) -> dict[str, list[float]]:
    path = run_dir / "summary.json"
    if not path.exists():
        raise FileNotFoundError(f"{run_dir}: no summary.json (not a finished `seqzoo train` run)")
    try:
        runs = json.loads(path.read_text(encoding="utf-8"))["runs"]
    except (json.JSONDecodeError, KeyError, TypeError) as err:
        raise DataError(f"not a seqzoo summary ({err})", path) from None
    metrics: dict[str, list[float]] = {}
    for record in per_seed(runs).values():  # one value per seed: the folds of a seed are averaged
        for key, value in record.items():
            if isinstance(value, (int, float)) and key not in ("test_tokens", "test_examples"):  # counts, not metrics
                metrics.setdefault(key, []).append(float(value))
    return metrics


def _setting(run_dir: Path) -> dict[str, Any] | None:
    """What a run was trained and tested on, from its ``config.yaml`` (None without one)."""
    path = run_dir / "config.yaml"
    if not path.exists():
        return None
    config = load_config(path, resolved=True)
    data = config.data
    where = getattr(data, "data_dir", None) or getattr(data, "test", None)  # ABSA: its test file
    return {
        "task": config.task,
        "data": getattr(data, "name", None) or (Path(where).name if where else None),
        "level": getattr(data, "level", None),
        "subset": getattr(data, "subset", None),  # ABSA: all test sentences (ds) or the hard ones (hds)
    }


def compare_runs(run_a: str | Path, run_b: str | Path) -> list[dict[str, Any]]:
    """One record per test metric the two runs share: each side's values, mean, std, and the test.

    Runs of different tasks are refused (``ConfigError``); runs tested on differently named data
    are compared with a warning.
    """
    a, b = _test_metrics(Path(run_a)), _test_metrics(Path(run_b))
    setting_a, setting_b = _setting(Path(run_a)), _setting(Path(run_b))
    if setting_a and setting_b and setting_a != setting_b:
        what = ", ".join(
            f"{key} {setting_a[key]!r} vs {setting_b[key]!r}" for key in setting_a if setting_a[key] != setting_b[key]
        )
        if setting_a["task"] != setting_b["task"]:
            raise ConfigError(f"{run_a} and {run_b} are not comparable: {what}")
        warn_user(f"{run_a} and {run_b} were tested on different data ({what})")
    records = []
    for key in sorted(a.keys() & b.keys()):
        (mean_a, std_a), (mean_b, std_b) = mean_std(a[key]), mean_std(b[key])
        record: dict[str, Any] = {"metric": key, "a": a[key], "b": b[key]}
        record.update(mean_a=mean_a, std_a=std_a, mean_b=mean_b, std_b=std_b, welch=welch_t_test(a[key], b[key]))
        records.append(record)
    return records


def format_comparison(records: list[dict[str, Any]]) -> list[str]:
    """One line per metric: ``A mean ± std (n) vs B mean ± std (n), B − A, t, df, p``."""
    lines = []
    for r in records:
        scale = 100.0 if "accuracy" in r["metric"] else 1.0
        side_a, side_b = (
            _side(name, r[f"mean_{key}"], r[f"std_{key}"], len(r[key]), scale) for name, key in (("A", "a"), ("B", "b"))
        )
        line = f"{r['metric']}: {side_a} vs {side_b}, B − A {(r['mean_b'] - r['mean_a']) * scale:+.3f}"
        test = r["welch"]
        if test is None:
            line += "; no test (a side has one seed)"
        else:
            t, df, p = (_number(test[key], spec) for key, spec in (("t", ".2f"), ("df", ".1f"), ("p", ".3g")))
            line += f"; Welch t = {t}, df = {df}, p = {p}"
        lines.append(line)
    return lines


def _side(name: str, mean: float, std: float, n: int, scale: float) -> str:
    """``A mean ± std (n)``; a single seed has no spread to show."""
    spread = f" ± {std * scale:.3f}" if n > 1 else ""
    return f"{name} {mean * scale:.3f}{spread} (n={n})"


def _number(value: float | None, spec: str) -> str:
    """``value`` in format ``spec``; "n/a" for None (not finite, e.g. df when neither side has spread)."""
    return "n/a" if value is None else format(value, spec)


def mean_std(values: Sequence[float]) -> tuple[float, float]:
    """Mean and sample standard deviation (NaN for a single value: it has none), summed exactly
    (``statistics`` works in rationals): equal values give exactly that value and 0, as Welch's test
    needs (a float sum left 0.7 × 3 a spread of 1e-16, which gave p = 0.29 for two equal runs).
    With a value that is not finite, the float formulas (an inf or NaN mean, NaN spread)."""
    values = [float(v) for v in values]
    if len(values) < 2 or not all(map(math.isfinite, values)):
        return sum(values) / len(values), math.nan
    return statistics.mean(values), statistics.stdev(values)


def per_seed(results: dict[str, dict[str, float]]) -> dict[str, dict[str, float]]:
    """Sub-run metrics (keyed by sub-run: ``.``, ``seed-N``, ``fold-K`` or ``seed-N/fold-K``) averaged
    over the folds of each seed: the folds of one seed share its data and are no independent samples."""
    groups: dict[str, list[dict[str, float]]] = {}
    for name, metrics in results.items():
        first = Path(name).parts[0] if Path(name).parts else "."
        groups.setdefault(first if first.startswith("seed-") else ".", []).append(metrics)
    means: dict[str, dict[str, float]] = {}
    for seed, runs in groups.items():
        values: dict[str, list[float]] = {}
        for metrics in runs:  # numbers only (a hand-edited summary may hold others), over the runs that have them
            for key, value in metrics.items():
                if isinstance(value, (int, float)) and not isinstance(value, bool):
                    values.setdefault(key, []).append(value)
        means[seed] = {key: v[0] if len(v) == 1 else sum(v) / len(v) for key, v in values.items()}
    return means


def summarize(results: dict[str, dict[str, float]]) -> dict[str, Any]:
    """Mean ± sample std of each test metric over the seeds (each seed's folds averaged first,
    :func:`per_seed`; the std of a single seed is None); ``runs`` keeps every sub-run's metrics."""
    seeds = per_seed(results)
    keys = sorted({k for r in seeds.values() for k in r})
    stats = {}
    for key in keys:
        values = [r[key] for r in seeds.values() if key in r]
        mean, std = mean_std(values)
        stats[key] = {"mean": mean, "std": std if len(values) > 1 else None, "n": len(values)}  # None: JSON null
    return {"runs": results, "metrics": stats}
