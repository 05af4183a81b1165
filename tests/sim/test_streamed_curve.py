"""The exact curve read in chunks (memory bounded by the distinct blocks) is the whole-trace curve:
the same distances whatever the chunks on random traces, the same rows at every change point on
generated big traces, the Mooncake trace and with ``--requests``; and every trace the chunks cannot
vouch for (late lines, ids that do not name their prefixes) is left to the whole-trace path."""

import json

import numpy as np
import pytest
from big_traces import big_trace_file
from curve_traces import BLOCK, chat_trace_file, traces
from hypothesis import given, settings
from hypothesis import strategies as st

from kvbench.sim.compact_curve import compact_hit_curve
from kvbench.sim.exact_memory import estimated_ids, exact_memory_refusal
from kvbench.sim.replay import prepare_prompts
from kvbench.sim.stack_distance import distances_of
from kvbench.sim.streamed_curve import StackState, streamed_hit_curve


def assert_same_rows(streamed, whole):
    sizes = whole.change_points()
    assert np.array_equal(streamed.change_points(), sizes)
    assert streamed.ideal_capacity_blocks == whole.ideal_capacity_blocks
    assert streamed.num_blocks == whole.num_blocks
    assert [r.as_row() for r in streamed.results(sizes)] == [r.as_row() for r in whole.results(sizes)]
    between = np.unique(np.concatenate([sizes - 1, sizes + 1, [1, 10**9]]))
    assert [r.as_row() for r in streamed.results(between)] == [r.as_row() for r in whole.results(between)]


@settings(max_examples=150, deadline=None)
@given(traces(), st.lists(st.integers(0, 40), max_size=6))
def test_chunks_give_the_per_key_distances(requests, cuts):
    """Random chunk boundaries; a long first chunk then short ones puts distances far above a
    chunk's own length (what a running max keyed by the chunk's length got wrong)."""
    key_lists = [prompt.block_hashes for prompt in prepare_prompts(requests, BLOCK).prompts]
    distances, offsets, num_distinct = distances_of(key_lists)
    numbers = {}
    keys = np.array([numbers.setdefault(k, len(numbers)) for ks in key_lists for k in ks], dtype=np.int64)
    bounds = sorted({0, len(key_lists), *(min(c, len(key_lists)) for c in cuts)})
    state, got = StackState(), []
    for first, last in zip(bounds[:-1], bounds[1:]):
        part = offsets[first : last + 1]
        got.append(state.distances(keys[part[0] : part[-1]], part - part[0]))
    assert np.array_equal(np.concatenate(got) if got else np.zeros(0), distances)
    assert state.num_distinct == num_distinct


@pytest.mark.parametrize(
    ("seed", "block_size", "chunk_ids"),
    [(0, 512, 3_000), (1, 1024, 1_111), (2, 256, 20_000), (3, 128, 50_000)],
)
def test_generated_big_traces_give_the_whole_trace_rows(tmp_path, seed, block_size, chunk_ids):
    path = big_trace_file(tmp_path, 3_000, seed=seed, num_system_prompts=40)
    whole = compact_hit_curve(path, "mooncake", block_size)
    streamed = streamed_hit_curve(path, "mooncake", block_size, chunk_ids=chunk_ids)
    assert streamed is not None
    assert_same_rows(streamed, whole)
    limited = streamed_hit_curve(path, "mooncake", block_size, limit=1_234, chunk_ids=chunk_ids)
    assert limited.trace.num_requests == 1_234
    assert_same_rows(limited, compact_hit_curve(path, "mooncake", block_size, 1_234))


def test_the_mooncake_trace_gives_the_whole_trace_rows(shared_data):
    path = shared_data / "mooncake" / "conversation_trace.jsonl"
    streamed = streamed_hit_curve(path, "mooncake", 512, chunk_ids=20_000)
    assert_same_rows(streamed, compact_hit_curve(path, "mooncake", 512))


def test_late_lines_and_odd_ids_are_left_to_the_whole_trace_path(tmp_path):
    late = chat_trace_file(tmp_path / "chats.jsonl", 300)  # out of order: the whole-trace path sorts
    assert streamed_hit_curve(late, "hash-ids", 16) is None
    assert compact_hit_curve(late, "hash-ids", 16) is not None
    lines = [
        {"timestamp": t, "input_length": 1536, "output_length": 1, "hash_ids": ids}
        for t, ids in enumerate([[7, 8, 9], [1, 2, 3], [8, 7, 9]])  # 7 after 8 in another chunk
    ]
    odd = tmp_path / "odd.jsonl"
    odd.write_text("".join(json.dumps(line) + "\n" for line in lines))
    assert streamed_hit_curve(odd, "mooncake", 512, chunk_ids=3) is None
    sparse = tmp_path / "sparse.jsonl"  # ids far above the accesses: a rank per value is not bounded
    sparse.write_text(
        json.dumps({"timestamp": 0, "input_length": 512, "output_length": 1, "hash_ids": [2**30]})
    )
    assert streamed_hit_curve(sparse, "mooncake", 512) is None


def test_a_far_distance_does_not_leak_into_the_next_request():
    """1,000 keys before the chunk; in it key 0 (distance 1,000), then a request of two runs with
    distances 2 and 4: the running max per request must not carry the 1,000 over (it did while it
    was keyed by the chunk's 5 accesses)."""
    key_lists = [[k] for k in range(1000)] + [[0], [999, 997]]
    distances, _, _ = distances_of(key_lists)
    state = StackState()
    state.distances(np.arange(1000, dtype=np.int64), np.arange(1001, dtype=np.int64))
    got = state.distances(np.array([0, 999, 997], dtype=np.int64), np.array([0, 1, 3], dtype=np.int64))
    assert got.tolist() == distances[1000:].tolist() == [1000, 2, 4]


def test_a_trace_too_big_for_the_memory_is_refused_before_reading(tmp_path):
    """The estimate of the ids from the size and the first lines is within 30% on a generated
    trace; too little memory gives one line offering the sampled curve, enough gives ``None``."""
    path = big_trace_file(tmp_path, 20_000, seed=4)
    num_ids = sum(len(json.loads(line)["hash_ids"]) for line in path.read_text().splitlines())
    assert abs(estimated_ids(path) - num_ids) < 0.3 * num_ids
    assert estimated_ids(path, limit=100) < estimated_ids(path) / 50
    refusal = exact_memory_refusal(path, None, 2**20)
    assert "--sample-keys 65536" in refusal and "1.0 GiB is available" not in refusal
    assert "\n" not in refusal and "0.0 GiB is available" in refusal
    assert exact_memory_refusal(path, None, 2**34) is None
    assert exact_memory_refusal(path, None, None) is None
