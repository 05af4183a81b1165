"""``kvbench compare``: side-by-side numbers with ratios, and refusal of runs of different traces."""

import pytest
from cli_and_rows import measured_row

from kvbench.errors import InputError
from kvbench.results.compare import MetricRow, TraceMismatchError, compare_runs
from kvbench.results.files import load_result
from kvbench.results.parquet import write_rows
from kvbench.results.schema import RUN_SCHEMA

HASH_A = "sha256:" + "0a" * 32
HASH_B = "sha256:" + "0b" * 32


def write_run(
    path,
    *,
    ttft_ms,
    content_hash=HASH_A,
    cached_tokens=0,
    request_prefix="q",
    num_requests=11,
    requests_hash=None,
):
    """A run whose requests (after the cold first one) all take ``ttft_ms``."""
    rows = []
    for index in range(num_requests):
        row = measured_row(
            index,
            f"{request_prefix}{index}",
            turn=0,
            prompt_tokens=1000,
            cached_prompt_tokens=cached_tokens if index else 0,
            output_tokens=5,
            ttft_ms=ttft_ms if index else 1000.0,
            tpot_ms=40.0,
            e2e_ms=(ttft_ms if index else 1000.0) + 160.0,
        )
        rows.append(row)
    run = {
        "run_id": path.stem,
        "backend": "inprocess",
        "model": "tiny",
        "scenario": "shared_2k",
        "trace": {
            "path": "t.jsonl",
            "content_hash": content_hash,
            "requests_hash": requests_hash,
            "generator": None,
            "params": {},
        },
        "cache": {"enabled": cached_tokens > 0, "kind": "hash", "block_size": 16, "capacity_blocks": 256},
    }
    return write_rows(path, rows, {"command": "run", "run": run}, schema=RUN_SCHEMA)


def metric(comparison, name):
    return next(m for m in comparison.metrics if m.name == name)


def test_same_trace_compares_side_by_side_with_ratios(tmp_path):
    off = load_result(write_run(tmp_path / "off.parquet", ttft_ms=800.0))
    on = load_result(write_run(tmp_path / "on.parquet", ttft_ms=100.0, cached_tokens=960))
    comparison = compare_runs(off, on)
    assert comparison.trace == HASH_A and comparison.warnings == ()
    p50 = metric(comparison, "TTFT p50 (ms)")
    assert (p50.a, p50.b, p50.ratio) == (800.0, 100.0, 0.125)
    hit = metric(comparison, "token hit rate")
    assert hit.a == 0 and hit.b == pytest.approx(9600 / 11000) and hit.ratio is None
    assert metric(comparison, "TPOT p50 (ms)").ratio == pytest.approx(1.0)


def test_different_traces_are_refused_unless_forced(tmp_path):
    a = load_result(write_run(tmp_path / "a.parquet", ttft_ms=800.0))
    b = load_result(write_run(tmp_path / "b.parquet", ttft_ms=100.0, content_hash=HASH_B))
    with pytest.raises(TraceMismatchError, match="not runs of the same trace.*--force"):
        compare_runs(a, b)
    forced = compare_runs(a, b, force=True)
    assert any("different trace content hashes" in w for w in forced.warnings)


def test_without_hashes_the_request_ids_decide(tmp_path):
    a = load_result(write_run(tmp_path / "a.parquet", ttft_ms=800.0, content_hash=None))
    same = load_result(write_run(tmp_path / "same.parquet", ttft_ms=100.0, content_hash=None))
    other = load_result(
        write_run(tmp_path / "other.parquet", ttft_ms=100.0, content_hash=None, request_prefix="x")
    )
    assert "matched by the ids of 11 requests" in compare_runs(a, same).trace
    with pytest.raises(TraceMismatchError, match="request 0 is 'q0'"):
        compare_runs(a, other)


def test_scenario_runs_without_a_header_hash_match_by_requests_hash(tmp_path):
    a = load_result(write_run(tmp_path / "a.parquet", ttft_ms=800.0, content_hash=None, requests_hash=HASH_A))
    same = load_result(
        write_run(tmp_path / "s.parquet", ttft_ms=90.0, content_hash=None, requests_hash=HASH_A)
    )
    other = load_result(
        write_run(tmp_path / "o.parquet", ttft_ms=90.0, content_hash=None, requests_hash=HASH_B)
    )
    assert compare_runs(a, same).trace == HASH_A
    with pytest.raises(TraceMismatchError, match="different request hashes"):
        compare_runs(a, other)


def test_different_slices_of_one_trace_warn(tmp_path):
    a = load_result(write_run(tmp_path / "a.parquet", ttft_ms=800.0))
    b = load_result(write_run(tmp_path / "b.parquet", ttft_ms=100.0, num_requests=5))
    assert compare_runs(a, b).warnings == (
        "ran under different load: measured requests 11 (A) vs 5 (B): their latencies are not comparable",
    )


def test_only_run_files_are_compared(tmp_path):
    run = load_result(write_run(tmp_path / "a.parquet", ttft_ms=800.0))
    sim = load_result(
        write_rows(
            tmp_path / "sim.parquet", [{"capacity_blocks": 64, "token_hit_rate": 0.5}], {"command": "sim"}
        )
    )
    with pytest.raises(InputError, match="compare takes the results of kvbench run"):
        compare_runs(run, sim)


def test_ratio_is_undefined_without_a_baseline():
    assert MetricRow("x", 0.0, 5.0).ratio is None and MetricRow("x", None, 5.0).cells()[3] == "-"
    assert MetricRow("x", 2.0, 5.0).cells() == ("x", "2.0", "5.0", "2.50x")


def test_cli_prints_the_table_and_refuses_mismatches_with_exit_2(tmp_path, kvbench):
    off = write_run(tmp_path / "off.parquet", ttft_ms=800.0)
    on = write_run(tmp_path / "on.parquet", ttft_ms=100.0, cached_tokens=960)
    other = write_run(tmp_path / "other.parquet", ttft_ms=100.0, content_hash=HASH_B)
    code, out, _ = kvbench("compare", off, on)
    assert code == 0 and "TTFT p50 (ms)" in out and "0.12x" in out
    code, _, err = kvbench("compare", off, other)
    assert code == 2 and "not runs of the same trace" in err and err.strip().count("\n") == 0
    code, out, err = kvbench("compare", off, other, "--force")
    assert code == 0 and "warning" in err


def test_runs_without_verify_say_not_verified_in_compare_and_report(tmp_path):
    """Runs that never used --verify once showed "outputs differing from reference: 0"."""
    from kvbench.results.compare import compare_runs
    from kvbench.results.files import NOT_VERIFIED, load_result
    from kvbench.results.report import run_table

    a = load_result(write_run(tmp_path / "a.parquet", ttft_ms=10.0))
    b = load_result(write_run(tmp_path / "b.parquet", ttft_ms=5.0))
    [row] = [m for m in compare_runs(a, b).metrics if m.name == "outputs differing from reference"]
    assert row.cells() == ("outputs differing from reference", NOT_VERIFIED, NOT_VERIFIED, "-")
    [cells] = [r for r in run_table([a, b]).rows if r[0] == "outputs differing from reference"]
    assert cells[1:] == (NOT_VERIFIED, NOT_VERIFIED)
