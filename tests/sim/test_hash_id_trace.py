"""Keys from a hash-id trace's ids give the same trace as synthesizing tokens and hashing them."""

import numpy as np
import pytest
from curve_traces import chat_trace_file

from kvbench.cache.base import CacheConfig, CacheKind
from kvbench.cache.block_hash import HashConfig
from kvbench.errors import InputError
from kvbench.run.source import load_source
from kvbench.sim.curve import hit_curve
from kvbench.sim.hash_id_trace import hash_id_refusal, hash_id_trace
from kvbench.sim.replay import prepare_prompts
from kvbench.sim.ttl_curve import ttl_curve
from kvbench.workloads.formats.hash_id_keys import ChainKeys, key_refusal


def assert_same_trace(fast, slow):
    """Same requests, token counts, arrivals, and one-pass distances at every block."""
    assert [p.num_tokens for p in fast.prompts] == [p.num_tokens for p in slow.prompts]
    assert np.array_equal(fast.arrivals_s, slow.arrivals_s)
    exact, streamed = hit_curve(slow), hit_curve(fast)
    assert np.array_equal(streamed.distances.distances, exact.distances.distances)
    assert streamed.distances.num_distinct_blocks == exact.distances.num_distinct_blocks
    sizes = exact.change_points()
    assert [r.as_row() for r in streamed.results(sizes)] == [r.as_row() for r in exact.results(sizes)]


@pytest.mark.parametrize(("block_size", "limit"), [(512, None), (1024, 3000), (256, 3000), (32, 600)])
def test_the_mooncake_conversation_trace_reads_the_same(shared_data, block_size, limit):
    path = shared_data / "mooncake" / "conversation_trace.jsonl"
    fast = hash_id_trace(path, "mooncake", block_size, limit)
    slow = prepare_prompts(load_source(path, limit=limit).requests, block_size)
    assert fast.num_requests == (limit or 12_031)
    assert_same_trace(fast, slow)


def test_a_hash_id_trace_with_sessions_and_late_lines_reads_the_same(tmp_path):
    """16-token ids, timestamps in seconds, out of order (both paths sort stably), a shared system
    prompt, multi-turn chats, a prompt shorter than a block and one cut mid-id."""
    path = chat_trace_file(tmp_path / "chats.jsonl", 200)
    for block_size in (16, 32):
        fast = hash_id_trace(path, "hash-ids", block_size)
        assert_same_trace(fast, prepare_prompts(load_source(path).requests, block_size))
        ttl_fast, ttl_slow = (
            ttl_curve(fast),
            ttl_curve(prepare_prompts(load_source(path).requests, block_size)),
        )
        assert ttl_fast.rows() == ttl_slow.rows()


def test_keys_are_interned_id_prefixes():
    keys = ChainKeys(512, 512)
    a = keys.prompt_blocks([([7, 8, 9], 1536), ([7, 8, 5], 1300), ([8, 7], 1024)])
    assert a[0].block_hashes[:2] == a[1].block_hashes[:2]  # the first two ids (1,024 tokens) agree
    assert len(a[1].block_hashes) == 2  # 1,300 tokens: two full blocks, the third id is cut
    assert not set(a[2].block_hashes) & set(a[0].block_hashes)  # same ids, other order: other prefixes
    assert keys.num_nodes == 5  # (7) (7,8) (7,8,9) (8) (8,7): the second prompt's cut third id is not a block
    assert all(len(key) == 8 for prompt in a for key in prompt.block_hashes)


def test_block_sizes_that_cut_ids_elsewhere_are_refused():
    assert key_refusal(512, 512) is None and key_refusal(1536, 512) is None and key_refusal(16, 512) is None
    assert "neither a multiple nor a divisor" in key_refusal(100, 512)
    assert key_refusal(8, 512) is not None  # an 8-token block could be two ids' identical tokens
    with pytest.raises(ValueError, match="block size 100"):
        ChainKeys(100, 512)
    hash_512 = CacheConfig(capacity_blocks=1, block_size=512)
    assert hash_id_refusal(hash_512, "mooncake") is None
    assert "radix" in hash_id_refusal(
        CacheConfig(capacity_blocks=1, block_size=512, kind=CacheKind.RADIX), "mooncake"
    )
    assert "truncated" in hash_id_refusal(
        CacheConfig(capacity_blocks=1, block_size=512, hash=HashConfig(hash_bits=16)), "mooncake"
    )
    assert "no block ids" in hash_id_refusal(hash_512, "kvbench-trace")


def test_a_malformed_line_names_the_file_line_and_field(tmp_path):
    path = tmp_path / "bad.jsonl"
    path.write_text(
        '{"timestamp": 0, "input_length": 600, "output_length": 1, "hash_ids": [1, 2]}\n'
        '{"timestamp": 1, "input_length": 600, "output_length": 1, "hash_ids": [1]}\n'
    )
    with pytest.raises(InputError, match=r"bad.jsonl:2: field 'hash_ids': 1 ids for input_length 600"):
        hash_id_trace(path, "mooncake", 512)
