"""``kvbench run --engine paged``: the paged engine through the real CLI, Parquet read back."""

import pyarrow.parquet as pq
import pytest
from cli_and_rows import file_fixture, one_error_line
from tiny_scenarios import PAGED_AT_4, PROMPT_TOKENS, SHARED_BLOCK_TOKENS
from tiny_scenarios import SHARED_PREFIX as SCENARIO

from kvbench.engine.native import native_kernels
from kvbench.results.parquet import read_metadata
from kvbench.results.schema import RUN_COLUMNS

scenario = file_fixture(SCENARIO, "tiny.toml")


def test_paged_at_concurrency_1_matches_the_vllm_prediction_and_cache_off(kvbench, scenario, tmp_path):
    out = tmp_path / "paged.parquet"
    code, stdout, stderr = kvbench(
        "run", scenario, "--engine", "paged", "--verify", "--ignore-eos", "--out", out
    )
    assert code == 0, stderr
    rows = pq.read_table(out).to_pylist()
    assert list(pq.read_schema(out).names) == list(RUN_COLUMNS)
    assert [r["prompt_tokens"] for r in rows] == [PROMPT_TOKENS] * 4
    assert [r["cached_prompt_tokens"] for r in rows] == [0] + [SHARED_BLOCK_TOKENS] * 3
    assert [r["expected_cached_tokens"] for r in rows] == [0] + [SHARED_BLOCK_TOKENS] * 3  # the vLLM pool
    assert all(r["output_matches_reference"] is True for r in rows)
    assert all(r["kv_load_ms"] == 0.0 and 0 < r["ttft_ms"] <= r["e2e_ms"] for r in rows)
    engine = read_metadata(out)["run"]["engine"]
    assert engine["kind"] == "paged" and engine["num_pool_blocks"] == 64 and engine["max_num_seqs"] == 256


def test_paged_radix_end_to_end_matches_its_prediction_and_cache_off(kvbench_rows, scenario, tmp_path):
    """``--cache-kind radix`` on the pool: the radix-mode pool simulator predicts every row."""
    out = tmp_path / "radix.parquet"
    rows = kvbench_rows(
        "run", scenario, "--engine", "paged", "--cache-kind", "radix", "--verify", "--ignore-eos", out=out
    )
    assert [r["cached_prompt_tokens"] for r in rows] == [0] + [SHARED_BLOCK_TOKENS] * 3
    # the pool's radix mode
    assert [r["expected_cached_tokens"] for r in rows] == [0] + [SHARED_BLOCK_TOKENS] * 3
    assert all(r["output_matches_reference"] is True for r in rows)
    assert {r["cache_kind"] for r in rows} == {"radix"}
    assert read_metadata(out)["run"]["engine"]["kind"] == "paged"


def test_paged_concurrency_4_batch_invariant_verifies(kvbench_rows, scenario, tmp_path):
    out = tmp_path / "paged4.parquet"
    rows = kvbench_rows(
        "run", scenario, *PAGED_AT_4, "--batch-invariant", "--max-num-seqs", "4", "--verify", out=out
    )
    assert all(r["output_matches_reference"] is True for r in rows)
    assert all(r["expected_cached_tokens"] is None for r in rows)  # side by side: not predictable
    assert read_metadata(out)["run"]["engine"]["batch_invariant"] is True


def test_paged_ttl_runs_and_is_not_predicted(kvbench_rows, scenario, tmp_path):
    out = tmp_path / "ttl.parquet"
    rows = kvbench_rows("run", scenario, "--engine", "paged", "--ttl", "600", "--ignore-eos", out=out)
    assert [r["cached_prompt_tokens"] for r in rows] == [0] + [SHARED_BLOCK_TOKENS] * 3  # nothing idle 600 s
    assert all(r["expected_cached_tokens"] is None for r in rows)  # the vLLM pool has no TTL


@pytest.mark.parametrize(
    "args,needle",
    [
        (["--max-num-seqs", "4"], "--max-num-seqs applies to --engine paged only"),
        (
            ["--engine", "paged", "--max-num-batched-tokens", "0"],
            "--max-num-batched-tokens: 0 must be positive",
        ),
        (
            ["--engine", "paged", "--cache-kind", "radix", "--release", "head-first"],
            "--cache-kind radix --release head-first: the radix cache evicts leaves only",
        ),
        (
            # the copy engine: was "error: ValueError: ..."
            [
                "--cache-kind",
                "radix",
                "--release",
                "head-first",
            ],
            "--cache-kind radix --release head-first: the radix cache evicts leaves only",
        ),
        (["--engine", "paged", "--backend", "openai"], "apply to --backend inprocess only"),
    ],
)
def test_bad_engine_flags_are_one_line_and_exit_2(kvbench, scenario, tmp_path, args, needle):
    code, _, stderr = kvbench("run", scenario, *args, "--out", tmp_path / "x.parquet")
    assert needle in one_error_line(code, stderr)


def test_a_request_larger_than_the_pool_leaves_the_others_predicted(kvbench, tmp_path):
    """Shipped chat at 40 blocks, concurrency 1: two turns need more blocks than the pool (error rows, no
    prediction); every request that ran is still predicted exactly (it was null for the whole run)."""
    out = tmp_path / "chat.parquet"
    code, _, stderr = kvbench(
        "run",
        "chat",
        "--engine",
        "paged",
        "--cache-size",
        "40",
        "--concurrency",
        "1",
        "--requests",
        "5",
        "--max-tokens",
        "2",
        "--ignore-eos",
        "--out",
        out,
    )
    assert code == 1 and "2 request(s) failed" in stderr  # failed requests exit 1; the rows are written
    rows = pq.read_table(out).to_pylist()
    assert [r["status"] for r in rows] == ["ok", "ok", "error", "ok", "error"]
    assert [r["expected_cached_tokens"] for r in rows] == [r["cached_prompt_tokens"] for r in rows]
    assert rows[3]["cached_prompt_tokens"] > 0  # after a refused request, the shared system prompt still hits


def test_a_host_tier_is_sized_in_bytes_recorded_and_refused_on_the_copy_engine(
    kvbench, kvbench_rows, scenario, tmp_path
):
    out = tmp_path / "host.parquet"
    rows = kvbench_rows("run", scenario, "--engine", "paged", "--host-tier", "2MiB", "--ignore-eos", out=out)
    # the pool keeps the shared system prompt: every hit is on the GPU, none loaded from the host tier
    assert [(r["cached_prompt_tokens"], r["host_cached_tokens"]) for r in rows] == [(0, 0)] + [
        (SHARED_BLOCK_TOKENS, 0)
    ] * 3
    assert [r["expected_cached_tokens"] for r in rows] == [None] * 4  # the pool predictor has no host tier
    engine = read_metadata(out)["run"]["engine"]
    # 16 blocks of 128 KiB (default model, fp32)
    assert engine["host_tier_blocks"] == 2 * 2**20 // (16 * 8192)
    assert engine["host_tier_bytes"] == 16 * 16 * 8192
    if native_kernels() is not None:  # the CPU: kvbench's own paged decode (engine/paged/kernels.py)
        assert (engine["attention_kernel"], engine["attention_kernel_reason"]) == ("kvbench-cpu", "auto")
    else:
        assert engine["attention_kernel"] == "sdpa-gathered"
        assert engine["attention_kernel_reason"].startswith(
            "flashinfer: needs a CUDA device (the pool is on cpu); "
        )
    code, _, stderr = kvbench("run", scenario, "--host-tier", "64", "--out", tmp_path / "copy.parquet")
    assert code == 2 and "--host-tier applies to --engine paged only" in stderr
