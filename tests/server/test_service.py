"""The server's service over the in-process backend: every token an event as it exists, the same
tokens as the plain engine, and a cancelled stream releasing every pin and caching nothing."""

import asyncio

import numpy as np

from kvbench.cache.base import CacheConfig
from kvbench.engine.engine import CopyConfig, HFEngine, SamplingParams

PROMPT = np.arange(1000, 1040)  # 40 tokens: 2 full blocks of 16 may hit


async def events_of(service, sampling, salt=None, cancel_after=None):
    """Submit PROMPT and collect its events; cancel after ``cancel_after`` tokens."""
    generation = service.submit(service.request(PROMPT, sampling.max_tokens, salt, "r"), sampling)
    events = []
    while not events or events[-1][0] == "token":
        events.append(await generation.events.get())
        if cancel_after is not None and len(events) == cancel_after:
            generation.cancel()
    await generation.task
    return events


def test_tokens_arrive_one_by_one_and_match_the_plain_engine(service, tiny_loaded):
    sampling = SamplingParams(max_tokens=6, ignore_eos=True)
    events = asyncio.run(events_of(service, sampling))
    kind, record = events[-1]
    assert kind == "done" and [value for _, value in events[:-1]] == list(record.output_token_ids)
    assert len(events) == 7
    plain = HFEngine(tiny_loaded, CopyConfig(cache=CacheConfig(capacity_blocks=64))).generate(
        PROMPT, sampling
    )
    assert plain.output_token_ids == record.output_token_ids
    assert service.counters.num_succeeded == 1 and service.counters.num_queried_tokens == 40
    again = asyncio.run(events_of(service, SamplingParams(max_tokens=1)))
    assert again[-1][1].cached_prompt_tokens == 32 and service.counters.num_hit_tokens == 32


def test_cancelling_midway_releases_pins_and_caches_nothing(service):
    events = asyncio.run(events_of(service, SamplingParams(max_tokens=50, ignore_eos=True), cancel_after=2))
    assert events[-1] == ("cancelled", None) and len(events) <= 4
    cache = service.engine.cache
    cache.check_invariants()
    assert cache.num_cached_blocks == 0
    assert service.counters.num_succeeded == 0 and service.counters.num_in_flight == 0
    again = asyncio.run(events_of(service, SamplingParams(max_tokens=2)))
    assert again[-1][1].cached_prompt_tokens == 0 and again[-1][1].output_tokens == 2


def test_reset_waits_for_the_running_request_and_empties_the_cache(service):
    async def go():
        sampling = SamplingParams(max_tokens=8, ignore_eos=True)
        generation = service.submit(service.request(PROMPT, 8, None, "r"), sampling)
        await asyncio.sleep(0)  # the request takes the backend's lock first
        cleared = await service.reset_prefix_cache()
        kind, record = [event async for event in _drain(generation)][-1]
        return cleared, kind, record

    cleared, kind, record = asyncio.run(go())
    assert cleared is True and kind == "done" and record.output_tokens == 8
    assert service.engine.cache.num_cached_blocks == 0  # reset ran after the request inserted its blocks


async def _drain(generation):
    while True:
        event = await generation.events.get()
        yield event
        if event[0] != "token":
            return
