"""The paged engine with ``--cache-kind radix`` (kvbench/cache/block_index.py): outputs, cached tokens
against the copy engine's radix cache and the pool simulator's radix mode, hash vs radix, n > 1 under
--max-num-seqs. Identity runs on the default model (fp32); the mechanics on the small random Llama."""

import numpy as np
import pytest

from kvbench.cache.base import CacheConfig
from kvbench.engine.engine import CopyConfig, HFEngine
from kvbench.engine.model import load_model
from kvbench.engine.paged.engine import PagedConfig, PagedEngine
from kvbench.engine.sampling import SamplingParams
from kvbench.request import Request, Status
from kvbench.sim.vllm_pool import VllmPoolConfig, simulate_vllm

GREEDY = SamplingParams(max_tokens=6, ignore_eos=True)


def ids(seed, n, vocab=1000):
    return np.random.default_rng(seed).integers(0, vocab, n).tolist()


def paged(loaded, capacity=256, block_size=16, kind="radix", **config):
    return PagedEngine(loaded, PagedConfig(CacheConfig(capacity, block_size, kind=kind), **config))


def request(index, prompt, max_tokens):
    return Request(
        index=index,
        request_id=str(index),
        session_id="s",
        turn=index,
        token_ids=np.array(prompt, dtype=np.uint32),
        max_tokens=max_tokens,
        output_tokens=max_tokens,
    )


def assert_clean(engine):
    engine.check_invariants()
    assert engine.scheduler.pool.num_used_blocks == 0


def test_default_model_radix_outputs_equal_copy_radix_and_cache_off():
    default = load_model()
    engine = paged(default)  # registers paged attention on the model first
    copy, off = HFEngine(default, CopyConfig(cache=CacheConfig(256, 16, kind="radix"))), HFEngine(default)
    sampling = SamplingParams(max_tokens=3, ignore_eos=True)
    shared = ids(0, 140, default.vocab_size)
    prompts = [shared + ids(1 + i, n, default.vocab_size) for i, n in enumerate((13, 40, 70))]
    first = engine.generate(prompts[0], sampling)
    prompts.append(prompts[0] + list(first.output_token_ids) + ids(9, 30, default.vocab_size))  # a next turn
    # ends on a block boundary inside the cached prefix: recomputed, deduplicated
    prompts.append(prompts[1][:160])
    for index, prompt in enumerate(prompts):
        record = first if index == 0 else engine.generate(prompt, sampling)
        reference = copy.generate(prompt, sampling)
        assert record.status is Status.OK
        assert (
            record.output_token_ids
            == reference.output_token_ids
            == off.generate(prompt, sampling).output_token_ids
        )
        assert record.cached_prompt_tokens == reference.cached_prompt_tokens, f"request {index}"
    assert engine.scheduler.index.num_deduplicated_blocks >= 1
    assert_clean(engine)


def multi_turn(engine, feed_outputs, num_sessions=3, num_turns=4, max_tokens=6):
    """Interleaved conversations: each turn is the previous prompt, an answer and a new message. The
    answer is the engine's output (``feed_outputs``) or, as in a trace replay, the trace's own tokens
    of the same length. After turn 1 a prompt cut to 2 blocks of an earlier one is sent (recomputed
    block 1: deduplicated by radix). Returns (requests, outputs, cached tokens)."""
    history = {s: ids(100 + s, 20 + 9 * s) for s in range(num_sessions)}
    requests, outputs, cached = [], [], []
    sampling = SamplingParams(max_tokens=max_tokens, ignore_eos=True)

    def send(prompt):
        record = engine.generate(prompt, sampling)
        requests.append(request(len(requests), prompt, max_tokens))
        outputs.append(record.output_token_ids)
        cached.append(record.cached_prompt_tokens)
        return list(record.output_token_ids) if feed_outputs else ids(500 + len(requests), max_tokens)

    for turn in range(num_turns):
        for session in range(num_sessions):
            answer = send(history[session])
            history[session] = history[session] + answer + ids(7 * turn + session, 11 + 5 * session)
        if turn == 1:
            send(requests[-1].token_ids.tolist()[:32])
    return requests, outputs, cached


@pytest.mark.parametrize("feed_outputs", [True, False], ids=["outputs-in-prompts", "trace-replay"])
def test_pool_simulator_radix_mode_predicts_every_request_under_eviction(loaded, feed_outputs):
    """Request by request, with the outputs given (they come back in later prompts) and, for a trace
    replay, with placeholders (what ``kvbench run`` predicts from)."""
    engine = paged(loaded, capacity=14)
    requests, outputs, cached = multi_turn(engine, feed_outputs)
    config = VllmPoolConfig(num_gpu_blocks=14 + 1, block_size=16, kind="radix")
    predicted = simulate_vllm(requests, config, outputs if feed_outputs else None)
    assert cached == predicted.cached_tokens.tolist()
    assert predicted.num_evicted_blocks > 0 and sum(cached) > 0
    assert engine.scheduler.index.num_deduplicated_blocks > 0
    assert_clean(engine)


@pytest.mark.parametrize("kind, last_hit_tokens", [("hash", 16), ("radix", 32)])
def test_hash_and_radix_differ_at_concurrency_1_and_each_is_predicted(loaded, kind, last_hit_tokens):
    """A 4-block pool: a 48-token prompt, a 16-token prompt three times (capped at 0 blocks, computed
    again each time: hash keeps every copy, radix frees them), then the first prompt extended."""
    engine = paged(loaded, capacity=4, kind=kind)
    long, short = ids(1, 48), ids(2, 16)
    prompts = [long, short, short, short, long + ids(3, 16)]
    sampling = SamplingParams(max_tokens=1, ignore_eos=True)
    cached = [engine.generate(p, sampling).cached_prompt_tokens for p in prompts]
    assert cached == [0, 0, 0, 0, last_hit_tokens]
    predicted = simulate_vllm(
        [request(i, p, 1) for i, p in enumerate(prompts)],
        VllmPoolConfig(num_gpu_blocks=5, block_size=16, kind=kind),
    )
    assert cached == predicted.cached_tokens.tolist()
    assert_clean(engine)


def test_concurrent_radix_requests_share_the_prefix_and_match_serial(loaded):
    shared = ids(0, 160)
    prompts = [shared + ids(1 + i, 16) for i in range(8)]
    engine = paged(loaded)
    records = [f.result() for f in [engine.submit(p, GREEDY) for p in prompts]]
    off = HFEngine(loaded)
    assert [r.output_token_ids for r in records] == [
        off.generate(p, GREEDY).output_token_ids for p in prompts
    ]
    assert sum(r.cached_prompt_tokens for r in records) == 7 * 160  # the prefix computed once
    assert_clean(engine)


def test_samples_past_max_num_seqs_wait_and_hit_the_prompt(loaded):
    engine = paged(loaded, max_num_seqs=2, kind="radix")
    running = []
    schedule = engine.scheduler.schedule
    engine.scheduler.schedule = lambda: (running.append(len(engine.scheduler.running)), schedule())[1]
    prompt = ids(5, 40)
    records = [f.result() for f in engine.submit_samples(prompt, GREEDY, 4)]
    expected = HFEngine(loaded).generate(prompt, GREEDY).output_token_ids
    assert [r.status for r in records] == [Status.OK] * 4
    assert all(r.output_token_ids == expected for r in records)  # greedy: every sample is the same
    assert max(running) == 2
    # admitted later: the prompt's blocks hit
    assert [r.cached_prompt_tokens for r in records[2:]] == [
        32,
        32,
    ]
    assert_clean(engine)
