"""``load_sweep.parquet`` through the one report path: read back, its table, its PNGs on the page."""

import pytest

from kvbench.results.files import load_result
from kvbench.results.load_sweep import LoadRun, load_points, write_load_sweep
from kvbench.results.load_sweep_report import read_points
from kvbench.results.report import build_report, summary_tables

RUNS = [
    LoadRun(
        1.0,
        0,
        {
            "request_throughput": 0.5,
            "output_throughput": 4.0,
            "median_ttft_ms": 100.0,
            "p99_ttft_ms": 180.0,
            "request_goodput": 0.25,
            "failed": 0.0,
        },
        "run-c1-1.parquet",
    ),
    LoadRun(
        1.0,
        1,
        {
            "request_throughput": 0.7,
            "output_throughput": 5.6,
            "median_ttft_ms": 140.0,
            "p99_ttft_ms": 220.0,
            "request_goodput": 0.35,
            "failed": 0.0,
        },
        "run-c1-2.parquet",
    ),
    LoadRun(
        4.0,
        0,
        {
            "request_throughput": 0.9,
            "output_throughput": 7.2,
            "median_ttft_ms": 900.0,
            "p99_ttft_ms": 1500.0,
            "request_goodput": 0.0,
            "failed": 1.0,
        },
        "run-c4-1.parquet",
    ),
]


@pytest.fixture
def sweep_file(tmp_path):
    points = load_points(RUNS)
    return write_load_sweep(
        tmp_path / "load_sweep.parquet",
        "concurrency",
        RUNS,
        points,
        {"source": "scenarios/chat.toml", "num_runs": 2},
        complete=False,
    )


def test_the_points_read_back_as_written(sweep_file):
    result = load_result(sweep_file)
    assert result.kind == "load-sweep" and result.scenario == "chat"
    assert [(r["value"], r["repeat"]) for r in result.table_rows] == [(1.0, 0), (1.0, 1), (4.0, 0)]
    assert read_points(result.metadata) == load_points(RUNS)  # intervals back as tuples, means exact


def test_its_table_and_pngs_are_on_the_report(sweep_file, tmp_path):
    result = load_result(sweep_file)
    (table,) = summary_tables([result])
    assert table.title == "kvbench sweep: chat (concurrency), interrupted: finished runs only"
    assert table.columns[:4] == ("clients", "runs", "req/s", "output tok/s")
    one, four = table.rows
    assert one[:2] == ("1", "2") and one[2].startswith("0.600 [0.5")  # mean of 0.5 and 0.7, with its CI
    assert four[:3] == ("4", "1", "0.900") and four[-1] == "1"
    pytest.importorskip("matplotlib")
    report = build_report([result], tmp_path / "report")
    names = sorted(figure.path.name for figure in report.figures)
    assert names == ["goodput.png", "throughput_vs_ttft.png"]
    assert all(figure.path.stat().st_size > 1000 for figure in report.figures)
    page = report.html_path.read_text()
    assert "kvbench sweep: chat (concurrency)" in page and page.count("data:image/png;base64,") == 2
    assert "interrupted, partial results" in page
