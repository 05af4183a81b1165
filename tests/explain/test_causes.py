"""``kvbench explain``: one small trace per cause, each detected at the right token offset, and the
waterfall summing exactly (kvbench/explain/)."""

import json

import numpy as np
from explain_traces import STABLE, first_difference

from kvbench.cache.base import CacheConfig
from kvbench.explain.api import explain_requests, unbounded_config
from kvbench.request import Request

B = 16


def explain(requests, tokenizer, capacity=None, **fields):
    config = CacheConfig(capacity_blocks=capacity or 1, block_size=B, **fields)
    config = config if capacity else unbounded_config(requests, config)
    explanation = explain_requests(requests, config, tokenizer)
    for item in explanation.requests:  # every request's bars sum to its prompt tokens
        assert sum(item.bars.tokens.values()) == item.request.num_tokens
    assert sum(explanation.waterfall.tokens.values()) == explanation.waterfall.total_tokens
    return explanation


def kinds(item):
    return [cause.kind for cause in item.causes]


def test_a_timestamp_at_the_top_is_volatile_at_its_offset_and_moving_it_down_brings_the_hits_back(
    chat, tokenizer
):
    def trace(top):
        requests = []
        for i in range(3):
            stamp = f"Current time: 2025-01-01 10:00:{i:02d}\n"
            system = stamp + STABLE if top else STABLE + stamp
            requests.append(
                chat(i, [("system", system), ("user", f"Question number {'one two three'.split()[i]}?")])
            )
        return requests

    top = trace(top=True)
    explained = explain(top, tokenizer)
    second = explained.requests[1]
    offset = first_difference(top[0].token_ids, top[1].token_ids)
    assert second.causes[0].kind == "volatile value (date)" and second.causes[0].offset_tokens == offset
    assert "10:00:‖01" in second.causes[0].excerpt and "10:00:‖00" in second.causes[0].earlier_excerpt
    assert "'2025-01-01 10:00:01' here, '2025-01-01 10:00:00' before" in second.causes[0].detail
    assert second.hit_tokens == offset // B * B == 16  # the hit stops in the block holding the date
    moved = explain(trace(top=False), tokenizer).requests[1]
    assert moved.causes[0].kind == "volatile value (date)" and moved.causes[0].offset_tokens > 100
    assert moved.hit_tokens >= moved.request.num_tokens - 40  # the stable prompt hits again


def test_a_round_robin_over_8_prompts_in_a_small_cache_is_evicted(chat, tokenizer):
    prompts = [
        chat(i, [("system", f"Tenant {chr(65 + i)}. " + STABLE), ("user", "Hello?")]) for i in range(8)
    ]
    requests = prompts + [
        Request(8 + i, f"r{8 + i}", f"t{i}", 0, p.token_ids, max_tokens=4, messages=p.messages)
        for i, p in enumerate(prompts)
    ]
    explained = explain(requests, tokenizer, capacity=40)  # 8 prompts need ~64 blocks
    second_round = explained.requests[8:]
    assert all(item.hit_tokens == 0 for item in second_round)
    cause = next(c for c in second_round[0].causes if c.kind == "evicted (capacity)")
    assert cause.offset_tokens == 0 and cause.tokens == (second_round[0].request.num_tokens - 1) // B * B
    assert "last used by r0 (8 requests" in cause.detail and "capacity 40 blocks" in cause.detail
    assert explained.waterfall.tokens["capacity"] == sum(
        c.tokens for i in second_round for c in i.causes if c.kind == "evicted (capacity)"
    )
    assert explain(requests, tokenizer).waterfall.tokens["capacity"] == 0  # room for everything: no loss


def test_idle_past_the_ttl_is_expired(chat, tokenizer):
    pairs = [("system", STABLE), ("user", "Hello?")]
    requests = [chat(0, pairs), chat(1, pairs, arrival_s=100.0), chat(2, pairs, arrival_s=105.0)]
    explained = explain(requests, tokenizer, capacity=200, ttl_s=30.0)
    late, soon = explained.requests[1], explained.requests[2]
    assert late.hit_tokens == 0 and "expired (TTL)" in kinds(late)
    assert "100.0 s earlier" in next(c.detail for c in late.causes if c.kind == "expired (TTL)")
    assert soon.hit_tokens > 0 and explained.waterfall.tokens["ttl"] == late.causes[-1].tokens


def test_two_salts_share_nothing(chat, tokenizer):
    pairs = [("system", STABLE), ("user", "Hello?")]
    requests = [
        chat(0, pairs, salt="tenant-a"),
        chat(1, pairs, salt="tenant-b"),
        chat(2, pairs, salt="tenant-a"),
    ]
    explained = explain(requests, tokenizer)
    other, same = explained.requests[1], explained.requests[2]
    assert other.hit_tokens == 0 and kinds(other)[-1] == "different salt"
    assert (
        other.causes[-1].tokens == (other.request.num_tokens - 1) // B * B
        and "'tenant-a'" in other.causes[-1].detail
    )
    assert same.hit_tokens == (same.request.num_tokens - 1) // B * B


def test_tool_call_json_with_keys_in_another_order(chat, tokenizer):
    call = {"name": "search_manual", "arguments": {"query": "snapshot retention", "limit": 5}}
    reordered = json.dumps(
        {"arguments": {"limit": 5, "query": "snapshot retention"}, "name": "search_manual"}
    )
    history = [("system", STABLE), ("user", "How long are snapshots kept?")]
    first = chat(0, history + [("assistant", json.dumps(call)), ("user", "And replicas?")], session="c")
    second = chat(1, history + [("assistant", reordered), ("user", "And replicas?")], session="d")
    item = explain([first, second], tokenizer).requests[1]
    assert item.causes[0].kind == "JSON key order"
    assert item.causes[0].offset_tokens == first_difference(first.token_ids, second.token_ids)
    assert '{"‖arguments"' in item.causes[0].excerpt and '{"‖name"' in item.causes[0].earlier_excerpt


def test_reasoning_stripped_from_history(chat, tokenizer):
    history = [("system", STABLE), ("user", "Which color is the logo?")]
    reply = "The logo is blue, as the brand guide says."
    first = chat(
        0,
        history
        + [
            ("assistant", "<think>The brand guide lists blue and white; the logo uses blue.</think>" + reply),
            ("user", "Thanks. And the font?"),
        ],
    )
    second = chat(1, history + [("assistant", reply), ("user", "Thanks. And the font?")])
    item = explain([first, second], tokenizer).requests[1]
    assert item.causes[0].kind == "reasoning stripped"
    assert item.causes[0].offset_tokens == first_difference(first.token_ids, second.token_ids)
    assert "<think>" in item.causes[0].earlier_excerpt


def test_a_reply_that_re_tokenizes_differently(tokenizer):
    reply = "Blue is the colour of the logo"
    # one id per char
    generated = tokenizer.encode(STABLE) + [t for ch in reply for t in tokenizer.encode(ch)]
    resent = tokenizer.encode(STABLE) + tokenizer.encode(reply + "\nAnd the font?")
    requests = [
        Request(i, f"r{i}", "s", i, np.asarray(ids, dtype=np.uint32), max_tokens=2)
        for i, ids in enumerate((generated, resent))
    ]
    item = explain(requests, tokenizer).requests[1]
    assert item.causes[0].kind == "re-tokenized" and item.causes[0].offset_tokens == len(
        tokenizer.encode(STABLE)
    )


def test_the_same_messages_rendered_with_another_template(chat, tokenizer):
    pairs = [("system", STABLE), ("user", "Where is the billing portal?")]
    other_template = list(tokenizer.render_messages(chat(0, pairs[:1]).messages[:1])[:-3]) + tokenizer.encode(
        "### User:\nWhere is the billing portal?\n### Assistant:\n"
    )
    requests = [chat(0, pairs), chat(1, pairs, token_ids=other_template)]
    item = explain(requests, tokenizer).requests[1]
    assert item.causes[0].kind == "text re-rendered"
    assert item.causes[0].offset_tokens == first_difference(requests[0].token_ids, requests[1].token_ids)


def test_a_prompt_below_the_provider_minimum(tokenizer):
    ids = np.asarray(tokenizer.encode(STABLE * 12), dtype=np.uint32)[:1000]
    requests = [Request(i, f"r{i}", f"s{i}", 0, ids, max_tokens=2) for i in range(2)]
    config = unbounded_config(requests, CacheConfig(1, B))
    explained = explain_requests(requests, config, tokenizer, min_cacheable_tokens=1024)
    item = explained.requests[1]
    assert item.hit_tokens == 0 and kinds(item) == ["block floor", "below provider minimum"]
    assert item.bars.tokens["provider_minimum"] == 999 // B * B
    assert "1,000 tokens < the minimum of 1,024" in item.causes[-1].detail
    assert explain_requests(requests, config, tokenizer).requests[1].hit_tokens == 999 // B * B


def test_block_floor_and_last_token(tokenizer):
    ids = np.asarray(tokenizer.encode(STABLE * 3), dtype=np.uint32)[:48]
    requests = [
        Request(0, "r0", "s0", 0, ids[:40], max_tokens=1),
        Request(1, "r1", "s1", 0, ids[:40], max_tokens=1),
        Request(2, "r2", "s2", 0, ids, max_tokens=1),
        Request(3, "r3", "s3", 0, ids, max_tokens=1),
    ]
    explained = explain(requests, tokenizer)
    floor, capped = explained.requests[1], explained.requests[3]
    assert floor.bars.tokens["block_floor"] == 8 and floor.hit_tokens == 32  # 40 shared: 2 blocks + 8
    assert capped.bars.tokens["last_token"] == 16 and capped.hit_tokens == 32  # 48 = 3 blocks, cap 2
    assert kinds(capped)[-1] == "last token" and capped.causes[-1].offset_tokens == 32
