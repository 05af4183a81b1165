"""``kvbench serve --kv-events``: the event stream, replayed by a real SUB socket into a block map after
every request, equals what the cache holds (``GET /kv_blocks``), on both engines."""

import json
import urllib.request
from collections import Counter

import numpy as np
import pytest
from readiness import wait_until
from serve_process import ServeProcess

from kvbench.events.blockmap import FleetBlocks
from kvbench.events.discover import sources_of_server
from kvbench.events.subscriber import Subscriber

pytestmark = [pytest.mark.server, pytest.mark.slow]


def get(root: str, path: str) -> dict:
    with urllib.request.urlopen(root + path, timeout=30) as response:
        return json.loads(response.read())


def complete(root: str, prompt: list[int], max_tokens: int = 3) -> dict:
    model = get(root, "/v1/models")["data"][0]["id"]
    body = json.dumps({"model": model, "prompt": prompt, "max_tokens": max_tokens, "ignore_eos": True})
    request = urllib.request.Request(
        root + "/v1/completions", body.encode(), {"Content-Type": "application/json"}
    )
    with urllib.request.urlopen(request, timeout=300) as response:
        return json.loads(response.read())


def held(root: str) -> dict[str, Counter]:
    blocks = get(root, "/kv_blocks")["blocks"]
    return {medium: Counter(hashes) for medium, hashes in blocks.items() if hashes}


def replayed(fleet: FleetBlocks, name: str, media: list[str]) -> dict[str, Counter]:
    replica = fleet.replica(name)
    return {m: c for m in media if (c := replica.hashes(m))}


def caught_up(subscriber: Subscriber, fleet: FleetBlocks, expected: dict[str, Counter]) -> bool:
    subscriber.poll(0.05)
    return replayed(fleet, "replica", ["GPU", "CPU"]) == expected


def prompts(num: int, seed: int = 0) -> list[list[int]]:
    """Three shared 40-token system prompts + a distinct question: hits, new blocks and evictions."""
    rng = np.random.default_rng(seed)
    systems = [rng.integers(10, 5000, 40).tolist() for _ in range(3)]
    return [systems[i % 3] + rng.integers(10, 5000, 12 + i % 5).tolist() for i in range(num)]


def check_stream_matches_cache(
    serve_args: tuple[str, ...],
    num_requests: int,
    encoding: str = "tagged",
    media: tuple[str, ...] = ("GPU",),
):
    server = ServeProcess(
        "--kv-events",
        "tcp://127.0.0.1:0",
        "--kv-events-encoding",
        encoding,
        "--block-size",
        "16",
        *serve_args,
    )
    try:
        root = server.url.removesuffix("/v1")
        (source,) = sources_of_server(root, "replica")
        assert source.endpoint.startswith("tcp://127.0.0.1:") and source.replay_endpoint
        fleet = FleetBlocks()
        notes: list[str] = []
        subscriber = Subscriber(
            [source], lambda name, seq, batch: fleet.apply(name, seq, batch, 0.0), notes.append
        )
        seen: set[str] = set()
        try:
            for prompt in prompts(num_requests):
                complete(root, prompt)
                expected = held(root)
                seen |= set(expected)
                wait_until(
                    lambda expected=expected: caught_up(subscriber, fleet, expected),
                    f"the replayed map to equal the cache: {expected}",
                    limit_s=20,
                )
            assert seen == set(media)
            num_evicted = fleet.replica("replica").num_removed_blocks
            assert num_evicted > 0  # the small cache evicted while serving, not only at the reset
            server.reset_prefix_cache()
            wait_until(lambda: (subscriber.poll(0.05), not fleet.replica("replica").held)[1], "cleared")
        finally:
            subscriber.close()
        replica = fleet.replica("replica")
        assert replica.num_stored_blocks > 0 and replica.num_removed_blocks > 0
        assert notes == []
    finally:
        server.stop()


def test_copy_engine_stream_equals_the_hash_cache_after_every_request():
    check_stream_matches_cache(("--cache-size", "12"), 8)


def test_paged_engine_stream_equals_the_pool_and_host_tier_after_every_request():
    check_stream_matches_cache(
        ("--engine", "paged", "--cache-size", "12", "--host-tier", "20"), 8, "positional", ("GPU", "CPU")
    )
