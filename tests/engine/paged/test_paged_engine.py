"""The paged engine (kvbench/engine/paged/): outputs, cache rules, pins, the vLLM predictor, memory.

Identity with the copy engine and the cache-off engine runs on the default model (fp32); the
mechanics run on a scaled-down random Llama with the same head layout.
"""

from concurrent.futures import CancelledError

import numpy as np
import pytest
from readiness import LIMIT_S

from kvbench.cache.base import CacheConfig
from kvbench.engine.engine import CopyConfig, HFEngine
from kvbench.engine.model import load_model
from kvbench.engine.paged.engine import PagedConfig, PagedEngine
from kvbench.engine.sampling import SamplingParams
from kvbench.request import Request, Status
from kvbench.sim.vllm_pool import VllmPoolConfig, simulate_vllm

GREEDY = SamplingParams(max_tokens=6, ignore_eos=True)


@pytest.fixture(scope="module")
def default():
    return load_model()


def ids(seed, n, vocab=1000):
    return np.random.default_rng(seed).integers(0, vocab, n).tolist()


def prompts_sharing(prefix_tokens, suffixes, vocab=1000):
    shared = ids(0, prefix_tokens, vocab)
    return [shared + ids(1 + i, n, vocab) for i, n in enumerate(suffixes)]


def paged(loaded, capacity=256, block_size=16, **config):
    return PagedEngine(loaded, PagedConfig(CacheConfig(capacity, block_size), **config))


def assert_clean(engine):
    engine.check_invariants()
    assert engine.scheduler.pool.num_used_blocks == 0  # nothing left pinned


@pytest.mark.parametrize("block_size", [16, 64])
def test_default_model_outputs_equal_copy_engine_and_cache_off(default, block_size):
    engine = paged(default, block_size=block_size)  # registers paged attention on the shared model first
    copy = HFEngine(default, CopyConfig(cache=CacheConfig(256, block_size)))
    off = HFEngine(default)
    sampling = SamplingParams(max_tokens=3, ignore_eos=True)
    prompts = prompts_sharing(140, (13, 40, 70), default.vocab_size)
    first = engine.generate(prompts[0], sampling)
    prompts.append(prompts[0] + list(first.output_token_ids) + ids(9, 30, default.vocab_size))  # a next turn
    for index, prompt in enumerate(prompts):
        record = first if index == 0 else engine.generate(prompt, sampling)
        assert record.status is Status.OK
        assert (
            record.output_token_ids
            == copy.generate(prompt, sampling).output_token_ids
            == off.generate(prompt, sampling).output_token_ids
        ), f"request {index}"
    # output blocks hit
    assert record.cached_prompt_tokens == (len(prompts[0]) + 2) // block_size * block_size
    assert_clean(engine)


def test_small_model_concurrency_1_exact_and_hits_are_block_floored(loaded):
    engine, off = paged(loaded), HFEngine(loaded)
    prompts = prompts_sharing(70, (13, 40, 25, 58, 290))
    for index, prompt in enumerate(prompts):
        record = engine.generate(prompt, GREEDY)
        assert record.output_token_ids == off.generate(prompt, GREEDY).output_token_ids
        assert record.cached_prompt_tokens == (0 if index == 0 else 64)
        assert record.kv_load_ms == 0.0 and record.ttft_ms <= record.e2e_ms
    again = engine.generate(prompts[1], GREEDY)
    assert again.cached_prompt_tokens == (len(prompts[1]) - 1) // 16 * 16  # the last token is recomputed
    assert_clean(engine)


def serial_outputs(loaded, prompts, sampling=GREEDY):
    off = HFEngine(loaded)
    return [off.generate(p, sampling).output_token_ids for p in prompts]


def test_concurrent_requests_batch_invariant_are_exact(loaded):
    prompts = prompts_sharing(50, (5, 17, 33, 64, 9, 80, 3, 41))
    engine = paged(loaded, batch_invariant=True)
    records = [f.result() for f in [engine.submit(p, GREEDY) for p in prompts]]
    assert [r.output_token_ids for r in records] == serial_outputs(loaded, prompts)
    assert_clean(engine)


def test_concurrent_requests_batched_agree_with_serial(loaded):
    """One packed forward over several sequences: GEMMs over more rows may round differently, so
    outputs may flip only at near-ties; on this model at fp32 none flips."""
    prompts = prompts_sharing(50, (5, 17, 33, 64, 9, 80, 3, 41))
    engine = paged(loaded)
    records = [f.result() for f in [engine.submit(p, GREEDY) for p in prompts]]
    assert [r.output_token_ids for r in records] == serial_outputs(loaded, prompts)
    assert_clean(engine)


def test_preemption_by_recompute_keeps_outputs(loaded):
    prompts = [ids(20 + i, 40) for i in range(4)]
    sampling = SamplingParams(max_tokens=20, ignore_eos=True)
    engine = paged(loaded, capacity=10, batch_invariant=True)  # 160 tokens: 4 x 59 do not fit at once
    records = [f.result() for f in [engine.submit(p, sampling) for p in prompts]]
    assert engine.scheduler.num_preemptions > 0
    assert [r.output_token_ids for r in records] == serial_outputs(loaded, prompts, sampling)
    assert_clean(engine)


def test_vllm_simulator_predicts_cached_tokens_at_concurrency_1(loaded):
    """A pool small enough to evict; prompts that reuse earlier prompts and outputs."""
    engine = paged(loaded, capacity=12, block_size=16)
    requests, outputs, cached = [], [], []
    prompts = prompts_sharing(48, (10, 30, 5, 60, 20))
    prompts += [prompts[0], prompts[3][:70]]
    for index, prompt in enumerate(prompts + [None]):
        if prompt is None:  # a next turn: the first prompt, its output, more
            prompt = prompts[0] + list(outputs[0]) + ids(7, 20)
        record = engine.generate(prompt, GREEDY)
        requests.append(
            Request(
                index=index,
                request_id=str(index),
                session_id=str(index),
                turn=0,
                token_ids=np.array(prompt, dtype=np.uint32),
                max_tokens=6,
                output_tokens=6,
            )
        )
        outputs.append(record.output_token_ids)
        cached.append(record.cached_prompt_tokens)
    predicted = simulate_vllm(requests, VllmPoolConfig(num_gpu_blocks=12 + 1, block_size=16), outputs)
    assert cached == predicted.cached_tokens.tolist()
    assert predicted.num_evicted_blocks > 0 and sum(cached) > 0


def test_eight_concurrent_requests_hold_the_prefix_once(loaded):
    prompts = prompts_sharing(160, (16,) * 8)
    engine = paged(loaded)
    engine.generate(prompts[0], SamplingParams(max_tokens=1))  # the prefix is cached
    peak = []

    def on_token(_):
        peak.append(engine.scheduler.pool.num_used_blocks)

    sampling = SamplingParams(max_tokens=4, ignore_eos=True)
    futures = [engine.submit(p, sampling, on_token=on_token) for p in prompts]
    assert all(f.result().cached_prompt_tokens == 160 for f in futures[1:])
    # 10 prefix blocks shared + per request its own tail block(s): 176 + 3 tokens = 12 blocks each
    assert max(peak) <= 10 + 8 * 2
    assert_clean(engine)


def test_on_token_error_and_abort_free_exactly_that_request(loaded):
    engine = paged(loaded)
    prompts = prompts_sharing(40, (10, 20, 30))

    def explode(_):
        raise RuntimeError("client went away")

    failing = engine.submit(prompts[0], GREEDY, on_token=explode)
    ok = engine.submit(prompts[1], GREEDY)
    with pytest.raises(RuntimeError, match="client went away"):
        failing.result()
    assert ok.result().status is Status.OK
    slow = engine.submit(prompts[2], SamplingParams(max_tokens=200, ignore_eos=True))
    engine.abort(slow)
    with pytest.raises(CancelledError):
        slow.result(timeout=LIMIT_S)
    assert slow.cancelled()
    engine.generate(prompts[2], GREEDY)  # still serving
    assert_clean(engine)


def test_a_failing_forward_fails_its_requests_and_frees_their_blocks(loaded, monkeypatch):
    engine = paged(loaded)
    original = engine._forward
    calls = []

    def flaky(group):
        calls.append(1)
        if len(calls) == 2:
            raise RuntimeError("out of memory")
        return original(group)

    monkeypatch.setattr(engine, "_forward", flaky)
    with pytest.raises(RuntimeError, match="out of memory"):
        engine.generate(ids(3, 50), GREEDY)
    assert_clean(engine)
    assert engine.generate(ids(3, 50), GREEDY).status is Status.OK


def test_bad_requests_and_settings_give_clear_errors(loaded):
    engine = paged(loaded, capacity=4)
    too_big = engine.generate(ids(1, 60), SamplingParams(max_tokens=20))
    assert too_big.status is Status.ERROR and "the KV pool has 4" in too_big.error
    assert engine.generate([], GREEDY).status is Status.ERROR
    assert "vocabulary" in engine.generate([5000], GREEDY).error
    with pytest.raises(ValueError, match="--max-num-seqs"):
        PagedConfig(CacheConfig(8), max_num_seqs=0)
    with pytest.raises(
        ValueError, match="--cache-kind radix --release head-first: .*exists only for the hash cache"
    ):
        CacheConfig(8, kind="radix", release_order="head-first")  # refused for every engine and cache


def test_prefix_caching_off_and_reset(loaded):
    engine = paged(loaded, prefix_caching=False)
    prompt = ids(4, 50)
    assert [engine.generate(prompt, GREEDY).cached_prompt_tokens for _ in range(2)] == [0, 0]
    cached = paged(loaded)
    cached.generate(prompt, GREEDY)
    cached.reset_prefix_cache()
    assert cached.generate(prompt, GREEDY).cached_prompt_tokens == 0


def test_ttl_expires_idle_pool_blocks_and_a_hit_restarts_the_timer(loaded):
    """--ttl on the paged engine: the copy engine's rule (tests/cache contract), on pool block ids."""
    now = [0.0]
    engine = PagedEngine(loaded, PagedConfig(CacheConfig(64, 16, ttl_s=300.0)), clock=lambda: now[0])
    reference = HFEngine(loaded, CopyConfig(cache=CacheConfig(64, 16, ttl_s=300.0)), clock=lambda: now[0])
    prompt, sampling = ids(7, 40), SamplingParams(max_tokens=2, ignore_eos=True)  # 41 computed: 2 blocks
    cached = []
    for now[0] in (0.0, 200.0, 450.0, 800.0):  # idle 200 s, 250 s (since the hit at 200), then 350 s
        record, copy = engine.generate(prompt, sampling), reference.generate(prompt, sampling)
        assert record.output_token_ids == copy.output_token_ids
        cached.append((record.cached_prompt_tokens, copy.cached_prompt_tokens))
    assert cached == [(0, 0), (32, 32), (32, 32), (0, 0)]  # paged == copy engine
    assert engine.scheduler.timer.num_expired_blocks == 2
    assert_clean(engine)
