"""``kvbench run --kv-events``: three real ``kvbench serve`` replicas publish their KV cache events
while a chat trace is routed round robin over them; the run's ``kv_events`` report equals what the
replicas hold at the end (``GET /kv_blocks``: every kvbench serve hashes alike, so a block held twice
has one wire hash), and attributes each request's hits to the replica that served it."""

import json
import subprocess
import sys
import urllib.request
from collections import Counter

import pyarrow.parquet as pq
import pytest
from real_router import CHAT
from serve_process import REPO, ServeProcess

from kvbench.results.parquet import read_metadata

pytestmark = [pytest.mark.server, pytest.mark.slow]


def kv_blocks(root: str) -> dict:
    with urllib.request.urlopen(root + "/kv_blocks", timeout=30) as response:
        return json.loads(response.read())


@pytest.fixture(scope="module")
def replicas():
    servers = [
        ServeProcess(
            "--engine",
            "paged",
            "--block-size",
            "16",
            "--cache-size",
            "24",
            "--kv-events",
            "tcp://127.0.0.1:0",
        )
        for _ in range(3)
    ]
    try:
        yield [server.url.removesuffix("/v1") for server in servers]
    finally:
        for server in servers:
            server.stop()


def run_with_events(
    roots: list[str], tmp_path, *extra: str, reset: bool = True, sources: list[str] | None = None
) -> subprocess.CompletedProcess:
    trace = tmp_path / "chat.toml"
    trace.write_text(CHAT)
    command = [sys.executable, "-m", "kvbench.cli", "run", str(trace), "--backend", "openai"]
    for root in roots:
        command += ["--base-url", root + "/v1"]
    for source in sources or roots:
        command += ["--kv-events", source]
    command += ["--route", "round-robin", "--max-tokens", "4", "--out", str(tmp_path / "r.parquet")]
    command += ["--reset-cache"] if reset else []
    return subprocess.run(
        [*command, *extra], cwd=REPO, capture_output=True, text=True, timeout=600, check=False
    )


def test_the_run_reports_the_fleets_duplicated_blocks_exactly(replicas, tmp_path):
    done = run_with_events(replicas, tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr
    report = read_metadata(tmp_path / "r.parquet")["kv_events"]
    held = {root.removeprefix("http://"): kv_blocks(root) for root in replicas}
    # per replica: the blocks the events left equal the blocks the cache holds
    by_name = {replica["name"]: replica for replica in report["replicas"]}
    for name, answer in held.items():
        assert by_name[name]["blocks"] == {"GPU": len(answer["blocks"]["GPU"])}
        assert by_name[name]["num_gaps"] == 0 and by_name[name]["num_lost_batches"] == 0
    # the small caches (24 blocks) evicted: removals were read too
    assert sum(replica["num_removed_blocks"] for replica in report["replicas"]) > 0
    # across the fleet: the blocks two or more replicas hold, counted from the caches themselves
    holders = Counter(h for answer in held.values() for h in set(answer["blocks"]["GPU"]))
    duplicated = [n for n in holders.values() if n > 1]
    assert report["num_distinct_blocks"] == len(holders)
    assert report["num_duplicated_blocks"] == len(duplicated) > 0
    assert report["num_redundant_copies"] == sum(n - 1 for n in duplicated)
    per_block = next(iter(held.values()))["bytes_per_block"]
    assert report["bytes_per_block"] == per_block > 0
    assert report["redundant_bytes"] == report["num_redundant_copies"] * per_block
    assert f"{report['num_duplicated_blocks']} held on two or more replicas" in done.stderr


def test_each_requests_hits_are_attributed_to_the_replica_that_held_them(replicas, tmp_path):
    done = run_with_events(replicas, tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr
    rows = pq.read_table(tmp_path / "r.parquet").to_pylist()
    requests = read_metadata(tmp_path / "r.parquet")["kv_events"]["requests"]
    by_index = {row["request_index"]: row for row in rows}
    assert sorted(requests["request_index"]) == sorted(by_index)
    served = dict(zip(requests["request_index"], requests["replica_id"]))
    held = dict(zip(requests["request_index"], requests["held_tokens"]))
    best = dict(zip(requests["request_index"], requests["best_tokens"]))
    for index, row in by_index.items():
        assert served[index] == row["replica_id"]
        # at concurrency 1 what the events say the serving replica held is what it reported hitting
        assert held[index] == row["cached_prompt_tokens"], index
        assert best[index] >= held[index]
    # round robin sends later turns away from the replica holding their conversation
    assert sum(best[i] - held[i] for i in by_index) > 0
    assert sum(held.values()) > 0


def test_a_second_salted_run_is_attributed_only_what_it_could_hit(replicas, tmp_path, refused_url):
    """Without a reset the replicas still hold the first run's blocks, stored under its own salt: the
    second run (a fresh salt) hits none of them, and its attribution leaves them out. A source that
    sends nothing is said, and a root pasted with its /v1 still finds the publisher."""
    assert run_with_events(replicas, tmp_path).returncode == 0
    dead = "tcp://" + refused_url.removeprefix("http://").removesuffix("/v1")
    sources = [replicas[0] + "/v1", *replicas[1:], f"dead={dead}"]
    done = run_with_events(replicas, tmp_path, reset=False, sources=sources)
    assert done.returncode == 0, done.stdout + done.stderr
    rows = pq.read_table(tmp_path / "r.parquet").to_pylist()
    report = read_metadata(tmp_path / "r.parquet")["kv_events"]
    held = dict(zip(report["requests"]["request_index"], report["requests"]["held_tokens"]))
    assert [held[row["request_index"]] for row in rows] == [row["cached_prompt_tokens"] for row in rows]
    assert report["silent"] == ["dead"] and "nothing heard from dead" in done.stderr
    assert {"name": "dead", "blocks": {}}.items() <= next(
        r for r in report["replicas"] if r["name"] == "dead"
    ).items()
