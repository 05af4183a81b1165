"""``--max-error-rate`` and ``--assert`` against a server whose every request fails (HTTP 500)."""

import json

import pytest
from cli_and_rows import openai_args
from tiny_workloads import tiny_shared_prefix

from kvbench.cli import main

SCENARIO = tiny_shared_prefix(4, system_tokens=32, max_tokens=2)


@pytest.fixture
def failing_run(fake_server, tmp_path, capsys):
    server = fake_server("fail")
    scenario = tmp_path / "tiny.toml"
    scenario.write_text(SCENARIO)

    def run(*flags):
        try:
            main(
                [
                    *openai_args("run", str(scenario), server.url),
                    "--timeout",
                    "2",
                    "--no-preflight",  # the gate, not the preflight (which stops a run that cannot stream)
                    "--out",
                    str(tmp_path / "run.parquet"),
                    *flags,
                ]
            )
            code = 0
        except SystemExit as exit_:
            code = exit_.code
        return code, capsys.readouterr()

    return run


def test_max_error_rate_decides_exit_1(failing_run, tmp_path):
    code, captured = failing_run("--max-error-rate", "0.5")
    assert code == 1 and "4 request(s) failed" in captured.err and "--max-error-rate 0.5" in captured.err
    code, captured = failing_run("--max-error-rate", "1", "--save-result", str(tmp_path / "r.json"))
    assert code == 0 and "4 request(s) failed" in captured.err  # reported, within the allowed rate
    result = json.loads((tmp_path / "r.json").read_text())
    assert (result["completed"], result["failed"], result["error_rate"]) == (0, 4, 1.0)
    assert result["request_throughput"] == 0.0 and result["median_ttft_ms"] is None


def test_a_failed_assertion_exits_3_even_when_requests_failed(failing_run):
    code, captured = failing_run("--assert", "failed==0", "--assert", "completed<=4")
    assert code == 3 and "1 of 2 assertion(s) failed" in captured.err
    assert "failed==0" in captured.out and "FAIL" in captured.out and "pass" in captured.out


def test_out_of_range_error_rate_is_a_usage_error(failing_run):
    code, captured = failing_run("--max-error-rate", "2")
    assert code == 2 and "--max-error-rate" in captured.err
