"""``/v1/messages`` reports what Anthropic's prompt cache would (breakpoints, the minimum
cacheable length, writes vs reads, the top-level ``cache_control``, cache fields in ``message_start``),
checked with the real ``anthropic`` SDK; the engine's real hit stays visible (a header, /metrics)."""

import secrets

import anthropic
import numpy as np
import pytest

from kvbench.server.breakpoint_cache import Breakpoint, BreakpointCache

pytestmark = [pytest.mark.engine, pytest.mark.server]

MODEL = "tiny"


@pytest.fixture(scope="module")
def client(live):
    return anthropic.Anthropic(
        base_url=live.url.removesuffix("/v1"), api_key="unused", max_retries=0, timeout=120
    )


def system_text(words: int) -> str:
    return f"{secrets.token_hex(4)} " + " ".join(["rule"] * words)  # a fresh prefix per test


def marked(text: str, **cache) -> list[dict]:
    return [{"type": "text", "text": text, "cache_control": {"type": "ephemeral", **cache}}]


def ask(client, system, question="what now?", **kwargs):
    response = client.messages.with_raw_response.create(
        model=MODEL, max_tokens=1, system=system, messages=[{"role": "user", "content": question}], **kwargs
    )
    return response.parse().usage, int(response.headers["x-kvbench-cached-tokens"])


def test_no_cache_control_means_no_cache_fields_but_the_engine_still_hits(client):
    system = system_text(1100)
    ask(client, system)
    usage, engine_hit = ask(client, system)
    assert usage.cache_read_input_tokens == 0 and usage.cache_creation_input_tokens == 0  # was 4,416 read
    assert engine_hit >= 1024 and usage.input_tokens > engine_hit  # the engine's hit, in the header only


def test_a_breakpoint_is_written_then_read_never_past_it(client):
    system = system_text(1100)
    question = "what now? " + "again " * 40  # > 2 blocks after the mark, wherever the mark falls in its block
    first, _ = ask(client, marked(system), question)
    # the same question: the engine hits past the mark
    second, engine_hit = ask(client, marked(system), question)
    written = first.cache_creation_input_tokens
    assert written > 1100 and first.cache_read_input_tokens == 0
    assert second.cache_read_input_tokens == written and second.cache_creation_input_tokens == 0
    # the engine's block cache reaches into the question; the read stops at the mark
    assert engine_hit > written
    for usage in (first, second):
        assert (
            usage.input_tokens + usage.cache_creation_input_tokens + usage.cache_read_input_tokens > written
        )


def test_below_the_minimum_nothing_is_cached(client):
    system = marked(system_text(600))  # under the 1,024-token minimum
    for _ in range(2):
        usage, _ = ask(client, system)
        assert usage.cache_creation_input_tokens == 0 and usage.cache_read_input_tokens == 0


def test_the_top_level_cache_control_marks_the_last_block(client):
    system = system_text(1100)
    first, _ = ask(client, system, extra_body={"cache_control": {"type": "ephemeral"}})
    second, _ = ask(client, system, extra_body={"cache_control": {"type": "ephemeral"}})
    # all but the generation prompt
    assert first.cache_creation_input_tokens > 1100 and first.input_tokens < 10
    assert second.cache_read_input_tokens == first.cache_creation_input_tokens


def test_message_start_carries_the_cache_fields(client):
    system = marked(system_text(1100))
    ask(client, system)
    with client.messages.stream(
        model=MODEL, max_tokens=2, system=system, messages=[{"role": "user", "content": "what now?"}]
    ) as stream:
        start = next(event for event in stream if event.type == "message_start")
        final = stream.get_final_message()
    assert start.message.usage.cache_read_input_tokens > 1100
    assert start.message.usage.cache_creation_input_tokens == 0
    assert final.usage.cache_read_input_tokens == start.message.usage.cache_read_input_tokens


def test_a_later_turn_reads_the_earlier_turns_breakpoint(client):
    """Anthropic looks back up to ~20 blocks before a breakpoint for a cached prefix."""
    system = system_text(1100)
    turn = [{"role": "user", "content": marked("first question")}]
    first = client.messages.create(model=MODEL, max_tokens=1, system=system, messages=turn).usage
    later = turn + [
        {"role": "assistant", "content": "an answer"},
        {"role": "user", "content": marked("a second question")},
    ]
    second = client.messages.create(model=MODEL, max_tokens=1, system=system, messages=later).usage
    assert second.cache_read_input_tokens == first.cache_creation_input_tokens
    assert 0 < second.cache_creation_input_tokens < 40  # only the new turn is written


def test_reset_forgets_and_five_breakpoints_are_refused(client, live):
    system = marked(system_text(1100))
    ask(client, system)
    assert live.post("/reset_prefix_cache", {})[0] == 200
    usage, _ = ask(client, system)
    assert usage.cache_read_input_tokens == 0 and usage.cache_creation_input_tokens > 1100
    with pytest.raises(anthropic.BadRequestError, match="A maximum of 4 blocks"):
        client.messages.create(
            model=MODEL, max_tokens=1, system=marked("s") * 5, messages=[{"role": "user", "content": "x"}]
        )


def test_the_rules_on_the_cache_itself():
    clock = [0.0]
    cache = BreakpointCache(1024, clock=lambda: clock[0])
    ids = np.arange(3000, dtype=np.uint32)
    first = cache.account(ids, [Breakpoint(1500), Breakpoint(2500)], [1500, 2000, 2500])
    assert (first.cache_read_input_tokens, first.cache_creation_input_tokens, first.input_tokens) == (
        0,
        2500,
        500,
    )
    other = np.concatenate([ids[:2000], ids[2000:] + 1])  # shares 2,000 tokens: the read stops at 1,500
    second = cache.account(other, [Breakpoint(2500)], [1500, 2000, 2500])
    assert (second.cache_read_input_tokens, second.cache_creation_input_tokens) == (1500, 1000)
    clock[0] = 301.0  # past the 5-minute TTL of the 2,500 entry; 1,500 was refreshed at t=0 only
    assert cache.account(ids, [Breakpoint(2500)], [1500, 2500]).cache_read_input_tokens == 0
