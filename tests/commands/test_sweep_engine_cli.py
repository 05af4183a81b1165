"""``kvbench sweep --engine paged`` and ``--repeats``: the real default model, Parquet read back."""

import statistics
from pathlib import Path

import pyarrow.parquet as pq
from cli_and_rows import file_fixture
from test_sweep_cli import SCENARIO  # 3 prefixes of 64 tokens round robin, 16 unique, 12 requests, 2 outputs

from kvbench.results.parquet import read_metadata
from kvbench.results.rows import rows_from_dicts
from kvbench.results.schema import RUN_COLUMNS
from kvbench.results.summary import summarize
from kvbench.results.sweep import fit_ttft_vs_miss_rate, read_sweep_summary

scenario = file_fixture(SCENARIO, "rr.toml")


def paged_sweep(scenario, sizes: str, *flags) -> tuple:
    """``kvbench sweep SCENARIO --cache-sizes SIZES --engine paged --ignore-eos FLAGS``'s words."""
    return ("sweep", scenario, "--cache-sizes", sizes, "--engine", "paged", "--ignore-eos", *flags)


def test_paged_sweep_has_the_run_columns_and_the_vllm_prediction(kvbench, scenario, tmp_path):
    out = tmp_path / "sweep"
    code, stdout, stderr = kvbench(*paged_sweep(scenario, "6,24", "--threads", "1", "--out", out))
    assert code == 0, stderr
    small, large = read_sweep_summary(out / "sweep.parquet").points
    # A request is 80 prompt + 2 output tokens: 6 pool blocks (running blocks count) hold one, so the
    # next prefix evicts the last; 24 hold all three prefixes: requests 4..12 hit their 4 blocks.
    assert small.token_hit_rate == 0.0 and large.token_hit_rate == (9 * 64) / (12 * 80)
    for point in (small, large):
        assert list(pq.read_schema(point.results_path).names) == list(RUN_COLUMNS)
        rows = pq.read_table(point.results_path).to_pylist()
        assert [r["cached_prompt_tokens"] for r in rows] == [r["expected_cached_tokens"] for r in rows]
        engine = read_metadata(point.results_path)["run"]["engine"]
        assert engine["kind"] == "paged" and engine["num_pool_blocks"] == point.capacity_blocks
        assert read_metadata(point.results_path)["run"]["threads"]["reason"] == "--threads 1"
    assert read_metadata(out / "sweep.parquet")["sweep"]["engine"] == "paged"
    assert read_metadata(out / "sweep.parquet")["sweep"]["threads"]["num_threads"] == 1  # as asked
    assert "threads: 1 (--threads 1;" in stderr
    assert "TTFT p50 =" in stdout


def test_repeats_write_every_run_the_spread_and_fit_the_medians(kvbench, scenario, tmp_path):
    out = tmp_path / "sweep"
    code, stdout, stderr = kvbench(
        "sweep", scenario, "--cache-sizes", "5,20", "--repeats", "3", "--requests", "6", "--out", out
    )
    assert code == 0, stderr
    summary = read_sweep_summary(out / "sweep.parquet")
    assert "min .. max of 3" in stdout and "wrote 6 run files" in stdout
    for point in summary.points:
        assert point.num_repeats == 3 and point.num_requests == 18
        assert [Path(p).name for p in point.repeat_results_paths] == [
            f"run-{point.capacity_blocks}-r{k}.parquet" for k in (1, 2, 3)
        ]
        # every repeat's p50 is its own file's; the point's is their median, the spread their min and max
        assert list(point.repeat_p50_ttft_ms) == [
            summarize(rows_from_dicts(pq.read_table(p).to_pylist())).p50_ttft_ms
            for p in point.repeat_results_paths
        ]
        assert point.p50_ttft_ms == statistics.median(point.repeat_p50_ttft_ms)
        assert point.min_p50_ttft_ms == min(point.repeat_p50_ttft_ms)
        assert point.max_p50_ttft_ms == max(point.repeat_p50_ttft_ms)
        assert f"{point.min_p50_ttft_ms:,.1f} .. {point.max_p50_ttft_ms:,.1f}" in stdout
    # round robin over 3 prefixes: 5 blocks never hit, 20 hold all three (requests 4..6 hit 4 blocks)
    assert [p.token_hit_rate for p in summary.points] == [0.0, (3 * 64) / (6 * 80)]
    medians = fit_ttft_vs_miss_rate(
        [p.token_hit_rate for p in summary.points], [p.p50_ttft_ms for p in summary.points]
    )
    assert summary.fit == medians


def test_engine_flags_on_a_load_sweep_are_one_line(kvbench, scenario):
    code, _, stderr = kvbench(
        "sweep", scenario, "--backend", "openai", "--concurrency", "1", "--repeats", "2"
    )
    assert code == 2 and "--repeats apply to the engine sweep" in stderr and "Traceback" not in stderr
    assert len([line for line in stderr.splitlines() if line.strip()]) == 1
    code, _, stderr = kvbench("sweep", scenario, "--cache-sizes", "8", "--max-num-seqs", "2")
    assert (
        code == 2 and "--max-num-seqs applies to --engine paged only" in stderr and "Traceback" not in stderr
    )


BLOCK_BYTES = 2 * 8 * 2 * 16 * 64 * 4  # K and V x 8 layers x 2 KV heads x 16 tokens x head dim 64 x fp32


def test_paged_sweep_names_each_failing_sizes_reason_and_writes_kv_memory(kvbench, scenario, tmp_path):
    out = tmp_path / "sweep"
    code, stdout, stderr = kvbench(*paged_sweep(scenario, "3,24", "--out", out))
    assert code == 0, stderr
    small, large = read_sweep_summary(out / "sweep.parquet").points
    assert small.num_errors == 12 and large.num_errors == 0
    # 80 prompt + 2 output tokens need 6 blocks of 16; a pool of 3 refuses every request, once per size in
    # stdout
    reason = "prompt + max_tokens need 6 blocks of 16 tokens; the KV pool has 3 (raise --cache-sizes)"
    flat = " ".join(stdout.split())  # rich wraps long lines
    assert flat.count("cache size 3 blocks: errors, the first:") == 1 and reason in flat
    assert "cache size 24 blocks: errors" not in flat
    row_error = pq.read_table(small.results_path).to_pylist()[0]["error"]
    # the run file keeps the engine's words
    assert row_error == reason.replace("--cache-sizes", "--cache-size")
    small_memory, large_memory = (read_metadata(p.results_path)["run"]["kv_memory"] for p in (small, large))
    assert small_memory["engine"] == large_memory["engine"] == "paged"
    assert small_memory["pool_bytes"] == (3 + 1) * BLOCK_BYTES and small_memory["peak_held_kv_bytes"] == 0
    assert large_memory["pool_bytes"] == (24 + 1) * BLOCK_BYTES  # + the null block
    # one request at a time: 81 tokens with K/V
    assert large_memory["peak_running_kv_bytes"] == 6 * BLOCK_BYTES


def test_a_sweep_where_every_size_fails_exits_1_with_the_first_reason(kvbench, scenario, tmp_path):
    """Sizes 3 and 5 refuse every request (6 blocks needed); a sweep where only some sizes fail exits 0
    (the test above: 3,24)."""
    out = tmp_path / "sweep"
    code, stdout, stderr = kvbench(*paged_sweep(scenario, "3,5", "--out", out))
    assert code == 1 and "Traceback" not in stderr
    [line] = [line for line in stderr.splitlines() if line.startswith("error:")]
    assert line == (
        "error: every cache size failed (2 of 2, no request succeeded); the first error, at 3 blocks: "
        "prompt + max_tokens need 6 blocks of 16 tokens; the KV pool has 3 (raise --cache-sizes)"
    )
    points = read_sweep_summary(out / "sweep.parquet").points  # what ran is still written
    assert [(p.capacity_blocks, p.num_errors) for p in points] == [(3, 12), (5, 12)]


def test_cache_kind_radix_sweeps_the_pool_keyed_as_a_radix_tree(kvbench, scenario, tmp_path):
    """``--cache-kind`` overrides the scenario's ``[cache] kind`` (hash here) as in ``kvbench run``; the
    radix-mode pool simulator predicts every row."""
    out = tmp_path / "sweep"
    code, _, stderr = kvbench(*paged_sweep(scenario, "6,24", "--cache-kind", "radix", "--out", out))
    assert code == 0, stderr
    points = read_sweep_summary(out / "sweep.parquet").points
    assert [p.token_hit_rate for p in points] == [0.0, (9 * 64) / (12 * 80)]
    for point in points:
        rows = pq.read_table(point.results_path).to_pylist()
        assert {r["cache_kind"] for r in rows} == {"radix"}
        assert [r["cached_prompt_tokens"] for r in rows] == [r["expected_cached_tokens"] for r in rows]
        assert read_metadata(point.results_path)["run"]["cache"]["kind"] == "radix"
    assert read_metadata(out / "sweep.parquet")["sweep"]["cache"]["kind"] == "radix"
    code, _, stderr = kvbench(
        "sweep", scenario, "--backend", "openai", "--concurrency", "1", "--cache-kind", "radix"
    )
    assert code == 2 and "--cache-kind" in stderr and "Traceback" not in stderr
