"""Two real ``kvbench serve`` replicas behind the real routers (sglang-router, vllm-router from the
``[fleet]`` extra) on loopback, and ``kvbench run --backend openai`` through each router: every row
names the replica that served it, and the replicas' own ``/metrics`` deltas summed equal the usage the
client saw. Under vllm-router's ``consistent_hash`` each session stays on one replica (the session goes
out as ``X-Session-ID``)."""

from collections import defaultdict
from pathlib import Path

import pyarrow.parquet as pq
import pytest
from real_router import CHAT as FLEET_CHAT
from real_router import real_router
from serve_process import ServeProcess

from kvbench.results.parquet import read_metadata

pytestmark = pytest.mark.slow  # two servers, a router and a 12-request run: ~30-60 s on 2 loaded cores

CHAT = FLEET_CHAT + "\n[run]\nconcurrency = 2\n"
POLICIES = {"sglang": "round_robin", "vllm": "consistent_hash"}


@pytest.fixture(scope="module")
def replicas():
    """Two ``kvbench serve --engine paged`` replicas on free ports (default replica id: host:port)."""
    started = [ServeProcess("--engine", "paged"), ServeProcess("--engine", "paged")]
    try:
        yield [process.url.removesuffix("/v1") for process in started]
    finally:
        for process in started:
            process.stop()


@pytest.fixture(params=sorted(POLICIES))
def router(request, replicas, tmp_path):
    """The real router over ``replicas`` on a free port: ``(name, url, policy)``."""
    policy = POLICIES[request.param]
    with real_router(request.param, policy, replicas, tmp_path) as url:
        yield request.param, url, policy


def test_rows_name_replicas_and_replica_metrics_add_up(kvbench, replicas, router, tmp_path):
    name, url, policy = router
    scenario, out = tmp_path / "chat.toml", tmp_path / "rows.parquet"
    scenario.write_text(CHAT)
    metrics_flags = [flag for replica in replicas for flag in ("--replica-metrics", replica)]
    code, stdout, stderr = kvbench(
        "run", scenario, "--backend", "openai", "--base-url", url + "/v1", *metrics_flags, "--out", out
    )
    assert code == 0, stderr
    rows = pq.read_table(out).to_pylist()
    names = {replica.removeprefix("http://") for replica in replicas}
    assert rows and all(row["status"] == "ok" for row in rows)
    assert {row["replica_id"] for row in rows} <= names  # every row names a replica of the fleet

    report = read_metadata(out)["replica_metrics"]
    assert report["verdict"] is None, report["verdict"]
    fleet = report["fleet"]
    assert fleet["prompt_tokens"] == sum(row["prompt_tokens"] for row in rows)
    assert fleet["cached_tokens"] == sum(row["cached_prompt_tokens"] for row in rows)
    assert fleet["requests"] == len(rows)
    for replica in report["replicas"]:  # per replica: its /metrics delta is what its rows saw
        mine = [row for row in rows if row["replica_id"] == replica["url"].removeprefix("http://")]
        assert replica["prompt_tokens"] == sum(row["prompt_tokens"] for row in mine)
        assert replica["cached_tokens"] == sum(row["cached_prompt_tokens"] for row in mine)
    assert "replicas' own /metrics (sum = the client's traffic)" in stdout

    by_session = defaultdict(set)
    for row in rows:
        by_session[row["session_id"]].add(row["replica_id"])
    if policy == "round_robin":
        assert {row["replica_id"] for row in rows} == names  # both replicas served
    else:  # consistent hashing on X-Session-ID: a session never changes replica
        assert all(len(served_by) == 1 for served_by in by_session.values()), dict(by_session)


def test_isolation_survives_the_router(kvbench, replicas, router, tmp_path, refused_url):
    """--reset-cache resets each replica itself (a router's own reset reaches some or none), a reset
    that fails anywhere stops the run, and the preflight's cache_salt check decides behind round robin
    (its repeats are resent until they reach the first probe's replica): sglang-router drops
    cache_salt, so the run falls back to nonce hygiene; vllm-router passes it on."""
    name, url, policy = router
    scenario = tmp_path / "chat.toml"
    scenario.write_text(CHAT)
    metrics_flags = [flag for replica in replicas for flag in ("--replica-metrics", replica)]
    base = ("run", scenario, "--backend", "openai", "--base-url", url + "/v1", "--requests", "3")
    code, _, stderr = kvbench(*base, *metrics_flags, "--reset-cache", "--out", tmp_path / "a.parquet")
    assert code == 0, stderr
    assert f"cache reset on all {len(replicas)} replicas (/reset_prefix_cache)" in stderr
    salt = next(line for line in stderr.splitlines() if line.startswith("preflight cache_salt:"))
    if name == "sglang":
        assert salt.startswith("preflight cache_salt: FAILED"), salt
        assert (
            "a router in front of it drops it (sglang-router does): falling back to --hygiene nonce" in stderr
        )
    else:
        assert salt.startswith("preflight cache_salt: ok"), salt

    dead = refused_url.removesuffix("/v1")  # a replica that does not answer: no fresh start anywhere
    code, _, stderr = kvbench(
        *base, *metrics_flags, "--replica-metrics", dead, "--reset-cache", "--out", tmp_path / "b.parquet"
    )
    errors = [line for line in stderr.splitlines() if line.startswith("error:")]
    assert code == 2 and len(errors) == 1 and not (tmp_path / "b.parquet").exists()
    assert (
        f"--reset-cache: {dead}: " in errors[0]
        and f"{len(replicas)} of {len(replicas) + 1} servers reset" in errors[0]
    )


def test_token_id_prompts_are_checked_before_the_run(kvbench, replicas, router, tmp_path):
    """sglang-router takes text only (422: its prompt type is a string or an array of strings): a
    trace of token ids is refused by the preflight in one line naming the fix, before any request."""
    name, url, _ = router
    trace = Path(__file__).resolve().parents[2] / "samples" / "hash_ids.jsonl"
    out = tmp_path / "ids.parquet"
    code, _, stderr = kvbench(
        "run", trace, "--requests", "2", "--backend", "openai", "--base-url", url + "/v1", "--out", out
    )
    if name == "sglang":
        errors = [line for line in stderr.splitlines() if line.startswith("error:")]
        assert code == 2 and len(errors) == 1 and not out.exists(), stderr
        assert "token_ids: a prompt of token ids is refused (Error code: 422)" in errors[0]
        assert "use a trace with text" in errors[0]
    else:
        assert code == 0 and "preflight token_ids: ok" in stderr, stderr
