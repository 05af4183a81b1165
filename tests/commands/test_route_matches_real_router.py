"""``kvbench route``'s models of sglang-router 0.3.2 against the real router: three ``kvbench serve``
replicas (``--replica-id r0..r2``) behind ``python -m sglang_router.launch_router``, a small chat trace
sent at concurrency 1 through ``kvbench run --backend openai``, and per request the replica the response
header names against the replica the model picks (:func:`kvbench.route.agreement.agreement`)."""

import pyarrow.parquet as pq
import pytest
from real_router import real_router
from serve_process import ServeProcess

from kvbench.cache.block_hash import BlockHasher
from kvbench.route.agreement import agreement
from kvbench.route.api import RouterOptions, make_router
from kvbench.route.policies import RequestView
from kvbench.route.real_routers import routing_text
from kvbench.run.source import load_source

pytestmark = pytest.mark.slow  # three servers, a router per policy, 16 requests each: ~2-3 min on 2 cores

CHAT = """
[workload]
kind = "chat"
num_conversations = 6
turns = "uniform:2,3"
system_tokens = 16
user_tokens = "lognormal:120,0.3"
reply_tokens = "lognormal:3,0.3"
conversation_rate_per_s = 100.0
think_time_s = 0.01
seed = 5

[cache]
block_size = 16

[run]
concurrency = 1
"""
REPLICAS = 3
CASES = {  # (real router, its policy) -> kvbench route's model of it
    ("sglang", "cache_aware"): "sglang_cache_aware",
    ("sglang", "round_robin"): "round-robin",
    ("vllm", "consistent_hash"): "consistent_hash",
}


@pytest.fixture(scope="module")
def replicas():
    started = [ServeProcess("--engine", "paged", "--replica-id", f"r{i}") for i in range(REPLICAS)]
    try:
        yield [process.url.removesuffix("/v1") for process in started]
    finally:
        for process in started:
            process.stop()


@pytest.mark.parametrize(("name", "policy"), sorted(CASES))
def test_model_picks_the_replica_the_real_router_picked(kvbench, replicas, name, policy, tmp_path):
    scenario, out = tmp_path / "chat.toml", tmp_path / "rows.parquet"
    scenario.write_text(CHAT)
    with real_router(name, policy, replicas, tmp_path) as url:
        code, _, stderr = kvbench(
            "run", scenario, "--backend", "openai", "--base-url", url + "/v1", "--no-preflight", "--out", out
        )
    assert code == 0, stderr
    rows = sorted(pq.read_table(out).to_pylist(), key=lambda row: row["sent_ms"])
    assert rows and all(row["status"] == "ok" for row in rows)
    observed = [int(row["replica_id"].removeprefix("r")) for row in rows]
    if policy == "round_robin":  # the router cycles in the order its workers finished registering,
        order = list(dict.fromkeys(observed))  # which changes from start to start: learn it from the
        observed = [order.index(replica) for replica in observed]  # first cycle, check every request

    requests = {r.request_id: r for r in load_source(scenario).requests}
    hasher = BlockHasher(16)
    views = [
        RequestView(
            r.session_id, hasher.prompt_blocks(r.token_ids), r.arrival_s, routing_text(r), r.token_ids
        )
        for r in (requests[row["request_id"]] for row in rows)
    ]
    router = make_router(CASES[name, policy], REPLICAS, 16, RouterOptions(worker_urls=tuple(replicas)))
    result = agreement(router, views, observed, REPLICAS)
    print(f"{name} {policy}: {result} {getattr(router, 'decisions', '')} observed={observed}")
    assert result.allowed == result.requests, (result, observed)
    if policy == "cache_aware":  # the trace exercises both branches: own-history matches and misses
        assert router.decisions["match"] >= 3 and router.decisions["smallest-tree"] >= 3, router.decisions
    if policy == "consistent_hash":  # each session on one replica, and more than one replica used
        assert len(set(observed)) > 1
