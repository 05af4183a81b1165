"""The sweep fit TTFT p50 = a + b x (1 - hit rate), and the sweep summary file written and read back."""

import numpy as np
import pytest

from kvbench.errors import InputError
from kvbench.results.parquet import read_metadata, write_rows
from kvbench.results.rows import rows_from_dicts
from kvbench.results.schema import RUN_SCHEMA, empty_row
from kvbench.results.summary import summarize
from kvbench.results.sweep import (
    Fit,
    SweepPoint,
    build_sweep_summary,
    fit_ttft_vs_miss_rate,
    read_sweep_summary,
    write_sweep_summary,
)

A_MS, B_MS = 80.0, 1200.0  # warm floor and full-prefill cost of the synthetic engine
PROMPT_TOKENS, BLOCK_SIZE = 2048, 16


def synthetic_run_rows(hit_rate, num_requests=40, noise_ms=0.0, seed=0):
    """Rows of a run whose every request hits ``hit_rate`` of its prompt and has TTFT = a + b x miss."""
    rng = np.random.default_rng(seed)
    cached = round(hit_rate * PROMPT_TOKENS)
    rows = []
    for index in range(num_requests):
        row = empty_row()
        ttft = A_MS + B_MS * (1 - cached / PROMPT_TOKENS) + rng.normal(0, noise_ms)
        row.update(
            request_index=index,
            request_id=f"r{index}",
            phase="measure",
            status="ok",
            turn=0,
            prompt_tokens=PROMPT_TOKENS,
            cached_prompt_tokens=cached,
            output_tokens=1,
            ttft_ms=ttft,
            e2e_ms=ttft,
        )
        rows.append(row)
    return rows


def test_fit_recovers_a_and_b_from_exact_points():
    hits = [0.0, 0.25, 0.5, 0.9]
    fit = fit_ttft_vs_miss_rate(hits, [A_MS + B_MS * (1 - h) for h in hits])
    assert fit.a_ms == pytest.approx(A_MS) and fit.b_ms == pytest.approx(B_MS)
    assert fit.r_squared == pytest.approx(1.0) and fit.num_points == 4
    assert fit.predict_ms(0.0) == pytest.approx(A_MS + B_MS) and fit.predict_ms(1.0) == pytest.approx(A_MS)


def test_fit_recovers_a_and_b_from_synthetic_sweep_runs(tmp_path):
    """One synthetic run per cache size -> summarize -> sweep points -> fit: a and b come back."""
    points = []
    for capacity, hit_rate in ((64, 0.05), (128, 0.2), (256, 0.45), (512, 0.75), (1024, 0.95)):
        rows = synthetic_run_rows(hit_rate, noise_ms=4.0, seed=capacity)
        path = write_rows(tmp_path / f"run-{capacity}.parquet", rows, {"command": "run"}, schema=RUN_SCHEMA)
        points.append(SweepPoint.from_summary(capacity, summarize(rows_from_dicts(rows)), path))
    fit = build_sweep_summary(points[::-1]).fit
    assert fit.a_ms == pytest.approx(A_MS, abs=10) and fit.b_ms == pytest.approx(B_MS, rel=0.02)
    assert fit.r_squared > 0.999


def test_flat_ttft_fits_a_flat_line_with_r_squared_one():
    fit = fit_ttft_vs_miss_rate([0.1, 0.5, 0.9], [100.0, 100.0, 100.0])
    assert fit.b_ms == pytest.approx(0.0, abs=1e-9) and fit.a_ms == pytest.approx(100.0)
    assert fit.r_squared == 1.0


@pytest.mark.parametrize(
    "hits, ttft, problem",
    [
        ([0.5], [100.0], "at least 2 points"),
        ([0.5, 0.5], [100.0, 120.0], "distinct hit rates"),
        ([0.1, 0.5], [100.0], "2 hit rates but 1"),
        ([0.1, 1.5], [100.0, 120.0], r"\[0, 1\]"),
        ([0.1, None], [100.0, 120.0], "no None"),
        ([0.1, 0.2], [100.0, float("nan")], "finite"),
    ],
)
def test_fit_rejects_unusable_input(hits, ttft, problem):
    with pytest.raises(ValueError, match=problem):
        fit_ttft_vs_miss_rate(hits, ttft)


def test_points_and_fits_validate_their_fields():
    with pytest.raises(ValueError, match="capacity_blocks"):
        SweepPoint(0, 0.5, 100.0, "x.parquet")
    with pytest.raises(ValueError, match="token_hit_rate"):
        SweepPoint(64, 1.2, 100.0, "x.parquet")
    with pytest.raises(ValueError, match="p50_ttft_ms"):
        SweepPoint(64, 0.5, -1.0, "x.parquet")
    with pytest.raises(ValueError, match="at least 2 points"):
        Fit(1.0, 2.0, 0.9, num_points=1)


def test_summary_sorts_points_and_fits_only_measured_ones():
    points = [
        SweepPoint(256, 0.6, A_MS + B_MS * 0.4, "c.parquet"),
        SweepPoint(64, None, None, "a.parquet", num_requests=10, num_errors=10),
        SweepPoint(128, 0.2, A_MS + B_MS * 0.8, "b.parquet"),
    ]
    summary = build_sweep_summary(points, {"scenario": "shared_2k"})
    assert [p.capacity_blocks for p in summary.points] == [64, 128, 256]
    assert summary.fit.num_points == 2 and summary.fit.a_ms == pytest.approx(A_MS)
    assert summary.name == "shared_2k"
    assert build_sweep_summary(points[:2]).fit is None  # one measured point: no line


def test_summary_file_round_trips(tmp_path):
    points = [
        SweepPoint(c, h, A_MS + B_MS * (1 - h), f"run-{c}.parquet", p90_ttft_ms=None, num_requests=50)
        for c, h in ((64, 0.1), (128, 0.4), (512, 0.9))
    ]
    summary = build_sweep_summary(points, {"scenario": "shared_2k", "cache": {"block_size": BLOCK_SIZE}})
    path = write_sweep_summary(tmp_path / "sweep.parquet", summary)
    metadata = read_metadata(path)
    assert metadata["command"] == "sweep" and metadata["complete"] is True
    assert metadata["fit"]["a_ms"] == pytest.approx(A_MS) and metadata["sweep"]["scenario"] == "shared_2k"
    assert read_sweep_summary(path) == summary


def test_reading_a_run_file_as_a_sweep_is_an_input_error(tmp_path):
    path = write_rows(
        tmp_path / "run.parquet", synthetic_run_rows(0.5, 2), {"command": "run"}, schema=RUN_SCHEMA
    )
    with pytest.raises(InputError, match="not a sweep summary"):
        read_sweep_summary(path)


def test_a_fit_from_two_points_or_with_a_negative_slope_is_not_a_finding():
    two = fit_ttft_vs_miss_rate([0.2, 0.8], [900.0, 300.0])
    assert two.r_squared == pytest.approx(1.0) and "only 2 points" in two.caveat
    assert two.describe().startswith("not meaningful: ")
    # a loaded 2-core machine: identical warm requests from 54 to 1,460 ms; TTFT fell as the miss rate rose
    noisy = fit_ttft_vs_miss_rate([0.1, 0.4, 0.6, 0.9], [300.0, 1400.0, 200.0, 900.0])
    assert noisy.b_ms < 0 and "slope is negative" in noisy.caveat and "not meaningful" in noisy.describe()
    good = fit_ttft_vs_miss_rate([0.1, 0.5, 0.9], [A_MS + B_MS * 0.9, A_MS + B_MS * 0.5, A_MS + B_MS * 0.1])
    assert good.caveat is None and not good.describe().startswith("not meaningful")
