"""StreamingEngine: every token reported as it exists, cancellation releases every pin."""

import numpy as np
import pytest

from kvbench.cache.base import CacheConfig
from kvbench.engine.engine import EngineConfig, HFEngine, SamplingParams
from kvbench.server.engine_stream import StreamCancelled, StreamingEngine

PROMPT = np.arange(1000, 1040)  # 40 tokens: 2 full blocks of 16 may hit


def test_tokens_arrive_one_by_one_and_match_the_plain_engine(tiny_loaded):
    engine = StreamingEngine(tiny_loaded, EngineConfig(cache=CacheConfig(capacity_blocks=64)))
    sampling = SamplingParams(max_tokens=6, ignore_eos=True)
    seen = []
    result = engine.generate_streaming(PROMPT, sampling, None, "r0", seen.append)
    assert tuple(seen) == result.output_token_ids
    plain = HFEngine(tiny_loaded, EngineConfig(cache=CacheConfig(capacity_blocks=64))).generate(PROMPT, sampling)
    assert plain.output_token_ids == result.output_token_ids


def test_cancelling_midway_releases_pins_and_caches_nothing(tiny_loaded):
    engine = StreamingEngine(tiny_loaded, EngineConfig(cache=CacheConfig(capacity_blocks=64)))
    sampling = SamplingParams(max_tokens=50, ignore_eos=True)

    def stop_after_two(token_id, seen=[]):
        seen.append(token_id)
        if len(seen) == 2:
            raise StreamCancelled

    with pytest.raises(StreamCancelled):
        engine.generate_streaming(PROMPT, sampling, None, "r0", stop_after_two)
    engine.cache.check_invariants()
    assert engine.cache.num_cached_blocks == 0
    again = engine.generate_streaming(PROMPT, SamplingParams(max_tokens=2), None, "r1", lambda token_id: None)
    assert again.cached_prompt_tokens == 0 and again.output_tokens == 2


def test_verify_is_refused(tiny_loaded):
    with pytest.raises(ValueError, match="verify"):
        StreamingEngine(tiny_loaded, EngineConfig(verify=True))
