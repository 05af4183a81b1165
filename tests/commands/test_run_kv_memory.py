"""``run.kv_memory``: the KV bytes a run held, in the Parquet metadata and the printed summary, for
the paged engine (measured on its pool) and the copy engine (its blocks + the contiguous copy)."""

from cli_and_rows import file_fixture
from tiny_scenarios import PROMPT_TOKENS
from tiny_scenarios import SHARED_PREFIX as SCENARIO

from kvbench.results.parquet import read_metadata

BLOCK_BYTES = 2 * 8 * 2 * 16 * 64 * 4  # K and V x 8 layers x 2 KV heads x 16 tokens x head dim 64 x fp32
TOKEN_BYTES = BLOCK_BYTES // 16


scenario = file_fixture(SCENARIO, "tiny.toml")


def test_paged_run_reports_the_pools_measured_bytes(kvbench, scenario, tmp_path):
    """4 requests of 93 prompt + 3 output tokens one after another, 16-token blocks: each holds 6
    blocks while it runs (95 tokens with K/V); 4 shared prefix blocks + 1 own full block per request
    stay cached, so the 4th request runs next to 3 cached blocks of the others (9 held) and 8 stay."""
    out = tmp_path / "paged.parquet"
    code, stdout, stderr = kvbench("run", scenario, "--engine", "paged", "--ignore-eos", "--out", out)
    assert code == 0, stderr
    memory = read_metadata(out)["run"]["kv_memory"]
    assert memory["engine"] == "paged"
    assert memory["peak_running_kv_bytes"] == 6 * BLOCK_BYTES
    assert memory["peak_held_kv_bytes"] == 9 * BLOCK_BYTES
    assert memory["end_held_kv_bytes"] == memory["end_cached_kv_bytes"] == 8 * BLOCK_BYTES
    assert memory["pool_bytes"] == (64 + 1) * BLOCK_BYTES  # 64 blocks + the null block
    assert memory["peak_unfilled_kv_bytes"] == (6 * 16 - PROMPT_TOKENS) * TOKEN_BYTES  # the prefill step
    assert memory["peak_copy_engine_kv_bytes"] > memory["peak_held_kv_bytes"]
    assert "KV pool held, running + cached: peak / end (MiB)" in stdout and "1.1 / 1.0" in stdout


def test_copy_run_reports_its_blocks_and_contiguous_copy(kvbench, scenario, tmp_path):
    out = tmp_path / "copy.parquet"
    code, stdout, stderr = kvbench("run", scenario, "--ignore-eos", "--out", out)
    assert code == 0, stderr
    memory = read_metadata(out)["run"]["kv_memory"]
    assert memory["engine"] == "copy" and memory["end_held_kv_bytes"] > 0
    assert memory["peak_contiguous_kv_bytes"] == (PROMPT_TOKENS + 3 - 1) * TOKEN_BYTES
    assert (
        memory["peak_copy_engine_kv_bytes"]
        == memory["end_held_kv_bytes"] + memory["peak_contiguous_kv_bytes"]
    )
    assert "largest contiguous copy" in stdout
