"""Every run file explains: the run files kvbench sweep and load sweeps write carry their
source, so ``kvbench explain RUN.parquet`` and ``kvbench report RUNS --explain`` work on them; a
summary or a break file says exactly what explain needs. Real files, written by the commands."""

import json

import pytest
from cli_and_rows import small_chat
from tiny_workloads import tiny_timestamp

from kvbench.results.parquet import read_metadata

pytestmark = [pytest.mark.engine, pytest.mark.slow]

TWO_PREFIXES = """
# two 64-token prefixes in turn (token ids), each request 8 unique tokens: 8 blocks hold both
[workload]
kind = "multi-prefix"
num_prefixes = 2
prefix_tokens = 64
unique_tokens = 8
num_requests = 6
popularity = "rr"
seed = 0

[cache]
block_size = 16

[run]
max_tokens = 2
"""


def one_line_error(code, err, *parts):
    assert code == 2 and len(err.strip().splitlines()) == 1 and "Traceback" not in err, err
    for part in parts:
        assert part in " ".join(err.split()), err


def test_the_run_files_of_an_engine_sweep_explain_and_report(kvbench, tmp_path):
    scenario, out = tmp_path / "two.toml", tmp_path / "sweep"
    scenario.write_text(TWO_PREFIXES)
    code, _, err = kvbench("sweep", scenario, "--cache-sizes", "5,20", "--out", out)
    assert code == 0, err
    assert read_metadata(out / "run-5.parquet")["run"]["source"] == str(scenario)
    code, stdout, err = kvbench("explain", out / "run-5.parquet", "--ttft-fit", out / "run-20.parquet")
    assert code == 0, err
    flat = " ".join(stdout.split())
    assert "cache of 5 blocks of 16" in stdout and "what to change" in stdout
    assert "1. raise the cache to >= " in flat and "TTFT p50 ~-" in flat and "(estimate)" in flat
    assert f"fitted on {out / 'run-20.parquet'}" in flat  # the fit of the warm run's own rows
    code, stdout, err = kvbench("explain", out / "run-5.parquet", "--format", "json")
    first = json.loads(stdout)["fixes"][0]
    code, stdout, err = kvbench("explain", out / "run-20.parquet", "--format", "json")
    hit = next(row for row in json.loads(stdout)["waterfall"] if row["step"] == "hit")
    assert first["setting"]["cache_size"] <= 20 and abs(hit["share"] - first["hit_rate_after"]) < 0.01
    code, _, err = kvbench(
        "report", out / "run-5.parquet", out / "run-20.parquet", "--explain", "--out", tmp_path / "r"
    )
    assert code == 0, err
    page = (tmp_path / "r" / "report.html").read_text(encoding="utf-8")
    assert "explain: run-5: what to change" in page and "explain: run-20: waterfall" in page
    code, _, err = kvbench("explain", out / "sweep.parquet")
    one_line_error(
        code, err, "a sweep summary", "explain one of its run files", "run-5.parquet", "run-20.parquet"
    )


def test_a_break_file_says_what_explain_needs(kvbench, tmp_path):
    out = tmp_path / "ts.parquet"
    code, _, err = kvbench(*tiny_timestamp(), "--out", out)
    assert code == 0, err
    code, _, err = kvbench("explain", out)
    one_line_error(
        code,
        err,
        "kvbench break timestamp",
        "generated in memory",
        "kvbench trace gen",
        "kvbench explain TRACE.jsonl",
    )


@pytest.mark.server
def test_the_run_files_of_a_load_sweep_explain(kvbench, server, tmp_path):
    out = tmp_path / "load"
    code, _, err = kvbench(*small_chat("sweep", server.url), "--request-rate", "4", "--out", out)
    assert code == 0, err
    code, stdout, err = kvbench("explain", out / "run-r4-1.parquet")
    assert code == 0, err
    assert "kvbench explain: run-r4-1" in stdout and "what to change" in stdout
    code, _, err = kvbench("explain", out / "load_sweep.parquet")
    one_line_error(code, err, "a load sweep summary", "explain one of its run files", "run-r4-1.parquet")
