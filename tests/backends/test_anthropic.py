"""The Anthropic Messages path end to end: the official SDK and ``kvbench run --backend anthropic``
against a real ``kvbench serve`` (``/v1/messages``) on loopback."""

import secrets

import pyarrow.parquet as pq
import pytest

from kvbench.request import Message, Request

anthropic = pytest.importorskip("anthropic")

MODEL = "random-llama-8L-512h-seed0"


def system_prompt(words=1100):
    """About ``words`` + 3 tokens of text no other test sends (a fresh nonce first)."""
    return f"{secrets.token_hex(4)} " + " ".join(["rule"] * words)


@pytest.fixture(scope="module")
def client(server):
    return anthropic.Anthropic(base_url=server.url.removesuffix("/v1"), api_key="test-key", max_retries=0)


def ask(client, system, question, max_tokens=3, cached=True):
    block = {"type": "text", "text": system, **({"cache_control": {"type": "ephemeral"}} if cached else {})}
    with client.messages.stream(
        model=MODEL, max_tokens=max_tokens, system=[block], messages=[{"role": "user", "content": question}]
    ) as stream:
        deltas = [event for event in stream if event.type == "content_block_delta"]
        return deltas, stream.get_final_message()


def test_the_sdk_reports_creation_then_read_tokens(client):
    system = system_prompt()
    deltas, first = ask(client, system, "first question")
    _, second = ask(client, system, "a second, different question")
    assert len(deltas) == 3 and first.usage.output_tokens == 3 and first.stop_reason == "max_tokens"
    written = first.usage.cache_creation_input_tokens
    assert written >= 1100 and first.usage.cache_read_input_tokens == 0  # the whole system block, exactly
    assert second.usage.cache_read_input_tokens == written and second.usage.cache_creation_input_tokens == 0
    for usage in (first.usage, second.usage):
        total = usage.input_tokens + usage.cache_creation_input_tokens + usage.cache_read_input_tokens
        assert 1100 < total < 1130


def test_a_whole_response_and_the_minimum_length(client):
    short = system_prompt(200)  # below the 1,024-token minimum: never cached, never read
    for _ in range(2):
        reply = client.messages.create(
            model=MODEL, max_tokens=2, system=short, messages=[{"role": "user", "content": "hi"}]
        )
        assert reply.usage.cache_creation_input_tokens == 0 and reply.usage.cache_read_input_tokens == 0
    assert reply.content[0].type == "text" and reply.usage.output_tokens == 2
    _, unmarked = ask(client, system_prompt(), "no breakpoint", cached=False)
    assert unmarked.usage.cache_creation_input_tokens == 0  # nothing marked: nothing billed as a write


def test_errors_come_back_as_status_errors(client):
    with pytest.raises(anthropic.NotFoundError):
        client.messages.create(model="claude-nope", max_tokens=2, messages=[{"role": "user", "content": "x"}])
    with pytest.raises(anthropic.BadRequestError, match="only text blocks"):
        client.messages.create(
            model=MODEL,
            max_tokens=2,
            messages=[
                {"role": "user", "content": [{"type": "image", "source": {"type": "url", "url": "http://x"}}]}
            ],
        )


AGENT = """
[workload]
kind = "agent"
num_agents = 2
steps = "uniform:3,3"
system_tokens = 1200
task_tokens = 40
observation_tokens = "lognormal:60,0.3"
final_tokens = 4
agent_rate_per_s = 5.0
step_time_s = 0.2
seed = {seed}

[run]
max_tokens = 3
concurrency = 1
"""


def test_kvbench_run_backend_anthropic_records_the_usage_fields(kvbench, server, tmp_path, monkeypatch):
    secret = "sk-ant-" + secrets.token_hex(8)
    monkeypatch.setenv("ANTHROPIC_API_KEY", secret)
    scenario = tmp_path / "agent.toml"
    scenario.write_text(AGENT.format(seed=secrets.randbelow(10**6)))
    out = tmp_path / "anthropic.parquet"
    code, stdout, stderr = kvbench(
        "run", scenario, "--backend", "anthropic", "--base-url", server.url, "--model", MODEL, "--out", out
    )
    assert code == 0, stderr
    rows = sorted(pq.read_table(out).to_pylist(), key=lambda r: (r["session_id"], r["turn"]))
    assert all(r["status"] == "ok" and r["backend"] == "anthropic" and r["ttft_ms"] > 0 for r in rows)
    first = [r for r in rows if r["turn"] == 0]
    (read_by, _), (written_by, _) = pairs = sorted(
        (r["cache_creation_input_tokens"], r["cached_prompt_tokens"]) for r in first
    )
    # one writes, the other reads
    assert pairs == [(0, written_by), (written_by, 0)] and 1200 <= written_by < 1210
    assert read_by == 0
    later = [r for r in rows if r["turn"] > 0]
    assert all(r["cached_prompt_tokens"] > 1200 and 0 < r["cache_creation_input_tokens"] < 200 for r in later)
    assert secret.encode() not in out.read_bytes() and secret not in stdout + stderr
    bill = tmp_path / "bill.parquet"  # kvbench bill prices the measured run from its recorded usage
    code, _, stderr = kvbench("bill", out, "--provider", "anthropic", "--out", bill)
    assert code == 0, stderr
    priced = pq.read_table(bill).to_pylist()[0]
    assert priced["cache_read_input_tokens"] == sum(r["cached_prompt_tokens"] for r in rows)
    assert priced["cache_creation_input_tokens"] == sum(r["cache_creation_input_tokens"] for r in rows)
    assert priced["prompt_tokens"] == sum(r["prompt_tokens"] for r in rows)


MOONCAKE_LINE = '{"timestamp": 0, "input_length": 600, "output_length": 4, "hash_ids": [0, 1]}\n'


def test_a_token_id_trace_is_refused_in_one_line(kvbench, tmp_path):
    trace = tmp_path / "mooncake.jsonl"
    trace.write_text(MOONCAKE_LINE * 2)
    code, _, stderr = kvbench("run", trace, "--backend", "anthropic", "--model", MODEL, "--requests", 2)
    assert code == 2 and "token ids only" in stderr and len(stderr.strip().splitlines()) == 1


def test_breakpoints_go_after_the_system_prompt_and_the_last_stable_turn():
    from kvbench.backends.anthropic import message_arguments

    messages = (
        Message("system", "S"),
        Message("user", "u1"),
        Message("assistant", "a1"),
        Message("user", "u2"),
    )
    request = Request(0, "r", "s", 1, __import__("numpy").zeros(3, dtype="uint32"), messages=messages)
    arguments = message_arguments(request)
    assert arguments["system"] == [{"type": "text", "text": "S", "cache_control": {"type": "ephemeral"}}]
    marks = ["cache_control" in m["content"][0] for m in arguments["messages"]]
    assert marks == [False, True, False] and [m["role"] for m in arguments["messages"]] == [
        "user",
        "assistant",
        "user",
    ]
