"""A run cut by a real SIGTERM or SIGINT mid-way writes what it measured with everything known at
that point: ``run.kv_memory`` (and its two table rows) and ``run.verify_logits`` of the paged engine,
and a sweep's cut size its ``run.kv_memory`` (``kvbench.run.execute.execute``'s ``on_end``)."""

import signal

import pyarrow.parquet as pq
from readiness import interrupted_kvbench
from tiny_scenarios import LONG_SHARED_PREFIX as LONG

from kvbench.results.parquet import read_metadata

BLOCK_BYTES = 2 * 8 * 2 * 16 * 64 * 4  # K and V x 8 layers x 2 KV heads x 16 tokens x head dim 64 x fp32


def test_sigterm_during_a_paged_verify_run_keeps_kv_memory_and_verify_counts(tmp_path):
    scenario, out = tmp_path / "long.toml", tmp_path / "term.parquet"
    scenario.write_text(LONG)
    code, stdout, stderr = interrupted_kvbench(
        ["run", scenario, "--engine", "paged", "--verify", "--concurrency", "2", "--out", out],
        out,
        signal.SIGTERM,
    )
    assert code == 143, stderr
    rows, metadata = pq.read_table(out).to_pylist(), read_metadata(out)
    assert 0 < len(rows) < 400 and metadata["complete"] is False
    memory = metadata["run"]["kv_memory"]
    assert memory["engine"] == "paged" and memory["pool_bytes"] == (64 + 1) * BLOCK_BYTES  # + the null block
    assert memory["peak_running_kv_bytes"] >= 6 * BLOCK_BYTES  # a 93-token prefill holds 6 blocks
    assert memory["peak_held_kv_bytes"] >= memory["peak_running_kv_bytes"]
    # the cut requests' blocks were freed
    assert memory["end_held_kv_bytes"] == memory["end_cached_kv_bytes"] > 0
    logits = metadata["run"]["verify_logits"]
    # cut unchecked: not counted
    checked = [row for row in rows if row["output_matches_reference"] is not None]
    assert logits["num_compared_tokens"] == sum(row["output_tokens"] for row in checked)
    assert all(row["status"] == "ok" for row in rows if row["output_matches_reference"] is None)
    assert logits["num_mismatches"] == 0
    flat = " ".join(stdout.split())  # the summary of what was kept, its memory and verify rows included
    assert "KV pool held, running + cached: peak / end (MiB)" in flat
    assert f"{memory['peak_held_kv_bytes'] / 2**20:,.1f} / {memory['end_held_kv_bytes'] / 2**20:,.1f}" in flat
    assert "argmax flips near ties / mismatches" in flat


def test_ctrl_c_during_a_sweep_keeps_the_cut_sizes_kv_memory(tmp_path):
    scenario, out = tmp_path / "long.toml", tmp_path / "sweep"
    scenario.write_text(LONG)
    code, _, stderr = interrupted_kvbench(
        ["sweep", scenario, "--cache-sizes", "64", "--engine", "paged", "--out", out],
        out / "run-64.parquet",
        signal.SIGINT,
    )
    assert code == 130, stderr
    metadata = read_metadata(out / "run-64.parquet")
    assert metadata["complete"] is False and 0 < len(pq.read_table(out / "run-64.parquet").to_pylist()) < 400
    memory = metadata["run"]["kv_memory"]
    assert memory["engine"] == "paged" and memory["pool_bytes"] == (64 + 1) * BLOCK_BYTES
    assert memory["peak_running_kv_bytes"] >= 6 * BLOCK_BYTES and memory["end_held_kv_bytes"] > 0
