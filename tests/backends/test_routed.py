"""Several real ``kvbench serve`` processes behind client-side routing: ``--base-url`` x3 ``--route P``."""

import asyncio

import numpy as np
import pyarrow.parquet as pq
import pytest

from kvbench.backends.routed import RoutedBackend
from kvbench.request import Request, RequestRecord, Status
from kvbench.results.replicas import replica_rows
from kvbench.results.rows import rows_from_dicts

CHAT = """
[workload]
kind = "chat"
num_conversations = 6
turns = "uniform:3,3"
system_tokens = 120
user_tokens = "lognormal:30,0.3"
reply_tokens = "lognormal:20,0.3"
conversation_rate_per_s = 4.0
think_time_s = 0.5

[run]
max_tokens = 2
concurrency = 3
"""


@pytest.fixture(scope="module")
def three_urls(server):
    # two more `kvbench serve` processes, same class as the fixture's
    others = [
        type(server)(),
        type(server)(),
    ]
    try:
        yield [server.url] + [other.url for other in others]
    finally:
        for other in others:
            other.stop()


def routed_run(kvbench, tmp_path, urls, policy):
    scenario = tmp_path / "chat.toml"
    scenario.write_text(CHAT)
    out = tmp_path / f"{policy}.parquet"
    args = [arg for url in urls for arg in ("--base-url", url)]
    code, stdout, stderr = kvbench(
        "run", scenario, "--backend", "openai", *args, "--route", policy, "--out", out
    )
    assert code == 0, stderr
    assert f"replicas (client-side routing: {policy})" in stdout
    return pq.read_table(out).to_pylist()


def test_session_routing_keeps_each_conversation_on_one_replica(kvbench, tmp_path, three_urls):
    session = routed_run(kvbench, tmp_path, three_urls, "session")
    rr = routed_run(kvbench, tmp_path, three_urls, "round-robin")
    for rows in (session, rr):
        assert len(rows) == 18 and all(r["status"] == "ok" and r["replica"] in (0, 1, 2) for r in rows)
    by_session = {}
    for row in session:
        by_session.setdefault(row["session_id"], set()).add(row["replica"])
    assert all(len(replicas) == 1 for replicas in by_session.values())
    assert len({r["replica"] for r in session}) > 1
    assert sorted(entry["requests"] for entry in replica_rows(rows_from_dicts(rr))) == [6, 6, 6]

    def hit_rate(rows):
        return sum(r["cached_prompt_tokens"] for r in rows) / sum(r["prompt_tokens"] for r in rows)

    assert hit_rate(session) > hit_rate(rr)  # turn k+1 of a conversation finds turn k's blocks


def test_route_needs_several_urls(kvbench, tmp_path):
    scenario = tmp_path / "chat.toml"
    scenario.write_text(CHAT)
    code, _, stderr = kvbench("run", scenario, "--backend", "openai", "--route", "session")
    assert code == 2 and "--route needs two or more --base-url" in stderr


class Slow:
    """An endpoint that takes ``delay_s`` per request (for the load accounting only)."""

    def __init__(self, delay_s):
        self.delay_s, self.seen = delay_s, 0

    async def serve(self, request):
        self.seen += 1
        await asyncio.sleep(self.delay_s)
        return RequestRecord(Status.OK, request.prompt_tokens)

    def describe(self):
        return {"backend": "openai"}


def test_least_loaded_counts_requests_in_flight_per_endpoint():
    fast, slow = Slow(0.001), Slow(0.2)
    routed = RoutedBackend([slow, fast], "least-loaded")
    requests = [Request(i, f"r{i}", f"s{i}", 0, np.arange(40, dtype=np.uint32)) for i in range(6)]

    async def main():
        first = asyncio.create_task(routed.serve(requests[0]))  # goes to endpoint 0 (slow), stays in flight
        await asyncio.sleep(0.01)
        rest = [await routed.serve(r) for r in requests[1:]]  # endpoint 0 is busy: all go to endpoint 1
        return [await first] + rest

    records = asyncio.run(main())
    assert [r.replica for r in records] == [0, 1, 1, 1, 1, 1] and routed.loads == [0, 0]
