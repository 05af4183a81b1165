"""``kvbench fleet`` against the real routers (the ``[fleet]`` extra) over ``kvbench serve`` replicas it
starts on loopback: per-replica rows and table, the replicas' /metrics summed equal to the client's
usage, expected = reported request by request at concurrency 1 (no server blamed under round robin),
the router's own counters kept, and nothing left listening after it ends, on SIGINT and on SIGTERM."""

import importlib.util
import json
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from urllib.parse import urlsplit

import pyarrow.parquet as pq
import pytest
from real_router import CHAT

from kvbench.explain.sources import ExplainConfig, explain_file
from kvbench.results.parquet import read_metadata

pytestmark = pytest.mark.slow  # two replicas and a router per policy: ~40-90 s on 2 loaded cores
REPO = Path(__file__).resolve().parents[2]


def needs(module: str) -> None:
    if importlib.util.find_spec(module) is None:
        pytest.skip(f"{module} is not installed (pip install -e '.[fleet]')")


def listening(url: str) -> bool:
    parts = urlsplit(url)
    with socket.socket() as sock:
        sock.settimeout(1)
        return sock.connect_ex((parts.hostname, parts.port)) == 0


def router_urls(stderr: str) -> list[str]:
    return [line.split(" on ")[1].split()[0] for line in stderr.splitlines() if " on http://" in line]


def events_and_explain(entry: dict, rows: list[dict], replicas: list[str]) -> tuple[int, int, int]:
    """A policy's KV event report and explanation checked against its rows; ``(tokens held
    elsewhere, blocks held twice or more, tokens lost to routing)``."""
    # the replicas' KV events: what each held of a prompt when it was sent is what it reported
    events, reported = entry["kv_events"], [row["cached_prompt_tokens"] for row in rows]
    assert sorted(r["name"] for r in events["replicas"]) == sorted(urlsplit(u).netloc for u in replicas)
    held = dict(zip(events["requests"]["request_index"], events["requests"]["held_tokens"]))
    assert [held[row["request_index"]] for row in rows] == reported, entry["policy"]
    assert sum(r["num_stored_blocks"] for r in events["replicas"]) > 0
    # explain puts what the placement lost down to routing, nothing to the servers
    waterfall = explain_file(ExplainConfig(Path(entry["rows"]))).waterfall
    assert waterfall.tokens["server"] == 0, (entry["policy"], waterfall.tokens)
    elsewhere = sum(events["requests"]["best_tokens"]) - sum(reported)
    return elsewhere, events["num_duplicated_blocks"], waterfall.tokens["routing"]


@pytest.mark.parametrize(
    ("router", "module", "policies"),
    [
        ("sglang", "sglang_router", ("round_robin", "cache_aware")),
        ("vllm", "vllm_router", ("round_robin", "cache_aware", "consistent_hash")),
    ],
)
def test_fleet_runs_each_policy_and_expectations_match_the_replicas(
    kvbench, tmp_path, router, module, policies
):
    needs(module)
    scenario, out = tmp_path / "chat.toml", tmp_path / "fleet"
    scenario.write_text(CHAT)
    code, stdout, stderr = kvbench(
        "fleet", scenario, "--router", router, "--replicas", "3", "--policy", ",".join(policies), "--out", out
    )
    assert code == 0, stderr
    summary = json.loads((out / "fleet.json").read_text())
    replicas = summary["replicas"]
    assert len(replicas) == 3 and [p["policy"] for p in summary["policies"]] == list(policies)
    elsewhere, duplicated, routing = {}, {}, {}
    for entry in summary["policies"]:
        policy, rows = entry["policy"], pq.read_table(entry["rows"]).to_pylist()
        assert len(rows) == 11 and all(row["status"] == "ok" for row in rows)
        assert {row["replica_id"] for row in rows} <= {urlsplit(url).netloc for url in replicas}
        report = entry["replica_metrics"]  # the replicas' own /metrics: per replica = its rows
        assert report["verdict"] is None
        assert report["fleet"]["prompt_tokens"] == sum(row["prompt_tokens"] for row in rows)
        assert report["fleet"]["cached_tokens"] == sum(row["cached_prompt_tokens"] for row in rows)
        for replica in report["replicas"]:
            mine = [row for row in rows if row["replica_id"] == urlsplit(replica["url"]).netloc]
            assert replica["cached_tokens"] == sum(row["cached_prompt_tokens"] for row in mine)
        assert any(name.endswith("_total") or "_total{" in name for name in entry["router_counters"]), entry
        expected = [row["expected_cached_tokens"] for row in rows]
        reported = [row["cached_prompt_tokens"] for row in rows]
        # concurrency 1: the model routes as the router did, request by request (consistent_hash on
        # vllm-router's own ring over the replicas' URLs)
        assert reported == expected, (policy, reported, expected)
        assert read_metadata(Path(entry["rows"]))["reconciliation"]["below_expected"] == []
        if policy == "consistent_hash":  # and a session never changes replica
            sessions = {}
            for row in rows:
                sessions.setdefault(row["session_id"], set()).add(row["replica_id"])
            assert all(len(on) == 1 for on in sessions.values()), sessions
        if policy == "round_robin":
            assert len({row["replica_id"] for row in rows}) == 3
        elsewhere[policy], duplicated[policy], routing[policy] = events_and_explain(entry, rows, replicas)
    # round robin scatters each conversation: its later turns find their prefix on another replica,
    # and the shared system prompt is held three times
    assert elsewhere["round_robin"] > elsewhere["cache_aware"] >= 0, elsewhere
    assert duplicated["round_robin"] > 0, duplicated
    assert routing["round_robin"] > routing["cache_aware"] == 0, routing
    table = stdout.replace("\n", " ")
    assert f"kvbench fleet: {router} router, 3 replicas" in table
    assert "KV events: what each replica held" in table
    round_robin = next(
        line for line in stdout.splitlines() if line.startswith("│ round_robin") and "fleet" in line
    )
    assert "11/11" in round_robin, stdout  # every request on the replica the model picked
    assert not any(listening(url) for url in replicas + router_urls(stderr))


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
def test_fleet_stops_every_process_and_keeps_the_rows_on_a_signal(tmp_path, sig):
    needs("sglang_router")
    scenario, out = tmp_path / "chat.toml", tmp_path / "fleet"
    scenario.write_text(CHAT.replace("num_conversations = 4", "num_conversations = 40"))
    process = subprocess.Popen(
        [sys.executable, "-m", "kvbench.cli", "fleet", scenario, "--replicas", "2", "--policy", "round_robin"]
        + ["--out", out],
        cwd=REPO,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    rows = out / "round_robin.parquet"
    deadline = time.monotonic() + 300
    while process.poll() is None and time.monotonic() < deadline:
        if rows.exists() and pq.read_metadata(rows).num_rows >= 2:
            break
        time.sleep(0.2)
    assert process.poll() is None, process.communicate()[1][-2000:]
    process.send_signal(sig)
    _, stderr = process.communicate(timeout=120)
    assert process.returncode == 128 + sig, stderr
    summary = json.loads((out / "fleet.json").read_text())
    kept = pq.read_table(rows).to_pylist()
    assert 2 <= len(kept) < 100 and read_metadata(rows)["complete"] is False
    assert summary["policies"][0]["policy"] == "round_robin"
    started = summary["replicas"] + router_urls(stderr)
    assert len(started) == 3 and not any(listening(url) for url in started), stderr[-2000:]


def test_kv_aware_routes_on_the_replicas_kv_events(kvbench, tmp_path):
    """vllm-router's kv_aware policy fed by kvbench serve's KV events (static sources read from each
    replica's /kv_event_sources): its placement lookups hit, so its decisions come from the events; at
    concurrency 1 kvbench route's kv_aware model expects what each request reported, request by
    request, on the replica the router picked."""
    needs("vllm_router")
    scenario, out = tmp_path / "chat.toml", tmp_path / "fleet"
    scenario.write_text(CHAT)
    code, stdout, stderr = kvbench(
        "fleet", scenario, "--router", "vllm", "--replicas", "3", "--policy", "kv_aware", "--out", out
    )
    assert code == 0, stderr
    entry = json.loads((out / "fleet.json").read_text())["policies"][0]
    counters = entry["router_counters"]
    hits = counters.get('vllm_router_kv_placement_lookups_total{result="hit"}', 0)
    assert hits >= 5, counters  # later turns and the shared system prompt found in the index
    assert not any('result="cache_salt"' in name for name in counters), counters  # nonce, not salt
    rows = pq.read_table(entry["rows"]).to_pylist()
    assert (
        sum(row["cached_prompt_tokens"] for row in rows) == entry["replica_metrics"]["fleet"]["cached_tokens"]
    )
    assert "kvbench route's kv_aware over 3 replicas" in stderr
    expected = [row["expected_cached_tokens"] for row in rows]
    reported = [row["cached_prompt_tokens"] for row in rows]
    assert reported == expected and sum(reported) > 0
    assert read_metadata(Path(entry["rows"]))["reconciliation"]["below_expected"] == []
    kv_aware = next(line for line in stdout.splitlines() if line.startswith("│ kv_aware") and "fleet" in line)
    assert "11/11" in kv_aware, stdout  # every request on the replica the model picked
