"""``--verify`` on the paged engine (kvbench/engine/paged/verify.py): logits against the cache-off
engine, argmax flips near ties told from mismatches; real model, real forwards."""

import asyncio
import math
import time

import numpy as np
import pytest
import torch
from readiness import LIMIT_S, wait_until

from kvbench.backends.inprocess import InProcessBackend
from kvbench.cache.base import CacheConfig
from kvbench.engine.engine import HFEngine
from kvbench.engine.paged.engine import PagedConfig, PagedEngine
from kvbench.engine.paged.verify import TIE_TOLERANCE_NATS, compare_logprobs
from kvbench.engine.sampling import SamplingParams
from kvbench.request import Request

GREEDY = SamplingParams(max_tokens=6, ignore_eos=True)


def prompts(n=8, shared=50):
    rng = np.random.default_rng(0)
    prefix = rng.integers(0, 1000, shared).tolist()
    return [prefix + rng.integers(0, 1000, int(k)).tolist() for k in rng.integers(3, 80, n)]


def verified(loaded, **config):
    return PagedEngine(loaded, PagedConfig(CacheConfig(256, 16), verify=True, **config))


def test_compare_logprobs_tells_a_near_tie_from_a_mismatch():
    # (3 positions, vocab 3)
    logprobs = torch.log_softmax(
        torch.tensor(
            [
                [5.0, 5.0 - 4e-4, 0.0],  # token 1 a hair below token 0
                [5.0, 1.0, 0.0],  # token 2 far below
                [0.0, 3.0, 0.0],
            ]
        ),
        dim=-1,
    )
    chosen = [float(logprobs[0, 1]), float(logprobs[1, 2]) + 0.5, float(logprobs[2, 1])]
    check = compare_logprobs(logprobs, [1, 2, 1], chosen, tolerance_nats=1e-3)
    assert (check.num_compared_tokens, check.num_flips_near_ties, check.num_mismatches) == (3, 1, 1)
    assert check.max_abs_logprob_diff == pytest.approx(0.5, abs=1e-6) and not check.matches
    assert compare_logprobs(
        logprobs, [0, 0, 1], [float(logprobs[i, t]) for i, t in enumerate([0, 0, 1])], 1e-3
    ).matches
    with pytest.raises(ValueError):
        compare_logprobs(logprobs, [0, 0], [0.0, 0.0], 1e-3)


def test_reference_logprobs_argmax_is_the_greedy_cache_off_output(loaded):
    prompt = prompts(1)[0]
    output = HFEngine(loaded).generate(prompt, GREEDY).output_token_ids
    reference = HFEngine(loaded).reference_logprobs(prompt, output)  # (6, vocab)
    assert reference.shape == (6, 1000) and tuple(reference.argmax(-1).tolist()) == output


@pytest.mark.parametrize("batch_invariant", [False, True])
def test_batched_verify_compares_every_token_and_reports_the_counts(loaded, batch_invariant):
    engine = verified(loaded, batch_invariant=batch_invariant)
    records = [f.result() for f in [engine.submit(p, GREEDY) for p in prompts()]]
    report = engine.verify_report.as_dict()
    assert report["num_requests"] == 8 and report["num_compared_tokens"] == 8 * 6
    assert report["tie_tolerance_nats"] == TIE_TOLERANCE_NATS[torch.float32] == 1e-3
    # fp32 on this model: no flip, no mismatch; batched logits differ from cache-off only in the last bits
    assert report["num_flips_near_ties"] == report["num_mismatches"] == 0
    assert all(r.output_matches_reference is True for r in records)
    assert 0 <= report["max_abs_logprob_diff"] < 1e-4


def test_a_corrupted_cached_block_is_a_mismatch_not_a_tie(loaded):
    engine = verified(loaded)
    first, second = prompts(2)
    engine.generate(first, GREEDY)
    generator = torch.Generator().manual_seed(0)
    for values in engine.kv_pool.values:  # a wrong past: every pool block's values replaced by noise
        values.copy_(torch.randn(values.shape, generator=generator) * 100)
    record = engine.generate(second, GREEDY)  # hits the 3 shared blocks, now wrong
    assert record.cached_prompt_tokens == 48
    report = engine.verify_report.totals
    assert record.output_matches_reference is False and report.num_mismatches >= 1
    assert report.max_abs_logprob_diff > 1e-2 and math.isfinite(report.max_abs_logprob_diff)


def test_sampled_requests_keep_the_token_check(loaded):
    engine = verified(loaded)
    record = engine.generate(
        prompts(1)[0], SamplingParams(max_tokens=4, temperature=1.0, seed=3, ignore_eos=True)
    )
    assert record.output_matches_reference is True  # seeded sampling: a cache-off rerun gives the same tokens
    assert engine.verify_report.num_requests == 0  # no argmax to compare


def test_reference_passes_run_only_when_the_engine_is_idle(loaded, monkeypatch):
    """A verify run's TTFT / ITL must not include other requests' reference passes. No
    reference pass (timed by wrapping the real ``Verifier.check``) falls between any request's first
    and last token, so no measured step waited on one; without the deferral the first finished
    request's pass ran while 7 others were mid-decode (this test fails then)."""
    engine = verified(loaded)
    passes, token_s = [], {}
    real_check = type(engine._verifier).check

    def timed_check(self, *args, **kwargs):
        start_s = time.perf_counter()
        result = real_check(self, *args, **kwargs)
        passes.append((start_s, time.perf_counter()))
        return result

    monkeypatch.setattr(type(engine._verifier), "check", timed_check)
    lengths = (2, 4, 6, 8, 10, 12, 14, 16)  # requests finish at different steps: most are still running
    futures = [
        engine.submit(
            p,
            SamplingParams(max_tokens=n, ignore_eos=True),
            on_token=lambda _t, i=i: token_s.setdefault(i, []).append(time.perf_counter()),
        )
        for i, (p, n) in enumerate(zip(prompts(), lengths))
    ]
    records = [f.result() for f in futures]
    assert len(passes) == 8 and all(r.output_matches_reference is True for r in records)
    assert [r.output_tokens for r in records] == list(lengths)
    for stamps in token_s.values():  # no pass between any request's first and last token
        assert all(end <= stamps[0] or start >= stamps[-1] for start, end in passes)
    assert min(start for start, _ in passes) > max(stamps[-1] for stamps in token_s.values())


def test_aborting_a_request_whose_check_is_pending_returns_what_was_measured(loaded):
    """Ctrl-C during a verify run must not lose a request that finished generating while its check
    waited for the engine to go idle: ``abort`` hands its record back (unchecked, so
    ``output_matches_reference`` is ``None`` and it is not counted), the others are still checked."""
    engine = verified(loaded)
    short_prompt, long_prompt = prompts(2)
    long = engine.submit(long_prompt, SamplingParams(max_tokens=400, ignore_eos=True))
    short = engine.submit(short_prompt, SamplingParams(max_tokens=3, ignore_eos=True))
    wait_until(
        lambda: engine._verifier.num_deferred > 0 or long.done(), "short's check deferred", poll_s=0.001
    )
    assert not long.done() and not short.done()  # short finished generating; its check waits
    record = engine.abort(short)
    assert record is not None and record.output_tokens == 3 and record.output_matches_reference is None
    assert engine.abort(short) is None  # taken once
    assert long.result(timeout=LIMIT_S).output_matches_reference is True
    report = engine.verify_report
    assert (report.num_requests, report.totals.num_compared_tokens) == (1, 400)  # only the long one checked
    engine.wait_idle(60)
    engine.check_invariants()
    assert engine.scheduler.pool.num_used_blocks == 0


def test_a_cancelled_client_keeps_a_finished_request_whose_check_was_pending(loaded):
    """The backend side of the test above (what Ctrl-C does to a run's send loop): cancelling the
    task that awaits a request finished but unchecked returns its record instead of raising."""
    engine = verified(loaded)
    backend = InProcessBackend(engine, SamplingParams(ignore_eos=True), "default")
    short_prompt, long_prompt = prompts(2)
    long = engine.submit(long_prompt, SamplingParams(max_tokens=400, ignore_eos=True))

    async def cut_after_generation():
        task = asyncio.ensure_future(
            backend.serve(
                Request(
                    index=0,
                    request_id="0",
                    session_id="0",
                    turn=0,
                    token_ids=np.array(short_prompt, dtype=np.uint32),
                    max_tokens=3,
                )
            )
        )
        while engine._verifier.num_deferred == 0 and not long.done():
            await asyncio.sleep(0.001)
        task.cancel()
        return await task

    record = asyncio.run(cut_after_generation())
    assert not long.done() and record.output_tokens == 3 and record.output_matches_reference is None
    assert long.result(timeout=LIMIT_S).output_matches_reference is True
