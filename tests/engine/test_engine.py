"""The in-process engine (kvbench/engine/engine.py). CPU, short prompts, few output tokens.

Cache-on vs cache-off identity runs on the default model (fp32); the mechanics (pins, storage,
timings, sampling, errors) run on a scaled-down random Llama, so the file stays fast on 2 cores.
"""

from dataclasses import replace

import numpy as np
import pytest
import torch

from kvbench.cache.base import CacheConfig
from kvbench.cache.block_hash import HashConfig
from kvbench.engine.engine import CopyConfig, HFEngine
from kvbench.engine.kv import (
    blocks_to_kv,
    cache_to_kv,
    capacity_blocks_for_bytes,
    forward_argument_names,
    kv_to_blocks,
    kv_to_cache,
    storage_bytes,
)
from kvbench.engine.model import load_model
from kvbench.engine.sampling import SamplingParams
from kvbench.errors import InputError
from kvbench.request import Status

GREEDY = SamplingParams(max_tokens=4, ignore_eos=True)
BLOCK = 16


@pytest.fixture(scope="module")
def default():
    """The default model: 8 layers, hidden 512, cl100k vocabulary, fp32."""
    return load_model()


def random_ids(seed: int, num_tokens: int, vocab_size: int = 1000) -> list[int]:
    return np.random.default_rng(seed).integers(0, vocab_size, num_tokens).tolist()


def shared_prefix_prompts(num_shared=70, suffixes=(13, 40, 25, 58), vocab_size=100_000) -> list[list[int]]:
    shared = random_ids(0, num_shared, vocab_size)
    return [shared + random_ids(1 + i, n, vocab_size) for i, n in enumerate(suffixes)]


def engine_with_cache(loaded, capacity_blocks=256, **config) -> HFEngine:
    cache_fields = {k: config.pop(k) for k in ("kind", "block_size", "hash", "ttl_s") if k in config}
    cache = CacheConfig(
        capacity_blocks=capacity_blocks, block_size=cache_fields.pop("block_size", BLOCK), **cache_fields
    )
    return HFEngine(loaded, CopyConfig(cache=cache, **config))


def held_payloads(engine: HFEngine, prompt: list[int]) -> list[torch.Tensor]:
    """The payloads cached for ``prompt``'s blocks (looked up, then released)."""
    blocks = engine._hasher.prompt_blocks(prompt)
    match = engine.cache.lookup(blocks)
    try:
        return list(match.payloads)
    finally:
        engine.cache.release(match.handles)


def random_layers(num_layers=3, num_kv_heads=2, num_tokens=40, head_dim=8):
    shape = (1, num_kv_heads, num_tokens, head_dim)  # (batch, kv_heads, seq, head_dim)
    return [(torch.randn(shape), torch.randn(shape)) for _ in range(num_layers)]


def test_compat_layer_round_trips_kv_without_copying():
    layers = random_layers()
    cache = kv_to_cache(layers)
    assert cache.get_seq_length() == 40
    for (k, v), (k2, v2) in zip(layers, cache_to_kv(cache)):
        assert k2 is k and v2 is v
    assert cache_to_kv(kv_to_cache([])) == []


def test_compat_layer_names_the_installed_forward_arguments(loaded):
    cache_name, logits_name = forward_argument_names(loaded.model)
    assert cache_name in ("cache", "past_key_values")
    assert logits_name in ("logits_to_keep", "num_logits_to_keep")


def test_blocks_round_trip_and_own_exactly_their_bytes():
    layers = random_layers()
    blocks = kv_to_blocks(layers, 1, 4, block_size=8)
    assert [tuple(b.shape) for b in blocks] == [(3, 2, 2, 8, 8)] * 3  # (layers, 2, kv_heads, block, head_dim)
    for block in blocks:
        assert block.is_contiguous()
        assert block.untyped_storage().nbytes() == block.numel() * block.element_size()
    for (k, v), (k2, v2) in zip(layers, blocks_to_kv(blocks)):
        assert torch.equal(k2, k[:, :, 8:32]) and torch.equal(v2, v[:, :, 8:32])
    views = kv_to_blocks(layers, 1, 4, block_size=8, store_views=True)
    assert all(torch.equal(a, b) for a, b in zip(blocks, views))
    assert storage_bytes(views) == 3 * 2 * 2 * 40 * 8 * 4  # one stack of the whole request's KV


@pytest.mark.parametrize("model, kind", [("default", "hash"), ("loaded", "radix"), ("loaded", "hash")])
def test_cache_on_and_off_give_identical_greedy_outputs(request, model, kind):
    loaded = request.getfixturevalue(model)
    on, off = engine_with_cache(loaded, kind=kind), HFEngine(loaded)
    suffixes = (13, 40, 25) if model == "default" else (13, 40, 25, 58)
    prompts = shared_prefix_prompts(suffixes=suffixes, vocab_size=loaded.vocab_size)
    sampling = replace(GREEDY, max_tokens=3 if model == "default" else 6)
    for index, prompt in enumerate(prompts):
        warm, cold = on.generate(prompt, sampling), off.generate(prompt, sampling)
        assert warm.status is cold.status is Status.OK
        assert warm.output_token_ids == cold.output_token_ids, f"request {index}"
        assert warm.cached_prompt_tokens == (0 if index == 0 else 64)  # 70 shared, floored to blocks
        assert cold.cached_prompt_tokens == 0
    on.cache.check_invariants()
    assert on.cache.num_evictable_blocks == on.cache.num_cached_blocks  # nothing left pinned


@pytest.mark.parametrize("num_tokens", [64, 70])
def test_a_prompt_sent_twice_recomputes_its_last_token(loaded, num_tokens):
    engine = engine_with_cache(loaded)
    prompt = random_ids(5, num_tokens)
    first, second = engine.generate(prompt, GREEDY), engine.generate(prompt, GREEDY)
    assert first.cached_prompt_tokens == 0
    assert second.cached_prompt_tokens == (num_tokens - 1) // BLOCK * BLOCK < num_tokens
    assert first.num_inserted_blocks == num_tokens // BLOCK  # the last full block is stored too
    assert second.output_token_ids == first.output_token_ids


def test_an_exception_during_prefill_leaks_no_pin_and_inserts_nothing(loaded, monkeypatch):
    engine = engine_with_cache(loaded)
    prompts = shared_prefix_prompts(vocab_size=1000)
    engine.generate(prompts[0], GREEDY)
    cache = engine.cache
    num_cached, stats = cache.num_cached_blocks, replace(cache.stats)

    def broken_prefill(*args, **kwargs):
        raise RuntimeError("injected")

    monkeypatch.setattr(engine, "_prefill", broken_prefill)
    with pytest.raises(RuntimeError, match="injected"):
        engine.generate(prompts[1], GREEDY)  # hits 4 blocks, which lookup pinned
    assert cache.num_cached_blocks == num_cached
    assert cache.num_evictable_blocks == cache.num_cached_blocks
    assert cache.stats.num_inserted_blocks == stats.num_inserted_blocks
    assert cache.stats.num_hit_blocks == stats.num_hit_blocks + 4
    cache.check_invariants()


def test_a_cached_block_does_not_keep_the_request_alive(loaded):
    engine = engine_with_cache(loaded)
    prompt = random_ids(7, 100)
    engine.generate(prompt, GREEDY)
    block_bytes = loaded.kv_layout(BLOCK).bytes_per_block
    payloads = held_payloads(engine, prompt + [1])
    assert len(payloads) == 6
    for payload in payloads:
        assert payload.untyped_storage().nbytes() == block_bytes
    assert engine.held_kv_bytes() == engine.nominal_kv_bytes() == 6 * block_bytes


def test_store_views_keeps_the_whole_request_alive(loaded):
    engine = engine_with_cache(loaded, store_views=True)
    prompt = random_ids(7, 100)
    first = engine.generate(prompt, GREEDY)
    request_bytes = (100 + GREEDY.max_tokens - 1) * loaded.kv_layout(BLOCK).bytes_per_token
    for payload in held_payloads(engine, prompt + [1]):
        assert payload.untyped_storage().nbytes() == request_bytes
    assert engine.held_kv_bytes() == request_bytes > engine.nominal_kv_bytes()
    assert engine.generate(prompt, GREEDY).output_token_ids == first.output_token_ids  # views still work


def test_timings_are_consistent(loaded):
    engine = engine_with_cache(loaded)
    prompt = random_ids(9, 50)
    for _ in range(2):
        result = engine.generate(prompt, SamplingParams(max_tokens=5, ignore_eos=True))
        assert result.output_tokens == 5 and len(result.itl_ms) == 4
        assert 0 < result.prefill_ms <= result.ttft_ms <= result.e2e_ms
        assert result.tpot_ms == pytest.approx((result.e2e_ms - result.ttft_ms) / 4)
        assert result.tpot_ms == pytest.approx(sum(result.itl_ms) / 4)
        assert result.lookup_ms + result.kv_load_ms + result.prefill_ms <= result.ttft_ms
    single = engine.generate(prompt, SamplingParams(max_tokens=1))
    assert single.output_tokens == 1 and single.itl_ms == () and single.tpot_ms is None


def test_seeded_sampling_is_reproducible(loaded):
    engine = engine_with_cache(loaded)
    prompt = random_ids(11, 40)
    sampled = SamplingParams(max_tokens=6, temperature=1.0, top_p=0.9, seed=7, ignore_eos=True)
    first, again = engine.generate(prompt, sampled), engine.generate(prompt, sampled)
    assert again.cached_prompt_tokens == 32
    assert first.output_token_ids == again.output_token_ids
    other = engine.generate(prompt, replace(sampled, seed=8))
    assert other.output_token_ids != first.output_token_ids


def test_eos_ends_the_response_unless_ignored(loaded):
    prompt = random_ids(13, 40)
    first_token = HFEngine(loaded).generate(prompt, GREEDY).output_token_ids[0]
    engine = HFEngine(replace(loaded, eos_token_ids=(first_token,)))
    assert engine.generate(prompt, SamplingParams(max_tokens=4)).output_token_ids == (first_token,)
    assert engine.generate(prompt, SamplingParams(max_tokens=4, ignore_eos=True)).output_tokens == 4


def test_verify_records_output_matches_reference(loaded):
    engine = engine_with_cache(loaded, verify=True)
    results = [engine.generate(p, GREEDY) for p in shared_prefix_prompts(suffixes=(5, 20), vocab_size=1000)]
    assert [r.output_matches_reference for r in results] == [True, True]
    assert results[1].cached_prompt_tokens == 64
    assert engine_with_cache(loaded).generate(random_ids(1, 20), GREEDY).output_matches_reference is None


def test_salts_separate_namespaces(loaded):
    engine = engine_with_cache(loaded, salt="run-a")
    prompt = random_ids(15, 40)
    engine.generate(prompt, GREEDY)
    assert engine.generate(prompt, GREEDY, salt="tenant-b").cached_prompt_tokens == 0
    assert engine.generate(prompt, GREEDY, extra_keys=("lora-1",)).cached_prompt_tokens == 0
    assert engine.generate(prompt, GREEDY).cached_prompt_tokens == 32  # the run's salt again


def test_hash_settings_and_block_size_pass_through(loaded):
    engine = engine_with_cache(loaded, block_size=8, hash=HashConfig(algo="xxhash", hash_bits=64))
    prompt = random_ids(19, 41)
    first = engine.generate(prompt, GREEDY)
    second = engine.generate(prompt, GREEDY)
    assert second.cached_prompt_tokens == 40 and second.output_token_ids == first.output_token_ids
    assert engine.cache.num_cached_blocks == 5
    assert engine.held_kv_bytes() == 5 * loaded.kv_layout(8).bytes_per_block


def test_a_full_cache_refuses_blocks_without_leaking_pins(loaded):
    engine = engine_with_cache(loaded, capacity_blocks=3)
    prompts = shared_prefix_prompts(vocab_size=1000)
    reference = HFEngine(loaded)
    for prompt in prompts:
        expected = reference.generate(prompt, GREEDY).output_token_ids
        assert engine.generate(prompt, GREEDY).output_token_ids == expected
    assert engine.cache.num_cached_blocks == 3 and engine.cache.stats.num_refused_blocks > 0
    assert engine.cache.num_evictable_blocks == 3
    assert engine.held_kv_bytes() == engine.nominal_kv_bytes()  # evicted payloads were freed


def test_ideal_prefill_matches_the_cached_path(loaded):
    engine = engine_with_cache(loaded)
    prompt = random_ids(17, 60)
    engine.generate(prompt, GREEDY)
    warm = engine.generate(prompt, GREEDY)
    past = engine.compute_kv(prompt[:48])
    assert past[0][0].shape == (1, 2, 48, 64)  # (batch, kv_heads, seq, head_dim)
    token, elapsed_ms = engine.ideal_prefill(past, prompt[48:])
    assert token == warm.output_token_ids[0] and elapsed_ms > 0
    assert past[0][0].shape[2] == 48  # the ready-made past is not consumed: it can be reused


@pytest.mark.parametrize(
    "prompt, max_tokens, problem",
    [
        ([], 4, "empty prompt"),
        ([5, 100_277], 4, "vocabulary"),
        ([-1, 5], 4, "vocabulary"),
        ([7] * 8190, 8, "exceeds the model's context of 8192 tokens"),
    ],
)
def test_bad_requests_get_an_error_status(default, prompt, max_tokens, problem):
    engine = engine_with_cache(default)
    result = engine.generate(prompt, SamplingParams(max_tokens=max_tokens))
    assert result.status is Status.ERROR and problem in result.error
    assert result.output_tokens == 0 and result.ttft_ms is None
    assert engine.cache.stats.num_lookups == 0


def test_configs_reject_bad_values(loaded):
    with pytest.raises(ValueError):
        SamplingParams(max_tokens=0)
    with pytest.raises(ValueError):
        SamplingParams(top_p=0)
    with pytest.raises(ValueError):
        SamplingParams(temperature=-1)
    with pytest.raises(ValueError):
        CopyConfig(cache=4096)
    layout = loaded.kv_layout(BLOCK)
    assert layout.bytes_per_block == 16 * 2 * 2 * 2 * 64 * 4  # tokens x K,V x layers x heads x dim x fp32
    assert capacity_blocks_for_bytes(2**20, layout) == 32  # 1 MiB / 32 KiB blocks
    with pytest.raises(InputError, match="holds no block"):
        capacity_blocks_for_bytes(1000, layout)


def test_ttl_expires_blocks_on_the_injected_clock(loaded):
    now_s = [0.0]
    config = CopyConfig(cache=CacheConfig(capacity_blocks=64, ttl_s=10.0))
    engine = HFEngine(loaded, config, clock=lambda: now_s[0])
    prompt = random_ids(21, 40)
    engine.generate(prompt, GREEDY)
    now_s[0] = 5.0
    assert engine.generate(prompt, GREEDY).cached_prompt_tokens == 32
    now_s[0] = 16.0
    assert engine.generate(prompt, GREEDY).cached_prompt_tokens == 0
    assert engine.cache.stats.num_expired_blocks == 2
