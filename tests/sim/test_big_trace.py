"""benchmarks/big_trace.py: a seeded Mooncake trace with many one-off first blocks, read back."""

import json

import numpy as np
from big_traces import BigTraceConfig, big_trace_file, generate

from kvbench.sim.hash_id_trace import hash_id_trace


def test_the_trace_has_the_issue_shape_and_is_seeded():
    """10% one-offs each with its own first block, the rest on 300 system prompts: at 20,000
    requests 2,000 + at most 300 distinct first blocks; ~25 blocks a request; the same seed, the
    same trace; another seed, another."""
    trace = generate(BigTraceConfig(num_requests=20_000, seed=3))
    assert 2_000 < trace.num_distinct_first_blocks <= 2_300
    assert 20 < trace.hash_ids.size / 20_000 < 30
    again, other = (
        generate(BigTraceConfig(num_requests=20_000, seed=3)),
        generate(BigTraceConfig(num_requests=20_000, seed=4)),
    )
    assert np.array_equal(trace.hash_ids, again.hash_ids) and np.array_equal(
        trace.timestamps_ms, again.timestamps_ms
    )
    assert not np.array_equal(trace.hash_ids[:1000], other.hash_ids[:1000])
    assert np.all(np.diff(trace.timestamps_ms) >= 0)


def test_the_file_reads_back_as_a_mooncake_trace(tmp_path):
    """Every line a valid Mooncake record (kvbench's reader checks one id per 512-token block), the
    ids and lengths as generated, and conversations hit: turns reuse their system prompt and history."""
    path = big_trace_file(tmp_path, 3_000, seed=1)
    trace = generate(BigTraceConfig(num_requests=3_000, seed=1))
    records = [json.loads(line) for line in path.read_text().splitlines()]
    assert [r["input_length"] for r in records] == trace.input_lengths.tolist()
    assert np.array_equal(np.concatenate([r["hash_ids"] for r in records]), trace.hash_ids)
    prepared = hash_id_trace(path, "mooncake", 512)
    assert prepared.num_requests == 3_000
    keys = [key for prompt in prepared.prompts for key in prompt.block_hashes]
    assert len(keys) <= trace.hash_ids.size and len(set(keys)) < 0.6 * len(keys)  # reused blocks
