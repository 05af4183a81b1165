"""The exact curve from a hash-id trace held as numpy arrays is today's curve: the same
distances on random traces, the same rows and per-request cached tokens on the Mooncake trace, on
hash-id traces with late lines and on generated big traces; and every file the arrays' reader does
not vouch for goes to the line reader (same results, same error lines)."""

import json

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from big_traces import big_trace_file
from curve_traces import BLOCK, chat_trace_file, traces
from hypothesis import given, settings

from kvbench.results.curve_files import MAX_DRAWN_POINTS, _drawn, curve_table
from kvbench.sim.compact_curve import compact_hit_curve
from kvbench.sim.compact_distances import compact_distances, earlier_sums
from kvbench.sim.curve import hit_curve
from kvbench.sim.hash_id_trace import hash_id_trace
from kvbench.sim.replay import prepare_prompts
from kvbench.sim.stack_distance import distances_of


@pytest.mark.parametrize(
    "key_lists",
    [
        # hypothesis found it: a warm request, then one without keys
        [
            [0],
            [1, 2],
            [3, 4, 5, 6],
            [3, 4, 5],
            [],
        ],
        [[0, 1], [0, 1], [], [], [0]],
        [[], [7, 8], [7, 8, 9], [], [7]],
    ],
)
def test_requests_without_keys_leave_the_others_distances_alone(key_lists):
    distances, offsets, num_distinct = distances_of(key_lists)
    keys = np.array([key for keys in key_lists for key in keys], dtype=np.int32)
    got, got_distinct = compact_distances(keys, offsets)
    assert got.tolist() == distances.tolist() and got_distinct == num_distinct


def assert_same_curve(fast, slow):
    assert np.array_equal(fast.distances.distances, slow.distances.distances)
    assert fast.distances.num_distinct_blocks == slow.distances.num_distinct_blocks
    sizes = slow.change_points()
    assert [r.as_row() for r in fast.results(sizes)] == [r.as_row() for r in slow.results(sizes)]
    for capacity in (1, int(sizes[len(sizes) // 2]), slow.ideal_capacity_blocks):
        a, b = slow.result_at(capacity), fast.result_at(capacity)
        assert a.as_row() == b.as_row() and np.array_equal(
            a.cached_tokens_per_request, b.cached_tokens_per_request
        )


@settings(max_examples=150, deadline=None)
@given(traces())
def test_the_vectorized_pass_gives_the_per_key_distances(requests):
    key_lists = [prompt.block_hashes for prompt in prepare_prompts(requests, BLOCK).prompts]
    distances, offsets, num_distinct = distances_of(key_lists)
    numbers = {}
    keys = np.array(
        [numbers.setdefault(key, len(numbers)) for keys in key_lists for key in keys], dtype=np.int32
    )
    got, got_distinct = compact_distances(keys, offsets)
    assert np.array_equal(got, distances) and got_distinct == num_distinct


def test_earlier_sums_against_the_definition():
    rng = np.random.default_rng(0)
    for _ in range(100):
        num_u, num_q = rng.integers(0, 40, size=2)
        t_u, v_u, s_u = rng.integers(0, 30, num_u), rng.integers(0, 60, num_u), rng.choice([-1, 1], num_u)
        t_q, v_q = rng.integers(0, 30, num_q), rng.integers(0, 60, num_q)
        want = [
            sum(s * (v - value) for t, v, s in zip(t_u, v_u, s_u) if t < time and v < value)
            for time, value in zip(t_q, v_q)
        ]
        assert earlier_sums(t_u, v_u, s_u, t_q, v_q).tolist() == want


@pytest.mark.parametrize(("block_size", "limit"), [(512, None), (1024, 3000), (256, 3000), (32, 600)])
def test_the_mooncake_trace_gives_todays_curve(shared_data, block_size, limit):
    path = shared_data / "mooncake" / "conversation_trace.jsonl"
    assert_same_curve(
        compact_hit_curve(path, "mooncake", block_size, limit),
        hit_curve(hash_id_trace(path, "mooncake", block_size, limit)),
    )


def test_a_hash_id_trace_with_late_lines_gives_todays_curve(tmp_path):
    """16-token ids in seconds, out of order (both sort stably), chats extending their parents."""
    path = chat_trace_file(tmp_path / "chats.jsonl", 300)
    for block_size in (16, 32):
        assert_same_curve(
            compact_hit_curve(path, "hash-ids", block_size),
            hit_curve(hash_id_trace(path, "hash-ids", block_size)),
        )


def test_a_generated_big_trace_through_the_command(tmp_path, kvbench):
    """``kvbench sim`` on a big_trace.py trace takes the arrays (no Python object a block) and
    writes the rows and the curve file today's path writes."""
    path = big_trace_file(tmp_path, 4_000, seed=2)
    code, out, err = kvbench("sim", path, "--sizes", "100,1000,10000", "--out", tmp_path / "a.parquet")
    assert code == 0, err
    slow = hit_curve(hash_id_trace(path, "mooncake", 512))
    rows = pq.read_table(tmp_path / "a.parquet").to_pylist()
    assert rows == [slow.result_at(c).as_row() for c in (100, 1000, 10000)]
    written = pq.read_table(tmp_path / "a.curve.parquet")
    assert written.to_pylist() == [r.as_row() for r in slow.results()]
    assert written.select(curve_table(slow, slow.change_points()).column_names).equals(
        pa.Table.from_pylist([r.as_row() for r in slow.results()])
    )


def test_ids_that_do_not_name_their_prefixes_go_to_the_line_reader(tmp_path, kvbench):
    """Id 7 after 8 in one line and first in another: equal ids, other prefixes. The arrays give
    ``None``; the command interns prefixes as before (same rows as ``hash_id_trace``)."""
    lines = [
        {"timestamp": t, "input_length": 1536, "output_length": 1, "hash_ids": ids}
        for t, ids in enumerate([[7, 8, 9], [8, 7, 9], [7, 8, 9], [8, 7, 5]])
    ]
    path = tmp_path / "odd.jsonl"
    path.write_text("".join(json.dumps(line) + "\n" for line in lines))
    assert compact_hit_curve(path, "mooncake", 512) is None
    code, _, err = kvbench("sim", path, "--sizes", "2,8", "--out", tmp_path / "odd.parquet")
    assert code == 0, err
    slow = hit_curve(hash_id_trace(path, "mooncake", 512))
    assert pq.read_table(tmp_path / "odd.parquet").to_pylist() == [slow.result_at(c).as_row() for c in (2, 8)]


@pytest.mark.parametrize(
    "bad",
    [
        '{"timestamp": 0, "input_length": 600, "output_length": 3, "hash_ids": [1, -2]}',
        '{"timestamp": 0, "input_length": 600, "output_length": 3, "hash_ids": [1]}',
        '{"timestamp": true, "input_length": 600, "output_length": 3, "hash_ids": [1, 2]}',
        '{"timestamp": 0, "input_length": 600, "output_length": 3}',
        "[1, 2]",
    ],
)
def test_a_bad_line_is_the_line_readers_error(tmp_path, kvbench, bad):
    good = '{"timestamp": 0, "input_length": 600, "output_length": 3, "hash_ids": [1, 2]}'
    path = tmp_path / "bad.jsonl"
    path.write_text(f"{good}\n{bad}\n{good}\n")
    assert compact_hit_curve(path, "mooncake", 512) is None
    code, _, err = kvbench("sim", path, "--out", tmp_path / "bad.parquet")
    assert (
        code == 2 and "bad.jsonl:2:" in err and len(err.strip().splitlines()) == 1 and "Traceback" not in err
    )


def test_a_long_curve_is_drawn_at_log_spaced_sizes():
    capacities = np.arange(1, 100_001, dtype=np.int64)
    rates = capacities / 100_000
    x, y = _drawn(capacities, rates)
    assert x.size <= MAX_DRAWN_POINTS + 1 and x[-1] == 100_000 and np.array_equal(y, x / 100_000)
    assert _drawn(capacities[:100], rates[:100])[0].size == 100
