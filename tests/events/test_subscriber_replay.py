"""The subscriber against real ZMQ publishers on loopback: both encodings, a late join replayed, a gap
the replay buffer no longer covers said lost, duplicated blocks across replicas counted by content,
and ``kvbench events watch --once`` printing them."""

import subprocess
import sys
import time

import pytest

from kvbench.events.blockmap import FleetBlocks
from kvbench.events.publisher import EventPublisher, PublisherConfig
from kvbench.events.subscriber import EventSource, Subscriber
from kvbench.events.wire import BlockRemoved, BlockStored, Encoding

BLOCK = 4


def publisher(encoding=Encoding.TAGGED, buffer_steps=100) -> EventPublisher:
    config = PublisherConfig("tcp://127.0.0.1:0", "tcp://127.0.0.1:0", "kv", buffer_steps, encoding=encoding)
    return EventPublisher(config)


def source(name: str, pub: EventPublisher) -> EventSource:
    return EventSource(name, pub.endpoint, pub.replay_endpoint, "kv")


def store_chain(pub: EventPublisher, seed: int, blocks: list[list[int]]) -> list[int]:
    """One batch per block, a chain; hashes differ per ``seed`` as each server salts its own."""
    hashes, parent = [], None
    for index, tokens in enumerate(blocks):
        block_hash = seed * 1000 + index
        pub.publish(BlockStored((block_hash,), parent, tuple(tokens), BLOCK, "GPU"))
        assert pub.flush()
        hashes.append(block_hash)
        parent = block_hash
    return hashes


def read_until(subscriber: Subscriber, ready, limit_s: float = 10.0) -> None:
    deadline = time.monotonic() + limit_s
    while not ready():
        assert time.monotonic() < deadline, "timed out"
        subscriber.poll(0.05)


@pytest.mark.parametrize("encoding", list(Encoding))
def test_a_late_subscriber_replays_the_missed_batches_and_says_so(encoding):
    pub = publisher(encoding)
    try:
        hashes = store_chain(pub, 1, [[1, 2, 3, 4], [5, 6, 7, 8], [9, 10, 11, 12]])
        fleet, notes = FleetBlocks(), []
        sub = Subscriber([source("a", pub)], lambda n, s, b: fleet.apply(n, s, b, 0.0), notes.append, False)
        try:
            time.sleep(0.3)  # the SUB socket is connected before the next batch
            pub.publish(BlockRemoved((hashes[-1],), "GPU"))
            read_until(sub, lambda: fleet.replica("a").last_seq == 3)
        finally:
            sub.close()
        assert notes == ["a: batches 0..2 missed; replaying", "a: recovered 3 batches by replay"]
        assert dict(fleet.replica("a").hashes("GPU")) == {hashes[0]: 1, hashes[1]: 1}
        assert sub.states[0].num_gaps == 1 and sub.states[0].num_lost_batches == 0
    finally:
        pub.close()


def test_batches_gone_from_the_replay_buffer_are_said_lost():
    pub = publisher(buffer_steps=2)
    try:
        store_chain(pub, 1, [[1, 2, 3, 4], [5, 6, 7, 8], [9, 10, 11, 12], [13, 14, 15, 16]])
        notes = []
        sub = Subscriber([source("a", pub)], lambda n, s, b: None, notes.append, False)
        try:
            time.sleep(0.3)
            pub.publish(BlockRemoved((1000,), "GPU"))
            read_until(sub, lambda: sub.states[0].last_seq == 4)
        finally:
            sub.close()
        # the buffer keeps batches 3 and 4 (the live one): 0..2 are gone, 3 is recovered
        assert notes == [
            "a: batches 0..3 missed; replaying",
            "a: 3 batches no longer in the replay buffer: lost",
            "a: recovered 1 batches by replay",
        ]
        assert sub.states[0].num_lost_batches == 3
    finally:
        pub.close()


def test_duplicated_blocks_are_counted_by_content_across_replicas():
    shared = [[1, 2, 3, 4], [5, 6, 7, 8]]
    pubs = [publisher(), publisher(Encoding.POSITIONAL), publisher()]
    try:
        store_chain(pubs[0], 1, [*shared, [9, 9, 9, 9]])
        store_chain(pubs[1], 2, shared)  # the same content under other hashes
        store_chain(pubs[2], 3, [[5, 6, 7, 8]])  # same tokens as block 1 but another prefix: no match
        fleet = FleetBlocks(bytes_per_block=4096)
        sources = [source(name, pub) for name, pub in zip("abc", pubs)]
        sub = Subscriber(sources, lambda n, s, b: fleet.apply(n, s, b, 0.0))
        sub.close()
        summary = fleet.summary(0.0)
        assert [r.blocks_by_medium for r in summary.replicas] == [{"GPU": 3}, {"GPU": 2}, {"GPU": 1}]
        assert (summary.num_distinct_blocks, summary.num_duplicated_blocks) == (4, 2)
        assert (summary.num_redundant_copies, summary.redundant_bytes) == (2, 8192)
    finally:
        for pub in pubs:
            pub.close()


def test_events_watch_once_prints_the_fleet():
    pubs = [publisher(), publisher()]
    try:
        store_chain(pubs[0], 1, [[1, 2, 3, 4], [5, 6, 7, 8]])
        store_chain(pubs[1], 2, [[1, 2, 3, 4]])
        targets = [f"r{i}={p.endpoint},replay={p.replay_endpoint}" for i, p in enumerate(pubs)]
        done = subprocess.run(
            [
                sys.executable,
                "-m",
                "kvbench.cli",
                "events",
                "watch",
                *targets,
                "--once",
                "--bytes-per-block",
                "1048576",
            ],
            capture_output=True,
            text=True,
            timeout=120,
        )
    finally:
        for pub in pubs:
            pub.close()
    assert done.returncode == 0, done.stderr
    assert "r0" in done.stdout and "2 GPU" in done.stdout and "1 GPU" in done.stdout
    words = " ".join(done.stdout.split())  # the caption wraps at the table's width
    assert (
        "2 distinct blocks by content; 1 held by two or more replicas: 1 redundant copies (1.0 MiB)" in words
    )


def test_events_watch_names_a_bad_target_in_one_line():
    done = subprocess.run(
        [sys.executable, "-m", "kvbench.cli", "events", "watch", "ftp://x", "--once"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 2 and "expected tcp://HOST:PORT" in done.stderr
    assert "Traceback" not in done.stderr
