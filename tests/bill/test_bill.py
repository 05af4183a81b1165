"""Bills against hand computation: writes, reads, TTL refresh and expiry, minimum lengths, increments."""

import numpy as np
import pyarrow.parquet as pq
import pytest

from kvbench.bill.api import bill_requests
from kvbench.bill.invoice import break_even_reads, make_bill
from kvbench.bill.placement import Marked, Placement, message_boundaries
from kvbench.bill.rules import cache_rules, provider_table, with_prices
from kvbench.bill.simulate import simulate
from kvbench.errors import InputError
from kvbench.request import Message, Request
from kvbench.workloads.tokenizer import load_tokenizer

RNG = np.random.default_rng(0)
PREFIX = RNG.integers(0, 50_000, 2000).astype(np.uint32)


def prefixed(arrival_s, prefix=PREFIX, suffix_tokens=50, breakpoint_=None):
    ids = np.concatenate([prefix, RNG.integers(0, 50_000, suffix_tokens).astype(np.uint32)])
    cut = len(prefix) if breakpoint_ is None else breakpoint_
    return Marked(ids, float(arrival_s), (cut, len(ids)), (cut,), 10)


def test_a_2000_token_prefix_read_9_times_in_5_minutes_then_after_6_minutes():
    times = [0, 30, 60, 90, 120, 150, 180, 210, 240, 270] + [270 + 360]  # 10 sends, then one 6 min later
    rules = cache_rules("anthropic", "claude-sonnet-4-5")  # $3 input, 1.25x write, 0.1x read, $15 output
    usages = simulate([prefixed(t) for t in times], rules)
    assert [u.cache_creation_input_tokens for u in usages] == [2000] + [0] * 9 + [2000]
    assert [u.cache_read_input_tokens for u in usages] == [0] + [2000] * 9 + [0]
    assert all(u.input_tokens == 50 for u in usages)
    bill = make_bill(usages, rules)
    assert (bill.num_writes, bill.num_reads) == (2, 9)
    lines = bill.lines()
    assert lines["cache writes"] == pytest.approx(2 * 2000 * 3.75 / 1e6)
    assert lines["cache reads"] == pytest.approx(9 * 2000 * 0.30 / 1e6)
    assert lines["input"] == pytest.approx(11 * 50 * 3.00 / 1e6)
    assert lines["output"] == pytest.approx(11 * 10 * 15.00 / 1e6)
    assert bill.no_cache_usd == pytest.approx(11 * 2050 * 3.00 / 1e6 + 11 * 10 * 15.00 / 1e6)


def test_reads_refresh_the_ttl_and_the_1h_retention_costs_2x():
    times = [0, 250, 500, 750]  # each gap < 300 s, total > 300 s: alive only because reads refresh it
    five = simulate([prefixed(t) for t in times], cache_rules("anthropic", "claude-sonnet-4-5", "5m"))
    assert [u.cache_read_input_tokens for u in five] == [0, 2000, 2000, 2000]
    hour = cache_rules("anthropic", "claude-sonnet-4-5", "1h")
    assert hour.ttl_s == 3600 and hour.prices.cache_write_per_mtok == pytest.approx(6.0)
    late = simulate([prefixed(0), prefixed(1800)], hour)
    assert late[1].cache_read_input_tokens == 2000


def test_nothing_is_cached_below_the_minimum_length():
    short = PREFIX[:1000]  # Sonnet's minimum is 1024, Haiku 3.5's 2048
    usages = simulate([prefixed(t, short) for t in (0, 10)], cache_rules("anthropic", "claude-sonnet-4-5"))
    assert all(u.cache_creation_input_tokens == u.cache_read_input_tokens == 0 for u in usages)
    haiku = simulate([prefixed(t) for t in (0, 10)], cache_rules("anthropic", "claude-haiku-3-5"))
    assert all(u.cache_creation_input_tokens == u.cache_read_input_tokens == 0 for u in haiku)
    sonnet = simulate([prefixed(t) for t in (0, 10)], cache_rules("anthropic", "claude-sonnet-4-5"))
    assert sonnet[1].cache_read_input_tokens == 2000


def test_a_read_lands_on_an_earlier_content_block_boundary():
    first = prefixed(0, breakpoint_=1500)  # cached up to 1500
    ids = np.concatenate([first.token_ids[:1800], RNG.integers(0, 50_000, 400).astype(np.uint32)])
    second = Marked(ids, 5.0, (1500, 1800, 2200), (2200,), 10)  # breakpoint at the end; 1500 is a boundary
    usages = simulate([first, second], cache_rules("anthropic", "claude-sonnet-4-5"))
    assert (usages[1].cache_read_input_tokens, usages[1].cache_creation_input_tokens) == (1500, 700)


def test_openai_is_automatic_from_1024_tokens_in_128_token_steps():
    rules = cache_rules("openai", "gpt-5")
    ids = RNG.integers(0, 50_000, 3000).astype(np.uint32)
    requests = [
        Marked(ids[:1100], 0.0, (), (1100,), 1),
        Marked(ids[:2000], 1.0, (), (2000,), 1),
        Marked(ids[:3000], 2.0, (), (3000,), 1),
        Marked(ids[:3000], 400.0, (), (3000,), 1),
    ]
    usages = simulate(requests, rules)
    # 1100 tokens = 8 blocks of 128 cached; the 2000-token prompt reuses them: 1024 (>= 1024, 8 x 128)
    assert [u.cache_read_input_tokens for u in usages] == [0, 1024, 1920, 0]  # 400 s idle > 300 s: expired
    assert usages[0].cache_creation_input_tokens == 1024 and usages[0].input_tokens == 76
    assert simulate([Marked(ids[:1000], 0.0, (), (1000,), 1)] * 2, rules)[1].cache_read_input_tokens == 0
    assert rules.write_multiplier == 1.0 and rules.prices.cache_read_per_mtok == pytest.approx(0.125)


def test_break_even():
    assert break_even_reads(1.25, 0.1) == 1  # 0.25 / 0.9 = 0.28 -> 1 read
    assert break_even_reads(2.0, 0.1) == 2  # 1 / 0.9 = 1.11 -> 2 reads
    assert break_even_reads(1.0, 0.5) == 0 and break_even_reads(1.25, 1.0) is None


def test_every_number_has_a_date_and_a_source():
    table = provider_table()
    for provider in ("anthropic", "openai"):
        assert table[provider]["source"].startswith("https://") and table[provider]["as_of"]
        for model, entry in table[provider]["models"].items():
            assert entry["source"].startswith("https://") and entry["as_of"], model


def test_price_overrides_and_unknown_models():
    rules = with_prices(cache_rules("anthropic", "claude-opus-4-1"), input_per_mtok=1.0)
    assert rules.prices.input_per_mtok == 1.0 and rules.prices.output_per_mtok == 75.0
    with pytest.raises(InputError, match="--model: 'gpt-9'"):
        cache_rules("openai", "gpt-9")
    with pytest.raises(InputError, match="--retention"):
        cache_rules("openai", "gpt-5", "1h")


def chat_request(messages, arrival_s, tokenizer):
    ids = tokenizer.render_messages(messages)
    return Request(0, "r", "s", 0, ids, arrival_s, 10, messages=tuple(messages))


def test_messages_placement_marks_the_system_prompt_and_the_last_stable_turn():
    tokenizer = load_tokenizer()
    system = Message("system", " ".join(["rules"] * 1200))
    turn1 = [system, Message("user", "question one")]
    turn2 = turn1 + [Message("assistant", "answer " * 300), Message("user", "question two")]
    boundaries = message_boundaries(chat_request(turn2, 0, tokenizer), tokenizer)
    bill = bill_requests(
        [chat_request(turn1, 0, tokenizer), chat_request(turn2, 5, tokenizer)],
        cache_rules("anthropic", "claude-sonnet-4-5"),
        Placement.MESSAGES,
        tokenizer,
    )
    assert bill.cache_read_tokens == boundaries[0]  # turn 2 reads the system prompt turn 1 wrote
    assert bill.cache_write_tokens == boundaries[0] + (boundaries[2] - boundaries[0])


def test_the_cli_prices_a_scenario_and_writes_the_bill(kvbench, tmp_path):
    out = tmp_path / "bill.parquet"
    code, stdout, stderr = kvbench(
        "bill", "scenarios/agent.toml", "--provider", "anthropic", "--requests", 30, "--out", out
    )
    assert code == 0, stderr
    row = pq.read_table(out).to_pylist()[0]
    assert row["cache_read_input_tokens"] > row["cache_creation_input_tokens"] > 0
    assert row["total_usd"] < row["no_cache_usd"] and "saving" in stdout
    trace = tmp_path / "mooncake.jsonl"
    trace.write_text(
        '{"timestamp": 0, "input_length": 1100, "output_length": 4, "hash_ids": [0, 1, 2]}\n' * 3
    )
    code, _, stderr = kvbench("bill", trace, "--placement", "messages")
    assert code == 2 and "--placement messages" in stderr
    code, stdout, stderr = kvbench("bill", trace, "--provider", "openai", "--model", "gpt-4.1")
    assert code == 0, stderr  # 1,100 tokens, the same three blocks: requests 2 and 3 read 1,024
    assert "2,048" in stdout
