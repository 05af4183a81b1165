"""``kvbench sweep`` on the real default model: one run file per size, a summary file and a fit."""

import pyarrow.parquet as pq

from kvbench.results.parquet import read_metadata
from kvbench.results.sweep import read_sweep_summary

SCENARIO = """
[workload]
kind = "multi-prefix"
num_prefixes = 3
prefix_tokens = 64
unique_tokens = 16
num_requests = 12
popularity = "rr"

[cache]
block_size = 16

[run]
max_tokens = 2
"""


def test_sweep_writes_runs_summary_and_fit(kvbench, tmp_path):
    scenario = tmp_path / "rr.toml"
    scenario.write_text(SCENARIO)
    out = tmp_path / "sweep"
    code, stdout, stderr = kvbench("sweep", scenario, "--cache-sizes", "5,20", "--out", out)
    assert code == 0, stderr
    summary = read_sweep_summary(out / "sweep.parquet")
    assert [p.capacity_blocks for p in summary.points] == [5, 20]
    small, large = summary.points
    # Round robin over 3 prefixes of 4 blocks (+1 unique block per request): 5 blocks hold one
    # request, so nothing ever hits; 20 blocks hold all three prefixes, so requests 4..12 hit 4 blocks.
    assert small.token_hit_rate == 0.0
    assert large.token_hit_rate == (9 * 64) / (12 * 80)
    for point in summary.points:
        rows = pq.read_table(point.results_path).to_pylist()
        assert len(rows) == 12 and {r["capacity_blocks"] for r in rows} == {point.capacity_blocks}
        assert [r["cached_prompt_tokens"] for r in rows] == [r["expected_cached_tokens"] for r in rows]
    assert summary.fit is not None and summary.fit.num_points == 2
    memory = read_metadata(summary.points[0].results_path)["run"]["kv_memory"]  # as kvbench run writes it
    assert (
        memory["engine"] == "copy" and memory["peak_contiguous_kv_bytes"] == (80 + 2 - 1) * 2 * 8 * 2 * 64 * 4
    )
    assert "TTFT p50 =" in stdout


def test_sweep_rejects_bad_sizes(kvbench, tmp_path):
    scenario = tmp_path / "rr.toml"
    scenario.write_text(SCENARIO)
    code, _, stderr = kvbench("sweep", scenario, "--cache-sizes", "5,0")
    assert code == 2 and "--cache-sizes: 0" in stderr


def test_sweep_refuses_a_size_given_twice(kvbench, tmp_path):
    scenario = tmp_path / "rr.toml"
    scenario.write_text(SCENARIO)
    out = tmp_path / "sweep"
    code, _, stderr = kvbench("sweep", scenario, "--cache-sizes", "16,8,16", "--out", out)
    assert code == 2 and "Traceback" not in stderr and not out.exists()
    assert "--cache-sizes: 16 given more than once" in stderr and "--repeats" in stderr
