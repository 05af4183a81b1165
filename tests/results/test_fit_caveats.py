"""Fits that cannot be true: labelled with the reason, with 95% intervals, wherever
shown."""

import math
from types import SimpleNamespace

import numpy as np
import pytest
from rich.console import Console

from kvbench.results.ols import ols_line, t_quantile_975
from kvbench.results.parquet import read_metadata
from kvbench.results.sweep import (
    Fit,
    SweepPoint,
    build_sweep_summary,
    fit_ttft_vs_miss_rate,
    write_sweep_summary,
)

# A sweep on a loaded machine (multi_prefix_zipf, --cache-sizes 128,512,1024 --requests 60) printed
# TTFT p50 = -1,298.7 ms + 6,056.6 ms x (1 - hit rate). These three points have exactly that line:
# their residuals (100, -220, 120) sum to 0 and are orthogonal to the miss rates (0.8, 0.5, 0.25).
ISSUE_A_MS, ISSUE_B_MS = -1298.7, 6056.6
ISSUE_HITS = (0.2, 0.5, 0.75)
ISSUE_TTFT_MS = tuple(
    ISSUE_A_MS + ISSUE_B_MS * (1 - h) + e for h, e in zip(ISSUE_HITS, (100.0, -220.0, 120.0))
)


def test_the_issues_line_is_labelled_with_where_it_goes_negative():
    fit = fit_ttft_vs_miss_rate(ISSUE_HITS, ISSUE_TTFT_MS)
    assert fit.a_ms == pytest.approx(ISSUE_A_MS) and fit.b_ms == pytest.approx(ISSUE_B_MS)
    # 0 ms at hit rate 0.786
    assert fit.predict_ms(1.0 + ISSUE_A_MS / ISSUE_B_MS) == pytest.approx(0.0, abs=1e-6)
    [reason] = fit.caveats
    assert reason.startswith(
        "the line gives a negative TTFT (-1,298.7 ms at hit rate 1, 0 ms at hit rate 0.79)"
    )
    text = fit.describe()
    assert (
        text.startswith("not meaningful: TTFT p50 = -1,298.7 ms + 6,056.6 ms x (1 - hit rate)")
        and reason in text
    )


def test_the_interval_is_t_times_the_ols_standard_errors():
    fit = fit_ttft_vs_miss_rate(ISSUE_HITS, ISSUE_TTFT_MS)
    miss = 1 - np.asarray(ISSUE_HITS)
    design = np.column_stack([np.ones(3), miss])  # (points, [intercept, slope])
    coefficients, residual, _, _ = np.linalg.lstsq(design, np.asarray(ISSUE_TTFT_MS), rcond=None)
    covariance = residual[0] / (3 - 2) * np.linalg.inv(design.T @ design)
    a_se, b_se = np.sqrt(np.diag(covariance))
    assert (fit.a_se_ms, fit.b_se_ms) == (pytest.approx(a_se), pytest.approx(b_se))
    assert fit.a_ci_ms == pytest.approx((coefficients[0] - 12.706 * a_se, coefficients[0] + 12.706 * a_se))
    assert fit.b_ci_ms == pytest.approx((coefficients[1] - 12.706 * b_se, coefficients[1] + 12.706 * b_se))
    assert f"95% CI a [{fit.a_ci_ms[0]:,.1f}, {fit.a_ci_ms[1]:,.1f}] ms" in fit.describe()


def _t_cdf(t: float, df: int) -> float:
    """Student's t CDF by integrating its density (trapezoids on a fine grid), for checking the table."""
    grid = np.linspace(0.0, t, 200_001)
    log_norm = math.lgamma((df + 1) / 2) - math.lgamma(df / 2) - 0.5 * math.log(df * math.pi)
    density = np.exp(log_norm - (df + 1) / 2 * np.log1p(grid**2 / df))
    return 0.5 + float(((density[1:] + density[:-1]) / 2 * np.diff(grid)).sum())


@pytest.mark.parametrize("df", [1, 2, 3, 7, 30, 31, 45, 120])
def test_the_t_quantile_is_the_975th_percentile(df):
    assert _t_cdf(t_quantile_975(df), df) == pytest.approx(0.975, abs=2e-5)


@pytest.mark.parametrize(
    ("hits", "ttft_ms", "expected"),
    [
        ((0.2, 0.8), (900.0, 300.0), ["only 2 points"]),  # no degrees of freedom left: no interval either
        ((0.1, 0.5, 0.9), (200.0, 500.0, 900.0), ["slope is negative"]),
        (
            (0.1, 0.5, 0.9),
            (-50.0, -40.0, -45.0),
            ["slope is negative", "negative TTFT (-48.1 ms at hit rate 0):"],
        ),
        # negative at full prefill
        (
            (0.0, 0.5, 1.0),
            (-10.0, 400.0, 810.0),
            ["slope is negative", "at hit rate 0"],
        ),
        ((0.0, 0.5, 1.0), (1200.0, 620.0, 40.0), []),  # a line that can be true
    ],
)
def test_every_reason_is_named(hits, ttft_ms, expected):
    fit = fit_ttft_vs_miss_rate(hits, ttft_ms)
    assert len(fit.caveats) == len(expected)
    for reason, part in zip(fit.caveats, expected):
        assert part in reason
    assert (fit.a_ci_ms is None) == (len(hits) < 3)
    assert fit.describe().startswith("not meaningful") == bool(expected)


def test_the_stored_fit_carries_its_reasons_and_intervals_and_reads_back(tmp_path):
    points = [
        SweepPoint(size, hit, ttft, f"run-{size}.parquet")
        for size, hit, ttft in zip((128, 512, 1024), ISSUE_HITS, ISSUE_TTFT_MS)
    ]
    summary = build_sweep_summary(points, {"scenario": "multi_prefix_zipf"})
    path = write_sweep_summary(tmp_path / "sweep.parquet", summary)
    stored = read_metadata(path)["fit"]
    assert stored["caveats"] == summary.fit.caveats and len(stored["caveats"]) == 1
    assert stored["a_ci_ms"] == list(summary.fit.a_ci_ms) and stored["interval"].startswith("95%")
    assert Fit.from_dict(stored) == summary.fit
    # older files
    assert Fit.from_dict({"a_ms": 1.0, "b_ms": 2.0, "r_squared": 0.9, "num_points": 3}).a_ci_ms is None


def test_the_sweep_command_and_the_report_print_the_label(tmp_path, kvbench):
    from kvbench.commands.sweep import _print

    points = [
        SweepPoint(size, hit, ttft, f"run-{size}.parquet", num_requests=60)
        for size, hit, ttft in zip((128, 512, 1024), ISSUE_HITS, ISSUE_TTFT_MS)
    ]
    summary = build_sweep_summary(points, {"scenario": "multi_prefix_zipf"})
    console = Console(record=True, width=200)
    _print(
        console,
        SimpleNamespace(
            name="multi_prefix_zipf",
            points=points,
            first_errors={},
            summary=summary,
            path=tmp_path / "sweep.parquet",
        ),
    )
    printed = " ".join(console.export_text().split())
    assert "not meaningful: TTFT p50 = -1,298.7 ms" in printed and "0 ms at hit rate 0.79" in printed
    path = write_sweep_summary(tmp_path / "sweep.parquet", summary)
    code, out, err = kvbench("report", path, "--out", tmp_path / "page")
    assert code == 0, err
    assert "not meaningful" in out and "negative TTFT" in " ".join(out.split())


def test_ols_line_refuses_a_line_it_cannot_draw():
    with pytest.raises(ValueError, match="2 distinct x"):
        ols_line([0.5, 0.5, 0.5], [1.0, 2.0, 3.0])
