"""The simulator: hit rates on workloads whose answers are known, and agreement between caches."""

import json

import numpy as np
import pytest

from kvbench.cache.base import CacheConfig
from kvbench.errors import InputError
from kvbench.request import Request
from kvbench.sim.replay import ideal_hit_rate, prepare_prompts, simulate, sweep
from kvbench.workloads.formats.mooncake import read_mooncake
from kvbench.workloads.token_ids import MultiPrefixConfig, multi_prefix_requests

RR_SMALL = MultiPrefixConfig(
    num_prefixes=2, prefix_tokens=32, unique_tokens=5, num_requests=10, popularity="rr"
)


def test_round_robin_with_room_for_every_prefix():
    trace = prepare_prompts(multi_prefix_requests(RR_SMALL), block_size=4)
    result = simulate(trace, CacheConfig(capacity_blocks=100, block_size=4))
    # 37-token prompts: the cap allows 9 blocks; 8 hold the shared prefix, the 9th has unique tokens.
    expected = [0, 0] + [32] * 8
    assert result.cached_tokens_per_request.tolist() == expected
    assert result.token_hit_rate == pytest.approx(256 / 370)
    assert result.block_hit_rate == pytest.approx(64 / 90)
    assert result.num_evicted_blocks == 0


def test_round_robin_is_lrus_worst_case():
    trace = prepare_prompts(multi_prefix_requests(RR_SMALL), block_size=4)
    result = simulate(trace, CacheConfig(capacity_blocks=9, block_size=4))  # room for one request
    assert result.num_cached_tokens == 0 and result.num_evicted_blocks > 0


def test_workload_is_deterministic_in_its_seed():
    first = multi_prefix_requests(MultiPrefixConfig(num_requests=20, seed=3))
    again = multi_prefix_requests(MultiPrefixConfig(num_requests=20, seed=3))
    other = multi_prefix_requests(MultiPrefixConfig(num_requests=20, seed=4))
    assert all(np.array_equal(a.token_ids, b.token_ids) for a, b in zip(first, again))
    assert not all(np.array_equal(a.token_ids, b.token_ids) for a, b in zip(first, other))


def test_zipf_popularity_follows_the_weights():
    from kvbench.workloads.token_ids import prefix_choices, zipf_weights

    config = MultiPrefixConfig(num_requests=20000, zipf_exponent=0.9)
    counts = np.bincount(prefix_choices(config, np.random.default_rng(0)), minlength=8) / 20000
    assert counts == pytest.approx(zipf_weights(8, 0.9), abs=0.01)
    assert zipf_weights(8, 0.9)[0] / zipf_weights(8, 0.9)[1] == pytest.approx(2**0.9)


@pytest.fixture(scope="module")
def zipf_trace():
    config = MultiPrefixConfig(num_prefixes=8, prefix_tokens=256, unique_tokens=20, num_requests=300)
    return prepare_prompts(multi_prefix_requests(config), block_size=16, keep_tokens=True)


def test_head_first_never_beats_tail_first_and_loses_somewhere(zipf_trace):
    results = sweep(
        zipf_trace, CacheConfig(capacity_blocks=1), [20, 40, 80, 160], ["tail-first", "head-first"]
    )
    by_size = {}
    for r in results:
        by_size.setdefault(r.capacity_blocks, {})[r.release_order] = r.token_hit_rate
    assert all(rates["head-first"] <= rates["tail-first"] for rates in by_size.values())
    assert any(rates["head-first"] < rates["tail-first"] - 0.03 for rates in by_size.values())


def test_hash_and_radix_caches_agree(zipf_trace):
    for capacity in (20, 40, 80, 1000):
        hashed = simulate(zipf_trace, CacheConfig(capacity_blocks=capacity, block_size=16))
        radix = simulate(zipf_trace, CacheConfig(capacity_blocks=capacity, block_size=16, kind="radix"))
        assert radix.cached_tokens_per_request.tolist() == hashed.cached_tokens_per_request.tolist()


def test_parallel_sweep_equals_serial(zipf_trace):
    args = (zipf_trace, CacheConfig(capacity_blocks=1, block_size=16), [20, 80], ["tail-first", "head-first"])
    serial = [r.as_row() for r in sweep(*args)]
    parallel = [r.as_row() for r in sweep(*args, num_workers=2)]
    assert serial == parallel


def test_hit_rate_grows_with_capacity_up_to_the_ideal(zipf_trace):
    rates = [
        r.token_hit_rate
        for r in sweep(zipf_trace, CacheConfig(capacity_blocks=1, block_size=16), [20, 40, 80, 160, 10000])
    ]
    assert rates == sorted(rates)
    assert rates[-1] == pytest.approx(ideal_hit_rate(zipf_trace).token_hit_rate)


def test_ttl_acts_on_arrival_time():
    tokens = np.arange(64, dtype=np.uint32)
    requests = [
        Request(i, f"r{i}", f"r{i}", 0, tokens, arrival_s=t) for i, t in enumerate((0.0, 10.0, 100.0))
    ]
    trace = prepare_prompts(requests, block_size=16)
    result = simulate(trace, CacheConfig(capacity_blocks=100, block_size=16, ttl_s=30))
    assert result.cached_tokens_per_request.tolist() == [0, 48, 0]  # idle 90 s > 30 s: expired
    assert result.num_expired_blocks == 4


def test_block_size_mismatch_is_refused(zipf_trace):
    with pytest.raises(ValueError, match="block size"):
        simulate(zipf_trace, CacheConfig(capacity_blocks=10, block_size=64))


def write_lines(path, records):
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    return path


def test_mooncake_equal_hash_ids_give_equal_tokens(tmp_path):
    path = write_lines(
        tmp_path / "t.jsonl",
        [
            {"timestamp": 0, "input_length": 1100, "output_length": 5, "hash_ids": [7, 8, 9]},
            {"timestamp": 5, "input_length": 1030, "output_length": 5, "hash_ids": [7, 8, 10]},
            {"timestamp": 9, "input_length": 600, "output_length": 5, "hash_ids": [7, 11]},
        ],
    )
    first, second, third = read_mooncake(path)
    assert first.num_tokens == 1100 and second.arrival_s == 0.005
    assert np.array_equal(first.token_ids[:1024], second.token_ids[:1024])
    assert not np.array_equal(first.token_ids[1024:1030], second.token_ids[1024:1030])
    common = int(np.argmin(first.token_ids[:600] == third.token_ids[:600]))
    assert common == 512  # exactly the first block is shared
    trace = prepare_prompts([first, second, third], block_size=512)
    result = simulate(trace, CacheConfig(capacity_blocks=100, block_size=512))
    assert result.cached_tokens_per_request.tolist() == [0, 1024, 512]


@pytest.mark.parametrize(
    "record,field",
    [
        ({"timestamp": 0, "input_length": 10, "output_length": 1}, "hash_ids"),
        ({"timestamp": 0, "input_length": 1000, "output_length": 1, "hash_ids": [1]}, "hash_ids"),
        ({"timestamp": -1, "input_length": 10, "output_length": 1, "hash_ids": [1]}, "timestamp"),
        ({"timestamp": 0, "input_length": "10", "output_length": 1, "hash_ids": [1]}, "input_length"),
    ],
)
def test_mooncake_bad_lines_name_file_line_and_field(tmp_path, record, field):
    good = {"timestamp": 0, "input_length": 10, "output_length": 1, "hash_ids": [1]}
    path = write_lines(tmp_path / "bad.jsonl", [good, record])
    with pytest.raises(InputError) as error:
        read_mooncake(path)
    assert str(error.value).startswith(f"{path}:2: field '{field}'")


def test_mooncake_conversation_trace_replays(shared_data):
    requests = read_mooncake(shared_data / "mooncake" / "conversation_trace.jsonl", limit=300)
    trace = prepare_prompts(requests, block_size=512)
    small, large = sweep(trace, CacheConfig(capacity_blocks=1, block_size=512), [50, 100000])
    assert 0 < small.token_hit_rate < large.token_hit_rate
    assert large.token_hit_rate == pytest.approx(ideal_hit_rate(trace).token_hit_rate)
